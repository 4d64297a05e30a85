"""Per-partition media work (no Dagster): probe, packet index, the analysis pass and clips, each a
step over the partition's videos (see ``runtime.step``). Each function returns (rows, stats) for a
thin asset to write.

Row-exact reuse: a row whose producer and input versions are unchanged is kept as it is, so a
re-run costs only what changed; transient failures are tried again by later runs (up to
``execution.max_runs``), deterministic ones (not a video) are final for that version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import AnalysisSettings, ClipSettings, NearDuplicateSettings, ProbeSettings
from vidassets.media.analysis import GRID_NAMES, MODEL_DETECTORS, SIGNAL_NAMES, final_cuts, shots_of
from vidassets.media.clips import clip_rows, image_clip
from vidassets.media.image import is_image
from vidassets.media.packet_index import nonref_between
from vidassets.media.source import step_source
from vidassets.runtime import tasks
from vidassets.runtime.engine import Engine
from vidassets.runtime.step import Failure, Step
from vidassets.storage.objects import ObjectStore, ReadOnlyBucket
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
from vidassets.storage.rows import RowVersion, StepStats, records
from vidassets.storage.tables import put_blob

Log = Callable[[str], None]
ShotModel = Callable[[np.ndarray], np.ndarray]
__all__ = ["records"]


def _isna(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def canonical_videos(split: pd.DataFrame, inventory: pd.DataFrame) -> list[dict[str, Any]]:
    """Canonical (not exact-duplicate) videos of a split table (train or eval side), with what a reader needs."""
    canonical = split[split["duplicate_of"].isna()]
    inv = inventory.set_index("uri")
    out = []
    for row in records(canonical):
        src = inv.loc[row["uri"]]
        out.append({**row, "key": src["key"], "member": None if _isna(src["member"]) else src["member"],
                    "media_type": src["media_type"],
                    "member_offset": None if _isna(src["member_offset"]) else int(src["member_offset"]),
                    "size": int(src["size"]), "source_tier": src.get("source_tier"),
                    "synthetic": bool(src["synthetic"]) if "synthetic" in src and not _isna(src["synthetic"]) else False})
    return out


def probe_partition(bucket: ReadOnlyBucket, videos: list[dict], previous: pd.DataFrame, version: RowVersion,
                    probe: ProbeSettings, max_runs: int, retry_quarantined: bool = False,
                    log: Log = lambda _: None, engine: Engine | None = None) -> tuple[list[dict], StepStats]:
    """Facts and a verdict per video. ``retry_quarantined`` probes final quarantines again too."""
    if retry_quarantined and len(previous):
        previous = previous[previous.status != "quarantined"]
    limits = probe.model_dump()

    def compute(video: dict) -> dict:
        with step_source(step, bucket, video) as spec:
            facts = tasks.probe(step.sandbox, spec, limits, video["size"])
        failure = None
        if facts["status"] == "quarantined":
            failure = "transient" if facts.pop("transient", False) else "final"
        return {**_probe_row(video, facts), "failure": failure}

    def failed(video: dict, exc: Failure) -> dict:
        return _probe_row(video, {"status": "quarantined", "reason": exc.reason, "attempts": 0, "frames_decoded": 0})

    with Step(previous, lambda r: r["asset_id"], max_runs, probe.memory_mb, log, engine,
              isolation=probe.isolation) as step:
        step.stats.rows_in = len(videos)
        rows = step.run(videos, lambda v: v["asset_id"], version, compute, failed, label=lambda v: f"probe {v['uri']}")
        step.stats.frames_decoded = _decoded_now(rows, step)
        return step.finish(rows), step.stats


def _decoded_now(rows: list[dict], step: Step) -> int:
    """Frames decoded by the rows this run computed (reused rows decoded nothing now)."""
    reused = {id(r) for r in step.reuse.rows}
    return sum(int(r.get("frames_decoded") or 0) for r in rows if id(r) not in reused)


_PROBE_FIELDS = ("container", "codec", "profile", "pix_fmt", "width", "height", "display_width", "display_height",
                 "rotation", "fps_avg", "fps_base", "vfr", "duration_s", "declared_frames", "counted_frames",
                 "count_method", "has_audio", "audio_codec", "bitrate", "frames_decoded", "attempts")


def _probe_row(video: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    row = {k: facts.get(k) for k in _PROBE_FIELDS}
    row["media_type"] = facts.get("media_type") or video.get("media_type") or "video"
    row.update(asset_id=video["asset_id"], uri=video["uri"], source_shard=video["source_shard"],
               status=facts["status"], reason=facts.get("reason"), seconds=None)
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


def _usable_step(videos: list[dict], probe_rows: list[dict]) -> tuple[dict[str, dict], list[dict]]:
    """(probe facts by asset_id, videos to work on): the usable (ok/salvaged) ones."""
    facts = {r["asset_id"]: r for r in usable(probe_rows)}
    return facts, [v for v in videos if v["asset_id"] in facts]


def _task_failure(result) -> Failure:
    return Failure(result.error or "worker failed", transient=result.transient)


def index_partition(bucket: ReadOnlyBucket, objects: ObjectStore, videos: list[dict], probe_rows: list[dict],
                    previous: pd.DataFrame, version: RowVersion, probe: ProbeSettings, max_runs: int,
                    log: Log = lambda _: None, engine: Engine | None = None) -> tuple[list[dict], StepStats]:
    facts, todo = _usable_step(videos, probe_rows)
    limits = probe.model_dump()

    def base(video: dict) -> dict:
        return {"asset_id": video["asset_id"], "uri": video["uri"], "source_shard": video["source_shard"], "seconds": None}

    def compute(video: dict) -> dict:
        with step_source(step, bucket, video) as spec:
            result = tasks.packet_index(step.sandbox, spec, limits, facts[video["asset_id"]])
        if not result.ok:
            raise _task_failure(result)
        value = result.value
        row = base(video)
        row["index_blob"] = put_blob(objects, "packet_index", to_parquet_bytes(pd.DataFrame(value["arrays"])), ".parquet")
        row.update({k: value["profile"].get(k) for k in (
            "codec", "packets", "keyframes", "gop_mean", "gop_max", "keyframe_interval_s", "i_share",
            "p_share", "b_share", "frame_types_known", "nonref_share", "vfr", "duration_s", "bitrate_bps",
            "bits_per_pixel")})
        row.update(status="partial" if value["error"] else "ok", reason=value["error"])
        return row

    with Step(previous, lambda r: r["asset_id"], max_runs, probe.memory_mb, log, engine,
              isolation=probe.isolation) as step:
        step.stats.rows_in = len(todo)
        rows = step.run(todo, lambda v: v["asset_id"], version, compute,
                        lambda v, exc: {**base(v), "status": "failed", "reason": exc.reason},
                        label=lambda v: f"frame_index {v['uri']}")
        return step.finish(rows), step.stats


def whole_grid_key(version: RowVersion, asset_id: str) -> str:
    """Where the whole-grid fingerprint of a video (its bytes: ``asset_id``) under ``version`` is
    kept: taken once, by whichever run needs it first (its own drop's, or another drop's that needed
    it to decide a pair), and found there by the others."""
    token = hashlib.sha256(f"{version.producer}|{version.inputs}".encode()).hexdigest()[:16]
    return f"blobs/video_fingerprints/whole_grid/{token}/{asset_id}.json"


def _take_print(step: Step, bucket: ReadOnlyBucket, objects: ObjectStore, video: Mapping[str, Any],
                facts: Mapping[str, Any], index: Mapping[str, Any] | None, near: NearDuplicateSettings,
                limits: Mapping[str, Any], budget: float | None, whole_key: str | None) -> dict[str, Any]:
    """One video's fingerprint: sampled within ``budget`` (stored content-addressed), or on the
    whole grid (``budget`` None, or a budget that did not bind: stored at ``whole_key``). A
    whole-grid print some run already stored there is taken as it is, whatever the budget: nothing
    is decoded. ``whole_grid`` says which print it is."""
    if whole_key is not None and objects.exists(whole_key):
        blob = json.loads(objects.get_bytes(whole_key))
        return {"fingerprint_blob": whole_key, "samples": len(blob["times"]), "frames_decoded": 0,
                "has_audio_fingerprint": blob.get("audio") is not None, "whole_grid": True}
    if not index or not index.get("index_blob"):
        raise Failure("no packet index to plan the fingerprint from", transient=False)
    packets = read_parquet_blob(objects, index["index_blob"])
    packets = {k: packets[k].astype(int).tolist() for k in ("pts", "keyframe", "is_ref", "frame_type")}
    with step_source(step, bucket, video) as spec:
        result = tasks.fingerprint(step.sandbox, spec, limits, facts, packets, near.grid_fps, near.audio, budget)
    if not result.ok:
        raise _task_failure(result)
    value = result.value
    if not value["times"]:
        raise Failure("no sampled frame decoded: " + "; ".join(value["errors"][:2]), transient=False)
    data = json.dumps({k: value[k] for k in ("times", "full", "square", "inner", "quality", "audio")}).encode()
    whole = budget is None or bool(value.get("whole_grid"))
    if whole and whole_key is not None:
        objects.put_if_absent(whole_key, data)
        key = whole_key
    else:
        key = put_blob(objects, "video_fingerprints", data, ".json")
    return {"fingerprint_blob": key, "samples": len(value["times"]), "frames_decoded": int(value["frames_decoded"]),
            "has_audio_fingerprint": value["audio"] is not None, "whole_grid": whole}


def fingerprint_partition(bucket: ReadOnlyBucket, objects: ObjectStore, videos: list[dict], probe_rows: list[dict],
                          index_rows: list[dict], previous: pd.DataFrame, version: RowVersion,
                          whole_grid_version: RowVersion, near: NearDuplicateSettings, probe: ProbeSettings,
                          max_runs: int, log: Log = lambda _: None, engine: Engine | None = None,
                          retake: Callable[[list[dict]], set[str]] | None = None) -> tuple[list[dict], StepStats]:
    """The ingest fingerprint of every usable video, decoding only what ``sample_plan`` picks from
    its packet index within the decode budget (``version``; a stored whole-grid row is reused as it
    is). ``retake(rows)`` names the videos to take again on the whole grid (``whole_grid_version``):
    those the near-duplicate decision could not decide from budgeted samples; it is asked again after
    each retake until it names none not yet retaken, so its last call saw the final rows. Rows carry the facts
    the canonical rule ranks by; the decision columns are left to ``ingest.near_duplicates``."""
    facts, todo = _usable_step(videos, probe_rows)
    indexes = {r["asset_id"]: r for r in index_rows}
    limits = probe.model_dump()

    def base(video: dict) -> dict:
        fact, index = facts[video["asset_id"]], indexes.get(video["asset_id"], {})
        width, height = fact.get("display_width") or fact.get("width"), fact.get("display_height") or fact.get("height")
        bpp = index.get("bits_per_pixel")
        quality = float(bpp) * int(width) * int(height) if bpp and width and height and not _isna(bpp) else None
        return {"asset_id": video["asset_id"], "uri": video["uri"], "source_shard": video["source_shard"],
                "source_tier": video.get("source_tier"), "synthetic": bool(video.get("synthetic")),
                "duration_s": fact.get("duration_s"),
                "width": width, "height": height, "bits_per_pixel": None if _isna(bpp) else bpp,
                "quality_key": quality, "seconds": None}

    def sampled(budget: float | None) -> Callable[[dict], dict]:
        def compute(video: dict) -> dict:
            asset_id = video["asset_id"]
            taken = _take_print(step, bucket, objects, video, facts[asset_id], indexes.get(asset_id), near, limits,
                                budget, whole_grid_key(whole_grid_version, asset_id))
            return {**base(video), "status": "ok", "reason": None, **taken}
        return compute

    def failed(video: dict, exc: Failure) -> dict:
        return {**base(video), "status": "failed", "reason": exc.reason, "samples": 0, "frames_decoded": 0,
                "fingerprint_blob": None, "has_audio_fingerprint": None, "whole_grid": None}

    key = lambda v: v["asset_id"]  # noqa: E731
    label = lambda v: f"fingerprint {v['uri']}"  # noqa: E731
    with Step(previous, key, max_runs, probe.memory_mb, log, engine,
              isolation=probe.isolation) as step:
        step.stats.rows_in = len(todo)
        stored_whole = {v["asset_id"] for v in todo if step.reuse.reusable(v["asset_id"], whole_grid_version)}
        rows = step.run(todo, key, lambda v: whole_grid_version if v["asset_id"] in stored_whole else version,
                        sampled(near.max_decode_share), failed, label=label)
        by_asset = {v["asset_id"]: v for v in todo}

        def current(rows: list[dict]) -> list[dict]:  # what the inventory says now (a reused row keeps
            for row in rows:                             # its fingerprint, not its tags)
                video = by_asset.get(row["asset_id"], {})
                row.update(uri=video.get("uri", row["uri"]), source_tier=video.get("source_tier"),
                           synthetic=bool(video.get("synthetic")))
            return rows

        rows = current(rows)
        decoded = _decoded_now(rows, step)
        tried: set[str] = set()  # each video is retaken at most once
        while retake is not None and near.max_decode_share is not None:
            # a retake can raise new candidate pairs (a whole grid samples other seconds): until none is left
            again = retake(rows) - tried  # one decision per round
            chosen = [v for v in todo if v["asset_id"] in again]
            if not chosen:
                break
            tried |= {v["asset_id"] for v in chosen}
            log(f"fingerprint: {len(chosen)} video(s) taken again on the whole grid (a pair left undecided)")
            retaken = {r["asset_id"]: r for r in current(step.run(chosen, key, whole_grid_version, sampled(None),
                                                                  failed, label=label))}
            decoded += _decoded_now(list(retaken.values()), step)
            # a retake that fails keeps the budgeted fingerprint (its pair stays undecided: the drop's
            # next run tries again); counted and logged with its reason
            lost = {a: r.get("reason") for a, r in retaken.items() if r.get("status") != "ok"}
            for asset_id, reason in sorted(lost.items()):
                log(f"fingerprint: whole-grid retake of {asset_id} failed ({reason}); its budgeted print is kept")
            rows = [r if r["asset_id"] in lost else retaken.get(r["asset_id"], r) for r in rows]
            step.stats.add("whole_grid_retakes", len(chosen))
            if lost:
                step.stats.add("whole_grid_retake_failures", len(lost))
        step.stats.frames_decoded = decoded
        return step.finish(rows), step.stats


def whole_grid_prints(bucket: ReadOnlyBucket, objects: ObjectStore, items: list[dict], version: RowVersion,
                      near: NearDuplicateSettings, probe: ProbeSettings, log: Log = lambda _: None,
                      engine: Engine | None = None) -> tuple[dict[str, str], StepStats]:
    """Whole-grid fingerprints of other drops' videos that a decision needs (``items``: their
    ``video``, probe ``facts`` and packet ``index`` rows), taken here or found where some run took
    them (``whole_grid_key``): asset_id -> fingerprint blob key. Their drops' rows are left as they
    are; a video that cannot be taken is left out (its pair stays undecided)."""
    limits = probe.model_dump()

    def compute(item: dict) -> dict:
        asset_id = item["video"]["asset_id"]
        return {"status": "ok", **_take_print(step, bucket, objects, item["video"], item["facts"], item["index"],
                                              near, limits, None, whole_grid_key(version, asset_id))}

    with Step([], lambda it: it["video"]["asset_id"], 1, probe.memory_mb, log, engine, isolation=probe.isolation) as step:
        rows = step.run(items, lambda it: it["video"]["asset_id"], version, compute,
                        lambda it, exc: {"status": "failed", "reason": exc.reason, "frames_decoded": 0},
                        label=lambda it: f"whole-grid fingerprint {it['video']['uri']} (another drop's copy)")
        step.stats.frames_decoded = sum(int(r.get("frames_decoded") or 0) for r in rows)
        found: dict[str, str] = {}
        for it, r in zip(items, rows, strict=True):
            if r["status"] == "ok":
                found[it["video"]["asset_id"]] = r["fingerprint_blob"]
            else:
                step.stats.add("whole_grid_borrow_failures")
                log(f"fingerprint: whole-grid print of {it['video']['uri']} (another drop's copy) failed "
                    f"({r.get('reason')}); its pair stays undecided until a later run")
        step.stats.add("whole_grid_borrowed", len(found))
        return found, step.stats


def analyze_partition(bucket: ReadOnlyBucket, objects: ObjectStore, videos: list[dict], probe_rows: list[dict],
                      previous: pd.DataFrame, previous_frames: pd.DataFrame, version: RowVersion,
                      analysis: AnalysisSettings, probe: ProbeSettings, max_runs: int,
                      log: Log = lambda _: None, shot_model: ShotModel | None = None, engine: Engine | None = None,
                      ) -> tuple[list[dict], list[dict], StepStats]:
    """The one decode pass for every usable video: analysis rows and context-frame rows.
    ``shot_model`` maps the pass's 48x27 frames to per-frame shot-end probabilities (needed by the
    transnetv2 and ensemble detectors; it runs here, in the caller's process, where models live)."""
    if analysis.detector in MODEL_DETECTORS and shot_model is None:
        raise ValueError(f"analysis.detector {analysis.detector} needs a shot model")
    facts, todo = _usable_step(videos, probe_rows)
    params = analysis.model_dump()
    limits = probe.model_dump()
    frames_by_asset: dict[str, list[dict]] = {}
    for r in records(previous_frames):
        frames_by_asset.setdefault(r["asset_id"], []).append(r)

    def base(video: dict) -> dict:
        fact = facts[video["asset_id"]]
        return {"asset_id": video["asset_id"], "uri": video["uri"], "source_shard": video["source_shard"],
                "media_type": video.get("media_type") or "video",
                "counted_frames": fact.get("counted_frames"), "rotation": fact.get("rotation") or 0, "seconds": None}

    def compute(video: dict) -> dict:
        asset_id = video["asset_id"]
        with step_source(step, bucket, video) as spec:
            result, attempts = tasks.analyze(step.sandbox, spec, limits, params, facts[asset_id])
        if not result.ok:
            raise Failure(result.error or "worker failed", transient=result.transient, attempts=attempts)
        value = result.value
        counters = {}
        if analysis.detector in MODEL_DETECTORS:
            n = int(value["frames_decoded"])
            probabilities = shot_model(value["shot_frames"]) if n else np.zeros(0, np.float32)
            counters = {"shot_model_frames": n, "model_calls": n}
            luma = np.asarray(value["signals"])[:, SIGNAL_NAMES.index("luma_mean")]
            cuts = final_cuts(analysis, value["cuts"], probabilities, luma)
            value = {**value, "cuts": cuts, "shots": shots_of(cuts, n)}
        row = {**base(video), "attempts": attempts, **_analysis_row(objects, value, facts[asset_id]), "_stats": counters}
        row["_side"] = [{  # the context-frame rows, written beside the analysis rows
            "asset_id": asset_id, "frame_index": ctx["frame_index"], "time_s": ctx["time_s"],
            "blob_key": put_blob(objects, "context_frames", ctx["jpeg"], ".jpg"),
            "width": ctx["width"], "height": ctx["height"], "pdq_hash": ctx["pdq"],
            "pdq_quality": ctx["pdq_quality"]} for ctx in result.value["context"]]
        return row

    def failed(video: dict, exc: Failure) -> dict:
        return {**base(video), "status": "failed", "reason": exc.reason, "frames_decoded": 0, "context_frames": 0,
                "decode_errors": 0, "cut_frames": "[]", "cut_seconds": "[]", "shots": "[]", "num_shots": 0,
                "attempts": 0}

    with Step(previous, lambda r: r["asset_id"], max_runs, probe.memory_mb, log, engine,
              isolation=probe.isolation) as step:
        step.stats.rows_in = len(todo)
        rows = step.run(todo, lambda v: v["asset_id"], version, compute, failed,
                        label=lambda v: f"analysis {v['uri']}")
        fresh_frames = step.side
        frame_rows: list[dict] = []
        for row in rows:
            asset_id = row["asset_id"]
            if asset_id in fresh_frames:
                stamp = {k: row[k] for k in ("producer_version", "input_version", "runs")}
                frame_rows += [{**f, **stamp, "failure": None} for f in fresh_frames[asset_id]]
            elif row.get("status") != "failed":
                frame_rows += frames_by_asset.get(asset_id, [])
        step.stats.frames_decoded = _decoded_now(rows, step)
        step.stats.add("frames_counted", sum(int(facts[v["asset_id"]].get("counted_frames") or 0) for v in todo
                                             if v["asset_id"] in fresh_frames))
        step.stats.add("context_frames", len(frame_rows))
        return step.finish(rows), frame_rows, step.stats


def _analysis_row(objects: ObjectStore, value: Mapping[str, Any], fact: Mapping[str, Any]) -> dict[str, Any]:
    pts = np.asarray(value["frame_pts"], dtype=np.int64)
    times = (pts - pts[0]) * float(value["time_base"]) if len(pts) else np.zeros(0)
    signals = pd.DataFrame(np.asarray(value["signals"]), columns=[*SIGNAL_NAMES, *GRID_NAMES])
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


def clip_partition(objects: ObjectStore, analysis_rows: list[dict], previous: pd.DataFrame, version: RowVersion,
                   clips: ClipSettings) -> tuple[list[dict], StepStats]:
    """Training windows from saved shots and frame times; no decode. Cheap enough to recompute
    whole; ``clip_id`` is deterministic (asset, frames, segmentation version), so unchanged clips keep
    their ids. A clip counts as reused when a row with its id and both versions already existed."""
    params = clips.model_dump()
    done = [r for r in analysis_rows if r["status"] in ("ok", "partial") and r.get("signals_blob")]
    stats = StepStats(rows_in=len(done))
    existing = {(r["clip_id"], r["producer_version"], r.get("input_version") or "") for r in records(previous)}
    rows: list[dict] = []
    for analysis in done:
        signals = read_parquet_blob(objects, analysis["signals_blob"])
        pts = signals["pts"].to_numpy()
        image = is_image(analysis)
        cut = image_clip if image else clip_rows
        for clip in cut(analysis["asset_id"], json.loads(analysis["shots"]), signals["time_s"].to_numpy(),
                        params, version.producer):
            clip.update(media_type="image" if image else "video", uri=analysis["uri"],
                        source_shard=analysis["source_shard"], producer_version=version.producer,
                        input_version=version.inputs, runs=1, failure=None,
                        first_pts=int(pts[clip["first_frame"]]), last_pts=int(pts[clip["last_frame"]]),
                        duration_s=round(clip["end_s"] - clip["start_s"], 6))
            rows.append(clip)
    stats.reused = sum(1 for r in rows if (r["clip_id"], version.producer, version.inputs) in existing)
    stats.computed = len(rows) - stats.reused
    return rows, stats
