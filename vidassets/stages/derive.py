"""Derive stage: ``annotations`` (camera motion, captions, tags), ``latents`` (shape-bucketed VAE
latents) and ``text_embeddings`` (the recipe's caption level) for the selected clips of each
partition, T0 first. Reads saved context frames, the packet index and the clip reader; never a
fresh full decode of the source."""

import os

import numpy as np
import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets.config import DEFAULT_HOME, Settings
from vidassets.curate.selection import selected_in_order
from vidassets.derive import caption_check, caption_judge, latent_check
from vidassets.derive.annotations import Backends, annotate_partition
from vidassets.derive.audio_annotations import AudioModels, ClipAudioReader, annotate_audio
from vidassets.derive.labels import caption_texts
from vidassets.derive.latents import encode_partition
from vidassets.derive.text_embeddings import embed_captions
from vidassets.media import drop_steps as media_work
from vidassets.resources import BucketResource, EvalVaultResource, StoreResource
from vidassets.runtime.step import Step
from vidassets.stages.common import asset_args, model_registry, result, selected_or_keep, step_engine
from vidassets.storage.blobs import load_images
from vidassets.storage.rows import records
from vidassets.versions import Versions


def vae(settings: Settings):
    """The configured video VAE (built once per process; a random-init placeholder without weights)."""
    cache = os.environ.get("VIDASSETS_MODEL_CACHE") or f"{DEFAULT_HOME}/models"
    lat = settings.latents
    return model_registry(settings).get("vae", lat.vae_class, lat.vae_path, cache_root=cache)


def text_encoder(settings: Settings):
    te = settings.text_embeddings
    return model_registry(settings).get("sentence-transformer", te.model_path, te.batch_size)


def audio_models(settings: Settings) -> AudioModels:
    """Silero VAD from the registry, the transcription endpoint (or the offline placeholder) and,
    for ``audio_annotations.captions: vlm``, the annotations' chat-completions client; built lazily."""
    a, vlm = settings.audio_annotations, settings.annotations.vlm

    def transcriber():
        from vidassets.models.transcriber import NoTranscriber, OpenAITranscriber

        t = a.transcription
        return OpenAITranscriber(t.endpoint, t.model, t.model_revision, t.api_key_env, t.timeout_seconds, t.retries,
                                 t.backoff_seconds) if t else NoTranscriber()

    def captioner():
        from vidassets.models.vlm import OpenAIChatClient

        return OpenAIChatClient(vlm.endpoint, vlm.model, vlm.api_key_env, vlm.timeout_seconds, vlm.retries,
                                vlm.backoff_seconds, 1, vlm.max_tokens, vlm.temperature, use_json_schema=vlm.json_schema)

    built: dict = {}

    def once(name, make):
        return lambda: built[name] if name in built else built.setdefault(name, make())

    return AudioModels(vad=once("vad", lambda: model_registry(settings).get("silero-vad", a.vad_threshold)),
                       transcriber=once("asr", transcriber),
                       captioner=once("captioner", captioner) if a.captions == "vlm" else None)


def derive_assets(settings: Settings, versions: Versions) -> list:
    max_runs = settings.execution.max_runs
    kinds = versions.annotation_kinds
    lat = settings.latents
    caption_choice = versions.recipe.captions

    @asset(**asset_args("annotations", settings, versions, metadata={"kind_versions": kinds}))
    def annotations(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected = selected_in_order(tables.read_or_empty("selection"), key)
        scores, analysis, probe = (tables.read_or_empty(t, key) for t in ("clip_scores", "video_analysis", "video_probe"))
        rows, stats = annotate_partition(
            store.objects(), selected, tables.read_or_empty("clips", key), tables.read_or_empty("context_frames", key),
            tables.previous("annotations", key), versions.annotation_rows(),
            Backends(settings.annotations, scores, analysis, probe), max_runs, context.log.info, step_engine(settings))
        tables.write("annotations", key, rows)
        current = [r for r in rows if r["producer_version"] in kinds.values()]
        return result(stats, rows, versions.own("annotations"), selected=selected,
                      ok_share_current=round(sum(r["status"] == "ok" for r in current) / len(current), 4) if current else 1.0)

    @asset(**asset_args("latents", settings, versions))
    def latents(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected, previous, idle = selected_or_keep(tables, "latents", key, versions.own("latents"))
        if idle:  # nothing selected here (yet): keep what exists, encode nothing
            return idle
        probe = tables.read("video_probe", key)
        dims = {r["asset_id"]: (r["display_width"], r["display_height"]) for r in media_work.records(probe)}
        videos = {v["asset_id"]: {**v, "display_width": dims.get(v["asset_id"], (None, None))[0],
                                  "display_height": dims.get(v["asset_id"], (None, None))[1]}
                  for v in media_work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))}
        from_ladder = lat.read_from == "ladder"
        rows, stats = encode_partition(
            bucket.open(), store.objects(), selected, tables.read("clips", key), tables.read("video_analysis", key),
            videos, previous, lambda clip: versions.window_row("latents", clip), lat, settings.probe,
            lambda: vae(settings), max_runs, context.log.info,
            tables.read_or_empty("frame_index", key),
            tables.read_or_empty("clip_ladder", key) if from_ladder else None,
            (lambda clip: versions.window_row("clip_ladder", clip)) if from_ladder else None, step_engine(settings),
            context.run.run_id, model_registry(settings).run_frames("vae"))
        tables.write("latents", key, rows)
        return result(stats, rows, versions.own("latents"), selected=selected)

    @asset(**asset_args("text_embeddings", settings, versions))
    def text_embeddings(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        caption_version = caption_choice.version or kinds["captions"]
        selected = selected_in_order(tables.read_or_empty("selection"), key)
        levels = versions.recipe.curriculum.caption_levels(caption_choice.level)
        rows, stats = embed_captions(selected, tables.read_or_empty("annotations", key), caption_version,
                                     levels, tables.previous("text_embeddings", key),
                                     versions.own("text_embeddings"), lambda: text_encoder(settings), max_runs,
                                     settings.text_embeddings.batch_size, step_engine(settings))
        tables.write("text_embeddings", key, rows)
        return result(stats, rows, versions.own("text_embeddings"), selected=selected, caption_version=caption_version,
                      caption_levels=levels)

    audio_kinds = versions.audio_annotation_kinds

    @asset(**asset_args("audio_annotations", settings, versions, metadata={"kind_versions": audio_kinds}))
    def audio_annotations(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected = selected_in_order(tables.read_or_empty("selection"), key)
        clips = {r["clip_id"]: r for r in media_work.records(tables.read_or_empty("clips", key))}
        audio_rows = [{**r, **{k: clips[r["clip_id"]][k] for k in ("first_pts", "last_pts")}}
                      for r in media_work.records(tables.read_or_empty("clip_audio", key))
                      if r["clip_id"] in clips and r["producer_version"] == versions.own("clip_audio")]
        caption_version = caption_choice.version or kinds["captions"]
        video_captions, _ = caption_texts(tables.read_or_empty("annotations", key), caption_version,
                                          caption_choice.level)
        with Step([], lambda r: r["clip_id"], max_runs, settings.probe.memory_mb, context.log.info,
                  step_engine(settings)) as step:
            rows, stats = annotate_audio(selected, audio_rows, video_captions, tables.previous("audio_annotations", key),
                                         versions.audio_annotation_row, settings.audio_annotations,
                                         audio_models(settings), ClipAudioReader(store.objects(), step,
                                                                                 settings.probe.model_dump()),
                                         max_runs, context.log.info, step.engine)
        tables.write("audio_annotations", key, rows)
        return result(stats, rows, versions.own("audio_annotations"), selected=selected)

    @asset(**asset_args("caption_qc", settings, versions))
    def caption_qc(context: AssetExecutionContext, store: StoreResource,
                   eval_vault: EvalVaultResource) -> MaterializeResult:
        tables, vault = store.tables(), eval_vault.tables()
        qc, version = settings.caption_qc, kinds["captions"]
        judge = caption_judge.judge_for(qc.judge)
        analysis, probe = vault.read_all("eval_video_analysis"), vault.read_all("eval_video_probe")
        fps = dict(zip(analysis.asset_id, analysis.fps, strict=True)) if len(analysis) else {}
        eval_frames = vault.read_all("eval_context_frames")
        backends = Backends(settings.annotations, pd.DataFrame(), analysis, probe)

        def frames_in(table: pd.DataFrame, objects, asset_id: str, first: int, last: int, start_s: float):
            inside = table[(table.asset_id == asset_id) & (table.frame_index >= first) & (table.frame_index <= last)] \
                if len(table) else table
            inside = inside.sort_values("frame_index") if len(inside) else inside
            return [float(t) - start_s for t in inside.time_s] if len(inside) else [], \
                load_images(objects, inside.blob_key) if len(inside) else []

        def golden_frames(g: dict):
            start = int(g["first_frame"]) / float(fps.get(g["asset_id"]) or 1.0)
            return frames_in(eval_frames, vault.objects, g["asset_id"], int(g["first_frame"]), int(g["last_frame"]), start)

        def caption_golden(g: dict, times, frames):
            n = int(g["last_frame"]) - int(g["first_frame"]) + 1
            row = {"clip_id": g["golden_id"], "asset_id": g["asset_id"], "source_shard": "eval",
                   "duration_s": n / float(fps.get(g["asset_id"]) or 1.0)}
            return caption_judge.caption_with(backends, row, times, frames, qc.level)

        annotations = tables.read_all("annotations")
        captions = annotations[(annotations.kind == "captions") & (annotations.producer_version == version)
                               & annotations.status.isin(["ok", "partial"])] if len(annotations) else annotations
        texts = {r.clip_id: caption_judge.caption_of(r.value, qc.level) for r in captions.itertuples()}
        chosen = caption_judge.sample_clips(sorted(c for c, t in texts.items() if t), qc.sample_size, qc.seed, version)
        clip_rows = {r["clip_id"]: r for r in records(tables.read_all("clips"))}
        context_frames = tables.read_all("context_frames")

        def sample_frames(s: dict):
            c = clip_rows[s["clip_id"]]
            return frames_in(context_frames, tables.objects, c["asset_id"], int(c["first_frame"]), int(c["last_frame"]),
                             float(c["start_s"]))

        rows, stats = caption_judge.judge_all(
            records(vault.read_or_empty("golden_captions")), golden_frames, caption_golden,
            [{"clip_id": c, "caption": texts[c]} for c in chosen if c in clip_rows], sample_frames, judge, version,
            qc.level, vault.read_or_empty("caption_qc"), versions.own("caption_qc"), max_runs)
        vault.write_groups("caption_qc", rows, None)
        found = caption_judge.summary(rows, version, judge.version)
        context.log.info(f"caption QC of {version} by {judge.version}: {found}")
        return result(stats, rows, versions.own("caption_qc"), golden=found["golden"], sample=found["sample"],
                      judge=judge.version, captions_version=version)

    @asset_check(asset=caption_qc, blocking=False,
                 description="The current captioner's mean judged score on the golden set is at least "
                 "checks.caption_min_golden_score (warns below; no golden set: passes, said so).")
    def captioner_meets_the_golden_set(eval_vault: EvalVaultResource) -> AssetCheckResult:
        table = eval_vault.tables().read_or_empty("caption_qc")
        judge = caption_judge.judge_for(settings.caption_qc.judge)
        found = caption_judge.summary(table, kinds["captions"], judge.version)
        mean = found["golden"]["mean_score"]
        return AssetCheckResult(passed=mean is None or mean >= settings.checks.caption_min_golden_score,
                                severity=AssetCheckSeverity.WARN,
                                metadata={"golden_mean_score": mean if mean is not None else "no golden set judged",
                                          "golden_judged": found["golden"]["judged"],
                                          "sample_mean_score": found["sample"]["mean_score"] or "none judged",
                                          "judge": judge.version})

    @asset_check(asset=latents, blocking=True,
                 description="Latents of the current VAE version hold no NaN/Inf and their per-clip mean and std "
                 "lie within the version's running range (robust z-score over every partition).")
    def latents_are_sane(store: StoreResource) -> AssetCheckResult:
        table = store.tables().read_all("latents")
        if len(table):
            table = table[(table.producer_version == versions.own("latents")) & (table.status == "ok")]
        if not len(table):
            return AssetCheckResult(passed=True, metadata={"clips": 0})
        bad_values = table[(table.nan_count > 0) | (table.inf_count > 0)]
        outliers: list[str] = []
        for column in ("mean", "std"):
            values = table[column].astype(float).to_numpy()
            median = float(np.median(values))
            spread = 1.4826 * float(np.median(np.abs(values - median))) + 0.05 * abs(median) + 1e-6
            z = np.abs(values - median) / spread
            outliers += list(table.clip_id[z > settings.latents.max_abs_robust_z])
        return AssetCheckResult(
            passed=not len(bad_values) and not outliers, severity=AssetCheckSeverity.ERROR,
            metadata={"clips": len(table), "with_nan_or_inf": len(bad_values), "stat_outliers": len(set(outliers)),
                      "examples": sorted(set(outliers) | set(bad_values.clip_id))[:10],
                      "mean_median": float(np.median(table["mean"])), "std_median": float(np.median(table["std"]))})

    @asset_check(asset=latents, blocking=True,
                 description="Each cohort of latents (the rows one encode run wrote under the current VAE version) "
                 "matches the version's per-channel reference: the statistics its checkpoint declares, or the "
                 "version's first cohort for the placeholder. A stale or wrong checkpoint fails it, the cohort named.")
    def latents_match_their_reference(store: StoreResource) -> AssetCheckResult:
        c = settings.checks
        found = latent_check.check(store.objects(), store.tables().read_all("latents"), versions.own("latents"),
                                   settings.latents.vae_path, c.latent_max_shift, c.latent_max_std_ratio,
                                   c.latent_min_clips)
        return AssetCheckResult(passed=not found["failed"], severity=AssetCheckSeverity.ERROR, metadata={
            "failed_cohorts": found["failed"] or "none", "cohorts": found["cohorts"] or "none",
            "reference": found["reference"] or "none yet"})

    @asset_check(asset=annotations, blocking=True,
                 description="The captions of the current captioner version, drop by drop: none garbled (mojibake, "
                 "control characters) and no language share that jumps from the version's typical drop; the bad "
                 "drop is named. Also the version's length and language monitors.")
    def captions_read_as_text(store: StoreResource) -> AssetCheckResult:
        c = settings.checks
        by_drop = caption_check.caption_texts_by_drop(store.tables().read_all("annotations"), kinds["captions"])
        found = caption_check.check(by_drop, c.caption_max_mojibake, c.caption_max_language_jump, c.caption_min_captions)
        every = caption_check.profile(t for texts in by_drop.values() for t in texts)
        return AssetCheckResult(passed=not found["failed"], severity=AssetCheckSeverity.ERROR, metadata={
            "failed_drops": found["failed"] or "none", "captions": every["captions"],
            "languages": every["languages"], "mean_words": every["mean_words"], "p95_words": every["p95_words"],
            "mojibake_share": every["mojibake_share"], "version": kinds["captions"]})

    @asset_check(asset=annotations, blocking=False,
                 description="Share of current-version annotations that passed schema validation (warn below 95%).")
    def captions_schema_pass_rate(store: StoreResource) -> AssetCheckResult:
        table = store.tables().read_all("annotations")
        if len(table):
            table = table[table.producer_version.isin(list(kinds.values())) & (table.status != "error")]
        by_kind = {k: round(float((g.status == "ok").mean()), 4) for k, g in table.groupby("kind")} if len(table) else {}
        worst = min(by_kind.values(), default=1.0)
        return AssetCheckResult(passed=worst >= 0.95, severity=AssetCheckSeverity.WARN,
                                metadata={"pass_rate_by_kind": by_kind, "rows": len(table)})

    return [annotations, audio_annotations, latents, text_embeddings, caption_qc], [
        latents_are_sane, latents_match_their_reference, captions_schema_pass_rate, captions_read_as_text,
        captioner_meets_the_golden_set]
