"""What a global stage read on its last run, kept so that its next run reads and writes about as
much of it as changed: the version of every partition of each input table, per input store in
buckets by partition name (a new drop's partitions fall in one bucket of each store), and the small
rest (the stage's full version, when it read, the versions of tables without partitions, how many
partitions each table had) in one meta object.

A store's bucket count grows with its partitions (``BUCKET_PARTITIONS`` per bucket at most, counts
doubling): a growth, a first run or a table listed whole rewrites that store's buckets once; every
other run rewrites the buckets its changed partitions fall in. The meta object is written last:
a run that stops before it leaves the previous meta, whose older read time makes the next run look
at the same partitions again."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes

BUCKET_PARTITIONS = 256
"""Partitions per bucket of one store's stored versions, at most (a bucket holds every input
table's versions of its partitions)."""

Where = tuple[str, str]
"""(input store: "" for the stage's own store, else its URI; table)."""


def bucket_count(partitions: int) -> int:
    """The buckets for ``partitions``: the smallest power of two holding them ``BUCKET_PARTITIONS``
    to a bucket."""
    count = 1
    while partitions > count * BUCKET_PARTITIONS:
        count *= 2
    return count


def bucket_of(partition: str, buckets: int) -> int:
    return zlib.crc32(partition.encode()) % buckets


class StoredInputVersions:
    """The stored versions under ``prefix`` (``state/inputs/<stage>``), read a bucket at a time."""

    def __init__(self, objects: ObjectStore, prefix: str):
        self.objects, self.prefix = objects, prefix
        self.meta_key = f"{prefix}/meta.json"
        meta = json.loads(objects.get_bytes(self.meta_key)) if objects.exists(self.meta_key) else None
        self.found = meta is not None
        meta = meta or {}
        self.version: str | None = meta.get("version")
        self.read_at: int = int(meta.get("read_at", 0))
        self.whole: dict[Where, dict[str, str]] = {
            (e["store"], e["table"]): e["versions"] for e in meta.get("unpartitioned", [])}
        """Tables without partitions: their versions (one or a few), kept in the meta object."""
        self.counts: dict[Where, int] = {(e["store"], e["table"]): int(e["count"]) for e in meta.get("partitioned", [])}
        """Partitioned tables: how many partitions each had."""
        self.buckets: dict[str, int] = dict(meta.get("buckets", {}))
        self._loaded: dict[tuple[str, int], dict[str, dict[str, str]]] = {}
        self.buckets_read = 0

    def known(self, where: Where) -> bool:
        return where in self.whole or where in self.counts

    def _key(self, store: str, buckets: int, bucket: int) -> str:
        return f"{self.prefix}/{hashlib.sha1(store.encode()).hexdigest()[:12]}/b{buckets:05d}-{bucket:05d}.parquet"

    def _bucket(self, store: str, bucket: int) -> dict[str, dict[str, str]]:
        """Table -> {partition: version} of one stored bucket."""
        if (store, bucket) not in self._loaded:
            key, held = self._key(store, self.buckets[store], bucket), {}
            if self.objects.exists(key):
                frame = from_parquet_bytes(self.objects.get_bytes(key))
                for table, rows in frame.groupby("table", sort=False):
                    held[table] = dict(zip(rows.partition, rows.version, strict=True))
                self.buckets_read += 1
            self._loaded[store, bucket] = held
        return self._loaded[store, bucket]

    def versions_of(self, where: Where, partitions: Iterable[str]) -> dict[str, str]:
        """The stored versions of ``partitions`` (those it had) of the partitioned input ``where``."""
        store, table = where
        if where not in self.counts or store not in self.buckets:
            return {}
        found = {}
        for part in partitions:
            version = self._bucket(store, bucket_of(part, self.buckets[store])).get(table, {}).get(part)
            if version is not None:
                found[part] = version
        return found

    def every(self, where: Where) -> dict[str, str] | None:
        """Every stored version of ``where`` (None: not stored); reads all of its store's buckets."""
        if where in self.whole:
            return dict(self.whole[where])
        store, table = where
        if where not in self.counts:
            return None
        found: dict[str, str] = {}
        for bucket in range(self.buckets.get(store, 0)):
            found.update(self._bucket(store, bucket).get(table, {}))
        return found

    def write(self, version: str, read_at: int, whole: Mapping[Where, Mapping[str, str]],
              listed: Mapping[Where, Mapping[str, str]], changed: Mapping[Where, Mapping[str, str | None]],
              counts: Mapping[Where, int]) -> None:
        """Store a run's read: ``whole`` (tables without partitions), ``listed`` (partitioned tables
        listed whole: every version), ``changed`` (partitioned tables read through the journal: the
        versions of the partitions written since, None for one removed) and every partitioned
        table's partition ``counts``."""
        stores = sorted({store for store, _ in [*listed, *changed]})
        buckets = {}
        for store in stores:
            largest = max(counts[w] for w in counts if w[0] == store)
            buckets[store] = bucket_count(largest)
            inputs = [w for w in [*listed, *changed] if w[0] == store]
            if buckets[store] != self.buckets.get(store) or any(w in listed for w in inputs):
                self._rewrite(store, buckets[store], {w: listed[w] if w in listed else self._overlaid(w, changed[w])
                                                       for w in inputs})
            else:
                self._update(store, {w: changed[w] for w in inputs})
        meta = {"version": version, "read_at": read_at, "buckets": buckets,
                "unpartitioned": [{"store": s, "table": t, "versions": dict(v)} for (s, t), v in sorted(whole.items())],
                "partitioned": [{"store": s, "table": t, "count": int(n)} for (s, t), n in sorted(counts.items())]}
        self.objects.put_bytes(self.meta_key, json.dumps(meta, sort_keys=True).encode())
        for store in stores:
            if buckets[store] != self.buckets.get(store):
                self._prune(store, buckets[store])
        self.buckets = buckets

    def _overlaid(self, where: Where, changed: Mapping[str, str | None]) -> dict[str, str]:
        found = self.every(where) or {}
        for part, version in changed.items():
            if version is None:
                found.pop(part, None)
            else:
                found[part] = version
        return found

    def _put(self, store: str, buckets: int, bucket: int, held: Mapping[str, Mapping[str, str]]) -> None:
        rows = [(table, part, version) for table, parts in sorted(held.items()) for part, version in sorted(parts.items())]
        self.objects.put_bytes(self._key(store, buckets, bucket),
                               to_parquet_bytes(pd.DataFrame(rows, columns=["table", "partition", "version"])))

    def _rewrite(self, store: str, buckets: int, versions: Mapping[Where, Mapping[str, str]]) -> None:
        held: list[dict[str, dict[str, str]]] = [{} for _ in range(buckets)]
        for (_, table), parts in versions.items():
            for part, version in parts.items():
                held[bucket_of(part, buckets)].setdefault(table, {})[part] = version
        for bucket, tables in enumerate(held):
            self._put(store, buckets, bucket, tables)
        self._loaded = {k: v for k, v in self._loaded.items() if k[0] != store}

    def _update(self, store: str, changed: Mapping[Where, Mapping[str, str | None]]) -> None:
        buckets, touched = self.buckets[store], {}
        for (_, table), parts in changed.items():
            for part, version in parts.items():
                held = touched.setdefault(bucket_of(part, buckets), self._bucket(store, bucket_of(part, buckets)))
                if version is None:
                    held.get(table, {}).pop(part, None)
                else:
                    held.setdefault(table, {})[part] = version
        for bucket, held in sorted(touched.items()):
            self._put(store, buckets, bucket, held)

    def _prune(self, store: str, buckets: int) -> None:
        """Delete the store's buckets of another count (a count that grew)."""
        keep = f"/b{buckets:05d}-"
        folder = self._key(store, buckets, 0).rsplit("/", 1)[0]
        for info in list(self.objects.list(folder)):
            if keep not in info.key:
                self.objects.delete(info.key)
