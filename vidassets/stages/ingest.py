"""Ingest stage: ``raw_inventory`` (what is in each drop, with provenance and exact duplicates) and
``eval_split`` (the eval carve-out, before any other stage sees the data)."""


import time

from dagster import AssetExecutionContext, AssetsDefinition, AutomationCondition, MaterializeResult, asset

from vidassets.config import Settings
from vidassets.ingest.drops import Drop
from vidassets.ingest.duplicates import mark_exact_duplicates
from vidassets.ingest.eval_split import split_rows
from vidassets.ingest.inventory import inventory_drop
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource, StoreResource

GROUP = "ingest"


def ingest_assets(settings: Settings) -> list[AssetsDefinition]:
    versions = settings.versions

    @asset(op_tags=settings.compute.op_tags("raw_inventory"),
        partitions_def=source_shards,
        group_name=GROUP,
        code_version=versions.raw_inventory,
        automation_condition=AutomationCondition.code_version_changed(),
        freshness_policy=settings.freshness.policy(settings.freshness.inventory_within_hours),
        description="One row per video file and tar member of a drop: uri, size, sha256 asset_id, "
        "provenance from the drop's sidecar, and duplicate_of for exact copies seen first elsewhere.",
    )
    def raw_inventory(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        drop = Drop.from_key(context.partition_key)
        tables = store.tables()
        previous = tables.read_or_empty("raw_inventory", drop.key)
        rows, stats = inventory_drop(
            bucket.open(), drop, settings.ingest, versions.raw_inventory, previous, marker=settings.bucket.marker
        )
        duplicates = mark_exact_duplicates(rows, store.objects())
        tables.write("raw_inventory", drop.key, rows)
        mb = stats.bytes_hashed / 1e6
        return MaterializeResult(
            metadata={
                "rows_in": stats.objects_listed,
                "rows_out": stats.rows,
                "rows_by_status": dict(sorted(stats.by_status.items())),
                "exact_duplicates": duplicates,
                "rows_reused": stats.rows_reused,
                "mb_hashed": round(mb, 3),
                "hash_mb_per_s": round(mb / stats.seconds_hashing, 1) if stats.seconds_hashing else 0.0,
                "producer_version": versions.raw_inventory,
            }
        )

    @asset(op_tags=settings.compute.op_tags("eval_split"),
        partitions_def=source_shards,
        group_name=GROUP,
        deps=[raw_inventory],
        code_version=versions.eval_split,
        automation_condition=AutomationCondition.eager() | AutomationCondition.code_version_changed(),
        description="Salted-hash carve-out of eval assets into the eval vault (a separate root); this "
        "table holds the train side only, which is all any later stage reads.",
    )
    def eval_split(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        started = time.perf_counter()
        inventory = store.tables().read("raw_inventory", context.partition_key)
        train, evals = split_rows(
            inventory.to_dict("records"), settings.eval.salt, settings.eval.fraction, versions.eval_split
        )
        # Vault first: if the train write fails, nothing eval-side can be missing from the vault.
        store.eval_vault().write("eval_assets", context.partition_key, evals)
        store.tables().write("eval_split", context.partition_key, train)
        return MaterializeResult(
            metadata={
                "rows_in": len(inventory),
                "rows_out": len(train),
                "eval_rows": len(evals),
                "eval_fraction_configured": settings.eval.fraction,
                "seconds": round(time.perf_counter() - started, 3),
                "producer_version": versions.eval_split,
            }
        )

    return [raw_inventory, eval_split]
