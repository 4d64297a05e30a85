"""Media outputs of selected clips: ``clip_ladder`` (the durable training-facing copies: every rung
from one decode per clip) and ``clip_audio`` (the clip's audio span, sync status, light signals)."""

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets.config import Settings
from vidassets.media import drop_steps as media_work
from vidassets.media.clip_outputs import audio_partition, ladder_partition
from vidassets.resources import BucketResource, StoreResource
from vidassets.stages.common import asset_args, result, selected_or_keep, step_engine
from vidassets.versions import Versions


def _videos(tables, key: str) -> dict[str, dict]:
    """Canonical videos of a partition with their upright size (from the probe)."""
    dims = {r["asset_id"]: r for r in media_work.records(tables.read("video_probe", key))}
    return {v["asset_id"]: {**v, "display_width": dims.get(v["asset_id"], {}).get("display_width"),
                            "display_height": dims.get(v["asset_id"], {}).get("display_height")}
            for v in media_work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))}


def output_assets(settings: Settings, versions: Versions) -> list:
    max_runs = settings.execution.max_runs
    ladder_version, audio_version = versions.own("clip_ladder"), versions.own("clip_audio")

    @asset(**asset_args("clip_ladder", settings, versions))
    def clip_ladder(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected, previous, idle = selected_or_keep(tables, "clip_ladder", key, ladder_version)
        if idle:
            return idle
        rows, stats = ladder_partition(bucket.open(), store.objects(), selected, tables.read("clips", key),
                                       tables.read("video_analysis", key), _videos(tables, key), previous,
                                       lambda clip: versions.window_row("clip_ladder", clip), settings.ladder, settings.probe, max_runs,
                                       context.log.info, tables.read_or_empty("frame_index", key), step_engine(settings))
        tables.write("clip_ladder", key, rows)
        return result(stats, rows, ladder_version, selected=selected)

    @asset(**asset_args("clip_audio", settings, versions))
    def clip_audio(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected, previous, idle = selected_or_keep(tables, "clip_audio", key, audio_version)
        if idle:
            return idle
        rows, stats = audio_partition(bucket.open(), store.objects(), selected, tables.read("clips", key),
                                      tables.read("video_probe", key), _videos(tables, key), previous,
                                      lambda clip: versions.window_row("clip_audio", clip), settings.audio, settings.probe, max_runs,
                                      context.log.info, step_engine(settings))
        tables.write("clip_audio", key, rows)
        return result(stats, rows, audio_version, selected=selected)

    @asset_check(asset=clip_ladder, blocking=False,
                 description="Each clip's rungs came from one decode, and every rung has the configured rate.")
    def one_decode_per_clip(context, store: StoreResource) -> AssetCheckResult:
        part = context.partition_key if context.has_partition_key else None
        table = store.tables().read_or_empty("clip_ladder", part)
        table = table[(table.producer_version == ladder_version) & (table.status == "ok")] if len(table) else table
        per_clip = table.groupby("clip_id").frames_decoded.nunique() if len(table) else []
        fps_ok = bool(table.fps.isin([settings.ladder.fps, settings.ladder.high_fps]).all()) if len(table) else True
        one_decode = bool((per_clip <= 1).all()) if len(table) else True
        return AssetCheckResult(passed=one_decode and fps_ok,
                                severity=AssetCheckSeverity.WARN,
                                metadata={"clips": int(table.clip_id.nunique()) if len(table) else 0,
                                          "rungs": len(table), "rung_rates_as_configured": fps_ok})

    return [clip_ladder, clip_audio], [one_decode_per_clip]
