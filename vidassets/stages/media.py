"""Media stage: validate (``video_probe``), index packets (``frame_index``), fingerprint and decide
near-duplicates (``video_fingerprint``), the one decode pass (``video_analysis``, which also writes
the ``context_frames`` table) and ``clips``. Every decode-touching call runs in the sandboxed worker
(``vidassets.runtime.sandbox``)."""

import resource
import time

from dagster import AssetExecutionContext, Config, MaterializeResult, ResourceParam

from vidassets.ingest import hash_lists
from vidassets.ingest.near_duplicates import Neighbourhood, Prints, fingerprint_drop, indexed_videos, kept_out
from vidassets.media import drop_steps
from vidassets.resources import (
    BucketResource,
    Execution,
    Models,
    NearDuplicateIndexResource,
    Pipeline,
    StageRun,
    StoreResource,
)
from vidassets.stages.common import freshness, result, stage_asset
from vidassets.storage.rows import records
from vidassets.train.snapshot import taken_down_assets


class ProbeRunConfig(Config):
    retry_quarantined: bool = False
    """Probe files whose quarantine is final again (transient ones are retried anyway)."""


def drop_videos(run: StageRun, key: str) -> list[dict]:
    """The canonical train-side videos of a drop (which videos a media step works on)."""
    return drop_steps.canonical_videos(run.which.read("eval_split", key), run.which.read("raw_inventory", key))


def _videos_of(run: StageRun, rows: list[dict]) -> list[dict]:
    """Other drops' videos (their fingerprint ``rows``) with what a fingerprint reads: the video,
    its probe facts and its packet index row, from their own drops' tables."""
    items = []
    for shard in sorted({r["source_shard"] for r in rows}):
        wanted = {r["asset_id"] for r in rows if r["source_shard"] == shard}
        facts = {r["asset_id"]: r for r in records(run.tables.read("video_probe", shard)) if r["asset_id"] in wanted}
        index = {r["asset_id"]: r for r in records(run.tables.read("frame_index", shard)) if r["asset_id"] in wanted}
        items += [{"video": v, "facts": facts[v["asset_id"]], "index": index.get(v["asset_id"])}
                  for v in drop_videos(run, shard) if v["asset_id"] in wanted and v["asset_id"] in facts]
    return items


@stage_asset("video_probe")
def video_probe(context: AssetExecutionContext, config: ProbeRunConfig, bucket: BucketResource, store: StoreResource,
                pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    rows, stats = drop_steps.probe_partition(bucket.open(), drop_videos(run, run.key), run.tables.previous("video_probe", run.key),
                                       run.versions.row("video_probe"), run.settings.probe, execution.max_runs,
                                       config.retry_quarantined, context.log.info, execution.engine)
    run.tables.write("video_probe", run.key, rows)
    quarantined = stats.by_status.get("quarantined", 0)
    return result(stats, rows, run.versions.own("video_probe"),
                  quarantine_rate=round(quarantined / len(rows), 4) if rows else 0.0)


@stage_asset("frame_index")
def frame_index(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    rows, stats = drop_steps.index_partition(bucket.open(), run.objects, drop_videos(run, run.key),
                                       records(run.tables.read("video_probe", run.key)),
                                       run.tables.previous("frame_index", run.key), run.versions.row("frame_index"),
                                       execution.limits, execution.max_runs, context.log.info, execution.engine)
    run.tables.write("frame_index", run.key, rows)
    return result(stats, rows, run.versions.own("frame_index"))


@stage_asset("video_fingerprint")
def video_fingerprint(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                      near_index: NearDuplicateIndexResource, pipeline: ResourceParam[Pipeline],
                      execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    near = run.settings.near_duplicates
    prints = Prints(run.objects)
    index = near_index.open()

    def drop_rows(drop: str) -> list[dict]:
        return records(run.tables.read("video_fingerprints", drop))

    synced = []
    if near.enabled:  # the index is a cache of the stored partitions: bring it up to them first
        synced = index.sync(run.tables.versions("video_fingerprints"),
                            lambda drop: indexed_videos(drop_rows(drop), prints))
    others = Neighbourhood(index, drop_rows, run.key, near.max_hamming, prints)
    rows, stats, outcome, prints = fingerprint_drop(
        bucket.open(), run.objects, drop_videos(run, run.key), records(run.tables.read("video_probe", run.key)),
        records(run.tables.read("frame_index", run.key)), run.tables.previous("video_fingerprints", run.key), others,
        run.versions.fingerprint_row(), run.versions.fingerprint_row(whole_grid=True), near,
        run.settings.ingest.tier_priority, execution.limits, execution.max_runs, context.log.info, execution.engine,
        lambda wanted: _videos_of(run, wanted),
        down=taken_down_assets(run.objects, run.which), prints=prints)  # which copies may be canonical, not values
    if prints.packs_unreadable:
        context.log.warning(f"{prints.packs_unreadable} fingerprint pack(s) unreadable: their drops' hashes "
                            "were read from each video's fingerprint instead (same decision)")
    reports = hash_lists.block(rows, others.rows, prints.hashes, run.versions.hash_lists(), run.settings.safety.max_hamming)
    run.tables.write("video_fingerprints", run.key, rows)
    run.tables.write("safety_reports", run.key,
                     [{**r, "producer_version": run.versions.own("video_fingerprint")} for r in reports])
    if near.enabled:
        index.put_drop(run.key, run.tables.version("video_fingerprints", run.key), indexed_videos(rows, prints))
    if reports:
        context.log.warning(f"{len({r['asset_id'] for r in reports})} video(s) blocked by the safety hash lists: "
                            "never analysed; see safety_reports")
    if outcome and outcome.requests:
        context.log.info(f"near-duplicate canonical copies moving: drops {sorted(outcome.requests)} decide again")
    counts = {k: getattr(outcome, k) if outcome else 0
              for k in ("near_duplicates", "contains", "generated_matches", "pairs_aligned")}
    return result(stats, rows, run.versions.own("video_fingerprint"), **counts,
                  canonical_requests=sorted(outcome.requests) if outcome else [],
                  other_drops_compared=len(others.drops),
                  blocked=sum(1 for r in rows if r.get("blocked")),
                  fingerprint_packs_read=prints.packs_read, fingerprints_read=prints.blobs_read,
                  fingerprint_packs_unreadable=prints.packs_unreadable,
                  near_index_drops_synced=len(synced), near_index_probes=index.counters.probes)


def _analysis_freshness(settings, versions) -> dict:
    return {"freshness_policy": freshness(settings.freshness.analysis_within_hours)}


@stage_asset("video_analysis", _analysis_freshness)
def video_analysis(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                   pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution],
                   models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store)
    started, cpu = time.perf_counter(), cpu_seconds()
    near = {r["asset_id"]: why for r in records(run.which.read_or_empty("video_fingerprints", run.key))
            if (why := kept_out(r))}  # near-duplicate copies and copies of model-generated footage
    videos = [v for v in drop_videos(run, run.key) if v["asset_id"] not in near]
    parked = run.tables.park(("video_analysis", "context_frames"), run.key, set(near))
    rows, frames, stats = drop_steps.analyze_partition(
        bucket.open(), run.objects, videos, records(run.tables.read("video_probe", run.key)),
        run.tables.previous("video_analysis", run.key), run.tables.previous("context_frames", run.key),
        run.versions.row("video_analysis"), run.settings.analysis, execution.limits, execution.max_runs,
        context.log.info, models.shot_model(run.settings.analysis), execution.engine)
    run.tables.write("context_frames", run.key, frames)
    run.tables.write("video_analysis", run.key, rows)
    counted = stats.extra.get("frames_counted", 0)
    return result(stats, rows, run.versions.own("video_analysis"),
                  near_duplicates_not_analysed=len(near), rows_parked=parked,
                  decoded_over_counted=round(stats.frames_decoded / counted, 4) if counted else 0.0,
                  video_seconds_per_wall_second=_realtime(rows, time.perf_counter() - started),
                  cpu_seconds=round(cpu_seconds() - cpu, 2),
                  video_seconds_per_cpu_second=_realtime(rows, cpu_seconds() - cpu))


@stage_asset("clips")
def clips(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    run = pipeline.run(context, store)
    analysis = records(run.tables.read("video_analysis", run.key))
    rows, stats = drop_steps.clip_partition(run.objects, analysis, run.tables.previous("clips", run.key),
                                      run.versions.row("clips"), run.settings.clips)
    run.tables.write("clips", run.key, rows)
    return result(stats, rows, run.versions.own("clips"), clip_seconds=round(sum(r["duration_s"] for r in rows), 2))


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the sandbox workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _realtime(rows: list[dict], seconds: float) -> float:
    video = sum((r["frames_decoded"] / r["fps"]) for r in rows if r.get("fps") and r.get("seconds") is not None)
    return round(video / seconds, 2) if seconds > 0 else 0.0
