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

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vidassets.curate.embeddings import vector_of
from vidassets.storage.objects import ObjectStore

STATE_KEY = "state/dedup/state.npz"


class UnionFind:
    def __init__(self, parent: np.ndarray | None = None):
        self.parent = list(parent) if parent is not None else []

    def add(self, n: int) -> None:
        self.parent.extend(range(len(self.parent), len(self.parent) + n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


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

    def save(self, objects: ObjectStore) -> None:
        buffer = io.BytesIO()
        meta = {k: getattr(self, k) for k in ("version", "clip_ids", "asset_ids", "shards", "covered", "pdq_parent",
                                               "sem_parent", "pdq_evidence", "sem_evidence")}
        np.savez_compressed(buffer, frame_hashes=self.frame_hashes, frame_clip=self.frame_clip, vectors=self.vectors,
                            has_vector=self.has_vector, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        objects.put_bytes(STATE_KEY, buffer.getvalue())

    @classmethod
    def load(cls, objects: ObjectStore) -> DedupState:
        if not objects.exists(STATE_KEY):
            return cls()
        data = np.load(io.BytesIO(objects.get_bytes(STATE_KEY)))
        meta = json.loads(data["meta"].tobytes())
        return cls(frame_hashes=data["frame_hashes"], frame_clip=data["frame_clip"], vectors=data["vectors"],
                   has_vector=data["has_vector"], **meta)


@dataclass
class DedupParams:
    max_hamming: int = 31
    min_frame_share: float = 0.8
    semantic_k: int = 50
    semantic_min_cosine: float = 0.95


@dataclass
class PartitionFeatures:
    clips: pd.DataFrame  # clip_id, asset_id, source_shard, first_frame, last_frame
    frames: pd.DataFrame  # asset_id, frame_index, pdq_hash
    embeddings: pd.DataFrame  # clip_id, status, vector


def update(state: DedupState, version: str, fingerprints: Mapping[str, str], load: Any,
           params: DedupParams) -> tuple[DedupState, dict[str, int]]:
    """Bring ``state`` up to date with the partitions in ``fingerprints``; ``load(partition)``
    returns its PartitionFeatures. Returns the new state and what was done."""
    stale = state.version != version or any(fingerprints.get(p) != fp for p, fp in state.covered.items())
    if stale:
        state = DedupState(version=version)
    new_parts = sorted(p for p in fingerprints if p not in state.covered)
    first_new = len(state.clip_ids)
    new_hashes, new_frame_clip, new_vectors, new_has = [], [], [], []
    for part in new_parts:
        feats = load(part)
        frames_by_asset = {a: g for a, g in feats.frames.groupby("asset_id")} if len(feats.frames) else {}
        vectors = {r.clip_id: vector_of(r.vector) for r in feats.embeddings.itertuples() if r.status == "ok"}
        for clip in feats.clips.sort_values("clip_id").itertuples():
            index = len(state.clip_ids)
            state.clip_ids.append(clip.clip_id)
            state.asset_ids.append(clip.asset_id)
            state.shards.append(clip.source_shard)
            frames = frames_by_asset.get(clip.asset_id)
            if frames is not None:
                inside = frames[(frames.frame_index >= clip.first_frame) & (frames.frame_index <= clip.last_frame)]
                for h in inside.pdq_hash:
                    new_hashes.append(np.frombuffer(bytes.fromhex(h), np.uint8))
                    new_frame_clip.append(index)
            vec = vectors.get(clip.clip_id)
            new_vectors.append(vec)
            new_has.append(vec is not None)
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
        if new_hashes:
            state.frame_hashes = np.concatenate([state.frame_hashes, np.stack(new_hashes)])
            state.frame_clip = np.concatenate([state.frame_clip, np.asarray(new_frame_clip, np.int64)])
        done["perceptual_links"] = _perceptual_links(state, old_frames, pdq, params)
        done["semantic_links"] = _semantic_links(state, first_new, new_vectors, new_has, sem, params)
    state.pdq_parent, state.sem_parent = pdq.parent, sem.parent
    return state, done


def _perceptual_links(state: DedupState, first_new_frame: int, uf: UnionFind, params: DedupParams) -> int:
    import faiss

    hashes, owner = state.frame_hashes, state.frame_clip
    if first_new_frame >= len(hashes):
        return 0
    index = faiss.IndexBinaryFlat(256)
    index.add(hashes)
    lims, _, found = index.range_search(hashes[first_new_frame:], params.max_hamming + 1)
    frames_per_clip = np.bincount(owner, minlength=len(state.clip_ids))
    matched: dict[tuple[int, int], list[set, set]] = {}
    for q in range(len(hashes) - first_new_frame):
        frame = first_new_frame + q
        a = int(owner[frame])
        for hit in found[lims[q] : lims[q + 1]]:
            b = int(owner[hit])
            if a == b:
                continue
            key = (a, b) if a < b else (b, a)
            sides = matched.setdefault(key, [set(), set()])
            sides[0 if key[0] == a else 1].add(frame)
            sides[1 if key[0] == a else 0].add(int(hit))
    links = 0
    for (a, b), (frames_a, frames_b) in matched.items():
        share = (len(frames_a) + len(frames_b)) / (frames_per_clip[a] + frames_per_clip[b])
        if share >= params.min_frame_share:
            uf.union(a, b)
            links += 1
            for x, y in ((a, b), (b, a)):
                best = state.pdq_evidence.get(state.clip_ids[x])
                if best is None or share > best[1]:
                    state.pdq_evidence[state.clip_ids[x]] = [state.clip_ids[y], round(share, 4)]
    return links


def _semantic_links(state: DedupState, first_new: int, new_vectors: Sequence[np.ndarray | None], new_has: Sequence[bool],
                    uf: UnionFind, params: DedupParams) -> int:
    import faiss

    dims = {v.shape[0] for v in new_vectors if v is not None}
    dim = dims.pop() if dims else (state.vectors.shape[1] if state.vectors.size else 0)
    filled = np.stack([v if v is not None else np.zeros(dim, np.float32) for v in new_vectors]) if dim else np.zeros((len(new_vectors), 0), np.float32)
    state.vectors = filled if not state.vectors.size else np.concatenate([state.vectors, filled])
    state.has_vector = np.concatenate([state.has_vector, np.asarray(new_has, bool)])
    if not dim or not state.has_vector[first_new:].any():
        return 0
    ids = np.flatnonzero(state.has_vector)
    index = faiss.IndexFlatIP(dim)
    index.add(np.ascontiguousarray(state.vectors[ids], dtype=np.float32))
    queries = np.flatnonzero(state.has_vector[first_new:]) + first_new
    k = min(params.semantic_k + 1, len(ids))
    sims, hits = index.search(np.ascontiguousarray(state.vectors[queries], dtype=np.float32), k)
    links = 0
    for row, a in enumerate(queries):
        for sim, hit in zip(sims[row], hits[row], strict=True):
            b = int(ids[hit]) if hit >= 0 else -1
            if b < 0 or b == a or sim < params.semantic_min_cosine:
                continue
            uf.union(int(a), b)
            links += 1
            for x, y in ((int(a), b), (b, int(a))):
                best = state.sem_evidence.get(state.clip_ids[x])
                if best is None or sim > best[1]:
                    state.sem_evidence[state.clip_ids[x]] = [state.clip_ids[y], round(float(sim), 4)]
    return links


def group_rows(state: DedupState, version: str) -> list[dict[str, Any]]:
    """One row per clip: its perceptual and semantic group (id = smallest member clip_id), size,
    representative (smallest clip_id; selection decides what to keep) and evidence."""
    rows = []
    pdq, sem = UnionFind(state.pdq_parent), UnionFind(state.sem_parent)
    pdq_members: dict[int, list[int]] = {}
    sem_members: dict[int, list[int]] = {}
    for i in range(len(state.clip_ids)):
        pdq_members.setdefault(pdq.find(i), []).append(i)
        sem_members.setdefault(sem.find(i), []).append(i)
    pdq_group = {m: min(state.clip_ids[j] for j in ms) for ms in pdq_members.values() for m in ms}
    sem_group = {m: min(state.clip_ids[j] for j in ms) for ms in sem_members.values() for m in ms}
    for i, clip_id in enumerate(state.clip_ids):
        rows.append({
            "clip_id": clip_id, "asset_id": state.asset_ids[i], "source_shard": state.shards[i],
            "pdq_group": pdq_group[i], "pdq_group_size": len(pdq_members[pdq.find(i)]),
            "pdq_evidence": json.dumps(state.pdq_evidence.get(clip_id)),
            "semantic_group": sem_group[i] if state.has_vector[i] else None,
            "semantic_group_size": len(sem_members[sem.find(i)]) if state.has_vector[i] else 0,
            "semantic_evidence": json.dumps(state.sem_evidence.get(clip_id)),
            "producer_version": version,
        })
    return rows
