"""The media stage through Dagster on real and hostile files: statuses, one decode per frame,
context frames in the store, clips, and row-exact reuse / sticky quarantine on re-runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vidassets.storage import TableStore, open_object_store
from vidassets_tests.conftest import MEDIA_STAGES, graph_settings, run_graph
from vidassets_tests.media_files import make_awkward_files


@pytest.fixture(scope="module")
def run_dir(demo_bucket: Path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("media_assets")
    bucket = tmp / "bucket"
    shutil.copytree(demo_bucket, bucket)
    shutil.rmtree(bucket / "raw/web/drop-0004")
    hostile = bucket / "raw/web/drop-0005"
    make_awkward_files(hostile, demo_bucket / "raw/licensed/drop-0001/bikes.mp4")
    (hostile / "_SUCCESS").write_bytes(b"")
    first = run_graph(graph_settings(bucket, tmp), tmp, select=MEDIA_STAGES)
    (tmp / "first_summary.json").write_text(json.dumps({k: vars(v) for k, v in first.stages.items()}))
    return tmp


def _tables(tmp: Path) -> TableStore:
    return TableStore(open_object_store(str(tmp / "store")))


def test_every_file_gets_a_verdict_and_nothing_crashes(run_dir: Path) -> None:
    probe = _tables(run_dir).read_all("video_probe")
    by_name = {u.rsplit("/", 1)[-1]: r for u, r in zip(probe.uri, probe.to_dict("records"), strict=True)}
    assert by_name["page.mp4"]["status"] == "quarantined"
    assert "not a readable video container" in by_name["page.mp4"]["reason"]
    assert by_name["playlist.mp4"]["status"] == "quarantined"
    assert by_name["one_frame.mp4"]["status"] == "quarantined"
    assert "32x24" in by_name["tiny_32x24.mp4"]["reason"]
    assert by_name["bikes_truncated.mp4"]["status"] == "salvaged"
    for name in ("mpeg2.ts", "vp9.webm", "mjpeg.avi", "hevc.mp4", "vfr.mp4", "bigbuckbunny_rot90.mp4"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert by_name["bigbuckbunny_rot90.mp4"]["rotation"] == 90
    assert bool(by_name["vfr.mp4"]["vfr"]) is True
    inventory = _tables(run_dir).read_all("raw_inventory")
    fifo = inventory[inventory.uri.str.endswith("fifo.mp4")].iloc[0]
    assert fifo["status"] == "refused" and "fifo" in fifo["reason"]
    assert not probe.uri.str.endswith("fifo.mp4").any()  # refused at ingest, never opened


def test_each_frame_is_decoded_once_and_context_frames_are_stored(run_dir: Path) -> None:
    tables = _tables(run_dir)
    probe = tables.read_all("video_probe").set_index("asset_id")
    analysis = tables.read_all("video_analysis")
    usable = probe[probe.status.isin(["ok", "salvaged"])]
    assert set(analysis.asset_id) == set(usable.index)
    for row in analysis.to_dict("records"):
        counted = probe.loc[row["asset_id"], "counted_frames"]
        assert row["frames_decoded"] <= counted
        if probe.loc[row["asset_id"], "status"] == "ok":
            assert row["status"] == "ok" and row["frames_decoded"] == counted, row
    frames = tables.read_all("context_frames")
    objects = open_object_store(str(run_dir / "store"))
    assert len(frames) == analysis.context_frames.sum() > 0
    sample = frames.iloc[0]
    assert objects.get_bytes(sample["blob_key"])[:2] == b"\xff\xd8"  # a JPEG
    index = tables.read_all("frame_index")
    assert set(index.asset_id) == set(usable.index) and (index.status != "failed").all()


def test_clips_lie_inside_their_shots(run_dir: Path) -> None:
    tables = _tables(run_dir)
    clips = tables.read_all("clips")
    analysis = tables.read_all("video_analysis").set_index("asset_id")
    assert len(clips) > 0
    for clip in clips.to_dict("records"):
        shots = json.loads(analysis.loc[clip["asset_id"], "shots"])
        assert any(a <= clip["first_frame"] <= clip["last_frame"] <= b for a, b in shots)
        if clip["media_type"] == "image":  # a still image is one 1-frame clip, no duration bounds
            assert (clip["first_frame"], clip["last_frame"], clip["duration_s"]) == (0, 0, 0.0)
        else:
            assert 2.0 - 1e-6 <= clip["duration_s"] <= 20.0 + 1e-6


def test_rerun_reuses_rows_and_a_final_quarantine_is_final_for_its_version(run_dir: Path) -> None:
    bucket = run_dir / "bucket"
    again = run_graph(graph_settings(bucket, run_dir), run_dir, select=MEDIA_STAGES)
    assert again.stages["video_analysis"].extra.get("frames_decoded", 0) == 0
    assert again.stages["video_probe"].extra["rows_reused"] == again.stages["video_probe"].rows_out
    # a new probe version (other limits) probes every file again: a verdict holds for its version only
    changed = graph_settings(bucket, run_dir, **{"probe.min_salvage_seconds": 0.5})
    summary = run_graph(changed, run_dir, select=["video_probe"])
    assert summary.stages["video_probe"].extra["rows_reused"] == 0
    quarantined = summary.stages["video_probe"].extra["quarantined"]
    probe = _tables(run_dir).read_all("video_probe")
    transient = int((probe.failure == "transient").sum())
    assert quarantined > 0 and set(probe.loc[probe.status == "quarantined", "failure"]) <= {"final", "transient"}
    # under that version final quarantines stand (only transient failures are tried again)...
    kept = run_graph(changed, run_dir, select=["video_probe"]).stages["video_probe"]
    assert kept.extra["rows_reused"] == kept.rows_out - transient and kept.extra["rows_computed"] == transient
    # ...unless asked to
    retried = run_graph(changed, run_dir, select=["video_probe"], retry_quarantined=True)
    stage = retried.stages["video_probe"]
    assert stage.extra["rows_reused"] == stage.rows_out - quarantined  # only quarantined rows re-probed
    assert stage.extra["quarantined"] == quarantined
