"""Per-partition media work (no Dagster): which rows to (re)compute, running them in the sandbox,
and the catalog rows they become. Each function returns (rows, stats) for a thin asset to write.

Row-exact reuse: a row whose (asset_id, producer version) already exists is kept as it is, so a
re-run costs only what changed. Quarantine is sticky across versions unless explicitly retried.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import Settings
from vidassets.media import tasks
from vidassets.media.analysis import SIGNAL_NAMES
from vidassets.media.clips import clip_rows
from vidassets.media.packet_index import nonref_between
from vidassets.media.sandbox import Sandbox, TaskResult
from vidassets.media.source import source_spec
from vidassets.storage.objects import ObjectStore, ReadOnlyBucket
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
from vidassets.storage.tables import put_blob

Log = Callable[[str], None]


@dataclass
class Stats:
    rows_in: int = 0
    computed: int = 0
    reused: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    frames_decoded: int = 0
    frames_counted: int = 0
    seconds: float = 0.0

    def count(self, status: str) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: (None if _isna(v) else v) for k, v in r.items()} for r in frame.to_dict("records")]


def _isna(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def split_reusable(previous: pd.DataFrame, wanted: Iterable[str], version: str,
                   sticky: Callable[[dict], bool] = lambda r: False) -> tuple[list[dict], list[str]]:
    """(rows to keep, asset_ids to compute) for the wanted asset_ids."""
    old = {r["asset_id"]: r for r in records(previous)} if len(previous) else {}
    keep, todo = [], []
    for asset_id in wanted:
        row = old.get(asset_id)
        if row is not None and (row["producer_version"] == version or sticky(row)):
            keep.append(row)
        else:
            todo.append(asset_id)
    return keep, todo


def canonical_videos(split: pd.DataFrame, inventory: pd.DataFrame) -> list[dict[str, Any]]:
    """Canonical (not exact-duplicate) videos of a split table (train or eval side), with what a reader needs."""
    canonical = split[split["duplicate_of"].isna()]
    inv = inventory.set_index("uri")
    out = []
    for row in records(canonical):
        src = inv.loc[row["uri"]]
        out.append({**row, "key": src["key"], "member": None if _isna(src["member"]) else src["member"],
                    "member_offset": None if _isna(src["member_offset"]) else int(src["member_offset"]),
                    "size": int(src["size"])})
    return out


def probe_partition(bucket: ReadOnlyBucket, videos: list[dict], previous: pd.DataFrame, settings: Settings,
                    retry_quarantined: bool = False, log: Log = lambda _: None) -> tuple[list[dict], Stats]:
    version = settings.versions.video_probe
    limits = settings.probe.model_dump()
    stats = Stats(rows_in=len(videos))
    by_id = {v["asset_id"]: v for v in videos}
    rows, todo = split_reusable(previous, by_id, version,
                                sticky=lambda r: r["status"] == "quarantined" and not retry_quarantined)
    stats.reused = len(rows)
    with Sandbox(settings.probe.memory_mb) as sandbox, tempfile.TemporaryDirectory(prefix="vidassets-") as scratch:
        for i, asset_id in enumerate(todo):
            video = by_id[asset_id]
            started = time.perf_counter()
            try:
                with source_spec(bucket, video, scratch) as spec:
                    facts = tasks.probe(sandbox, spec, limits, video["size"])
            except OSError as exc:  # the object vanished or cannot be fetched: a reason, not a crash
                facts = {"status": "quarantined", "reason": f"cannot read source: {exc}", "attempts": 0, "frames_decoded": 0}
            rows.append(_probe_row(video, facts, version, time.perf_counter() - started))
            stats.computed += 1
            stats.frames_decoded += int(facts.get("frames_decoded") or 0)
            log(f"probe {i + 1}/{len(todo)} {video['uri']}: {facts['status']}")
    for row in rows:
        stats.count(row["status"])
    return rows, stats


_PROBE_FIELDS = ("container", "codec", "profile", "pix_fmt", "width", "height", "display_width", "display_height",
                 "rotation", "fps_avg", "fps_base", "vfr", "duration_s", "declared_frames", "counted_frames",
                 "count_method", "has_audio", "audio_codec", "bitrate", "frames_decoded", "attempts")


def _probe_row(video: Mapping[str, Any], facts: Mapping[str, Any], version: str, seconds: float) -> dict[str, Any]:
    row = {k: facts.get(k) for k in _PROBE_FIELDS}
    row.update(asset_id=video["asset_id"], uri=video["uri"], source_shard=video["source_shard"],
               status=facts["status"], reason=facts.get("reason"), seconds=round(seconds, 4),
               producer_version=version)
    row["attempts"] = int(row["attempts"] or 0)
    row["frames_decoded"] = int(row["frames_decoded"] or 0)
    return row


def usable(probe_rows: list[dict]) -> list[dict]:
    return [r for r in probe_rows if r["status"] in ("ok", "salvaged")]


def read_parquet_blob(objects: ObjectStore, key: str) -> pd.DataFrame:
    return from_parquet_bytes(objects.get_bytes(key))


class SkippableFrames:
    """Non-reference frames a clip reader may leave undecoded, from the stored packet indexes
    (``frame_index`` rows; each asset's index is read once). No index for an asset: nothing skipped."""

    def __init__(self, objects: ObjectStore, packet_index: pd.DataFrame | None) -> None:
        self._objects = objects
        self._blobs = ({r["asset_id"]: r["index_blob"] for r in records(packet_index) if r.get("index_blob")}
                       if packet_index is not None and len(packet_index) else {})
        self._packets: dict[str, pd.DataFrame] = {}

    def between(self, asset_id: str, first_pts: int, last_pts: int) -> list[int]:
        if asset_id in self._blobs and asset_id not in self._packets:
            self._packets[asset_id] = read_parquet_blob(self._objects, self._blobs[asset_id])
        return nonref_between(self._packets.get(asset_id), first_pts, last_pts)


@dataclass
class _Plan:
    facts: dict[str, dict]
    videos: dict[str, dict]
    rows: list[dict]
    todo: list[str]
    stats: Stats


def _plan(videos: list[dict], probe_rows: list[dict], previous: pd.DataFrame, version: str) -> _Plan:
    """What to compute for the usable (ok/salvaged) videos, and which rows to keep as they are."""
    facts = {r["asset_id"]: r for r in usable(probe_rows)}
    by_id = {v["asset_id"]: v for v in videos if v["asset_id"] in facts}
    rows, todo = split_reusable(previous, by_id, version)
    return _Plan(facts, by_id, rows, todo, Stats(rows_in=len(by_id), reused=len(rows)))


def _run_in_sandbox(bucket: ReadOnlyBucket, settings: Settings, plan: _Plan, task: Callable[[Sandbox, dict, dict], Any]):
    """(asset_id, result of ``task(sandbox, spec, facts)`` or a TaskResult failure, seconds) per video to do."""
    with Sandbox(settings.probe.memory_mb) as sandbox, tempfile.TemporaryDirectory(prefix="vidassets-") as scratch:
        for asset_id in plan.todo:
            started = time.perf_counter()
            try:
                with source_spec(bucket, plan.videos[asset_id], scratch) as spec:
                    result = task(sandbox, spec, plan.facts[asset_id])
            except OSError as exc:  # the object vanished or cannot be fetched: a reason, not a crash
                result = TaskResult(False, error=f"cannot read source: {exc}")
            plan.stats.computed += 1
            yield asset_id, result, time.perf_counter() - started


def index_partition(bucket: ReadOnlyBucket, objects: ObjectStore, videos: list[dict], probe_rows: list[dict],
                    previous: pd.DataFrame, settings: Settings, log: Log = lambda _: None) -> tuple[list[dict], Stats]:
    version = settings.versions.frame_index
    plan = _plan(videos, probe_rows, previous, version)
    limits = settings.probe.model_dump()
    rows = plan.rows
    for asset_id, result, seconds in _run_in_sandbox(
        bucket, settings, plan, lambda box, spec, fact: tasks.packet_index(box, spec, limits, fact)
    ):
        video = plan.videos[asset_id]
        row: dict[str, Any] = {"asset_id": asset_id, "uri": video["uri"], "source_shard": video["source_shard"],
                               "producer_version": version, "seconds": round(seconds, 4)}
        if not result.ok:
            row.update(status="failed", reason=result.error)
        else:
            value = result.value
            row["index_blob"] = put_blob(objects, "packet_index", to_parquet_bytes(pd.DataFrame(value["arrays"])), ".parquet")
            row.update({k: value["profile"].get(k) for k in (
                "codec", "packets", "keyframes", "gop_mean", "gop_max", "keyframe_interval_s", "i_share",
                "p_share", "b_share", "frame_types_known", "nonref_share", "vfr", "duration_s", "bitrate_bps",
                "bits_per_pixel")})
            row.update(status="partial" if value["error"] else "ok", reason=value["error"])
        rows.append(row)
        log(f"frame_index {video['uri']}: {row['status']}")
    for row in rows:
        plan.stats.count(row["status"])
    return rows, plan.stats


def analysis_params(settings: Settings) -> dict[str, Any]:
    return settings.analysis.model_dump()


def analyze_partition(bucket: ReadOnlyBucket, objects: ObjectStore, videos: list[dict], probe_rows: list[dict],
                      previous: pd.DataFrame, previous_frames: pd.DataFrame, settings: Settings,
                      log: Log = lambda _: None) -> tuple[list[dict], list[dict], Stats]:
    """The one decode pass for every usable video: analysis rows and context-frame rows."""
    version = settings.versions.video_analysis
    plan = _plan(videos, probe_rows, previous, version)
    kept = {r["asset_id"] for r in plan.rows}
    frame_rows = [r for r in records(previous_frames) if r["asset_id"] in kept] if len(previous_frames) else []
    params = analysis_params(settings)
    limits = settings.probe.model_dump()
    rows, stats = plan.rows, plan.stats
    attempts: dict[str, int] = {}

    def analyze(box: Sandbox, spec: dict, fact: dict) -> TaskResult:
        result, attempts[fact["asset_id"]] = tasks.analyze(box, spec, limits, params, fact)
        return result

    for asset_id, result, seconds in _run_in_sandbox(bucket, settings, plan, analyze):
        video, fact = plan.videos[asset_id], plan.facts[asset_id]
        row = {"asset_id": asset_id, "uri": video["uri"], "source_shard": video["source_shard"],
               "attempts": attempts.get(asset_id, 0), "counted_frames": fact.get("counted_frames"),
               "rotation": fact.get("rotation") or 0, "producer_version": version, "seconds": round(seconds, 4)}
        if not result.ok:
            row.update(status="failed", reason=result.error, frames_decoded=0, context_frames=0, decode_errors=0,
                       cut_frames="[]", cut_seconds="[]", shots="[]", num_shots=0)
        else:
            row.update(_analysis_row(objects, result.value, fact))
            for ctx in result.value["context"]:
                frame_rows.append({
                    "asset_id": asset_id, "frame_index": ctx["frame_index"], "time_s": ctx["time_s"],
                    "blob_key": put_blob(objects, "context_frames", ctx["jpeg"], ".jpg"),
                    "width": ctx["width"], "height": ctx["height"], "pdq_hash": ctx["pdq"],
                    "pdq_quality": ctx["pdq_quality"], "producer_version": version,
                })
        rows.append(row)
        stats.frames_decoded += int(row["frames_decoded"])
        stats.frames_counted += int(fact.get("counted_frames") or 0)
        log(f"analysis {video['uri']}: {row['status']}, {row['frames_decoded']} frames decoded")
    for row in rows:
        stats.count(row["status"])
    return rows, frame_rows, stats


def _analysis_row(objects: ObjectStore, value: Mapping[str, Any], fact: Mapping[str, Any]) -> dict[str, Any]:
    pts = np.asarray(value["frame_pts"], dtype=np.int64)
    times = (pts - pts[0]) * float(value["time_base"]) if len(pts) else np.zeros(0)
    signals = pd.DataFrame(np.asarray(value["signals"]), columns=list(SIGNAL_NAMES))
    signals.insert(0, "time_s", times)
    signals.insert(0, "pts", pts)
    signals.insert(0, "frame_index", np.arange(len(pts), dtype=np.int64))
    counted = int(fact.get("counted_frames") or 0)
    n = int(value["frames_decoded"])
    problems = []
    if value["decode_error_count"]:
        problems.append(f"{value['decode_error_count']} decode error(s): {'; '.join(value['decode_errors'][:2])}")
    if value.get("stopped"):
        problems.append(value["stopped"])
    if counted and n < counted:
        problems.append(f"decoded {n} of {counted} counted frames")
    return {
        "status": "partial" if problems else "ok",
        "reason": " | ".join(problems) or None,
        "frames_decoded": n,
        "fps": value["fps"],
        "analysis_width": value["analysis_size"][0],
        "analysis_height": value["analysis_size"][1],
        "num_shots": len(value["shots"]),
        "cut_frames": json.dumps(value["cuts"]),
        "cut_seconds": json.dumps([round(float(times[c]), 4) for c in value["cuts"]]),
        "shots": json.dumps(value["shots"]),
        "signals_blob": put_blob(objects, "frame_signals", to_parquet_bytes(signals), ".parquet"),
        "context_frames": len(value["context"]),
        "decode_errors": int(value["decode_error_count"]),
    }


def clip_partition(objects: ObjectStore, analysis_rows: list[dict], previous: pd.DataFrame,
                   settings: Settings) -> tuple[list[dict], Stats]:
    """Training windows from saved shots and frame times; no decode. Cheap enough to recompute
    whole; ``clip_id`` is deterministic, so unchanged clips keep their ids (counted as reused)."""
    version = settings.versions.clips
    params = settings.clips.model_dump()
    done = [r for r in analysis_rows if r["status"] in ("ok", "partial") and r.get("signals_blob")]
    stats = Stats(rows_in=len(done))
    existing = set(previous["clip_id"]) if len(previous) else set()
    rows: list[dict] = []
    for analysis in done:
        signals = read_parquet_blob(objects, analysis["signals_blob"])
        pts = signals["pts"].to_numpy()
        for clip in clip_rows(analysis["asset_id"], json.loads(analysis["shots"]), signals["time_s"].to_numpy(),
                              params, version):
            clip.update(uri=analysis["uri"], source_shard=analysis["source_shard"], producer_version=version,
                        first_pts=int(pts[clip["first_frame"]]), last_pts=int(pts[clip["last_frame"]]),
                        duration_s=round(clip["end_s"] - clip["start_s"], 6))
            rows.append(clip)
    stats.reused = sum(1 for r in rows if r["clip_id"] in existing)
    stats.computed = len(rows) - stats.reused
    return rows, stats
