"""No-reference image quality: BRISQUE (brisque package; its SVR model ships in the wheel).
Raw BRISQUE is ~0 (pristine) to ~100 (very distorted); lower is better."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement


class BrisqueQuality:
    def __init__(self, placement: Placement) -> None:
        from brisque import BRISQUE

        self._model = BRISQUE(url=False)  # a feature extractor + SVR in numpy: CPU wherever it runs
        self.calls = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        out = []
        for rgb in frames:
            self.calls += 1
            record_calls()
            out.append(float(self._model.score(rgb)))
        return out
