"""The persistent near-duplicate index: what a drop's near-duplicate decision reads instead of every
stored fingerprint.

A drop's decision needs the stored videos that share a sampled frame with its own (two PDQ hashes
within ``max_hamming``) and the groups those videos belong to. Finding them by reading every drop's
fingerprint pack and searching every stored hash costs a read per older drop and a search linear in
the whole store; this index answers both from a SQL database (SQLite next to a local store,
PostgreSQL in production) with point lookups, so a decision costs what its own hashes probe:

- **frames**: every stored hash of every fingerprinted video (``nd_frames``), and locality-sensitive
  **postings** (``nd_postings``): ``TABLES`` tables, each keyed by ``BITS`` of the 256 bits drawn
  without replacement (fixed by ``SEED``). A query hash probes its key in every table; what shares a
  key is checked exactly (Hamming distance on the stored hash), so the index finds a subset of the
  exhaustive search's pairs, never a false one. Two copies of one footage share many sampled
  frames: a video pair is missed only when every one of its matching frame pairs misses every table
  (``pair_recall``; measured against the exhaustive search in ``bench/near_dup_index.py``).
- **videos**: each fingerprinted video's drop, asset id, fingerprint blob and the canonical copy its
  drop's decision chose (``nd_videos``): a group is read from the index (``groups``), not by
  reading every drop.
- **drops**: for each indexed drop the version of its ``video_fingerprints`` partition it was built
  from. The index is a cache of those tables: ``sync`` re-indexes any drop whose stored partition
  changed (or is missing: a store that predates the index, an index lost) and forgets drops that are
  gone, so a decision never depends on the index being current; only its cost does.

Ids are derived from content (a video's id from its drop and asset id), so concurrent runs of
different drops write without coordination. Nothing here imports Dagster.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from math import comb
from typing import Any

import numpy as np

from vidassets.media.fingerprint import band_keys
from vidassets.storage.sql import Database

TABLES = 32
BITS = 24
SEED = 20261205
PLAN = f"lsh-{TABLES}x{BITS}-seed{SEED}"
"""Changing the plan re-indexes every drop (the stored postings are keyed by it)."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS nd_meta (name VARCHAR(64) PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nd_drops (drop_key TEXT PRIMARY KEY, version TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nd_videos (video_id BIGINT PRIMARY KEY, drop_key TEXT NOT NULL, asset_id TEXT NOT NULL,"
    " blob TEXT NOT NULL, canonical TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS nd_videos_drop ON nd_videos (drop_key)",
    "CREATE INDEX IF NOT EXISTS nd_videos_canonical ON nd_videos (canonical)",
    "CREATE INDEX IF NOT EXISTS nd_videos_asset ON nd_videos (asset_id)",
    "CREATE TABLE IF NOT EXISTS nd_frames (video_id BIGINT NOT NULL, ordinal INTEGER NOT NULL, hash {blob} NOT NULL,"
    " PRIMARY KEY (video_id, ordinal))",
    "CREATE TABLE IF NOT EXISTS nd_postings (lsh_key BIGINT NOT NULL, video_id BIGINT NOT NULL, ordinal INTEGER NOT NULL,"
    " PRIMARY KEY (lsh_key, video_id, ordinal)){without_rowid}",
)


def positions() -> np.ndarray:
    """(TABLES, BITS): the bit positions each table keys on (without replacement within a table)."""
    rng = np.random.default_rng(SEED)
    return np.stack([rng.permutation(256)[:BITS] for _ in range(TABLES)])


def frame_recall(distance: int) -> float:
    """Probability that two hashes at ``distance`` share a key in at least one table."""
    p = comb(256 - distance, BITS) / comb(256, BITS)
    return 1 - (1 - p) ** TABLES


def pair_recall(distances: Sequence[int]) -> float:
    """Probability that a video pair whose matching frame pairs lie at ``distances`` is found
    (tables drawn independently of the frames)."""
    miss = 1.0
    for d in distances:
        miss *= 1 - frame_recall(d)
    return 1 - miss


def lsh_keys(hashes: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """(n, TABLES) int64 keys of ``hashes`` (n, 32) uint8 under this index's plan."""
    return band_keys(hashes, positions() if where is None else where)


def video_id(drop: str, asset_id: str) -> int:
    """A 63-bit id from the drop and asset id (writers never coordinate)."""
    return int.from_bytes(hashlib.blake2b(f"{drop}\0{asset_id}".encode(), digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True)
class IndexedVideo:
    """One fingerprinted video as the index holds it."""

    asset_id: str
    blob: str
    """Its fingerprint blob (the hashes are re-indexed only when it changes)."""
    canonical: str
    """The asset id its drop's decision made canonical for it (itself when it is)."""
    hashes: np.ndarray | Callable[[], np.ndarray]
    """Its hashes (n, 32) uint8, or how to read them (only called for a video not indexed yet)."""


@dataclass
class Found:
    """A stored video the index returned."""

    drop: str
    asset_id: str


@dataclass
class Counters:
    probes: int = 0
    postings_read: int = 0
    frames_checked: int = 0
    drops_indexed: int = 0
    videos_hashed: int = 0


class NearDuplicateIndex:
    """The index in the database at ``url`` (a SQLAlchemy URL: ``sqlite:///…``,
    ``postgresql://…``), created on first use."""

    def __init__(self, url: str):
        self.url = url
        self.database = Database(url)
        self.sqlite = self.database.sqlite
        self.engine = self.database.engine
        self._sql = self.database.sql
        self.counters = Counters()
        self.database.create(_SCHEMA, lock=20261205, then=self._check_plan)

    @cached_property
    def _where(self) -> np.ndarray:
        return positions()

    def _check_plan(self, db: Any) -> None:
        plan = db.execute(self._sql("SELECT value FROM nd_meta WHERE name = 'plan'")).scalar()
        if plan != PLAN:  # another plan's postings: start over (sync re-indexes every drop)
            for table in ("nd_postings", "nd_frames", "nd_videos", "nd_drops", "nd_meta"):
                db.execute(self._sql(f"DELETE FROM {table}"))
            db.execute(self._sql("INSERT INTO nd_meta (name, value) VALUES ('plan', :plan)"), {"plan": PLAN})

    # -- writing ----------------------------------------------------------------------------------
    def indexed(self) -> dict[str, str]:
        """Drop -> the ``video_fingerprints`` version it was indexed from."""
        with self.engine.connect() as db:
            return dict(db.execute(self._sql("SELECT drop_key, version FROM nd_drops")).all())

    def put_drop(self, drop: str, version: str, videos: Iterable[IndexedVideo]) -> None:
        """Make the index hold exactly ``videos`` for ``drop``, built from its partition at ``version``.
        A video whose fingerprint blob is already indexed keeps its frames (only its canonical is
        rewritten): re-deciding a drop costs no hashing."""
        videos = list(videos)
        with self.engine.begin() as db:
            stored = {row[0]: (row[1], row[2]) for row in db.execute(
                self._sql("SELECT video_id, asset_id, blob FROM nd_videos WHERE drop_key = :d"), {"d": drop})}
            wanted = {video_id(drop, v.asset_id): v for v in videos}
            rehash = [vid for vid, v in wanted.items() if stored.get(vid, (None, None))[1] != v.blob]
            gone = [vid for vid in stored if vid not in wanted or vid in rehash]
            self._delete_frames(db, gone)
            if gone:
                db.execute(self._sql("DELETE FROM nd_videos WHERE video_id = :v"), [{"v": vid} for vid in gone])
            frames, postings = [], []
            for vid in rehash:
                v = wanted[vid]
                hashes = np.ascontiguousarray(v.hashes() if callable(v.hashes) else v.hashes, dtype=np.uint8)
                hashes = hashes.reshape(-1, 32)
                self.counters.videos_hashed += 1
                frames += [(vid, i, h.tobytes()) for i, h in enumerate(hashes)]
                keys = lsh_keys(hashes, self._where).tolist()
                postings += [(k, vid, i) for i in range(len(hashes)) for k in keys[i]]
            self.database.bulk(db, "INSERT INTO nd_frames (video_id, ordinal, hash) VALUES %s", frames)
            self.database.bulk(db, "INSERT INTO nd_postings (lsh_key, video_id, ordinal) VALUES %s", postings)
            news = [{"v": vid, "d": drop, "a": v.asset_id, "b": v.blob, "c": v.canonical} for vid, v in wanted.items()
                    if vid in rehash]
            if news:
                db.execute(self._sql("INSERT INTO nd_videos (video_id, drop_key, asset_id, blob, canonical) "
                                     "VALUES (:v, :d, :a, :b, :c)"), news)
            kept = [{"v": vid, "c": v.canonical} for vid, v in wanted.items() if vid not in rehash]
            if kept:
                db.execute(self._sql("UPDATE nd_videos SET canonical = :c WHERE video_id = :v"), kept)
            db.execute(self._sql("DELETE FROM nd_drops WHERE drop_key = :d"), {"d": drop})
            db.execute(self._sql("INSERT INTO nd_drops (drop_key, version) VALUES (:d, :ver)"),
                       {"d": drop, "ver": version})
        self.counters.drops_indexed += 1

    def _delete_frames(self, db: Any, video_ids: Sequence[int]) -> None:
        for vid in video_ids:
            hashes = [bytes(r[0]) for r in db.execute(
                self._sql("SELECT hash FROM nd_frames WHERE video_id = :v ORDER BY ordinal"), {"v": vid})]
            if hashes:
                keys = lsh_keys(np.frombuffer(b"".join(hashes), dtype=np.uint8).reshape(-1, 32), self._where)
                db.exec_driver_sql("DELETE FROM nd_postings WHERE lsh_key = {0} AND video_id = {0} AND ordinal = {0}"
                                   .format("?" if self.sqlite else "%s"),
                                   [(k, vid, i) for i, row in enumerate(keys.tolist()) for k in row])
            db.execute(self._sql("DELETE FROM nd_frames WHERE video_id = :v"), {"v": vid})

    def remove_drop(self, drop: str) -> None:
        with self.engine.begin() as db:
            ids = [r[0] for r in db.execute(self._sql("SELECT video_id FROM nd_videos WHERE drop_key = :d"), {"d": drop})]
            self._delete_frames(db, ids)
            db.execute(self._sql("DELETE FROM nd_videos WHERE drop_key = :d"), {"d": drop})
            db.execute(self._sql("DELETE FROM nd_drops WHERE drop_key = :d"), {"d": drop})

    def sync(self, stored: Mapping[str, str], load: Callable[[str], Iterable[IndexedVideo]]) -> list[str]:
        """Bring the index to the stored partitions (drop -> version, from one listing): re-index the
        drops whose version differs (``load`` gives their videos), forget the drops not stored.
        Returns the drops re-indexed."""
        have = self.indexed()
        for drop in sorted(set(have) - set(stored)):
            self.remove_drop(drop)
        changed = sorted(d for d, v in stored.items() if have.get(d) != v)
        for drop in changed:
            self.put_drop(drop, stored[drop], load(drop))
        return changed

    # -- reading ----------------------------------------------------------------------------------
    def neighbours(self, hashes: np.ndarray, max_hamming: int, skip_drop: str | None = None) -> list[Found]:
        """The stored videos (outside ``skip_drop``) holding a hash within ``max_hamming`` of one of
        ``hashes`` that shares an LSH key with it."""
        import faiss

        hashes = np.ascontiguousarray(hashes, dtype=np.uint8).reshape(-1, 32)
        if not len(hashes):
            return []
        keys = np.unique(lsh_keys(hashes, self._where))
        self.counters.probes += len(keys)
        hits: dict[tuple[int, int], bytes] = {}
        with self.engine.connect() as db:
            for start in range(0, len(keys), 10_000):
                chunk = keys[start:start + 10_000].tolist()  # (sorted: neighbouring pages)
                for vid, ordinal, h in self._probe(db, chunk):
                    hits[(vid, ordinal)] = bytes(h)
            self.counters.postings_read += len(hits)
            if not hits:
                return []
            frames = list(hits)
            stacked = np.frombuffer(b"".join(hits[f] for f in frames), dtype=np.uint8).reshape(-1, 32)
            query = faiss.IndexBinaryFlat(256)
            query.add(hashes)
            lims, _, _ = query.range_search(np.ascontiguousarray(stacked), max_hamming + 1)
            self.counters.frames_checked += len(frames)
            near = sorted({frames[i][0] for i in range(len(frames)) if lims[i + 1] > lims[i]})
            return [f for f in self._videos(db, near) if f.drop != skip_drop]

    def _probe(self, db: Any, keys: list[int]) -> list[tuple[int, int, Any]]:
        return self.database.select_in(db, "SELECT p.video_id, p.ordinal, f.hash FROM nd_postings p JOIN nd_frames f "
                                       "ON f.video_id = p.video_id AND f.ordinal = p.ordinal WHERE p.lsh_key", keys)

    def _videos(self, db: Any, ids: Sequence[int]) -> list[Found]:
        found = []
        for start in range(0, len(ids), 10_000):
            part = list(ids[start:start + 10_000])
            rows = self._in(db, "SELECT drop_key, asset_id FROM nd_videos WHERE video_id", part)
            found += [Found(d, a) for d, a in rows]
        return sorted(found, key=lambda f: (f.drop, f.asset_id))

    def _in(self, db: Any, head: str, values: list[Any]) -> list[tuple]:
        return self.database.select_in(db, head, values)

    def groups(self, found: Iterable[Found], skip_drop: str | None = None) -> list[Found]:
        """``found`` with every video of their near-duplicate groups (as their drops last decided
        them), transitively: a video, the canonical it points at, the videos pointing at either."""
        seen = {(f.drop, f.asset_id) for f in found}
        assets = {a for _, a in seen}
        frontier = set(assets)
        with self.engine.connect() as db:
            while frontier:
                part = sorted(frontier)
                rows = set()
                for start in range(0, len(part), 5_000):
                    chunk = part[start:start + 5_000]
                    rows |= set(self._in(db, "SELECT drop_key, asset_id, canonical FROM nd_videos WHERE asset_id", chunk))
                    rows |= set(self._in(db, "SELECT drop_key, asset_id, canonical FROM nd_videos WHERE canonical", chunk))
                frontier = set()
                for drop, asset, canonical in rows:
                    seen.add((drop, asset))
                    frontier |= {asset, canonical} - assets
                assets |= frontier
        return sorted((Found(d, a) for d, a in seen if d != skip_drop), key=lambda f: (f.drop, f.asset_id))
