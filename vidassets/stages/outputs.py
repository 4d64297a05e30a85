"""Media outputs of selected clips: ``clip_ladder`` (the durable training-facing copies: every rung
from one decode per clip) and ``clip_audio`` (the clip's audio span, sync status, light signals)."""

from dagster import AssetCheckResult, AssetCheckSeverity, AssetExecutionContext, MaterializeResult, ResourceParam

from vidassets.media import drop_steps
from vidassets.media.clip_outputs import audio_partition, ladder_partition
from vidassets.resources import BucketResource, Execution, Pipeline, StageRun, StoreResource
from vidassets.stages.common import result, selected_or_keep, stage_asset, stage_check
from vidassets.storage.rows import current_rows, records


def upright_videos(run: StageRun) -> dict[str, dict]:
    """Canonical videos of the run's partition with their upright size (the probe's facts: an input of
    the rows that use it)."""
    dims = {r["asset_id"]: r for r in records(run.tables.read("video_probe", run.key))}
    return {v["asset_id"]: {**v, "display_width": dims.get(v["asset_id"], {}).get("display_width"),
                            "display_height": dims.get(v["asset_id"], {}).get("display_height")}
            for v in drop_steps.canonical_videos(run.which.read("eval_split", run.key), run.which.read("raw_inventory", run.key))}


@stage_asset("clip_ladder")
def clip_ladder(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, versions = run.key, run.versions
    selected, previous, idle = selected_or_keep(run, "clip_ladder", versions.own("clip_ladder"))
    if idle:
        return idle
    rows, stats = ladder_partition(bucket.open(), run.objects, selected, run.which.read("clips", key),
                                   run.which.read("video_analysis", key), upright_videos(run), previous,
                                   lambda clip: versions.window_row("clip_ladder", clip), run.settings.ladder,
                                   execution.limits, execution.max_runs, context.log.info,
                                   run.tables.read_or_empty("frame_index", key), execution.engine)
    run.tables.write("clip_ladder", key, rows)
    return result(stats, rows, versions.own("clip_ladder"), selected=selected)


@stage_asset("clip_audio")
def clip_audio(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
               pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, versions = run.key, run.versions
    selected, previous, idle = selected_or_keep(run, "clip_audio", versions.own("clip_audio"))
    if idle:
        return idle
    rows, stats = audio_partition(bucket.open(), run.objects, selected, run.which.read("clips", key),
                                  run.tables.read("video_probe", key), upright_videos(run), previous,
                                  lambda clip: versions.window_row("clip_audio", clip), run.settings.audio,
                                  execution.limits, execution.max_runs, context.log.info, execution.engine)
    run.tables.write("clip_audio", key, rows)
    return result(stats, rows, versions.own("clip_audio"), selected=selected)


@stage_check("clip_ladder", "Each clip's rungs came from one decode, and every rung has the configured rate.")
def one_decode_per_clip(context, store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    part = context.partition_key if context.has_partition_key else None
    ladder = pipeline.settings.ladder
    table = current_rows(store.tables().read_or_empty("clip_ladder", part), pipeline.versions.own("clip_ladder"))
    per_clip = table.groupby("clip_id").frames_decoded.nunique() if len(table) else []
    fps_ok = bool(table.fps.isin([ladder.fps, ladder.high_fps]).all()) if len(table) else True
    one_decode = bool((per_clip <= 1).all()) if len(table) else True
    return AssetCheckResult(passed=one_decode and fps_ok, severity=AssetCheckSeverity.WARN,
                            metadata={"clips": int(table.clip_id.nunique()) if len(table) else 0,
                                      "rungs": len(table), "rung_rates_as_configured": fps_ok})
