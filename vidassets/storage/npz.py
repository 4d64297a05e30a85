"""State files of the incremental global stages: NumPy arrays plus a JSON part in one ``.npz``
object, and chunk series (a run writes its new rows as one chunk; the owner merges chunks as it
sees fit), so a run writes what it added, not everything it holds."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from vidassets.storage.objects import ObjectStore


def put_npz(objects: ObjectStore, key: str, meta: dict[str, Any], **arrays: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    objects.put_bytes(key, buffer.getvalue())


def load_npz(objects: ObjectStore, key: str) -> tuple[dict[str, Any], Any] | None:
    """(the JSON part, the arrays), or None when the object does not exist."""
    if not objects.exists(key):
        return None
    data = np.load(io.BytesIO(objects.get_bytes(key)))
    return json.loads(data["meta"].tobytes()), data


class ChunkSeries:
    """Chunk objects ``<prefix>/chunks/<seq>.npz``: which ones are current is recorded by the caller
    (in its own meta object, written after the chunk), so a crash between the two leaves a stray
    chunk that the next ``prune`` deletes, never a half state."""

    def __init__(self, objects: ObjectStore, prefix: str):
        self.objects, self.prefix = objects, f"{prefix}/chunks"

    def listed(self) -> list[str]:
        return sorted(i.key for i in self.objects.list(self.prefix) if i.key.endswith(".npz"))

    def seqs(self) -> list[int]:
        """The sequence numbers of the chunk objects there are (``<seq>.npz``)."""
        return [int(k.rsplit("/", 1)[-1].split(".")[0]) for k in self.listed()]

    def prune(self, current: list[str]) -> None:
        for key in self.listed():
            if key not in current:
                self.objects.delete(key)
