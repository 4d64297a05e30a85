"""Near-duplicate groups across all partitions, perceptual (PDQ) and semantic (embeddings), kept
separately, updated incrementally.

- Perceptual: two clips are linked when, of all their sampled frames together, at least
  ``min_frame_share`` have a match in the other clip within Hamming distance ``max_hamming``.
  Candidate pairs are those whose frames share a key of one of ``lsh_tables`` bit-sampling hash
  tables (recall planned at the threshold); each is verified exactly.
- Semantic: inner-product top-k on L2-normalised clip embeddings; linked at cosine >= threshold.
- Links merge groups (a group's id is its smallest member clip_id).

Incremental: the state (``dedup_state.DedupState``, a SQL database) holds every covered clip's
hashes, keys, vector, group and evidence. A run reads the new partitions' features and, of the
stored state, only what their clips probe: the stored clips sharing a key, the vectors in the lists
nearest theirs, the groups they join. Among the new clips themselves the band join runs in memory,
as tasks on the engine. A covered partition removed, or rebuilt (its tables changed), is taken out
at the cost of its own clips (``_take_out``): the groups it was in split again from the stored links
of their remaining members; a rebuilt one then comes in again as new. New dedup parameters (or a
state that kept no links, from before they were kept) rebuild the state from the tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import DedupSettings
from vidassets.curate.dedup_state import (
    FLAT_LIMIT,
    KINDS,
    PROBES,
    DedupState,
    GroupChange,
    NewClips,
    StoredClip,
    list_count,
)
from vidassets.media.fingerprint import band_keys
from vidassets.runtime.engine import all_or_fail
from vidassets.storage.input_versions import told_every_change
from vidassets.storage.rows import RowVersion

VERSION = "dedup-v5"  # v2: bit-sampling LSH with planned recall at the threshold (above 200,000 frames);
# v3: the plan counts bits drawn without replacement and one matching frame (images); v4: the state in
# SQL, read in pieces: candidates always from the band join (no exact search below 200,000 frames),
# vectors compared within their nearest k-means lists past FLAT_LIMIT; v5: sqrt(8n) lists
# (list_count) instead of lists of 32


@dataclass
class PartitionFeatures:
    clips: pd.DataFrame  # clip_id, asset_id, source_shard, first_frame, last_frame
    frames: pd.DataFrame  # asset_id, frame_index, pdq_hash
    embeddings: pd.DataFrame  # clip_id, status, vector


@dataclass
class Update:
    """What a run of ``update`` did."""

    changed_shards: set[str] | None
    """The drops whose group rows may have changed, those taken out included (None: every drop, a
    state built from scratch)."""
    done: dict[str, int]
    size: int
    """Clips the state covers."""


def update(state: DedupState, version: str, fingerprints: Mapping[str, str], load: Any,
           params: DedupSettings, engine: Any = None, changed: Iterable[str] | None = None) -> Update:
    """Bring ``state`` up to date with the partitions in ``fingerprints``; ``load(partition)``
    returns its PartitionFeatures. ``changed``: the partitions whose fingerprint may differ from the
    last run's (added, rebuilt or removed since; None: unknown), so only their rows of the covered
    drops are read; a covered one removed or rebuilt is taken out first (``_take_out``). The band
    join among the new clips and the verification of the candidate pairs run as tasks on ``engine``
    (None: here); the result is the same wherever they ran."""
    state.counters = dict.fromkeys(state.counters, 0)
    meta = state.meta()
    counted = meta.get("version") == version and "drops" in meta
    exact = False
    if changed is not None and counted:
        asked = set(changed)
        covered = state.covered(asked)
        # the count catches a partition that changed outside ``changed``: the whole comparison then
        exact = told_every_change(int(meta["drops"]), asked, covered, fingerprints)
    if not exact:
        covered = state.covered()
    looked_at = asked if exact else fingerprints
    gone = sorted(p for p, fp in covered.items() if fingerprints.get(p) != fp)  # removed or rebuilt
    drops_before = len(covered) if not exact else int(meta["drops"])
    stale = meta.get("version") != version or bool(gone and not meta.get("links"))
    if stale:  # built from scratch: every row is new
        state.reset(version)
        meta, drops_before, gone = state.meta(), 0, []
        new_parts = sorted(fingerprints)
    else:
        new_parts = sorted(p for p in looked_at if p in fingerprints and (p not in covered or p in gone))
    if gone:
        drops_before -= len(gone)
        _take_out(state, gone, drops_before)
        meta = state.meta()
    first = int(meta.get("next_row", meta["clips"]))
    new = _new_clips(new_parts, load, first=first, dim=int(meta["dim"]))
    pdq_links = _perceptual_links(state, new, params, engine)
    sem_links, lists = _semantic_links(state, new, params, engine)
    involved = {r for x, y, _ in pdq_links + sem_links for r in (x, y) if r < first}
    stored = state.clips(involved)
    changes = {"pdq": _merge(state, "pdq", pdq_links, stored, new), "sem": _merge(state, "sem", sem_links, stored, new)}
    evidence = {"pdq": _evidence(pdq_links, "pdq", stored, new), "sem": _evidence(sem_links, "sem", stored, new)}
    vectors = int(meta["vectors"]) + int(new.has_vector.sum())
    dim = int(meta["dim"]) or (new.vectors.shape[1] if new.has_vector.any() else 0)
    touched = {kind: set(change.root_of.values()) | set(change.absorbed) for kind, change in changes.items()}
    before = meta.get("unwritten", [])  # drops a run changed and did not write (it stopped between)
    unwritten = None if stale or before == "all" else set(before) | set(new_parts) | state.shards_of(touched)
    state.add(new, {p: fingerprints[p] for p in new_parts}, changes, evidence, lists, {
        "clips": int(meta["clips"]) + len(new.rows), "next_row": first + len(new.rows), "vectors": vectors, "dim": dim,
        "drops": drops_before + len(new_parts),
        "pdq_gt1": int(meta["pdq_gt1"]) + changes["pdq"].gt1_delta, "sem_gt1": int(meta["sem_gt1"]) + changes["sem"].gt1_delta,
        "unwritten": sorted(unwritten) if unwritten is not None else "all"}, {"pdq": pdq_links, "sem": sem_links})
    _relist_if_grown(state, vectors, int(meta.get("trained_on", 0)), dim)
    done = {"rebuilt": int(stale), "taken_out_partitions": len(gone), "new_partitions": len(new_parts),
            "new_clips": len(new.rows),
            "perceptual_links": len(pdq_links), "semantic_links": len(sem_links)}
    return Update(unwritten, done, int(meta["clips"]) + len(new.rows))


def _take_out(state: DedupState, drops: Sequence[str], drops_after: int) -> None:
    """Take the clips of the covered ``drops`` out of the state at the cost of those clips and the
    groups they were in: their rows are marked gone (their postings and vectors skipped from now
    on) and their links deleted; each group one was in is split again by the stored links among its
    remaining members (a link only ever joins members of one group, so these are every link that
    held it together); a remaining member whose evidence named a clip taken out gets its best
    remaining link's. Those drops and the drops of the regrouped members are marked unwritten
    (their rows change)."""
    meta = state.meta()
    out = state.clips_of(drops)
    removed, names_out = set(out), {c.clip_id for c in out.values()}
    changes: dict[str, GroupChange] = {}
    evidence: dict[str, dict[int, list | None]] = {}
    shards = set(drops)
    for kind in KINDS:
        roots = {c.roots[kind] for c in out.values()}
        before = state.groups(kind, roots)
        members = {r: c for r, c in state.members(kind, roots).items() if r not in removed}
        links = [link for link in state.links_of(kind, members) if link[0] not in removed and link[1] not in removed]
        changes[kind] = _regroup(kind, members, links, roots)
        changes[kind].gt1_delta -= sum(size > 1 for size, _ in before.values())
        evidence[kind] = _evidence_again(kind, members, links, names_out)
        shards |= {c.shard for c in members.values()}
    before_unwritten = meta.get("unwritten", [])
    state.take_out(sorted(out), changes, evidence, drops, {
        "clips": int(meta["clips"]) - len(out), "next_row": int(meta.get("next_row", meta["clips"])),
        "vectors": int(meta["vectors"]) - sum(c.has_vector for c in out.values()), "drops": drops_after,
        "pdq_gt1": int(meta["pdq_gt1"]) + changes["pdq"].gt1_delta, "sem_gt1": int(meta["sem_gt1"]) + changes["sem"].gt1_delta,
        "unwritten": "all" if before_unwritten == "all" else sorted(set(before_unwritten) | shards)})


def _regroup(kind: str, members: Mapping[int, StoredClip], links: Sequence[tuple[int, int, float]],
             roots: set[int]) -> GroupChange:
    """The groups of ``members`` (the remaining members of the groups at ``roots``) joined by
    ``links``: a group keeps its old root while that clip stays in it, else takes its smallest row
    (a member's row: no other group's root). ``absorbed``: the old roots no group keeps."""
    parent = {r: r for r in members}

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b, _ in links:
        x, y = find(a), find(b)
        if x != y:
            parent[max(x, y)] = min(x, y)
    parts: dict[int, list[int]] = {}
    for r in sorted(members):
        parts.setdefault(find(r), []).append(r)
    change = GroupChange()
    for rows in parts.values():
        old = members[rows[0]].roots[kind]
        root = old if old in members and find(old) == find(rows[0]) else rows[0]
        change.groups[root] = (len(rows), min(members[r].clip_id for r in rows))
        change.root_of |= {r: root for r in rows if members[r].roots[kind] != root}
    change.absorbed = {r: -1 for r in roots - set(change.groups)}
    change.gt1_delta = sum(size > 1 for size, _ in change.groups.values())
    return change


def _evidence_again(kind: str, members: Mapping[int, StoredClip], links: Sequence[tuple[int, int, float]],
                    names_out: set[str]) -> dict[int, list | None]:
    """The new evidence of the members whose evidence named a clip taken out: their best remaining
    link's (ties: the partner that arrived first, as ``_evidence`` keeps), None without one."""
    due = {r for r, c in members.items() if c.evidence[kind] is not None and c.evidence[kind][0] in names_out}
    best: dict[int, tuple[float, int]] = {}
    for a, b, value in links:
        for me, other in ((a, b), (b, a)):
            if me in due and (me not in best or (value, -other) > (best[me][0], -best[me][1])):
                best[me] = (value, other)
    return {r: [members[best[r][1]].clip_id, round(best[r][0], 4)] if r in best else None for r in due}


def _new_clips(parts: Sequence[str], load: Any, first: int, dim: int) -> NewClips:
    """The clips of ``parts`` (in order, each part's by clip_id), numbered from ``first``."""
    ids, assets, shards, hashes, owner, vectors, has = [], [], [], [], [], [], []
    for part in parts:
        feats = load(part)
        base = first + len(ids)
        clips = feats.clips.sort_values("clip_id").reset_index(drop=True)
        ids += list(clips.clip_id)
        assets += list(clips.asset_id)
        shards += list(clips.source_shard)
        frame_hashes, frame_owner = _clip_frame_hashes(clips, feats.frames)
        hashes.append(frame_hashes)
        owner.append(frame_owner + base)
        part_vectors, part_has = _clip_vectors(clips, feats.embeddings)
        vectors.append(part_vectors)
        has.append(part_has)
    dims = {v.shape[1] for v in vectors if v is not None} | ({dim} if dim else set())
    if len(dims) > 1:
        raise ValueError(f"embeddings of different sizes cannot be compared: {sorted(dims)}")
    width = dims.pop() if dims else 0
    blocks = [v if v is not None else np.zeros((len(h), width), np.float32) for v, h in zip(vectors, has, strict=True)]
    return NewClips(rows=np.arange(first, first + len(ids), dtype=np.int64), clip_ids=ids, asset_ids=assets,
                    shards=shards, hashes=np.concatenate([np.zeros((0, 32), np.uint8), *hashes]),
                    owner=np.concatenate([np.zeros(0, np.int64), *owner]),
                    vectors=np.concatenate([np.zeros((0, width), np.float32), *blocks]),
                    has_vector=np.concatenate([np.zeros(0, bool), *has]))


def _merge(state: DedupState, kind: str, links: Sequence[tuple[int, int, float]], stored: Mapping[int, StoredClip],
           new: NewClips) -> GroupChange:
    """The groups of one kind after ``links`` (each with a new clip on one side): the larger of two
    merging groups keeps its root (ties: the smaller root), the other's members are relabelled."""
    root = {r: c.roots[kind] for r, c in stored.items()} | {r: r for r in new.rows.tolist()}
    info = state.groups(kind, {root[r] for r in stored})
    before = sum(1 for size, _ in info.values() if size > 1)
    info |= {r: (1, new.clip_ids[i]) for i, r in enumerate(new.rows.tolist())}
    parent: dict[int, int] = {}

    def find(a: int) -> int:
        while parent.get(a, a) != a:
            a = parent[a]
        return a

    for x, y, _ in links:
        a, b = find(root[x]), find(root[y])
        if a == b:
            continue
        (size_a, first_a), (size_b, first_b) = info[a], info[b]
        keep, gone = (a, b) if (size_a, -a) > (size_b, -b) else (b, a)
        parent[gone] = keep
        info[keep] = (size_a + size_b, min(first_a, first_b))
    root_of = {r: find(g) for r, g in root.items()}
    groups = {g: info[g] for g in set(root_of.values())}
    return GroupChange(root_of=root_of, groups=groups, absorbed={g: find(g) for g in parent},
                       gt1_delta=sum(1 for size, _ in groups.values() if size > 1) - before)


def _evidence(links: Sequence[tuple[int, int, float]], kind: str, stored: Mapping[int, StoredClip],
              new: NewClips) -> dict[int, list]:
    """Each linked clip's best evidence [other clip, value] where the links changed it."""
    ids = {r: c.clip_id for r, c in stored.items()} | dict(zip(new.rows.tolist(), new.clip_ids, strict=True))
    best = {r: c.evidence[kind] for r, c in stored.items()}
    changed: dict[int, list] = {}
    for x, y, value in links:
        for a, b in ((x, y), (y, x)):
            if best.get(a) is None or value > best[a][1]:
                best[a] = changed[a] = [ids[b], round(float(value), 4)]
    return changed


def _relist_if_grown(state: DedupState, vectors: int, trained_on: int, dim: int) -> None:
    """Train the vectors' k-means lists once there are ``FLAT_LIMIT`` of them, and again each time
    they have doubled since (each training reads every vector once: amortised, a constant per clip)."""
    import faiss

    if vectors < FLAT_LIMIT or vectors < 2 * trained_on or not dim:
        return
    rows, stored = state.all_vectors(dim)
    kmeans = faiss.Kmeans(dim, list_count(len(rows)), niter=20, seed=1, spherical=True)
    kmeans.train(np.ascontiguousarray(stored, np.float32))
    lists = _nearest_lists(kmeans.centroids, stored, 1)[:, 0]
    state.relist(kmeans.centroids, lists, rows, stored, len(rows))


def _nearest_lists(centroids: np.ndarray, vectors: np.ndarray, probes: int) -> np.ndarray:
    import faiss

    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, np.float32))
    return index.search(np.ascontiguousarray(vectors, np.float32), min(probes, len(centroids)))[1]

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


def _perceptual_links(state: DedupState, new: NewClips, params: DedupSettings,
                      engine: Any = None) -> list[tuple[int, int, float]]:
    """Links (stored or new clip row, new clip row, share) of the new clips, by pair."""
    tables = lsh_tables(params.max_hamming)
    new.postings = band_keys(new.hashes, np.stack(lsh_plan(tables)))
    if not len(new.hashes):
        return []
    first = int(new.rows[0])
    among_new = _among_new(new.postings, new.owner, engine)
    mine = pd.DataFrame({"key": new.postings.ravel(), "clip": np.repeat(new.owner, tables)}).drop_duplicates()
    theirs = pd.DataFrame(state.posting_pairs(new.postings.ravel()), columns=["key", "row"])
    joined = mine.merge(theirs, on="key")
    with_stored = np.stack([joined["row"].to_numpy(np.int64), joined["clip"].to_numpy(np.int64)], axis=1)
    candidates = np.concatenate([with_stored, among_new])
    if not len(candidates):
        return []
    candidates = np.unique(candidates, axis=0)
    stored = state.clips(np.unique(candidates[:, 0][candidates[:, 0] < first]).tolist(), hashes=True)
    clips, local = np.unique(candidates, return_inverse=True)
    parts = [stored[c].hashes if c < first else new.hashes[new.owner == c] for c in clips.tolist()]
    owner = np.repeat(np.arange(len(clips)), [len(p) for p in parts])
    share = pair_shares(np.concatenate(parts), owner, local.reshape(-1, 2), params.max_hamming, engine)
    linked = share >= params.min_frame_share
    return list(zip(candidates[linked, 0].tolist(), candidates[linked, 1].tolist(), share[linked].tolist(), strict=True))

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
    parts = [found["pairs"] for found in all_or_fail(join, items, engine, "dedup band join",
                                                     label=lambda i: f"stored frames {i[0]}-{i[1]}")]
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
    parts = [found["share"] for found in all_or_fail(check, items, engine, "dedup pair verification",
                                                     label=lambda i: f"{len(i[2])} pairs")]
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
    found = all_or_fail(search, items, engine, "dedup neighbour search", label=lambda i: f"vectors {i[0]}-{i[1]}")
    sims = np.concatenate([f["sims"] for f in found], axis=1)
    hits = np.concatenate([f["hits"] for f in found], axis=1)
    sims = np.where(hits >= 0, sims, -np.inf)
    order = np.lexsort((np.where(hits >= 0, hits, np.iinfo(np.int64).max), -sims), axis=1)[:, :k]
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(hits, order, axis=1)


TABLES_PER_TASK = 16
"""Hash tables one task of the band join among a run's new clips keys."""


class KeyJoin:
    """One task of the band join among new clips: pairs sharing a key of tables ``[lo, hi)`` (the
    engine's compute; picklable)."""

    def __init__(self, keys: np.ndarray, owner: np.ndarray):
        self.keys, self.owner = keys, owner

    def __call__(self, item: tuple[int, int]) -> dict[str, Any]:
        lo, hi = item
        return {"pairs": _equal_key_pairs(np.ascontiguousarray(self.keys[:, lo:hi]).ravel(),
                                          np.repeat(self.owner, hi - lo), 0)}


def _among_new(keys: np.ndarray, owner: np.ndarray, engine: Any = None) -> np.ndarray:
    """Clip pairs among a run's new clips whose frames (``keys``: (frames, tables) ``band_keys``,
    ``owner``: each frame's clip) share a key: tasks of ``TABLES_PER_TASK`` tables on ``engine``
    (None: here), the union the same wherever they ran."""
    items = [(lo, min(lo + TABLES_PER_TASK, keys.shape[1])) for lo in range(0, keys.shape[1], TABLES_PER_TASK)]
    join = KeyJoin(keys, owner)
    parts = [found["pairs"] for found in all_or_fail(join, items, engine, "dedup band join",
                                                     label=lambda i: f"tables {i[0]}-{i[1]}")]
    pairs = np.concatenate([np.zeros((0, 2), np.int64), *parts])
    return np.unique(pairs, axis=0) if len(pairs) else pairs


def _semantic_links(state: DedupState, new: NewClips, params: DedupSettings,
                    engine: Any = None) -> tuple[list[tuple[int, int, float]], np.ndarray | None]:
    """Links (new clip row, its neighbour's row, cosine) of the new clips' vectors, compared with
    the stored vectors of their ``PROBES`` nearest lists (every stored vector while there is one
    list) and with each other; and the list each new vector goes in."""
    if not new.has_vector.any():
        return [], None
    queries = new.vectors[new.has_vector]
    centroids = state.centroids()
    if centroids is None:
        lists, read = np.zeros(len(queries), np.int64), [0]
    else:
        near = _nearest_lists(centroids, queries, PROBES)
        lists, read = near[:, 0], np.unique(near).tolist()
    rows, vectors = state.vectors_in(read, queries.shape[1])
    every_row = np.concatenate([rows, new.rows[new.has_vector]])  # ascending: ties go to the lower row
    every = np.concatenate([vectors, queries])
    asked = np.arange(len(rows), len(every_row))
    k = min(params.semantic_k + 1, len(every_row))
    sims, hits = nearest(every, np.arange(len(every_row)), asked, k, engine)
    a = np.repeat(every_row[asked], k)
    b = np.where(hits.ravel() >= 0, every_row[np.clip(hits.ravel(), 0, None)], -1)
    sim = sims.ravel()
    keep = (b >= 0) & (b != a) & (sim >= params.semantic_min_cosine)
    return list(zip(a[keep].tolist(), b[keep].tolist(), sim[keep].tolist(), strict=True)), lists


def group_rows(state: DedupState, version: RowVersion, shards: set[str] | None = None) -> list[dict[str, Any]]:
    """One row per clip (of ``shards``, else of every drop): its perceptual and semantic group (id =
    smallest member clip_id), size, representative (smallest clip_id; selection decides what to
    keep) and evidence."""
    return [{
        "clip_id": clip_id, "asset_id": asset_id, "source_shard": shard,
        "pdq_group": pdq_group, "pdq_group_size": int(pdq_size), "pdq_evidence": pdq_evidence or "null",
        "semantic_group": sem_group if has_vector else None, "semantic_group_size": int(sem_size) if has_vector else 0,
        "semantic_evidence": sem_evidence or "null",
        "producer_version": version.producer, "input_version": version.inputs, "runs": 1,
    } for clip_id, asset_id, shard, pdq_group, pdq_size, pdq_evidence, has_vector, sem_group, sem_size, sem_evidence
        in state.group_rows(shards)]


def group_counts(state: DedupState) -> dict[str, int]:
    """Perceptual and semantic groups with more than one member, over every clip."""
    meta = state.meta()
    return {"perceptual_groups_gt1": int(meta.get("pdq_gt1", 0)), "semantic_groups_gt1": int(meta.get("sem_gt1", 0))}
