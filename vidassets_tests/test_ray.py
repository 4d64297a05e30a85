"""The ``ray`` engine on a real local Ray cluster: a head (no CPUs of its own) and two worker nodes,
each its own raylet and worker processes, started by the test. The steps it runs (media steps as
tasks, model steps on actors holding their models) must write the rows ``local`` writes, and a
worker process killed mid-step must cost no row."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from vidassets.config import ProbeSettings
from vidassets.media import drop_steps as work
from vidassets.runtime.engine import RayEngine, engine_for
from vidassets.storage.objects import ReadOnlyBucket, open_object_store
from vidassets.storage.rows import RowVersion
from vidassets_tests.conftest import graph_settings, run_graph

ray = pytest.importorskip("ray")

TABLES = ["video_probe", "frame_index", "video_fingerprints", "video_analysis", "context_frames", "clips",
          "clip_scores", "clip_embeddings", "dedup_groups", "decontamination", "selection", "clip_ladder",
          "clip_audio", "annotations", "audio_annotations", "latents", "text_embeddings"]
TIMINGS = {"seconds", "encode_run"}  # an item's wall time and the run that wrote it: allowed to differ


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def _table(root: Path, name: str) -> pd.DataFrame:
    from vidassets.storage.tables import TableStore

    tables = TableStore(open_object_store(str(root)))
    frames = [tables.read(name, part) for part in tables.partitions(name)]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame = frame.drop(columns=[c for c in TIMINGS if c in frame.columns])
    return frame.sort_values(sorted(frame.columns[:2].tolist())).reset_index(drop=True) if len(frame) else frame


@pytest.mark.slow
def test_demo_graph_on_ray_writes_the_rows_local_writes(ray_cluster: str, demo_bucket: Path, tmp_path: Path):
    local, remote = tmp_path / "local", tmp_path / "ray"
    # float outputs agree bit for bit at the same torch thread count
    pinned = {"models.torch_threads": 1}
    run_graph(graph_settings(demo_bucket, local, **pinned), local)
    summary = run_graph(graph_settings(demo_bucket, remote, **{"execution.engine": "ray",
                                                               "execution.ray.address": ray_cluster, **pinned}),
                        remote)
    for stage in ("video_probe", "frame_index", "video_fingerprint", "video_analysis",  # computed on the cluster
                  "clip_scores", "clip_embeddings", "clip_ladder", "clip_audio", "annotations", "audio_annotations",
                  "latents", "text_embeddings"):
        assert summary.stages[stage].extra.get("items_on_ray", 0) > 0, stage
    for name in TABLES:
        a, b = _table(local / "store", name), _table(remote / "store", name)
        assert len(a) > 0, name
        pd.testing.assert_frame_equal(a, b, check_like=True, obj=name)
    # the work did run on the cluster's worker nodes, not in this process
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")}
    assert len(nodes) == 2


def _ray_task_pids(title: bytes) -> list[int]:
    """Ray worker processes running an item right now (Ray titles them after the task)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().startswith(title):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _killer(title: bytes, killed: list[int]) -> threading.Thread:
    """A started thread that SIGKILLs the first Ray process seen running under ``title``."""

    def kill_one() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            pids = _ray_task_pids(title)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.05)

    thread = threading.Thread(target=kill_one)
    thread.start()
    return thread


def test_a_worker_killed_mid_step_loses_no_row(ray_cluster: str, demo_bucket: Path):
    drop = demo_bucket / "raw/licensed/drop-0001"
    videos = [{"asset_id": f"a{i}-{p.stem}", "uri": str(p), "key": str(p.relative_to(demo_bucket)),
               "source_shard": "licensed/drop-0001", "size": p.stat().st_size}
              for i in range(4) for p in sorted(drop.glob("*.mp4"))]
    bucket = ReadOnlyBucket(open_object_store(str(demo_bucket)))
    engine = engine_for("ray", ray_cluster)
    assert isinstance(engine, RayEngine)
    killed: list[int] = []
    killer = _killer(b"ray::_ray_task", killed)
    rows, stats = work.probe_partition(bucket, videos, pd.DataFrame(), RowVersion("probe-test", "in"),
                                       ProbeSettings(), 3, engine=engine)
    killer.join()
    assert killed, "no Ray task was seen running"
    assert [r["asset_id"] for r in rows] == [v["asset_id"] for v in videos]  # each once, in order
    assert all(r["status"] == "ok" for r in rows), [(r["asset_id"], r["reason"]) for r in rows]
    assert stats.computed == len(videos) and stats.failed == 0
    # the same rows as a local step computes (timings aside)
    local, _ = work.probe_partition(bucket, videos, pd.DataFrame(), RowVersion("probe-test", "in"), ProbeSettings(), 3)
    strip = [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]
    assert strip == [{k: v for k, v in r.items() if k not in TIMINGS} for r in local]


def test_a_model_actor_killed_mid_step_loses_no_row(ray_cluster: str):
    """Model steps run on actors: one SIGKILLed mid-step is restarted by Ray and its pending calls
    re-run; every item comes back once, in order."""
    engine = engine_for("ray", ray_cluster, model_actors=2)
    killed: list[int] = []
    killer = _killer(b"ray::_ModelActor.run", killed)
    outcomes = list(engine.map(lambda i: (time.sleep(0.2), {"item": i})[1], list(range(30)), models=True))
    killer.join()
    assert killed, "no model actor was seen running an item"
    assert [o.row for o in outcomes] == [{"item": i} for i in range(30)]


def test_dedup_band_join_and_its_verification_as_ray_tasks_give_the_local_groups(ray_cluster: str, monkeypatch,
                                                                                  tmp_path) -> None:
    """Dedup's perceptual band join among a run's new clips, the exact check of its candidate pairs
    (batches carrying their clips' frames only) and the semantic neighbour search (slices of the
    vectors compared, merged) run as Ray tasks on a real local cluster: drops added a few at a time
    give the same links, groups and evidence as the same work in this process, and as each in one
    piece."""
    import numpy as np

    from vidassets.config import DedupSettings
    from vidassets.curate import dedup
    from vidassets.curate.dedup_state import DedupState
    from vidassets_tests.test_curate import _dedup_partition

    rng = np.random.default_rng(11)
    anchors = rng.integers(0, 256, (4, 4, 32), dtype=np.uint8)
    anchor_vectors = rng.normal(size=(4, 16))
    parts = {f"web/d{i}": _dedup_partition(rng, f"web/d{i}", 12, anchors, anchor_vectors) for i in range(5)}
    version = RowVersion("dedup-ray", "in")

    def run(engine, name: str) -> tuple[list[dict], list[dict]]:
        state, dones = DedupState(f"sqlite:///{tmp_path}/{name}.sqlite"), []
        for n in (2, 3, 5):  # the first run's band join among two drops' clips, later ones also probe the stored
            dones.append(dedup.update(state, "v", {p: "1" for p in list(parts)[:n]}, parts.__getitem__,
                                      DedupSettings(), engine).done)
        return dedup.group_rows(state, version), dones

    whole_rows, whole_done = run(None, "whole")  # one task each: every table, every frame, every pair
    monkeypatch.setattr(dedup, "PAIRS_PER_TASK", 7)
    monkeypatch.setattr(dedup, "SEMANTIC_SLICE", 13)  # several vector slices, each its own index
    local_rows, local_done = run(engine_for("local"), "local")
    ray_rows, ray_done = run(engine_for("ray", ray_cluster), "ray")
    assert ray_rows == local_rows == whole_rows and ray_done == local_done == whole_done
    assert sum(d["perceptual_links"] for d in ray_done) > 0 and sum(d["semantic_links"] for d in ray_done) > 0
    assert any(r["pdq_group_size"] > 1 for r in ray_rows) and any(r["semantic_group_size"] > 1 for r in ray_rows)


def test_decontamination_matching_as_ray_tasks_gives_the_local_rows(ray_cluster: str, monkeypatch) -> None:
    """With ``execution.ray.vault_matching``, decontamination's matching runs as Ray tasks on a real
    local cluster (slices of whole eval assets' hashes, slices of eval vectors): drops arriving one at
    a time give the same rows as the same work in this process, and as one slice each; without the
    opt-in the stage keeps eval material out of the cluster (``Execution.vault_engine`` is None)."""
    from vidassets.config import DecontaminationSettings, Settings
    from vidassets.curate import decontamination
    from vidassets.curate.decontamination import DecontaminationState, update
    from vidassets.resources import Execution
    from vidassets_tests.test_decontamination import _random_drops

    train, evals = _random_drops(5, 8)
    params, version = DecontaminationSettings(), RowVersion("d", "i")

    def run(engine) -> list[dict]:
        state = DecontaminationState()
        for n in range(1, len(train) + 1):
            state, _ = update(state, "v", {p: "1" for p in list(train)[:n]},
                              {f"eval/{p}": "1" for p in list(train)[:n]}, train.__getitem__, evals.__getitem__,
                              params, engine)
        return state.rows(params, version)

    whole = run(None)
    monkeypatch.setattr(decontamination, "EVAL_SLICE", 3)  # several slices, each whole eval assets
    assert run(engine_for("local")) == run(engine_for("ray", ray_cluster)) == whole
    assert sum(r["contaminated"] for r in whole) > 0
    ray = {"execution": {"engine": "ray", "ray": {"address": ray_cluster}}}
    assert Execution(Settings.model_validate(ray)).vault_engine is None
    ray["execution"]["ray"]["vault_matching"] = True
    assert Execution(Settings.model_validate(ray)).vault_engine is not None


def _cluster_drops(count: int) -> dict:
    """``count`` drops of clip embeddings (8-d, seeded), the table ``clip_clusters`` reads."""
    import numpy as np

    rng = np.random.default_rng(5)
    return {f"web/d{i}": pd.DataFrame({
        "clip_id": [f"web/d{i}-c{j}" for j in range(4 + i)], "asset_id": "a", "source_shard": f"web/d{i}",
        "status": "ok", "dim": 8, "vector": [v.tobytes() for v in rng.normal(size=(4 + i, 8)).astype(np.float32)],
        "producer_version": "e"}) for i in range(count)}


def _cluster_rows(drops: dict, engine, root: Path) -> list[dict]:
    """Every drop's rows after drops arrive two at a time, then every drop reassigned (a new version
    of what the clustering reads): each run's tasks read their drops where they run."""
    from vidassets.config import ClusterSettings
    from vidassets.curate import clusters
    from vidassets.storage import LocalObjectStore

    objects, table = LocalObjectStore(root), {}
    for n, full in ((2, "f1"), (4, "f1"), (len(drops), "f1"), (len(drops), "f2")):
        done = clusters.update(objects, dict.fromkeys(list(drops)[:n], "1"), drops.__getitem__, "c1", full,
                               RowVersion("clusters-ray", "in"), ClusterSettings(k=3), engine=engine)
        table = {c: r for c, r in table.items() if r["source_shard"] not in done.changed}
        table.update({r["clip_id"]: r for r in done.rows})
        done.remember()
    return [table[c] for c in sorted(table)]


def test_cluster_assignment_as_ray_tasks_gives_the_local_rows(ray_cluster: str, tmp_path: Path) -> None:
    """``clip_clusters`` assigns each changed drop in a task that reads the drop where it runs: on a
    real local Ray cluster the rows equal those of the same tasks in this process and of no engine
    at all, through arrivals and a reassignment of every drop."""
    drops = _cluster_drops(7)
    whole = _cluster_rows(drops, None, tmp_path / "whole")
    assert len(whole) == sum(len(d) for d in drops.values()) and len({r["cluster"] for r in whole}) > 1
    assert _cluster_rows(drops, engine_for("local"), tmp_path / "local") == whole
    assert _cluster_rows(drops, engine_for("ray", ray_cluster), tmp_path / "ray") == whole


class _Slowed:
    """An engine whose every task first sleeps ``seconds`` (long enough for a test to find the worker
    running it), then runs the real compute."""

    def __init__(self, engine, seconds: float):
        self.engine, self.seconds = engine, seconds

    def map(self, compute, items, label=str, log=lambda _: None, models=False):
        seconds = self.seconds
        return self.engine.map(lambda item: (time.sleep(seconds), compute(item))[1], items, label, log, models)


def test_a_worker_killed_mid_global_stage_loses_nothing(ray_cluster: str, monkeypatch, tmp_path: Path) -> None:
    """A Ray worker SIGKILLed while it runs a task of dedup's join, the cluster assignment or the
    decontamination matching: Ray runs the task again and the stage's rows equal the local ones."""
    import numpy as np

    from vidassets.config import DecontaminationSettings, DedupSettings
    from vidassets.curate import decontamination, dedup
    from vidassets.curate.dedup_state import DedupState
    from vidassets_tests.test_curate import _dedup_partition
    from vidassets_tests.test_decontamination import _random_drops

    def killed_during(work):
        killed: list[int] = []
        killer = _killer(b"ray::_ray_task", killed)
        found = work(_Slowed(engine_for("ray", ray_cluster), 0.5))
        killer.join()
        assert killed, "no Ray task was seen running"
        return found

    drops = _cluster_drops(5)
    assert killed_during(lambda e: _cluster_rows(drops, e, tmp_path / "clusters")) == \
        _cluster_rows(drops, None, tmp_path / "clusters-local")

    rng = np.random.default_rng(11)
    anchors, anchor_vectors = rng.integers(0, 256, (4, 4, 32), dtype=np.uint8), rng.normal(size=(4, 16))
    parts = {f"web/d{i}": _dedup_partition(rng, f"web/d{i}", 10, anchors, anchor_vectors) for i in range(3)}

    def dedup_rows(engine, name: str) -> list[dict]:
        state = DedupState(f"sqlite:///{tmp_path}/{name}.sqlite")
        dedup.update(state, "v", dict.fromkeys(parts, "1"), parts.__getitem__, DedupSettings(), engine)
        return dedup.group_rows(state, RowVersion("dedup-ray", "in"))

    assert killed_during(lambda e: dedup_rows(e, "dedup")) == dedup_rows(None, "dedup-local")

    train, evals = _random_drops(3, 6)
    monkeypatch.setattr(decontamination, "EVAL_SLICE", 2)
    params, version = DecontaminationSettings(), RowVersion("d", "i")

    def decontaminated(engine) -> list[dict]:
        state, _ = decontamination.update(decontamination.DecontaminationState(), "v", dict.fromkeys(train, "1"),
                                          {f"eval/{p}": "1" for p in train}, train.__getitem__, evals.__getitem__,
                                          params, engine)
        return state.rows(params, version)

    assert killed_during(decontaminated) == decontaminated(None)
