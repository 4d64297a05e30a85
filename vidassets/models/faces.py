"""Faces per frame from NudeNet's detector (its FACE_FEMALE / FACE_MALE classes; 320n ONNX model
inside the wheel): count and the largest face's share of the frame. Tags only, never a filter.

NudeNet's own preprocessing is used; its post-processing (a Python loop over the 2,100 candidate
boxes, ~17 ms a frame) is done here with array operations and the same non-maximum suppression:
the same detections (tested against ``NudeDetector.detect``)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement, package_dir

FACE_CLASSES = {"FACE_FEMALE", "FACE_MALE"}
CANDIDATE_SCORE, NMS_SCORE, NMS_IOU = 0.2, 0.25, 0.45
"""NudeNet's thresholds: a candidate box, and non-maximum suppression."""


class NudeNetFaces:
    def __init__(self, placement: Placement, min_score: float = 0.5, threads: int = 1, *, batch_frames: int):
        import nudenet.nudenet as nudenet
        import onnxruntime

        options = onnxruntime.SessionOptions()  # NudeDetector ignores providers and takes every core
        options.intra_op_num_threads = threads
        path = str(package_dir("nudenet") / "320n.onnx")
        self.session = onnxruntime.InferenceSession(path, options, providers=placement.onnx_providers())
        self._input = self.session.get_inputs()[0].name
        self._read_image = nudenet._read_image
        labels = nudenet.__dict__["__labels"]
        self._face_ids = np.array([i for i, label in enumerate(labels) if label in FACE_CLASSES])
        self.min_score = min_score
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[tuple[int, float]]:
        """(faces, largest face's share of the frame) per RGB frame; ``batch_frames`` frames per
        model run (every frame is padded and resized to the network's 320x320 input)."""
        out = []
        for start in range(0, len(frames), self.batch_frames):
            batch = frames[start : start + self.batch_frames]
            for rgb, found in zip(batch, self._detect_batch([cv2.cvtColor(f, cv2.COLOR_RGB2BGR) for f in batch]),
                                  strict=True):
                faces = [box for cls, score, box in found if cls in self._face_ids and score >= self.min_score]
                area = float(rgb.shape[0] * rgb.shape[1])
                largest = max((w * h / area for _, _, w, h in faces), default=0.0)
                out.append((len(faces), float(min(largest, 1.0))))
        return out

    def detect(self, bgr: np.ndarray) -> list[tuple[int, float, list[int]]]:
        """(class id, score, [x, y, w, h]) of every detection, as ``NudeDetector.detect`` finds them."""
        return self._detect_batch([bgr])[0]

    def _detect_batch(self, images: Sequence[np.ndarray]) -> list[list[tuple[int, float, list[int]]]]:
        prepared = [self._read_image(bgr, 320) for bgr in images]
        (raw,) = self.session.run(None, {self._input: np.concatenate([p[0] for p in prepared])})[:1]
        self.calls += len(images)
        self.batches += 1
        record_calls(len(images))
        return [_detections(np.transpose(out), *p[3:]) for out, p in zip(raw, prepared, strict=True)]


def _detections(rows: np.ndarray, x_pad: int, y_pad: int, width: int, height: int) -> list[tuple[int, float, list[int]]]:
    """NudeNet's post-processing of one frame's candidate rows (cx, cy, w, h, class scores...)."""
    scores = rows[:, 4:].max(axis=1)
    keep = np.flatnonzero(scores >= CANDIDATE_SCORE)
    if not len(keep):
        return []
    classes = rows[keep, 4:].argmax(axis=1)
    cx, cy, w, h = (rows[keep, i] for i in range(4))
    sx, sy = (width + x_pad) / 320, (height + y_pad) / 320
    x = np.clip((cx - w / 2) * sx, 0, width)
    y = np.clip((cy - h / 2) * sy, 0, height)
    w = np.minimum(w * sx, width - x)
    h = np.minimum(h * sy, height - y)
    boxes = np.stack([x, y, w, h], axis=1)
    picked = cv2.dnn.NMSBoxes(boxes.tolist(), scores[keep].tolist(), NMS_SCORE, NMS_IOU)
    return [(int(classes[i]), float(scores[keep][i]), [int(v) for v in boxes[i]]) for i in picked]
