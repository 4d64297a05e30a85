"""A real PostgreSQL server (Debian's package, started on loopback in a temp dir) as the Dagster
instance storage: the graph runs for one partition and its run history and asset records are read
back from Postgres. `.ci/run` installs the server; elsewhere the test is skipped if it is absent."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus

from vidassets_tests.conftest import free_port, graph_settings, run_graph

pytestmark = pytest.mark.postgres



@pytest.fixture(scope="module")
def postgres_port() -> int:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    bindir = Path(bins[-1]).parent
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


def test_graph_runs_with_a_postgres_instance(postgres_port: int, demo_bucket: Path, tmp_path: Path) -> None:
    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in ("carphone.mp4", "_provenance.json", "_SUCCESS"):
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    home = tmp_path / "home"
    home.mkdir()
    # the same shape as deployments/k8s/dagster.yaml (postgres_db, default driver)
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nstorage:\n  postgres:\n    postgres_db:\n      hostname: 127.0.0.1\n"
        f"      port: {postgres_port}\n      username: vidassets\n      password: ''\n      db_name: dagster\n")
    summary = run_graph(graph_settings(tmp_path / "bucket", tmp_path), tmp_path)
    assert summary.drops == ["licensed/drop-0001"]
    instance = DagsterInstance.from_config(str(home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    runs = instance.get_runs()
    # the partition, the global assets, then the partition's assets downstream of selection
    assert len(runs) == 3 and all(r.status == DagsterRunStatus.SUCCESS for r in runs)
    clips = instance.fetch_materializations(AssetKey("clips"), limit=5).records
    assert [r.partition_key for r in clips] == ["licensed/drop-0001"]
    assert instance.fetch_materializations(AssetKey("selection"), limit=5).records
    assert "licensed/drop-0001" in instance.get_dynamic_partitions("source_shard")
