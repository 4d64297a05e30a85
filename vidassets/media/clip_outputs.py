"""Per-partition work for the training-facing media outputs of selected clips (no Dagster):
``clip_ladder`` (every rung from one decode per clip) and ``clip_audio`` (the clip's audio span,
its sync status and light signals). Rows are reused per (clip, rung / audio, producer version) while
their inputs are unchanged; rows of other versions stay beside them."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable

import pandas as pd

from vidassets.config import AudioSettings, LadderSettings, ProbeSettings
from vidassets.media.drop_steps import SkippableFrames, read_parquet_blob
from vidassets.media.image import is_image
from vidassets.media.ladder import center_crop, nearest_aspect
from vidassets.media.source import step_source
from vidassets.runtime.engine import Engine
from vidassets.runtime.step import Failure, Step, count_remote
from vidassets.runtime.tasks import wall_budget
from vidassets.storage.objects import ObjectStore, ReadOnlyBucket
from vidassets.storage.rows import FINAL, TRANSIENT, RowVersion, StepStats, records
from vidassets.storage.tables import put_blob

Log = Callable[[str], None]


def rungs_for(lad: LadderSettings, tier: str | None, source_fps: float, short_side: int,
              still: bool = False) -> list[dict]:
    """The rungs a clip gets: every base short side not above the source's (at least the smallest),
    the T0-only ones for T0 clips, and a high-frame-rate rung for fast sources. A still image gets
    none (its latents and shards read the image itself)."""
    if still:
        return []
    sides = list(lad.short_sides) + (list(lad.t0_short_sides) if tier == "T0" else [])
    kept = sorted({s for s in sides if s <= short_side} or {min(sides)})
    rungs = [{"name": f"{s}p{lad.fps:g}", "short_side": s, "fps": lad.fps} for s in kept]
    if lad.high_fps and source_fps >= lad.high_fps:
        s = min(lad.high_fps_short_side, short_side)
        rungs.append({"name": f"{s}p{lad.high_fps:g}", "short_side": s, "fps": lad.high_fps})
    return rungs


def _clip_inputs(clip: dict, analysis: dict, objects: ObjectStore, cache: dict) -> tuple[list[int], list[float]]:
    key = analysis["signals_blob"]
    if key not in cache:
        signals = read_parquet_blob(objects, key)
        cache[key] = (signals["pts"].tolist(), signals["time_s"].tolist())
    return cache[key]


def ladder_partition(bucket: ReadOnlyBucket, objects: ObjectStore, selected: list[dict], clips: pd.DataFrame,
                     analysis: pd.DataFrame, videos: dict[str, dict], previous: pd.DataFrame,
                     version_of: Callable[[dict], RowVersion], lad: LadderSettings, probe: ProbeSettings, max_runs: int, log: Log = lambda _: None,
                     packet_index: pd.DataFrame | None = None, engine: Engine | None = None) -> tuple[list[dict], StepStats]:
    started = time.perf_counter()
    encoder = f"{lad.codec}+crf{lad.crf}+{lad.preset}+threads{lad.encoder_threads}+av{_av_version()}"
    step = Step(previous, lambda r: (r["clip_id"], r["rung"], r["producer_version"]), max_runs, probe.memory_mb, log,
                engine, isolation=probe.isolation)
    stats = step.stats
    stats.rows_in = len(selected)
    decodes = 0
    clip_by_id = {r["clip_id"]: r for r in records(clips)}
    analysis_by_asset = {r["asset_id"]: r for r in records(analysis)}
    new_rows: list[dict] = []
    cache: dict = {}
    skippable = SkippableFrames(objects, packet_index)
    limits = probe.model_dump()
    jobs: list[dict] = []
    job_versions: list[RowVersion] = []
    with step:
        for sel in selected:
            clip = {**clip_by_id[sel["clip_id"]], "tier": sel.get("tier")}
            version = version_of(clip)  # the rung reads the clip's frames: its window names them
            a = analysis_by_asset[clip["asset_id"]]
            video = videos[clip["asset_id"]]
            width, height = int(video.get("display_width") or a["analysis_width"]), int(video.get("display_height") or a["analysis_height"])
            fps = float(a.get("fps") or 0.0)
            rungs = rungs_for(lad, clip["tier"], fps, min(width, height), is_image(clip))
            todo = step.due(((clip["clip_id"], r["name"], version.producer), version, r) for r in rungs)
            if not todo:
                continue
            aspect = nearest_aspect(width, height, lad.aspect_ratios)
            crop = center_crop(width, height, aspect)
            pts, times = _clip_inputs(clip, a, objects, cache)
            skip = skippable.between(clip["asset_id"], int(pts[int(clip["first_frame"])]), int(pts[int(clip["last_frame"])]))
            base = {"clip_id": clip["clip_id"], "asset_id": clip["asset_id"], "source_shard": clip["source_shard"],
                    "tier": clip["tier"], "source_fps": fps, "aspect_ratio": aspect, "crop": json.dumps(list(crop)),
                    "crop_baked": lad.bake_crop, "encoder_version": encoder}
            jobs.append({"video": video, "base": base, "todo": todo,
                         "budget": wall_budget(limits, float(clip["duration_s"]) * (1 + len(todo)), 0),
                         "args": {"frame_pts": pts, "frame_times": times, "first_frame": int(clip["first_frame"]),
                                  "last_frame": int(clip["last_frame"]), "rotation": int(a.get("rotation") or 0),
                                  "rungs": todo, "codec": lad.codec, "crf": lad.crf, "preset": lad.preset,
                                  "crop": list(crop) if lad.bake_crop else None, "threads": lad.encoder_threads,
                                  "nonref_pts": skip}})
            job_versions.append(version)
        # one decode per clip for all its rungs, on the step's engine (Ray tasks when configured)
        outcomes = step.engine.map(_LadderClip(bucket, objects, step), jobs, log=log)
        count_remote(stats, step.engine, len(jobs))
        for job, version, outcome in zip(jobs, job_versions, outcomes, strict=True):
            base, todo = job["base"], job["todo"]
            done = outcome.row or {"error": outcome.reason, "transient": outcome.transient}
            if done.get("error"):
                for r in todo:
                    new_rows.append(step.stamp((base["clip_id"], r["name"], version.producer),
                                                {**base, **_empty_rung(r), "status": "error", "reason": done["error"]},
                                                version, TRANSIENT if done["transient"] else FINAL))
                continue
            decodes += 1
            stats.frames_decoded += done["decoded"]
            for row in done["rows"]:
                new_rows.append(step.stamp((base["clip_id"], row["rung"], version.producer), row, version))
            missing = {r["name"] for r in todo} - {row["rung"] for row in done["rows"]}
            for r in todo:  # a rung the encoder did not return is a row too
                if r["name"] in missing:
                    new_rows.append(step.stamp((base["clip_id"], r["name"], version.producer),
                                                {**base, **_empty_rung(r), "status": "error",
                                                 "reason": "the encoder returned no file for this rung"}, version, TRANSIENT))
            log(f"ladder {base['clip_id']}: {len(todo)} rung(s) from one decode of {done['decoded']} frames")
    rows = step.complete(new_rows)
    stats.extra["clip_decodes"] = decodes
    stats.extra["decodes_per_clip"] = round(decodes / max(1, len({r["clip_id"] for r in new_rows})), 3)
    stats.seconds = time.perf_counter() - started
    return sorted(rows, key=lambda r: (r["clip_id"], r["rung"], r["producer_version"])), stats


class _LadderClip:
    """One clip's rungs from one decode in the sandbox, written as blobs (picklable: it may run on a
    Ray worker). Returns the rung rows and the frames decoded, or the failure."""

    def __init__(self, bucket: ReadOnlyBucket, objects: ObjectStore, step: Step):
        self.bucket, self.objects, self.step = bucket, objects, step

    def __call__(self, job: dict) -> dict:
        step, base = self.step, job["base"]
        out_dir = tempfile.mkdtemp(dir=step.scratch)
        try:
            with step_source(step, self.bucket, job["video"]) as spec:
                result = step.sandbox.run("ladder", {**job["args"], "spec": spec, "out_dir": out_dir},
                                          cpu_seconds=job["budget"] * 2, wall_seconds=job["budget"])
        except (OSError, KeyError, Failure) as exc:
            return {"error": f"cannot read source: {exc}", "transient": True}
        if not result.ok:
            return {"error": result.error, "transient": result.transient}
        decoded = int(result.value["frames_decoded"])
        rows = []
        for rung in result.value["rungs"]:
            with open(rung["path"], "rb") as f:
                key = put_blob(self.objects, "ladder", f.read(), ".mp4")
            os.unlink(rung["path"])
            rows.append({**base, "rung": rung["name"], "status": "ok", "reason": None,
                         "short_side": min(rung["width"], rung["height"]), "width": rung["width"],
                         "height": rung["height"], "fps": rung["fps"], "frames": rung["frames"], "bytes": rung["bytes"],
                         "bitrate_bps": round(rung["bytes"] * 8 / rung["duration_s"], 1) if rung["duration_s"] else None,
                         "duration_s": round(rung["duration_s"], 4), "blob_key": key, "frames_decoded": decoded})
        return {"rows": rows, "decoded": decoded}


def _empty_rung(rung: dict) -> dict:
    return {"rung": rung["name"], "short_side": rung["short_side"], "width": None, "height": None, "fps": rung["fps"],
            "frames": None, "bytes": None, "bitrate_bps": None, "duration_s": None, "blob_key": None, "frames_decoded": 0}


def _av_version() -> str:
    import av

    return av.__version__


def audio_partition(bucket: ReadOnlyBucket, objects: ObjectStore, selected: list[dict], clips: pd.DataFrame,
                    probe: pd.DataFrame, videos: dict[str, dict], previous: pd.DataFrame,
                    version_of: Callable[[dict], RowVersion], au: AudioSettings, limits_of: ProbeSettings, max_runs: int,
                    log: Log = lambda _: None, engine: Engine | None = None) -> tuple[list[dict], StepStats]:
    started = time.perf_counter()
    clip_by_id = {r["clip_id"]: r for r in records(clips)}
    has_audio = {r["asset_id"]: bool(r["has_audio"]) for r in records(probe)} if len(probe) else {}
    items = [{**clip_by_id[sel["clip_id"]], "tier": sel.get("tier")} for sel in selected]
    with Step(previous, lambda r: (r["clip_id"], r["producer_version"]), max_runs, limits_of.memory_mb, log,
              engine, isolation=limits_of.isolation) as step:
        step.stats.rows_in = len(selected)
        rows = step.run(items, lambda c: (c["clip_id"], version_of(c).producer), version_of,
                        _AudioClip(bucket, objects, step, au, limits_of.model_dump(), has_audio, videos),
                        lambda c, exc: {**_audio_row(c), "audio_status": "broken", "reason": exc.reason},
                        label=lambda c: f"audio {c['clip_id']}")
    stats = step.stats
    rows = step.with_others(rows)
    for row in rows[len(rows) - len(items):]:
        stats.count(row["audio_status"])
    stats.seconds = time.perf_counter() - started
    return sorted(rows, key=lambda r: (r["clip_id"], r["producer_version"])), stats


def _audio_row(clip: dict) -> dict:
    return {"clip_id": clip["clip_id"], "asset_id": clip["asset_id"], "source_shard": clip["source_shard"],
            "tier": clip.get("tier"), "audio_status": "none", "reason": None, "drift_ms": None, "codec": None,
            "rate": None, "channels": None, "blob_key": None, "duration_s": None, "loudness_dbfs": None,
            "peak_dbfs": None, "silence_share": None, "clipping_share": None, "content_guess": None}


class _AudioClip:
    """One clip's audio cut, measured and re-encoded in the sandbox (speech profile, a second pass at
    the music profile for music), stored as a blob (picklable: it may run on a Ray worker)."""

    def __init__(self, bucket: ReadOnlyBucket, objects: ObjectStore, step: Step, au: AudioSettings, limits: dict,
                 has_audio: dict[str, bool], videos: dict[str, dict]):
        self.bucket, self.objects, self.step, self.au, self.limits = bucket, objects, step, au, limits
        self.has_audio, self.videos = has_audio, videos

    def __call__(self, clip: dict) -> dict:
        step, au, row = self.step, self.au, _audio_row(clip)
        if not self.has_audio.get(clip["asset_id"]):
            return {**row, "reason": "the source has no audio track"}
        budget = wall_budget(self.limits, float(clip["duration_s"]), 0)
        value, failure, written = None, None, []
        for profile in ("speech", "music"):
            codec, rate, channels, bitrate = ((au.codec, au.rate, au.channels, au.bitrate) if profile == "speech" else
                                              (au.music_codec, au.music_rate, au.music_channels, au.music_bitrate))
            suffix = {"libopus": ".ogg", "aac": ".m4a", "flac": ".flac"}[codec]
            out_path = os.path.join(step.scratch, f"{clip['clip_id']}-{profile}{suffix}")
            written.append(out_path)
            try:
                with step_source(step, self.bucket, self.videos[clip["asset_id"]]) as spec:
                    result = step.sandbox.run("audio", {
                        "spec": spec, "start_s": float(clip["start_s"]), "end_s": float(clip["end_s"]), "rate": rate,
                        "channels": channels, "codec": codec, "bitrate": bitrate,
                        "max_drift_s": au.max_drift_ms / 1000, "out_path": out_path,
                    }, cpu_seconds=budget, wall_seconds=budget)
            except (OSError, KeyError, Failure) as exc:
                value, failure = {"audio_status": "broken", "reason": f"cannot read source: {exc}"}, TRANSIENT
                break
            if not result.ok:
                value = {"audio_status": "broken", "reason": result.error}
                failure = TRANSIENT if result.transient else FINAL
                break
            value = {**result.value, "codec": codec, "rate": rate, "channels": channels}
            if value.get("content_guess") != "music" or profile == "music":
                break  # music gets a second pass at the music profile
        if value.get("path") and os.path.exists(value["path"]):
            with open(value["path"], "rb") as f:
                row["blob_key"] = put_blob(self.objects, "audio", f.read(), os.path.splitext(value["path"])[1])
            row.update(codec=value["codec"], rate=value["rate"], channels=value["channels"])
        row.update(audio_status=value["audio_status"], reason=value.get("reason"),
                   drift_ms=round(value["drift_s"] * 1000, 1) if value.get("drift_s") is not None else None,
                   **{k: value.get(k) for k in ("duration_s", "loudness_dbfs", "peak_dbfs", "silence_share",
                                                 "clipping_share", "content_guess")})
        for path in written:  # a Ray worker's scratch directory outlives the item
            if os.path.exists(path):
                os.unlink(path)
        if row["audio_status"] == "broken" and failure is None:
            failure = FINAL  # the worker read the file and found its audio broken
        return {**row, "failure": failure}
