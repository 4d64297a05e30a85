"""Ingest stage: ``raw_inventory`` (what is in each drop, with provenance and exact duplicates) and
``eval_split`` (the eval carve-out, before any other stage sees the data)."""


import time

from dagster import AssetExecutionContext, AssetsDefinition, MaterializeResult, asset

from vidassets import catalog
from vidassets.config import Settings
from vidassets.ingest.drops import Drop
from vidassets.ingest.duplicates import mark_canonical
from vidassets.ingest.eval_split import split_changes, split_rows
from vidassets.ingest.inventory import inventory_drop
from vidassets.resources import BucketResource, EvalVaultResource, StoreResource
from vidassets.stages.common import asset_args, freshness
from vidassets.storage.rows import records
from vidassets.versions import Versions

HANDOFF_TABLES = tuple(t for a in catalog.ASSETS if a.partitioned and a.name not in ("raw_inventory", "eval_split")
                       and not a.vault for t in a.tables)
"""Tables whose rows of an asset move with it when its canonical copy moves to another drop."""


def ingest_assets(settings: Settings, versions: Versions) -> list[AssetsDefinition]:
    inventory_version, split_version = versions.own("raw_inventory"), versions.own("eval_split")

    @asset(**asset_args("raw_inventory", settings, versions,
                        freshness_policy=freshness(settings.freshness.inventory_within_hours)))
    def raw_inventory(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        drop = Drop.from_key(context.partition_key)
        tables = store.tables()
        previous = tables.read_or_empty("raw_inventory", drop.key)
        rows, stats = inventory_drop(
            bucket.open(), drop, settings.ingest, inventory_version, previous, marker=settings.bucket.marker
        )
        handed = {}

        def hand_over(asset_id: str, copy: dict) -> None:
            handed[asset_id] = tables.hand_over(HANDOFF_TABLES, drop.key, copy["source_shard"], asset_id,
                                                {"uri": copy["uri"], "source_shard": copy["source_shard"]})

        canonical = mark_canonical(rows, records(previous), store.objects(), settings.ingest.tier_priority, drop.key,
                                   hand_over)
        duplicates = canonical.duplicates
        tables.write("raw_inventory", drop.key, rows)
        if canonical.requests:
            context.log.info(f"canonical copies moving: drops {sorted(canonical.requests)} must ingest again")
        mb = stats.bytes_hashed / 1e6
        return MaterializeResult(
            metadata={
                "rows_in": stats.objects_listed,
                "rows_out": stats.rows,
                "rows_by_status": dict(sorted(stats.by_status.items())),
                "exact_duplicates": duplicates,
                "canonical_requests": sorted(canonical.requests),
                "released_assets": len(canonical.released),
                "rows_handed_over": sum(handed.values()),
                "rows_reused": stats.rows_reused,
                "rows_computed": stats.rows - stats.rows_reused,
                "mb_hashed": round(mb, 3),
                "hash_mb_per_s": round(mb / stats.seconds_hashing, 1) if stats.seconds_hashing else 0.0,
                "producer_version": inventory_version,
            }
        )

    @asset(**asset_args("eval_split", settings, versions))
    def eval_split(context: AssetExecutionContext, store: StoreResource, eval_vault: EvalVaultResource) -> MaterializeResult:
        started = time.perf_counter()
        key = context.partition_key
        inventory = store.tables().read("raw_inventory", key)
        train, evals = split_rows(
            inventory.to_dict("records"), settings.eval.salt, settings.eval.fraction_for, split_version
        )
        before = [*records(store.tables().read_or_empty("eval_split", key)),
                  *records(eval_vault.tables().read_or_empty("eval_assets", key))]
        changed = split_changes(before, inventory.to_dict("records"), settings.eval.salt, settings.eval.fraction_for,
                                split_version)
        # Vault first: if the train write fails, nothing eval-side can be missing from the vault.
        eval_vault.tables().write("eval_assets", context.partition_key, evals)
        store.tables().write("eval_split", context.partition_key, train)
        return MaterializeResult(
            metadata={
                "rows_in": len(inventory),
                "rows_out": len(train),
                "eval_rows": len(evals),
                "rows_computed": len(changed),
                "rows_reused": len(train) + len(evals) - len(changed),
                "eval_fraction_configured": settings.eval.fraction,
                "eval_fraction_by_tier": dict(settings.eval.fraction_by_tier),
                "synthetic_rows": sum(bool(r.get("synthetic")) for r in inventory.to_dict("records")),
                "seconds": round(time.perf_counter() - started, 3),
                "producer_version": split_version,
            }
        )

    return [raw_inventory, eval_split]
