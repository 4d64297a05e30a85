"""State files of the incremental global stages: NumPy arrays plus a JSON part in one ``.npz``
object, and append-only chunk series (a run appends its new rows as one chunk; the series is
merged into one chunk now and then), so a run writes what it added, not everything it holds."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from vidassets.storage.objects import ObjectStore

MAX_CHUNKS = 16  # chunks of a series before a save merges them into one


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

    def next_key(self) -> str:
        seqs = [int(k.rsplit("/", 1)[-1].split(".")[0]) for k in self.listed()]
        return f"{self.prefix}/{1 + max([0, *seqs]):08d}.npz"

    def prune(self, current: list[str]) -> None:
        for key in self.listed():
            if key not in current:
                self.objects.delete(key)

    def kept(self, meta_key: str, stored_rows: int | None) -> tuple[list[str], int]:
        """(the chunks a save keeps, the first row its new chunk holds): the chunks the meta object
        lists when the store holds the first ``stored_rows`` rows (None: it holds none of them) and
        they are fewer than MAX_CHUNKS; else none, and the new chunk holds every row."""
        old = load_npz(self.objects, meta_key)
        chunks = list(old[0]["chunks"]) if old is not None and stored_rows is not None else []
        if not chunks or len(chunks) >= MAX_CHUNKS:
            return [], 0
        return chunks, stored_rows
