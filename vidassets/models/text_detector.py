"""Text area: PP-OCRv4 text *detection* (rapidocr-onnxruntime, weights inside the wheel)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement


class TextAreaDetector:
    """Share of each frame covered by the union of detected text boxes (box score >= min_score)."""

    def __init__(self, placement: Placement, limit_side: int = 256, min_score: float = 0.5):
        from rapidocr_onnxruntime import RapidOCR

        self._ocr = RapidOCR(det_limit_side_len=limit_side, det_limit_type="max", det_box_thresh=min_score,
                             det_use_cuda=placement.cuda)
        self.calls = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        shares = []
        for rgb in frames:
            self.calls += 1
            record_calls()
            boxes, _ = self._ocr(rgb, use_det=True, use_cls=False, use_rec=False)
            mask = np.zeros(rgb.shape[:2], np.uint8)
            for box in boxes if boxes is not None else []:
                cv2.fillPoly(mask, [np.asarray(box, dtype=np.int32).reshape(-1, 2)], 1)
            shares.append(float(mask.mean()))
        return shares
