"""Decontamination: match every train clip against eval-vault material, perceptually (PDQ of
sampled frames) and semantically (embeddings). Matched clips are recorded and excluded from
selection; a blocking asset check fails if any selected clip matches eval material.

Eval features (probe, analysis, context frames, embeddings of eval videos) live only in the eval
vault; this module reads them next to train-side features and writes only the match table.

Incremental: the state (each covered train clip's frame hashes and embedding, the covered eval
material, and each clip's best match so far) is stored beside the tables. A new train drop's clips
are matched against all eval material; new eval material is matched against every covered train
clip and can only add matches (the best match per clip is a maximum over eval assets, so it merges
exactly). A rebuilt or removed drop on either side, or new parameters, start again from the tables.
Every path is the same code, so an update gives the rows a run from scratch gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import DecontaminationSettings
from vidassets.runtime.engine import all_or_fail
from vidassets.storage.blobs import vector_of
from vidassets.storage.input_versions import told_every_change
from vidassets.storage.npz import ChunkSeries, load_npz, put_npz
from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import RowVersion

VERSION = "decontamination-v2"
EVAL_FEATURES_VERSION = "eval-features-v2"  # v2: one embedding per eval segment, not per video
STATE_PREFIX = "state/decontamination"
STATE_KEY = f"{STATE_PREFIX}/state.npz"  # decontamination-v2 and before kept the whole state in this one file
META_KEY = f"{STATE_PREFIX}/meta.npz"
_CLIP_IDS = ("clip_id", "asset_id", "source_shard", "frames")
_MATCH_ARRAYS = {"hits": np.int64, "cosine": np.float64, "perceptual": np.int64, "semantic": np.int64, "frames": np.int64}
"""Per stored clip, its best matches so far (indices into the meta's ``match_assets``) and frames."""
EVAL_TABLES = ("eval_context_frames", "eval_embeddings")
"""The vault tables decontamination matches against (per eval drop)."""


def scan_coverage(objects: ObjectStore, clip_ids: set[str], current_eval: Mapping[str, str]) -> dict[str, Any]:
    """How much of ``clip_ids`` (the training-ready clips) was checked against the eval vault as it
    is now (``current_eval``: eval drop -> fingerprint of its vault tables): a release-gate figure.
    A clip counts when the stored state covers it and the state's eval material is the vault's
    current material; eval drops added or rebuilt since the last decontamination are listed."""
    stored = load_npz(objects, META_KEY)
    if stored is None:
        return {"clips": len(clip_ids), "checked": 0, "coverage": 0.0 if clip_ids else 1.0,
                "eval_drops_not_scanned": sorted(current_eval)}
    meta = stored[0]
    covered = {c for key in meta["chunks"] for c in load_npz(objects, key)[0]["clip_id"]}
    stale = sorted(p for p, fp in current_eval.items() if meta["eval"].get(p) != fp)
    checked = len(clip_ids & covered) if not stale else 0
    return {"clips": len(clip_ids), "checked": checked,
            "coverage": round(checked / len(clip_ids), 4) if clip_ids else 1.0, "eval_drops_not_scanned": stale}


@dataclass
class TrainPart:
    """One drop's train side: clips (clip_id, asset_id, source_shard, first_frame, last_frame), the
    context frames of their assets (asset_id, frame_index, pdq_hash) and clip embeddings."""

    clips: pd.DataFrame
    frames: pd.DataFrame
    embeddings: pd.DataFrame


@dataclass
class EvalPart:
    """One drop's eval material: context frames (asset_id, pdq_hash) and segment embeddings
    (asset_id, status, vector; several per video)."""

    frames: pd.DataFrame
    embeddings: pd.DataFrame


def _hashes(hex_hashes) -> np.ndarray:
    return np.stack([np.frombuffer(bytes.fromhex(h), np.uint8) for h in hex_hashes]) if len(hex_hashes) \
        else np.zeros((0, 32), np.uint8)


@dataclass
class DecontaminationState:
    version: str = ""
    train: dict[str, str] = field(default_factory=dict)  # drop -> fingerprint of its tables
    eval: dict[str, str] = field(default_factory=dict)
    clips: list[dict[str, Any]] = field(default_factory=list)
    """Per covered clip: clip_id, asset_id, source_shard, frames, best perceptual (hits, asset), best
    semantic (cosine, asset)."""
    frame_hashes: np.ndarray = field(default_factory=lambda: np.zeros((0, 32), np.uint8))
    frame_clip: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    vector_clip: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    eval_hashes: np.ndarray = field(default_factory=lambda: np.zeros((0, 32), np.uint8))
    eval_hash_owner: list[str] = field(default_factory=list)
    eval_vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    eval_vector_owner: list[str] = field(default_factory=list)
    eval_parts: dict[str, list[str]] = field(default_factory=dict)  # eval drop -> its asset ids
    changed_shards: set[str] | None = None
    """Not stored: the train drops whose rows the last ``update`` may have changed (None: all, a
    state built from scratch)."""

    stored_clips: int | None = None
    """Not stored: how many clips (from the front) the store already holds in chunks (None: none)."""

    base: int = 0
    """Not stored: clips held in the store but not loaded (a state loaded ``lazy``): ``clips`` and
    the train features hold the clips from index ``base`` on; the stored ones are read only when a
    run needs them (new eval material, a rebuilt drop, every row, a merge of the chunks)."""
    _stored: dict[str, Any] | None = None
    """Not stored: a lazy state's store, meta and per-clip best-match arrays of the stored clips."""

    @property
    def size(self) -> int:
        """Clips covered, stored and in memory."""
        return self.base + len(self.clips)

    def save(self, objects: ObjectStore) -> None:
        """Append the clips added since the last save as one chunk (ids, frame hashes, vectors), then
        the mutable part (each clip's best match so far, the eval material, coverage) as arrays: a
        run writes its new clips and a few numbers per clip. A state built from scratch, one whose
        drops were removed, or one past ``npz.MAX_CHUNKS`` chunks is written as one chunk."""
        series = ChunkSeries(objects, STATE_PREFIX)
        chunks, start = series.kept(META_KEY, self.stored_clips)
        if start < self.base:  # the chunks are merged into one: every clip is written
            self.load_stored()
        if start < self.size or not chunks:
            frames, vecs, key = self.frame_clip >= start, self.vector_clip >= start, series.next_key()
            put_npz(objects, key, {k: [c[k] for c in self.clips[start - self.base:]] for k in _CLIP_IDS},
                    frame_hashes=self.frame_hashes[frames], frame_clip=self.frame_clip[frames],
                    vectors=self.vectors[vecs] if len(self.vectors) else self.vectors, vector_clip=self.vector_clip[vecs])
            chunks.append(key)
        stored = self._stored["arrays"] if self.base else {k: np.zeros(0, t) for k, t in _MATCH_ARRAYS.items()}
        stored_assets = self._stored["assets"] if self.base else []
        assets = sorted(({c[k] for c in self.clips for k in ("perceptual_asset", "semantic_asset")}
                         | {stored_assets[i] for k in ("perceptual", "semantic") for i in set(stored[k].tolist()) if i >= 0})
                        - {None})
        at = {a: i for i, a in enumerate(assets)}
        remap = np.array([at[a] for a in stored_assets] + [-1], np.int64)  # index -1 stays -1
        meta = {k: getattr(self, k) for k in ("version", "train", "eval", "eval_hash_owner", "eval_vector_owner",
                                               "eval_parts")}
        put_npz(objects, META_KEY, {**meta, "chunks": chunks, "match_assets": assets},
                eval_hashes=self.eval_hashes, eval_vectors=self.eval_vectors,
                hits=np.concatenate([stored["hits"], np.array([c["hits"] for c in self.clips], np.int64)]),
                cosine=np.concatenate([stored["cosine"], np.array([c["cosine"] for c in self.clips], np.float64)]),
                perceptual=np.concatenate([remap[stored["perceptual"]],
                                           np.array([at.get(c["perceptual_asset"], -1) for c in self.clips], np.int64)]),
                semantic=np.concatenate([remap[stored["semantic"]],
                                         np.array([at.get(c["semantic_asset"], -1) for c in self.clips], np.int64)]),
                frames=np.concatenate([stored["frames"], np.array([c["frames"] for c in self.clips], np.int64)]))
        series.prune(chunks)
        objects.delete(STATE_KEY)  # the single-file state of decontamination-v2 and before
        self.stored_clips = self.size

    @classmethod
    def load(cls, objects: ObjectStore, version: str, lazy: bool = False) -> DecontaminationState:
        """The stored state (empty when none, or made by another version). ``lazy``: the eval side,
        the coverage and the stored clips' best matches (arrays) only; the clips and their features
        are read when a run needs them (``load_stored``)."""
        stored = load_npz(objects, META_KEY)
        if stored is None or stored[0]["version"] != version:
            return cls()
        meta, arrays = stored
        if lazy and "frames" in arrays:
            match = {k: arrays[k] for k in _MATCH_ARRAYS}
            state = cls(changed_shards=set(), eval_hashes=arrays["eval_hashes"], eval_vectors=arrays["eval_vectors"],
                        **{k: v for k, v in meta.items() if k not in ("chunks", "match_assets")})
            state.base = state.stored_clips = len(match["hits"])
            state._stored = {"objects": objects, "arrays": match, "assets": meta["match_assets"]}
            return state
        parts = [load_npz(objects, key) for key in meta.pop("chunks")]
        assets = meta.pop("match_assets")
        clips = [dict(zip(_CLIP_IDS, values, strict=True)) for info, _ in parts
                 for values in zip(*(info[k] for k in _CLIP_IDS), strict=True)]
        for c, hits, cosine, p, s in zip(clips, arrays["hits"].tolist(), arrays["cosine"].tolist(),
                                         arrays["perceptual"].tolist(), arrays["semantic"].tolist(), strict=True):
            c.update(hits=hits, cosine=cosine, perceptual_asset=assets[p] if p >= 0 else None,
                     semantic_asset=assets[s] if s >= 0 else None)
        vectors = [p["vectors"] for _, p in parts if p["vectors"].ndim == 2 and len(p["vectors"])]
        state = cls(clips=clips, changed_shards=set(), eval_hashes=arrays["eval_hashes"], eval_vectors=arrays["eval_vectors"],
                    frame_hashes=np.concatenate([np.zeros((0, 32), np.uint8), *(p["frame_hashes"] for _, p in parts)]),
                    frame_clip=np.concatenate([np.zeros(0, np.int64), *(p["frame_clip"] for _, p in parts)]),
                    vectors=np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32),
                    vector_clip=np.concatenate([np.zeros(0, np.int64), *(p["vector_clip"] for _, p in parts)]), **meta)
        state.stored_clips = len(clips)
        return state

    def load_stored(self) -> None:
        """Read the stored clips and their features into a lazy state, before what it added since."""
        if not self.base:
            return
        whole = DecontaminationState.load(self._stored["objects"], self.version)
        if len(whole.clips) == self.size:  # saved since it was loaded: the store holds every clip now
            self.clips, self.frame_hashes, self.frame_clip = whole.clips, whole.frame_hashes, whole.frame_clip
            self.vectors, self.vector_clip = whole.vectors, whole.vector_clip
            self.base, self._stored = 0, None
            return
        if len(whole.clips) != self.base:
            raise RuntimeError(f"decontamination state: {len(whole.clips)} stored clips, {self.base} expected")
        self.clips = whole.clips + self.clips
        self.frame_hashes = np.concatenate([whole.frame_hashes, self.frame_hashes])
        self.frame_clip = np.concatenate([whole.frame_clip, self.frame_clip])
        if len(whole.vectors) and len(self.vectors):
            self.vectors = np.concatenate([whole.vectors, self.vectors])
        elif len(whole.vectors):
            self.vectors = whole.vectors
        self.vector_clip = np.concatenate([whole.vector_clip, self.vector_clip])
        self.base, self._stored = 0, None

    # -- the train side -----------------------------------------------------------------------------
    def drop_train(self, parts: set[str]) -> None:
        if not parts:
            return
        self.load_stored()
        keep = [i for i, c in enumerate(self.clips) if c["source_shard"] not in parts]
        renumber = np.full(len(self.clips), -1, np.int64)
        renumber[keep] = np.arange(len(keep))
        if len(keep) < len(self.clips):
            self.stored_clips = None  # renumbered: the stored chunks no longer line up
        self.clips = [self.clips[i] for i in keep]
        frames = renumber[self.frame_clip] >= 0 if len(self.frame_clip) else np.zeros(0, bool)
        self.frame_hashes, self.frame_clip = self.frame_hashes[frames], renumber[self.frame_clip[frames]]
        vecs = renumber[self.vector_clip] >= 0 if len(self.vector_clip) else np.zeros(0, bool)
        self.vectors, self.vector_clip = self.vectors[vecs], renumber[self.vector_clip[vecs]]
        for part in parts:
            self.train.pop(part, None)
        self._changed(parts)

    def _changed(self, shards) -> None:
        if self.changed_shards is not None:
            self.changed_shards.update(shards)

    def add_train(self, part: str, fingerprint: str, feats: TrainPart) -> tuple[int, int]:
        """Append a drop's clips; returns the range of their indices."""
        first = self.size
        frames_by_asset = {a: g for a, g in feats.frames.groupby("asset_id")} if len(feats.frames) else {}
        vectors = {r.clip_id: vector_of(r.vector) for r in feats.embeddings.itertuples() if r.status == "ok"} \
            if len(feats.embeddings) else {}
        hashes, owners, vecs, vec_owner = [], [], [], []
        for clip in feats.clips.sort_values("clip_id").itertuples():
            index = self.size
            frames = frames_by_asset.get(clip.asset_id)
            own = [] if frames is None else list(
                frames[(frames.frame_index >= clip.first_frame) & (frames.frame_index <= clip.last_frame)].pdq_hash)
            hashes.append(_hashes(own))
            owners.append(np.full(len(own), index, np.int64))
            if clip.clip_id in vectors:
                vecs.append(vectors[clip.clip_id])
                vec_owner.append(index)
            self.clips.append({"clip_id": clip.clip_id, "asset_id": clip.asset_id, "source_shard": clip.source_shard,
                               "frames": len(own), "hits": 0, "perceptual_asset": None, "cosine": 0.0,
                               "semantic_asset": None})
        self.frame_hashes = np.concatenate([self.frame_hashes, *hashes])
        self.frame_clip = np.concatenate([self.frame_clip, *owners])
        if vecs:
            block = np.stack(vecs).astype(np.float32)
            self.vectors = block if not len(self.vectors) else np.concatenate([self.vectors, block])
            self.vector_clip = np.concatenate([self.vector_clip, np.array(vec_owner, np.int64)])
        self.train[part] = fingerprint
        self._changed([part])
        return first, self.size

    # -- the eval side ------------------------------------------------------------------------------
    def add_eval(self, part: str, fingerprint: str, feats: EvalPart) -> tuple[int, int, int, int]:
        """Append a drop's eval material; returns the ranges of its hashes and vectors."""
        h0, v0 = len(self.eval_hashes), len(self.eval_vector_owner)
        if len(feats.frames):
            self.eval_hashes = np.concatenate([self.eval_hashes, _hashes(list(feats.frames.pdq_hash))])
            self.eval_hash_owner += list(feats.frames.asset_id)
        ok = feats.embeddings[feats.embeddings.status == "ok"] if len(feats.embeddings) else feats.embeddings
        if len(ok):
            block = np.stack([vector_of(v) for v in ok.vector]).astype(np.float32)
            self.eval_vectors = block if not len(self.eval_vectors) else np.concatenate([self.eval_vectors, block])
            self.eval_vector_owner += list(ok.asset_id)
        self.eval[part] = fingerprint
        self.eval_parts[part] = sorted(set(self.eval_hash_owner[h0:]) | set(self.eval_vector_owner[v0:]))
        return h0, len(self.eval_hashes), v0, len(self.eval_vector_owner)

    # -- matching -----------------------------------------------------------------------------------
    def match(self, clips: range, hashes: range, vectors: range, params: DecontaminationSettings,
              engine: Any = None) -> None:
        """Merge into each clip of ``clips`` its best matches among the eval hashes and vectors in
        the given ranges (a maximum over eval assets: merging a new range is exact). The matching
        runs as tasks of at most ``EVAL_SLICE`` eval hashes (whole eval assets each) or vectors on
        ``engine`` (None: here, in order); the maxima are the same wherever they ran."""
        if not len(clips) or not (len(hashes) or len(vectors)):
            return
        if clips.start < self.base:
            self.load_stored()
        in_clips = (self.frame_clip >= clips.start) & (self.frame_clip < clips.stop)
        in_vecs = (self.vector_clip >= clips.start) & (self.vector_clip < clips.stop)
        task = EvalMatch(self.frame_hashes[in_clips], self.frame_clip[in_clips], self.vectors[in_vecs],
                         self.vector_clip[in_vecs], params.max_hamming)
        items: list[tuple] = []
        if len(hashes) and in_clips.any():
            owners = self.eval_hash_owner[hashes.start:hashes.stop]
            for lo, hi in _owner_slices(owners, EVAL_SLICE):
                items.append(("hashes", self.eval_hashes[hashes.start + lo:hashes.start + hi], owners[lo:hi]))
        if len(vectors) and in_vecs.any():
            for lo in range(vectors.start, vectors.stop, EVAL_SLICE):
                hi = min(lo + EVAL_SLICE, vectors.stop)
                items.append(("vectors", self.eval_vectors[lo:hi], self.eval_vector_owner[lo:hi]))
        found = all_or_fail(task, items, engine, "decontamination matching", label=lambda i: f"{len(i[2])} eval {i[0]}")
        for result in found:
            key, asset = ("hits", "perceptual_asset") if result["kind"] == "hashes" else ("cosine", "semantic_asset")
            for clip, value, owner in zip(result["clip"], result["value"], result["owner"], strict=True):
                row = self.clips[clip - self.base]
                if (value, owner) > (row[key], row[asset] or ""):
                    row[key], row[asset] = value, owner
                    self._changed([row["source_shard"]])

    def rows(self, params: DecontaminationSettings, version: RowVersion,
             shards: set[str] | None = None) -> list[dict[str, Any]]:
        """One row per covered clip (of ``shards``, else of every drop)."""
        if self.base and (shards is None or not shards <= self._shards_in_memory()):
            self.load_stored()
        rows = []
        for c in sorted(self.clips, key=lambda c: c["clip_id"]):
            if shards is not None and c["source_shard"] not in shards:
                continue
            share, perceptual, semantic = _verdict(c, params)
            rows.append({
                "clip_id": c["clip_id"], "asset_id": c["asset_id"], "source_shard": c["source_shard"],
                "contaminated": bool(perceptual or semantic),
                "method": "+".join(m for m, hit in (("perceptual", perceptual), ("semantic", semantic)) if hit) or None,
                "perceptual_share": round(share, 4), "perceptual_eval_asset": c["perceptual_asset"],
                "cosine": round(c["cosine"], 4), "semantic_eval_asset": c["semantic_asset"],
                "producer_version": version.producer, "input_version": version.inputs, "runs": 1,
            })
        return rows

    def _shards_in_memory(self) -> set[str]:
        """Drops all of whose clips are in memory: those added since a lazy load (new drops)."""
        return {c["source_shard"] for c in self.clips}

    def contaminated(self, params: DecontaminationSettings) -> int:
        """Covered clips matching eval material, over every drop (a lazy state counts its stored
        clips from their best-match arrays)."""
        a = self._stored["arrays"] if self.base else {k: np.zeros(0, t) for k, t in _MATCH_ARRAYS.items()}
        _, perceptual, semantic = _verdicts(
            np.concatenate([a["hits"], np.array([c["hits"] for c in self.clips], np.int64)]),
            np.concatenate([a["frames"], np.array([c["frames"] for c in self.clips], np.int64)]),
            np.concatenate([a["cosine"], np.array([c["cosine"] for c in self.clips], np.float64)]),
            np.concatenate([a["semantic"] >= 0, np.array([c["semantic_asset"] is not None for c in self.clips], bool)]),
            params)
        return int((perceptual | semantic).sum())


def _verdicts(hits: np.ndarray, frames: np.ndarray, cosine: np.ndarray, has_semantic: np.ndarray,
              params: DecontaminationSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per clip: (share of its frames with an eval match, perceptual match, semantic match)."""
    share = np.where(frames > 0, hits / np.maximum(frames, 1), 0.0)
    return share, (share >= params.min_frame_share) & (hits > 0), has_semantic & (cosine >= params.min_cosine)


def _verdict(clip: dict[str, Any], params: DecontaminationSettings) -> tuple[float, bool, bool]:
    """``_verdicts`` of one clip record."""
    share, perceptual, semantic = _verdicts(np.array([clip["hits"]]), np.array([clip["frames"]]),
                                            np.array([clip["cosine"]], np.float64),
                                            np.array([clip["semantic_asset"] is not None]), params)
    return float(share[0]), bool(perceptual[0]), bool(semantic[0])


EVAL_SLICE = 1_000_000
"""Eval hashes (whole eval assets) or eval vectors one matching task reads."""


class EvalMatch:
    """One task of the matching (the engine's compute; picklable): for the train clips' frames and
    vectors it holds, their best match in one slice of the eval material: per (clip, eval asset) the
    frames within ``max_hamming`` of one of the asset's hashes, or per clip the best cosine."""

    def __init__(self, queries: np.ndarray, query_clip: np.ndarray, vectors: np.ndarray, vector_clip: np.ndarray,
                 max_hamming: int):
        self.queries, self.query_clip, self.vectors, self.vector_clip = queries, query_clip, vectors, vector_clip
        self.max_hamming = max_hamming

    def __call__(self, item: tuple[str, np.ndarray, list[str]]) -> dict[str, Any]:
        kind, material, owners = item
        if kind == "hashes":
            import faiss

            index = faiss.IndexBinaryFlat(256)
            index.add(np.ascontiguousarray(material))
            lims, _, found = index.range_search(np.ascontiguousarray(self.queries), self.max_hamming + 1)
            hits: dict[tuple[int, str], int] = {}
            for q in range(len(self.queries)):
                for owner in {owners[i] for i in found[lims[q]:lims[q + 1]]}:
                    key = (int(self.query_clip[q]), owner)
                    hits[key] = hits.get(key, 0) + 1
            return {"kind": kind, "clip": [c for c, _ in hits], "value": list(hits.values()),
                    "owner": [o for _, o in hits]}
        sims = np.round(self.vectors.astype(np.float64) @ material.astype(np.float64).T, 7)  # float64, rounded
        best = [max(zip(row.tolist(), owners, strict=True)) for row in sims]  # the same number whatever the batch
        return {"kind": kind, "clip": self.vector_clip.tolist(), "value": [v for v, _ in best],
                "owner": [o for _, o in best]}


def _owner_slices(owners: Sequence[str], size: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of at most about ``size`` entries that no owner spans (an asset's hit count
    is taken within one task)."""
    last = {owner: i for i, owner in enumerate(owners)}
    out, start, reach = [], 0, -1
    for i, owner in enumerate(owners):
        if i > start and i - start >= size and reach < i:
            out.append((start, i))
            start = i
        reach = max(reach, last[owner])
    if start < len(owners):
        out.append((start, len(owners)))
    return out


def update(state: DecontaminationState, version: str, train: Mapping[str, str], evals: Mapping[str, str],
           load_train: Callable[[str], TrainPart], load_eval: Callable[[str], EvalPart],
           params: DecontaminationSettings, engine: Any = None,
           changed: Iterable[str] | None = None) -> tuple[DecontaminationState, dict[str, int]]:
    """Bring ``state`` up to date with the train and eval drops (drop -> fingerprint of its tables);
    the matching runs on ``engine`` (None: here). ``changed``: the train drops whose fingerprint may
    differ from the last run's (None: unknown), so only those are compared; when the covered count
    does not add up (a change not named) every covered drop is."""
    eval_gone = any(evals.get(p) != fp for p, fp in state.eval.items())
    new_eval = sorted(p for p in evals if p not in state.eval)
    if state.version != version or eval_gone:
        state = DecontaminationState(version=version)  # built from scratch: every row is new
        new_eval = sorted(evals)
    else:
        state.changed_shards = set()
    asked = set(changed) if changed is not None else None
    if asked is not None and not told_every_change(len(state.train), asked, state.train, train, len(train)):
        asked = None
    stale_train = {p for p, fp in state.train.items() if train.get(p) != fp} if asked is None \
        else {p for p in asked & state.train.keys() if train.get(p) != state.train[p]}
    state.drop_train(stale_train)
    new_train = sorted(p for p in (train if asked is None else asked) if p in train and p not in state.train)
    # new eval material against every clip already covered (new assets only: an asset seen before
    # would need its old counts, so that case starts again)
    old_assets = {a for owners in state.eval_parts.values() for a in owners}
    covered = state.size
    h0, v0 = len(state.eval_hashes), len(state.eval_vector_owner)
    for part in new_eval:
        state.add_eval(part, evals[part], load_eval(part))
    if old_assets & (set(state.eval_hash_owner[h0:]) | set(state.eval_vector_owner[v0:])):
        return update(DecontaminationState(), version, train, evals, load_train, load_eval, params, engine)
    state.match(range(0, covered), range(h0, len(state.eval_hashes)), range(v0, len(state.eval_vector_owner)), params,
                engine)
    # new train clips against all eval material
    first = state.size
    for part in new_train:
        state.add_train(part, train[part], load_train(part))
    state.match(range(first, state.size), range(0, len(state.eval_hashes)),
                range(0, len(state.eval_vector_owner)), params, engine)
    return state, {"new_train_drops": len(new_train), "rebuilt_train_drops": sum(p in train for p in stale_train),
                   "new_eval_drops": len(new_eval), "new_clips": state.size - first,
                   "clips_matched_against_new_eval": covered if new_eval else 0}
