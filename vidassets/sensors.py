"""Sensors. The bucket sensor finds complete new drops, adds their partitions and requests their
ingest: one code path for local directories and S3 (the bucket resource hides which); a drop is added
once (its key becomes a dynamic partition, which later ticks skip; the cursor holds only the last
tick's new keys, so it stays a few bytes with 10^5 drops); incomplete drops (see
``vidassets.ingest.drops``) are left for a later tick.

The global-stages sensor requests ONE run of the global assets (dedup, decontamination,
selection) when drops finished their chains since the last one, and waits while other drops' chains
are still in flight (at most ``execution.global_max_wait_seconds``): a burst of drops costs one
global run, not one per drop or per automation tick. While a UI backfill that targets the global
assets is in flight it requests nothing (the backfill runs them once, after its drops).

The selected-clips sensor requests the work on selected clips (annotations, ladder, audio, latents,
text embeddings: the catalog's after-global assets) for exactly the drops whose selected clips
changed in a new ``selection`` materialization, one run per drop: a new drop costs its own run (after
selection has seen its clips), never a run per existing drop. Drops that the backfill which ran
that selection also targets are left to it (it runs their selected-clip work itself).

The retry sensor requests a partitioned asset's partition again when its last step left rows with a
transient failure and runs to spare (``retry_pending``): nothing else would (no upstream changed),
and the step retries exactly those rows.
"""


import hashlib
import json
import time

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    AssetsDefinition,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from vidassets import catalog
from vidassets.config import Settings
from vidassets.ingest.drops import Drop, is_complete, list_drops
from vidassets.ingest.near_duplicates import regroup_drops
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource, StoreResource
from vidassets.storage.drop_batches import DropBatches
from vidassets.storage.rows import records
from vidassets.train.snapshot import read_tombstones, taken_down_assets


def bucket_drop_sensor(settings: Settings, ingest_assets: list[AssetsDefinition]):
    ingest_keys = [key for a in ingest_assets for key in a.keys]

    @sensor(
        name="bucket_drop_sensor",
        description="Lists raw/<tier>/<drop>/ in the bucket; adds a source_shard partition for every "
        f"complete new drop (completion rule: {settings.bucket.completion}) and requests its ingest.",
        asset_selection=ingest_assets,
        minimum_interval_seconds=settings.bucket.sensor_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def bucket_drop_sensor(context: SensorEvaluationContext, bucket: BucketResource, store: StoreResource):
        seen = set(json.loads(context.cursor)) if context.cursor else set()
        partitions = set(context.instance.get_dynamic_partitions(source_shards.name))
        batches = DropBatches(store.objects())
        known = seen | partitions | batches.recorded().keys()
        source = bucket.open()
        listing = list_drops(source, settings.bucket, known=known)
        if listing.invalid_names:
            context.log.warning(f"skipping directories whose names cannot be partition keys: {listing.invalid_names}")
        new_keys = [d.key for d in listing.complete if d.key not in known]
        # complete drops put in a batch whose ingest was never requested (a tick stopped after
        # recording them)
        members = batches.partition_of(d for p in sorted(batches.newest().values()) for d in batches.drops_of(p)
                                       if d not in seen)
        # busy: a run in flight, or a backfill in flight that will run the batch's ingest itself
        busy = {r.tags.get("dagster/partition") for r in context.instance.get_runs(
            filters=RunsFilter(statuses=IN_FLIGHT))} if members else set()
        backfills = _backfills_in_flight(context) if members else []
        busy |= {p for p in set(members.values()) if any(_targets(b, ingest_keys[0], p) for b in backfills)}
        tables = store.tables()
        waiting = {d: p for d, p in members.items() if p not in busy and not tables.exists("raw_inventory", d)
                   and is_complete(source, Drop.from_key(d), settings.bucket)}
        if not new_keys and not waiting:
            incomplete = f"; {len(listing.incomplete)} incomplete drop(s) waiting" if listing.incomplete else ""
            return SkipReason(f"no new complete drops{incomplete}")
        assigned = batches.assign(new_keys, settings.bucket.drops_per_partition)
        due: dict[str, list[str]] = {}
        for drop, partition in {**waiting, **assigned}.items():
            due.setdefault(partition, []).append(drop)
        added = sorted(p for p in due if p not in partitions)
        return SensorResult(
            run_requests=[  # one per partition and set of drops it must ingest: a repeated tick asks nothing twice
                RunRequest(run_key=f"ingest:{partition}" if partition == drops[0] else
                           f"ingest:{partition}:{','.join(sorted(drops))}", partition_key=partition,
                           asset_selection=ingest_keys) for partition, drops in sorted(due.items())
            ],
            dynamic_partitions_requests=[source_shards.build_add_request(added)] if added else [],
            cursor=json.dumps(sorted(new_keys)),  # the partitions and the batches remember the older ones
        )

    return bucket_drop_sensor


IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
             DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def _in_flight(context: SensorEvaluationContext, keys: set[AssetKey]) -> list[str]:
    runs = context.instance.get_runs(filters=RunsFilter(statuses=IN_FLIGHT))
    return [r.run_id for r in runs if set(r.asset_selection or ()) & keys]


def _backfills_in_flight(context: SensorEvaluationContext) -> list:
    from dagster._core.execution.backfill import BulkActionStatus  # not exported at the top level in 1.13

    return list(context.instance.get_backfills(status=BulkActionStatus.REQUESTED))


def _backfill_of(context: SensorEvaluationContext, run_id: str | None):
    """The backfill a run belongs to (UI backfills tag their runs), or None."""
    run = context.instance.get_run_by_id(run_id) if run_id else None
    backfill_id = run.tags.get("dagster/backfill") if run else None
    return context.instance.get_backfill(backfill_id) if backfill_id else None


def _targets(backfill, key: AssetKey, partition: str) -> bool:
    from dagster._core.definitions.events import AssetKeyPartitionKey

    data = backfill.asset_backfill_data
    return data is not None and AssetKeyPartitionKey(key, partition) in data.target_subset


def _global_run_started_after(context: SensorEvaluationContext, last_global: AssetKey, moment: float) -> str | None:
    """The run that last materialized the final global asset, if it started after ``moment``."""
    latest = context.instance.fetch_materializations(last_global, limit=1).records
    if not latest or not latest[0].run_id:
        return None
    stats = context.instance.get_run_stats(latest[0].run_id)
    return latest[0].run_id if stats.start_time and stats.start_time > moment else None


def global_stages_sensor(job, interval_seconds: int = 30, max_wait_seconds: int = 900):
    targets = [AssetKey(a.name) for a in catalog.of_kind("global")]
    feeding = {AssetKey(a.name) for a in catalog.feeding_global()}
    # the partitioned assets the global ones read directly: their materializations mark finished work
    inputs = sorted({AssetKey(d) for a in catalog.of_kind("global") for d in a.deps if catalog.entry(d).partitioned},
                    key=lambda k: k.to_user_string())

    @sensor(
        name="global_stages_sensor",
        description="Requests one run of the global assets (" + ", ".join(k.to_user_string() for k in targets)
        + ") once drops finished their chains since the last one and no other drop's chain is in flight "
        f"(waiting at most {max_wait_seconds} s for those).",
        job=job,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def global_stages_sensor(context: SensorEvaluationContext):
        after = int(context.cursor) if context.cursor else None
        first = last = newest = None
        for key in inputs:
            for ascending in (True, False):
                found = context.instance.fetch_materializations(
                    AssetRecordsFilter(asset_key=key, after_storage_id=after), limit=1, ascending=ascending).records
                if found and ascending and (first is None or found[0].timestamp < first):
                    first = found[0].timestamp
                if found and not ascending:
                    last = max(last or 0, found[0].storage_id)
                    newest = max(newest or 0.0, found[0].timestamp)
        if last is None:
            return SkipReason("no drop finished its chain since the last global run")
        covering = _global_run_started_after(context, targets[-1], newest)
        if covering:  # e.g. a backfill's or the CLI's own global run: it read all of these
            return SensorResult(skip_reason=f"run {covering} started after these drops finished and ran the "
                                "global assets", cursor=str(last))
        if _in_flight(context, set(targets)):
            return SkipReason("a global run is in flight; the drops it has not seen go into the next")
        backfills = [b.backfill_id for b in _backfills_in_flight(context) if set(b.asset_selection or ()) & set(targets)]
        if backfills:
            return SkipReason(f"backfill {backfills[0]} in flight runs the global assets itself, after its drops")
        waiting = _in_flight(context, feeding)
        waited = time.time() - first
        if waiting and waited < max_wait_seconds:
            return SkipReason(f"{len(waiting)} run(s) of drop chains in flight; waiting for them "
                              f"({waited:.0f} of at most {max_wait_seconds} s)")
        return SensorResult(run_requests=[RunRequest(run_key=f"global:{last}", asset_selection=targets)],
                            cursor=str(last))

    return global_stages_sensor


def selected_clips_sensor(job, interval_seconds: int = 30):
    targets = [AssetKey(a.name) for a in catalog.after_global()]

    @sensor(
        name="selected_clips_sensor",
        description="After each selection materialization, requests one run per drop whose selected clips "
        "changed (its metadata lists them) for the work on selected clips: "
        + ", ".join(k.to_user_string() for k in targets) + ".",
        job=job,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def selected_clips_sensor(context: SensorEvaluationContext, store: StoreResource):
        after = int(context.cursor) if context.cursor else None
        events = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("selection"), after_storage_id=after), limit=100, ascending=True)
        if not events.records:
            return SkipReason("no new selection")
        batches = DropBatches(store.objects())
        due: dict[str, int] = {}
        for record in events.records:
            meta = record.asset_materialization.metadata if record.asset_materialization else {}
            changed = meta.get("changed_drops")
            backfill = _backfill_of(context, record.run_id)
            for partition in sorted(set(batches.partition_of(getattr(changed, "value", changed) or []).values())):
                if backfill is not None and all(_targets(backfill, key, partition) for key in targets):
                    continue  # the backfill that ran this selection does this drop's selected-clip work itself
                due[partition] = record.storage_id
        known = [p for p in sorted(due) if context.instance.has_dynamic_partition(source_shards.name, p)]
        last = events.records[-1].storage_id
        return SensorResult(
            run_requests=[RunRequest(run_key=f"selected:{due[p]}:{p}", partition_key=p, asset_selection=targets)
                          for p in known],
            cursor=str(last),
        )

    return selected_clips_sensor


def retry_sensor(interval_seconds: int = 300):
    partitioned = [AssetKey(a.name) for a in catalog.ASSETS if a.partitioned]

    @sensor(
        name="retry_sensor",
        description="Requests a partition of an asset again when its last materialization left rows with a "
        "transient failure and runs to spare (metadata retry_pending > 0); the step retries just those rows.",
        asset_selection=partitioned,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def retry_sensor(context: SensorEvaluationContext):
        cursor = json.loads(context.cursor) if context.cursor else {}
        due: dict[str, dict[AssetKey, int]] = {}
        for key in partitioned:
            name = key.to_user_string()
            records = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=key, after_storage_id=cursor.get(name)), limit=1000, ascending=True).records
            for record in records:
                meta = record.asset_materialization.metadata if record.asset_materialization else {}
                pending = meta.get("retry_pending")
                if record.partition_key and int(getattr(pending, "value", pending) or 0) > 0:
                    due.setdefault(record.partition_key, {})[key] = record.storage_id
                cursor[name] = record.storage_id
        if not due:
            return SensorResult(skip_reason="no rows waiting for a retry", cursor=json.dumps(cursor, sort_keys=True))
        return SensorResult(
            run_requests=[RunRequest(run_key=f"retry:{max(keys.values())}:{part}", partition_key=part,
                                     asset_selection=sorted(keys, key=lambda k: k.to_user_string()))
                          for part, keys in sorted(due.items())],
            cursor=json.dumps(cursor, sort_keys=True),
        )

    return retry_sensor


def canonical_sensor(interval_seconds: int = 30):
    """A better copy of an asset landed in another drop: the drops a step named
    (``canonical_requests``) run that step again. For exact copies (``raw_inventory``): the holder that
    must release the asset, then the drop that takes it; for near-duplicates (``video_fingerprint``):
    the drops whose stored decision changed (fingerprints are reused; only the decision is made
    again, and automation follows with their analysis). One run per drop and asset."""
    watched = [AssetKey("raw_inventory"), AssetKey("video_fingerprint")]

    @sensor(
        name="canonical_sensor",
        description="Requests raw_inventory / video_fingerprint of the drops a canonical-copy change names (an "
        "exact copy's holder releases the asset and hands its rows over; a near-duplicate group's old canonical "
        "copy stops being analysed): no re-decode of what was already decoded.",
        asset_selection=watched,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def canonical_sensor(context: SensorEvaluationContext, store: StoreResource):
        cursor = _json_cursor(context.cursor)
        batches = DropBatches(store.objects())
        requests = []
        for asset_key in watched:
            name = asset_key.to_user_string()
            after = cursor.get(name)
            records = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=asset_key, after_storage_id=after), limit=1000, ascending=True).records
            due: dict[str, int] = {}
            for record in records:
                meta = record.asset_materialization.metadata if record.asset_materialization else {}
                value = meta.get("canonical_requests")
                for partition in batches.partition_of(getattr(value, "value", value) or []).values():
                    due[partition] = record.storage_id
                cursor[name] = record.storage_id
            requests += [RunRequest(run_key=f"canonical:{name}:{storage_id}:{partition}", partition_key=partition,
                                    asset_selection=[asset_key]) for partition, storage_id in sorted(due.items())]
        if not requests:
            return SensorResult(skip_reason="no canonical copy is moving", cursor=json.dumps(cursor, sort_keys=True))
        return SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return canonical_sensor


def takedown_sensor(interval_seconds: int = 30):
    """A takedown that hits a near-duplicate group's canonical copy: the drops holding the copies
    that stood in for it decide again (``video_fingerprint``; fingerprints reused), so the best copy
    still up is promoted and automation analyses it. The cursor holds a digest of the tombstones
    already acted on."""
    @sensor(
        name="takedown_sensor",
        description="On a new takedown tombstone, requests video_fingerprint of every drop holding near-duplicates "
        "of footage now taken down: the best copy still up becomes canonical and is analysed (nothing is lost "
        "with the copy).",
        asset_selection=[AssetKey("video_fingerprint")],
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def takedown_sensor(context: SensorEvaluationContext, store: StoreResource):
        objects = store.objects()
        stones = read_tombstones(objects)
        seen = hashlib.sha256(json.dumps(sorted((s.kind, s.value) for s in stones)).encode()).hexdigest()[:16]
        if context.cursor == seen:
            return SkipReason("no new takedown")
        tables = store.tables()
        stale = regroup_drops(records(tables.read_all("video_fingerprints")), taken_down_assets(objects, tables))
        partitions = sorted(set(DropBatches(objects).partition_of(stale).values()))
        requests = [RunRequest(run_key=f"takedown:{seen}:{partition}", partition_key=partition,
                               asset_selection=[AssetKey("video_fingerprint")]) for partition in partitions]
        return SensorResult(run_requests=requests, cursor=seen)

    return takedown_sensor


def _json_cursor(value: str | None) -> dict[str, int]:
    """The canonical sensor's cursor: last storage id seen per watched asset (an older plain-number
    cursor was raw_inventory's)."""
    if not value:
        return {}
    if value.isdigit():
        return {"raw_inventory": int(value)}
    return {k: int(v) for k, v in json.loads(value).items()}
