"""Which Dagster partition each drop belongs to.

With ``bucket.drops_per_partition`` = 1 (the default) a drop is its own partition: its key is the
drop key (``<tier>/<drop_id>``) and nothing is recorded here. With K > 1, drops are put in batches
of K in the order they are first seen, per source tier, and a batch is one partition, keyed
``<tier>/~batch-<n>`` (``~`` never appears in a drop key, so no batch key is a drop key). Storage stays
per drop: every table, row and lineage record names the drop, never the batch.

An assignment is recorded when a drop is first seen and never recomputed: changing K later moves no
drop (batches opened afterwards take the new size; drops that were their own partitions stay so).
Two records, written in this order: each batch's members (``members/<tier>/<n>.json``: what a step
of that partition reads, K names) and the whole drop -> partition table (``drops.parquet``: what a
sensor reads once per tick, one object of ~10 bytes a drop). A stop between the two leaves a drop
listed as a member but not recorded: the next assignment puts it in the same open batch again (a
member is listed once).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes

PREFIX = "state/partitions"
BATCH_MARK = "~batch-"


def is_batch(partition: str) -> bool:
    """Whether a partition key names a batch of drops (else it is a drop's own key)."""
    return f"/{BATCH_MARK}" in partition


def batch_key(tier: str, number: int) -> str:
    return f"{tier}/{BATCH_MARK}{number:06d}"


def _number(partition: str) -> int:
    return int(partition.rsplit(BATCH_MARK, 1)[1])


class DropBatches:
    """The recorded drop -> partition assignment in a store (``state/partitions/``)."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self.record_key = f"{PREFIX}/drops.parquet"
        self._recorded: dict[str, str] | None = None

    def _members_key(self, partition: str) -> str:
        tier = partition.split("/", 1)[0]
        return f"{PREFIX}/members/{tier}/{_number(partition):06d}.json"

    def recorded(self) -> dict[str, str]:
        """Drop -> batch partition of every drop put in a batch (one object read)."""
        if self._recorded is None:
            self._recorded = {}
            if self.objects.exists(self.record_key):
                frame = from_parquet_bytes(self.objects.get_bytes(self.record_key))
                self._recorded = dict(zip(frame["drop"], frame["partition"], strict=True))
        return self._recorded

    def drops_of(self, partition: str) -> list[str]:
        """The drops a partition holds, in the order they joined it (a drop key: itself)."""
        if not is_batch(partition):
            return [partition]
        key = self._members_key(partition)
        return list(json.loads(self.objects.get_bytes(key))) if self.objects.exists(key) else []

    def partition_of(self, drops: Iterable[str]) -> dict[str, str]:
        """Each drop's partition: its batch if it was put in one, else the drop's own key."""
        recorded = self.recorded()
        return {drop: recorded.get(drop, drop) for drop in drops}

    def newest(self) -> dict[str, str]:
        """Each tier's newest batch: the one the tier's next new drop joins while it has room."""
        newest: dict[str, str] = {}
        for partition in set(self.recorded().values()):
            tier = partition.split("/", 1)[0]
            if tier not in newest or _number(partition) > _number(newest[tier]):
                newest[tier] = partition
        return newest

    def assign(self, drops: Iterable[str], per_partition: int) -> dict[str, str]:
        """The partition of each of ``drops``, recording the batch of those not yet recorded.
        ``drops`` must not include drops that are already their own partitions (with K = 1 every
        drop is, and nothing is written)."""
        if per_partition < 1:
            raise ValueError(f"bucket.drops_per_partition must be at least 1, got {per_partition}")
        recorded = self.recorded()
        drops = list(dict.fromkeys(drops))
        new = [d for d in drops if d not in recorded]
        if per_partition == 1 or not new:
            return self.partition_of(drops)
        sizes = Counter(recorded.values())
        newest = self.newest()
        joined: dict[str, list[str]] = {}
        for drop in sorted(new):
            tier = drop.split("/", 1)[0]
            open_batch = newest.get(tier)
            if open_batch is None or sizes[open_batch] >= per_partition:
                open_batch = newest[tier] = batch_key(tier, _number(open_batch) + 1 if open_batch else 0)
            sizes[open_batch] += 1
            joined.setdefault(open_batch, []).append(drop)
            recorded[drop] = open_batch
        for partition, members in sorted(joined.items()):
            held = self.drops_of(partition)
            self.objects.put_bytes(self._members_key(partition),
                                   json.dumps(held + [d for d in members if d not in held]).encode())
        frame = pd.DataFrame(sorted(recorded.items()), columns=["drop", "partition"])
        self.objects.put_bytes(self.record_key, to_parquet_bytes(frame))
        return self.partition_of(drops)
