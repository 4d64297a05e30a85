"""The jobs the sensors launch: ``global_stages`` (the global assets, one run per batch of finished
drops) and ``selected_clips`` (the work on one drop's selected clips, one run per changed drop).

On Kubernetes (``deployment: k8s``) a job listed in ``compute.shared_pod`` runs every step in its
run's pod (in-process executor), the pod sized by the profile of its assets with the most GPUs: a
drop's GPU work (annotations, latents, text embeddings) loads its models once and pays one pod
start instead of one per asset. Other jobs use the deployment's executor (``k8s_job_executor``: one
pod per step, each sized by its asset's profile)."""

from __future__ import annotations

from dagster import define_asset_job, in_process_executor

from vidassets import catalog
from vidassets.config import Settings
from vidassets.egress import role_of

JOBS: dict[str, tuple[str, ...]] = {
    "global_stages": tuple(a.name for a in catalog.of_kind("global")),
    "selected_clips": tuple(a.name for a in catalog.after_global()),
}


def pod_profile(settings: Settings, job: str):
    """The compute profile of a shared pod: that of the job's asset with the most GPUs (the first
    in catalog order on a tie)."""
    profiles = [settings.compute.profile_of(name, catalog.entry(name).profile) for name in JOBS[job]]
    return max((p for p in profiles if p is not None), key=lambda p: p.gpus, default=None)


def sensor_jobs(settings: Settings) -> dict:
    jobs = {}
    for name, assets in JOBS.items():
        extra: dict = {}
        if settings.deployment == "k8s" and name in settings.compute.shared_pod:
            config = settings.compute.k8s_config(pod_profile(settings, name), any(catalog.entry(a).vault for a in assets),
                                                 role_of(settings, assets))
            extra = {"executor_def": in_process_executor, "tags": {"dagster-k8s/config": config} if config else {}}
        jobs[name] = define_asset_job(  # partitioned like its assets (Dagster infers it from them)
            name, selection=list(assets),
            description=f"{', '.join(assets)}: launched by the {name}_sensor"
            + (" (one shared pod on Kubernetes)" if "executor_def" in extra else ""), **extra)
    return jobs
