"""Snapshots on real footage: a frozen manifest of the selected clips with latents, takedowns that
exclude every derived sample of an asset with no recomputation, snapshot diffs with reasons, and
the lineage of one sample from source object to the snapshots that hold (or dropped) it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vidassets.storage import TableStore, open_object_store
from vidassets.train.lineage import sample_lineage
from vidassets.train.snapshot import diff_snapshots, read_snapshot, snapshot_meta, snapshot_versions
from vidassets_tests.conftest import graph_settings, run_graph

CLI = str(Path(sys.executable).parent / "vidassets")


@pytest.fixture(scope="module")
def trained(demo_bucket: Path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("train")
    drop = tmp / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in ("bikes.mp4", "carphone.mp4", "_provenance.json", "_SUCCESS"):
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    run_graph(graph_settings(tmp / "bucket", tmp), tmp)
    return tmp


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def test_snapshot_takedown_diff_and_lineage(trained: Path) -> None:
    tables = TableStore(open_object_store(str(trained / "store")))
    objects = tables.objects
    settings = graph_settings(trained / "bucket", trained)
    first = run_graph(settings, trained, select=["dataset_snapshot"])
    assert first.stages["dataset_snapshot"].runs == 1 and snapshot_versions(objects) == [1]
    v1 = read_snapshot(objects, 1)
    chosen = set(tables.read("selection").query("decision == 'pass'").clip_id)
    with_latents = set(tables.read_all("latents").query("status == 'ok'").clip_id)
    assert set(v1.clip_id) == chosen & with_latents and len(v1) >= 2
    assert v1.source_uri.str.startswith("file://").all() and v1.license.notna().all()
    assert (v1.stream == "licensed").all() and v1.bucket.notna().all() and v1.latent_version.notna().all()
    assert all(json.loads(s) for s in v1.score_versions) and v1.captions.notna().all()
    meta = snapshot_meta(objects, 1)
    assert meta["samples"] == len(v1) and meta["versions"]["latents"] == settings.versions.latents
    assert objects.exists("snapshots/v1/recipe.yaml")

    # take down one source asset: the next snapshot drops all of its clips, recomputing nothing
    victim = v1.asset_id.iloc[0]
    victim_clips = set(v1.loc[v1.asset_id == victim, "clip_id"])
    proc = _cli("takedown", "--store", str(trained / "store"), "--asset-id", victim, "--reason", "rights holder request")
    assert proc.returncode == 0, proc.stderr
    second = run_graph(settings, trained, select=["dataset_snapshot"])
    assert second.stages["dataset_snapshot"].extra.get("model_calls", 0) == 0
    assert second.stages["dataset_snapshot"].extra.get("frames_decoded", 0) == 0
    v2 = read_snapshot(objects, 2)
    assert not set(v2.clip_id) & victim_clips and set(v2.clip_id) == set(v1.clip_id) - victim_clips
    # v1 is untouched, and the snapshots share their latents (no copies)
    assert read_snapshot(objects, 1).equals(v1)
    shared = v1[v1.clip_id.isin(v2.clip_id)].set_index("clip_id").latent_key
    assert (shared == v2.set_index("clip_id").latent_key.loc[shared.index]).all()

    diff = diff_snapshots(objects, 1, 2)
    removed = diff[diff.change == "removed"]
    assert set(removed.clip_id) == victim_clips and (removed.reason == "takedown").all()
    assert "rights holder request" in removed.detail.iloc[0]
    proc = _cli("snapshot", "diff", "1", "2", "--store", str(trained / "store"))
    assert proc.returncode == 0 and "takedown" in proc.stdout, proc.stderr

    clip = sorted(victim_clips)[0]
    lineage = sample_lineage(tables, clip)
    assert lineage["sources"][0]["uri"].endswith(".mp4") and lineage["sources"][0]["license"]
    assert {s["score"] for s in lineage["scores"]} >= {"optical", "motion", "quality"}
    assert all(s["producer_version"] for s in lineage["scores"])
    assert {a["kind"] for a in lineage["annotations"]} == {"camera", "captions", "tags"}
    assert lineage["latents"][0]["latent_key"].startswith("blobs/latents/")
    assert lineage["snapshots"] == [{"snapshot": 1, "included": True},
                                    {"snapshot": 2, "included": False, "reason": "takedown",
                                     "detail": lineage["snapshots"][1]["detail"]}]
    proc = _cli("lineage", "sample", clip, "--store", str(trained / "store"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["clip"]["clip_id"] == clip
    assert _cli("lineage", "sample", "nope", "--store", str(trained / "store")).returncode == 2
