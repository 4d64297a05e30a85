"""clip_embeddings for one partition: one L2-normalised vector per clip from its saved context
frames (no decode); rows whose embedder version is unchanged are reused."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cv2
import numpy as np
import pandas as pd

from vidassets.media.partition import records
from vidassets.storage.objects import ObjectStore


@dataclass
class EmbedStats:
    clips: int = 0
    computed: int = 0
    reused: int = 0
    model_calls: int = 0
    missing: int = 0


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


def embed_partition(objects: ObjectStore, clips: pd.DataFrame, context_frames: pd.DataFrame, previous: pd.DataFrame,
                    version: str, load_embedder) -> tuple[list[dict], EmbedStats]:
    stats = EmbedStats(clips=len(clips))
    old = {r["clip_id"]: r for r in records(previous)} if len(previous) else {}
    frames_by_asset = {a: g for a, g in context_frames.groupby("asset_id")} if len(context_frames) else {}
    rows = []
    for clip in records(clips):
        prior = old.get(clip["clip_id"])
        if prior is not None and prior["producer_version"] == version:
            rows.append(prior)
            stats.reused += 1
            continue
        frames = frames_by_asset.get(clip["asset_id"])
        keys = [] if frames is None else list(
            frames[(frames.frame_index >= clip["first_frame"]) & (frames.frame_index <= clip["last_frame"])].blob_key)
        images = []
        for key in keys:
            bgr = cv2.imdecode(np.frombuffer(objects.get_bytes(key), np.uint8), cv2.IMREAD_COLOR)
            if bgr is not None:
                images.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        base = {"clip_id": clip["clip_id"], "asset_id": clip["asset_id"], "source_shard": clip["source_shard"],
                "frames": len(images), "producer_version": version}
        if not images:
            rows.append({**base, "status": "no_frames", "dim": 0, "vector": b""})
            stats.missing += 1
            continue
        model = load_embedder()
        before = model.calls
        vector = model(images)
        stats.model_calls += model.calls - before
        rows.append({**base, "status": "ok", "dim": int(vector.shape[0]), "vector": vector_bytes(vector)})
        stats.computed += 1
    return rows, stats


def embed_videos(objects: ObjectStore, frames: pd.DataFrame, assets: list[dict], previous: pd.DataFrame,
                 version: str, load_embedder) -> tuple[list[dict], EmbedStats]:
    """One embedding per whole video (all its context frames): the eval side of decontamination."""
    stats = EmbedStats(clips=len(assets))
    old = {r["asset_id"]: r for r in records(previous)} if len(previous) else {}
    by_asset = {a: g for a, g in frames.groupby("asset_id")} if len(frames) else {}
    rows = []
    for asset in assets:
        prior = old.get(asset["asset_id"])
        if prior is not None and prior["producer_version"] == version:
            rows.append(prior)
            stats.reused += 1
            continue
        group = by_asset.get(asset["asset_id"])
        images = []
        for key in [] if group is None else group.blob_key:
            bgr = cv2.imdecode(np.frombuffer(objects.get_bytes(key), np.uint8), cv2.IMREAD_COLOR)
            if bgr is not None:
                images.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        base = {"asset_id": asset["asset_id"], "source_shard": asset["source_shard"], "frames": len(images),
                "producer_version": version}
        if not images:
            rows.append({**base, "status": "no_frames", "dim": 0, "vector": b""})
            stats.missing += 1
            continue
        model = load_embedder()
        before = model.calls
        vector = model(images)
        stats.model_calls += model.calls - before
        rows.append({**base, "status": "ok", "dim": int(vector.shape[0]), "vector": vector_bytes(vector)})
        stats.computed += 1
    return rows, stats
