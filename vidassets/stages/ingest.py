"""Ingest stage: ``raw_inventory`` (what is in each drop, with provenance and exact duplicates) and
``eval_split`` (the eval carve-out, before any other stage sees the data)."""


import time

from dagster import AssetCheckResult, AssetCheckSeverity, AssetExecutionContext, MaterializeResult, ResourceParam

from vidassets import catalog
from vidassets.ingest.drops import Drop
from vidassets.ingest.duplicates import mark_canonical
from vidassets.ingest.eval_split import split_changes, split_rows
from vidassets.ingest.inventory import inventory_drop
from vidassets.resources import BucketResource, EvalVaultResource, Pipeline, StoreResource
from vidassets.stages.common import freshness, stage_asset, stage_check
from vidassets.storage.rows import records

HANDOFF_TABLES = tuple(t for a in catalog.ASSETS if a.partitioned and a.name not in ("raw_inventory", "eval_split")
                       and not a.vault for t in a.tables)
"""Tables whose rows of an asset move with it when its canonical copy moves to another drop."""


def _inventory_freshness(settings, versions) -> dict:
    return {"freshness_policy": freshness(settings.freshness.inventory_within_hours)}


@stage_asset("raw_inventory", _inventory_freshness)
def raw_inventory(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                  pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    run = pipeline.run(context, store)
    drop = Drop.from_key(run.key)
    previous = run.tables.read_or_empty("raw_inventory", drop.key)
    version = run.versions.own("raw_inventory")
    rows, stats = inventory_drop(bucket.open(), drop, run.settings.ingest, version, previous,
                                 marker=run.settings.bucket.marker)
    handed: dict[str, int] = {}

    def hand_over(asset_id: str, copy: dict) -> None:
        handed[asset_id] = run.tables.hand_over(HANDOFF_TABLES, drop.key, copy["source_shard"], asset_id,
                                                {"uri": copy["uri"], "source_shard": copy["source_shard"]})

    canonical = mark_canonical(rows, records(previous), run.objects, run.settings.ingest.tier_priority, drop.key,
                               hand_over)
    run.tables.write("raw_inventory", drop.key, rows)
    if canonical.requests:
        context.log.info(f"canonical copies moving: drops {sorted(canonical.requests)} must ingest again")
    mb = stats.extra.get("bytes_hashed", 0) / 1e6
    return MaterializeResult(metadata={
        "rows_in": stats.rows_in, "rows_out": len(rows), "rows_by_status": dict(sorted(stats.by_status.items())),
        "exact_duplicates": canonical.duplicates, "canonical_requests": sorted(canonical.requests),
        "released_assets": len(canonical.released), "rows_handed_over": sum(handed.values()),
        "rows_reused": stats.reused, "rows_computed": stats.computed, "mb_hashed": round(mb, 3),
        "hash_mb_per_s": round(mb / stats.seconds, 1) if stats.seconds else 0.0, "producer_version": version})


@stage_asset("eval_split")
def eval_split(context: AssetExecutionContext, store: StoreResource, eval_vault: EvalVaultResource,
               pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    started = time.perf_counter()
    run = pipeline.run(context, store, eval_vault)
    ev, version = run.settings.eval, run.versions.own("eval_split")
    inventory = run.which.read("raw_inventory", run.key).to_dict("records")
    train, evals = split_rows(inventory, ev.salt, ev.fraction_for, version)
    before = [*records(run.tables.read_or_empty("eval_split", run.key)),
              *records(run.vault.read_or_empty("eval_assets", run.key))]
    changed = split_changes(before, inventory, ev.salt, ev.fraction_for, version)
    # Vault first: if the train write fails, nothing eval-side can be missing from the vault.
    run.vault.write("eval_assets", run.key, evals)
    run.tables.write("eval_split", run.key, train)
    return MaterializeResult(metadata={
        "rows_in": len(inventory), "rows_out": len(train), "eval_rows": len(evals), "rows_computed": len(changed),
        "rows_reused": len(train) + len(evals) - len(changed), "eval_fraction_configured": ev.fraction,
        "eval_fraction_by_tier": dict(ev.fraction_by_tier),
        "synthetic_rows": sum(bool(r.get("synthetic")) for r in inventory),
        "seconds": round(time.perf_counter() - started, 3), "producer_version": version})


@stage_check("eval_split", "The eval vault is sealed from the training side: a local directory, or on S3 a key pair of "
             "its own that is not the store's. With eval.vault_shared_credentials: true (the store's credentials "
             "allowed on purpose) it warns on every run.")
def eval_vault_is_sealed(eval_vault: EvalVaultResource) -> AssetCheckResult:
    problem = eval_vault.sealing()
    return AssetCheckResult(passed=problem is None, severity=AssetCheckSeverity.WARN,
                            metadata={"vault": eval_vault.root, "problem": problem or "none",
                                      "shared_credentials_allowed": eval_vault.shared_credentials})
