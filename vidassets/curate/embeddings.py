"""clip_embeddings for one partition: one L2-normalised vector per clip from its saved context
frames (no decode); rows whose embedder version is unchanged are reused."""

from __future__ import annotations

import functools

import cv2
import numpy as np
import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import FINAL, Reuse, RowVersion, StepStats, records

VERSION = "embed-v1"


@functools.cache
def embedder(name: str = "mobilenet_v2", weights: str | None = None):
    """The configured embedder, loaded once per process."""
    if name == "mobilenet_v2":
        from vidassets.models.embedder import MobileNetV2Embedder

        return MobileNetV2Embedder(weights)
    if name == "clip":
        from vidassets.models.embedder import ClipImageEmbedder

        if not weights:
            raise ValueError("embeddings.weights: the clip embedder needs a local model directory")
        return ClipImageEmbedder(weights)
    raise ValueError(f"unknown embedder {name!r}")


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def vector_of(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


def load_images(objects: ObjectStore, keys) -> list[np.ndarray]:
    """Saved context frames (JPEG blobs) as RGB arrays; unreadable blobs are skipped."""
    images = []
    for key in keys:
        bgr = cv2.imdecode(np.frombuffer(objects.get_bytes(key), np.uint8), cv2.IMREAD_COLOR)
        if bgr is not None:
            images.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return images


def _embed(objects: ObjectStore, items: list[dict], id_column: str, frame_keys, identity, previous: pd.DataFrame,
           version: RowVersion, load_embedder, max_runs: int) -> tuple[list[dict], StepStats]:
    """One vector per item from its frames; rows with unchanged versions are reused."""
    stats = StepStats(rows_in=len(items))
    reuse = Reuse(previous, lambda r: r[id_column], max_runs, stats)
    rows = []
    for item in items:
        kept = reuse.take(item[id_column], version)
        if kept is not None:
            rows.append(kept)
            continue
        images = load_images(objects, frame_keys(item))
        base = {**identity(item), "frames": len(images)}
        if not images:
            rows.append(reuse.stamp(item[id_column], {**base, "status": "no_frames", "dim": 0, "vector": b""}, version,
                                    FINAL))
            stats.add("no_frames")
            continue
        model = load_embedder()
        before = model.calls
        vector = model(images)
        stats.model_calls += model.calls - before
        rows.append(reuse.stamp(item[id_column], {**base, "status": "ok", "dim": int(vector.shape[0]),
                                                  "vector": vector_bytes(vector)}, version))
    return rows, stats


def _by_asset(frames: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {a: g for a, g in frames.groupby("asset_id")} if len(frames) else {}


def embed_partition(objects: ObjectStore, clips: pd.DataFrame, context_frames: pd.DataFrame, previous: pd.DataFrame,
                    version: RowVersion, load_embedder, max_runs: int) -> tuple[list[dict], StepStats]:
    """One vector per clip from the context frames inside it."""
    by_asset = _by_asset(context_frames)

    def frame_keys(clip: dict) -> list[str]:
        frames = by_asset.get(clip["asset_id"])
        if frames is None:
            return []
        return list(frames[(frames.frame_index >= clip["first_frame"]) & (frames.frame_index <= clip["last_frame"])].blob_key)

    return _embed(objects, records(clips), "clip_id", frame_keys,
                  lambda c: {"clip_id": c["clip_id"], "asset_id": c["asset_id"], "source_shard": c["source_shard"]},
                  previous, version, load_embedder, max_runs)


def embed_videos(objects: ObjectStore, frames: pd.DataFrame, assets: list[dict], previous: pd.DataFrame,
                 version: RowVersion, load_embedder, max_runs: int) -> tuple[list[dict], StepStats]:
    """One vector per whole video (all its context frames): the eval side of decontamination."""
    by_asset = _by_asset(frames)
    return _embed(objects, assets, "asset_id",
                  lambda a: list(by_asset[a["asset_id"]].blob_key) if a["asset_id"] in by_asset else [],
                  lambda a: {"asset_id": a["asset_id"], "source_shard": a["source_shard"]},
                  previous, version, load_embedder, max_runs)
