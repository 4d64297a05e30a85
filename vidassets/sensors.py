"""Sensors. The bucket sensor finds complete new drops, adds their partitions and requests their
ingest: one code path for local directories and S3 (the bucket resource hides which); a drop is added
once (its key goes into the cursor and becomes a dynamic partition, either fact is enough to skip it
later); incomplete drops (see ``vidassets.ingest.drops``) are left for a later tick.

The selected-clips sensor requests the work on selected clips (annotations, ladder, audio, latents,
text embeddings: the catalog's after-global assets) for exactly the drops whose selected clips
changed in a new ``selection`` materialization, one run per drop: a new drop costs its own run (after
selection has seen its clips), never a run per existing drop.

The retry sensor requests a partitioned asset's partition again when its last step left rows with a
transient failure and runs to spare (``retry_pending``): nothing else would (no upstream changed),
and the step retries exactly those rows.
"""


import json

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    AssetsDefinition,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from vidassets import catalog
from vidassets.config import Settings
from vidassets.ingest.drops import list_drops
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource


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
    def bucket_drop_sensor(context: SensorEvaluationContext, bucket: BucketResource):
        seen = set(json.loads(context.cursor)) if context.cursor else set()
        listing = list_drops(bucket.open(), settings.bucket)
        if listing.invalid_names:
            context.log.warning(f"skipping directories whose names cannot be partition keys: {listing.invalid_names}")
        new_keys = [
            d.key
            for d in listing.complete
            if d.key not in seen and not context.instance.has_dynamic_partition(source_shards.name, d.key)
        ]
        if not new_keys:
            waiting = f"; {len(listing.incomplete)} incomplete drop(s) waiting" if listing.incomplete else ""
            return SkipReason(f"no new complete drops{waiting}")
        return SensorResult(
            run_requests=[
                RunRequest(run_key=f"ingest:{key}", partition_key=key, asset_selection=ingest_keys) for key in new_keys
            ],
            dynamic_partitions_requests=[source_shards.build_add_request(new_keys)],
            cursor=json.dumps(sorted(seen | set(new_keys))),
        )

    return bucket_drop_sensor


def selected_clips_sensor(interval_seconds: int = 30):
    targets = [AssetKey(a.name) for a in catalog.after_global()]

    @sensor(
        name="selected_clips_sensor",
        description="After each selection materialization, requests one run per drop whose selected clips "
        "changed (its metadata lists them) for the work on selected clips: "
        + ", ".join(k.to_user_string() for k in targets) + ".",
        asset_selection=targets,
        minimum_interval_seconds=interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def selected_clips_sensor(context: SensorEvaluationContext):
        after = int(context.cursor) if context.cursor else None
        events = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("selection"), after_storage_id=after), limit=100, ascending=True)
        if not events.records:
            return SkipReason("no new selection")
        drops: dict[str, int] = {}
        for record in events.records:
            meta = record.asset_materialization.metadata if record.asset_materialization else {}
            changed = meta.get("changed_drops")
            for drop in (getattr(changed, "value", changed) or []):
                drops[drop] = record.storage_id
        known = [d for d in sorted(drops) if context.instance.has_dynamic_partition(source_shards.name, d)]
        last = events.records[-1].storage_id
        return SensorResult(
            run_requests=[RunRequest(run_key=f"selected:{drops[d]}:{d}", partition_key=d, asset_selection=targets)
                          for d in known],
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
