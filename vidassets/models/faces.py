"""Faces per frame from NudeNet's detector (its FACE_FEMALE / FACE_MALE classes; 320n ONNX model
inside the wheel): count and the largest face's share of the frame. Tags only, never a filter."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement, package_dir

FACE_CLASSES = {"FACE_FEMALE", "FACE_MALE"}


class NudeNetFaces:
    def __init__(self, placement: Placement, min_score: float = 0.5, threads: int = 1):
        import onnxruntime
        from nudenet import NudeDetector

        self._detector = NudeDetector()
        # NudeDetector ignores its providers argument and takes every core: give it our own session
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        path = str(package_dir("nudenet") / "320n.onnx")
        self._detector.onnx_session = onnxruntime.InferenceSession(path, options, providers=placement.onnx_providers())
        self.min_score = min_score
        self.calls = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[tuple[int, float]]:
        out = []
        for rgb in frames:
            self.calls += 1
            record_calls()
            found = self._detector.detect(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
            faces = [d for d in found if d["class"] in FACE_CLASSES and d["score"] >= self.min_score]
            area = float(rgb.shape[0] * rgb.shape[1])
            largest = max((d["box"][2] * d["box"][3] / area for d in faces), default=0.0)
            out.append((len(faces), float(min(largest, 1.0))))
        return out
