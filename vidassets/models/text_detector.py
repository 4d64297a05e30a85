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
    only ever enlarges its limit to 960 px: the shrink is done here, and the detector's own steps
    (pre-processing, network, box post-processing) are called directly, without the recognizer
    pipeline around it.) Frames of one size run through the network ``batch_frames`` at a time: a
    frame's boxes are the same as when it runs alone (tested)."""

    def __init__(self, placement: Placement, limit_side: int = 256, min_score: float = 0.5, threads: int = 1,
                 *, batch_frames: int):
        from rapidocr_onnxruntime import RapidOCR

        # the thread count is one of RapidOCR's global settings (it overwrites a per-model one);
        # -1 is its "every core"
        ocr = RapidOCR(det_limit_side_len=limit_side, det_limit_type="max", det_box_thresh=min_score,
                       det_use_cuda=placement.cuda, intra_op_num_threads=threads or -1)
        self._det = ocr.text_det
        self.session = self._det.infer.session
        self.limit_side = limit_side
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        small = [self._shrink(rgb)[..., ::-1] for rgb in frames]  # the detector reads BGR
        shares = [0.0] * len(small)
        by_size: dict[tuple[int, int], list[int]] = {}
        for i, bgr in enumerate(small):
            by_size.setdefault(bgr.shape[:2], []).append(i)
        for size, indices in by_size.items():
            prepare = self._det.get_preprocess(max(size))
            for start in range(0, len(indices), self.batch_frames):
                batch = indices[start : start + self.batch_frames]
                inputs = [prepare(np.ascontiguousarray(small[i])) for i in batch]
                self.calls += len(batch)
                self.batches += 1
                record_calls(len(batch))
                if any(x is None for x in inputs):  # the detector's resize refused this size: no text found
                    continue
                (maps,) = self._det.infer(np.concatenate(inputs))[:1]
                for i, text_map in zip(batch, maps, strict=True):
                    boxes, _ = self._det.postprocess_op(text_map[None], size)
                    boxes = self._det.filter_tag_det_res(boxes, size)
                    mask = np.zeros(size, np.uint8)
                    for box in boxes:
                        cv2.fillPoly(mask, [np.asarray(box, dtype=np.int32).reshape(-1, 2)], 1)
                    shares[i] = float(mask.mean())
        return shares

    def _shrink(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        scale = min(1.0, self.limit_side / max(h, w))
        return cv2.resize(rgb, (max(1, round(w * scale)), max(1, round(h * scale))),
                          interpolation=cv2.INTER_AREA) if scale < 1 else rgb
