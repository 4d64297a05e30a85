"""The expiry matrix: for each kind of change, materialize a small real corpus, apply the change,
materialize again, and count rows computed, model calls and frames decoded per stage. What the
change expires must recompute; everything else must be reused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from dagster import AssetKey

from vidassets.config import load_settings
from vidassets.graph import build_definitions
from vidassets.models.embedder import mobilenet_weights_path
from vidassets.plan import plan_change
from vidassets.runner import RunSummary, local_instance
from vidassets.storage import TableStore, open_object_store
from vidassets_tests.conftest import graph_settings, run_graph, small_bucket
from vidassets_tests.test_derive import ChatServer

MEDIA = ("video_probe", "frame_index", "video_analysis")


@pytest.fixture(scope="module")
def corpus(demo_bucket: Path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("expiry")
    bucket = small_bucket(demo_bucket, tmp)
    run_graph(graph_settings(bucket, tmp), tmp)
    return tmp


@pytest.fixture
def world(corpus: Path, tmp_path: Path) -> Path:
    """A private copy of the materialized corpus: bucket, store, vault and Dagster instance."""
    shutil.copytree(corpus, tmp_path / "w")
    return tmp_path / "w"


def _tables(root: Path) -> TableStore:
    return TableStore(open_object_store(str(root / "store")))


def _passing(root: Path) -> set[str]:
    return set(_tables(root).read("selection").query("decision == 'pass'").clip_id)


def _extra(summary: RunSummary, stage: str, key: str) -> int:
    return summary.stages[stage].extra.get(key, 0)


def _no_work(summary: RunSummary, *stages: str) -> None:
    for stage in stages:
        s = summary.stages[stage]
        assert s.extra.get("rows_computed", 0) == 0, (stage, s.extra)
        assert s.extra.get("model_calls", 0) == 0, (stage, s.extra)
        assert s.extra.get("frames_decoded", 0) == 0, (stage, s.extra)


def _rerun(world: Path, **changes) -> tuple[RunSummary, list]:
    settings = graph_settings(world / "bucket", world, **changes)
    plan = {p.asset: p for p in plan_change(_tables(world), settings)}
    return run_graph(settings, world), plan


def test_new_drop_computes_that_partition_only(world: Path, demo_bucket: Path) -> None:
    drop = world / "bucket/raw/web/drop-0007"
    drop.mkdir(parents=True)
    shutil.copy(demo_bucket / "raw/licensed/drop-0002/carphone_vp9.webm", drop / "carphone_vp9.webm")
    (drop / "_SUCCESS").write_bytes(b"")
    before = _tables(world).read_all("clip_scores")
    summary, _ = _rerun(world)
    assert summary.stages["video_probe"].runs == 2
    assert _extra(summary, "video_probe", "rows_computed") == 1 and _extra(summary, "video_probe", "rows_reused") == 2
    assert _extra(summary, "video_analysis", "rows_computed") == 1
    new_clips = _tables(world).read("clips", "web/drop-0007")
    assert _extra(summary, "clip_scores", "rows_computed") == 8 * len(new_clips)
    assert _extra(summary, "clip_scores", "rows_reused") == len(before)
    assert _extra(summary, "clip_embeddings", "rows_computed") == len(new_clips)
    assert summary.stages["dedup_groups"].extra["new_clips"] == len(new_clips)  # incremental


def test_captioner_change_recaptions_only(world: Path) -> None:
    server = ChatServer()
    try:
        chosen = _passing(world)
        summary, plan = _rerun(world, **{"annotations.captions": "vlm", "annotations.vlm": {
            "endpoint": server.endpoint, "model": "test-vl", "model_revision": "r2", "backoff_seconds": 0.01}})
    finally:
        server.close()
    assert len(server.requests) == len(chosen)  # captions only: camera and tags are reused
    assert _extra(summary, "annotations", "rows_computed") == len(chosen)
    assert _extra(summary, "text_embeddings", "model_calls") == len(chosen)
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings", "latents")
    assert plan["annotations"].rows_to_compute == len(chosen) and plan["latents"].rows_to_compute == 0


def test_embedder_change_reembeds_and_rededups_but_scores_nothing(world: Path) -> None:
    weights = torch.load(mobilenet_weights_path(), map_location="cpu", weights_only=True)
    name = next(k for k in weights if k.endswith("weight") and weights[k].ndim == 4)
    weights[name] = weights[name] * 1.0001  # a new embedder revision, as far as versions go
    path = world / "mobilenet_v2_rev2.pth"
    torch.save(weights, path)
    before = _passing(world)
    clips = len(_tables(world).read_all("clips"))
    summary, plan = _rerun(world, **{"embeddings.weights": str(path)})
    admitted = _passing(world) - before
    assert _extra(summary, "clip_embeddings", "rows_computed") == clips == plan["clip_embeddings"].rows_to_compute
    assert summary.stages["dedup_groups"].runs == 1 and summary.stages["selection"].runs == 1
    _no_work(summary, *MEDIA, "clips", "clip_scores")
    assert _extra(summary, "latents", "model_calls") == len(admitted)  # only changed decisions
    assert _extra(summary, "annotations", "rows_computed") == 3 * len(admitted)


def test_vae_change_reencodes_latents_only_and_dagster_marks_only_them_stale(world: Path) -> None:
    chosen = _passing(world)
    changed = graph_settings(world / "bucket", world, **{"latents.base_resolution": 80})
    instance = local_instance(str(world / "home"))
    defs = build_definitions(changed)
    # the resolver the Dagster UI uses to mark assets stale (private API; no public equivalent in 1.13)
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(), LoadingContextForTest(instance))
    key = "licensed/drop-0001"
    assert resolver.get_status(AssetKey("latents"), key) == StaleStatus.STALE
    causes = resolver.get_stale_root_causes(AssetKey("latents"), key)
    assert any("code version" in c.reason for c in causes)
    for fresh in ("annotations", "text_embeddings", "clip_scores", "video_analysis"):
        assert resolver.get_status(AssetKey(fresh), key) == StaleStatus.FRESH, fresh
    summary, plan = _rerun(world, **{"latents.base_resolution": 80})
    assert _extra(summary, "latents", "model_calls") == len(chosen) == plan["latents"].rows_to_compute
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings", "annotations", "text_embeddings",
             "clip_ladder")
    # the new resolution is read from the ladder: no raw video is decoded again
    assert _extra(summary, "latents", "read_from_ladder") == len(chosen)
    assert _extra(summary, "latents", "raw_frames_decoded") == 0
    lat = _tables(world).read_all("latents")
    assert len(lat) == 2 * len(chosen)  # the old version's rows stay beside the new ones
    new = lat[lat.producer_version == changed.versions.latents]
    assert set(new.frames_from) == {"ladder:128p24"}  # the 64 px rung is too small for an 80 px bucket


def test_ladder_change_reencodes_rungs_and_the_latents_that_read_them(world: Path) -> None:
    chosen = _passing(world)
    rungs = len(_tables(world).read_all("clip_ladder"))
    summary, plan = _rerun(world, **{"ladder.crf": 30})
    assert _extra(summary, "clip_ladder", "rows_computed") == rungs
    assert _extra(summary, "clip_ladder", "clip_decodes") == len(chosen)
    assert _extra(summary, "latents", "model_calls") == len(chosen) == plan["latents"].rows_to_compute
    assert _extra(summary, "latents", "raw_frames_decoded") == 0
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings", "annotations", "text_embeddings",
             "clip_audio")
    # latents reading the raw files do not depend on the ladder
    summary, plan = _rerun(world, **{"latents.read_from": "raw"})
    assert _extra(summary, "latents", "read_from_raw") == len(chosen) and _extra(summary, "latents", "raw_frames_decoded") > 0
    summary, plan = _rerun(world, **{"latents.read_from": "raw", "ladder.crf": 31})
    assert _extra(summary, "clip_ladder", "rows_computed") == rungs
    assert _extra(summary, "latents", "model_calls") == 0 and plan["latents"].rows_to_compute == 0


def test_one_formula_change_rescores_that_score_only(world: Path) -> None:
    clips = len(_tables(world).read_all("clips"))
    before = _passing(world)
    summary, plan = _rerun(world, **{"scores.motion_cut_threshold": 20.0})
    admitted = _passing(world) - before
    assert _extra(summary, "clip_scores", "rows_computed") == clips == plan["clip_scores"].rows_to_compute
    assert _extra(summary, "clip_scores", "rows_reused") == 7 * clips
    assert _extra(summary, "clip_scores", "model_calls") == 0  # motion is a formula over saved signals
    scores = _tables(world).read_all("clip_scores")
    assert scores.loc[scores.score == "motion", "producer_version"].str.contains("cut20").all()
    _no_work(summary, *MEDIA, "clips", "clip_embeddings")
    assert _extra(summary, "latents", "model_calls") == len(admitted)


def test_model_score_change_runs_that_model_only(world: Path) -> None:
    clips = len(_tables(world).read_all("clips"))
    frames = len(_tables(world).read_all("context_frames"))
    summary, _ = _rerun(world, **{"scores.text_min_score": 0.6})
    assert _extra(summary, "clip_scores", "rows_computed") == clips
    assert 0 < _extra(summary, "clip_scores", "model_calls") <= frames  # text detector on context frames only
    _no_work(summary, *MEDIA, "clips", "clip_embeddings")


def test_segmentation_change_recuts_clips_but_not_media(world: Path) -> None:
    old = set(_tables(world).read_all("clips").clip_id)
    summary, plan = _rerun(world, **{"clips.max_seconds": 3.0})
    new = set(_tables(world).read_all("clips").clip_id)
    added = new - old
    assert added and plan["clips"].rows_to_compute == len(added)
    _no_work(summary, *MEDIA)
    assert _extra(summary, "video_probe", "rows_reused") == 2
    assert _extra(summary, "clip_scores", "rows_computed") == 8 * len(added)
    assert _extra(summary, "clip_embeddings", "rows_computed") == len(added)


def test_plan_change_cli_prints_the_plan(world: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "new.yaml"
    config.write_text(json.dumps({"latents": {"base_resolution": 80, "frame_buckets": [9, 17]}}))
    proc = subprocess.run([str(Path(sys.executable).parent / "vidassets"), "plan-change", "--config", str(config),
                           "--store", str(world / "store"), "--dagster-home", str(world / "home"), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plans = {p["asset"]: p for p in json.loads(proc.stdout)}
    assert plans["latents"]["stale"] and plans["latents"]["rows_to_compute"] == len(_passing(world))
    assert plans["latents"]["seconds_per_row"] and plans["latents"]["estimated_seconds"] > 0
    assert not plans["video_analysis"]["stale"] and not plans["annotations"]["stale"]
    assert load_settings(config, env={}).latents.base_resolution == 80


def test_report_is_one_offline_html_page(world: Path, tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    out = tmp_path / "report.html"
    proc = subprocess.run([str(Path(sys.executable).parent / "vidassets"), "report", "-o", str(out),
                           "--store", str(world / "store"), "--dagster-home", str(world / "home")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = out.read_text()
    for section in ("Funnel per stage", "Score histograms", "Duplicate group sizes", "Throughput per stage"):
        assert section in page
    assert page.count("data:image/png;base64,") >= 4
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing to fetch: opens offline
    assert "clips selected" in page and "latents" in page


def test_schema_check_catches_a_table_changed_behind_the_catalogs_back(world: Path) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from dagster import AssetSelection, materialize

    tables = _tables(world)
    clips = tables.read("clips", "licensed/drop-0001")
    clips.loc[0, "last_frame"] = -5  # written around TableStore, which would have refused it
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(clips, preserve_index=False), buffer)
    tables.objects.put_bytes(tables.key("clips", "licensed/drop-0001"), buffer.getvalue())
    defs = build_definitions(graph_settings(world / "bucket", world))
    result = materialize([*defs.assets, *defs.asset_checks], instance=local_instance(str(world / "home")),
                         resources=defs.resources, selection=AssetSelection.checks_for_assets(AssetKey("clips")),
                         raise_on_error=False)
    checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    schema = next(c for c in checks if c.check_name == "schema")
    assert not schema.passed and "last_frame before first_frame" in str(schema.metadata["failures"].value)


def test_quarantine_warning_and_freshness_policies(world: Path, demo_bucket: Path) -> None:
    from vidassets.runner import materialize_bucket
    from vidassets_tests.conftest import MEDIA_STAGES
    from vidassets_tests.media_files import make_awkward_files

    hostile = world / "bucket/raw/web/drop-0005"
    make_awkward_files(hostile, demo_bucket / "raw/licensed/drop-0001/bikes.mp4")
    (hostile / "_SUCCESS").write_bytes(b"")
    lines: list[str] = []
    settings = graph_settings(world / "bucket", world)
    summary = materialize_bucket(settings, local_instance(str(world / "home")), select=MEDIA_STAGES, log=lines.append)
    assert summary.ok
    warned = [line for line in lines if "quarantine_rate on video_probe FAILED (WARN)" in line]
    assert len(warned) == 1 and warned[0].startswith("[web/drop-0005]")  # the clean drop passes
    defs = build_definitions(settings)
    for name, hours in (("raw_inventory", 6), ("video_analysis", 24)):
        policy = next(iter(defs.get_assets_def(AssetKey(name)).specs)).freshness_policy
        assert policy.fail_window.to_timedelta().total_seconds() == hours * 3600, name
