"""Text area: PP-OCRv4 text *detection* (rapidocr-onnxruntime, weights inside the wheel)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement


class TextAreaDetector:
    """Share of each frame covered by the union of detected text boxes (box score >= min_score),
    detected on the frame shrunk to ``limit_side`` on its longer side. (RapidOCR's own ``max`` limit
    only ever enlarges its limit to 960 px: the shrink is done here, and the detector is called
    directly, without the recognizer pipeline around it.)"""

    def __init__(self, placement: Placement, limit_side: int = 256, min_score: float = 0.5, threads: int = 1):
        from rapidocr_onnxruntime import RapidOCR

        ocr = RapidOCR(det_limit_side_len=limit_side, det_limit_type="max", det_box_thresh=min_score,
                       det_use_cuda=placement.cuda, det_intra_op_num_threads=threads)
        self._detect = ocr.text_det
        self.limit_side = limit_side
        self.calls = self.batches = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        shares = []
        for rgb in frames:  # one run per frame: the input's size follows each frame's aspect
            self.calls += 1
            self.batches += 1
            record_calls()
            h, w = rgb.shape[:2]
            scale = min(1.0, self.limit_side / max(h, w))
            small = cv2.resize(rgb, (max(1, round(w * scale)), max(1, round(h * scale))),
                               interpolation=cv2.INTER_AREA) if scale < 1 else rgb
            boxes, _ = self._detect(np.ascontiguousarray(small[..., ::-1]))  # the detector reads BGR
            mask = np.zeros(small.shape[:2], np.uint8)
            for box in boxes if boxes is not None else []:
                cv2.fillPoly(mask, [np.asarray(box, dtype=np.int32).reshape(-1, 2)], 1)
            shares.append(float(mask.mean()))
        return shares
