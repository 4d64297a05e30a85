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
from vidassets.storage.partition_map import PartitionMap
from vidassets.storage.rows import RowVersion

VERSION = "decontamination-v2"
EVAL_FEATURES_VERSION = "eval-features-v2"  # v2: one embedding per eval segment, not per video
STATE_PREFIX = "state/decontamination"
LAYOUT = 3
"""The stored state's layout. 3: the covered drops in a ``PartitionMap`` whose summary lists the
chunks, each chunk holding its clips' best matches; before: the best matches of every clip and the
drop list in one object rewritten each run (a state in an older layout is rebuilt from the tables)."""
DROPS_PREFIX = f"{STATE_PREFIX}/drops"
EVAL_DROPS_PREFIX = f"{STATE_PREFIX}/eval_drops"
EVAL_PREFIX = f"{STATE_PREFIX}/eval"
OLD_KEYS = (f"{STATE_PREFIX}/state.npz", f"{STATE_PREFIX}/meta.npz")
"""The objects of layouts before 3, deleted by the first save in layout 3."""
MERGE_FANOUT = 4
"""Chunks of one level merged into one of the next level: a clip is rewritten about
log_MERGE_FANOUT(runs) times in all, and (MERGE_FANOUT - 1) chunks per level are kept at most."""
WHOLE_LEVEL = 64
"""The level of a chunk holding every clip (a state written whole): never merged with the small
chunks after it."""
_CLIP_IDS = ("clip_id", "asset_id", "source_shard", "frames")
EVAL_TABLES = ("eval_context_frames", "eval_embeddings")
"""The vault tables decontamination matches against (per eval drop)."""


def _stored_meta(objects: ObjectStore) -> dict[str, Any]:
    """The summary of the stored state (empty when there is none in the current layout, or when a
    save stopped between its two maps: the eval drops are not the ones the summary was written with,
    as ``DecontaminationState.load`` finds)."""
    meta = PartitionMap(objects, DROPS_PREFIX).meta
    if meta.get("layout") != LAYOUT or PartitionMap(objects, EVAL_DROPS_PREFIX).meta.get("seq") != meta["eval_drops_seq"]:
        return {}
    return meta


def scan_coverage(objects: ObjectStore, clip_ids: set[str], current_eval: Mapping[str, str]) -> dict[str, Any]:
    """How much of ``clip_ids`` (the training-ready clips) was checked against the eval vault as it
    is now (``current_eval``: eval drop -> fingerprint of its vault tables): a release-gate figure.
    A clip counts when the stored state covers it and the state's eval material is the vault's
    current material; eval drops added or rebuilt since the last decontamination are listed."""
    meta = _stored_meta(objects)
    if not meta:
        return {"clips": len(clip_ids), "checked": 0, "coverage": 0.0 if clip_ids else 1.0,
                "eval_drops_not_scanned": sorted(current_eval)}
    scanned = dict(CoveredDrops(PartitionMap(objects, EVAL_DROPS_PREFIX)).items())
    covered = set()
    for chunk in meta["chunks"]:
        info, arrays = load_npz(objects, chunk["key"])
        covered |= {c for c, gone in zip(info["clip_id"], _gone_flags(info, arrays).tolist(), strict=True) if not gone}
    stale = sorted(p for p, fp in current_eval.items() if scanned.get(p) != fp)
    checked = len(clip_ids & covered) if not stale else 0
    return {"clips": len(clip_ids), "checked": checked,
            "coverage": round(checked / len(clip_ids), 4) if clip_ids else 1.0, "eval_drops_not_scanned": stale}


Covered = str | dict[str, Any]
"""A covered drop's stored value: the fingerprint of its tables, and for a train drop the range of
its clips' indices (``{"fp": ..., "clips": [lo, hi]}``; a drop covered before ranges were kept: the
fingerprint alone)."""


def _fingerprint(value: Covered | None) -> str | None:
    return value["fp"] if isinstance(value, dict) else value


class CoveredDrops:
    """Drop -> fingerprint of its tables, for the drops the state covers (train drops with the range
    of their clips): read by bucket from the stored map (a run looks up the drops it was told
    changed, not every drop), the changes since kept until the state is saved. Without a stored
    map: every value is in ``changes``."""

    def __init__(self, stored: PartitionMap | None = None):
        self.stored = stored if stored is not None and stored.found else None
        self.changes: dict[str, Covered | None] = {}
        self._count = self.stored.count if self.stored is not None else 0

    def __len__(self) -> int:
        return self._count

    def _value(self, drop: str) -> Covered | None:
        if drop in self.changes:
            return self.changes[drop]
        return None if self.stored is None else self.stored.get([drop]).get(drop)

    def get(self, drop: str) -> str | None:
        return _fingerprint(self._value(drop))

    def clip_range(self, drop: str) -> tuple[int, int] | None:
        """The indices [lo, hi) of a covered train drop's clips (None: not covered, or covered
        before ranges were kept)."""
        value = self._value(drop)
        return (int(value["clips"][0]), int(value["clips"][1])) if isinstance(value, dict) else None

    def cover(self, drop: str, fingerprint: str, lo: int, hi: int) -> None:
        """A train drop covered with its clips at indices [lo, hi)."""
        self._count += drop not in self
        self.changes[drop] = {"fp": fingerprint, "clips": [lo, hi]}

    def __contains__(self, drop: object) -> bool:
        return isinstance(drop, str) and self.get(drop) is not None

    def __getitem__(self, drop: str) -> str:
        if (value := self.get(drop)) is None:
            raise KeyError(drop)
        return value

    def __setitem__(self, drop: str, fingerprint: str) -> None:
        self._count += drop not in self
        self.changes[drop] = fingerprint

    def pop(self, drop: str) -> None:
        self._count -= drop in self
        self.changes[drop] = None

    def values(self) -> dict[str, Covered]:
        """Every covered drop's stored value (reads every bucket of the stored map)."""
        every = dict(self.stored.every()) if self.stored is not None else {}
        for drop, value in self.changes.items():
            if value is None:
                every.pop(drop, None)
            else:
                every[drop] = value
        return every

    def items(self) -> list[tuple[str, str]]:
        """Every covered drop and its fingerprint (reads every bucket of the stored map)."""
        return sorted((drop, str(_fingerprint(value))) for drop, value in self.values().items())


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


def _gone_flags(info: Mapping[str, Any], arrays: Any) -> np.ndarray:
    """A chunk's taken-out flags per clip (a chunk written before clips were taken out: none)."""
    return np.asarray(arrays["gone"], bool) if "gone" in arrays else np.zeros(len(info["clip_id"]), bool)


def _hashes(hex_hashes) -> np.ndarray:
    return np.stack([np.frombuffer(bytes.fromhex(h), np.uint8) for h in hex_hashes]) if len(hex_hashes) \
        else np.zeros((0, 32), np.uint8)


def _count_params(params: DecontaminationSettings) -> list[float]:
    """The settings a stored count of contaminated clips was made with."""
    return [params.min_frame_share, params.min_cosine]


@dataclass
class DecontaminationState:
    """The covered train clips (their frame hashes, embeddings and best matches so far) and the eval
    material they were matched against.

    Stored (layout ``LAYOUT``) as chunks of clips, each the clips one or more runs added with their
    features and best matches (``<STATE_PREFIX>/chunks/<seq>.npz``), the eval material as one object
    (``<EVAL_PREFIX>/<seq>.npz``, rewritten when material is added), the eval drops matched in a
    ``PartitionMap`` (``EVAL_DROPS_PREFIX``), and the covered train drops in a ``PartitionMap``
    (``DROPS_PREFIX``) whose summary lists the chunks (their first clip, size, level and count of
    contaminated clips), the eval object and the eval drops' write: the summary and the train drops
    are written together, after everything they name, so a save stopped half-way leaves the last
    state whole or, between the two maps, no state (rebuilt from the tables), and stray objects the
    next save deletes. A run adding a drop writes one chunk of its clips, merges the last
    ``MERGE_FANOUT`` chunks of one level when there are that many, and the buckets of the drops it
    added: nothing proportional to the clips covered."""

    version: str = ""
    train: CoveredDrops = field(default_factory=CoveredDrops)
    eval: CoveredDrops = field(default_factory=CoveredDrops)
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
    eval_parts: dict[str, list[str]] = field(default_factory=dict)  # eval drop -> its asset ids (drops with any)
    changed_shards: set[str] | None = None
    """Not stored: the train drops whose rows the last ``update`` may have changed (None: all, a
    state built from scratch)."""

    stored_clips: int | None = None
    """Not stored: how many clips (from the front) the store already holds in chunks (None: the
    store's chunks do not line up with these clips; the next save writes them whole)."""

    base: int = 0
    """Not stored: clips held in the store but not loaded (a state loaded ``lazy``): ``clips`` and
    the train features hold the clips from index ``base`` on; the stored ones are read only when a
    run needs them (new eval material, a rebuilt drop, every row)."""
    _stored: dict[str, Any] | None = None
    """Not stored: a lazy state's store, its chunks and the count of contaminated clips among the
    first ``base`` clips (with the settings it was counted with)."""
    _rematched: set[int] = field(default_factory=set)
    """Not stored: stored clips whose best match changed since the load (their chunks are rewritten)."""
    gone: set[int] = field(default_factory=set)
    """Indices of clips taken out (their drop removed or re-cut): they keep their place in their
    chunk, flagged, so no other clip is renumbered, and rows, counts, matching and the scan skip
    them. Of a lazy state: those among the clips read and those taken out since the load."""
    _taken_out: set[int] = field(default_factory=set)
    """Not stored: clips taken out since the load (their chunks are rewritten with the flag)."""
    _eval_changed: bool = False

    @property
    def size(self) -> int:
        """Clips covered, stored and in memory."""
        return self.base + len(self.clips)

    # -- the store ------------------------------------------------------------------------------------
    def _chunk_arrays(self, lo: int, hi: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The chunk object of clips [lo, hi) (held in memory)."""
        part = self.clips[lo - self.base:hi - self.base]
        frames, vecs = (self.frame_clip >= lo) & (self.frame_clip < hi), (self.vector_clip >= lo) & (self.vector_clip < hi)
        assets = sorted({c[k] for c in part for k in ("perceptual_asset", "semantic_asset")} - {None})
        at = {a: i for i, a in enumerate(assets)}
        info = {**{k: [c[k] for c in part] for k in _CLIP_IDS}, "first": lo, "match_assets": assets}
        return info, {"gone": np.array([i in self.gone for i in range(lo, hi)], bool),
                      "frame_hashes": self.frame_hashes[frames], "frame_clip": self.frame_clip[frames],
                      "vectors": self.vectors[vecs] if len(self.vectors) else self.vectors,
                      "vector_clip": self.vector_clip[vecs],
                      "hits": np.array([c["hits"] for c in part], np.int64),
                      "cosine": np.array([c["cosine"] for c in part], np.float64),
                      "perceptual": np.array([at.get(c["perceptual_asset"], -1) for c in part], np.int64),
                      "semantic": np.array([at.get(c["semantic_asset"], -1) for c in part], np.int64)}

    @staticmethod
    def _put_chunk(objects: ObjectStore, key: str, level: int, info: dict[str, Any], arrays: Mapping[str, np.ndarray],
                   params: DecontaminationSettings) -> dict[str, Any]:
        """Write a chunk object; returns its entry in the summary."""
        put_npz(objects, key, info, **arrays)
        _, perceptual, semantic = _verdicts(arrays["hits"], np.asarray(info["frames"], np.int64), arrays["cosine"],
                                            arrays["semantic"] >= 0, params)
        return {"key": key, "first": info["first"], "clips": len(info["clip_id"]), "level": level,
                "contaminated": int(((perceptual | semantic) & ~_gone_flags(info, arrays)).sum())}

    @staticmethod
    def _merged(objects: ObjectStore, chunks: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The chunk object holding the clips of ``chunks`` (consecutive), read from the store."""
        parts = [load_npz(objects, c["key"]) for c in chunks]
        assets = sorted({a for info, _ in parts for a in info["match_assets"]})
        at = {a: i for i, a in enumerate(assets)}
        info = {**{k: [v for part, _ in parts for v in part[k]] for k in _CLIP_IDS}, "first": chunks[0]["first"],
                "match_assets": assets}
        arrays: dict[str, np.ndarray] = {"gone": np.concatenate([_gone_flags(part, a) for part, a in parts])}
        for name in ("frame_hashes", "frame_clip", "vector_clip", "hits", "cosine"):
            arrays[name] = np.concatenate([a[name] for _, a in parts])
        vectors = [a["vectors"] for _, a in parts if a["vectors"].ndim == 2 and len(a["vectors"])]
        arrays["vectors"] = np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)
        for name in ("perceptual", "semantic"):
            arrays[name] = np.concatenate([np.array([at[p["match_assets"][i]] if i >= 0 else -1 for i in a[name].tolist()],
                                                    np.int64) for p, a in parts])
        return info, arrays

    def save(self, objects: ObjectStore, params: DecontaminationSettings) -> None:
        """Write what changed since the state was loaded: a chunk of the clips added, the chunks
        whose clips' best matches changed, the eval material when it changed, the covered drops
        added or removed, then the summary; the last ``MERGE_FANOUT`` chunks of one level are merged
        into one. A state built from scratch, or one whose drops were removed (its clips renumbered),
        is written whole as one chunk."""
        drops, series = PartitionMap(objects, DROPS_PREFIX), ChunkSeries(objects, STATE_PREFIX)
        old = drops.meta if drops.meta.get("layout") == LAYOUT and drops.meta.get("version") == self.version else {}
        whole = self.stored_clips is None or not old
        if whole:
            self.load_stored()
        seq = max([int(old.get("seq", 0)), *series.seqs()])

        def next_key(prefix: str) -> str:
            nonlocal seq
            seq += 1
            return f"{prefix}/{seq:08d}.npz"

        chunks = [] if whole else [dict(c) for c in old["chunks"]]
        for i, chunk in enumerate(chunks):
            lo, hi = chunk["first"], chunk["first"] + chunk["clips"]
            if any(lo <= c < hi for c in self._rematched | self._taken_out):
                if lo >= self.base:  # its clips are in memory
                    chunks[i] = self._put_chunk(objects, next_key(series.prefix), chunk["level"],
                                                *self._chunk_arrays(lo, hi), params)
                    continue
                info, arrays = load_npz(objects, chunk["key"])  # taken-out clips of a lazy state: flag them
                arrays = {**{k: arrays[k] for k in arrays.files if k != "meta"},
                          "gone": _gone_flags(info, arrays) | np.isin(np.arange(lo, hi), list(self._taken_out))}
                chunks[i] = self._put_chunk(objects, next_key(series.prefix), chunk["level"], info, arrays, params)
                self._stored["contaminated"] += chunks[i]["contaminated"] - chunk["contaminated"]
        start = 0 if whole else int(old["clips"])
        if start < self.size:
            chunks.append(self._put_chunk(objects, next_key(series.prefix), WHOLE_LEVEL if whole else 0,
                                          *self._chunk_arrays(start, self.size), params))
        while len(chunks) >= MERGE_FANOUT and len({c["level"] for c in chunks[-MERGE_FANOUT:]}) == 1 \
                and chunks[-1]["level"] < WHOLE_LEVEL:
            tail = chunks[-MERGE_FANOUT:]
            chunks[-MERGE_FANOUT:] = [self._put_chunk(objects, next_key(series.prefix), tail[0]["level"] + 1,
                                                      *self._merged(objects, tail), params)]
        eval_key = old.get("eval_key")
        if whole or self._eval_changed or not eval_key:
            eval_key = next_key(EVAL_PREFIX)
            put_npz(objects, eval_key, {"eval_parts": self.eval_parts, "eval_hash_owner": self.eval_hash_owner,
                                        "eval_vector_owner": self.eval_vector_owner},
                    eval_hashes=self.eval_hashes, eval_vectors=self.eval_vectors)
        eval_drops = PartitionMap(objects, EVAL_DROPS_PREFIX)
        if whole or self.eval.changes or not eval_drops.found:
            eval_drops.write(dict(self.eval.items()) if whole else self.eval.changes, {"seq": seq}, whole=whole)
        meta = {"layout": LAYOUT, "version": self.version, "seq": seq, "clips": self.size, "chunks": chunks,
                "eval_key": eval_key, "eval_drops_seq": eval_drops.meta["seq"], "params": _count_params(params)}
        if whole:
            drops.write(self.train.values(), meta, whole=True)
        else:
            drops.write(self.train.changes, meta)
        series.prune([c["key"] for c in chunks])
        for info in objects.list(EVAL_PREFIX):
            if info.key != eval_key:
                objects.delete(info.key)
        for key in OLD_KEYS:
            objects.delete(key)
        self.train, self.eval = CoveredDrops(drops), CoveredDrops(eval_drops)
        self.stored_clips, self._rematched, self._taken_out, self._eval_changed = self.size, set(), set(), False
        if self._stored is not None:
            self._stored["chunks"] = chunks  # the stored clips now lie in these (load_stored reads them)

    @classmethod
    def load(cls, objects: ObjectStore, version: str, lazy: bool = False) -> DecontaminationState:
        """The stored state (empty when none, or made by another version or layout). ``lazy``: the
        eval side and the summary only; the stored clips and their features are read when a run
        needs them (``load_stored``)."""
        drops, eval_drops = PartitionMap(objects, DROPS_PREFIX), PartitionMap(objects, EVAL_DROPS_PREFIX)
        meta = drops.meta
        if meta.get("layout") != LAYOUT or meta.get("version") != version \
                or eval_drops.meta.get("seq") != meta["eval_drops_seq"]:  # a save stopped between the maps
            return cls()
        info, arrays = load_npz(objects, meta["eval_key"])
        state = cls(version=version, train=CoveredDrops(drops), changed_shards=set(), eval=CoveredDrops(eval_drops),
                    eval_parts=info["eval_parts"], eval_hash_owner=info["eval_hash_owner"],
                    eval_vector_owner=info["eval_vector_owner"], eval_hashes=arrays["eval_hashes"],
                    eval_vectors=arrays["eval_vectors"])
        state.base = state.stored_clips = int(meta["clips"])
        state._stored = {"objects": objects, "chunks": meta["chunks"], "params": meta["params"],
                         "contaminated": sum(int(c["contaminated"]) for c in meta["chunks"])}
        if not lazy:
            state.load_stored()
        return state

    def load_stored(self) -> None:
        """Read the stored clips and their features into a lazy state, before what it added since."""
        if not self.base:
            return
        objects, chunks = self._stored["objects"], self._stored["chunks"]
        parts = [load_npz(objects, c["key"]) for c in chunks]
        clips = []
        for info, arrays in parts:
            assets = info["match_assets"]
            for values, hits, cosine, p, s in zip(zip(*(info[k] for k in _CLIP_IDS), strict=True), arrays["hits"].tolist(),
                                                  arrays["cosine"].tolist(), arrays["perceptual"].tolist(),
                                                  arrays["semantic"].tolist(), strict=True):
                clips.append({**dict(zip(_CLIP_IDS, values, strict=True)), "hits": hits, "cosine": cosine,
                              "perceptual_asset": assets[p] if p >= 0 else None,
                              "semantic_asset": assets[s] if s >= 0 else None})
        if len(clips) < self.base:
            raise RuntimeError(f"decontamination state: {len(clips)} stored clips, {self.base} expected")
        self.gone |= {int(info["first"]) + i for info, a in parts for i in np.flatnonzero(_gone_flags(info, a)).tolist()
                      if int(info["first"]) + i < self.base}
        frame_clip = np.concatenate([np.zeros(0, np.int64), *(a["frame_clip"] for _, a in parts)])
        frame_hashes = np.concatenate([np.zeros((0, 32), np.uint8), *(a["frame_hashes"] for _, a in parts)])
        vector_clip = np.concatenate([np.zeros(0, np.int64), *(a["vector_clip"] for _, a in parts)])
        found = [a["vectors"] for _, a in parts if a["vectors"].ndim == 2 and len(a["vectors"])]
        vectors = np.concatenate(found) if found else np.zeros((0, 0), np.float32)
        frames, vecs = frame_clip < self.base, vector_clip < self.base  # the chunks may reach past base (saved since)
        self.clips = clips[:self.base] + self.clips
        self.frame_hashes = np.concatenate([frame_hashes[frames], self.frame_hashes])
        self.frame_clip = np.concatenate([frame_clip[frames], self.frame_clip])
        if len(vectors) and vecs.any():
            self.vectors = np.concatenate([vectors[vecs], self.vectors]) if len(self.vectors) else vectors[vecs]
        self.vector_clip = np.concatenate([vector_clip[vecs], self.vector_clip])
        self.base, self._stored = 0, None

    # -- the train side -----------------------------------------------------------------------------
    def drop_train(self, parts: set[str]) -> None:
        """Take out the clips of drops removed or rebuilt: flagged in place (the chunks holding them
        are rewritten by the next save, nothing else), or, for a drop covered before clip ranges
        were kept, every clip renumbered without them (written whole)."""
        if not parts:
            return
        ranges = {part: self.train.clip_range(part) for part in parts}
        if any(r is None for r in ranges.values()):
            self._compact(parts)
            return
        for part, (lo, hi) in ranges.items():
            self.gone.update(range(lo, hi))
            self._taken_out.update(range(lo, hi))
            self.train.pop(part)
        self._changed(parts)

    def _compact(self, parts: set[str]) -> None:
        """Every clip of ``parts`` and every clip taken out before dropped, the rest renumbered, each
        covered drop's clip range recorded again (the next save writes the state whole)."""
        self.load_stored()
        keep = [i for i, c in enumerate(self.clips) if c["source_shard"] not in parts and i not in self.gone]
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
            self.train.pop(part)
        self.gone, self._taken_out = set(), set()
        spans: dict[str, list[int]] = {}
        for i, clip in enumerate(self.clips):
            spans.setdefault(clip["source_shard"], []).append(i)
        for part, at in spans.items():
            fingerprint = self.train.get(part)
            if fingerprint is not None and at[-1] - at[0] + 1 == len(at):  # contiguous (always, as added)
                self.train.cover(part, fingerprint, at[0], at[-1] + 1)
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
        self.train.cover(part, fingerprint, first, self.size)
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
        if len(self.eval_hashes) > h0 or len(self.eval_vector_owner) > v0:
            self._eval_changed = True
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
        gone = np.fromiter(self.gone, np.int64, len(self.gone))
        in_clips = (self.frame_clip >= clips.start) & (self.frame_clip < clips.stop) & ~np.isin(self.frame_clip, gone)
        in_vecs = (self.vector_clip >= clips.start) & (self.vector_clip < clips.stop) & ~np.isin(self.vector_clip, gone)
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
                    self._rematched.add(clip)

    def rows(self, params: DecontaminationSettings, version: RowVersion,
             shards: set[str] | None = None) -> list[dict[str, Any]]:
        """One row per covered clip (of ``shards``, else of every drop)."""
        if self.base and (shards is None or not {s for s in shards if s in self.train} <= self._shards_in_memory()):
            self.load_stored()
        rows = []
        for at, c in sorted(enumerate(self.clips, self.base), key=lambda item: item[1]["clip_id"]):
            if (shards is not None and c["source_shard"] not in shards) or at in self.gone:
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
        return {c["source_shard"] for at, c in enumerate(self.clips, self.base) if at not in self.gone}

    def contaminated(self, params: DecontaminationSettings) -> int:
        """Covered clips matching eval material, over every drop (a lazy state takes its stored
        clips' count from the summary: each chunk's count)."""
        if self.base and (self._stored["params"] != _count_params(params) or min(self._taken_out, default=self.base) < self.base):
            self.load_stored()  # counted with other settings, or stored clips taken out since (counted by the next save)
        alive = np.array([at not in self.gone for at in range(self.base, self.size)], bool)
        _, perceptual, semantic = _verdicts(
            np.array([c["hits"] for c in self.clips], np.int64), np.array([c["frames"] for c in self.clips], np.int64),
            np.array([c["cosine"] for c in self.clips], np.float64),
            np.array([c["semantic_asset"] is not None for c in self.clips], bool), params)
        return int((perceptual | semantic)[alive].sum()) + (self._stored["contaminated"] if self.base else 0)


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
           params: DecontaminationSettings, engine: Any = None, changed: Iterable[str] | None = None,
           eval_changed: Iterable[str] | None = None) -> tuple[DecontaminationState, dict[str, int]]:
    """Bring ``state`` up to date with the train and eval drops (drop -> fingerprint of its tables);
    the matching runs on ``engine`` (None: here). ``changed`` / ``eval_changed``: the train / eval
    drops whose fingerprint may differ from the last run's (None: unknown), so only those are
    compared; when a side's covered count does not add up (a change not named) every drop of that
    side is."""
    asked_eval = set(eval_changed) if eval_changed is not None else None
    if asked_eval is not None and not told_every_change(len(state.eval), asked_eval, state.eval, evals):
        asked_eval = None
    if asked_eval is None:
        eval_gone = any(evals.get(p) != fp for p, fp in state.eval.items())
        new_eval = sorted(p for p in evals if p not in state.eval)
    else:
        eval_gone = any((fp := state.eval.get(p)) is not None and evals.get(p) != fp for p in asked_eval)
        new_eval = sorted(p for p in asked_eval if p in evals and p not in state.eval)
    if state.version != version or eval_gone:
        state = DecontaminationState(version=version)  # built from scratch: every row is new
        new_eval = sorted(evals)
    else:
        state.changed_shards = set()
    asked = set(changed) if changed is not None else None
    if asked is not None and not told_every_change(len(state.train), asked, state.train, train):
        asked = None
    stale_train = {p for p, fp in state.train.items() if train.get(p) != fp} if asked is None \
        else {p for p in asked if (fp := state.train.get(p)) is not None and train.get(p) != fp}
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
