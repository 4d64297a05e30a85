"""A ready megatron-energon task encoder for vidassets shards (CrudeWebdataset with a cooker): each
sample comes back as its clip key, latents tensor (original dtype restored), text embedding and
metadata. Use it with ``get_train_dataset(path, task_encoder=VidassetsTaskEncoder(), ...)``."""

from __future__ import annotations

from typing import Any

from megatron.energon import Cooker, DefaultTaskEncoder, basic_sample_keys, stateless

from vidassets.train.shards import padded_text_states, restore_latents


@stateless
def cook_vidassets(sample: dict) -> dict[str, Any]:
    meta = sample["json"]
    return {**basic_sample_keys(sample), "clip_id": meta["clip_id"], "meta": meta,
            "latents": restore_latents(sample["latents.npy"], meta["latents_dtype"]),
            "text_embedding": sample.get("text.npy"), **_text_states(sample, meta)}


def _text_states(sample: dict, meta: dict) -> dict[str, Any]:
    """A per-token encoder's states padded to its text length, with the mask (absent otherwise)."""
    states = meta.get("text_states")
    if "text_states.npy" not in sample or not states:
        return {}
    padded, mask = padded_text_states(sample["text_states.npy"], states["dtype"], states["max_tokens"])
    return {"text_states": padded, "text_states_mask": mask}


class VidassetsTaskEncoder(DefaultTaskEncoder):
    cookers = [Cooker(cook_vidassets)]

    def batch(self, samples: list[dict]) -> list[dict]:
        return samples  # one shape bucket per dataset: the caller stacks what it needs
