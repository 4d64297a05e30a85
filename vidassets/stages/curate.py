"""Curate stage: ``eval_features`` (the eval vault's side), ``clip_scores`` and ``clip_embeddings``
per partition (score, don't delete), then the global ``dedup_groups``, ``clip_clusters``,
``decontamination`` (each incremental) and ``selection`` (a recipe over saved rows)."""

import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MaterializeResult,
    ResourceParam,
)

from vidassets.curate import clusters, dedup
from vidassets.curate import decontamination as decontam
from vidassets.curate.embeddings import embed_partition, embed_videos
from vidassets.curate.eval_leaks import EvalLeaks
from vidassets.curate.scores import cascade_gates, rule_kill_rates, score_partition
from vidassets.curate.selection import reselect_incrementally
from vidassets.media import drop_steps
from vidassets.models import model_calls_total
from vidassets.resources import (
    BucketResource,
    DedupStateResource,
    EvalVaultResource,
    Execution,
    Models,
    Pipeline,
    SelectionStateResource,
    StageRun,
    StoreResource,
)
from vidassets.runtime.sandbox import Sandbox
from vidassets.stages.common import GlobalInputs, kept, result, stage_asset, stage_check, versions_metadata
from vidassets.storage.rows import RowVersion, StepStats
from vidassets.storage.sql import bound_version


@stage_asset("eval_features")
def eval_features(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
                  eval_vault: EvalVaultResource, pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution],
                  models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store, eval_vault)
    key, vault, own, embeddings = run.key, run.vault, run.versions.own, run.settings.embeddings
    videos = drop_steps.canonical_videos(run.vault_which.read_or_empty("eval_assets", key), run.which.read("raw_inventory", key))
    probe_rows, probe_stats = drop_steps.probe_partition(
        bucket.open(), videos, vault.read_or_empty("eval_video_probe", key), RowVersion(own("video_probe")),
        run.settings.probe, execution.max_runs, log=context.log.info)
    vault.write("eval_video_probe", key, probe_rows)
    analysis_rows, frame_rows, stats = drop_steps.analyze_partition(
        bucket.open(), vault.objects, videos, probe_rows, vault.read_or_empty("eval_video_analysis", key),
        vault.read_or_empty("eval_context_frames", key), RowVersion(own("video_analysis")), run.settings.analysis,
        run.settings.probe, execution.max_runs, context.log.info, models.shot_model(run.settings.analysis))
    vault.write("eval_context_frames", key, frame_rows)
    vault.write("eval_video_analysis", key, analysis_rows)
    embed_rows, embed_stats = embed_videos(
        vault.objects, vault.read("eval_context_frames", key), [r for r in analysis_rows if r["status"] != "failed"],
        vault.read_or_empty("eval_embeddings", key), run.versions.row("eval_features"),
        lambda: models.embedder(embeddings),
        execution.max_runs, run.settings.decontamination.eval_segment_s, models.batch_frames)
    vault.write("eval_embeddings", key, embed_rows)
    return MaterializeResult(metadata={
        "rows_in": len(videos), "rows_out": len(embed_rows), "frames_decoded": stats.frames_decoded,
        "model_calls": embed_stats.model_calls, "rows_reused": probe_stats.reused,
        "rows_computed": probe_stats.computed + stats.computed + embed_stats.computed})


@stage_asset("clip_scores", versions_metadata("score_versions", "scores"))
def clip_scores(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline],
                execution: ResourceParam[Execution], models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, tables, recipe = run.key, run.tables, run.recipe
    rows, stats = score_partition(
        run.objects, tables.read("clips", key), tables.read("video_analysis", key), tables.read("frame_index", key),
        tables.read("video_probe", key), tables.read("context_frames", key), tables.previous("clip_scores", key),
        run.versions.score_rows(), run.settings.scores, execution.max_runs, models.registry,
        cascade_gates(run.settings.scores, recipe.score_rules), execution.engine)
    tables.write("clip_scores", key, rows)
    return result(stats, rows, run.versions.own("clip_scores"), kill_rate_by_rule=_kill_rates(rows, recipe))


@stage_asset("clip_embeddings")
def clip_embeddings(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline],
                    execution: ResourceParam[Execution], models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, tables, embeddings = run.key, run.tables, run.settings.embeddings
    rows, stats = embed_partition(run.objects, tables.read("clips", key), tables.read("context_frames", key),
                                  tables.previous("clip_embeddings", key), run.versions.row("clip_embeddings"),
                                  lambda: models.embedder(embeddings), execution.max_runs, models.batch_frames,
                                  execution.engine)
    tables.write("clip_embeddings", key, rows)
    return result(stats, rows, run.versions.own("clip_embeddings"), embedder=embeddings.model)


@stage_asset("dedup_groups")
def dedup_groups(context: AssetExecutionContext, store: StoreResource, dedup_state: DedupStateResource,
                 pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    tables, objects, full = run.tables, run.objects, run.versions.full("dedup_groups")
    seen = GlobalInputs(objects, "dedup_groups", full, [(tables, "clips"), (tables, "context_frames"),
                                                         (tables, "clip_embeddings"), (run.which, "raw_inventory")])
    if seen.unchanged(tables, "dedup_groups"):
        return kept(tables, "dedup_groups", run.versions.own("dedup_groups"), seen)
    read = ("clips", "context_frames", "clip_embeddings", "raw_inventory")
    fingerprints = seen.fingerprints(tables, read, over="clip_embeddings")

    def load(part: str) -> dedup.PartitionFeatures:
        return dedup.PartitionFeatures(held_clips(run, "clips", part), tables.read("context_frames", part),
                                       tables.read("clip_embeddings", part))

    state = dedup_state.open()
    with state.database.held():  # one connection for the step's uses of the state
        done = dedup.update(state, bound_version(objects, full), fingerprints, load, run.settings.dedup,
                            execution.engine, changed=seen.changed(tables, read))
        rows = dedup.group_rows(state, run.versions.row("dedup_groups"), done.changed_shards)
        tables.write_groups("dedup_groups", rows, done.changed_shards)
        state.written()
        counts = dedup.group_counts(state)
    seen.remember()
    return result(StepStats(rows_in=done.size, computed=len(rows), reused=done.size - len(rows)),
                  rows, run.versions.own("dedup_groups"), **done.done, **counts,
                  **state.counters, drops_rewritten=_rewritten(done.changed_shards), **seen.metadata())


@stage_asset("clip_clusters")
def clip_clusters(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline],
                  execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    tables, own, full = run.tables, run.versions.own("clip_clusters"), run.versions.full("clip_clusters")
    seen = GlobalInputs(run.objects, "clip_clusters", full, [(tables, "clip_embeddings"), (run.which, "raw_inventory")])
    if seen.unchanged(tables, "clip_clusters"):
        return kept(tables, "clip_clusters", own, seen)
    read = ("clip_embeddings", "raw_inventory")
    done = clusters.update(run.objects, seen.fingerprints(tables, read, over="clip_embeddings"),
                           HeldClips(tables, run.which, "clip_embeddings"), own, full,
                           run.versions.row("clip_clusters"), run.settings.clusters, changed=seen.changed(tables, read),
                           engine=execution.engine)
    if done.rows is None:  # too few embeddings yet: nothing assigned, tried again on the next run
        context.log.info(f"clip_clusters: {done.meta['waiting']}")
        seen.remember()  # what it read; with no rows written, the next run tries again all the same
        return result(StepStats(), [], own, **done.meta, drops_read=done.drops_read, **seen.metadata())
    tables.write_groups("clip_clusters", done.rows, done.changed)
    done.remember()
    seen.remember()
    return result(StepStats(rows_in=len(done.rows), computed=len(done.rows)), done.rows, own,
                  drops_rewritten=len(done.changed), centroids_trained=done.meta["trained"],
                  centroids_trained_on=done.meta["trained_on"], clips_per_cluster=done.clips_per_cluster,
                  drops_read=done.drops_read, **seen.metadata())


@stage_asset("decontamination")
def decontamination(context: AssetExecutionContext, store: StoreResource, eval_vault: EvalVaultResource,
                    pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store, eval_vault)
    tables, vault, full, started = run.tables, run.vault, run.versions.full("decontamination"), time.perf_counter()
    seen = GlobalInputs(run.objects, "decontamination", full,
                        [(tables, "clips"), (tables, "context_frames"), (tables, "clip_embeddings"),
                         (run.which, "raw_inventory"), (vault, "eval_context_frames"), (vault, "eval_embeddings")])
    if seen.unchanged(tables, "decontamination"):
        return kept(tables, "decontamination", run.versions.own("decontamination"), seen)
    read = ("clips", "context_frames", "clip_embeddings", "raw_inventory")
    train = seen.fingerprints(tables, read, over="clips")
    settings = run.settings.decontamination
    state, done = decontam.update(
        decontam.DecontaminationState.load(run.objects, full, lazy=True), full, train,
        seen.fingerprints(vault, decontam.EVAL_TABLES, over=decontam.EVAL_TABLES[0]),
        lambda part: decontam.TrainPart(held_clips(run, "clips", part), tables.read_or_empty("context_frames", part),
                                        tables.read_or_empty("clip_embeddings", part)),
        lambda part: decontam.EvalPart(vault.read_or_empty("eval_context_frames", part),
                                       vault.read_or_empty("eval_embeddings", part)), settings,
        execution.vault_engine, changed=seen.changed(tables, read), eval_changed=seen.changed(vault, decontam.EVAL_TABLES))
    state.save(run.objects, settings)
    rows = state.rows(settings, run.versions.row("decontamination"), state.changed_shards)
    tables.write_groups("decontamination", rows, state.changed_shards)
    seen.remember()
    stats = StepStats(rows_in=state.size, computed=done["new_clips"], reused=state.size - done["new_clips"],
                      seconds=time.perf_counter() - started)
    return result(stats, rows, run.versions.own("decontamination"), **done, contaminated=state.contaminated(settings),
                  drops_rewritten=_rewritten(state.changed_shards), **seen.metadata())


@stage_asset("selection")
def selection(context: AssetExecutionContext, store: StoreResource, selection_state: SelectionStateResource,
              pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    calls, tasks, started = model_calls_total(), Sandbox.tasks_total, time.perf_counter()
    run = pipeline.run(context, store)
    tables, own, full, recipe = run.tables, run.versions.own("selection"), run.versions.full("selection"), run.recipe
    seen = GlobalInputs(run.objects, "selection", full, [(tables, "clip_scores"), (tables, "dedup_groups"),
                                                         (tables, "decontamination"), (tables, "clip_embeddings"),
                                                         (run.which, "raw_inventory")])
    if seen.unchanged(tables, "selection"):
        clips, passed = tables.row_count("selection"), tables.row_count("selection_pass")
        return result(StepStats(rows_in=clips, reused=clips), range(passed), own,
                      inputs_unchanged=True, changed_drops=[], drops_changed=0, **seen.metadata())
    read = ("clip_scores", "clip_embeddings", "raw_inventory")
    covered = seen.fingerprints(tables, read, over="clip_scores")
    inventory_read: list[str] = []  # the drops whose inventory this run read

    def inventory_reader(drops: list[str]) -> set[str]:
        inventory_read.extend(drops)
        return synthetic_assets(run, drops)

    state = selection_state.open()
    with state.database.held():  # one connection for the step's uses of the state
        done = reselect_incrementally(tables, state, recipe, run.versions.row("selection"),
                                      bound_version(run.objects, full), covered,
                                      lambda table, part: held_clips(run, table, part), inventory_reader,
                                      run.settings.near_duplicates.firewall_generated, changed=seen.changed(tables, read))
        for table, decision in (("selection", None), ("selection_pass", "pass"), ("selection_reject", "reject")):
            tables.write_groups(table, [r for r in done.rows if decision in (None, r["decision"])], done.drops)
        done.remember()
    seen.remember()
    totals = done.totals
    failed = totals.dropna(subset=["first_failed_rule"]).groupby("first_failed_rule").n.sum()
    tiers = totals.dropna(subset=["tier"]).groupby("tier").n.sum()
    clips, passed = int(totals.n.sum()), int(totals.loc[totals.decision == "pass", "n"].sum())
    stats = StepStats(rows_in=clips, computed=done.decided, reused=clips - done.decided,
                      model_calls=model_calls_total() - calls, frames_decoded=Sandbox.tasks_total - tasks,
                      seconds=time.perf_counter() - started)
    return result(stats, range(passed), own,
                  rejected_by_rule={k: int(v) for k, v in failed.sort_index().items()},
                  recipe=recipe.name, recipe_hash=recipe.digest,
                  waiting_for_score_retry=int(failed[failed.index.str.startswith("error:")].sum()),
                  changed_drops=done.changed, drops_changed=len(done.changed),
                  drops_with_new_inputs=len(done.new_inputs), drops_rewritten=_rewritten(done.drops),
                  clips_flipped=len(done.flipped), clips_flipped_examples=done.flipped[:10],
                  inventory_drops_read=len(inventory_read), contexts_read=done.contexts_read,
                  upstream_read_whole=done.upstream_read_whole,
                  tiers={str(k): int(v) for k, v in tiers.sort_index().items()}, **seen.metadata())


@stage_check("selection", "No selected clip may match eval material (decontamination).", blocking=True)
def selection_is_decontaminated(store: StoreResource) -> AssetCheckResult:
    leaks = EvalLeaks.load(store.objects()).update(store.tables())
    leaks.save()
    bad = leaks.leaks()
    return AssetCheckResult(passed=not bad, severity=AssetCheckSeverity.ERROR,
                            metadata={"selected": leaks.selected, "selected_matching_eval": len(bad), "examples": bad[:10],
                                      "tables_read_whole": leaks.read_whole})


def _kill_rates(rows: list[dict], recipe) -> dict[str, float]:
    """Share of this partition's clips each recipe score rule (and the safety kill) rejects (of
    those its score was computed for)."""
    rates = {name: round(rate, 4) for name, (rate, _) in rule_kill_rates(rows, recipe.score_rules).items()}
    clips = {r["clip_id"] for r in rows}
    if clips:
        rates["safety"] = round(len({r["clip_id"] for r in rows if r["kill"]}) / len(clips), 4)
    return rates


def _rewritten(drops: set[str] | None) -> int | str:
    """How many drops' rows a global step wrote (``write_groups``; None: the whole table)."""
    return len(drops) if drops is not None else "all"


def synthetic_assets(run: StageRun, drops: list[str] | None = None) -> set[str]:
    """Assets tagged model-generated at ingest (the generated-footage registry) in ``drops`` (None:
    every drop)."""
    if drops is not None and not drops:
        return set()
    inventory = run.which.read_all("raw_inventory", drops)
    if not len(inventory) or "synthetic" not in inventory:
        return set()
    return set(inventory.loc[inventory.synthetic.fillna(False).astype(bool), "asset_id"].dropna())


@dataclass(frozen=True)
class HeldClips:
    """A partition's rows of a clip table, for the assets the partition holds now (its inventory
    has their canonical copy): while a canonical copy moves between drops, the releasing drop's
    rows may outlive its release for a moment, and the global stages must never see a clip twice.
    Picklable: an engine task reads its drop with it where it runs."""

    tables: Any
    which: Any
    table: str

    def __call__(self, part: str) -> pd.DataFrame:
        rows = self.tables.read(self.table, part)
        inventory = self.which.read_or_empty("raw_inventory", part)
        if not len(rows) or not len(inventory):
            return rows
        held = set(inventory.loc[(inventory.status == "ok") & inventory.duplicate_of.isna(), "asset_id"])
        return rows[rows.asset_id.isin(held)]


def held_clips(run: StageRun, table: str, part: str) -> pd.DataFrame:
    """``HeldClips`` of ``run``'s tables: one partition's rows."""
    return HeldClips(run.tables, run.which, table)(part)
