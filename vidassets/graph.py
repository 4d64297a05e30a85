"""The whole Dagster graph for one set of settings. Settings decide the code versions, the
resources and, through ``deployment`` (``VIDASSETS_DEPLOYMENT``), the executor; nothing else
picks the environment. Every asset's place in the graph comes from ``vidassets.catalog``."""

from __future__ import annotations

from dagster import Definitions, in_process_executor, multiprocess_executor

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
    takedown_sensor,
)
from vidassets.stages import checks, curate, derive, ingest, media, outputs, train  # noqa: F401 - each registers its assets
from vidassets.stages.common import build_assets


def build_definitions(settings: Settings) -> Definitions:
    unknown = sorted(set(settings.compute.assets) - set(catalog.NAMES))
    if unknown:
        raise ConfigError(f"compute.assets: unknown asset(s) {unknown}; known: {', '.join(catalog.NAMES)}")
    resources = build_resources(settings)
    assets, stage_checks = build_assets(settings, resources["pipeline"].versions)
    executor = {"multiprocess": multiprocess_executor, "in_process": in_process_executor}[settings.execution.local_executor]
    if settings.deployment == "k8s":
        from dagster_k8s import k8s_job_executor

        executor = k8s_job_executor
    jobs = sensor_jobs(settings)
    ingest_assets = [a for a in assets if a.key.to_user_string() in ("raw_inventory", "eval_split")]
    return Definitions(
        assets=assets,
        jobs=list(jobs.values()),
        asset_checks=[*stage_checks, *checks.table_checks()],
        sensors=[bucket_drop_sensor(settings, ingest_assets),
                 global_stages_sensor(jobs["global_stages"], settings.execution.automation_interval_seconds,
                                      settings.execution.global_max_wait_seconds),
                 selected_clips_sensor(jobs["selected_clips"], settings.bucket.sensor_interval_seconds),
                 retry_sensor(), canonical_sensor(settings.execution.automation_interval_seconds),
                 takedown_sensor(settings.execution.automation_interval_seconds),
                 automation_sensor(settings.execution.automation_interval_seconds)],
        resources=resources,
        executor=executor,
    )
