"""Selection's state in a SQL database, read in pieces: each clip's ``decision_context`` (what
couples its decision to others: duplicate groups, asset, drop, eval match, generated copy), indexed
by every coupling key, so a run reads the contexts its change reaches, not every clip's.

- **context** (``sel_context``): one row per decided clip, indexed by drop, source tier, asset and
  both duplicate groups.
- **counts** (``sel_counts``): per drop, its decisions counted by (decision, first failed rule,
  tier); their sum over every drop is kept too (``totals`` in meta): the step's totals without
  reading the selection table or every drop's counts.
- **rows** (``sel_rows``): per drop, its decision rows as written (Parquet): the rows a run keeps
  or compares, read by drop (the ``selection`` table itself is one global table).
- **drops** (``sel_drops``): each covered drop's fingerprint of its score and embedding tables;
  **meta**: the version that built the state.

Losing the database costs one run that decides every clip again (the version check finds it
empty), never a wrong row. Nothing here imports Dagster."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
from vidassets.storage.sql import Database

CONTEXT_COLUMNS = ["clip_id", "source_shard", "asset_id", "pdq_group", "semantic_group", "contaminated", "generated",
                   "synthetic"]
FLAGS = ("contaminated", "generated", "synthetic")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sel_meta (name VARCHAR(64) PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sel_drops (drop_key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sel_context (clip_id TEXT PRIMARY KEY, source_shard TEXT NOT NULL,"
    " source_tier TEXT NOT NULL, asset_id TEXT, pdq_group TEXT, semantic_group TEXT, contaminated INTEGER NOT NULL,"
    " generated INTEGER NOT NULL, synthetic INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sel_context_shard ON sel_context (source_shard)",
    "CREATE INDEX IF NOT EXISTS sel_context_tier ON sel_context (source_tier)",
    "CREATE INDEX IF NOT EXISTS sel_context_asset ON sel_context (asset_id)",
    "CREATE INDEX IF NOT EXISTS sel_context_pdq ON sel_context (pdq_group)",
    "CREATE INDEX IF NOT EXISTS sel_context_semantic ON sel_context (semantic_group)",
    "CREATE TABLE IF NOT EXISTS sel_counts (drop_key TEXT NOT NULL, decision TEXT NOT NULL, first_failed_rule TEXT,"
    " tier TEXT, n BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sel_counts_drop ON sel_counts (drop_key)",
    "CREATE TABLE IF NOT EXISTS sel_rows (drop_key TEXT PRIMARY KEY, rows {blob} NOT NULL)",
)
_TABLES = ("sel_rows", "sel_counts", "sel_context", "sel_drops", "sel_meta")
KEY_COLUMNS = ("pdq_group", "semantic_group", "asset_id", "source_shard", "source_tier")


def source_tier(shard: Any) -> str:
    """A drop's source tier: the first part of its name (``licensed/2026-01`` -> ``licensed``)."""
    return str(shard).split("/")[0]


class SelectionState:
    """The state in the database at ``url``, created on first use."""

    def __init__(self, url: str):
        self.database = Database(url)
        self.database.create(_SCHEMA, lock=20261207)
        self.contexts_read = 0

    def version(self) -> str | None:
        with self.database.engine.connect() as db:
            found = db.execute(self.database.sql("SELECT value FROM sel_meta WHERE name = 'version'")).scalar()
        return json.loads(found) if found is not None else None

    def cursors(self) -> dict[str, Any]:
        """Per upstream table, the cursor of its writes the last run had read (``changes_since``)."""
        with self.database.engine.connect() as db:
            found = db.execute(self.database.sql("SELECT value FROM sel_meta WHERE name = 'cursors'")).scalar()
        return json.loads(found) if found is not None else {}

    def covered(self, drops: Iterable[str] | None = None) -> dict[str, str]:
        """The fingerprint each covered drop had when it was decided: of ``drops`` (None: of every one)."""
        with self.database.engine.connect() as db:
            if drops is None:
                return dict(db.execute(self.database.sql("SELECT drop_key, fingerprint FROM sel_drops")).all())
            return dict(self.database.select_in(db, "SELECT drop_key, fingerprint FROM sel_drops WHERE drop_key",
                                                sorted(set(drops))))

    def covered_count(self) -> int:
        with self.database.engine.connect() as db:
            return int(db.execute(self.database.sql("SELECT COUNT(*) FROM sel_drops")).scalar())

    def reset(self, version: str) -> None:
        with self.database.engine.begin() as db:
            for table in _TABLES:
                db.execute(self.database.sql(f"DELETE FROM {table}"))
            self.database.many(db, "INSERT INTO sel_meta (name, value) VALUES (?, ?)", [("version", json.dumps(version))])

    def contexts(self, column: str, values: Iterable[Any]) -> pd.DataFrame:
        """The stored contexts whose ``column`` (a coupling key or ``clip_id``) is one of ``values``."""
        values = sorted({v for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))})
        with self.database.engine.connect() as db:
            found = self.database.select_in(db, f"SELECT {', '.join(CONTEXT_COLUMNS)} FROM sel_context WHERE {column}",
                                            values)
        self.contexts_read += len(found)
        frame = pd.DataFrame(found, columns=CONTEXT_COLUMNS)
        for flag in FLAGS:
            frame[flag] = frame[flag].astype(bool)
        return frame.astype({"pdq_group": object, "semantic_group": object})

    def rows_of(self, drops: Iterable[str]) -> pd.DataFrame:
        """The stored decision rows of ``drops``."""
        with self.database.engine.connect() as db:
            found = self.database.select_in(db, "SELECT drop_key, rows FROM sel_rows WHERE drop_key", sorted(set(drops)))
        frames = [from_parquet_bytes(bytes(blob)) for _, blob in sorted(found)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def counts(self, drops: Iterable[str] | None = None) -> pd.DataFrame:
        """(decision, first_failed_rule, tier, n) counted over ``drops`` (None: every drop)."""
        head = "SELECT decision, first_failed_rule, tier, SUM(n) FROM sel_counts"
        tail = " GROUP BY decision, first_failed_rule, tier"
        with self.database.engine.connect() as db:
            if drops is None:
                found = [tuple(r) for r in db.exec_driver_sql(head + tail)]
            else:
                found = self.database.select_in(db, head + " WHERE drop_key", sorted(set(drops)), tail)
        frame = pd.DataFrame(found, columns=["decision", "first_failed_rule", "tier", "n"])
        return frame.astype({"first_failed_rule": object, "tier": object, "n": "int64"})

    def totals(self) -> pd.DataFrame:
        """``counts()`` over every drop, as the last run stored them (one small value, not a sum
        over every drop's counts); summed from the counts in a state saved before totals were kept."""
        with self.database.engine.connect() as db:
            found = db.execute(self.database.sql("SELECT value FROM sel_meta WHERE name = 'totals'")).scalar()
        if found is None:
            return self.counts()
        frame = pd.DataFrame(json.loads(found), columns=["decision", "first_failed_rule", "tier", "n"])
        return frame.astype({"first_failed_rule": object, "tier": object, "n": "int64"})

    def save(self, contexts: pd.DataFrame, drops: Sequence[str], gone_drops: Sequence[str],
             rows: Sequence[Mapping[str, Any]] | None, rewritten: Sequence[str] | None,
             covered: Mapping[str, str], cursors: Mapping[str, Any], totals: pd.DataFrame | None = None) -> None:
        """In one transaction: the contexts of ``drops`` (the touched ones) replaced by theirs in
        ``contexts`` (and any other clip in ``contexts`` upserted), ``gone_drops`` forgotten, the
        counts of the ``rewritten`` drops (None: every drop) recounted from ``rows`` (their every
        row), ``drops``' fingerprints from ``covered``, the upstream tables' ``cursors``, and the
        ``totals`` over every drop those counts now sum to (``totals()``)."""
        d = self.database
        with d.engine.begin() as db:
            for part in (*drops, *gone_drops):
                db.execute(d.sql("DELETE FROM sel_context WHERE source_shard = :d"), {"d": part})
            d.many(db, "DELETE FROM sel_context WHERE clip_id = ?", [(c,) for c in contexts.clip_id])
            d.bulk(db, "INSERT INTO sel_context (clip_id, source_shard, source_tier, asset_id, pdq_group, semantic_group,"
                       " contaminated, generated, synthetic) VALUES %s", [
                (r.clip_id, r.source_shard, source_tier(r.source_shard), _text(r.asset_id), _text(r.pdq_group),
                 _text(r.semantic_group), int(bool(r.contaminated)), int(bool(r.generated)), int(bool(r.synthetic)))
                for r in contexts.itertuples()])
            if rewritten is None:
                db.execute(d.sql("DELETE FROM sel_counts"))
                db.execute(d.sql("DELETE FROM sel_rows"))
            else:
                d.many(db, "DELETE FROM sel_counts WHERE drop_key = ?", [(p,) for p in {*rewritten, *gone_drops}])
                d.many(db, "DELETE FROM sel_rows WHERE drop_key = ?", [(p,) for p in {*rewritten, *gone_drops}])
            if rows:
                frame = pd.DataFrame(list(rows))
                d.bulk(db, "INSERT INTO sel_rows (drop_key, rows) VALUES %s",
                       [(str(drop), to_parquet_bytes(part.reset_index(drop=True)))
                        for drop, part in frame.groupby("source_shard", sort=True)])
                counted = pd.DataFrame(list(rows))[["source_shard", "decision", "first_failed_rule", "tier"]]
                counted = counted.astype(object).where(counted.notna(), None)
                grouped = counted.groupby(list(counted.columns), dropna=False).size()
                d.bulk(db, "INSERT INTO sel_counts (drop_key, decision, first_failed_rule, tier, n) VALUES %s",
                       [(*(None if isinstance(k, float) and pd.isna(k) else k for k in key), int(n))
                        for key, n in grouped.items()])
            d.many(db, "DELETE FROM sel_drops WHERE drop_key = ?", [(p,) for p in (*drops, *gone_drops)])
            d.bulk(db, "INSERT INTO sel_drops (drop_key, fingerprint) VALUES %s",
                   sorted((p, covered[p]) for p in drops if p in covered))
            meta = [("cursors", json.dumps(dict(cursors)))]
            if totals is not None:
                meta.append(("totals", json.dumps([[_text(v) for v in r[:3]] + [int(r[3])] for r in
                                                   totals[["decision", "first_failed_rule", "tier", "n"]].itertuples(index=False)])))
            else:
                db.execute(d.sql("DELETE FROM sel_meta WHERE name = 'totals'"))  # summed from the counts when asked
            d.many(db, "INSERT INTO sel_meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET "
                       "value = excluded.value", meta)


def _text(value: Any) -> str | None:
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
