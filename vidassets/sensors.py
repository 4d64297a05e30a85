"""The bucket sensor: finds complete new drops, adds their partitions and requests their ingest.

One code path for local directories and S3 (the bucket resource hides which). A drop is added
once: its key goes into the cursor and becomes a dynamic partition, and either fact is enough to
skip it later. Incomplete drops (see ``vidassets.ingest.drops``) are left for a later tick.
"""


import json

from dagster import (
    AssetsDefinition,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

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
