"""Speech presence: Silero VAD (its ONNX weights ship inside the ``silero-vad`` wheel), run by our own
ONNX Runtime session so that it is placed and threaded like every other model.

The network reads 16 kHz mono audio in 512-sample windows (32 ms), each with the previous window's
last 64 samples as context, and carries a recurrent state; it returns the speech probability of
each window. ``segments`` turns probabilities into speech spans with hysteresis (speech starts at
``threshold``, ends below ``threshold - 0.15``), dropping spans shorter than ``min_speech_s`` and
closing gaps shorter than ``min_silence_s``.
"""

from __future__ import annotations

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement, package_dir

RATE = 16000
WINDOW = 512
CONTEXT = 64


def weights_path():
    return package_dir("silero_vad") / "data" / "silero_vad.onnx"


class SileroVad:
    def __init__(self, placement: Placement, threshold: float = 0.5, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or 0
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(weights_path()), options, providers=placement.onnx_providers())
        self.threshold = threshold
        self.calls = 0

    def probabilities(self, samples: np.ndarray) -> np.ndarray:
        """Speech probability per 32 ms window of 16 kHz mono float samples in [-1, 1]."""
        x = np.asarray(samples, dtype=np.float32).ravel()
        n = int(np.ceil(len(x) / WINDOW)) if len(x) else 0
        if not n:
            return np.zeros(0, np.float32)
        x = np.pad(x, (0, n * WINDOW - len(x)))
        state = np.zeros((2, 1, 128), np.float32)
        context = np.zeros(CONTEXT, np.float32)
        sr = np.array(RATE, dtype=np.int64)
        out = np.empty(n, np.float32)
        for i in range(n):
            window = x[i * WINDOW:(i + 1) * WINDOW]
            prob, state = self.session.run(None, {"input": np.concatenate([context, window])[None, :],
                                                   "state": state, "sr": sr})
            out[i] = float(prob[0, 0])
            context = window[-CONTEXT:]
        self.calls += 1
        record_calls(1)
        return out

    def segments(self, samples: np.ndarray, min_speech_s: float = 0.25,
                 min_silence_s: float = 0.1) -> list[tuple[float, float]]:
        """Speech spans in seconds."""
        probs = self.probabilities(samples)
        step = WINDOW / RATE
        spans: list[list[float]] = []
        start = None
        for i, p in enumerate(probs):
            if start is None and p >= self.threshold:
                start = i * step
            elif start is not None and p < self.threshold - 0.15:
                spans.append([start, i * step])
                start = None
        if start is not None:
            spans.append([start, len(probs) * step])
        merged: list[list[float]] = []
        for span in spans:
            if merged and span[0] - merged[-1][1] < min_silence_s:
                merged[-1][1] = span[1]
            else:
                merged.append(span)
        end = len(samples) / RATE
        return [(round(a, 3), round(min(b, end), 3)) for a, b in merged if b - a >= min_speech_s]
