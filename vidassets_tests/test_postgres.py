"""A real PostgreSQL server (Debian's package, started on loopback in a temp dir) as the Dagster
instance storage: the graph runs for one partition and its run history and asset records are read
back from Postgres. `.ci/run` installs the server; elsewhere the test is skipped if it is absent."""

from __future__ import annotations

import glob
import shutil
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus

from vidassets_tests.conftest import graph_settings, postgres_dagster_yaml, postgres_server, run_graph

pytestmark = pytest.mark.postgres



@pytest.fixture(scope="module")
def postgres_port() -> int:
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    with postgres_server() as port:
        yield port


def test_graph_runs_with_a_postgres_instance(postgres_port: int, demo_bucket: Path, tmp_path: Path) -> None:
    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in ("carphone.mp4", "_provenance.json", "_SUCCESS"):
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    home = tmp_path / "home"
    home.mkdir()
    # the same shape as deployments/k8s/dagster.yaml (postgres_db, default driver)
    (home / "dagster.yaml").write_text(postgres_dagster_yaml(postgres_port))
    summary = run_graph(graph_settings(tmp_path / "bucket", tmp_path), tmp_path)
    assert summary.drops == ["licensed/drop-0001"]
    instance = DagsterInstance.from_config(str(home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    runs = instance.get_runs()
    # the inventory, the partition's chain, the global assets, then its assets downstream of selection
    assert len(runs) == 4 and all(r.status == DagsterRunStatus.SUCCESS for r in runs)
    clips = instance.fetch_materializations(AssetKey("clips"), limit=5).records
    assert [r.partition_key for r in clips] == ["licensed/drop-0001"]
    assert instance.fetch_materializations(AssetKey("selection"), limit=5).records
    assert "licensed/drop-0001" in instance.get_dynamic_partitions("source_shard")
