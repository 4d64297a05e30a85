"""An unpartitioned table written a few groups (drops) at a time, stored so that a write costs the
groups it replaced and a reader of some groups reads those groups' bucket, not the table.

Layout under ``tables/<table>``::

    _groups/index.json                  {"by", "buckets", "groups", "rows", "seq", "epoch"}
    _groups/b<buckets>-<bucket>.parquet the rows of the groups hashing to that bucket
    _delta/<seq>.parquet                the log: each write's rows and the groups it replaced

The rows live in buckets by group (``BUCKET_GROUPS`` groups to a bucket at most, the bucket count
doubling as the groups grow: every row rewritten once then, so a group's share of those rewrites
stays constant however many groups came before). A write of some groups appends their rows to the
log, rewrites the buckets they fall in, then the index (which names the last log entry applied);
a write stopped half-way leaves log entries past the index's, which readers apply on the fly and
the next write applies to the buckets. The log is what ``changes_since`` reads: the groups written
since a cursor, with their rows; it keeps the newest ``KEEP_LOG`` entries (a cursor older than that,
or one from before a whole rewrite, is answered "cannot tell": read the table whole).

No Dagster, no schemas here: the caller (``TableStore``) validates rows and orders columns.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, parquet_meta, to_parquet_bytes
from vidassets.storage.partition_map import bucket_count, bucket_of

BUCKET_GROUPS = 32
"""Groups per bucket, at most: a write of one group rewrites one bucket of up to this many groups."""
KEEP_LOG = 64
"""Log entries kept (``changes_since`` answers cursors at most this many writes behind)."""
REPLACES, BY = "vidassets.replaces", "vidassets.by"  # a log entry's metadata (REPLACES null: a whole rewrite)
GROUPS_DIR, LOG_DIR = "_groups", "_delta"


class GroupedTable:
    """One table's grouped layout (``exists`` is False until its first grouped write)."""

    def __init__(self, objects: ObjectStore, prefix: str, read_many: Callable = lambda read, keys: [read(k) for k in keys]):
        self.objects, self.prefix, self._read_many = objects, prefix, read_many
        self.index_key = f"{prefix}/{GROUPS_DIR}/index.json"
        self.index: dict[str, Any] = json.loads(objects.get_bytes(self.index_key)) if objects.exists(self.index_key) else {}
        self.buckets_read = 0

    @property
    def exists(self) -> bool:
        return bool(self.index)

    @property
    def by(self) -> str:
        return self.index["by"]

    # -- the log ----------------------------------------------------------------------------------
    def _log_key(self, seq: int) -> str:
        return f"{self.prefix}/{LOG_DIR}/{seq:012d}.parquet"

    def _log(self) -> list[tuple[int, str]]:
        """(seq, key) of the log entries kept, in order."""
        found = []
        for info in self.objects.list(f"{self.prefix}/{LOG_DIR}"):
            stem, _, suffix = info.key.rsplit("/", 1)[-1].partition(".")
            if stem.isdigit() and suffix == "parquet":
                found.append((int(stem), info.key))
        return sorted(found)

    def _entry(self, key: str) -> tuple[set[str] | None, str, pd.DataFrame]:
        """A log entry: the groups it replaced (None: the whole table), its ``by`` column, its rows."""
        data = self.objects.get_bytes(key)
        replaces = json.loads(parquet_meta(data, REPLACES) or "null")
        return (None if replaces is None else set(replaces)), parquet_meta(data, BY), from_parquet_bytes(data)

    def _unapplied(self, log: list[tuple[int, str]] | None = None) -> list[tuple[set[str] | None, pd.DataFrame]]:
        """The entries a stopped write left past the index (normally none)."""
        applied = int(self.index.get("seq", 0))
        return [(replaces, rows) for seq, key in (self._log() if log is None else log) if seq > applied
                for replaces, _, rows in [self._entry(key)]]

    # -- buckets ----------------------------------------------------------------------------------
    def _bucket_key(self, buckets: int, bucket: int) -> str:
        return f"{self.prefix}/{GROUPS_DIR}/b{buckets:05d}-{bucket:05d}.parquet"

    def _read_bucket(self, buckets: int, bucket: int) -> pd.DataFrame | None:
        key = self._bucket_key(buckets, bucket)
        if not self.objects.exists(key):
            return None
        self.buckets_read += 1
        return from_parquet_bytes(self.objects.get_bytes(key))

    def _frames(self, buckets: Iterable[int]) -> list[pd.DataFrame]:
        found = self._read_many(lambda b: self._read_bucket(self.index["buckets"], b), sorted(set(buckets)))
        return [f for f in found if f is not None]

    # -- reads ------------------------------------------------------------------------------------
    def read(self, empty: pd.DataFrame) -> pd.DataFrame:
        """Every row (``empty``: the table's columns, for a table without rows)."""
        frame = _concat(self._frames(range(self.index["buckets"])), empty)
        for replaces, rows in self._unapplied():
            frame = rows if replaces is None else _replace(frame, rows, replaces, self.by)
        return _ordered(frame)

    def read_groups(self, groups: Iterable[str], empty: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``groups`` (reads the buckets they fall in)."""
        groups = set(groups)
        buckets = self.index["buckets"]
        frame = _concat(self._frames(bucket_of(g, buckets) for g in groups), empty)
        for replaces, rows in self._unapplied():
            frame = rows if replaces is None else _replace(frame, rows, replaces, self.by)
        return _ordered(frame[frame[self.by].isin(groups)] if len(frame) else frame)

    def changes_since(self, cursor: dict[str, Any] | None) -> tuple[tuple[set[str], pd.DataFrame] | None, dict[str, Any]]:
        """The groups written after ``cursor`` with their rows now, and the cursor now; None instead
        when that cannot be told (no cursor, another table's, the log no longer reaching back, a whole
        rewrite since)."""
        log = self._log()
        now = {"epoch": self.index["epoch"], "seq": max([int(self.index["seq"]), *(s for s, _ in log)])}
        if cursor is None or cursor.get("epoch") != now["epoch"]:
            return None, now
        since = int(cursor.get("seq", 0))
        wanted = [(seq, key) for seq, key in log if seq > since]
        if since < now["seq"] and (not wanted or wanted[0][0] != since + 1):
            return None, now  # pruned past the cursor
        groups: set[str] = set()
        rows: pd.DataFrame | None = None
        for _, key in wanted:
            replaces, by, fresh = self._entry(key)
            if replaces is None:
                return None, now
            rows = fresh if rows is None else _replace(rows, fresh, replaces, by)
            groups |= replaces
        return (groups, rows if rows is not None else pd.DataFrame(columns=[self.by])), now

    def latest_rows(self) -> pd.DataFrame | None:
        """The rows of the newest write (None: it rewrote the whole table)."""
        log = self._log()
        if not log:
            return None
        replaces, _, rows = self._entry(log[-1][1])
        return None if replaces is None else rows

    def row_count(self) -> int | None:
        """The table's rows, from the index (None: not known there: a stopped write's entry not yet
        applied, or an index written before it counted rows)."""
        if "rows" not in self.index or self._unapplied():
            return None
        return int(self.index["rows"])

    def version(self) -> str:
        """Changes with every write (the index names the last entry applied; a stopped write's entry
        is named too)."""
        log = self._log()
        return f"{self.index['epoch']}:{max([int(self.index['seq']), *(s for s, _ in log)])}"

    # -- writes -----------------------------------------------------------------------------------
    def write(self, frame: pd.DataFrame, groups: set[str] | None, by: str, first_seq: int = 1) -> None:
        """Replace ``groups``' rows with ``frame`` (None: the whole table is ``frame``)."""
        if self.index and by != self.by:
            raise ValueError(f"{self.prefix}: grouped by {self.by!r}, not {by!r}")
        log = self._log()
        self._finish(log)
        seq = max([int(self.index.get("seq", 0)), first_seq - 1, *(s for s, _ in log)]) + 1
        self.objects.put_bytes(self._log_key(seq), to_parquet_bytes(
            frame, meta={REPLACES: json.dumps(None if groups is None else sorted(groups)), BY: by}))
        if not self.index:
            self.index = {"by": by, "buckets": 0, "groups": 0, "seq": 0, "epoch": uuid.uuid4().hex}
        if groups is None or not self.index["buckets"]:
            self._rewrite(frame, seq)
        else:
            self._apply(frame, groups, seq)
        for old, key in log:
            if old <= seq - KEEP_LOG:
                self.objects.delete(key)

    def _finish(self, log: list[tuple[int, str]]) -> None:
        """Apply what a stopped write left in the log to the buckets."""
        applied = int(self.index.get("seq", 0))
        for seq, key in log:
            if seq > applied and self.index:
                replaces, _, rows = self._entry(key)
                if replaces is None:
                    self._rewrite(rows, seq)
                else:
                    self._apply(rows, replaces, seq)

    def _apply(self, frame: pd.DataFrame, groups: set[str], seq: int) -> None:
        buckets, by = self.index["buckets"], self.by
        touched = sorted({bucket_of(g, buckets) for g in groups})
        held = dict(zip(touched, self._read_many(lambda b: self._read_bucket(buckets, b), touched), strict=True))
        before = {g for f in held.values() if f is not None for g in f[by].unique()}
        count = int(self.index["groups"]) - len(before & groups) + len(set(frame[by]) & groups)
        replaced = sum(int(f[by].isin(groups).sum()) for f in held.values() if f is not None)
        if count > buckets * BUCKET_GROUPS:  # the groups outgrew the buckets: rewrite all, twice as many
            self._rewrite(_replace(self.read(frame.iloc[:0]), frame, groups, by), seq)
            return
        which = frame[by].map(lambda g: bucket_of(g, buckets)).to_numpy() if len(frame) else None
        for bucket in touched:
            mine = frame[which == bucket] if len(frame) else frame
            rows = _replace(held[bucket] if held[bucket] is not None else frame.iloc[:0], mine,
                            {g for g in groups if bucket_of(g, buckets) == bucket}, by)
            self._put_bucket(buckets, bucket, rows)
        rows_now = None if "rows" not in self.index else int(self.index["rows"]) - replaced + len(frame)
        self._put_index(count, seq, rows_now)

    def _rewrite(self, frame: pd.DataFrame, seq: int) -> None:
        by, old = self.index["by"], self.index["buckets"]
        groups = frame[by].unique() if len(frame) else []
        buckets = bucket_count(len(groups), BUCKET_GROUPS)
        which = frame[by].map(lambda g: bucket_of(g, buckets)) if len(frame) else pd.Series([], dtype=int)
        for bucket in range(buckets):
            self._put_bucket(buckets, bucket, frame[(which == bucket).to_numpy()] if len(frame) else frame)
        self.index["buckets"] = buckets
        self._put_index(len(groups), seq, len(frame))
        if old and old != buckets:
            for bucket in range(old):
                self.objects.delete(self._bucket_key(old, bucket))

    def _put_bucket(self, buckets: int, bucket: int, rows: pd.DataFrame) -> None:
        self.objects.put_bytes(self._bucket_key(buckets, bucket), to_parquet_bytes(_ordered(rows)))

    def _put_index(self, groups: int, seq: int, rows: int | None) -> None:
        self.index.update(groups=groups, seq=seq)
        if rows is None:
            self.index.pop("rows", None)
        else:
            self.index["rows"] = rows
        self.objects.put_bytes(self.index_key, json.dumps(self.index, sort_keys=True).encode())


def _concat(frames: list[pd.DataFrame], empty: pd.DataFrame) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else empty.iloc[:0]


def _replace(frame: pd.DataFrame, rows: pd.DataFrame, groups: set[str], by: str) -> pd.DataFrame:
    """``frame`` with every row of ``groups`` replaced by ``rows``."""
    kept = frame[~frame[by].isin(groups)] if len(frame) else frame
    parts = [f for f in (kept, rows) if len(f)]
    return pd.concat(parts, ignore_index=True) if parts else rows.iloc[:0]


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in first-column order (whatever the history of writes)."""
    return frame.sort_values(frame.columns[0], kind="mergesort").reset_index(drop=True) if len(frame.columns) else frame
