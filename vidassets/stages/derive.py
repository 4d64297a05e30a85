"""Derive stage: ``annotations`` (camera motion, captions, tags), ``latents`` (shape-bucketed VAE
latents), ``text_embeddings`` (the recipe's caption level) and ``audio_annotations`` for the
selected clips of each partition, T0 first, and ``caption_qc`` on request. Reads saved context
frames, the packet index and the clip reader; never a fresh full decode of the source."""

import numpy as np
import pandas as pd
from dagster import AssetCheckResult, AssetCheckSeverity, AssetExecutionContext, MaterializeResult, ResourceParam

from vidassets.curate.selection import selected_in_order
from vidassets.derive import caption_check, caption_judge, latent_check
from vidassets.derive.annotations import Backends, annotate_partition, schema_pass_rates
from vidassets.derive.audio_annotations import ClipAudioReader, annotate_audio
from vidassets.derive.labels import caption_texts
from vidassets.derive.latents import encode_partition
from vidassets.derive.text_embeddings import embed_captions
from vidassets.resources import BucketResource, EvalVaultResource, Execution, Models, Pipeline, StoreResource
from vidassets.runtime.step import Step
from vidassets.stages.common import result, selected_or_keep, stage_asset, stage_check, versions_metadata
from vidassets.stages.outputs import upright_videos
from vidassets.storage.rows import current_rows, records


@stage_asset("annotations", versions_metadata("kind_versions", "annotation_kinds"))
def annotations(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline],
                execution: ResourceParam[Execution]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, tables, kinds = run.key, run.tables, run.versions.annotation_kinds
    selected = selected_in_order(run.which.read_groups("selection", [key]), key)
    scores, analysis = tables.read_or_empty("clip_scores", key), tables.read_or_empty("video_analysis", key)
    probe = tables.read_or_empty("video_probe", key)
    rows, stats = annotate_partition(
        run.objects, selected, tables.read_or_empty("clips", key), tables.read_or_empty("context_frames", key),
        tables.previous("annotations", key), run.versions.annotation_rows(),
        Backends(run.settings.annotations, scores, analysis, probe), execution.max_runs, context.log.info,
        execution.engine)
    tables.write("annotations", key, rows)
    current = [r for r in rows if r["producer_version"] in kinds.values()]
    return result(stats, rows, run.versions.own("annotations"), selected=selected,
                  ok_share_current=round(sum(r["status"] == "ok" for r in current) / len(current), 4) if current else 1.0)


@stage_asset("latents")
def latents(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource,
            pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution],
            models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, tables, versions, lat = run.key, run.tables, run.versions, run.settings.latents
    selected, previous, idle = selected_or_keep(run, "latents", versions.own("latents"))
    if idle:  # nothing selected here (yet): keep what exists, encode nothing
        return idle
    from_ladder = lat.read_from == "ladder"
    rows, stats = encode_partition(
        bucket.open(), run.objects, selected, run.which.read("clips", key), run.which.read("video_analysis", key),
        upright_videos(run), previous, versions.latent_rows, lat, execution.limits,
        lambda: models.vae(lat), execution.max_runs, context.log.info, tables.read_or_empty("frame_index", key),
        tables.read_or_empty("clip_ladder", key) if from_ladder else None,
        (lambda clip: versions.window_row("clip_ladder", clip)) if from_ladder else None, execution.engine,
        context.run.run_id, models.registry.run_frames("vae"))
    tables.write("latents", key, rows)
    return result(stats, rows, versions.own("latents"), selected=selected)


@stage_asset("text_embeddings")
def text_embeddings(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline],
                    execution: ResourceParam[Execution], models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, tables, captions = run.key, run.tables, run.recipe.captions
    caption_version = captions.version or run.versions.annotation_kinds["captions"]
    selected = selected_in_order(run.which.read_groups("selection", [key]), key)
    levels = run.recipe.curriculum.caption_levels(captions.level)
    own, encoder = run.versions.own("text_embeddings"), run.settings.text_embeddings
    rows, stats = embed_captions(selected, tables.read_or_empty("annotations", key), caption_version, levels,
                                 tables.previous("text_embeddings", key), own, lambda: models.text_encoder(encoder),
                                 execution.max_runs, encoder.batch_size, execution.engine, run.objects)
    tables.write("text_embeddings", key, rows)
    return result(stats, rows, own, selected=selected, caption_version=caption_version, caption_levels=levels)


@stage_asset("audio_annotations", versions_metadata("kind_versions", "audio_annotation_kinds"))
def audio_annotations(context: AssetExecutionContext, store: StoreResource, pipeline: ResourceParam[Pipeline],
                      execution: ResourceParam[Execution], models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store)
    key, tables, versions, captions = run.key, run.tables, run.versions, run.recipe.captions
    selected = selected_in_order(run.which.read_groups("selection", [key]), key)
    clips = {r["clip_id"]: r for r in records(run.which.read_or_empty("clips", key))}
    audio_rows = [{**r, **{k: clips[r["clip_id"]][k] for k in ("first_pts", "last_pts")}}
                  for r in records(tables.read_or_empty("clip_audio", key))
                  if r["clip_id"] in clips and r["producer_version"] == versions.own("clip_audio")]
    video_captions, _ = caption_texts(tables.read_or_empty("annotations", key),
                                      captions.version or versions.annotation_kinds["captions"], captions.level)
    limits, audio_models = execution.limits, models.audio_models(run.settings.audio_annotations,
                                                                 run.settings.annotations.vlm)
    with Step([], lambda r: r["clip_id"], execution.max_runs, limits.memory_mb, context.log.info,
              execution.engine, isolation=limits.isolation) as step:
        rows, stats = annotate_audio(selected, audio_rows, video_captions, tables.previous("audio_annotations", key),
                                     versions.audio_annotation_row, run.settings.audio_annotations,
                                     audio_models, ClipAudioReader(run.objects, step, limits.model_dump()),
                                     execution.max_runs, context.log.info, step.engine)
    tables.write("audio_annotations", key, rows)
    return result(stats, rows, versions.own("audio_annotations"), selected=selected)


@stage_asset("caption_qc")
def caption_qc(context: AssetExecutionContext, store: StoreResource, eval_vault: EvalVaultResource,
               pipeline: ResourceParam[Pipeline], execution: ResourceParam[Execution],
               models: ResourceParam[Models]) -> MaterializeResult:
    run = pipeline.run(context, store, eval_vault)
    version, judge = run.versions.annotation_kinds["captions"], models.judge(run.settings.caption_qc)
    backends = Backends(run.settings.annotations, pd.DataFrame(), run.vault.read_all("eval_video_analysis"),
                        run.vault.read_all("eval_video_probe"))
    rows, stats = caption_judge.caption_qc_rows(run.tables, run.vault, backends, judge, run.settings.caption_qc,
                                                version, run.versions.own("caption_qc"), execution.max_runs)
    run.vault.write_groups("caption_qc", rows, None)
    found = caption_judge.summary(rows, version, judge.version)
    context.log.info(f"caption QC of {version} by {judge.version}: {found}")
    return result(stats, rows, run.versions.own("caption_qc"), golden=found["golden"], sample=found["sample"],
                  judge=judge.version, captions_version=version)


@stage_check("caption_qc", "The current captioner's mean judged score on the golden set is at least "
             "checks.caption_min_golden_score (warns below; no golden set: passes, said so).")
def captioner_meets_the_golden_set(eval_vault: EvalVaultResource, pipeline: ResourceParam[Pipeline],
                                   models: ResourceParam[Models]) -> AssetCheckResult:
    table = eval_vault.tables().read_or_empty("caption_qc")
    judge = models.judge(pipeline.settings.caption_qc)
    found = caption_judge.summary(table, pipeline.versions.annotation_kinds["captions"], judge.version)
    mean = found["golden"]["mean_score"]
    return AssetCheckResult(passed=mean is None or mean >= pipeline.settings.checks.caption_min_golden_score,
                            severity=AssetCheckSeverity.WARN,
                            metadata={"golden_mean_score": mean if mean is not None else "no golden set judged",
                                      "golden_judged": found["golden"]["judged"],
                                      "sample_mean_score": found["sample"]["mean_score"] or "none judged",
                                      "judge": judge.version})


@stage_check("latents", "Latents of the current VAE version hold no NaN/Inf and their per-clip mean and std lie "
             "within the version's running range (robust z-score over every partition).", blocking=True)
def latents_are_sane(store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    table = current_rows(store.tables().read_all("latents"), pipeline.versions.latent_producers())
    if not len(table):
        return AssetCheckResult(passed=True, metadata={"clips": 0})
    bad_values = table[(table.nan_count > 0) | (table.inf_count > 0)]
    outliers: list[str] = []
    for column in ("mean", "std"):
        values = table[column].astype(float).to_numpy()
        median = float(np.median(values))
        spread = 1.4826 * float(np.median(np.abs(values - median))) + 0.05 * abs(median) + 1e-6
        z = np.abs(values - median) / spread
        outliers += list(table.clip_id[z > pipeline.settings.latents.max_abs_robust_z])
    return AssetCheckResult(
        passed=not len(bad_values) and not outliers, severity=AssetCheckSeverity.ERROR,
        metadata={"clips": len(table), "with_nan_or_inf": len(bad_values), "stat_outliers": len(set(outliers)),
                  "examples": sorted(set(outliers) | set(bad_values.clip_id))[:10],
                  "mean_median": float(np.median(table["mean"])), "std_median": float(np.median(table["std"]))})


@stage_check("latents", "Each cohort of latents (the rows one encode run wrote under the current VAE version) matches "
             "the version's per-channel reference: the statistics its checkpoint declares, or the version's first "
             "cohort for the placeholder. A stale or wrong checkpoint fails it, the cohort named.", blocking=True)
def latents_match_their_reference(store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    c, lat = pipeline.settings.checks, pipeline.settings.latents
    table, producers = store.tables().read_all("latents"), pipeline.versions.latent_producers()
    failed, cohorts, references = {}, {}, {}
    for producer, resolution in producers.items():  # each resolution's rows against its own reference
        found = latent_check.check(store.objects(), table, producer, lat.vae_class, lat.vae_path, c.latent_max_shift,
                                   c.latent_max_std_ratio, c.latent_min_clips)
        name = (lambda run, r=resolution: f"{run}@{r}") if len(producers) > 1 else (lambda run: run)
        failed |= {name(run): v for run, v in found["failed"].items()}
        cohorts |= {name(run): v for run, v in found["cohorts"].items()}
        references[resolution] = found["reference"] or "none yet"
    return AssetCheckResult(passed=not failed, severity=AssetCheckSeverity.ERROR, metadata={
        "failed_cohorts": failed or "none", "cohorts": cohorts or "none",
        "reference": references.popitem()[1] if len(references) == 1 else references})


@stage_check("annotations", "The captions of the current captioner version, drop by drop: none garbled (mojibake, "
             "control characters) and no language share that jumps from the version's typical drop; the bad drop is "
             "named. Also the version's length and language monitors.", blocking=True)
def captions_read_as_text(store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    c, version = pipeline.settings.checks, pipeline.versions.annotation_kinds["captions"]
    by_drop = caption_check.caption_texts_by_drop(store.tables().read_all("annotations"), version)
    found = caption_check.check(by_drop, c.caption_max_mojibake, c.caption_max_language_jump, c.caption_min_captions)
    every = caption_check.profile(t for texts in by_drop.values() for t in texts)
    return AssetCheckResult(passed=not found["failed"], severity=AssetCheckSeverity.ERROR, metadata={
        "failed_drops": found["failed"] or "none", "captions": every["captions"], "languages": every["languages"],
        "mean_words": every["mean_words"], "p95_words": every["p95_words"],
        "mojibake_share": every["mojibake_share"], "version": version})


@stage_check("annotations", "Share of current-version annotations that passed schema validation (ok, or partial: "
             "some caption levels off their word targets), per kind, of those that were judged: transport errors "
             "and kinds that do not apply (camera motion of a still image) are not failures (warn below 95%).")
def captions_schema_pass_rate(store: StoreResource, pipeline: ResourceParam[Pipeline]) -> AssetCheckResult:
    table = store.tables().read_all("annotations")
    if len(table):
        table = table[table.producer_version.isin(list(pipeline.versions.annotation_kinds.values()))]
    by_kind = schema_pass_rates(table)
    worst = min(by_kind.values(), default=1.0)
    return AssetCheckResult(passed=worst >= 0.95, severity=AssetCheckSeverity.WARN,
                            metadata={"pass_rate_by_kind": by_kind, "rows": len(table)})

