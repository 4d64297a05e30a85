"""Media stage: validate (``video_probe``), index packets (``frame_index``), the one decode pass
(``video_analysis``, which also writes the ``context_frames`` table) and ``clips``.
Every decode-touching call runs in the sandboxed worker (see ``vidassets.runtime.sandbox``)."""

import resource
import time

from dagster import AssetExecutionContext, AssetsDefinition, Config, MaterializeResult, asset

from vidassets.config import Settings
from vidassets.ingest.near_duplicates import Prints, decide, kept_out
from vidassets.media import drop_steps as work
from vidassets.resources import BucketResource, StoreResource
from vidassets.stages.common import asset_args, freshness, result, shot_model, step_engine
from vidassets.versions import Versions


class ProbeRunConfig(Config):
    retry_quarantined: bool = False
    """Probe files whose quarantine is final again (transient ones are retried anyway)."""


def _videos(store: StoreResource, key: str) -> list[dict]:
    tables = store.tables()
    return work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))


def _near_duplicates(store: StoreResource, key: str) -> dict[str, str]:
    """asset_id -> why it is not analysed, for this drop's near-duplicate copies and copies of
    model-generated footage."""
    rows = work.records(store.tables().read_or_empty("video_fingerprints", key))
    return {r["asset_id"]: why for r in rows if (why := kept_out(r))}


def _videos_of(store: StoreResource, rows: list[dict]) -> list[dict]:
    """Other drops' videos (their fingerprint ``rows``) with what a fingerprint reads: the video,
    its probe facts and its packet index row, from their own drops' tables."""
    tables = store.tables()
    items = []
    for shard in sorted({r["source_shard"] for r in rows}):
        wanted = {r["asset_id"] for r in rows if r["source_shard"] == shard}
        facts = {r["asset_id"]: r for r in work.records(tables.read("video_probe", shard)) if r["asset_id"] in wanted}
        index = {r["asset_id"]: r for r in work.records(tables.read("frame_index", shard)) if r["asset_id"] in wanted}
        items += [{"video": v, "facts": facts[v["asset_id"]], "index": index.get(v["asset_id"])}
                  for v in _videos(store, shard) if v["asset_id"] in wanted and v["asset_id"] in facts]
    return items


def media_assets(settings: Settings, versions: Versions) -> list[AssetsDefinition]:
    max_runs = settings.execution.max_runs

    @asset(**asset_args("video_probe", settings, versions))
    def video_probe(context: AssetExecutionContext, config: ProbeRunConfig, bucket: BucketResource,
                    store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        rows, stats = work.probe_partition(bucket.open(), _videos(store, key), tables.previous("video_probe", key),
                                           versions.row("video_probe"), settings.probe, max_runs,
                                           config.retry_quarantined, context.log.info, step_engine(settings))
        tables.write("video_probe", key, rows)
        quarantined = stats.by_status.get("quarantined", 0)
        return result(stats, rows, versions.own("video_probe"),
                      quarantine_rate=round(quarantined / len(rows), 4) if rows else 0.0)

    @asset(**asset_args("frame_index", settings, versions))
    def frame_index(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        rows, stats = work.index_partition(bucket.open(), store.objects(), _videos(store, key),
                                           work.records(tables.read("video_probe", key)),
                                           tables.previous("frame_index", key), versions.row("frame_index"),
                                           settings.probe, max_runs, context.log.info, step_engine(settings))
        tables.write("frame_index", key, rows)
        return result(stats, rows, versions.own("frame_index"))

    @asset(**asset_args("video_fingerprint", settings, versions))
    def video_fingerprint(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        near = settings.near_duplicates
        others = work.records(tables.read_all("video_fingerprints",
                                              [p for p in tables.partitions("video_fingerprints") if p != key]))

        prints = Prints(store.objects())  # every stored fingerprint this run reads, read once
        whole_grid = versions.fingerprint_row(whole_grid=True)
        decided: list = []  # each decision this run made; the last one saw the final rows
        borrowed: dict[str, str] = {}  # other drops' videos this run took on the whole grid to decide
        asked: set[str] = set()  # each borrowed at most once (one that cannot be taken stays undecided)
        borrow_stats: list = []

        def undecided(rows: list[dict]) -> set[str]:
            while True:  # a borrowed whole grid can raise new candidate pairs: until none is left to borrow
                decided.append(outcome := decide(rows, others, prints, near, settings.ingest.tier_priority,
                                                 borrowed))
                wanted = [r for r in outcome.borrow if r["asset_id"] not in asked]
                if not wanted:
                    return outcome.undecided
                asked.update(r["asset_id"] for r in wanted)
                found, taken = work.whole_grid_prints(bucket.open(), store.objects(), _videos_of(store, wanted),
                                                      whole_grid, near, settings.probe, context.log.info,
                                                      step_engine(settings))
                borrowed.update(found)
                borrow_stats.append(taken)

        rows, stats = work.fingerprint_partition(
            bucket.open(), store.objects(), _videos(store, key), work.records(tables.read("video_probe", key)),
            work.records(tables.read("frame_index", key)), tables.previous("video_fingerprints", key),
            versions.fingerprint_row(), whole_grid, near, settings.probe, max_runs,
            context.log.info, step_engine(settings), retake=undecided if near.enabled and near.retake_undecided else None)
        for taken in borrow_stats:
            stats.frames_decoded += taken.frames_decoded
            stats.merge(taken.extra)
        outcome = None
        if near.enabled:
            outcome = decided[-1] if decided else decide(rows, others, prints, near, settings.ingest.tier_priority)
        if outcome is None:
            for row in rows:
                row.update(near_duplicate_of=None, near_duplicate_of_uri=None, match=None, contains=None,
                           contained_in=None, group_size=None, generated_match=None)
        prints.write_pack(rows)  # what later drops' decisions read of this drop: one object
        if prints.packs_unreadable:
            context.log.warning(f"{prints.packs_unreadable} fingerprint pack(s) unreadable: their drops' hashes "
                                "were read from each video's fingerprint instead (same decision)")
        tables.write("video_fingerprints", key, rows)
        if outcome and outcome.requests:
            context.log.info(f"near-duplicate canonical copies moving: drops {sorted(outcome.requests)} decide again")
        return result(stats, rows, versions.own("video_fingerprint"),
                      near_duplicates=outcome.near_duplicates if outcome else 0,
                      contains=outcome.contains if outcome else 0,
                      generated_matches=outcome.generated_matches if outcome else 0,
                      pairs_aligned=outcome.pairs_aligned if outcome else 0,
                      canonical_requests=sorted(outcome.requests) if outcome else [],
                      other_drops_compared=len({r["source_shard"] for r in others}),
                      fingerprint_packs_read=prints.packs_read, fingerprints_read=prints.blobs_read,
                      fingerprint_packs_unreadable=prints.packs_unreadable)

    @asset(**asset_args("video_analysis", settings, versions,
                        freshness_policy=freshness(settings.freshness.analysis_within_hours)))
    def video_analysis(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        started, cpu = time.perf_counter(), cpu_seconds()
        near = _near_duplicates(store, key)
        videos = [v for v in _videos(store, key) if v["asset_id"] not in near]
        parked = tables.park(("video_analysis", "context_frames"), key, set(near))
        rows, frames, stats = work.analyze_partition(
            bucket.open(), store.objects(), videos, work.records(tables.read("video_probe", key)),
            tables.previous("video_analysis", key), tables.previous("context_frames", key),
            versions.row("video_analysis"), settings.analysis, settings.probe, max_runs, context.log.info,
            shot_model(settings), step_engine(settings))
        tables.write("context_frames", key, frames)
        tables.write("video_analysis", key, rows)
        counted = stats.extra.get("frames_counted", 0)
        return result(stats, rows, versions.own("video_analysis"),
                      near_duplicates_not_analysed=len(near), rows_parked=parked,
                      decoded_over_counted=round(stats.frames_decoded / counted, 4) if counted else 0.0,
                      video_seconds_per_wall_second=_realtime(rows, time.perf_counter() - started),
                      cpu_seconds=round(cpu_seconds() - cpu, 2),
                      video_seconds_per_cpu_second=_realtime(rows, cpu_seconds() - cpu))

    @asset(**asset_args("clips", settings, versions))
    def clips(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        analysis = work.records(tables.read("video_analysis", key))
        rows, stats = work.clip_partition(store.objects(), analysis, tables.previous("clips", key),
                                          versions.row("clips"), settings.clips)
        tables.write("clips", key, rows)
        return result(stats, rows, versions.own("clips"), clip_seconds=round(sum(r["duration_s"] for r in rows), 2))

    return [video_probe, frame_index, video_fingerprint, video_analysis, clips]


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the sandbox workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _realtime(rows: list[dict], seconds: float) -> float:
    video = sum((r["frames_decoded"] / r["fps"]) for r in rows if r.get("fps") and r.get("seconds") is not None)
    return round(video / seconds, 2) if seconds > 0 else 0.0
