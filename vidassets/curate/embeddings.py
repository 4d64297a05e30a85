"""clip_embeddings for one partition: one L2-normalised vector per clip from its saved context
frames (no decode); rows whose embedder version is unchanged are reused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from vidassets.config import EmbeddingSettings
from vidassets.models.embedder import pool
from vidassets.models.registry import ModelRegistry
from vidassets.runtime.engine import Engine, Outcome, each
from vidassets.runtime.step import Step
from vidassets.storage.blobs import load_images
from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import FINAL, RowVersion, StepStats, records

VERSION = "embed-v1"


def embedder_kind(name: str = "mobilenet_v2", weights: str | None = None, video_frames: int | None = None) -> tuple:
    """Registry kind and arguments of the configured embedder."""
    if name == "mobilenet_v2":
        return ("mobilenet_v2-imagenet", weights)
    if not weights:
        raise ValueError(f"embeddings.weights: the {name} embedder needs a local model directory")
    if name in ("clip", "siglip"):
        return (f"{name}-image", weights)
    if name == "vjepa2":
        return ("vjepa2-video", weights, video_frames)
    raise ValueError(f"unknown embedder {name!r}")


def embedder(registry: ModelRegistry, embeddings: EmbeddingSettings | None = None) -> object:
    """The embedder ``embeddings`` settings name (default: the offline default), loaded once per process."""
    e = embeddings or EmbeddingSettings()
    return registry.get(*embedder_kind(e.model, e.weights, e.video_frames))


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


class _EmbedItem:
    """One item's vector from its saved frames (picklable: it may run on a Ray model actor)."""

    def __init__(self, objects: ObjectStore, load_embedder):
        self.objects, self.load_embedder = objects, load_embedder

    def __call__(self, job: tuple[dict, list[str]]) -> dict:
        return self.vectors([(job, load_images(self.objects, job[1]))])[0]

    def vectors(self, loaded: list[tuple[tuple[dict, list[str]], list[np.ndarray]]]) -> list[dict]:
        """Rows of items whose frames are loaded: every frame of them in one pass of the embedder
        (its runs hold frames of several items), each item's vector pooled from its own rows."""
        rows = [{**identity, "frames": len(images)} for (identity, _), images in loaded]
        for row, (_, images) in zip(rows, loaded, strict=True):
            if not images:
                row.update(status="no_frames", reason="no readable context frame", dim=0, vector=b"", failure=FINAL,
                           _stats={"no_frames": 1})
        live = [i for i, (_, images) in enumerate(loaded) if images]
        if live:
            model = self.load_embedder()
            before, runs_before = model.calls, model.batches
            for i, vector in zip(live, _item_vectors(model, [loaded[i][1] for i in live]), strict=True):
                rows[i].update(status="ok", reason=None, dim=int(vector.shape[0]), vector=vector_bytes(vector))
            rows[live[0]]["_stats"] = {"model_calls": model.calls - before, "model_batches": model.batches - runs_before}
        return rows


def _item_vectors(model, items: list[list[np.ndarray]]) -> list[np.ndarray]:
    """One vector per item: an image embedder embeds every frame of the items in one pass and pools
    each item's own rows; a video embedder (no ``embed_frames``) reads each item's frames in order."""
    if not hasattr(model, "embed_frames"):
        return [model(frames) for frames in items]
    features = model.embed_frames([f for frames in items for f in frames])
    out, start = [], 0
    for frames in items:
        out.append(pool(features[start : start + len(frames)]))
        start += len(frames)
    return out


class _EmbedGroup(_EmbedItem):
    """The vectors of a group of items in one batched pass; when that pass fails, each item alone
    (so one item's failure is its own ``error`` row, not its neighbours')."""

    def __call__(self, jobs: list[tuple[dict, list[str]]]) -> dict:
        try:
            rows = self.vectors([(job, load_images(self.objects, job[1])) for job in jobs])
        except Exception:  # noqa: BLE001 - find the item that fails: one at a time
            return {"outcomes": each(_EmbedItem(self.objects, self.load_embedder), jobs)}
        return {"outcomes": [Outcome(row=row) for row in rows]}


def _embed(objects: ObjectStore, items: list[dict], key, frame_keys, identity, previous: pd.DataFrame,
           version: RowVersion, load_embedder, max_runs: int, batch_frames: int, engine: Engine | None = None,
           ) -> tuple[list[dict], StepStats]:
    """One vector per item from its frames (``key(row)`` names an item and its stored row); rows
    with unchanged versions are reused, the rest computed on ``engine`` (model actors on Ray) in
    groups of at least ``batch_frames`` frames, so that the embedder's runs hold frames of several
    items. An item whose embedding failed is an ``error`` row, tried again by a later run."""
    step = Step(previous, key, max_runs, engine=engine)
    step.stats.rows_in = len(items)
    jobs = [(identity(item), list(frame_keys(item))) for item in items]
    rows = step.run_grouped(jobs, lambda job: key(job[0]), version, _EmbedGroup(objects, load_embedder),
                            lambda job, exc: {**job[0], "frames": 0, "status": "error", "reason": exc.reason, "dim": 0,
                                              "vector": b""},
                            weight=lambda job: len(job[1]), limit=batch_frames)
    return rows, step.stats


def _by_asset(frames: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {a: g for a, g in frames.groupby("asset_id")} if len(frames) else {}


def embed_partition(objects: ObjectStore, clips: pd.DataFrame, context_frames: pd.DataFrame, previous: pd.DataFrame,
                    version: RowVersion, load_embedder, max_runs: int, batch_frames: int, engine: Engine | None = None,
                    ) -> tuple[list[dict], StepStats]:
    """One vector per clip from the context frames inside it."""
    by_asset = _by_asset(context_frames)

    def frame_keys(clip: dict) -> list[str]:
        frames = by_asset.get(clip["asset_id"])
        if frames is None:
            return []
        return list(frames[(frames.frame_index >= clip["first_frame"]) & (frames.frame_index <= clip["last_frame"])].blob_key)

    return _embed(objects, records(clips), lambda c: c["clip_id"], frame_keys,
                  lambda c: {"clip_id": c["clip_id"], "asset_id": c["asset_id"], "source_shard": c["source_shard"]},
                  previous, version, load_embedder, max_runs, batch_frames, engine)


def video_segments(asset_id: str, shots: list[list[int]], frames: pd.DataFrame | None, segment_s: float) -> list[dict]:
    """The segments of a video that a train clip is compared with: each shot, and shots longer than
    ``segment_s`` as windows of ``segment_s`` with half overlap (the last one ending at the shot's
    end), over its context frames (frame_index, time_s, blob_key). An excerpt of a long video lies
    mostly inside one segment, so it is compared with that part, not with the whole video's mean."""
    out: list[dict] = []
    if frames is None or not len(frames):
        return [{"asset_id": asset_id, "segment": 0, "first_frame": 0, "last_frame": 0, "blob_keys": []}]
    frames = frames.sort_values("frame_index")
    for first, last in shots or [[int(frames.frame_index.min()), int(frames.frame_index.max())]]:
        inside = frames[(frames.frame_index >= first) & (frames.frame_index <= last)]
        if not len(inside):
            continue
        times = inside.time_s.to_numpy(dtype=float)
        starts = [times[0]]
        while starts[-1] + segment_s < times[-1]:
            starts.append(min(starts[-1] + segment_s / 2, times[-1] - segment_s))
        for start in starts:
            window = inside[(times >= start - 1e-6) & (times <= start + segment_s + 1e-6)]
            out.append({"asset_id": asset_id, "segment": len(out), "first_frame": int(window.frame_index.iloc[0]),
                        "last_frame": int(window.frame_index.iloc[-1]), "blob_keys": list(window.blob_key)})
    return out or [{"asset_id": asset_id, "segment": 0, "first_frame": 0, "last_frame": 0, "blob_keys": []}]


def embed_videos(objects: ObjectStore, frames: pd.DataFrame, analyses: list[dict], previous: pd.DataFrame,
                 version: RowVersion, load_embedder, max_runs: int, segment_s: float, batch_frames: int,
                 ) -> tuple[list[dict], StepStats]:
    """The eval side of decontamination: one vector per segment of each video (``video_segments``
    over its shots and context frames)."""
    by_asset = _by_asset(frames)
    segments = [{**seg, "source_shard": a["source_shard"]}
                for a in analyses
                for seg in video_segments(a["asset_id"], json.loads(a.get("shots") or "[]"), by_asset.get(a["asset_id"]),
                                          segment_s)]
    return _embed(objects, segments, lambda r: (r["asset_id"], int(r["segment"])), lambda s: s["blob_keys"],
                  lambda s: {k: s[k] for k in ("asset_id", "source_shard", "segment", "first_frame", "last_frame")},
                  previous, version, load_embedder, max_runs, batch_frames)
