"""latents for one partition: each selected clip goes to the largest shape bucket it fills (frame
count 4k+1 x aspect-ratio bucket at the base resolution), its frames are read in the sandbox and
encoded by the configured VAE.

Frames come from the clip's ladder rung (``latents.read_from = ladder``, the default): the smallest
rung of the current ladder version at least as large as the bucket (or the source, when that is
smaller), read from its start; the ladder is the durable copy of every selected clip, so a new VAE
or resolution never decodes raw video again. With no such rung (or ``read_from = raw``) they come
from the source with the clip reader (seek to the keyframe before the first sampled frame, decode
only to the last one, never decoding unwanted non-reference frames). The row says which
(``frames_from``) and its ``frame_indices`` count frames of that file.

Latents are stored as safetensors under a key derived from (clip_id, latents version, bucket), in
the configured dtype, with the per-clip stats in the file's metadata too. A clip whose key already
exists is not encoded again, even if its row was lost (the stats come back from the file header).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import LatentSettings, ProbeSettings
from vidassets.media.drop_steps import SkippableFrames, read_parquet_blob
from vidassets.media.image import is_image
from vidassets.media.ladder import center_crop as ladder_crop
from vidassets.media.source import step_source
from vidassets.runtime import tasks
from vidassets.runtime.engine import Engine, groups
from vidassets.runtime.step import Failure, Step, count_remote
from vidassets.storage.objects import ObjectStore, ReadOnlyBucket
from vidassets.storage.rows import FINAL, TRANSIENT, RowVersion, StepStats, matches, records

VERSION = "latents-v1"

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "float8_e4m3fn"}


# ---------------------------------------------------------------- shape buckets

@dataclass(frozen=True)
class SpatialBucket:
    aspect_ratio: str
    width: int
    height: int


def vae_model(lat: LatentSettings) -> tuple:
    """Registry kind and arguments of the VAE ``latents`` settings name."""
    return ("vae", lat.vae_class, lat.vae_path, lat.vae_tiling)


def bucket_multiple(lat: LatentSettings) -> int:
    """What every bucket side is a multiple of: 16, or the VAE's spatial multiple where larger (LTX: 32)."""
    from vidassets.models.vae import read_layout

    return math.lcm(16, read_layout(lat.vae_class, lat.vae_path).spatial_multiple)


def spatial_buckets(ratios: Sequence[str], base: int, multiple: int = 16) -> list[SpatialBucket]:
    """One bucket per aspect ratio: short side ``base``, long side from the ratio, both rounded to
    ``multiple`` (the VAE's spatial factor times the model's patch size)."""
    out = []
    for r in ratios:
        w, h = (int(x) for x in r.split(":"))
        short = max(multiple, round(base / multiple) * multiple)
        long = max(multiple, round(base * max(w, h) / min(w, h) / multiple) * multiple)
        out.append(SpatialBucket(r, long if w >= h else short, short if w >= h else long))
    return out


def bucket_name(frames: int, width: int, height: int) -> str:
    """A shape bucket's name: ``f<frames>_<width>x<height>`` (pixels of the encoded frames)."""
    return f"f{frames}_{width}x{height}"


def bucket_shape(name: str) -> tuple[int, int, int]:
    """(frames, width, height) of a ``bucket_name``."""
    match = re.fullmatch(r"f(\d+)_(\d+)x(\d+)", name)
    if match is None:
        raise ValueError(f"not a shape bucket name: {name!r}")
    frames, width, height = (int(g) for g in match.groups())
    return frames, width, height


def nearest_bucket(width: int, height: int, buckets: Sequence[SpatialBucket]) -> SpatialBucket:
    """The bucket whose aspect ratio is nearest on a log scale (ties: first configured)."""
    ratio = math.log(width / height)
    return min(buckets, key=lambda b: abs(math.log(b.width / b.height) - ratio))


def center_crop(width: int, height: int, bucket: SpatialBucket) -> tuple[int, int, int, int]:
    """[x, y, w, h] of the largest centred window of the bucket's aspect ratio (the ladder's crop rule)."""
    return ladder_crop(width, height, f"{bucket.width}:{bucket.height}")


IMAGE_FRAMES = 1
"""A still image is encoded as a 1-frame latent (the 4k+1 frame count of a causal video VAE at k = 0:
its first frame is encoded alone), in 1-frame shape buckets of its own."""


def frame_buckets_for(clip: Mapping[str, Any], lat: LatentSettings) -> tuple[int, ...]:
    return (IMAGE_FRAMES,) if is_image(clip) else tuple(lat.frame_buckets)


def sample_frames(first: int, last: int, frame_buckets: Sequence[int], source_fps: float,
                  fps: float | None) -> list[int] | None:
    """Source frame indices for the largest frame bucket the clip fills, or None if it fills none.
    Without ``fps`` the bucket's frames are spread uniformly over the clip; with it they are taken
    at that rate from a window centred in the clip."""
    n = last - first + 1
    step = 1.0 if not fps or not source_fps else source_fps / fps
    available = int(math.floor((n - 1) / step + 1e-9)) + 1
    fitting = [f for f in frame_buckets if f <= available]
    if not fitting:
        return None
    frames = max(fitting)
    if not fps:
        return [int(i) for i in np.linspace(first, last, frames).round().astype(int)]
    start = first + ((n - 1) - (frames - 1) * step) / 2
    return [int(round(start + k * step)) for k in range(frames)]


# ---------------------------------------------------------------- latents files

def latent_key(clip_id: str, version: str, bucket: str) -> str:
    digest = hashlib.sha256(f"{clip_id}\x00{version}\x00{bucket}".encode()).hexdigest()
    return f"blobs/latents/{digest[:2]}/{digest}.safetensors"


def latent_stats(latents) -> dict[str, float | int]:
    import torch

    x = latents.float()
    finite = x[torch.isfinite(x)]
    channels = torch.where(torch.isfinite(x), x, torch.nan).flatten(1)  # (C, T*H*W), non-finite as NaN
    return {"mean": float(finite.mean()) if finite.numel() else float("nan"),
            "std": float(finite.std()) if finite.numel() > 1 else float("nan"),
            "nan_count": int(torch.isnan(x).sum()), "inf_count": int(torch.isinf(x).sum()),
            # per channel: what the latent-statistics check compares with the VAE version's reference
            "channel_mean": json.dumps([round(float(v), 6) for v in channels.nanmean(dim=1)]),
            "channel_std": json.dumps([round(float(v), 6) for v in _nanstd(channels)])}


def _nanstd(x):
    import torch

    mean = x.nanmean(dim=1, keepdim=True)
    return torch.sqrt(((x - mean) ** 2).nanmean(dim=1))


def latents_bytes(latents, dtype: str, metadata: dict[str, str]) -> bytes:
    import torch
    from safetensors.torch import save

    return save({"latents": latents.to(getattr(torch, DTYPES[dtype])).contiguous()}, metadata=metadata)


def load_latents(objects: ObjectStore, key: str):
    """(latents tensor in its stored dtype, metadata) of a stored latents file."""
    from safetensors.torch import load

    data = objects.get_bytes(key)
    header_len = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + header_len]).get("__metadata__", {})
    return load(data)["latents"], meta


def _header_metadata(objects: ObjectStore, key: str) -> dict[str, str]:
    head = objects.read_range(key, 0, 8)
    header = objects.read_range(key, 8, int.from_bytes(head, "little"))
    return json.loads(header).get("__metadata__", {})


# ---------------------------------------------------------------- the partition

def encode_partition(bucket: ReadOnlyBucket, objects: ObjectStore, selected: list[dict], clips: pd.DataFrame,
                     analysis: pd.DataFrame, videos: dict[str, dict], previous: pd.DataFrame,
                     versions_of: Callable[[dict], Mapping[int, RowVersion]], lat: LatentSettings, probe: ProbeSettings, vae_factory: Callable[[], Any], max_runs: int,
                     log: Callable[[str], None] = lambda _: None, packet_index: pd.DataFrame | None = None,
                     ladder: pd.DataFrame | None = None,
                     ladder_version_of: Callable[[dict], RowVersion] | None = None,
                     engine: Engine | None = None, run_id: str | None = None,
                     batch_frames: int = 1) -> tuple[list[dict], StepStats]:
    """Latents of the selected clips, one row per clip and resolution (``versions_of(clip)``:
    resolution -> its row version). Rows of other versions stay beside the new ones; a row of this
    version is reused unless a transient failure has runs left. The clips to encode go to ``engine``
    (on Ray: actors keeping the VAE loaded) in groups of one shape bucket holding at least
    ``batch_frames`` frames, each group one VAE run (1: one clip a run, as on the CPU)."""
    started = time.perf_counter()
    step = Step(previous, lambda r: (r["clip_id"], r["producer_version"]), max_runs, probe.memory_mb, log, engine,
              isolation=probe.isolation)
    stats = step.stats
    stats.rows_in = len(selected)
    limits = probe.model_dump()
    clip_by_id = {r["clip_id"]: r for r in records(clips)}
    analysis_by_asset = {r["asset_id"]: r for r in records(analysis)}
    multiple = bucket_multiple(lat)
    buckets = {r: spatial_buckets(lat.aspect_ratios, r, multiple) for r in lat.resolutions}
    new_rows: list[dict] = []
    pts_cache: dict[str, np.ndarray] = {}
    skippable = SkippableFrames(objects, packet_index)
    rungs_by_clip = (_current_rungs(ladder, clip_by_id, ladder_version_of)
                     if lat.read_from == "ladder" and ladder_version_of else {})
    jobs: list[dict] = []
    job_keys: list[tuple] = []
    with step:
        due = [(sel, resolution, version) for sel in selected
               for resolution, version in versions_of({**clip_by_id[sel["clip_id"]], "tier": sel.get("tier")}).items()]
        for sel, resolution, version in due:
            clip = {**clip_by_id[sel["clip_id"]], "tier": sel.get("tier")}
            key_of_row = (sel["clip_id"], version.producer)
            if not step.due([(key_of_row, version, clip)]):
                continue
            a = analysis_by_asset[clip["asset_id"]]
            rotation = int(a.get("rotation") or 0)
            w, h = int(a["analysis_width"]), int(a["analysis_height"])  # upright aspect of the source
            full_w, full_h = _upright_size(videos.get(clip["asset_id"], {}), w, h)
            rung = pick_rung(rungs_by_clip.get(clip["clip_id"], []), min(resolution, full_w, full_h), lat.fps)
            row = _base_row(clip, lat.dtype, resolution)
            if rung is not None:
                row["frames_from"] = f"ladder:{rung['rung']}"
                indices = sample_frames(0, int(rung["frames"]) - 1, lat.frame_buckets, float(rung["fps"]), lat.fps)
            else:
                indices = sample_frames(int(clip["first_frame"]), int(clip["last_frame"]), frame_buckets_for(clip, lat),
                                        float(a.get("fps") or 0.0), lat.fps)
            if indices is None:
                have = f"{rung['frames']} frames at {rung['fps']:g} fps" if rung is not None else f"{clip['num_frames']} frames"
                row.update(status="too_short", reason=f"{have} fill no frame bucket "
                           f"{list(lat.frame_buckets)}" + (f" at {lat.fps:g} fps" if lat.fps else ""))
                stats.add("too_short")
                new_rows.append(step.stamp(key_of_row, row, version))
                continue
            sb = nearest_bucket(w, h, buckets[resolution])
            shape_bucket = bucket_name(len(indices), sb.width, sb.height)
            key = latent_key(clip["clip_id"], f"{version.producer}+in-{version.inputs}", shape_bucket)
            row.update(bucket=shape_bucket, frames=len(indices), width=sb.width, height=sb.height,
                       aspect_ratio=sb.aspect_ratio, frame_indices=json.dumps(indices), latent_key=key)
            if objects.exists(key):
                meta = _header_metadata(objects, key)
                row.update(status="ok", crop=meta.get("crop"), latent_shape=meta.get("shape"),
                           **{k: float(meta[k]) for k in ("mean", "std")},
                           **{k: int(meta[k]) for k in ("nan_count", "inf_count")},
                           **{k: meta.get(k) for k in ("channel_mean", "channel_std")})
                stats.add("reused_files")
                new_rows.append(step.stamp(key_of_row, row, version))
                continue
            if rung is not None:
                crop = center_crop(int(rung["width"]), int(rung["height"]), sb)
                source: dict[str, Any] = {"rung": rung}
            else:
                asset_key = clip["asset_id"]
                if asset_key not in pts_cache:
                    pts_cache[asset_key] = read_parquet_blob(objects, a["signals_blob"])["pts"].to_numpy()
                crop = center_crop(full_w, full_h, sb)
                pts = pts_cache[asset_key]
                source = {"video": videos[asset_key], "pts": pts.tolist(), "rotation": rotation,
                          "skip": skippable.between(asset_key, int(pts[indices[0]]), int(pts[indices[-1]]))}
            row["crop"] = json.dumps(list(crop))
            jobs.append({"clip": clip, "row": row, "indices": indices, "crop": crop, "size": (sb.width, sb.height),
                         "key": key, "version": (version.producer, version.inputs), **source})
            job_keys.append((key_of_row, version))
        # read and encode on the step's engine (model actors on Ray, GPU shares there when present):
        # clips of one bucket (one shape) grouped into VAE runs
        by_bucket: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_bucket.setdefault(job["row"]["bucket"], []).append(i)
        runs = [group for members in by_bucket.values()
                for group in groups(members, lambda i: len(jobs[i]["indices"]), batch_frames)]
        outcomes = step.engine.map(_EncodeClips(bucket, objects, limits, step, vae_factory, lat.dtype),
                                   [[jobs[i] for i in group] for group in runs], log=log, models=True)
        count_remote(stats, step.engine, len(runs))
        rows_of_job: dict[int, tuple[dict, str | None]] = {}
        for group, outcome in zip(runs, outcomes, strict=True):
            if outcome.row is not None:
                stats.add("model_batches", outcome.row["runs"])
            for i, row in zip(group, outcome.row["rows"] if outcome.row is not None else [None] * len(group),
                              strict=True):
                if row is None:  # the whole run was lost (its worker died): every clip of it, transient
                    rows_of_job[i] = ({**jobs[i]["row"], "status": "error", "reason": outcome.reason},
                                      TRANSIENT if outcome.transient else FINAL)
                else:
                    stats.merge(row.pop("_stats", {}))
                    rows_of_job[i] = row, row.pop("failure", None)
        for i, (key_of_row, version) in enumerate(job_keys):
            row, failure = rows_of_job[i]
            new_rows.append(step.stamp(key_of_row, row, version, failure))
            if row["status"] == "ok":
                log(f"latents {row['clip_id']}: {row['bucket']}, {row['frames_decoded']} frames of "
                    f"{row['frames_from']} decoded for {row['frames']}")
    for row in new_rows:  # the encode run (cohort) a row was written by: what the latent-statistics check judges
        row["encode_run"] = run_id
    rows = step.complete(new_rows)
    stats.seconds = time.perf_counter() - started
    return sorted(rows, key=lambda r: (r["clip_id"], r["producer_version"])), stats


def _current_rungs(ladder: pd.DataFrame | None, clips: dict[str, dict],
                   version_of: Callable[[dict], RowVersion]) -> dict[str, list[dict]]:
    """The clip's ``ok`` rungs of the current ladder version (and inputs), per clip_id."""
    out: dict[str, list[dict]] = {}
    for r in records(ladder) if ladder is not None else []:
        if r["status"] == "ok" and r["clip_id"] in clips and matches(r, version_of(clips[r["clip_id"]])):
            out.setdefault(r["clip_id"], []).append(r)
    return out


def pick_rung(rungs: Sequence[dict], min_short_side: int, fps: float | None) -> dict | None:
    """The cheapest rung to read a bucket from: the smallest one whose short side is at least
    ``min_short_side`` (never upscale a rung where the source had more pixels) and whose rate is at
    least ``fps`` (when sampling at a set rate); lower rates first on ties. None: read the raw file."""
    fitting = [r for r in rungs if int(r["short_side"]) >= min_short_side and (not fps or float(r["fps"]) >= fps)]
    return min(fitting, key=lambda r: (int(r["short_side"]), float(r["fps"]))) if fitting else None


@contextlib.contextmanager
def blob_spec(objects: ObjectStore, key: str, scratch: str):
    """A source spec for a stored blob: its local path, or a scratch copy (S3)."""
    local = objects.local_path(key)
    if local:
        yield {"path": local}
        return
    fd, path = tempfile.mkstemp(dir=scratch, suffix=os.path.splitext(key)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(objects.get_bytes(key))
        yield {"path": path}
    finally:
        os.unlink(path)


def _upright_size(video: dict, analysis_w: int, analysis_h: int) -> tuple[int, int]:
    """The source's upright frame size (probe's display size), else the analysis frame's."""
    w, h = video.get("display_width"), video.get("display_height")
    if w and h:
        return int(w), int(h)
    return analysis_w, analysis_h


class _EncodeClips:
    """A group of clips of one shape bucket: each clip's frames read in the sandbox, all of them
    encoded by the VAE in one run, each clip's latents written (picklable: it may run on a Ray model
    actor, which keeps the VAE it built). Returns ``rows``, one per clip, and the VAE ``runs``: a clip whose frames cannot
    be read gets its own error row; when the run fails, the clips are encoded one at a time, so that
    only a clip that breaks the VAE gets an error row."""

    def __init__(self, bucket: ReadOnlyBucket, objects: ObjectStore, limits: dict, step: Step,
                 vae_factory: Callable[[], Any], dtype: str):
        self.bucket, self.objects, self.limits, self.step = bucket, objects, limits, step
        self.vae_factory, self.dtype = vae_factory, dtype

    def __call__(self, group: list[dict]) -> dict:
        rows: list[dict] = []
        read: list[tuple[int, np.ndarray, float]] = []  # (clip in group, frames, seconds to read)
        for n, job in enumerate(group):
            t0 = time.perf_counter()
            outcome = self._read(job)
            if isinstance(outcome, dict):
                rows.append(outcome)
            else:
                rows.append({**job["row"], "frames_decoded": outcome[1]["frames_decoded"], "_stats": outcome[1]})
                read.append((n, outcome[0], time.perf_counter() - t0))
        if not read:
            return {"rows": rows, "runs": 0}
        vae = self.vae_factory()
        t0 = time.perf_counter()
        try:
            encoded: list = vae.encode_batch([frames for _, frames, _ in read])
            runs = 1
        except Exception:  # noqa: BLE001 - find the clip that breaks the VAE
            encoded, runs = [], 0
            for _, frames, _ in read:
                try:
                    encoded.append(vae.encode_batch([frames])[0])
                    runs += 1
                except Exception as exc:  # noqa: BLE001 - one clip's failure is its own row, retried
                    encoded.append(exc)
        encode_s = (time.perf_counter() - t0) / len(read)
        for (n, frames, read_s), latents in zip(read, encoded, strict=True):
            row, counters = rows[n], rows[n].pop("_stats")
            if isinstance(latents, Exception):
                rows[n] = {**row, "status": "error", "reason": f"{latents.__class__.__name__}: {latents}"[:300],
                           "failure": TRANSIENT}
                continue
            counters.update(model_calls=1, frames_encoded=len(frames))
            rows[n] = {**self._write(group[n], row, latents), "seconds": round(read_s + encode_s, 4),
                       "_stats": counters}
        return {"rows": rows, "runs": runs}

    def _read(self, job: dict) -> dict | tuple[np.ndarray, dict]:
        """The clip's frames and read counters, or its error row."""
        step, row, indices, crop, size = self.step, job["row"], job["indices"], job["crop"], job["size"]
        try:
            if "rung" in job:
                rung = job["rung"]
                with blob_spec(self.objects, rung["blob_key"], step.scratch) as spec:
                    result = tasks.read_sequential_frames(step.sandbox, spec, self.limits, float(rung["duration_s"] or 0.0),
                                                          indices, crop, size)
            else:
                with step_source(step, self.bucket, job["video"]) as spec:
                    result = tasks.read_frames(step.sandbox, spec, self.limits, job["clip"], job["pts"], indices,
                                               job["rotation"], crop, size, job["skip"])
            failure = None if result.ok else f"reading frames failed: {result.error}"
            final = not result.ok and not result.transient
        except (OSError, KeyError, Failure) as exc:
            failure, final = f"cannot read {row['frames_from']}: {exc}", False
        if failure:
            return {**row, "status": "error", "reason": failure, "failure": FINAL if final else TRANSIENT}
        decoded = int(result.value["frames_decoded"])
        counters = {"frames_decoded": decoded, "read_from_ladder" if "rung" in job else "read_from_raw": 1}
        if "rung" not in job:
            counters["raw_frames_decoded"] = decoded
        return result.value["frames"], counters

    def _write(self, job: dict, row: dict, latents) -> dict:
        clip_stats = latent_stats(latents)
        shape = json.dumps(list(latents.shape))
        producer, inputs = job["version"]
        meta = {"clip_id": row["clip_id"], "producer_version": producer, "input_version": inputs,
                "bucket": row["bucket"], "crop": row["crop"], "shape": shape, "frame_indices": row["frame_indices"],
                **{k: str(v) for k, v in clip_stats.items()}}
        self.objects.put_if_absent(job["key"], latents_bytes(latents, self.dtype, meta))
        return {**row, "status": "ok", "latent_shape": shape, **clip_stats}


def _base_row(clip: dict, dtype: str, resolution: int) -> dict[str, Any]:
    return {"clip_id": clip["clip_id"], "asset_id": clip["asset_id"], "source_shard": clip["source_shard"],
            "tier": clip.get("tier"), "resolution": resolution, "status": "error", "reason": None, "bucket": None, "frames": None,
            "width": None, "height": None, "aspect_ratio": None, "crop": None, "frame_indices": None,
            "latent_key": None, "latent_shape": None, "frames_from": "raw", "dtype": dtype, "mean": None, "std": None,
            "nan_count": None, "inf_count": None, "channel_mean": None, "channel_std": None, "encode_run": None,
            "frames_decoded": 0, "seconds": None}
