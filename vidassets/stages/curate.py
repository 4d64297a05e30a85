"""Curate stage: ``clip_scores`` and ``clip_embeddings`` per partition (score, don't delete), then
the global ``dedup_groups`` (incremental) and ``selection`` (a recipe over saved rows)."""

import time

import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets.config import Settings
from vidassets.curate import clusters, dedup
from vidassets.curate import decontamination as decontam
from vidassets.curate.embeddings import embed_partition, embed_videos, embedder
from vidassets.curate.scores import cascade_gates, score_partition
from vidassets.curate.selection import (
    SelectionState,
    changed_drops,
    decision_context,
    generated_copies,
    reselect_drops,
)
from vidassets.media import drop_steps as media_work
from vidassets.models import model_calls_total
from vidassets.resources import BucketResource, EvalVaultResource, StoreResource
from vidassets.runtime.sandbox import Sandbox
from vidassets.stages.common import GlobalInputs, asset_args, kept, model_registry, result, shot_model, step_engine
from vidassets.storage.blobs import vector_of
from vidassets.storage.rows import StepStats, records
from vidassets.versions import RowVersion, Versions


def curate_assets(settings: Settings, versions: Versions) -> list:
    max_runs = settings.execution.max_runs
    emb = settings.embeddings
    recipe = versions.recipe

    registry = model_registry(settings)

    def load_embedder():
        return embedder(registry, emb.model, emb.weights)

    @asset(**asset_args("eval_features", settings, versions))
    def eval_features(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                      eval_vault: EvalVaultResource) -> MaterializeResult:
        key = context.partition_key
        vault = eval_vault.tables()
        vault_objects = vault.objects
        videos = media_work.canonical_videos(vault.read_or_empty("eval_assets", key), store.tables().read("raw_inventory", key))
        probe_rows, probe_stats = media_work.probe_partition(
            bucket.open(), videos, vault.read_or_empty("eval_video_probe", key), RowVersion(versions.own("video_probe")),
            settings.probe, max_runs, log=context.log.info)
        vault.write("eval_video_probe", key, probe_rows)
        analysis_rows, frame_rows, stats = media_work.analyze_partition(
            bucket.open(), vault_objects, videos, probe_rows, vault.read_or_empty("eval_video_analysis", key),
            vault.read_or_empty("eval_context_frames", key), RowVersion(versions.own("video_analysis")),
            settings.analysis, settings.probe, max_runs, context.log.info, shot_model(settings))
        vault.write("eval_context_frames", key, frame_rows)
        vault.write("eval_video_analysis", key, analysis_rows)
        embed_rows, embed_stats = embed_videos(
            vault_objects, vault.read("eval_context_frames", key), [r for r in analysis_rows if r["status"] != "failed"],
            vault.read_or_empty("eval_embeddings", key), versions.row("eval_features"), load_embedder, max_runs,
            settings.decontamination.eval_segment_s, settings.models.batch_frames)
        vault.write("eval_embeddings", key, embed_rows)
        return MaterializeResult(metadata={
            "rows_in": len(videos), "rows_out": len(embed_rows), "frames_decoded": stats.frames_decoded,
            "model_calls": embed_stats.model_calls, "rows_reused": probe_stats.reused,
            "rows_computed": probe_stats.computed + stats.computed + embed_stats.computed,
        })

    @asset(**asset_args("clip_scores", settings, versions, metadata={"score_versions": versions.scores}))
    def clip_scores(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        rows, stats = score_partition(
            store.objects(), tables.read("clips", key), tables.read("video_analysis", key),
            tables.read("frame_index", key), tables.read("video_probe", key), tables.read("context_frames", key),
            tables.previous("clip_scores", key), versions.score_rows(), settings.scores, max_runs, registry,
            cascade_gates(settings.scores, recipe.score_rules), step_engine(settings))
        tables.write("clip_scores", key, rows)
        return result(stats, rows, versions.own("clip_scores"), kill_rate_by_rule=_kill_rates(rows, recipe))

    @asset(**asset_args("clip_embeddings", settings, versions))
    def clip_embeddings(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        rows, stats = embed_partition(store.objects(), tables.read("clips", key), tables.read("context_frames", key),
                                      tables.previous("clip_embeddings", key), versions.row("clip_embeddings"),
                                      load_embedder, max_runs, settings.models.batch_frames, step_engine(settings))
        tables.write("clip_embeddings", key, rows)
        return result(stats, rows, versions.own("clip_embeddings"), embedder=emb.model)

    @asset(**asset_args("dedup_groups", settings, versions))
    def dedup_groups(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        tables, objects = store.tables(), store.objects()
        seen = GlobalInputs(store, "dedup_groups", versions.full("dedup_groups"),
                            [(tables, "clips"), (tables, "context_frames"), (tables, "clip_embeddings"),
                             (tables, "raw_inventory")])
        if seen.unchanged(tables, "dedup_groups"):
            return kept(tables, "dedup_groups", versions.own("dedup_groups"))
        fingerprints = seen.fingerprints(tables, ("clips", "context_frames", "clip_embeddings", "raw_inventory"),
                                         over="clip_embeddings")

        def load(part: str) -> dedup.PartitionFeatures:
            return dedup.PartitionFeatures(held_clips(tables, "clips", part), tables.read("context_frames", part),
                                           tables.read("clip_embeddings", part))

        state, done = dedup.update(dedup.DedupState.load(objects), versions.full("dedup_groups"), fingerprints, load,
                                   settings.dedup)
        state.save(objects)
        rows = dedup.group_rows(state, versions.row("dedup_groups"), state.changed_shards)
        tables.write_groups("dedup_groups", rows, state.changed_shards)
        seen.remember()
        return result(StepStats(rows_in=len(state.clip_ids), computed=len(rows), reused=len(state.clip_ids) - len(rows)),
                      rows, versions.own("dedup_groups"), **done, **dedup.group_counts(state),
                      drops_rewritten=_rewritten(state.changed_shards))

    @asset(**asset_args("clip_clusters", settings, versions))
    def clip_clusters(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        tables, objects = store.tables(), store.objects()
        own = versions.own("clip_clusters")
        seen = GlobalInputs(store, "clip_clusters", versions.full("clip_clusters"),
                            [(tables, "clip_embeddings"), (tables, "raw_inventory")])
        if seen.unchanged(tables, "clip_clusters"):
            return kept(tables, "clip_clusters", own)
        fingerprints = seen.fingerprints(tables, ("clip_embeddings", "raw_inventory"), over="clip_embeddings")
        done = clusters.update(objects, fingerprints, lambda part: held_clips(tables, "clip_embeddings", part),
                               own, versions.full("clip_clusters"), versions.row("clip_clusters"), settings.clusters)
        if done.rows is None:  # too few embeddings yet: nothing assigned, tried again on the next run
            context.log.info(f"clip_clusters: {done.meta['waiting']}")
            return result(StepStats(), [], own, **done.meta)
        tables.write_groups("clip_clusters", done.rows, done.changed)
        done.remember()
        seen.remember()
        sizes = tables.read("clip_clusters").cluster.value_counts().sort_index()
        return result(StepStats(rows_in=len(done.rows), computed=len(done.rows)), done.rows, own,
                      drops_rewritten=len(done.changed), centroids_trained=done.meta["trained"],
                      centroids_trained_on=done.meta["trained_on"],
                      clips_per_cluster={int(c): int(n) for c, n in sizes.items()})

    @asset(**asset_args("decontamination", settings, versions))
    def decontamination(context: AssetExecutionContext, store: StoreResource,
                        eval_vault: EvalVaultResource) -> MaterializeResult:
        tables, vault = store.tables(), eval_vault.tables()
        seen = GlobalInputs(store, "decontamination", versions.full("decontamination"),
                            [(tables, "clips"), (tables, "context_frames"), (tables, "clip_embeddings"),
                             (tables, "raw_inventory"), (vault, "eval_context_frames"), (vault, "eval_embeddings")])
        if seen.unchanged(tables, "decontamination"):
            return kept(tables, "decontamination", versions.own("decontamination"))
        started, objects, full_version = time.perf_counter(), store.objects(), versions.full("decontamination")
        train = seen.fingerprints(tables, ("clips", "context_frames", "clip_embeddings", "raw_inventory"), over="clips")
        evals = seen.fingerprints(vault, decontam.EVAL_TABLES)
        state, done = decontam.update(
            decontam.DecontaminationState.load(objects, full_version), full_version, train, evals,
            lambda part: decontam.TrainPart(held_clips(tables, "clips", part), tables.read_or_empty("context_frames", part),
                                                   tables.read_or_empty("clip_embeddings", part)),
            lambda part: decontam.EvalPart(vault.read_or_empty("eval_context_frames", part),
                                                  vault.read_or_empty("eval_embeddings", part)),
            settings.decontamination)
        state.save(objects)
        rows = state.rows(settings.decontamination, versions.row("decontamination"), state.changed_shards)
        tables.write_groups("decontamination", rows, state.changed_shards)
        seen.remember()
        stats = StepStats(rows_in=len(state.clips), computed=done["new_clips"], reused=len(state.clips) - done["new_clips"],
                          seconds=time.perf_counter() - started)
        return result(stats, rows, versions.own("decontamination"), **done,
                      contaminated=state.contaminated(settings.decontamination),
                      drops_rewritten=_rewritten(state.changed_shards))

    @asset(**asset_args("selection", settings, versions))
    def selection(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        calls, tasks, started = model_calls_total(), Sandbox.tasks_total, time.perf_counter()
        tables = store.tables()
        seen = GlobalInputs(store, "selection", versions.full("selection"),
                            [(tables, "clip_scores"), (tables, "dedup_groups"), (tables, "decontamination"),
                             (tables, "clip_embeddings"), (tables, "raw_inventory")])
        if seen.unchanged(tables, "selection"):
            stored = tables.read("selection")
            return result(StepStats(rows_in=len(stored), reused=len(stored)), stored[stored.decision == "pass"],
                          versions.own("selection"), inputs_unchanged=True, changed_drops=[], drops_changed=0)
        objects, full_version = store.objects(), versions.full("selection")
        state = SelectionState.load(objects, full_version)
        stored = tables.read_or_empty("selection")
        previous_rows = stored if state.version else stored.iloc[0:0]
        covered = seen.fingerprints(tables, ("clip_scores", "clip_embeddings", "raw_inventory"), over="clip_scores")
        new_inputs = {p for p, fp in covered.items() if state.covered.get(p) != fp} | (set(state.covered) - set(covered))
        fresh_scores = {p: held_clips(tables, "clip_scores", p) for p in sorted(new_inputs & set(covered))}
        clips = pd.concat([state.context[~state.context.source_shard.isin(new_inputs)],
                           *[f for f in fresh_scores.values() if len(f)]])[["clip_id", "source_shard", "asset_id"]]
        contaminated = tables.read_or_empty("decontamination")
        excluded = set(contaminated.loc[contaminated.contaminated.astype(bool), "clip_id"]) if len(contaminated) else set()
        groups = tables.read_or_empty("dedup_groups")
        generated = (generated_copies(clips, groups, synthetic_assets(tables))
                     if settings.near_duplicates.firewall_generated else set())
        current = decision_context(clips, groups, excluded, generated)

        def load(shards: list[str]) -> tuple[pd.DataFrame, dict]:
            scores = [fresh_scores[p] if p in fresh_scores else held_clips(tables, "clip_scores", p) for p in shards]
            embeddings = [tables.read_or_empty("clip_embeddings", p) for p in shards]
            vectors = {r.clip_id: vector_of(r.vector) for e in embeddings if len(e) for r in e.itertuples()
                       if r.status == "ok"}
            return (pd.concat(scores) if scores else pd.DataFrame()), vectors

        rows, drops, decided = reselect_drops(recipe, versions.row("selection"), previous_rows, state.context, current,
                                              new_inputs, load)
        if not state.version:
            drops = None  # built from scratch: the whole table is replaced
        before = stored[stored.source_shard.isin(drops)] if drops is not None and len(stored) else stored
        changed = changed_drops(records(before), rows)
        tables.write_groups("selection", rows, drops)
        tables.write_groups("selection_pass", [r for r in rows if r["decision"] == "pass"], drops)
        tables.write_groups("selection_reject", [r for r in rows if r["decision"] == "reject"], drops)
        SelectionState(full_version, covered, current).save(objects)
        seen.remember()
        standing = stored[~stored.source_shard.isin(drops)] if drops is not None and len(stored) else stored.iloc[0:0]
        everything = pd.concat([standing[["decision", "first_failed_rule", "tier"]],
                                pd.DataFrame(rows, columns=["decision", "first_failed_rule", "tier"])], ignore_index=True)
        failed = everything.first_failed_rule.dropna()
        stats = StepStats(rows_in=len(everything), computed=decided, reused=len(everything) - decided,
                          model_calls=model_calls_total() - calls, frames_decoded=Sandbox.tasks_total - tasks, seconds=time.perf_counter() - started)
        return result(stats, everything[everything.decision == "pass"], versions.own("selection"),
                      rejected_by_rule={k: int(v) for k, v in failed.value_counts().sort_index().items()},
                      recipe=recipe.name, recipe_hash=recipe.digest,
                      waiting_for_score_retry=int(failed.str.startswith("error:").sum()),
                      changed_drops=changed, drops_changed=len(changed), drops_with_new_inputs=len(new_inputs),
                      drops_rewritten=_rewritten(drops),
                      tiers={str(k): int(v) for k, v in everything.tier.dropna().value_counts().sort_index().items()})

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

    return [eval_features, clip_scores, clip_embeddings, dedup_groups, clip_clusters, decontamination, selection,
            selection_is_decontaminated]


def _kill_rates(rows: list[dict], recipe) -> dict[str, float]:
    """Share of this partition's clips each recipe score rule (and the safety kill) would reject;
    scores that could not be computed are not counted as rejections."""
    rates = {}
    for rule in recipe.score_rules:
        values = [r["value"] for r in rows if r["score"] == rule.score and r["status"] != "error"]
        if values:
            rates[rule.name] = round(sum(not rule.check(v) for v in values) / len(values), 4)
    clips = {r["clip_id"] for r in rows}
    if clips:
        rates["safety"] = round(len({r["clip_id"] for r in rows if r["kill"]}) / len(clips), 4)
    return rates


def _rewritten(drops: set[str] | None) -> int | str:
    """How many drops' rows a global step wrote (``write_groups``; None: the whole table)."""
    return len(drops) if drops is not None else "all"


def synthetic_assets(tables) -> set[str]:
    """Assets tagged model-generated at ingest (the generated-footage registry)."""
    inventory = tables.read_all("raw_inventory")
    if not len(inventory) or "synthetic" not in inventory:
        return set()
    return set(inventory.loc[inventory.synthetic.fillna(False).astype(bool), "asset_id"].dropna())


def held_clips(tables, table: str, part: str) -> pd.DataFrame:
    """A partition's rows of a clip table, for the assets the partition holds now (its inventory
    has their canonical copy): while a canonical copy moves between drops, the releasing drop's
    rows may outlive its release for a moment, and the global stages must never see a clip twice."""
    rows = tables.read(table, part)
    inventory = tables.read_or_empty("raw_inventory", part)
    if not len(rows) or not len(inventory):
        return rows
    held = set(inventory.loc[(inventory.status == "ok") & inventory.duplicate_of.isna(), "asset_id"])
    return rows[rows.asset_id.isin(held)]
