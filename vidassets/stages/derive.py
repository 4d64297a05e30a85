"""Derive stage: ``annotations`` (camera motion, captions, tags), ``latents`` (shape-bucketed VAE
latents) and ``text_embeddings`` (the recipe's caption level) for the selected clips of each
partition, T0 first. Reads saved context frames, the packet index and the clip reader; never a
fresh full decode of the source."""

import functools
import os

import numpy as np
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

from vidassets.config import DEFAULT_HOME, Settings
from vidassets.curate.selection import load_recipe
from vidassets.derive.annotations import Backends, annotate_partition, kind_versions, selected_in_order
from vidassets.derive.latents import encode_partition
from vidassets.derive.text_embeddings import embed_captions
from vidassets.media import partition as media_work
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource, StoreResource
from vidassets.stages.common import selected_or_keep

GROUP = "derive"
AUTOMATION = AutomationCondition.eager() | AutomationCondition.code_version_changed()


@functools.cache
def _vae(class_name: str, path: str | None, device: str):
    from vidassets.models.vae import VideoVAE

    cache = os.environ.get("VIDASSETS_MODEL_CACHE") or f"{DEFAULT_HOME}/models"
    return VideoVAE(class_name, path, device, cache)


@functools.cache
def _text_encoder(path: str | None, batch_size: int):
    from vidassets.models.text_encoder import TextEncoder

    return TextEncoder(path, batch_size)


def derive_assets(settings: Settings, selection: AssetsDefinition, clips: AssetsDefinition,
                  video_analysis: AssetsDefinition, frame_index: AssetsDefinition,
                  clip_scores: AssetsDefinition, clip_ladder: AssetsDefinition) -> list:
    versions = settings.versions
    from_ladder = settings.latents.read_from == "ladder"
    kinds = kind_versions(settings)

    @asset(op_tags=settings.compute.op_tags("annotations"), partitions_def=source_shards, group_name=GROUP,
           deps=[selection, clips, video_analysis, clip_scores], code_version=versions.annotations,
           automation_condition=AUTOMATION, metadata={"kind_versions": kinds},
           description="Camera motion, four-level captions and tags per selected clip (T0 first), each row with "
           "model id, prompt and schema versions. New versions are appended beside old ones.")
    def annotations(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected = selected_in_order(tables.read_or_empty("selection"), key)
        scores, analysis, probe = (tables.read_or_empty(t, key) for t in ("clip_scores", "video_analysis", "video_probe"))
        rows, stats = annotate_partition(
            store.objects(), selected, tables.read_or_empty("clips", key), tables.read_or_empty("context_frames", key),
            scores, analysis, probe, tables.read_or_empty("annotations", key), settings,
            Backends(settings, scores, analysis, probe), context.log.info)
        tables.write("annotations", key, rows)
        current = [r for r in rows if r["producer_version"] in kinds.values()]
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused,
            "rows_computed": sum(stats.computed.values()), "computed_by_kind": stats.computed, "invalid": stats.invalid, "errors": stats.errors,
            "model_calls": stats.requests, "frames_decoded": 0,
            "ok_share_current": round(sum(r["status"] == "ok" for r in current) / len(current), 4) if current else 1.0,
            "seconds": round(stats.seconds, 3), "producer_version": versions.annotations,
        })

    @asset(op_tags=settings.compute.op_tags("latents"), partitions_def=source_shards, group_name=GROUP,
           deps=[selection, clips, video_analysis, frame_index, *([clip_ladder] if from_ladder else [])],
           code_version=versions.latents, automation_condition=AUTOMATION,
           description=f"VAE latents ({settings.latents.vae_class}) per selected clip in its shape bucket (frames "
           "4k+1 x aspect ratio), frames read from the clip's ladder rung "
           f"({'else the raw file' if from_ladder else 'disabled: read_from = raw'}), keyed by (clip_id, VAE "
           "version, bucket).")
    def latents(context: AssetExecutionContext, bucket: BucketResource, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        selected, previous, idle = selected_or_keep(tables, "latents", key)
        if idle:  # nothing selected here (yet): keep what exists, encode nothing
            return idle
        probe = tables.read("video_probe", key)
        dims = {r["asset_id"]: (r["display_width"], r["display_height"]) for r in media_work.records(probe)}
        videos = {v["asset_id"]: {**v, "display_width": dims.get(v["asset_id"], (None, None))[0],
                                  "display_height": dims.get(v["asset_id"], (None, None))[1]}
                  for v in media_work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))}
        lat = settings.latents
        rows, stats = encode_partition(
            bucket.open(), store.objects(), selected, tables.read("clips", key), tables.read("video_analysis", key),
            videos, previous, settings,
            lambda: _vae(lat.vae_class, lat.vae_path, lat.device), context.log.info,
            tables.read_or_empty("frame_index", key),
            tables.read_or_empty("clip_ladder", key) if lat.read_from == "ladder" else None)
        tables.write("latents", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused_rows + stats.reused_files,
            "encoded": stats.encoded, "model_calls": stats.encoded, "too_short": stats.too_short,
            "errors": stats.errors, "frames_decoded": stats.frames_decoded, "frames_encoded": stats.frames_encoded,
            "read_from_ladder": stats.rung_reads, "read_from_raw": stats.raw_reads,
            "raw_frames_decoded": stats.raw_frames_decoded,
            "seconds": round(stats.seconds, 3), "producer_version": versions.latents,
        })

    @asset(op_tags=settings.compute.op_tags("text_embeddings"), partitions_def=source_shards, group_name=GROUP,
           deps=[annotations, selection], code_version=versions.text_embeddings,
           automation_condition=AUTOMATION,
           description="The recipe's caption level (of the recipe's captioner version) embedded by the text "
           "encoder, per selected clip; reused while the caption text is unchanged.")
    def text_embeddings(context: AssetExecutionContext, store: StoreResource) -> MaterializeResult:
        key = context.partition_key
        tables = store.tables()
        choice = load_recipe(settings.selection.recipe).captions
        caption_version = choice.version or kinds["captions"]
        selected = selected_in_order(tables.read_or_empty("selection"), key)
        te = settings.text_embeddings
        rows, stats = embed_captions(selected, tables.read_or_empty("annotations", key), caption_version, choice.level,
                                     tables.read_or_empty("text_embeddings", key), versions.text_embeddings,
                                     lambda: _text_encoder(te.model_path, te.batch_size))
        tables.write("text_embeddings", key, rows)
        return MaterializeResult(metadata={
            "rows_in": stats.clips, "rows_out": len(rows), "rows_reused": stats.reused, "rows_computed": stats.computed,
            "missing_caption": stats.missing_caption, "model_calls": stats.model_calls, "frames_decoded": 0,
            "caption_version": caption_version, "caption_level": choice.level,
            "producer_version": versions.text_embeddings,
        })

    @asset_check(asset=latents, blocking=True,
                 description="Latents of the current VAE version hold no NaN/Inf and their per-clip mean and std "
                 "lie within the version's running range (robust z-score over every partition).")
    def latents_are_sane(store: StoreResource) -> AssetCheckResult:
        table = store.tables().read_all("latents")
        if len(table):
            table = table[(table.producer_version == versions.latents) & (table.status == "ok")]
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

    return [annotations, latents, text_embeddings], [latents_are_sane, captions_schema_pass_rate]
