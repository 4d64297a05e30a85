"""Near-duplicate groups across all partitions, perceptual (PDQ) and semantic (embeddings), kept
separately, updated incrementally.

- Perceptual: every sampled frame's PDQ hash goes into a faiss binary index. Two clips are linked
  when, of all their sampled frames together, at least ``min_frame_share`` have a match in the other
  clip within Hamming distance ``max_hamming``.
- Semantic: inner-product top-k on L2-normalised clip embeddings; linked at cosine >= threshold.
- Union-find turns links into groups.

Incremental: the state (features, union-find parents, evidence, which partition versions it covers)
is stored in the store. A new partition's clips are queried against the stored indexes and merged;
features of partitions already covered are never recomputed or re-read. If a covered partition was
rebuilt (its tables changed) or the dedup parameters changed, the state is rebuilt from the tables.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import DedupSettings
from vidassets.storage.npz import ChunkSeries, load_npz, put_npz
from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import RowVersion
from vidassets.union_find import UnionFind

VERSION = "dedup-v3"  # v2: bit-sampling LSH with planned recall at the threshold (above EXACT_LIMIT frames);
# v3: the plan counts bits drawn without replacement and one matching frame (images)

STATE_PREFIX = "state/dedup"
STATE_KEY = f"{STATE_PREFIX}/state.npz"  # dedup-v2 and before kept the whole state in this one file
META_KEY = f"{STATE_PREFIX}/meta.npz"


@dataclass
class DedupState:
    version: str = ""
    clip_ids: list[str] = field(default_factory=list)
    asset_ids: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    covered: dict[str, str] = field(default_factory=dict)  # partition -> fingerprint of its tables
    frame_hashes: np.ndarray = field(default_factory=lambda: np.zeros((0, 32), np.uint8))
    frame_clip: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    has_vector: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    pdq_parent: list[int] = field(default_factory=list)
    sem_parent: list[int] = field(default_factory=list)
    pdq_evidence: dict[str, list] = field(default_factory=dict)  # clip -> [other clip, share]
    sem_evidence: dict[str, list] = field(default_factory=dict)  # clip -> [other clip, cosine]
    changed_shards: set[str] | None = None
    """Not stored: the drops whose group rows the last ``update`` may have changed (None: all, a
    state built from scratch)."""

    stored_clips: int | None = None
    """Not stored: how many clips (from the front) the store already holds in chunks (None: none)."""

    def save(self, objects: ObjectStore) -> None:
        """Append the clips added since the last save as one chunk (their hashes, vectors, ids), then
        the small mutable part (union-find parents, evidence, coverage): a run writes its new clips,
        not every clip. A state built from scratch, or one past ``npz.MAX_CHUNKS`` chunks, is written as one
        chunk."""
        series = ChunkSeries(objects, STATE_PREFIX)
        chunks, start = series.kept(META_KEY, self.stored_clips)
        if start < len(self.clip_ids) or not chunks:
            frames = self.frame_clip >= start
            key = series.next_key()
            put_npz(objects, key, {"clip_ids": self.clip_ids[start:], "asset_ids": self.asset_ids[start:],
                                   "shards": self.shards[start:]},
                    frame_hashes=self.frame_hashes[frames], frame_clip=self.frame_clip[frames],
                    vectors=self.vectors[start:] if len(self.vectors) else self.vectors, has_vector=self.has_vector[start:])
            chunks.append(key)
        meta = {k: getattr(self, k) for k in ("version", "covered", "pdq_evidence", "sem_evidence")}
        put_npz(objects, META_KEY, {**meta, "chunks": chunks},
                pdq_parent=np.asarray(self.pdq_parent, np.int64), sem_parent=np.asarray(self.sem_parent, np.int64))
        series.prune(chunks)
        objects.delete(STATE_KEY)  # the single-file state of dedup-v2 and before
        self.stored_clips = len(self.clip_ids)

    @classmethod
    def load(cls, objects: ObjectStore) -> DedupState:
        stored = load_npz(objects, META_KEY)
        if stored is None:
            return cls()
        meta, arrays = stored
        parts = [load_npz(objects, key) for key in meta.pop("chunks")]
        dim = max([p["vectors"].shape[1] for _, p in parts if p["vectors"].ndim == 2] or [0])
        vectors = [p["vectors"] if p["vectors"].ndim == 2 and p["vectors"].shape[1] == dim
                   else np.zeros((len(p["has_vector"]), dim), np.float32) for _, p in parts]
        state = cls(clip_ids=[c for i, _ in parts for c in i["clip_ids"]],
                    asset_ids=[a for i, _ in parts for a in i["asset_ids"]], shards=[s for i, _ in parts for s in i["shards"]],
                    frame_hashes=np.concatenate([np.zeros((0, 32), np.uint8), *(p["frame_hashes"] for _, p in parts)]),
                    frame_clip=np.concatenate([np.zeros(0, np.int64), *(p["frame_clip"] for _, p in parts)]),
                    vectors=np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32),
                    has_vector=np.concatenate([np.zeros(0, bool), *(p["has_vector"] for _, p in parts)]),
                    pdq_parent=arrays["pdq_parent"].tolist(), sem_parent=arrays["sem_parent"].tolist(),
                    changed_shards=set(), **meta)
        state.stored_clips = len(state.clip_ids)
        return state


@dataclass
class PartitionFeatures:
    clips: pd.DataFrame  # clip_id, asset_id, source_shard, first_frame, last_frame
    frames: pd.DataFrame  # asset_id, frame_index, pdq_hash
    embeddings: pd.DataFrame  # clip_id, status, vector


def update(state: DedupState, version: str, fingerprints: Mapping[str, str], load: Any,
           params: DedupSettings, engine: Any = None) -> tuple[DedupState, dict[str, int]]:
    """Bring ``state`` up to date with the partitions in ``fingerprints``; ``load(partition)``
    returns its PartitionFeatures. The band join and the verification of its pairs run as tasks on
    ``engine`` (None: here); the result is the same wherever they ran. Returns the new state and
    what was done."""
    stale = state.version != version or any(fingerprints.get(p) != fp for p, fp in state.covered.items())
    if stale:
        state = DedupState(version=version)  # built from scratch: every row is new
    else:
        state.changed_shards = set()
    new_parts = sorted(p for p in fingerprints if p not in state.covered)
    first_new = len(state.clip_ids)
    new_hashes: list[np.ndarray] = []
    new_owner: list[np.ndarray] = []
    new_vectors: list[np.ndarray | None] = []
    new_has: list[np.ndarray] = []
    for part in new_parts:
        feats = load(part)
        base = len(state.clip_ids)
        clips = feats.clips.sort_values("clip_id").reset_index(drop=True)
        state.clip_ids += list(clips.clip_id)
        state.asset_ids += list(clips.asset_id)
        state.shards += list(clips.source_shard)
        hashes, owner = _clip_frame_hashes(clips, feats.frames)
        new_hashes.append(hashes)
        new_owner.append(owner + base)
        vectors, has = _clip_vectors(clips, feats.embeddings)
        new_vectors.append(vectors)
        new_has.append(has)
        state.covered[part] = fingerprints[part]
    n_new = len(state.clip_ids) - first_new
    pdq = UnionFind(state.pdq_parent)
    sem = UnionFind(state.sem_parent)
    pdq.add(n_new)
    sem.add(n_new)
    done = {"rebuilt": int(stale), "new_partitions": len(new_parts), "new_clips": n_new,
            "perceptual_links": 0, "semantic_links": 0}
    if n_new:
        old_frames = len(state.frame_hashes)
        state.frame_hashes = np.concatenate([state.frame_hashes, *new_hashes])
        state.frame_clip = np.concatenate([state.frame_clip, *new_owner])
        done["perceptual_links"] = _perceptual_links(state, old_frames, pdq, params, engine)
        done["semantic_links"] = _semantic_links(state, first_new, new_vectors, new_has, sem, params, engine)
    state.pdq_parent, state.sem_parent = pdq.parent, sem.parent
    if state.changed_shards is not None:
        # every link has a new clip on one side: a new clip changes the rows (group id, size, evidence)
        # of every member of the groups it ends up in, and nothing else
        touched = list(range(first_new, len(state.clip_ids)))
        pdq_roots, sem_roots = _roots(pdq), _roots(sem)
        hit_pdq, hit_sem = np.unique(pdq_roots[touched]), np.unique(sem_roots[touched])
        affected = np.isin(pdq_roots, hit_pdq) | np.isin(sem_roots, hit_sem)
        state.changed_shards |= set(np.asarray(state.shards, dtype=object)[affected].tolist()) | set(new_parts)
    return state, done


def _roots(uf: UnionFind) -> np.ndarray:
    """Every member's root, by pointer jumping over the parent array (vectorised)."""
    roots = np.asarray(uf.parent, np.int64)
    while len(roots):
        jumped = roots[roots]
        if np.array_equal(jumped, roots):
            break
        roots = jumped
    return roots


def _clip_frame_hashes(clips: pd.DataFrame, frames: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """PDQ hashes (n, 32) of the sampled frames inside each clip, and the clip row of each."""
    if not len(frames) or not len(clips):
        return np.zeros((0, 32), np.uint8), np.zeros(0, np.int64)
    spans = clips[["asset_id", "first_frame", "last_frame"]].assign(row=np.arange(len(clips)))
    joined = frames[["asset_id", "frame_index", "pdq_hash"]].merge(spans, on="asset_id")
    joined = joined[(joined.frame_index >= joined.first_frame) & (joined.frame_index <= joined.last_frame)]
    hashes = np.frombuffer(bytes.fromhex("".join(joined.pdq_hash)), np.uint8).reshape(-1, 32)
    return hashes, joined.row.to_numpy(np.int64)


def _clip_vectors(clips: pd.DataFrame, embeddings: pd.DataFrame) -> tuple[np.ndarray | None, np.ndarray]:
    has = np.zeros(len(clips), bool)
    if not len(embeddings):
        return None, has
    ok = embeddings[embeddings.status == "ok"]
    if not len(ok):
        return None, has
    dim = int(ok.dim.iloc[0])
    rows = pd.Series(np.arange(len(clips)), index=clips.clip_id).reindex(ok.clip_id)
    ok, rows = ok[rows.notna().to_numpy()], rows.dropna().astype(np.int64).to_numpy()
    vectors = np.zeros((len(clips), dim), np.float32)
    vectors[rows] = np.frombuffer(b"".join(ok.vector), "<f4").reshape(-1, dim)
    has[rows] = True
    return vectors, has


EXACT_LIMIT = 200_000  # sampled frames; above this, candidate pairs come from locality-sensitive hashing
LSH_BITS = 24
"""Bits sampled per hash table: random pairs share a key with probability 2^-24 per table."""
LSH_MIN_FRAME_PAIRS = 1
"""Matching frame pairs a linked item pair has at least: one, for images (1-frame samples) and
1-frame clips; recall is planned for this worst case (longer clips get more)."""
LSH_RECALL = 0.995
"""Planned recall of a one-frame pair exactly at ``max_hamming`` (more for closer ones, and for
longer items): above the 0.99 target by a margin, since a plan of exactly 0.99 measures below it
about half the time (bench/dedup.py measured 0.9893 on 1,500 pairs when planned at 0.99)."""
LSH_NARROW_BITS = 4
"""Stored frames are narrowed to the new frames' partial keys once those keys have this many bits
more than log2(new frames): at most ~1/16 of the stored frames then stay (random hashes)."""
LSH_NARROW_MAX_BITS = 24
"""Largest partial key narrowed by a lookup table (2^24 flags: 16 MiB)."""


def key_collision(distance: int, bits: int = LSH_BITS) -> float:
    """Probability that two hashes ``distance`` bits apart share a table's key: its ``bits``
    positions, drawn without replacement (as ``_lsh_candidates`` draws them), all miss the differing
    ones: C(256 - d, bits) / C(256, bits) (below (1 - d/256)^bits, the with-replacement figure)."""
    return math.comb(256 - distance, bits) / math.comb(256, bits)


def lsh_tables(max_hamming: int, bits: int = LSH_BITS, frame_pairs: int = LSH_MIN_FRAME_PAIRS,
               recall: float = LSH_RECALL) -> int:
    """Hash tables of ``bits`` sampled bits each such that a clip pair with ``frame_pairs`` matching
    frame pairs, each at Hamming distance ``max_hamming``, shares a key in some table with
    probability >= ``recall``: one table keeps a frame pair with q = ``key_collision(d, bits)``; L
    tables keep it with p = 1 - (1 - q)^L; the clip pair is found with 1 - (1 - p)^frame_pairs."""
    q = key_collision(max_hamming, bits)
    p_needed = 1 - (1 - recall) ** (1 / frame_pairs)
    if q >= 1:
        return 1
    return max(1, math.ceil(math.log(1 - p_needed) / math.log(1 - q)))


def _perceptual_links(state: DedupState, first_new_frame: int, uf: UnionFind, params: DedupSettings,
                      engine: Any = None) -> int:
    hashes, owner = state.frame_hashes, state.frame_clip
    if first_new_frame >= len(hashes):
        return 0
    first_new_clip = int(owner[first_new_frame:].min())
    if len(hashes) <= EXACT_LIMIT:
        candidates = _exact_candidates(hashes, owner, first_new_frame, params.max_hamming)
    else:
        candidates = _lsh_candidates(hashes, owner, first_new_clip, lsh_tables(params.max_hamming), engine=engine)
    if not len(candidates):
        return 0
    share = pair_shares(hashes, owner, candidates, params.max_hamming, engine)
    linked = share >= params.min_frame_share
    for x, y, v in zip(candidates[linked, 0].tolist(), candidates[linked, 1].tolist(), share[linked].tolist(), strict=True):
        uf.union(x, y)
        _evidence(state.pdq_evidence, state.clip_ids, x, y, v)
    return int(linked.sum())


def _exact_candidates(hashes: np.ndarray, owner: np.ndarray, first_new_frame: int, max_hamming: int) -> np.ndarray:
    """Clip pairs with at least one frame pair within ``max_hamming`` (faiss exact binary search)."""
    import faiss

    index = faiss.IndexBinaryFlat(256)
    index.add(hashes)
    lims, _, found = index.range_search(hashes[first_new_frame:], max_hamming + 1)
    query = np.repeat(np.arange(first_new_frame, len(hashes), dtype=np.int64), np.diff(lims).astype(np.int64))
    return _clip_pairs(owner[query], owner[found.astype(np.int64)])


LSH_SLICE_FRAMES = 4_000_000
"""Stored frames one task of the band join reads, with every table (the slice's hash words are
gathered once for all of them): what bounds a worker's memory (the arrays sit in Ray's object store
once, each task touching its slice)."""


def lsh_plan(tables: int, bits: int = LSH_BITS) -> list[np.ndarray]:
    """The bit positions each hash table keys on (fixed seed: the same tables every run)."""
    rng = np.random.default_rng(20250601)
    return [rng.choice(256, size=bits, replace=False) for _ in range(tables)]


class LshJoin:
    """One task of the band join: clip pairs (one side new) sharing a key in some table, between
    the new frames and stored frames ``[lo, hi)`` (the engine's compute; picklable)."""

    def __init__(self, hashes: np.ndarray, owner: np.ndarray, first_new_clip: int, plan: list[np.ndarray]):
        self.hashes, self.owner, self.first_new_clip, self.plan = hashes, owner, first_new_clip, plan

    def __call__(self, item: tuple[int, int]) -> dict[str, Any]:
        lo, hi = item
        return {"pairs": _lsh_pairs(self.hashes, self.owner, self.first_new_clip, self.plan, lo, hi)}


def _lsh_candidates(hashes: np.ndarray, owner: np.ndarray, first_new_clip: int, tables: int,
                    bits: int = LSH_BITS, engine: Any = None) -> np.ndarray:
    """Clip pairs (one side new: clip >= ``first_new_clip``) whose frames share the key of some hash
    table, each table keying a frame by ``bits`` bit positions of its PDQ hash drawn at random (fixed
    seed: the same tables every run). Bit sampling is locality-sensitive for Hamming distance with a
    known collision probability, so ``lsh_tables`` plans the recall at the threshold (see
    ``bench/dedup.py`` for it measured per distance). Candidates are verified exactly.

    The join runs as tasks of ``LSH_SLICE_FRAMES`` stored frames on ``engine`` (None: here, in
    order); the pairs are their union, the same wherever they ran."""
    n_old = int((owner < first_new_clip).sum())
    plan = lsh_plan(tables, bits)
    items = [(lo, min(lo + LSH_SLICE_FRAMES, n_old)) for lo in range(0, max(n_old, 1), LSH_SLICE_FRAMES)]
    join = LshJoin(hashes, owner, first_new_clip, plan)
    if engine is None:
        parts = [join(item)["pairs"] for item in items]
    else:
        parts = []
        for item, outcome in zip(items, engine.map(join, items, label=lambda i: f"stored frames {i[0]}-{i[1]}"),
                                 strict=True):
            if outcome.row is None:  # a task Ray could not finish: the step fails, nothing is saved
                raise RuntimeError(f"dedup band join {item}: {outcome.reason}")
            parts.append(outcome.row["pairs"])
    pairs = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    return np.unique(pairs, axis=0) if len(pairs) else pairs


def _lsh_pairs(hashes: np.ndarray, owner: np.ndarray, first_new_clip: int, plan: list[np.ndarray],
               lo: int, hi: int) -> np.ndarray:
    """The band join of ``plan``'s tables between every new frame and stored frames ``[lo, hi)``
    (stored frames in the order the state keeps them).

    A stored frame matters only where its key equals a new frame's: keys are built 16 hash bits at a
    time (the words holding most key bits first), and once the key so far tells the new frames apart
    (``LSH_NARROW_BITS`` bits beyond log2 of their count) the stored frames whose partial key no new
    frame has are dropped, so a small drop reads a few words of most stored frames, not every word
    a key uses. The pairs are exactly those of whole keys."""
    values = np.arange(1 << 16, dtype=np.uint32)
    new_at = np.flatnonzero(owner >= first_new_clip)
    old_at = np.flatnonzero(owner < first_new_clip)[lo:hi]
    n_old = len(old_at)
    in_order = not n_old or (int(old_at[0]) == lo and int(old_at[-1]) == hi - 1)  # a contiguous slice
    # word-major: each gather reads one contiguous column of 16-bit words (bit 15 = the word's first hash bit)
    words = np.ascontiguousarray(hashes).view(">u2")
    old_columns = np.ascontiguousarray(words[lo:hi].T if in_order else words[old_at].T, dtype=np.uint16)
    new_columns = np.ascontiguousarray(words[new_at].T, dtype=np.uint16)
    narrow_from = math.ceil(math.log2(max(len(new_at), 1))) + LSH_NARROW_BITS
    parts = []
    for positions in plan:
        held: dict[int, list[int]] = {}
        for position in positions.tolist():
            held.setdefault(position // 16, []).append(position % 16)
        new_key = np.zeros(len(new_at), np.uint32)
        old_key = np.zeros(n_old, np.uint32)
        alive = None  # None: every stored frame of the slice, in place; else positions within the slice
        key_bits = 0
        for word in sorted(held, key=lambda w: (-len(held[w]), w)):
            lut = np.zeros(1 << 16, np.uint32)  # the key bits this word holds, for each of its values
            for bit in held[word]:
                lut |= ((values >> np.uint32(15 - bit)) & np.uint32(1)) << np.uint32(key_bits)
                key_bits += 1
            new_key |= lut[new_columns[word]]
            old_key |= lut[old_columns[word] if alive is None else old_columns[word][alive]]
            if narrow_from <= key_bits <= LSH_NARROW_MAX_BITS and len(old_key) > 2 * len(new_key):
                seen = np.zeros(1 << key_bits, bool)
                seen[new_key] = True
                keep = seen[old_key]
                alive = (np.arange(n_old) if alive is None else alive)[keep]
                old_key = old_key[keep]
        frames = np.concatenate([old_at if alive is None else old_at[alive], new_at])
        parts.append(_equal_key_pairs(np.concatenate([old_key, new_key]), owner[frames], first_new_clip))
    pairs = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    return np.unique(pairs, axis=0) if len(pairs) else pairs


def _window_candidates(hashes: np.ndarray, owner: np.ndarray, first_new_clip: int) -> np.ndarray:
    """The previous candidate generator, kept as the baseline of ``bench/dedup.py``: clip pairs whose
    frames share any of 16 overlapping 32-bit windows of the PDQ hash (stride 16 bits). Its per-pair
    recall falls fast near the threshold (about 0.17 at Hamming 31)."""
    words = np.ascontiguousarray(hashes).view(">u2").astype(np.uint64)  # (F, 16) 16-bit words
    windows = (words << np.uint64(16)) | np.roll(words, -1, axis=1)
    keys = (windows | (np.arange(16, dtype=np.uint64) << np.uint64(32))).ravel()
    return _equal_key_pairs(keys, np.repeat(owner, 16), first_new_clip)


def _equal_key_pairs(keys: np.ndarray, owner: np.ndarray, first_new_clip: int) -> np.ndarray:
    """Clip pairs (one side new) of frames with equal keys: a sort, then every pair inside each run
    of equal keys (runs are short)."""
    if keys.dtype == np.uint32 and len(keys) < 2**32:  # key and position in one word: a plain sort
        packed = np.sort((keys.astype(np.uint64) << np.uint64(32)) | np.arange(len(keys), dtype=np.uint64))
        keys, order = packed >> np.uint64(32), (packed & np.uint64(0xFFFFFFFF)).astype(np.int64)
    else:
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    clip_of = owner[order]
    same = np.flatnonzero(keys[1:] == keys[:-1])
    if not len(same):
        return np.zeros((0, 2), np.int64)
    breaks = np.diff(same) > 1
    starts = same[np.r_[True, breaks]]
    lengths = np.r_[same[np.r_[breaks, False]], same[-1]] - starts + 2
    a_parts, b_parts = [], []
    for length in np.unique(lengths):
        at = starts[lengths == length]
        i, j = np.triu_indices(int(length), 1)
        a_parts.append(clip_of[at[:, None] + i[None, :]].ravel())
        b_parts.append(clip_of[at[:, None] + j[None, :]].ravel())
    pairs = _clip_pairs(np.concatenate(a_parts), np.concatenate(b_parts))
    return pairs[pairs[:, 1] >= first_new_clip]  # at least one side is new


def _clip_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    keep = a != b
    lo, hi = np.minimum(a[keep], b[keep]), np.maximum(a[keep], b[keep])
    return np.unique(np.stack([lo, hi], axis=1), axis=0) if len(lo) else np.zeros((0, 2), np.int64)


PAIRS_PER_TASK = 20_000
"""Candidate pairs one verification task checks, with only those clips' frames."""


class PairCheck:
    """One task of the verification: the share of matching frames of each pair in a batch (the
    engine's compute; an item carries its pairs' frames only)."""

    def __init__(self, max_hamming: int):
        self.max_hamming = max_hamming

    def __call__(self, item: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[str, Any]:
        hashes, owner, pairs = item
        return {"share": _pair_shares(hashes, owner, int(owner.max()) + 1 if len(owner) else 0, pairs,
                                      self.max_hamming)}


def pair_shares(hashes: np.ndarray, owner: np.ndarray, pairs: np.ndarray, max_hamming: int,
                engine: Any = None) -> np.ndarray:
    """``_pair_shares`` of every candidate pair, in batches of ``PAIRS_PER_TASK`` that each carry
    only their clips' frames (renumbered), on ``engine`` (None: here)."""
    order = np.argsort(owner, kind="stable")
    starts = np.searchsorted(owner[order], np.arange(int(owner.max()) + 2 if len(owner) else 1))
    items = []
    for lo in range(0, len(pairs), PAIRS_PER_TASK):
        batch = pairs[lo:lo + PAIRS_PER_TASK]
        clips, local = np.unique(batch, return_inverse=True)
        frames = np.concatenate([order[starts[c]:starts[c + 1]] for c in clips])
        renumber = np.repeat(np.arange(len(clips)), starts[clips + 1] - starts[clips])
        items.append((hashes[frames], renumber, local.reshape(-1, 2)))
    check = PairCheck(max_hamming)
    if engine is None:
        parts = [check(item)["share"] for item in items]
    else:
        parts = []
        for outcome in engine.map(check, items, label=lambda i: f"{len(i[2])} pairs"):
            if outcome.row is None:
                raise RuntimeError(f"dedup pair verification: {outcome.reason}")
            parts.append(outcome.row["share"])
    return np.concatenate(parts) if parts else np.zeros(0)


def _pair_shares(hashes: np.ndarray, owner: np.ndarray, n_clips: int, pairs: np.ndarray, max_hamming: int,
                 batch: int = 20_000) -> np.ndarray:
    """Exact check of candidate clip pairs: the share of both clips' sampled frames that have a
    frame within ``max_hamming`` in the other clip."""
    counts = np.bincount(owner, minlength=n_clips)
    order = np.argsort(owner, kind="stable")
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    slot = np.arange(len(owner)) - starts[owner[order]]
    width = int(counts.max())
    padded = np.zeros((n_clips, width, 4), np.uint64)  # frame hashes as 4 words, per clip
    valid = np.zeros((n_clips, width), bool)
    padded[owner[order], slot] = np.ascontiguousarray(hashes[order]).view("<u8")
    valid[owner[order], slot] = True
    out = np.empty(len(pairs))
    for lo in range(0, len(pairs), batch):
        a, b = pairs[lo : lo + batch, 0], pairs[lo : lo + batch, 1]
        dist = np.bitwise_count(padded[a][:, :, None, :] ^ padded[b][:, None, :, :]).sum(axis=3, dtype=np.int32)
        close = (dist <= max_hamming) & valid[a][:, :, None] & valid[b][:, None, :]
        matched = close.any(axis=2).sum(axis=1) + close.any(axis=1).sum(axis=1)
        out[lo : lo + batch] = matched / (counts[a] + counts[b])
    return out


def _evidence(evidence: dict[str, list], clip_ids: list[str], x: int, y: int, value: float) -> None:
    for a, b in ((x, y), (y, x)):
        best = evidence.get(clip_ids[a])
        if best is None or value > best[1]:
            evidence[clip_ids[a]] = [clip_ids[b], round(float(value), 4)]


def semantic_index(vectors: np.ndarray):
    """Exact inner product for small sets; IVF (sqrt-scaled lists, 16 probes) for large ones."""
    import faiss

    n, dim = vectors.shape
    if n <= 50_000:
        index = faiss.IndexFlatIP(dim)
    else:
        nlist = int(4 * np.sqrt(n))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        index.train(vectors[rng.choice(n, size=min(n, nlist * 40), replace=False)])
        index.nprobe = 16
    index.add(vectors)
    return index


SEMANTIC_SLICE = 1_000_000
"""Stored vectors one neighbour-search task indexes (its own ``semantic_index``: exact up to 50,000,
IVF above); each query's nearest are merged over the slices. Up to 10^6 vectors: one index of all."""


class NeighbourSearch:
    """One task of the semantic search: the ``k`` nearest of every query among stored vectors
    ``ids[lo:hi]`` (the engine's compute; picklable)."""

    def __init__(self, vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int):
        self.vectors, self.ids, self.queries, self.k = vectors, ids, queries, k

    def __call__(self, item: tuple[int, int]) -> dict[str, Any]:
        lo, hi = item
        members = self.ids[lo:hi]
        index = semantic_index(np.ascontiguousarray(self.vectors[members], dtype=np.float32))
        sims, hits = index.search(np.ascontiguousarray(self.vectors[self.queries], dtype=np.float32),
                                  min(self.k, len(members)))
        return {"sims": sims, "hits": np.where(hits >= 0, members[np.clip(hits, 0, None)], -1)}


def nearest(vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int,
            engine: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(similarities, clip rows) of each query's ``k`` nearest stored vectors (rows ``ids``), by
    inner product, best first (ties: the lower row): tasks of ``SEMANTIC_SLICE`` stored vectors on
    ``engine`` (None: here, in order), merged; the same wherever they ran."""
    items = [(lo, min(lo + SEMANTIC_SLICE, len(ids))) for lo in range(0, len(ids), SEMANTIC_SLICE)]
    search = NeighbourSearch(vectors, ids, queries, k)
    if engine is None:
        found = [search(item) for item in items]
    else:
        found = []
        for item, outcome in zip(items, engine.map(search, items, label=lambda i: f"vectors {i[0]}-{i[1]}"),
                                 strict=True):
            if outcome.row is None:
                raise RuntimeError(f"dedup neighbour search {item}: {outcome.reason}")
            found.append(outcome.row)
    sims = np.concatenate([f["sims"] for f in found], axis=1)
    hits = np.concatenate([f["hits"] for f in found], axis=1)
    sims = np.where(hits >= 0, sims, -np.inf)
    order = np.lexsort((np.where(hits >= 0, hits, np.iinfo(np.int64).max), -sims), axis=1)[:, :k]
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(hits, order, axis=1)


def _semantic_links(state: DedupState, first_new: int, new_vectors: Sequence[np.ndarray | None],
                    new_has: Sequence[np.ndarray], uf: UnionFind, params: DedupSettings, engine: Any = None) -> int:
    dims = {v.shape[1] for v in new_vectors if v is not None}
    if state.vectors.size:
        dims.add(state.vectors.shape[1])
    if len(dims) > 1:
        raise ValueError(f"embeddings of different sizes cannot be compared: {sorted(dims)}")
    dim = dims.pop() if dims else 0
    sizes = [len(h) for h in new_has]
    blocks = [v if v is not None else np.zeros((k, dim), np.float32) for v, k in zip(new_vectors, sizes, strict=True)]
    old = state.vectors if state.vectors.size else np.zeros((first_new, dim), np.float32)
    state.vectors = np.concatenate([old, *blocks]) if dim else np.zeros((len(state.clip_ids), 0), np.float32)
    state.has_vector = np.concatenate([state.has_vector, *new_has]) if new_has else state.has_vector
    if not dim or not state.has_vector[first_new:].any():
        return 0
    ids = np.flatnonzero(state.has_vector)
    queries = np.flatnonzero(state.has_vector[first_new:]) + first_new
    k = min(params.semantic_k + 1, len(ids))
    sims, hits = nearest(state.vectors, ids, queries, k, engine)
    a = np.repeat(queries, k)
    valid = hits.ravel() >= 0
    b = hits.ravel()
    sim = sims.ravel()
    keep = valid & (b != a) & (sim >= params.semantic_min_cosine)
    for x, y, s in zip(a[keep].tolist(), b[keep].tolist(), sim[keep].tolist(), strict=True):
        uf.union(x, y)
        _evidence(state.sem_evidence, state.clip_ids, x, y, s)
    return int(keep.sum())


def group_rows(state: DedupState, version: RowVersion, shards: set[str] | None = None) -> list[dict[str, Any]]:
    """One row per clip (of ``shards``, else of every drop): its perceptual and semantic group (id =
    smallest member clip_id), size, representative (smallest clip_id; selection decides what to
    keep) and evidence."""
    rows = []
    ids = np.asarray(state.clip_ids, dtype=object)
    pdq_roots, sem_roots = _roots(UnionFind(state.pdq_parent)), _roots(UnionFind(state.sem_parent))
    pdq_group, pdq_size = _group_ids(ids, pdq_roots)
    sem_group, sem_size = _group_ids(ids, sem_roots)
    wanted = range(len(ids)) if shards is None else \
        np.flatnonzero(np.isin(np.asarray(state.shards, dtype=object), list(shards))).tolist()
    for i in wanted:
        clip_id = state.clip_ids[i]
        rows.append({
            "clip_id": clip_id, "asset_id": state.asset_ids[i], "source_shard": state.shards[i],
            "pdq_group": pdq_group[i], "pdq_group_size": int(pdq_size[i]),
            "pdq_evidence": json.dumps(state.pdq_evidence.get(clip_id)),
            "semantic_group": sem_group[i] if state.has_vector[i] else None,
            "semantic_group_size": int(sem_size[i]) if state.has_vector[i] else 0,
            "semantic_evidence": json.dumps(state.sem_evidence.get(clip_id)),
            "producer_version": version.producer, "input_version": version.inputs, "runs": 1,
        })
    return rows


def _group_ids(ids: np.ndarray, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per clip, its group's id (the smallest member clip_id) and size."""
    if not len(ids):
        return ids, np.zeros(0, np.int64)
    order = np.lexsort((ids.astype(str), roots))  # by root, then clip_id: each root's first is its id
    first = np.r_[True, roots[order][1:] != roots[order][:-1]]
    starts = np.flatnonzero(first)
    sizes = np.diff(np.r_[starts, len(order)])
    group_of_sorted = np.repeat(np.arange(len(starts)), sizes)
    group_id, size = np.empty(len(ids), dtype=object), np.empty(len(ids), np.int64)
    group_id[order] = ids[order][starts][group_of_sorted]
    size[order] = sizes[group_of_sorted]
    return group_id, size


def group_counts(state: DedupState) -> dict[str, int]:
    """Perceptual and semantic groups with more than one member, over every clip."""
    pdq = np.unique(_roots(UnionFind(state.pdq_parent)), return_counts=True)[1]
    sem_roots = _roots(UnionFind(state.sem_parent))[np.asarray(state.has_vector, bool)] \
        if len(state.has_vector) == len(state.clip_ids) else np.zeros(0, np.int64)
    sem = np.unique(sem_roots, return_counts=True)[1]
    return {"perceptual_groups_gt1": int((pdq > 1).sum()), "semantic_groups_gt1": int((sem > 1).sum())}
