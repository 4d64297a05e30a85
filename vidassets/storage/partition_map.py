"""Partition -> a small JSON value, stored so that a run changing a few partitions reads and writes
about as much as it changed: the values in buckets by partition name (``BUCKET_PARTITIONS`` to a
bucket at most, the bucket count doubling as the partitions grow: every bucket rewritten once then,
the old ones deleted), and an index object with the bucket count, the partition count and the
owner's own summary (``meta``).

A write is made safe against a stop half-way by writing its changes into the index first (with the
new ``meta``), then the buckets, then the index without them: a reader that finds changes in the
index applies them to its buckets before reading (setting a value twice is harmless), so the
``meta`` it reads always agrees with the values."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes

BUCKET_PARTITIONS = 256
"""Partitions per bucket, at most."""


def bucket_count(items: int, per_bucket: int | None = None) -> int:
    """The smallest power of two of buckets holding ``items`` at ``per_bucket`` to a bucket (None:
    this map's ``BUCKET_PARTITIONS``; ``GroupedTable`` passes its own)."""
    per_bucket = per_bucket or BUCKET_PARTITIONS
    count = 1
    while items > count * per_bucket:
        count *= 2
    return count


def bucket_of(name: str, buckets: int) -> int:
    """The bucket a partition (or group) ``name`` falls in, of ``buckets``."""
    return zlib.crc32(name.encode()) % buckets


class PartitionMap:
    """The map under ``prefix`` (``<prefix>/index.json``, ``<prefix>/b<count>-<bucket>.parquet``)."""

    def __init__(self, objects: ObjectStore, prefix: str):
        self.objects, self.prefix = objects, prefix
        self.index_key = f"{prefix}/index.json"
        index = json.loads(objects.get_bytes(self.index_key)) if objects.exists(self.index_key) else {}
        self.found = bool(index)
        self.buckets: int = int(index.get("buckets", 0))
        self.count: int = int(index.get("count", 0))
        self.meta: dict[str, Any] = index.get("meta", {})
        self._loaded: dict[int, dict[str, Any]] = {}
        self._prune_after: int | None = None  # a bucket count replaced: its buckets go once the index names the new
        self.buckets_read = 0
        if index.get("pending"):  # a write that stopped after its index: finish it
            self._apply(index["pending"])
            self._put_index(self.meta, {})

    def _key(self, buckets: int, bucket: int) -> str:
        return f"{self.prefix}/b{buckets:05d}-{bucket:05d}.parquet"

    def _bucket(self, bucket: int) -> dict[str, Any]:
        if bucket not in self._loaded:
            key, held = self._key(self.buckets, bucket), {}
            if self.objects.exists(key):
                frame = from_parquet_bytes(self.objects.get_bytes(key))
                held = {p: json.loads(v) for p, v in zip(frame.partition, frame.value, strict=True)}
                self.buckets_read += 1
            self._loaded[bucket] = held
        return self._loaded[bucket]

    def get(self, partitions: Iterable[str]) -> dict[str, Any]:
        """The values of those of ``partitions`` the map holds (reads their buckets)."""
        if not self.buckets:
            return {}
        found = {}
        for part in partitions:
            held = self._bucket(bucket_of(part, self.buckets))
            if part in held:
                found[part] = held[part]
        return found

    def every(self) -> dict[str, Any]:
        """Every value (reads every bucket)."""
        found: dict[str, Any] = {}
        for bucket in range(self.buckets):
            found.update(self._bucket(bucket))
        return found

    def write(self, changes: Mapping[str, Any], meta: Mapping[str, Any] | None = None, whole: bool = False) -> None:
        """Set each changed partition's value (None: remove it) and the owner's ``meta``; ``whole``:
        ``changes`` is every value (the rest removed)."""
        meta = dict(self.meta if meta is None else meta)
        if whole:
            self._rewrite(bucket_count(len(changes)), {p: v for p, v in changes.items() if v is not None})
            self._put_index(meta, {})
            return
        held = self.get(changes)
        count = self.count + sum((v is not None) - (p in held) for p, v in changes.items())
        if bucket_count(count) != self.buckets:
            values = self.every()
            for part, value in changes.items():
                if value is None:
                    values.pop(part, None)
                else:
                    values[part] = value
            self._rewrite(bucket_count(count), values)
            self._put_index(meta, {})
            return
        self.count = count
        self._put_index(meta, dict(changes))
        self._apply(changes)
        self._put_index(meta, {})

    def _apply(self, changes: Mapping[str, Any]) -> None:
        touched: dict[int, dict[str, Any]] = {}
        for part, value in changes.items():
            bucket = bucket_of(part, self.buckets)
            held = touched.setdefault(bucket, self._bucket(bucket))
            if value is None:
                held.pop(part, None)
            else:
                held[part] = value
        for bucket, held in sorted(touched.items()):
            self._put(self.buckets, bucket, held)

    def _put(self, buckets: int, bucket: int, held: Mapping[str, Any]) -> None:
        rows = [(part, json.dumps(value, sort_keys=True)) for part, value in sorted(held.items())]
        self.objects.put_bytes(self._key(buckets, bucket), to_parquet_bytes(pd.DataFrame(rows, columns=["partition", "value"])))

    def _rewrite(self, buckets: int, values: Mapping[str, Any]) -> None:
        held: list[dict[str, Any]] = [{} for _ in range(buckets)]
        for part, value in values.items():
            held[bucket_of(part, buckets)][part] = value
        for bucket, part_values in enumerate(held):
            self._put(buckets, bucket, part_values)
        old, self.buckets, self.count = self.buckets, buckets, len(values)
        self._loaded = dict(enumerate(held))
        if old and old != buckets:
            self._prune_after = old

    def _put_index(self, meta: Mapping[str, Any], pending: Mapping[str, Any]) -> None:
        self.meta = dict(meta)
        self.objects.put_bytes(self.index_key, json.dumps(
            {"buckets": self.buckets, "count": self.count, "meta": self.meta, "pending": pending}, sort_keys=True).encode())
        if self._prune_after:
            for bucket in range(self._prune_after):
                self.objects.delete(self._key(self._prune_after, bucket))
            self._prune_after = None
