"""The whole Dagster graph for one set of settings. Settings decide the code versions, the
resources and, through ``deployment`` (``VIDASSETS_DEPLOYMENT``), the executor; nothing else
picks the environment. Every asset's place in the graph comes from ``vidassets.catalog``."""

from __future__ import annotations

import os

from dagster import AssetChecksDefinition, Definitions, in_process_executor, multiprocess_executor

from vidassets import catalog
from vidassets.automation import automation_sensor
from vidassets.config import ConfigError, Settings
from vidassets.jobs import sensor_jobs
from vidassets.resources import build_resources
from vidassets.sensors import (
    bucket_drop_sensor,
    canonical_sensor,
    global_stages_sensor,
    retry_sensor,
    selected_clips_sensor,
)
from vidassets.stages.checks import check_assets
from vidassets.stages.curate import curate_assets
from vidassets.stages.derive import derive_assets
from vidassets.stages.ingest import ingest_assets
from vidassets.stages.media import media_assets
from vidassets.stages.outputs import output_assets
from vidassets.stages.train import train_assets
from vidassets.versions import Versions


def build_definitions(settings: Settings) -> Definitions:
    unknown = sorted(set(settings.compute.assets) - set(catalog.NAMES))
    if unknown:
        raise ConfigError(f"compute.assets: unknown asset(s) {unknown}; known: {', '.join(catalog.NAMES)}")
    versions = Versions(settings)
    ingest = ingest_assets(settings, versions)
    media = media_assets(settings, versions)
    curate = curate_assets(settings, versions)
    derive, derive_checks = derive_assets(settings, versions)
    outputs, output_checks = output_assets(settings, versions)
    train, train_checks = train_assets(settings, versions)
    built = [a for a in (*ingest, *media, *curate, *derive, *outputs, *train) if not isinstance(a, AssetChecksDefinition)]
    by_name = {a.key.to_user_string(): a for a in built}
    missing = sorted(set(catalog.NAMES) ^ set(by_name))
    if missing:
        raise AssertionError(f"the catalog and the stage modules disagree on {missing}")
    assets = [by_name[name] for name in catalog.NAMES]
    checks = [c for c in curate if isinstance(c, AssetChecksDefinition)]
    executor = {"multiprocess": multiprocess_executor, "in_process": in_process_executor}[settings.execution.local_executor]
    if settings.deployment == "k8s":
        from dagster_k8s import k8s_job_executor

        executor = k8s_job_executor
    jobs = sensor_jobs(settings)
    return Definitions(
        assets=assets,
        jobs=list(jobs.values()),
        asset_checks=[*checks, *derive_checks, *output_checks, *train_checks, *check_assets(settings)],
        sensors=[bucket_drop_sensor(settings, ingest),
                 global_stages_sensor(jobs["global_stages"], settings.execution.automation_interval_seconds,
                                      settings.execution.global_max_wait_seconds),
                 selected_clips_sensor(jobs["selected_clips"], settings.bucket.sensor_interval_seconds),
                 retry_sensor(), canonical_sensor(settings.execution.automation_interval_seconds),
                 automation_sensor(settings.execution.automation_interval_seconds)],
        resources=build_resources(
            settings.bucket.uri,
            settings.store.uri,
            settings.store.vault_uri(),
            os.environ.get("VIDASSETS_S3_ENDPOINT_URL") or None,
        ),
        executor=executor,
    )
