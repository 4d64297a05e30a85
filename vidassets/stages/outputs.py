"""Media outputs of selected clips: ``clip_ladder`` (the durable training-facing copies: every rung
from one decode per clip) and ``clip_audio`` (the clip's audio span, sync status, light signals)."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets.config import Settings
from vidassets.media import partition as media_work
from vidassets.media.clip_outputs import audio_partition, ladder_partition
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource, StoreResource
from vidassets.stages.common import selected_or_keep

GROUP = "outputs"
AUTOMATION = AutomationCondition.eager() | AutomationCondition.code_version_changed()


def _videos(tables, key: str) -> dict[str, dict]:
    """Canonical videos of a partition with their upright size (from the probe)."""
    dims = {r["asset_id"]: r for r in media_work.records(tables.read("video_probe", key))}
    return {v["asset_id"]: {**v, "display_width": dims.get(v["asset_id"], {}).get("display_width"),
                            "display_height": dims.get(v["asset_id"], {}).get("display_height")}
            for v in media_work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))}


def output_assets(settings: Settings, selection: AssetsDefinition, clips: AssetsDefinition,
                  video_analysis: AssetsDefinition, video_probe: AssetsDefinition,
                  frame_index: AssetsDefinition) -> list:
    versions = settings.versions

    @asset(op_tags=settings.compute.op_tags("clip_ladder"), partitions_def=source_shards, group_name=GROUP,
           deps=[selection, clips, video_analysis, frame_index], code_version=versions.clip_ladder,
           automation_condition=AUTOMATION,
           description="Every configured rung (short side x frame rate, H.264/H.265 MP4) of each selected clip, "
           "produced from ONE decode of the clip; content-addressed blobs, nearest aspect ratio and crop recorded.")
    def clip_ladder(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected, previous, idle = selected_or_keep(tables, "clip_ladder", key)
        if idle:
            return idle
        rows, stats = ladder_partition(bucket.open(), store.objects(), selected, tables.read("clips", key),
                                       tables.read("video_analysis", key), _videos(tables, key), previous, settings,
                                       context.log.info, tables.read_or_empty("frame_index", key))
        tables.write("clip_ladder", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused, "rows_computed": stats.computed,
            "errors": stats.errors, "clip_decodes": stats.decodes, "frames_decoded": stats.frames_decoded,
            "decodes_per_clip": round(stats.decodes / max(1, stats.clips - stats.reused), 3) if stats.computed else 0.0,
            "seconds": round(stats.seconds, 3), "producer_version": versions.clip_ladder,
        })

    @asset(op_tags=settings.compute.op_tags("clip_audio"), partitions_def=source_shards, group_name=GROUP,
           deps=[selection, clips, video_probe], code_version=versions.clip_audio, automation_condition=AUTOMATION,
           description="Each selected clip's audio span (16 kHz mono Opus by default; music kept at a higher "
           "profile), its sync status against the video track, loudness, silence and clipping shares.")
    def clip_audio(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected, previous, idle = selected_or_keep(tables, "clip_audio", key)
        if idle:
            return idle
        rows, stats = audio_partition(bucket.open(), store.objects(), selected, tables.read("clips", key),
                                      tables.read("video_probe", key), _videos(tables, key), previous, settings,
                                      context.log.info)
        tables.write("clip_audio", key, rows)
        current = [r for r in rows if r["producer_version"] == versions.clip_audio]
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused, "rows_computed": stats.computed,
            "by_status": {s: sum(r["audio_status"] == s for r in current) for s in sorted({r["audio_status"] for r in current})},
            "frames_decoded": 0, "seconds": round(stats.seconds, 3), "producer_version": versions.clip_audio,
        })

    @asset_check(asset=clip_ladder, blocking=False,
                 description="Each clip's rungs came from one decode, and every rung has the configured rate.")
    def one_decode_per_clip(context, store: StoreResource) -> AssetCheckResult:
        part = context.partition_key if context.has_partition_key else None
        table = store.tables().read_or_empty("clip_ladder", part)
        table = table[(table.producer_version == versions.clip_ladder) & (table.status == "ok")] if len(table) else table
        per_clip = table.groupby("clip_id").frames_decoded.nunique() if len(table) else []
        fps_ok = bool(table.fps.isin([settings.ladder.fps, settings.ladder.high_fps]).all()) if len(table) else True
        one_decode = bool((per_clip <= 1).all()) if len(table) else True
        return AssetCheckResult(passed=one_decode and fps_ok,
                                severity=AssetCheckSeverity.WARN,
                                metadata={"clips": int(table.clip_id.nunique()) if len(table) else 0,
                                          "rungs": len(table), "rung_rates_as_configured": fps_ok})

    return [clip_ladder, clip_audio], [one_decode_per_clip]
