"""Curate stage: ``clip_scores`` (score, don't delete: every score with evidence and version)."""

from dagster import AssetExecutionContext, AssetsDefinition, AutomationCondition, MaterializeResult, asset

from vidassets.config import Settings
from vidassets.curate.scores import score_partition
from vidassets.partitions import source_shards
from vidassets.resources import StoreResource

GROUP = "curate"
AUTOMATION = AutomationCondition.eager() | AutomationCondition.code_version_changed()


def curate_assets(settings: Settings, clips: AssetsDefinition, frame_index: AssetsDefinition) -> list[AssetsDefinition]:
    versions = settings.versions

    @asset(partitions_def=source_shards, group_name=GROUP, deps=[clips, frame_index], code_version=versions.clip_scores,
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
            "producer_version": versions.clip_scores,
        })

    return [clip_scores]
