"""Learned aesthetic score: an MLP head over CLIP image embeddings (the LAION "aesthetic
predictor" design: a few Linear layers mapping a normalised CLIP embedding to a 1-10 rating),
loaded from local weights. Both the CLIP tower (a local model directory) and the head (a torch
state dict of Linear layers ``<prefix>.<i>.weight/bias``) must be provided; nothing downloads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vidassets.models.embedder import ClipImageEmbedder, padded
from vidassets.models.placement import Placement


class AestheticPredictor:
    def __init__(self, placement: Placement, head_weights: str | Path, clip_dir: str | Path, low: float = 1.0,
                 high: float = 10.0, *, batch_frames: int):
        import torch
        from torch import nn

        path = Path(head_weights)
        state = torch.load(path, map_location="cpu", weights_only=True)
        weights = sorted((k for k in state if k.endswith(".weight")), key=lambda k: int(k.split(".")[-2]))
        if not weights:
            raise ValueError(f"scores.aesthetic_weights: no Linear layers in {path}")
        layers: list[nn.Module] = []
        for i, key in enumerate(weights):
            out_features, in_features = state[key].shape
            linear = nn.Linear(in_features, out_features)
            linear.weight.data.copy_(state[key])
            linear.bias.data.copy_(state[key[: -len("weight")] + "bias"])
            layers.append(linear)
            if i < len(weights) - 1:
                layers.append(nn.ReLU())
        self._head = nn.Sequential(*layers).eval().to(placement.device)
        self._clip = ClipImageEmbedder(placement, clip_dir, batch_frames=batch_frames)
        self._placement = placement
        self._torch = torch
        self.low, self.high = low, high
        self.calls = 0

    @property
    def batch_frames(self) -> int:
        return self._clip.batch_frames

    @batch_frames.setter
    def batch_frames(self, n: int) -> None:
        self._clip.batch_frames = n

    @property
    def batches(self) -> int:
        return self._clip.batches

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        """Per-frame aesthetic ratings mapped to [0, 1] (``low`` -> 0, ``high`` -> 1)."""
        embeddings = self._clip.embed_frames(frames).astype(np.float32)
        self.calls += len(frames)
        ratings = []
        for start, stop, shape in self._placement.torch_runs(len(frames), self.batch_frames):  # fixed shapes
            run = np.stack(padded(embeddings[start:stop], shape))
            with self._torch.inference_mode():
                out = self._head(self._torch.from_numpy(run).to(self._placement.device)).squeeze(-1).float().cpu().numpy()
            ratings.append(out[: stop - start])
        ratings = np.concatenate(ratings) if ratings else np.zeros(0, np.float32)
        return np.clip((ratings - self.low) / (self.high - self.low), 0.0, 1.0).astype(float).tolist()
