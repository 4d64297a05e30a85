"""text_embeddings for one partition: the recipe's caption level (and the levels its caption variants
may show) of the recipe's captioner version, encoded by the configured text encoder, for the
selected clips. Rows are keyed by (clip_id,
caption version, level, encoder version); a row is reused while its caption text is unchanged.

Every row holds the pooled vector (``vector``). A per-token encoder (``text_embeddings.model:
t5_encoder``, umT5 for Wan) also stores each text's token states as a safetensors object
(``token_key``: one object per (encoder version, text), shared by every clip with that caption),
with the count of the text's tokens and the length a trainer pads them to (``tokens``,
``max_tokens``); ``train.shards`` carries them into the shards.

The texts to encode go to the engine in batches of the encoder's batch size (model actors on Ray):
batches are cut the same way on every engine, so the vectors are the same bit for bit."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from vidassets.curate.embeddings import vector_bytes
from vidassets.derive.labels import caption_texts
from vidassets.runtime.engine import LocalEngine
from vidassets.runtime.step import Step, count_remote
from vidassets.storage.rows import TRANSIENT, RowVersion, StepStats

VERSION = "text-embed-v1"
STATES_PREFIX = "text_states"


def encoder_model(te: Any) -> tuple[str, tuple]:
    """The registry kind and arguments of the encoder ``text_embeddings`` settings name."""
    if te.model == "t5_encoder":
        return "t5-tokens", (te.model_path, te.max_tokens, te.states_dtype)
    return "sentence-transformer", (te.model_path, te.batch_size)


def states_key(version: str, text_sha256: str) -> str:
    """Where one text's token states lie: per encoder version (its digest) and caption text."""
    return f"{STATES_PREFIX}/{hashlib.sha256(version.encode()).hexdigest()[:16]}/{text_sha256}.safetensors"


def states_bytes(states: Any, max_tokens: int) -> bytes:
    from safetensors.torch import save

    return save({"states": states.contiguous()}, metadata={"max_tokens": str(max_tokens)})


def load_states(objects: Any, key: str) -> tuple[Any, int]:
    """(token states tensor, tokens x dim in its stored dtype; the text length it pads to) of a stored text."""
    from safetensors.torch import load

    data = objects.get_bytes(key)
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return load(data)["states"], int(header["__metadata__"]["max_tokens"])


def embed_captions(selected: list[dict], annotations: pd.DataFrame, caption_version: str, levels: Sequence[str],
                   previous: pd.DataFrame, version: str, encoder_factory: Callable[[], Any], max_runs: int,
                   batch_size: int = 64, engine: Any = None, objects: Any = None) -> tuple[list[dict], StepStats]:
    """Each of the given caption ``levels`` of each selected clip, embedded (the recipe's level and
    the levels its caption variants may show). A row's input is the caption text itself (its
    sha256): it is reused while the text and the encoder are unchanged. A batch that fails is an
    ``error`` row per clip (a transient failure: retried by the next run)."""
    step = Step(previous, lambda r: (r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"]),
                max_runs, engine=engine)
    stats = step.stats
    stats.rows_in = len(selected) * len(levels)
    wanted = []
    for level in levels:
        captions, _ = caption_texts(annotations, caption_version, level)
        for sel in selected:
            text = captions.get(sel["clip_id"])
            if text is None:
                stats.add("missing_caption")
                continue
            key = (sel["clip_id"], caption_version, level, version)
            row_version = RowVersion(version, "text-" + hashlib.sha256(text.encode()).hexdigest())
            wanted.append((key, row_version, (sel, text, key, row_version)))
    todo = step.due(wanted)
    batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
    engine = engine or LocalEngine()
    count_remote(stats, engine, len(batches))
    outcomes = engine.map(_EncodeTexts(encoder_factory, objects, version), [[text for _, text, _, _ in b] for b in batches],
                          lambda texts: f"{len(texts)} caption(s)", models=True)
    new_rows = []
    for batch, outcome in zip(batches, outcomes, strict=True):
        vectors = outcome.row["vectors"] if outcome.row is not None else [None] * len(batch)
        states = outcome.row["states"] if outcome.row is not None else [None] * len(batch)
        stats.model_calls += len(batch) if outcome.row is not None else 0
        for (sel, _, key, row_version), vec, (token_key, tokens, max_tokens) in zip(batch, vectors, states, strict=True):
            row = {"clip_id": sel["clip_id"], "asset_id": sel["asset_id"], "source_shard": sel["source_shard"],
                   "tier": sel.get("tier"), "caption_version": caption_version, "caption_level": key[2],
                   "text_sha256": row_version.inputs[len("text-"):],
                   "status": "ok" if vec is not None else "error",
                   "reason": None if vec is not None else outcome.reason,
                   "dim": int(vec.shape[0]) if vec is not None else None,
                   "vector": vector_bytes(vec) if vec is not None else None,
                   "token_key": token_key, "tokens": tokens, "max_tokens": max_tokens}
            new_rows.append(step.stamp(key, row, row_version, None if vec is not None else TRANSIENT))
    rows = step.complete(new_rows)
    return sorted(rows, key=lambda r: (r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"])), stats


def text_ok(table: pd.DataFrame) -> pd.Series:
    """Rows of a text_embeddings table that hold a vector (tables written before encode failures
    were rows have no status column: every row there is ok)."""
    if "status" not in table.columns:
        return pd.Series(True, index=table.index)
    return table.status.fillna("ok") == "ok"


class _EncodeTexts:
    """One batch of caption texts through the encoder (picklable: it may run on a Ray model actor,
    whose process keeps the encoder it built). A per-token encoder's states are written to the
    object store here, next to the model: only their keys travel back."""

    def __init__(self, encoder_factory: Callable[[], Any], objects: Any, version: str):
        self.encoder_factory, self.objects, self.version = encoder_factory, objects, version

    def __call__(self, texts: list[str]) -> dict:
        encoder = self.encoder_factory()
        if not hasattr(encoder, "token_states"):
            return {"vectors": list(encoder(texts)), "states": [(None, None, None)] * len(texts)}
        if self.objects is None:
            raise ValueError("a per-token text encoder needs the object store to keep its states")
        vectors, states = [], []
        for text, found in zip(texts, encoder.token_states(texts), strict=True):
            key = states_key(self.version, hashlib.sha256(text.encode()).hexdigest())
            self.objects.put_if_absent(key, states_bytes(found.states, found.max_tokens))
            vectors.append(found.pooled)
            states.append((key, found.tokens, found.max_tokens))
        return {"vectors": vectors, "states": states}
