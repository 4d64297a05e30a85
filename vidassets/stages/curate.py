"""Curate stage: ``clip_scores`` and ``clip_embeddings`` per partition (score, don't delete), then
the global ``dedup_groups`` (incremental) and ``selection`` (a recipe over saved rows)."""

import time

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets.config import Settings
from vidassets.curate import dedup
from vidassets.curate.decontamination import DecontaminationParams, match
from vidassets.curate.embeddings import embed_partition, embed_videos, embedder, vector_of
from vidassets.curate.scores import score_partition
from vidassets.curate.selection import load_recipe, select
from vidassets.media import partition as media_work
from vidassets.media.sandbox import Sandbox
from vidassets.models import model_calls_total
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource, StoreResource

GROUP = "curate"
AUTOMATION = AutomationCondition.eager() | AutomationCondition.code_version_changed()


def curate_assets(settings: Settings, clips: AssetsDefinition, frame_index: AssetsDefinition,
                  eval_split: AssetsDefinition) -> list:
    versions = settings.versions

    @asset(op_tags=settings.compute.op_tags("eval_features"), partitions_def=source_shards, group_name="eval", deps=[eval_split],
           code_version=f"eval-features-v1+{versions.video_probe}+{versions.video_analysis}+{versions.clip_embeddings}",
           automation_condition=AUTOMATION,
           description="Probe, analysis (PDQ-hashed context frames) and one embedding per eval video, written only "
           "to the eval vault: the material decontamination matches train clips against.")
    def eval_features(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        vault, vault_objects = store.eval_vault(), store.eval_vault().objects
        videos = media_work.canonical_videos(vault.read_or_empty("eval_assets", key), store.tables().read("raw_inventory", key))
        probe_rows, probe_stats = media_work.probe_partition(
            bucket.open(), videos, vault.read_or_empty("eval_video_probe", key), settings, log=context.log.info)
        vault.write("eval_video_probe", key, probe_rows)
        analysis_rows, frame_rows, stats = media_work.analyze_partition(
            bucket.open(), vault_objects, videos, probe_rows, vault.read_or_empty("eval_video_analysis", key),
            vault.read_or_empty("eval_context_frames", key), settings, context.log.info)
        vault.write("eval_context_frames", key, frame_rows)
        vault.write("eval_video_analysis", key, analysis_rows)
        emb = settings.embeddings
        embed_rows, embed_stats = embed_videos(
            vault_objects, vault.read("eval_context_frames", key), [r for r in analysis_rows if r["status"] != "failed"],
            vault.read_or_empty("eval_embeddings", key), versions.clip_embeddings, lambda: embedder(emb.model, emb.weights))
        vault.write("eval_embeddings", key, embed_rows)
        return MaterializeResult(metadata={
            "rows_in": len(videos), "rows_out": len(embed_rows), "frames_decoded": stats.frames_decoded,
            "model_calls": embed_stats.model_calls, "rows_reused": probe_stats.reused,
        })

    @asset(op_tags=settings.compute.op_tags("clip_scores"), partitions_def=source_shards, group_name=GROUP, deps=[clips, frame_index], code_version=versions.clip_scores,
           automation_condition=AUTOMATION, metadata={"score_versions": versions.scores},
           description="Per clip and score (optical, motion, static, bitrate, text, quality, nsfw, faces): value in "
           "[0, 1], evidence, status and the score's own version. NSFW above the threshold is a hard kill.")
    def clip_scores(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        rows, stats = score_partition(
            store.objects(), tables.read("clips", key), tables.read("video_analysis", key),
            tables.read("frame_index", key), tables.read("video_probe", key), tables.read("context_frames", key),
            tables.read_or_empty("clip_scores", key), settings)
        tables.write("clip_scores", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused, "rows_computed": stats.computed,
            "score_errors": stats.errors, "safety_kills": stats.kills, "model_calls": stats.model_calls,
            "frames_decoded": stats.decodes, "computed_by_score": stats.by_score,
            "kill_rate_by_rule": _kill_rates(rows, load_recipe(settings.selection.recipe)), "producer_version": versions.clip_scores,
        })

    @asset(op_tags=settings.compute.op_tags("clip_embeddings"), partitions_def=source_shards, group_name=GROUP, deps=[clips], code_version=versions.clip_embeddings,
           automation_condition=AUTOMATION,
           description="One L2-normalised visual embedding per clip, mean-pooled over its context frames "
           f"(embedder: {settings.embeddings.model}).")
    def clip_embeddings(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        emb = settings.embeddings
        rows, stats = embed_partition(store.objects(), tables.read("clips", key), tables.read("context_frames", key),
                                      tables.read_or_empty("clip_embeddings", key), versions.clip_embeddings,
                                      lambda: embedder(emb.model, emb.weights))
        tables.write("clip_embeddings", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused, "rows_computed": stats.computed,
            "model_calls": stats.model_calls, "no_frames": stats.missing, "frames_decoded": 0,
            "producer_version": versions.clip_embeddings,
        })

    @asset(op_tags=settings.compute.op_tags("dedup_groups"), group_name=GROUP, deps=[clip_embeddings, clip_scores], code_version=versions.dedup_groups,
           automation_condition=AUTOMATION,
           description="Perceptual (PDQ Hamming) and semantic (cosine) near-duplicate groups over all partitions, "
           "each with its own group id, size and evidence. Incremental: new partitions query stored indexes.")
    def dedup_groups(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        tables, objects = store.tables(), store.objects()
        d = settings.dedup
        params = dedup.DedupParams(d.max_hamming, d.min_frame_share, d.semantic_k, d.semantic_min_cosine)
        fingerprints = _fingerprints(tables, tables.partitions("clip_embeddings"), ("clips", "context_frames", "clip_embeddings"))

        def load(part: str) -> dedup.PartitionFeatures:
            return dedup.PartitionFeatures(tables.read("clips", part), tables.read("context_frames", part),
                                           tables.read("clip_embeddings", part))

        state, done = dedup.update(dedup.DedupState.load(objects), versions.dedup_groups, fingerprints, load, params)
        state.save(objects)
        rows = dedup.group_rows(state, versions.dedup_groups)
        tables.write("dedup_groups", None, rows)
        return MaterializeResult(metadata={
            "rows_in": len(rows), "rows_out": len(rows), **done,
            "perceptual_groups_gt1": len({r["pdq_group"] for r in rows if r["pdq_group_size"] > 1}),
            "semantic_groups_gt1": len({r["semantic_group"] for r in rows if r["semantic_group_size"] > 1}),
            "model_calls": 0, "frames_decoded": 0, "producer_version": versions.dedup_groups,
        })

    @asset(op_tags=settings.compute.op_tags("decontamination"), group_name=GROUP, deps=[eval_features, clip_embeddings, clips], code_version=f"decontamination-v1+{versions.dedup_groups}",
           automation_condition=AUTOMATION,
           description="Every train clip matched against eval-vault material (PDQ frames and embeddings); "
           "matches are recorded here and excluded by selection.")
    def decontamination(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        tables, vault = store.tables(), store.eval_vault()
        d = settings.dedup
        rows = match(tables.read_all("clips"), tables.read_all("context_frames"), tables.read_all("clip_embeddings"),
                     vault.read_all("eval_context_frames"), vault.read_all("eval_embeddings"),
                     DecontaminationParams(d.max_hamming, 0.5, d.semantic_min_cosine), f"decontamination-v1+{versions.dedup_groups}")
        tables.write("decontamination", None, rows)
        return MaterializeResult(metadata={
            "rows_in": len(rows), "rows_out": sum(r["contaminated"] for r in rows),
            "contaminated": sum(r["contaminated"] for r in rows), "model_calls": 0, "frames_decoded": 0,
        })

    @asset(op_tags=settings.compute.op_tags("selection"), group_name=GROUP, deps=[dedup_groups, clip_scores, decontamination], code_version=versions.selection,
           automation_condition=AUTOMATION,
           description="The selection recipe applied to saved scores and groups: pass/reject per clip, the first "
           "rule that rejected it, every rule's outcome and the tier. Makes no model call and no decode.")
    def selection(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        calls, tasks, started = model_calls_total(), Sandbox.tasks_total, time.perf_counter()
        tables = store.tables()
        recipe = load_recipe(settings.selection.recipe)
        embeddings = tables.read_all("clip_embeddings")
        vectors = {r.clip_id: vector_of(r.vector) for r in embeddings.itertuples() if r.status == "ok"}
        contaminated = tables.read_or_empty("decontamination")
        excluded = set(contaminated.loc[contaminated.contaminated.astype(bool), "clip_id"]) if len(contaminated) else set()
        rows = select(recipe, tables.read_all("clip_scores"), tables.read_or_empty("dedup_groups"), vectors,
                      versions.selection, excluded)
        tables.write("selection", None, rows)
        tables.write("selection_pass", None, [r for r in rows if r["decision"] == "pass"])
        tables.write("selection_reject", None, [r for r in rows if r["decision"] == "reject"])
        rejected: dict[str, int] = {}
        for r in rows:
            if r["first_failed_rule"]:
                rejected[r["first_failed_rule"]] = rejected.get(r["first_failed_rule"], 0) + 1
        return MaterializeResult(metadata={
            "rows_in": len(rows), "rows_out": sum(r["decision"] == "pass" for r in rows),
            "rejected_by_rule": rejected, "recipe": recipe.name, "recipe_hash": recipe.digest,
            "tiers": {t: sum(r["tier"] == t for r in rows) for t in sorted({r["tier"] for r in rows if r["tier"]})},
            "model_calls": model_calls_total() - calls, "frames_decoded": Sandbox.tasks_total - tasks,
            "seconds": round(time.perf_counter() - started, 3), "producer_version": versions.selection,
        })

    @asset_check(asset=selection, blocking=True,
                 description="No selected clip may match eval material (decontamination).")
    def selection_is_decontaminated(store: StoreResource) -> AssetCheckResult:
        tables = store.tables()
        chosen = tables.read_or_empty("selection")
        chosen = set(chosen.loc[chosen.decision == "pass", "clip_id"]) if len(chosen) else set()
        matches = tables.read_or_empty("decontamination")
        bad = sorted(chosen & set(matches.loc[matches.contaminated.astype(bool), "clip_id"])) if len(matches) else []
        return AssetCheckResult(passed=not bad, severity=AssetCheckSeverity.ERROR,
                                metadata={"selected": len(chosen), "selected_matching_eval": len(bad),
                                          "examples": bad[:10]})

    return [eval_features, clip_scores, clip_embeddings, dedup_groups, decontamination, selection,
            selection_is_decontaminated]


def _kill_rates(rows: list[dict], recipe) -> dict[str, float]:
    """Share of this partition's clips each recipe score rule (and the safety kill) would reject."""
    rates = {}
    for rule in recipe.score_rules:
        values = [r["value"] for r in rows if r["score"] == rule.score]
        if values:
            rates[rule.name] = round(sum(not rule.check(v) for v in values) / len(values), 4)
    clips = {r["clip_id"] for r in rows}
    if clips:
        rates["safety"] = round(len({r["clip_id"] for r in rows if r["kill"]}) / len(clips), 4)
    return rates


def _fingerprints(tables, partitions: list[str], names: tuple[str, ...]) -> dict[str, str]:
    """Per partition, the versions of the table files dedup reads: a rebuilt table changes it."""
    return {part: "|".join(str(tables.version(name, part)) for name in names) for part in partitions}
