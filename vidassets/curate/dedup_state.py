"""Dedup's state in a SQL database, read in pieces: what a new drop's dedup reads is what its own
clips probe, not every stored clip.

- **clips** (``dd_clips``): one row per deduplicated clip, numbered in the order clips arrived, with
  its drop, its sampled frames' PDQ hashes, the root of its perceptual and of its semantic group and
  its best evidence of each kind.
- **groups** (``dd_groups``): per kind and root, the group's size and smallest member clip id (its
  group id): a clip's group row is read without reading the group's members. Groups merge by
  relabelling the smaller one's members (each clip is relabelled at most log2(n) times).
- **postings** (``dd_postings_0``, ``_1``, ``dd_postings``): each clip's locality-sensitive keys
  (``band_keys`` under dedup's planned tables), in levels (``POSTING_LEVELS``): a new clip's
  candidates are the stored clips sharing a key with one of its frames, found by point lookups.
- **vectors** (``dd_vectors``) in inverted lists (their centroids in one row of
  ``dd_list_centroids``, read whole): below ``FLAT_LIMIT`` vectors one list (every stored vector is
  compared: exact); above, ``list_count(n)`` k-means lists (about sqrt(n): a small drop reads about
  as many centroids as stored vectors, both growing as sqrt(n), not as a share of n), retrained when
  the stored vectors have doubled since, and a new vector is compared with those in its ``PROBES``
  nearest lists.
- **links** (``dd_links``): every link a run found (kind, the two clips, the frame share or cosine),
  so a drop taken out (removed, or rebuilt: out, then in as new) costs its own clips: the groups it
  was in are split again from their remaining members' links, the evidence that named its clips is
  taken again from those links (``dedup._take_out``), and nothing else is read or rewritten. Its
  clips' rows go to ``dd_gone``: their postings and vectors stay where they are (deleting a
  posting at a random key would dirty a page of the largest table for each) and are skipped by every
  read (``ALIVE``), dropped when their level is merged into the next, and the vectors when the
  lists are trained again.
- **drops** (``dd_drops``) and **meta** (``dd_meta``): which partitions (at which fingerprint of
  their tables) the state covers and how many, the version that built it, counts, the next clip's
  row (rows are never reused: a drop taken out leaves a gap). A run told which partitions changed
  since the last one reads only their rows.

SQLite next to a local store, PostgreSQL in production. Losing the database costs one rebuild from
the tables (the version check finds it empty), never a wrong row. Nothing here imports Dagster."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vidassets.storage.sql import Database

FLAT_LIMIT = 512
"""Stored vectors compared exactly (one list) before the first k-means lists are trained."""
MIN_LIST_SIZE = 32
"""Vectors per list at the least when the lists are trained (they grow to about twice their size
before a retrain)."""
PROBED_VECTORS = 8
"""The new vectors x ``PROBES`` of a small drop, which ``list_count`` balances against the centroids."""


def list_count(vectors: int) -> int:
    """Lists trained over ``vectors`` stored vectors: sqrt(PROBED_VECTORS x n), so a small drop reads
    about as many centroids (every one) as stored vectors (its probed lists of n / lists each), both
    growing as sqrt(n); never lists under ``MIN_LIST_SIZE``."""
    return max(2, min(int(np.sqrt(PROBED_VECTORS * vectors)), vectors // MIN_LIST_SIZE))
PROBES = 2
"""Lists a new vector is compared against (its nearest centroids)."""

POSTING_LEVELS = (("dd_postings_0", 1 << 17), ("dd_postings_1", 1 << 22), ("dd_postings", None))
"""The postings in levels, each up to its size, the last unbounded: a run's postings go to the
first, small level (inserting at random keys dirties a page per key, so few pages here) and a full
level is merged, in key order, into the next. A posting is written about once per level instead of
dirtying a page of the largest table; a probe looks in every level."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS dd_meta (name VARCHAR(64) PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS dd_drops (drop_key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS dd_clips (row_id BIGINT PRIMARY KEY, clip_id TEXT NOT NULL, asset_id TEXT NOT NULL,"
    " shard TEXT NOT NULL, hashes {blob} NOT NULL, pdq_root BIGINT NOT NULL, sem_root BIGINT NOT NULL,"
    " has_vector INTEGER NOT NULL, pdq_evidence TEXT, sem_evidence TEXT)",
    "CREATE INDEX IF NOT EXISTS dd_clips_shard ON dd_clips (shard)",
    "CREATE INDEX IF NOT EXISTS dd_clips_pdq_root ON dd_clips (pdq_root)",
    "CREATE INDEX IF NOT EXISTS dd_clips_sem_root ON dd_clips (sem_root)",
    "CREATE TABLE IF NOT EXISTS dd_groups (kind INTEGER NOT NULL, root BIGINT NOT NULL, size BIGINT NOT NULL,"
    " first_clip TEXT NOT NULL, PRIMARY KEY (kind, root))",
    *(f"CREATE TABLE IF NOT EXISTS {table} (lsh_key BIGINT NOT NULL, row_id BIGINT NOT NULL,"
      " PRIMARY KEY (lsh_key, row_id)){without_rowid}" for table, _ in POSTING_LEVELS),
    "CREATE TABLE IF NOT EXISTS dd_vectors (list_id INTEGER NOT NULL, row_id BIGINT NOT NULL, vector {blob} NOT NULL,"
    " PRIMARY KEY (list_id, row_id))",
    "CREATE TABLE IF NOT EXISTS dd_list_centroids (id INTEGER PRIMARY KEY, lists INTEGER NOT NULL, centroids {blob} NOT NULL)",
    "CREATE TABLE IF NOT EXISTS dd_gone (row_id BIGINT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS dd_links (a BIGINT NOT NULL, b BIGINT NOT NULL, kind INTEGER NOT NULL,"
    " value REAL NOT NULL, PRIMARY KEY (a, b, kind)){without_rowid}",
    "CREATE INDEX IF NOT EXISTS dd_links_b ON dd_links (b)",
)
_TABLES = (*(t for t, _ in POSTING_LEVELS), "dd_vectors", "dd_list_centroids", "dd_links", "dd_gone", "dd_groups",
           "dd_clips", "dd_drops", "dd_meta")
ALIVE = " AND row_id NOT IN (SELECT row_id FROM dd_gone)"
"""The condition on a posting or vector that its clip was not taken out (``dd_gone``)."""
KINDS = ("pdq", "sem")


@dataclass
class StoredClip:
    """What a probe reads of one stored clip."""

    clip_id: str
    shard: str
    roots: dict[str, int]
    evidence: dict[str, list | None]
    hashes: np.ndarray | None = None
    has_vector: bool = False


@dataclass
class GroupChange:
    """One kind's groups after a run's links: the root every touched clip now has, each surviving
    touched group's (size, first clip), the roots absorbed into others."""

    root_of: dict[int, int] = field(default_factory=dict)
    groups: dict[int, tuple[int, str]] = field(default_factory=dict)
    absorbed: dict[int, int] = field(default_factory=dict)
    gt1_delta: int = 0


@dataclass
class NewClips:
    """The clips of the new partitions, numbered after the stored ones (``rows``)."""

    rows: np.ndarray
    clip_ids: list[str]
    asset_ids: list[str]
    shards: list[str]
    hashes: np.ndarray  # (frames, 32) uint8
    owner: np.ndarray  # each frame's clip row
    vectors: np.ndarray  # (clips, dim) float32 (zeros where there is none)
    has_vector: np.ndarray
    postings: np.ndarray | None = None  # (frames, tables) keys


class DedupState:
    """The state in the database at ``url``, created on first use."""

    def __init__(self, url: str):
        self.database = Database(url)
        self.database.create(_SCHEMA, lock=20261206)
        self.counters = {"postings_probed": 0, "postings_merged": 0, "clips_read": 0, "vectors_read": 0,
                         "lists_read": 0, "drops_read": 0}

    # -- meta -------------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        with self.database.engine.connect() as db:
            return {k: json.loads(v) for k, v in db.execute(self.database.sql("SELECT name, value FROM dd_meta"))}

    def covered(self, drops: Iterable[str] | None = None) -> dict[str, str]:
        """The fingerprint each covered drop had when it was added: of ``drops`` (None: of every one)."""
        with self.database.engine.connect() as db:
            if drops is None:
                found = dict(db.execute(self.database.sql("SELECT drop_key, fingerprint FROM dd_drops")).all())
            else:
                found = dict(self.database.select_in(db, "SELECT drop_key, fingerprint FROM dd_drops WHERE drop_key",
                                                     sorted(set(drops))))
        self.counters["drops_read"] += len(found)
        return found

    def reset(self, version: str) -> None:
        """Empty the state, to be built again from the tables by ``version``."""
        with self.database.engine.begin() as db:
            for table in _TABLES:
                db.execute(self.database.sql(f"DELETE FROM {table}"))
            self._set(db, {"version": version, "clips": 0, "next_row": 0, "vectors": 0, "dim": 0, "lists": 0,
                           "trained_on": 0, "pdq_gt1": 0, "sem_gt1": 0, "drops": 0, "links": True})

    def written(self) -> None:
        """The rows of the drops the last ``add`` changed are written (``unwritten`` is empty)."""
        with self.database.engine.begin() as db:
            self._set(db, {"unwritten": []})

    def _set(self, db: Any, values: Mapping[str, Any]) -> None:
        self.database.many(db, "INSERT INTO dd_meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET "
                               "value = excluded.value", [(name, json.dumps(value)) for name, value in values.items()])

    # -- reading in pieces ----------------------------------------------------------------------------
    def posting_pairs(self, keys: np.ndarray) -> np.ndarray:
        """(key, stored clip row) of every stored clip holding one of ``keys``."""
        keys = np.unique(keys)
        self.counters["postings_probed"] += len(keys)
        with self.database.engine.connect() as db:
            rows = [r for table, _ in POSTING_LEVELS for r in self.database.select_in(
                db, f"SELECT lsh_key, row_id FROM {table} WHERE lsh_key", keys.tolist(), ALIVE)]
        return np.asarray(rows, np.int64).reshape(-1, 2)

    def clips(self, rows: Iterable[int], hashes: bool = False) -> dict[int, StoredClip]:
        """Stored clips by row: their roots and evidence (and frame hashes)."""
        rows = sorted(set(int(r) for r in rows))
        self.counters["clips_read"] += len(rows)
        return self._clips_where("row_id", rows, hashes)

    def clips_of(self, drops: Iterable[str]) -> dict[int, StoredClip]:
        """Every stored clip of ``drops`` by row (no frame hashes)."""
        found = self._clips_where("shard", sorted(set(drops)))
        self.counters["clips_read"] += len(found)
        return found

    def members(self, kind: str, roots: Iterable[int]) -> dict[int, StoredClip]:
        """Every stored clip of the ``kind`` groups rooted at ``roots``, by row."""
        found = self._clips_where(f"{kind}_root", sorted(set(int(r) for r in roots)))
        self.counters["clips_read"] += len(found)
        return found

    def _clips_where(self, column: str, values: list, hashes: bool = False) -> dict[int, StoredClip]:
        columns = "row_id, clip_id, shard, pdq_root, sem_root, pdq_evidence, sem_evidence, has_vector" + (
            ", hashes" if hashes else "")
        with self.database.engine.connect() as db:
            found = self.database.select_in(db, f"SELECT {columns} FROM dd_clips WHERE {column}", values)
        return {int(r[0]): StoredClip(r[1], r[2], {"pdq": int(r[3]), "sem": int(r[4])},
                                      {"pdq": json.loads(r[5]) if r[5] else None, "sem": json.loads(r[6]) if r[6] else None},
                                      np.frombuffer(bytes(r[8]), np.uint8).reshape(-1, 32) if hashes else None,
                                      bool(r[7])) for r in found}

    def links_of(self, kind: str, rows: Iterable[int]) -> list[tuple[int, int, float]]:
        """(a, b, value), a < b, of every stored ``kind`` link with one end in ``rows``."""
        rows, k = sorted(set(int(r) for r in rows)), KINDS.index(kind)
        with self.database.engine.connect() as db:
            found = {tuple(r) for end in ("a", "b") for r in self.database.select_in(
                db, f"SELECT a, b, value FROM dd_links WHERE kind = {k} AND {end}", rows)}
        return sorted((int(a), int(b), float(v)) for a, b, v in found)

    def groups(self, kind: str, roots: Iterable[int]) -> dict[int, tuple[int, str]]:
        """(size, first clip) of the groups rooted at ``roots``."""
        with self.database.engine.connect() as db:
            found = self.database.select_in(db, f"SELECT root, size, first_clip FROM dd_groups WHERE kind = {KINDS.index(kind)}"
                                            " AND root", sorted(set(int(r) for r in roots)))
        return {int(r): (int(s), f) for r, s, f in found}

    def centroids(self) -> np.ndarray | None:
        """The lists' centroids (None: one list, every vector compared)."""
        with self.database.engine.connect() as db:
            found = db.execute(self.database.sql("SELECT lists, centroids FROM dd_list_centroids WHERE id = 0")).first()
        if found is None:
            return None
        return np.frombuffer(bytes(found[1]), "<f4").reshape(int(found[0]), -1)

    def vectors_in(self, lists: Sequence[int], dim: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows ascending, vectors) of the stored vectors in ``lists``."""
        self.counters["lists_read"] += len(lists)
        with self.database.engine.connect() as db:
            found = self.database.select_in(db, "SELECT row_id, vector FROM dd_vectors WHERE list_id", list(lists), ALIVE)
        found.sort(key=lambda r: r[0])
        self.counters["vectors_read"] += len(found)
        rows = np.asarray([r[0] for r in found], np.int64)
        vectors = np.frombuffer(b"".join(bytes(r[1]) for r in found), "<f4").reshape(-1, dim) if found \
            else np.zeros((0, dim), np.float32)
        return rows, vectors

    def shards_of(self, roots: Mapping[str, Iterable[int]]) -> set[str]:
        """The drops holding a member of the groups at ``roots`` (per kind)."""
        shards: set[str] = set()
        with self.database.engine.connect() as db:
            for kind, found in roots.items():
                shards |= {r[0] for r in self.database.select_in(
                    db, f"SELECT DISTINCT shard FROM dd_clips WHERE {kind}_root", sorted(set(found)))}
        return shards

    def group_rows(self, shards: Iterable[str] | None = None) -> list[tuple]:
        """(clip_id, asset_id, shard, pdq group, pdq size, pdq evidence, has_vector, semantic group,
        semantic size, semantic evidence) of every clip of ``shards`` (None: every clip), by row."""
        head = ("SELECT c.clip_id, c.asset_id, c.shard, p.first_clip, p.size, c.pdq_evidence, c.has_vector,"
                " s.first_clip, s.size, c.sem_evidence, c.row_id FROM dd_clips c"
                " JOIN dd_groups p ON p.kind = 0 AND p.root = c.pdq_root"
                " JOIN dd_groups s ON s.kind = 1 AND s.root = c.sem_root")
        with self.database.engine.connect() as db:
            if shards is None:
                found = [tuple(r) for r in db.exec_driver_sql(head)]
            else:
                found = self.database.select_in(db, head + " WHERE c.shard", sorted(set(shards)))
        return [r[:-1] for r in sorted(found, key=lambda r: r[-1])]

    def all_vectors(self, dim: int) -> tuple[np.ndarray, np.ndarray]:
        with self.database.engine.connect() as db:
            lists = [r[0] for r in db.execute(self.database.sql("SELECT DISTINCT list_id FROM dd_vectors"))]
        return self.vectors_in(lists, dim)

    # -- writing ----------------------------------------------------------------------------------
    def add(self, new: NewClips, covered: Mapping[str, str], changes: Mapping[str, GroupChange],
            evidence: Mapping[str, Mapping[int, list]], lists: np.ndarray | None, meta: Mapping[str, Any],
            links: Mapping[str, Sequence[tuple[int, int, float]]]) -> None:
        """Write a run in one transaction: the new clips (hashes, postings, vectors in ``lists``),
        their ``links`` per kind, the group changes, the stored clips' new evidence, the drops now
        covered, ``meta``."""
        d, sql = self.database, self.database.sql
        with d.engine.begin() as db:
            found = {(min(x, y), max(x, y), KINDS.index(kind)): float(v) for kind, pairs in links.items()
                     for x, y, v in pairs}  # a pair of new clips may come both ways: once
            d.bulk(db, "INSERT INTO dd_links (a, b, kind, value) VALUES %s ON CONFLICT DO NOTHING",
                   [(*key, v) for key, v in sorted(found.items())])
            d.bulk(db, "INSERT INTO dd_clips (row_id, clip_id, asset_id, shard, hashes, pdq_root, sem_root, has_vector,"
                       " pdq_evidence, sem_evidence) VALUES %s", [
                (int(r), new.clip_ids[i], new.asset_ids[i], new.shards[i], new.hashes[new.owner == r].tobytes(),
                 changes["pdq"].root_of.get(int(r), int(r)), changes["sem"].root_of.get(int(r), int(r)),
                 int(new.has_vector[i]), _json(evidence["pdq"].get(int(r))), _json(evidence["sem"].get(int(r))))
                for i, r in enumerate(new.rows.tolist())])
            if new.postings is not None and len(new.postings):
                pairs = np.unique(np.stack([new.postings.ravel(), np.repeat(new.owner, new.postings.shape[1])], 1), axis=0)
                self._post(db, [tuple(p) for p in pairs.tolist()])
            if lists is not None:
                at = np.flatnonzero(new.has_vector)
                d.bulk(db, "INSERT INTO dd_vectors (list_id, row_id, vector) VALUES %s",
                       [(int(lists[j]), int(new.rows[i]), new.vectors[i].astype("<f4").tobytes()) for j, i in enumerate(at)])
            new_rows = set(new.rows.tolist())
            for kind, change in changes.items():
                for old, root in change.absorbed.items():
                    db.execute(sql(f"UPDATE dd_clips SET {kind}_root = :new WHERE {kind}_root = :old"),
                               {"new": root, "old": old})
                self._groups_changed(db, kind, change, {r: v for r, v in evidence[kind].items() if r not in new_rows})
            d.bulk(db, "INSERT INTO dd_drops (drop_key, fingerprint) VALUES %s", sorted(covered.items()))
            self._set(db, meta)

    def _post(self, db: Any, postings: list[tuple[int, int]]) -> None:
        """Add ``postings`` to the first level; merge each full level into the next (in key order)."""
        d = self.database
        sizes = dict(db.execute(d.sql("SELECT name, value FROM dd_meta WHERE name LIKE 'postings:%'")).all())
        held = [int(sizes.get(f"postings:{table}", "0")) for table, _ in POSTING_LEVELS]
        d.bulk(db, f"INSERT INTO {POSTING_LEVELS[0][0]} (lsh_key, row_id) VALUES %s", sorted(postings))
        held[0] += len(postings)
        for level, (table, limit) in enumerate(POSTING_LEVELS[:-1]):
            if held[level] > limit:
                below = POSTING_LEVELS[level + 1][0]
                moved = db.execute(d.sql(f"INSERT INTO {below} (lsh_key, row_id) SELECT lsh_key, row_id FROM {table} "
                                         f"WHERE TRUE{ALIVE} ORDER BY lsh_key, row_id")).rowcount
                db.execute(d.sql(f"DELETE FROM {table}"))
                self.counters["postings_merged"] += held[level]
                held[level + 1] += moved if moved >= 0 else held[level]
                held[level] = 0
        self._set(db, {f"postings:{table}": n for (table, _), n in zip(POSTING_LEVELS, held, strict=True)})

    def take_out(self, rows: Sequence[int], changes: Mapping[str, GroupChange],
                 evidence: Mapping[str, Mapping[int, list | None]], drops: Sequence[str], meta: Mapping[str, Any]) -> None:
        """Take clips out in one transaction: the clips at ``rows`` (gone: their postings and vectors
        skipped from now on; their links deleted), the groups they were in (``changes``: the
        remaining members' new roots, the groups now, the roots gone), the remaining members'
        evidence that named them, ``drops`` no longer covered, ``meta``."""
        d = self.database
        rows = [int(r) for r in rows]
        with d.engine.begin() as db:
            d.bulk(db, "INSERT INTO dd_gone (row_id) VALUES %s ON CONFLICT DO NOTHING", [(r,) for r in rows])
            for statement in ("DELETE FROM dd_links WHERE a", "DELETE FROM dd_links WHERE b",
                              "DELETE FROM dd_clips WHERE row_id"):
                d.delete_in(db, statement, rows)
            d.delete_in(db, "DELETE FROM dd_drops WHERE drop_key", sorted(drops))
            for kind, change in changes.items():
                d.many(db, f"UPDATE dd_clips SET {kind}_root = ? WHERE row_id = ?",
                       [(root, r) for r, root in change.root_of.items()])
                self._groups_changed(db, kind, change, evidence[kind])
            self._set(db, meta)

    def _groups_changed(self, db: Any, kind: str, change: GroupChange, evidence: Mapping[int, list | None]) -> None:
        """A kind's group changes: the roots absorbed or gone deleted, the groups now written, the
        ``evidence`` of stored clips set."""
        d = self.database
        d.many(db, "DELETE FROM dd_groups WHERE kind = ? AND root = ?", [(KINDS.index(kind), r) for r in change.absorbed])
        d.many(db, "INSERT INTO dd_groups (kind, root, size, first_clip) VALUES (?, ?, ?, ?) ON CONFLICT "
                   "(kind, root) DO UPDATE SET size = excluded.size, first_clip = excluded.first_clip",
               [(KINDS.index(kind), r, s, f) for r, (s, f) in change.groups.items()])
        d.many(db, f"UPDATE dd_clips SET {kind}_evidence = ? WHERE row_id = ?", [(_json(v), r) for r, v in evidence.items()])

    def relist(self, centroids: np.ndarray, lists: np.ndarray, rows: np.ndarray, vectors: np.ndarray,
               trained_on: int) -> None:
        """Replace the lists: ``centroids``, and every stored vector (``rows``) in ``lists``."""
        d = self.database
        with d.engine.begin() as db:
            db.execute(d.sql("DELETE FROM dd_vectors"))
            db.execute(d.sql("DELETE FROM dd_list_centroids"))
            d.bulk(db, "INSERT INTO dd_list_centroids (id, lists, centroids) VALUES %s",
                   [(0, len(centroids), np.ascontiguousarray(centroids, "<f4").tobytes())])
            d.bulk(db, "INSERT INTO dd_vectors (list_id, row_id, vector) VALUES %s",
                   [(int(lists[i]), int(r), vectors[i].astype("<f4").tobytes()) for i, r in enumerate(rows.tolist())])
            self._set(db, {"lists": len(centroids), "trained_on": trained_on})


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
