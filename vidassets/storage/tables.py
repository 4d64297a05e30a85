"""Catalog tables: one Parquet file per (asset, partition), validated by its pandera schema on
write and written atomically, and content-addressed blobs.

Layout under a store root::

    tables/<table>/<partition key>.parquet   (partition keys may contain '/': <tier>/<drop>)
    tables/<table>/_all.parquet              (unpartitioned tables written whole)
    tables/<table>/_groups/...               (unpartitioned tables written by groups: ``grouped.py``)
    tables/<table>/_delta/<seq>.parquet      (their log: rows replacing whole groups; before the
                                              buckets, deltas folded into ``_all.parquet``)
    blobs/<kind>/<sha[:2]>/<sha><suffix>
    handoff/<partition key>/<table>/<asset_id>.parquet   (rows handed to a drop that now holds the asset)
    journal/<table>/<UTC hour>/<ns>-<quoted partition key>   (a partition about to be written)
    journal/<table>/_pruned                    (records before this ns are gone)

The journal lets a global stage find the partitions written since its last run without listing
every partition of its inputs (``written_since``): a write of a partition first records its key,
then replaces the file. Records are empty objects whose name says everything, grouped by hour so a
reader lists only the hours since its last run.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import pandas as pd

from vidassets.storage.grouped import GroupedTable
from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, parquet_meta, to_parquet_bytes
from vidassets.storage.schemas import SCHEMAS

UNPARTITIONED = "_all"
HANDOFF = "handoff"
DELTAS = "_delta"
# An unpartitioned table written a few groups at a time (``write_groups``) is kept in buckets by group
# (``grouped.GroupedTable``). Stores from before the buckets hold a base file plus deltas, which a
# whole write folds into the base and the first grouped write moves into buckets.
READS_IN_FLIGHT = 16
"""Objects read at once when many are wanted together (``read_all``, ``read_many``): on S3 a read
waits on the network, not on this machine, so a global stage's reads of every partition take a
sixteenth of the wall time (threads: a store's client is shared)."""
_REPLACES, _BY, _THROUGH = "vidassets.replaces", "vidassets.by", "vidassets.through"
JOURNAL = "journal"
JOURNAL_LAG_NS = 15 * 60 * 10**9
"""How far before its last run a journal reader looks again. A record is written just before its
file, by a machine whose clock may run behind: a write in flight, or a writer up to this much
behind, is still seen (a partition found again whose version did not change costs one lookup)."""


def journal_clock() -> int:
    """Wall-clock ns that stamps journal records and the global stages' reads (one place to read it)."""
    return time.time_ns()


class _DeltaListing(NamedTuple):
    files: list[tuple[int, str]]  # (sequence number, key) of every delta file, in order
    folded: int  # the newest sequence number a compaction folded into the base (0: none yet)
    markers: list[tuple[int, str]]  # compaction markers ``<seq>.folded``

    @property
    def pending(self) -> list[tuple[int, str]]:
        return [(seq, key) for seq, key in self.files if seq > self.folded]

    @property
    def next_seq(self) -> int:
        return max([self.folded, *(seq for seq, _ in self.files)]) + 1


class TableStore:
    """Reads and writes catalog tables in one object store."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self.uri = objects.uri

    @staticmethod
    def key(table: str, partition: str | None = None) -> str:
        return f"tables/{table}/{partition or UNPARTITIONED}.parquet"

    @staticmethod
    def _part(partition: str | None) -> str | None:
        """A partition as the methods below take it: None for the whole of an unpartitioned table,
        which callers may also name ``_all`` (the key ``partitions`` lists for it)."""
        return None if partition == UNPARTITIONED else partition

    def write(
        self,
        table: str,
        partition: str | None,
        rows: pd.DataFrame | Sequence[Mapping[str, Any]],
    ) -> pd.DataFrame:
        """Validate ``rows`` against the table's schema and replace the partition's file atomically.
        Returns the validated frame (columns in schema order)."""
        frame = self._validated(table, rows)
        partition = self._part(partition)
        if partition is None and (grouped := self._grouped(table)).exists:
            grouped.write(frame, None, grouped.by)
            return frame
        if partition is None and self._deltas(table).files:
            self._replace_base(table, frame)
            return frame
        key, data = self.key(table, partition), to_parquet_bytes(frame)
        # Identical contents are not rewritten, so a table's version only changes when its rows do
        # (incremental consumers such as dedup rely on that).
        if not (self.objects.exists(key) and self.objects.get_bytes(key) == data):
            if partition is not None:
                self._record_write(table, partition)
            self.objects.put_bytes(key, data)
        return frame

    # -- the journal of partition writes ----------------------------------------------------------
    @staticmethod
    def _hour(ns: int) -> str:
        return time.strftime("%Y%m%dT%H", time.gmtime(ns // 10**9))

    def _record_write(self, table: str, partition: str) -> None:
        """Before a partition's file is replaced: record it (a crash between the two leaves a record
        of an unchanged partition, which costs a reader one lookup; never a missed write)."""
        ns = journal_clock()
        self.objects.put_bytes(f"{JOURNAL}/{table}/{self._hour(ns)}/{ns:020d}-{urllib.parse.quote(partition, safe='')}", b"")

    def _journal_pruned(self, table: str) -> int:
        key = f"{JOURNAL}/{table}/_pruned"
        return int(self.objects.get_bytes(key).decode()) if self.objects.exists(key) else 0

    def written_since(self, table: str, since_ns: int) -> set[str] | None:
        """The partitions of ``table`` written at or after ``since_ns`` (a wall-clock time in ns), by
        the journal: a listing of the records since then (in the first hour, only the keys after
        ``since_ns``), not of every partition. None when the journal no longer reaches back that far
        (``prune_journal``): the caller lists every partition."""
        if since_ns < self._journal_pruned(table):
            return None
        base, first = f"{JOURNAL}/{table}", self._hour(since_ns)
        found: set[str] = set()
        for hour in self.objects.list_dirs(base):
            if hour < first:
                continue
            # records are named by their ns (fixed width): "<since_ns>" sorts before every record
            # stamped at or after it, so the records written before it are never listed
            after = f"{base}/{hour}/{since_ns:020d}" if hour == first else None
            for info in self.objects.list(f"{base}/{hour}", start_after=after):
                stamp, _, quoted = info.key.rsplit("/", 1)[-1].partition("-")
                if stamp.isdigit() and int(stamp) >= since_ns:
                    found.add(urllib.parse.unquote(quoted))
        return found

    def prune_journal(self, table: str, before_ns: int) -> int:
        """Delete the journal's whole hours before ``before_ns`` (readers whose last run is older
        then list every partition once). Returns the records deleted."""
        base, cut = f"{JOURNAL}/{table}", self._hour(before_ns)
        records = [info.key for hour in self.objects.list_dirs(base) if hour < cut
                   for info in self.objects.list(f"{base}/{hour}")]
        if not records:
            return 0
        bound = calendar.timegm(time.strptime(cut, "%Y%m%dT%H")) * 10**9
        self.objects.put_bytes(f"{base}/_pruned", str(max(bound, self._journal_pruned(table))).encode())
        for key in records:
            self.objects.delete(key)
        return len(records)

    @staticmethod
    def _validated(table: str, rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> pd.DataFrame:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        return SCHEMAS[table].validate(conform(frame, table), lazy=True)

    def write_groups(self, table: str, rows: pd.DataFrame | Sequence[Mapping[str, Any]],
                     groups: Iterable[str] | None, by: str = "source_shard") -> pd.DataFrame:
        """Replace, in the unpartitioned ``table``, every row whose ``by`` is in ``groups`` with ``rows``
        (all rows of those groups now; a group without rows is emptied); ``groups=None`` replaces the
        whole table. Only ``rows`` are validated and written (``GroupedTable``: a log entry and the
        buckets of those groups), so a global stage that changed a few drops pays for those drops,
        not for the table. Readers see the table in first-column order whatever the history. Returns
        the validated rows. A table in the layout before the buckets (a base file and deltas) moves
        to them on its first write here; a table without a ``by`` column keeps its single file."""
        frame = self._validated(table, rows)
        frame = frame.sort_values(frame.columns[0], kind="mergesort").reset_index(drop=True)
        grouped = self._grouped(table)
        if groups is None and not grouped.exists and by not in frame.columns:  # not a table of groups
            self._replace_base(table, frame)
            return frame
        if groups is not None:
            groups = set(groups)
            stray = set(frame[by].dropna()) - groups
            if stray:
                raise ValueError(f"table {table}: rows of {by} {sorted(stray)[:5]} are outside the groups being replaced")
            if not groups:
                return frame
        if not grouped.exists and self.exists(table):
            self.to_buckets(table, by)
            grouped = self._grouped(table)
        grouped.write(frame, groups, by)
        return frame

    def to_buckets(self, table: str, by: str = "source_shard") -> bool:
        """Move the unpartitioned ``table`` from a base file and deltas (the layout before buckets)
        into buckets by ``by``: written whole there first (the log continuing the deltas' numbers,
        so no reader's cursor can mistake one for the other), then the old files deleted. False when
        there was nothing to move (no table, or already in buckets). ``write_groups`` does this on a
        table's first grouped write."""
        grouped = self._grouped(table)
        if grouped.exists or not self.exists(table):
            return False
        listing, base_key = self._deltas(table), self.key(table)
        grouped.write(self._merged(table), None, by, first_seq=listing.next_seq)
        for _, key in listing.files + listing.markers:
            self.objects.delete(key)
        if self.objects.exists(base_key):
            self.objects.delete(base_key)
        return True

    def _grouped(self, table: str) -> GroupedTable:
        return GroupedTable(self.objects, f"tables/{table}", read_many)

    def read_groups(self, table: str, groups: Iterable[str], by: str = "source_shard") -> pd.DataFrame:
        """The rows of ``groups`` of the unpartitioned ``table`` (the buckets they fall in; a table
        not in buckets is read whole and filtered); empty when the table does not exist."""
        groups = set(groups)
        grouped = self._grouped(table)
        if grouped.exists:
            return self._with_schema_columns(table, grouped.read_groups(groups, conform(pd.DataFrame(), table)))
        frame = self.read_or_empty(table)
        return frame[frame[by].isin(groups)].reset_index(drop=True) if len(frame) else frame

    def _replace_base(self, table: str, frame: pd.DataFrame) -> None:
        """Write the whole table as its base file, folding in every delta so far, then mark them
        folded (``<seq>.folded``: sequence numbers keep growing) and delete them. A reader that
        listed deltas a compaction deleted reads again (``_merged``)."""
        listing = self._deltas(table)
        through = listing.next_seq - 1
        key, data = self.key(table), to_parquet_bytes(frame, meta={_THROUGH: str(through)} if through else None)
        if not (not through and self.objects.exists(key) and self.objects.get_bytes(key) == data):
            self.objects.put_bytes(key, data)
        if through:
            self.objects.put_bytes(self._delta_key(table, through, ".folded"), b"")
        for seq, old in listing.files + listing.markers:
            if seq < through or old.endswith(".parquet"):
                self.objects.delete(old)

    @staticmethod
    def _delta_key(table: str, seq: int, suffix: str = ".parquet") -> str:
        return f"tables/{table}/{DELTAS}/{seq:012d}{suffix}"

    def _deltas(self, table: str) -> _DeltaListing:
        files, folded = [], []
        for info in self.objects.list(f"tables/{table}/{DELTAS}"):
            stem, _, suffix = info.key.rsplit("/", 1)[-1].partition(".")
            if stem.isdigit() and suffix == "parquet":
                files.append((int(stem), info.key))
            elif stem.isdigit() and suffix == "folded":
                folded.append((int(stem), info.key))
        folded.sort()
        return _DeltaListing(sorted(files), folded[-1][0] if folded else 0, folded)

    def _merged(self, table: str) -> pd.DataFrame:
        """Base file + the deltas not yet folded into it, applied in order (or the buckets)."""
        if (grouped := self._grouped(table)).exists:
            return grouped.read(conform(pd.DataFrame(), table))
        for attempt in range(5):
            deltas = self._deltas(table).files
            base_key = self.key(table)
            try:
                data = self.objects.get_bytes(base_key) if self.objects.exists(base_key) or not deltas else None
                through = int(parquet_meta(data, _THROUGH) or 0) if data is not None else 0
                pieces = [self.objects.get_bytes(key) for seq, key in deltas if seq > through]
            except Exception:  # a compaction deleted what we listed: list again (else: the real error)
                if not deltas or attempt == 4:
                    raise
                continue
            frame = from_parquet_bytes(data) if data is not None else conform(pd.DataFrame(), table)
            if not pieces:
                return frame
            for piece in pieces:
                by, replaces = parquet_meta(piece, _BY), set(json.loads(parquet_meta(piece, _REPLACES)))
                rows = from_parquet_bytes(piece)
                frame = pd.concat([f for f in (frame[~frame[by].isin(replaces)], rows) if len(f)] or [rows],
                                  ignore_index=True)
            return frame.sort_values(frame.columns[0], kind="mergesort").reset_index(drop=True)
        raise AssertionError("unreachable")

    def changes_since(self, table: str, cursor: Mapping[str, Any] | None
                      ) -> tuple[tuple[set[str], pd.DataFrame] | None, dict[str, Any]]:
        """What the writes of the unpartitioned ``table`` after ``cursor`` (a cursor this returned
        before) replaced: (the groups they replaced, those groups' rows now), and the cursor now.
        None instead when that cannot be told from the deltas (no cursor, or the base was replaced
        or compacted since): read the table whole then."""
        if (grouped := self._grouped(table)).exists:
            changes, now = grouped.changes_since(cursor)
            if changes is not None and not len(changes[1]):
                changes = (changes[0], conform(pd.DataFrame(), table))
            return changes, now
        listing = self._deltas(table)
        base_key = self.key(table)
        now = {"seq": listing.next_seq - 1,
               "base": self.objects.version(base_key) if self.objects.exists(base_key) else None}
        if cursor is None or cursor.get("base") != now["base"] or int(cursor.get("seq", 0)) < listing.folded:
            return None, now
        groups: set[str] = set()
        rows = conform(pd.DataFrame(), table)
        try:
            for seq, key in listing.pending:
                if seq <= int(cursor["seq"]):
                    continue
                piece = self.objects.get_bytes(key)
                by, replaces = parquet_meta(piece, _BY), set(json.loads(parquet_meta(piece, _REPLACES)))
                fresh = from_parquet_bytes(piece)
                rows = pd.concat([f for f in (rows[~rows[by].isin(replaces)], fresh) if len(f)] or [fresh],
                                 ignore_index=True)
                groups |= replaces
        except Exception:  # a compaction deleted a delta we listed: unknown, read the table whole
            return None, now
        return (groups, rows), now

    def latest_rows(self, table: str) -> pd.DataFrame:
        """What the latest write of an unpartitioned table wrote: its newest delta, or the whole table
        when that write replaced or compacted it."""
        if (grouped := self._grouped(table)).exists:
            rows = grouped.latest_rows()
            return rows if rows is not None else self.read(table)
        pending = self._deltas(table).pending
        if pending:
            return from_parquet_bytes(self.objects.get_bytes(pending[-1][1]))
        return self.read(table)

    def version(self, table: str, partition: str | None = None) -> str | None:
        """Identity of the table's current contents (changes whenever it is rewritten)."""
        if self._part(partition) is None:
            grouped = self._grouped(table)
            return grouped.version() if grouped.exists else self.versions(table).get(UNPARTITIONED)
        return self.objects.version(self.key(table, partition))

    def row_count(self, table: str) -> int:
        """The rows of an unpartitioned table: from its index when it is in buckets and the index
        knows (no bucket read), else by reading it."""
        grouped = self._grouped(table)
        count = grouped.row_count() if grouped.exists else None
        return len(self.read(table)) if count is None else count

    def exists(self, table: str, partition: str | None = None) -> bool:
        partition = self._part(partition)
        return self.objects.exists(self.key(table, partition)) or (
            partition is None and (self._grouped(table).exists or bool(self._deltas(table).files)))

    def read(self, table: str, partition: str | None = None) -> pd.DataFrame:
        """The stored table; columns its schema gained since it was written read as nulls. The whole
        of an unpartitioned table is ``partition`` None or ``_all`` (the key ``partitions`` lists)."""
        frame = self._merged(table) if self._part(partition) is None else from_parquet_bytes(self.objects.get_bytes(self.key(table, partition)))
        return self._with_schema_columns(table, frame)

    @staticmethod
    def _with_schema_columns(table: str, frame: pd.DataFrame) -> pd.DataFrame:
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
        partitions, not one per partition. The unpartitioned table is keyed ``_all`` (its base file
        and deltas together; a table in buckets: ``GroupedTable.version``, its buckets not listed)."""
        if (grouped := self._grouped(table)).exists:
            return {UNPARTITIONED: grouped.version()}
        prefix = f"tables/{table}"
        found, deltas = {}, []
        for info in self.objects.list(prefix):
            name = info.key[len(prefix) + 1 :]
            if name.endswith(".parquet") and not name.rsplit("/", 1)[-1].startswith("."):
                if name.startswith(f"{DELTAS}/"):
                    deltas.append(f"{name}={info.version}")
                else:
                    found[name[: -len(".parquet")]] = info.version
        if deltas:
            found[UNPARTITIONED] = "+".join([str(found.get(UNPARTITIONED)), *sorted(deltas)])
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

    def park(self, tables: Iterable[str], partition: str, asset_ids: set[str]) -> int:
        """Keep the partition's current rows of ``asset_ids`` aside (in its own hand-over area) before
        a write leaves them out: they stop being current, and ``previous`` offers them again should
        those assets come back (a near-duplicate copy that becomes canonical is not decoded again).
        Returns the rows parked now."""
        parked = 0
        for table in tables:
            rows = self.read_or_empty(table, partition)
            if not asset_ids or not len(rows) or "asset_id" not in rows.columns:
                continue
            for asset_id in sorted(asset_ids & set(rows.asset_id)):
                mine = rows[rows.asset_id == asset_id]
                self.objects.put_bytes(f"{self._handoff_prefix(partition, table)}{asset_id}.parquet",
                                       to_parquet_bytes(mine))
                parked += len(mine)
        return parked

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
        frames = read_many(lambda k: self.read(table, k), keys)
        frames = [f for f in frames if len(f)]
        if not frames:
            return conform(pd.DataFrame(), table)
        return pd.concat(frames, ignore_index=True)

    def tables(self) -> list[str]:
        return self.objects.list_dirs("tables")


def read_many(read: Callable[[Any], Any], keys: Sequence[Any]) -> list[Any]:
    """``[read(k) for k in keys]``, up to ``READS_IN_FLIGHT`` at once; the first error is raised."""
    if len(keys) < 2:
        return [read(k) for k in keys]
    with ThreadPoolExecutor(max_workers=min(READS_IN_FLIGHT, len(keys))) as pool:
        return list(pool.map(read, keys))


def partition_fingerprints(tables: TableStore, names: tuple[str, ...], over: str | None = None,
                           listed: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """Per partition (of table ``over``, else of any of ``names``), the versions of the table files
    a global stage reads: a rebuilt table changes it. One listing per table (or the ``listed``
    versions of each), no request per file."""
    versions = {name: (listed[name] if listed is not None else tables.versions(name)) for name in names}
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
