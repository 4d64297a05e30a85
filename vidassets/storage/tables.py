"""Catalog tables: one Parquet file per (asset, partition), validated by its pandera schema on
write and written atomically, and content-addressed blobs.

Layout under a store root::

    tables/<table>/<partition key>.parquet   (partition keys may contain '/': <tier>/<drop>)
    tables/<table>/_all.parquet              (unpartitioned tables)
    blobs/<kind>/<sha[:2]>/<sha><suffix>
    handoff/<partition key>/<table>/<asset_id>.parquet   (rows handed to a drop that now holds the asset)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
from vidassets.storage.schemas import SCHEMAS

UNPARTITIONED = "_all"
HANDOFF = "handoff"


class TableStore:
    """Reads and writes catalog tables in one object store."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self.uri = objects.uri

    @staticmethod
    def key(table: str, partition: str | None = None) -> str:
        return f"tables/{table}/{partition or UNPARTITIONED}.parquet"

    def write(
        self,
        table: str,
        partition: str | None,
        rows: pd.DataFrame | Sequence[Mapping[str, Any]],
    ) -> pd.DataFrame:
        """Validate ``rows`` against the table's schema and replace the partition's file atomically.
        Returns the validated frame (columns in schema order)."""
        schema = SCHEMAS[table]
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        frame = conform(frame, table)
        frame = schema.validate(frame, lazy=True)
        key, data = self.key(table, partition), to_parquet_bytes(frame)
        # Identical contents are not rewritten, so a table's version only changes when its rows do
        # (incremental consumers such as dedup rely on that).
        if not (self.objects.exists(key) and self.objects.get_bytes(key) == data):
            self.objects.put_bytes(key, data)
        return frame

    def version(self, table: str, partition: str | None = None) -> str | None:
        """Identity of the table file's current contents (changes whenever it is rewritten)."""
        return self.objects.version(self.key(table, partition))

    def exists(self, table: str, partition: str | None = None) -> bool:
        return self.objects.exists(self.key(table, partition))

    def read(self, table: str, partition: str | None = None) -> pd.DataFrame:
        """The stored table; columns its schema gained since it was written read as nulls."""
        data = self.objects.get_bytes(self.key(table, partition))
        frame = from_parquet_bytes(data)
        schema = SCHEMAS.get(table)
        for name in schema.columns if schema is not None else ():
            if name not in frame.columns:
                frame[name] = pd.Series([None] * len(frame), dtype=object, index=frame.index)
        return frame

    def read_or_empty(self, table: str, partition: str | None = None) -> pd.DataFrame:
        if not self.exists(table, partition):
            return conform(pd.DataFrame(), table)
        return self.read(table, partition)

    def partitions(self, table: str) -> list[str]:
        return sorted(self.versions(table))

    def versions(self, table: str) -> dict[str, str]:
        """Every partition's ``version`` from one listing (paginated on S3): a request per 1,000
        partitions, not one per partition. The unpartitioned file is keyed ``_all``."""
        prefix = f"tables/{table}"
        found = {}
        for info in self.objects.list(prefix):
            name = info.key[len(prefix) + 1 :]
            if name.endswith(".parquet") and not name.rsplit("/", 1)[-1].startswith("."):
                found[name[: -len(".parquet")]] = info.version
        return found

    # -- rows handed over between partitions (a canonical copy that moved to another drop) ----------
    @staticmethod
    def _handoff_prefix(partition: str, table: str) -> str:
        return f"{HANDOFF}/{partition}/{table}/"

    def hand_over(self, tables: Iterable[str], source: str, target: str, asset_id: str,
                  rewrite: Mapping[str, Any]) -> int:
        """Copy ``source``'s rows of ``asset_id`` in each table to ``target``'s hand-over area, with
        the ``rewrite`` columns set (the new copy's uri and drop): ``target``'s next steps reuse them
        as if they were its own (same bytes, same versions), so nothing is decoded again."""
        moved = 0
        for table in tables:
            rows = self.read_or_empty(table, source)
            if not len(rows) or "asset_id" not in rows.columns:
                continue
            mine = rows[rows.asset_id == asset_id].copy()
            if not len(mine):
                continue
            for column, value in rewrite.items():
                if column in mine.columns:
                    mine[column] = value
            self.objects.put_bytes(f"{self._handoff_prefix(target, table)}{asset_id}.parquet", to_parquet_bytes(mine))
            moved += len(mine)
        return moved

    def previous(self, table: str, partition: str) -> pd.DataFrame:
        """The partition's stored rows plus rows handed over to it for assets it has no rows of: what
        a step reuses from."""
        own = self.read_or_empty(table, partition)
        handed = [from_parquet_bytes(self.objects.get_bytes(info.key))
                  for info in self.objects.list(self._handoff_prefix(partition, table)) if info.key.endswith(".parquet")]
        if not handed:
            return own
        extra = pd.concat(handed, ignore_index=True)
        if len(own) and "asset_id" in own.columns:
            extra = extra[~extra.asset_id.isin(set(own.asset_id))]
        return pd.concat([own, extra], ignore_index=True) if len(own) else extra.reset_index(drop=True)

    def read_all(self, table: str, partitions: Iterable[str] | None = None) -> pd.DataFrame:
        keys = list(partitions) if partitions is not None else self.partitions(table)
        frames = [self.read(table, None if k == UNPARTITIONED else k) for k in keys]
        frames = [f for f in frames if len(f)]
        if not frames:
            return conform(pd.DataFrame(), table)
        return pd.concat(frames, ignore_index=True)

    def tables(self) -> list[str]:
        return self.objects.list_dirs("tables")


def partition_fingerprints(tables: TableStore, names: tuple[str, ...], over: str | None = None) -> dict[str, str]:
    """Per partition (of table ``over``, else of any of ``names``), the versions of the table files
    a global stage reads: a rebuilt table changes it. One listing per table, no request per file."""
    versions = {name: tables.versions(name) for name in names}
    parts = set(versions[over]) if over else set().union(*versions.values())
    return {part: "|".join(str(versions[name].get(part)) for name in names) for part in sorted(parts)}


def conform(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """Add missing columns as nulls and order columns as the schema lists them. Columns the schema
    does not know are an error (a typo must not silently vanish)."""
    schema = SCHEMAS[table]
    frame = frame.copy()
    for name in schema.columns:
        if name not in frame.columns:
            frame[name] = pd.Series([None] * len(frame), dtype=object, index=frame.index)
    extra = [c for c in frame.columns if c not in schema.columns]
    if extra:
        raise ValueError(f"table {table}: columns not in its schema: {extra}")
    return frame[list(schema.columns)]


def put_blob(objects: ObjectStore, kind: str, data: bytes, suffix: str = "") -> str:
    """Store ``data`` content-addressed; returns its key. Existing blobs are never rewritten."""
    digest = hashlib.sha256(data).hexdigest()
    key = f"blobs/{kind}/{digest[:2]}/{digest}{suffix}"
    objects.put_if_absent(key, data)
    return key
