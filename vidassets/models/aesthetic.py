"""Learned aesthetic ratings: the two published aesthetic predictors, each a frozen image tower and a
small head over the tower's L2-normalised image embedding, loaded from local files only.

``laion``: LAION's "improved aesthetic predictor" (github christophschuhmann/improved-aesthetic-predictor,
checkpoint ``sac+logos+ava1-l14-linearMSE.pth``) over CLIP ViT-L/14's projected image features
(``get_image_features``; tower: a CLIP ``save_pretrained`` directory such as openai/clip-vit-large-patch14).

``v2.5``: Aesthetic Predictor V2.5 (package ``aesthetic-predictor-v2-5``, checkpoint
``aesthetic_predictor_v2_5.pth``) over the SigLIP vision model's pooled output (no projection; tower:
a SigLIP ``save_pretrained`` directory such as google/siglip-so400m-patch14-384).

Both heads are Linear layers with Dropout between them and no activation: that is how the published
checkpoints were trained, so a ReLU between layers would give other ratings. Ratings are about 1-10.
Frames are preprocessed by the tower's own image processor config, as upstream does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vidassets.models import record_calls
from vidassets.models.embedder import padded
from vidassets.models.placement import Placement

HEAD_SETTING = "scores.aesthetic_head"
TOWER_SETTING = "scores.aesthetic_tower"


@dataclass(frozen=True)
class HeadFamily:
    """A published head's layout: what its state dict holds and which tower feeds it."""

    name: str
    prefix: str
    """Key prefix of its ``nn.Sequential`` in the published state dict."""
    layers: tuple[float | None, ...]
    """Per Sequential index: ``None`` for a Linear layer, else a Dropout's probability."""
    widths: tuple[int, ...]
    """Output features of each Linear layer in order (the input is the tower's embedding)."""
    tower_types: tuple[str, ...]
    """``model_type`` values of a tower directory's config.json that feed it."""
    published: str

    def expected_keys(self) -> set[str]:
        return {f"{self.prefix}.{i}.{p}" for i, drop in enumerate(self.layers) if drop is None for p in ("weight", "bias")}


FAMILIES = {f.name: f for f in (
    HeadFamily("laion", "layers", (None, 0.2, None, 0.2, None, 0.1, None, None), (1024, 128, 64, 16, 1),
               ("clip", "clip_vision_model"), "improved-aesthetic-predictor sac+logos+ava1-l14-linearMSE.pth"),
    HeadFamily("v2.5", "scoring_head", (None, 0.5, None, 0.5, None, 0.5, None, 0.2, None), (1024, 128, 64, 16, 1),
               ("siglip", "siglip_vision_model"), "aesthetic-predictor-v2-5 aesthetic_predictor_v2_5.pth"),
)}


def build_head(family: HeadFamily, in_features: int):
    """The head's ``nn.Sequential`` in its published order (Dropouts included, so indices match the keys)."""
    from torch import nn

    layers: list[nn.Module] = []
    widths = iter(family.widths)
    features = in_features
    for drop in family.layers:
        if drop is None:
            out = next(widths)
            layers.append(nn.Linear(features, out))
            features = out
        else:
            layers.append(nn.Dropout(drop))
    return nn.Sequential(*layers).eval()


def load_head(family: HeadFamily, path: Path, in_features: int):
    """The head with the published state dict at ``path``; a file of another layout, or one whose
    input width is not the tower's embedding width, is a ValueError naming the file."""
    import torch

    if not path.is_file():
        raise FileNotFoundError(f"{HEAD_SETTING}: no head weights file at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a pickled module, a truncated file, not a torch file at all
        raise ValueError(f"{HEAD_SETTING}: {path} is not a torch state dict ({type(e).__name__}: {e})") from e
    if not isinstance(state, Mapping):
        raise ValueError(f"{HEAD_SETTING}: {path} holds a {type(state).__name__}, not a state dict")
    expected = family.expected_keys()
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        others = [f.name for f in FAMILIES.values() if f is not family and f.expected_keys() == set(state)]
        hint = f" (it is a {others[0]!r} head)" if others else ""
        raise ValueError(f"{HEAD_SETTING}: {path} is not a {family.name!r} head ({family.published}){hint}: "
                         f"missing keys {missing}, unexpected keys {unexpected}")
    first = state[f"{family.prefix}.0.weight"]
    if first.ndim != 2 or first.shape[1] != in_features:
        raise ValueError(f"{HEAD_SETTING}: {path} takes {tuple(first.shape)[1:]}-wide embeddings but the tower's "
                         f"are {in_features}-wide (a head for another tower)")
    head = build_head(family, in_features)
    try:
        head.load_state_dict({k[len(family.prefix) + 1:]: v for k, v in state.items()}, strict=True)
    except RuntimeError as e:  # hidden widths other than the published ones
        raise ValueError(f"{HEAD_SETTING}: {path} does not fit the published {family.name!r} layout: {e}") from e
    return head


def _tower_class(family: HeadFamily):
    """The vision-only model class for the family's tower: it loads the vision half of a full
    CLIP/SigLIP directory, ignoring (without a load report) the text tower's weights."""
    import transformers

    base = transformers.CLIPVisionModelWithProjection if family.name == "laion" else transformers.SiglipVisionModel
    ignored = [r"^text_model\.", r"^text_projection\.", r"^logit_scale$", r"^logit_bias$"]
    return type(f"Aesthetic{base.__name__}", (base,), {"_keys_to_ignore_on_load_unexpected": ignored})


def load_tower(family: HeadFamily, path: Path):
    """(vision model, its image processor, embedding width) from a ``save_pretrained`` directory."""
    import torch
    import transformers

    for name in ("config.json", "preprocessor_config.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{TOWER_SETTING}: {path} is not a saved model directory with its own "
                                    f"image processor (no {name})")
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in family.tower_types:
        raise ValueError(f"{TOWER_SETTING}: {path} holds a {model_type!r} model; a {family.name!r} head reads a "
                         f"{' / '.join(family.tower_types)} tower")
    config = None
    if model_type == "clip":  # the vision half of a full CLIP, with the full model's projection width
        full = transformers.CLIPConfig.from_pretrained(path, local_files_only=True)
        config = full.vision_config
        config.projection_dim = full.projection_dim
    kwargs = {"config": config} if config is not None else {}
    model, info = _tower_class(family).from_pretrained(path, local_files_only=True, dtype=torch.float32,
                                                       output_loading_info=True, **kwargs)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise ValueError(f"{TOWER_SETTING}: {path} lacks weights of its {family.name!r} tower: "
                         f"missing {sorted(info['missing_keys'])}, mismatched {sorted(info['mismatched_keys'])}")
    # the PIL backend: what the heads were trained with (OpenAI CLIP's PIL preprocessing; transformers 4's
    # SigLIP processor), and the same on every machine whether torchvision is installed or not
    processor = transformers.AutoImageProcessor.from_pretrained(path, local_files_only=True, backend="pil")
    width = model.config.projection_dim if family.name == "laion" else model.config.hidden_size
    return model.eval(), processor, width


class AestheticPredictor:
    """Per-frame aesthetic ratings of one published predictor (``head``: ``laion`` or ``v2.5``):
    ``head_weights`` is its published .pth, ``tower_dir`` its image tower's directory. ``low`` and
    ``high`` are the ratings mapped to 0 and 1. The tower runs under the placement's autocast; the
    head (a few thousand multiply-adds a frame) in fp32."""

    def __init__(self, placement: Placement, head: str, head_weights: str | Path, tower_dir: str | Path,
                 low: float = 1.0, high: float = 10.0, *, batch_frames: int):
        import torch

        if head not in FAMILIES:
            raise ValueError(f"aesthetic head must be one of {sorted(FAMILIES)}, got {head!r}")
        if not high > low:
            raise ValueError(f"aesthetic rating range must have high > low, got {low:g}..{high:g}")
        self.family = FAMILIES[head]
        tower, self._processor, width = load_tower(self.family, Path(tower_dir))
        self._head = load_head(self.family, Path(head_weights), width).to(placement.device)
        self._tower = tower.to(placement.device)
        self._placement = placement
        self._torch = torch
        self.low, self.high = low, high
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def _embeddings(self, pixel_values):
        """The tower's image embedding the head was trained on: LAION's on CLIP's projected features
        (``get_image_features``), V2.5's on SigLIP's pooled output; L2-normalised, in fp32."""
        out = self._tower(pixel_values=pixel_values)
        embeds = (out.image_embeds if self.family.name == "laion" else out.pooler_output).float()
        return embeds / embeds.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    def ratings(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """The head's raw ratings (about 1-10) of RGB uint8 frames, float32."""
        torch = self._torch
        out = []
        for start, stop, shape in self._placement.torch_runs(len(frames), self.batch_frames):  # fixed shapes
            inputs = self._processor(images=padded(frames[start:stop], shape), return_tensors="pt")
            with torch.inference_mode():
                with self._placement.autocast():
                    embeds = self._embeddings(inputs["pixel_values"].to(self._placement.device))
                rated = self._head(embeds.float()).squeeze(-1)
            self.calls += stop - start
            self.batches += 1
            record_calls(stop - start)
            out.append(rated.cpu().numpy()[: stop - start])
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        """Per-frame ratings mapped to [0, 1] (``low`` -> 0, ``high`` -> 1, clipped)."""
        mapped = (self.ratings(frames) - self.low) / (self.high - self.low)
        return np.clip(mapped, 0.0, 1.0).astype(float).tolist()
