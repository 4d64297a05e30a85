"""What a global stage read on its last run, kept so that its next run reads and writes about as
much of it as changed: the version of every partition of each input table, per input store a
``PartitionMap`` (partition -> {table: version}: a new drop's partitions fall in one bucket of each
store), and the small rest (the stage's full version, when it read, the versions of tables without
partitions, how many partitions each table had) in one meta object, written last: a run that stops
before it leaves the previous meta, whose older read time makes the next run look at the same
partitions again."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Container, Iterable, Mapping

from vidassets.storage.objects import ObjectStore
from vidassets.storage.partition_map import PartitionMap

Where = tuple[str, str]
"""(input store: "" for the stage's own store, else its URI; table)."""


def told_every_change(count: int, told: Iterable[str], stored: Container[str], current: Collection[str]) -> bool:
    """Whether the drops a stage was told changed account for every change since its last run: the
    drop ``count`` its state kept, plus the told drops that arrived, less the told drops that left,
    must be the number of ``current`` drops (a drop added or removed untold makes it differ: the
    stage compares every drop then). ``stored``: the told drops its state holds; ``current``: the
    drops there are (its length is asked, not its members listed)."""
    told = set(told)
    arrived = sum(p in current and p not in stored for p in told)
    left = sum(p in stored and p not in current for p in told)
    return count + arrived - left == len(current)


class StoredInputVersions:
    """The stored versions under ``prefix`` (``state/inputs/<stage>``), read a bucket at a time."""

    def __init__(self, objects: ObjectStore, prefix: str):
        self.objects, self.prefix = objects, prefix
        self.meta_key = f"{prefix}/meta.json"
        meta = json.loads(objects.get_bytes(self.meta_key)) if objects.exists(self.meta_key) else {}
        self.version: str | None = meta.get("version")
        self.read_at: int = int(meta.get("read_at", 0))
        self.whole: dict[Where, dict[str, str]] = {
            (e["store"], e["table"]): e["versions"] for e in meta.get("unpartitioned", [])}
        """Tables without partitions: their versions (one or a few), kept in the meta object."""
        self.counts: dict[Where, int] = {(e["store"], e["table"]): int(e["count"]) for e in meta.get("partitioned", [])}
        """Partitioned tables: how many partitions each had."""
        self._maps: dict[str, PartitionMap] = {}

    @property
    def buckets_read(self) -> int:
        return sum(m.buckets_read for m in self._maps.values())

    def known(self, where: Where) -> bool:
        """Whether the last run's versions of input ``where`` are stored (a partitioned table's are
        not when its store's map is missing: it is then listed whole, never read as empty)."""
        return where in self.whole or (where in self.counts and self._map(where[0]).found)

    def _map(self, store: str) -> PartitionMap:
        if store not in self._maps:
            self._maps[store] = PartitionMap(self.objects, f"{self.prefix}/{hashlib.sha1(store.encode()).hexdigest()[:12]}")
        return self._maps[store]

    def versions_of(self, where: Where, partitions: Iterable[str]) -> dict[str, str]:
        """The stored versions of ``partitions`` (those it had) of the partitioned input ``where``."""
        store, table = where
        if not self.known(where):
            return {}
        return {p: v[table] for p, v in self._map(store).get(partitions).items() if table in v}

    def every(self, where: Where) -> dict[str, str] | None:
        """Every stored version of ``where`` (None: not stored); reads all of its store's buckets."""
        if where in self.whole:
            return dict(self.whole[where])
        store, table = where
        if not self.known(where):
            return None
        return {p: v[table] for p, v in self._map(store).every().items() if table in v}

    def write(self, version: str, read_at: int, whole: Mapping[Where, Mapping[str, str]],
              listed: Mapping[Where, Mapping[str, str]], changed: Mapping[Where, Mapping[str, str | None]],
              counts: Mapping[Where, int]) -> None:
        """Store a run's read: ``whole`` (tables without partitions), ``listed`` (partitioned tables
        listed whole: every version), ``changed`` (partitioned tables read through the journal: the
        versions of the partitions written since, None for one removed) and every partitioned
        table's partition ``counts``."""
        for store in sorted({store for store, _ in [*listed, *changed]}):
            inputs = [w for w in [*listed, *changed] if w[0] == store]
            if any(w in listed for w in inputs):  # a table listed whole: the store's versions written whole
                values: dict[str, dict[str, str]] = {}
                for w in inputs:
                    for part, v in (listed[w] if w in listed else self.overlaid(w, changed[w])).items():
                        values.setdefault(part, {})[w[1]] = v
                self._map(store).write(values, whole=True)
                continue
            touched = {part for w in inputs for part in changed[w]}
            values = self._map(store).get(touched)
            updates = {}
            for part in touched:
                value = dict(values.get(part, {}))
                for w in inputs:
                    if part in changed[w]:
                        if changed[w][part] is None:
                            value.pop(w[1], None)
                        else:
                            value[w[1]] = changed[w][part]
                updates[part] = value or None
            self._map(store).write(updates)
        meta = {"version": version, "read_at": read_at,
                "unpartitioned": [{"store": s, "table": t, "versions": dict(v)} for (s, t), v in sorted(whole.items())],
                "partitioned": [{"store": s, "table": t, "count": int(n)} for (s, t), n in sorted(counts.items())]}
        self.objects.put_bytes(self.meta_key, json.dumps(meta, sort_keys=True).encode())

    def overlaid(self, where: Where, changed: Mapping[str, str | None]) -> dict[str, str]:
        """Every stored version of ``where`` with ``changed`` laid over it (None: the partition is gone)."""
        found = self.every(where) or {}
        for part, version in changed.items():
            if version is None:
                found.pop(part, None)
            else:
                found[part] = version
        return found
