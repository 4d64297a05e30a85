"""Train-facing stage: ``dataset_snapshot``, a frozen manifest over the catalog, materialized on
request (``vidassets snapshot create`` or the UI), with takedowns applied and an eval-leakage check."""

from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetsDefinition,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets.config import Settings
from vidassets.curate.selection import DEFAULT_RECIPE, load_recipe
from vidassets.resources import StoreResource
from vidassets.train.snapshot import build_samples, read_snapshot, read_tombstones, snapshot_versions, write_snapshot

GROUP = "train"


def train_assets(settings: Settings, selection: AssetsDefinition, latents: AssetsDefinition,
                 annotations: AssetsDefinition, text_embeddings: AssetsDefinition) -> tuple[list, list]:
    versions = settings.versions

    @asset(op_tags=settings.compute.op_tags("dataset_snapshot"), group_name=GROUP,
           deps=[selection, latents, annotations, text_embeddings], code_version="snapshot-v1",
           description="A frozen, versioned manifest snapshots/v<N>/: every training sample (selected clip with "
           "latents) with provenance, bucket, stream, tier and the version of everything it uses; takedowns "
           "applied; never copies media. Materialized on request.")
    def dataset_snapshot(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        tables, objects = store.tables(), store.objects()
        recipe = load_recipe(settings.selection.recipe)
        kinds = versions.annotation_kinds
        caption_version = recipe.captions.version or kinds["captions"]
        stones = read_tombstones(objects)
        samples, excluded, decisions = build_samples(tables, stones, caption_version, recipe.captions.level,
                                                     versions.latents, versions.text_embeddings)
        recipe_path = Path(settings.selection.recipe) if settings.selection.recipe else DEFAULT_RECIPE
        meta = {"recipe": recipe.name, "recipe_hash": recipe.digest, "tombstones": len(stones),
                "versions": {"selection": versions.selection, "scores": versions.scores, "annotations": kinds,
                             "latents": versions.latents, "text_embeddings": versions.text_embeddings,
                             "clip_embeddings": versions.clip_embeddings, "clips": versions.clips},
                "caption_version": caption_version, "caption_level": recipe.captions.level}
        version = write_snapshot(objects, samples, excluded, decisions, meta, recipe_path.read_text())
        context.log.info(f"wrote snapshot v{version}: {len(samples)} samples, {len(excluded)} excluded")
        return MaterializeResult(metadata={
            "snapshot": version, "rows_in": len(decisions), "rows_out": len(samples), "excluded": len(excluded),
            "excluded_by_reason": excluded.reason.value_counts().to_dict() if len(excluded) else {},
            "samples_by_bucket": samples.bucket.value_counts().to_dict() if len(samples) else {},
            "samples_by_stream": samples.stream.value_counts().to_dict() if len(samples) else {},
            "model_calls": 0, "frames_decoded": 0,
        })

    @asset_check(asset=dataset_snapshot, blocking=True,
                 description="The newest snapshot holds no clip matching eval material and no eval-vault asset.")
    def snapshot_has_no_eval_leakage(store: StoreResource) -> AssetCheckResult:
        tables, objects = store.tables(), store.objects()
        found = snapshot_versions(objects)
        if not found:
            return AssetCheckResult(passed=True, metadata={"snapshot": "none"})
        samples = read_snapshot(objects, found[-1])
        deco = tables.read_or_empty("decontamination")
        bad = set(samples.clip_id) & set(deco.loc[deco.contaminated.astype(bool), "clip_id"]) if len(deco) else set()
        eval_assets = set(store.eval_vault().read_all("eval_assets").asset_id)
        leaked_assets = set(samples.asset_id) & eval_assets
        return AssetCheckResult(passed=not bad and not leaked_assets, severity=AssetCheckSeverity.ERROR,
                                metadata={"snapshot": found[-1], "samples": len(samples),
                                          "matching_eval_material": len(bad), "eval_assets": len(leaked_assets)})

    return [dataset_snapshot], [snapshot_has_no_eval_leakage]
