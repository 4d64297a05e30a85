"""Train-facing stage: ``dataset_snapshot``, a frozen manifest over the catalog, materialized on
request (``vidassets snapshot create`` or the UI), with takedowns applied and an eval-leakage check."""

import hashlib
import json
from pathlib import Path

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    Failure,
    MaterializeResult,
    ResourceParam,
)

from vidassets.curate import clusters
from vidassets.curate.selection import DEFAULT_RECIPE
from vidassets.resources import Pipeline, StoreResource
from vidassets.stages.common import stage_asset, stage_check
from vidassets.train.build import build_plan, build_shards, snapshot_recipe
from vidassets.train.monitor import inspect_plan
from vidassets.train.plan import VERSION as PLAN_VERSION
from vidassets.train.plan import plan_bytes
from vidassets.train.snapshot import (
    build_samples,
    leak_findings,
    read_snapshot,
    read_tombstones,
    resolve_snapshot,
    snapshot_versions,
    write_snapshot,
)


@stage_asset("dataset_snapshot")
def dataset_snapshot(context: AssetExecutionContext, store: StoreResource,
                     pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    run = pipeline.run(context, store)
    versions, recipe, kinds = run.versions, run.recipe, run.versions.annotation_kinds
    caption_version = recipe.captions.version or kinds["captions"]
    stones = read_tombstones(run.objects)
    samples, excluded, decisions = build_samples(run.tables, stones, caption_version, recipe.captions.level,
                                                 versions.latent_rows,
                                                 versions.own("text_embeddings"), recipe.captions.missing,
                                                 versions.audio_annotation_kinds, recipe.audio, recipe.curriculum,
                                                 versions.own("clip_clusters"))
    recipe_path = Path(run.settings.selection.recipe) if run.settings.selection.recipe else DEFAULT_RECIPE
    meta = {"recipe": recipe.name, "recipe_hash": recipe.digest, "tombstones": len(stones),
            "versions": {**versions.code_versions(), "scores": versions.scores, "annotations": kinds},
            "caption_version": caption_version, "caption_level": recipe.captions.level,
            "missing_caption": recipe.captions.missing, "audio": recipe.audio.model_dump(),
            "language_shares": language_shares(samples), "streams": stream_counts(samples),
            "clusters": cluster_report(samples, run.settings.clusters.k, recipe.curriculum)}
    deco = run.tables.read_or_empty("decontamination")
    leaks = _leaks(run.which, samples, deco)
    checked = len(set(samples.clip_id) & set(deco.clip_id)) if len(deco) else 0
    meta["contamination_scan"] = {"samples": len(samples), "checked": checked,
                                  "coverage": round(checked / len(samples), 4) if len(samples) else 1.0}
    version = write_snapshot(run.objects, samples, excluded, decisions, meta, recipe_path.read_text(), leaks)
    if any(leaks.values()):
        raise Failure(description=f"snapshot v{version} failed the eval-leakage check and was not published: "
                                  f"{len(leaks['matching_eval_material'])} clips match eval material, "
                                  f"{len(leaks['not_routed_to_train'])} clips of assets not routed to train "
                                  f"(snapshots/v{version}/failed.json lists them)",
                      metadata={"snapshot": version, **{k: len(v) for k, v in leaks.items()}})
    context.log.info(f"wrote snapshot v{version}: {len(samples)} samples, {len(excluded)} excluded")
    return MaterializeResult(metadata={
        "snapshot": version, "rows_in": len(decisions), "rows_out": len(samples), "excluded": len(excluded),
        "excluded_by_reason": excluded.reason.value_counts().to_dict() if len(excluded) else {},
        "samples_by_bucket": samples.bucket.value_counts().to_dict() if len(samples) else {},
        "samples_by_stream": samples.stream.value_counts().to_dict() if len(samples) else {},
        "contamination_scan_coverage": meta["contamination_scan"]["coverage"], "model_calls": 0, "frames_decoded": 0})


@stage_check("dataset_snapshot", "The newest published snapshot holds no clip matching eval material and only assets "
             "the carve-out routed to train (checked again as the catalog moves on; a failing snapshot is never "
             "published).", blocking=True)
def snapshot_has_no_eval_leakage(store: StoreResource) -> AssetCheckResult:
    objects = store.objects()
    found = snapshot_versions(objects)
    if not found:
        return AssetCheckResult(passed=True, metadata={"snapshot": "none"})
    samples = read_snapshot(objects, found[-1])
    tables = store.tables()
    leaks = _leaks(tables, samples, tables.read_or_empty("decontamination"))
    return AssetCheckResult(passed=not any(leaks.values()), severity=AssetCheckSeverity.ERROR,
                            metadata={"snapshot": found[-1], "samples": len(samples),
                                      **{k: len(v) for k, v in leaks.items()}})


@stage_asset("training_shards")
def training_shards(context: AssetExecutionContext, store: StoreResource,
                    pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    run = pipeline.run(context, store)
    train = run.settings.train
    meta = build_shards(run.tables, resolve_snapshot(run.objects, train.snapshot), train.shard_mb)
    context.log.info(f"shards for snapshot: {meta}")
    return MaterializeResult(metadata={**{k: v for k, v in meta.items() if k != "streams"},
                                       "rows_out": meta["samples"], "model_calls": 0, "frames_decoded": 0})


@stage_asset("train_plan")
def train_plan(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline]) -> MaterializeResult:
    run = pipeline.run(context, store)
    t = run.settings.train
    version = resolve_snapshot(run.objects, t.snapshot)
    plan = build_plan(run.objects, version, t)
    spec = plan_spec(plan, version, t)
    missing = {d["phase"]: d["streams_without_samples"] for d in spec["phases"] if d["streams_without_samples"]}
    if missing:
        context.log.warning(f"mixture names streams with no samples in snapshot v{version} (served by none): {missing}")
    key = f"plans/v{version}/{hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]}.json"
    run.objects.put_if_absent(key, json.dumps(spec, indent=1, sort_keys=True).encode())
    return MaterializeResult(metadata={"plan": key, "rows_out": t.total_steps, "snapshot": version,
                                       "phases": [d["phase"] for d in spec["phases"]],
                                       "streams_without_samples": missing or "none",
                                       "epochs_at_total_steps": spec["epochs_at_total_steps"], "model_calls": 0,
                                       "frames_decoded": 0})


def plan_spec(plan, version: int, t) -> dict:
    """What a training plan file records: its inputs, phases, epochs and the digest of its first steps."""
    head = plan_bytes(plan, range(min(100, t.total_steps)), t.world_size)
    epochs = {phase: {k: round(float(v), 4) for k, v in by_stream.items()}
              for phase, by_stream in plan.epochs_at(t.total_steps).items()}
    return {"snapshot": version, "seed": t.seed, "global_batch": t.global_batch, "world_size": t.world_size,
            "total_steps": t.total_steps, "plan_version": PLAN_VERSION, "phases": plan.describe(),
            "max_epochs": {p.spec.name: dict(p.spec.max_epochs) for p in plan.phases},
            "caption_variants": plan.caption_variants, "epochs_at_total_steps": epochs,
            "first_100_steps_sha256": hashlib.sha256(head).hexdigest()}


@stage_check("train_plan", "No stream repeats more epochs than its phase's max_epochs within train.total_steps.",
             blocking=True)
def no_stream_over_repeats(store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    objects, t = store.objects(), pipeline.settings.train
    plan = build_plan(objects, resolve_snapshot(objects, t.snapshot), t)
    over = {phase: {k: round(float(v), 2) for k, v in streams.items()}
            for phase, streams in plan.over_repeated(t.total_steps).items()}
    epochs = {phase: {k: round(float(v), 2) for k, v in streams.items()}
              for phase, streams in plan.epochs_at(t.total_steps).items()}
    return AssetCheckResult(passed=not over, severity=AssetCheckSeverity.ERROR,
                            metadata={"over_repeated": over or "none", "epochs": epochs})


@stage_check("train_plan", "The realized-stream monitor over the first window of every phase: stream, cluster and "
             "source autocorrelation, clips repeated inside the window and realized stream shares stay within the "
             "recipe's curriculum.monitor limits.", blocking=True)
def plan_streams_are_well_mixed(store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    objects, t = store.objects(), pipeline.settings.train
    version = resolve_snapshot(objects, t.snapshot)
    plan = build_plan(objects, version, t)
    limits = snapshot_recipe(objects, version).curriculum.monitor
    reports = {}
    for phase in plan.phases:
        if phase.spec.start >= t.total_steps:
            break
        end = min(t.total_steps, phase.spec.start + limits.window_steps,
                  phase.spec.end if phase.spec.end is not None else t.total_steps)
        reports[phase.spec.name] = inspect_plan(plan, phase.spec.start, end, limits)
    findings = {name: r["findings"] for name, r in reports.items() if r["findings"]}
    return AssetCheckResult(passed=not findings, severity=AssetCheckSeverity.ERROR, metadata={
        "findings": findings or "none", "windows": {name: r["steps"] for name, r in reports.items()},
        "max_repeats": {name: r["max_repeats"] for name, r in reports.items()},
        "stream_shares": {name: r["stream_shares"] for name, r in reports.items()}})


def stream_counts(samples) -> dict[str, int]:
    return {str(k): int(v) for k, v in samples.stream.value_counts().sort_index().items()} if len(samples) else {}


def cluster_report(samples, k: int, curriculum) -> dict:
    """The snapshot's samples per semantic cluster (size, tiers, examples) and the coverage of the
    recipe's cluster groups against their targets."""
    table = clusters.cluster_table(samples, k)
    return {"per_cluster": table, "unclustered": int(samples.cluster.isna().sum()) if len(samples) else 0,
            "coverage": clusters.coverage(table, curriculum.cluster_groups,
                                          curriculum.cluster_targets)}


def language_shares(samples) -> dict[str, float]:
    """Share of samples per detected spoken language (``none``: no speech or not detected)."""
    if not len(samples):
        return {}
    counts = samples.language.fillna("none").value_counts()
    return {str(k): round(float(v) / len(samples), 4) for k, v in counts.sort_index().items()}


def _leaks(tables, samples, decontamination) -> dict[str, list[str]]:
    """The training side holds no vault credentials: the check reads the train side of the split."""
    split = tables.read_all("eval_split")
    routed = set(split.loc[split.duplicate_of.isna(), "asset_id"]) if len(split) else set()  # canonical copies only
    return leak_findings(samples, decontamination, routed)
