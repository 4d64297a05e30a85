"""The whole Dagster graph for one set of settings. Settings decide the code versions, the
resources and, through ``deployment`` (``VIDASSETS_DEPLOYMENT``), the executor; nothing else
picks the environment."""

from __future__ import annotations

import os

from dagster import Definitions, multiprocess_executor

from vidassets.automation import automation_sensor
from vidassets.config import Settings
from vidassets.resources import build_resources
from vidassets.sensors import bucket_drop_sensor
from vidassets.stages.checks import check_assets
from vidassets.stages.curate import curate_assets
from vidassets.stages.derive import derive_assets
from vidassets.stages.ingest import ingest_assets
from vidassets.stages.media import media_assets
from vidassets.stages.outputs import output_assets
from vidassets.stages.train import train_assets


def build_definitions(settings: Settings) -> Definitions:
    ingest = ingest_assets(settings)
    media = media_assets(settings, upstream=ingest[-1])
    video_probe, frame_index, video_analysis, clips = media
    curate = curate_assets(settings, clips=clips, frame_index=frame_index, eval_split=ingest[-1])
    _, clip_scores, _, _, _, selection, _ = curate
    outputs, output_checks = output_assets(settings, selection=selection, clips=clips, video_analysis=video_analysis,
                                           video_probe=video_probe, frame_index=frame_index)
    clip_ladder = outputs[0]
    derive, derive_checks = derive_assets(settings, selection=selection, clips=clips, video_analysis=video_analysis,
                                          frame_index=frame_index, clip_scores=clip_scores, clip_ladder=clip_ladder)
    annotations, latents, text_embeddings = derive
    train, train_checks = train_assets(settings, selection=selection, latents=latents, annotations=annotations,
                                       text_embeddings=text_embeddings)
    assets = [*ingest, *media, *curate[:-1], *derive, *outputs, *train]
    checks = check_assets(settings, {a.key.to_user_string(): a for a in assets})
    executor = multiprocess_executor
    if settings.deployment == "k8s":
        from dagster_k8s import k8s_job_executor

        executor = k8s_job_executor
    return Definitions(
        assets=assets,
        asset_checks=[curate[-1], *derive_checks, *output_checks, *train_checks, *checks],
        sensors=[bucket_drop_sensor(settings, ingest), automation_sensor],
        resources=build_resources(
            settings.bucket.uri,
            settings.store.uri,
            settings.store.vault_uri(),
            os.environ.get("VIDASSETS_S3_ENDPOINT_URL") or None,
        ),
        executor=executor,
    )

