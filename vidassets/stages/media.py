"""Media stage: validate (``video_probe``), index packets (``frame_index``), the one decode pass
(``video_analysis``, which also writes the ``context_frames`` table) and ``clips``.
Every decode-touching call runs in the sandboxed worker (see ``vidassets.media.sandbox``)."""

import resource
import time

from dagster import AssetExecutionContext, AssetsDefinition, AutomationCondition, Config, MaterializeResult, asset

from vidassets.config import Settings
from vidassets.media import partition as work
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource, StoreResource

GROUP = "media"
AUTOMATION = AutomationCondition.eager() | AutomationCondition.code_version_changed()


class ProbeRunConfig(Config):
    retry_quarantined: bool = False
    """Probe quarantined files again (they are otherwise never retried by later runs)."""


def _videos(store: StoreResource, key: str) -> list[dict]:
    tables = store.tables()
    return work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))


def media_assets(settings: Settings, upstream: AssetsDefinition) -> list[AssetsDefinition]:
    versions = settings.versions

    @asset(op_tags=settings.compute.op_tags("video_probe"), partitions_def=source_shards, group_name=GROUP, deps=[upstream], code_version=versions.video_probe,
           automation_condition=AUTOMATION,
           description="Validated media facts per train-side video (codec, size, rotation, fps, VFR, counted "
           "frames, audio) and a verdict: ok / salvaged / quarantined with a reason. Sandboxed, one retry.")
    def video_probe(context: AssetExecutionContext, config: ProbeRunConfig, bucket: BucketResource,
                    store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        rows, stats = work.probe_partition(bucket.open(), _videos(store, key), tables.read_or_empty("video_probe", key),
                                           settings, config.retry_quarantined, context.log.info)
        tables.write("video_probe", key, rows)
        quarantined = stats.by_status.get("quarantined", 0)
        return MaterializeResult(metadata={
            "rows_in": stats.rows_in, "rows_out": len(rows), "rows_by_status": stats.by_status,
            "quarantine_rate": round(quarantined / len(rows), 4) if rows else 0.0,
            "rows_reused": stats.reused, "rows_computed": stats.computed,
            "frames_decoded": stats.frames_decoded, "producer_version": versions.video_probe,
        })

    @asset(op_tags=settings.compute.op_tags("frame_index"), partitions_def=source_shards, group_name=GROUP, deps=[video_probe], code_version=versions.frame_index,
           automation_condition=AUTOMATION,
           description="Per-video packet index (pts, dts, duration, byte position, size, keyframe, frame type, "
           "reference flag) as a Parquet blob, plus the encode profile. Demux only, no decode.")
    def frame_index(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        probe_rows = work.records(tables.read("video_probe", key))
        rows, stats = work.index_partition(bucket.open(), store.objects(), _videos(store, key), probe_rows,
                                           tables.read_or_empty("frame_index", key), settings, context.log.info)
        tables.write("frame_index", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.rows_in, "rows_out": len(rows), "rows_by_status": stats.by_status,
            "rows_reused": stats.reused, "rows_computed": stats.computed, "frames_decoded": 0,
            "producer_version": versions.frame_index,
        })

    @asset(op_tags=settings.compute.op_tags("video_analysis"), partitions_def=source_shards, group_name=GROUP, deps=[video_probe], code_version=versions.video_analysis,
           automation_condition=AUTOMATION,
           freshness_policy=settings.freshness.policy(settings.freshness.analysis_within_hours),
           description="The one decode pass per video: shot boundaries (frame indices), per-frame luma/motion/"
           "scene-change signals, and context frames at a fixed rate with PDQ hashes (table context_frames).")
    def video_analysis(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        started, cpu = time.perf_counter(), cpu_seconds()
        rows, frames, stats = work.analyze_partition(
            bucket.open(), store.objects(), _videos(store, key), work.records(tables.read("video_probe", key)),
            tables.read_or_empty("video_analysis", key), tables.read_or_empty("context_frames", key),
            settings, context.log.info)
        tables.write("context_frames", key, frames)
        tables.write("video_analysis", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.rows_in, "rows_out": len(rows), "rows_by_status": stats.by_status,
            "rows_reused": stats.reused, "rows_computed": stats.computed, "context_frames": len(frames),
            "frames_decoded": stats.frames_decoded, "frames_counted": stats.frames_counted,
            "decoded_over_counted": round(stats.frames_decoded / stats.frames_counted, 4) if stats.frames_counted else 0.0,
            "video_seconds_per_wall_second": _realtime(rows, time.perf_counter() - started),
            "cpu_seconds": round(cpu_seconds() - cpu, 2),
            "video_seconds_per_cpu_second": _realtime(rows, cpu_seconds() - cpu),
            "producer_version": versions.video_analysis,
        })

    @asset(op_tags=settings.compute.op_tags("clips"), partitions_def=source_shards, group_name=GROUP, deps=[video_analysis], code_version=versions.clips,
           automation_condition=AUTOMATION,
           description="Shots cut into training windows (default 2-20 s): clip_id, asset_id, first/last frame "
           "(inclusive, presentation order), pts and seconds. Frame indices, not re-encoded files.")
    def clips(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        analysis = work.records(tables.read("video_analysis", key))
        rows, stats = work.clip_partition(store.objects(), analysis, tables.read_or_empty("clips", key), settings)
        tables.write("clips", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.rows_in, "rows_out": len(rows), "rows_reused": stats.reused,
            "rows_computed": stats.computed, "frames_decoded": 0,
            "clip_seconds": round(sum(r["duration_s"] for r in rows), 2), "producer_version": versions.clips,
        })

    return [video_probe, frame_index, video_analysis, clips]


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the sandbox workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _realtime(rows: list[dict], seconds: float) -> float:
    video = sum((r["frames_decoded"] / r["fps"]) for r in rows if r.get("fps") and r.get("seconds") is not None)
    return round(video / seconds, 2) if seconds > 0 else 0.0
