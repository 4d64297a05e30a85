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

from vidassets.change_plan import plan_change
from vidassets.config import load_settings
from vidassets.curate.selection import load_recipe
from vidassets.graph import build_definitions
from vidassets.models.registry import KINDS
from vidassets.runner import RunSummary, local_instance
from vidassets.storage import TableStore, open_object_store
from vidassets.versions import Versions
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


def _windows(root: Path, clip_ids: set[str]) -> set[tuple]:
    """(clip_id, asset_id, first_pts, last_pts) of those clips: the frames a latent or rung reads."""
    clips = _tables(root).read_all("clips")
    return {(r.clip_id, r.asset_id, r.first_pts, r.last_pts) for r in clips.itertuples() if r.clip_id in clip_ids}


def _extra(summary: RunSummary, stage: str, key: str) -> int:
    return summary.stages[stage].extra.get(key, 0)


def _model_scored(root: Path) -> int:
    """Clips whose model scores were computed (not skipped by the cheap-first cascade)."""
    scores = _tables(root).read_all("clip_scores")
    return scores[(scores.score == "text") & (scores.status != "skipped")].clip_id.nunique()


def _no_work(summary: RunSummary, *stages: str) -> None:
    for stage in stages:
        s = summary.stages[stage]
        assert s.extra.get("rows_computed", 0) == 0, (stage, s.extra)
        assert s.extra.get("model_calls", 0) == 0, (stage, s.extra)
        assert s.extra.get("frames_decoded", 0) == 0, (stage, s.extra)


def _rerun(world: Path, **changes) -> tuple[RunSummary, dict]:
    """Plan the change, run it, and check that every exact prediction equals what the run computed."""
    settings = graph_settings(world / "bucket", world, **changes)
    plan = {p.asset: p for p in plan_change(_tables(world), settings)}
    summary = run_graph(settings, world)
    for name, stage in summary.stages.items():
        p = plan[name]
        if p.exact:
            assert p.rows_to_compute == stage.extra.get("rows_computed", 0), (name, p, stage)
    return summary, plan


def test_new_drop_computes_that_partition_only(world: Path, demo_bucket: Path) -> None:
    drop = world / "bucket/raw/web/drop-0007"
    drop.mkdir(parents=True)
    # a video that is no copy of drop-0001's (a re-encode of one would be caught at ingest and not analysed)
    shutil.copy(demo_bucket / "raw/licensed/drop-0002/compilation_hardcuts.mp4", drop / "compilation_hardcuts.mp4")
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
    weights = torch.load(KINDS["mobilenet_v2-imagenet"].weights()[0], map_location="cpu", weights_only=True)
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
    changed = graph_settings(world / "bucket", world, **{"latents.resolutions": [80]})
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
    summary, plan = _rerun(world, **{"latents.resolutions": [80]})
    assert _extra(summary, "latents", "model_calls") == len(chosen) == plan["latents"].rows_to_compute
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings", "annotations", "text_embeddings",
             "clip_ladder")
    # the new resolution is read from the ladder: no raw video is decoded again
    assert _extra(summary, "latents", "read_from_ladder") == len(chosen)
    assert _extra(summary, "latents", "raw_frames_decoded") == 0
    lat = _tables(world).read_all("latents")
    assert len(lat) == 2 * len(chosen)  # the old version's rows stay beside the new ones
    new = lat[lat.producer_version == Versions(changed).own("latents")]
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
    assert load_settings(config, env={}).latents.resolutions == (80,)  # the one-resolution key still reads


def test_report_is_one_offline_html_page(world: Path, tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    out = tmp_path / "report.html"
    proc = subprocess.run([str(Path(sys.executable).parent / "vidassets"), "report", "-o", str(out),
                           "--store", str(world / "store"), "--dagster-home", str(world / "home"),
                           "--eval-vault", str(world / "vault")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = out.read_text()
    assert "contamination-scan coverage 100.0% (PASS)" in page
    # eval material the last decontamination has not seen: the gate fails and names the drop
    from vidassets.report import release_gate

    vault = _tables(tmp_path / "vault_copy")
    if (world / "vault").exists():
        shutil.copytree(world / "vault", tmp_path / "vault_copy" / "store", dirs_exist_ok=True)
    vault.write("eval_embeddings", "licensed/drop-9999", [])
    gate = release_gate(_tables(world), vault)
    assert "(FAIL)" in gate and "licensed/drop-9999" in gate
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


def test_analysis_change_rescores_and_reembeds_every_clip_it_touched(world: Path) -> None:
    """analysis.width and context_fps change the signals and context frames that scores and
    embeddings read: none of their rows may be reused, and plan-change says so beforehand."""
    clips_before = len(_tables(world).read_all("clips"))
    encoded = _windows(world, set(_tables(world).read_all("latents").query("status == 'ok'").clip_id))
    change = {"analysis.width": 256, "analysis.context_fps": 1.0}
    summary, plan = _rerun(world, **change)
    # latents, rungs and audio read the clip's frames: only windows not encoded before are encoded now
    assert _extra(summary, "latents", "model_calls") == len(_windows(world, _passing(world)) - encoded)
    assert _extra(summary, "latents", "rows_reused") == len(_windows(world, _passing(world)) & encoded)
    clips_after = len(_tables(world).read_all("clips"))
    assert _extra(summary, "video_analysis", "rows_computed") == 2
    for stage, per_clip in (("clip_scores", 8), ("clip_embeddings", 1)):
        assert _extra(summary, stage, "rows_reused") == 0, stage
        assert _extra(summary, stage, "rows_computed") == per_clip * clips_after
        assert plan[stage].stale and plan[stage].rows_to_compute == per_clip * clips_before
    assert plan["video_probe"].rows_to_compute == 0 and plan["frame_index"].rows_to_compute == 0
    _no_work(summary, "video_probe", "frame_index")
    frames = _tables(world).read_all("context_frames")
    scores = _tables(world).read_all("clip_scores")
    now = Versions(graph_settings(world / "bucket", world, **change)).score_rows()
    assert all(r.input_version == now[r.score].inputs for r in scores.itertuples())  # each row names what it read
    assert frames.time_s.diff().dropna().abs().median() >= 0.9  # 1 fps now


def test_context_fps_change_alone_expires_scores_and_embeddings(world: Path) -> None:
    summary, plan = _rerun(world, **{"analysis.context_fps": 1.0})
    assert _extra(summary, "clip_embeddings", "rows_reused") == 0 and _extra(summary, "clip_scores", "rows_reused") == 0
    _no_work(summary, "video_probe", "frame_index")


def test_ladder_rungs_audio_dedup_and_decontamination_changes_stay_local(world: Path) -> None:
    chosen = _passing(world)
    summary, plan = _rerun(world, **{"ladder.short_sides": [64, 96]})
    assert _extra(summary, "clip_ladder", "rows_computed") == plan["clip_ladder"].rows_to_compute > 0
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings", "annotations", "clip_audio")
    summary, plan = _rerun(world, **{"ladder.short_sides": [64, 96], "audio.bitrate": 24000})
    assert _extra(summary, "clip_audio", "rows_computed") == len(chosen) == plan["clip_audio"].rows_to_compute
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings", "annotations", "clip_ladder", "latents")
    base = {"ladder.short_sides": [64, 96], "audio.bitrate": 24000}
    clips = len(_tables(world).read_all("clips"))
    summary, plan = _rerun(world, **base, **{"dedup.max_hamming": 20})
    assert _extra(summary, "dedup_groups", "rows_computed") == clips == plan["dedup_groups"].rows_to_compute
    assert summary.stages["decontamination"].extra.get("rows_computed", 0) == 0  # its inputs did not change
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings")
    summary, plan = _rerun(world, **base, **{"dedup.max_hamming": 20, "decontamination.min_frame_share": 0.3})
    assert _extra(summary, "decontamination", "rows_computed") == clips == plan["decontamination"].rows_to_compute
    assert _extra(summary, "dedup_groups", "rows_computed") == 0
    _no_work(summary, *MEDIA, "clips", "clip_scores", "clip_embeddings")


def test_eval_salt_change_reroutes_without_reprobing_the_rest(world: Path) -> None:
    summary, plan = _rerun(world, **{"eval.fraction": 0.5, "eval.salt": "salt-b"})
    assert _extra(summary, "eval_split", "rows_computed") == 2 == plan["eval_split"].rows_to_compute
    assert _extra(summary, "video_probe", "rows_computed") == 0  # the videos left on the train side are reused
    routed = TableStore(open_object_store(str(world / "vault"))).read_all("eval_assets")
    train = _tables(world).read_all("eval_split")
    assert len(routed) + len(train) == 2 and set(_tables(world).read_all("clips").asset_id) <= set(train.asset_id)


def test_a_transient_score_failure_is_retried_and_never_counts_as_a_rejection(world: Path, monkeypatch) -> None:
    from vidassets.curate import scores as scores_module

    real = scores_module._model_score
    calls = {"n": 0}

    def flaky(name, model, frames, settings):
        if name == "text":
            calls["n"] += 1
            raise TimeoutError("the text detector timed out")  # injected: a failure of the run, not the clip
        return real(name, model, frames, settings)

    # clips a formula rule rejects never reach the text model (cheap first): count the others
    clips = _model_scored(world)
    monkeypatch.setattr(scores_module, "_model_score", flaky)
    change = {"scores.text_min_score": 0.6}
    summary, _ = _rerun(world, **change)
    assert calls["n"] == clips and _extra(summary, "clip_scores", "retry_pending") == clips
    text = _tables(world).read_all("clip_scores").query("score == 'text' and status != 'skipped'")
    assert set(text.status) == {"error"} and set(text.failure) == {"transient"} and set(text.runs) == {1}
    sel = _tables(world).read("selection")
    text_rule = next(r.name for r in load_recipe(None).score_rules if r.score == "text")
    assert text_rule not in set(sel.first_failed_rule)  # an error is not a failed threshold
    assert "error:text" in set(sel.first_failed_rule)
    # the next run retries exactly those rows (plan-change says so first) and they succeed
    monkeypatch.setattr(scores_module, "_model_score", real)
    summary, plan = _rerun(world, **change)
    assert _extra(summary, "clip_scores", "rows_computed") == clips == plan["clip_scores"].rows_to_compute
    text = _tables(world).read_all("clip_scores").query("score == 'text' and status != 'skipped'")
    assert set(text.status) == {"ok"} and set(text.runs) == {2} and text.failure.isna().all()
    assert not any(str(r).startswith("error:") for r in _tables(world).read("selection").first_failed_rule)


def test_a_permanent_failure_stops_after_the_run_budget(world: Path, monkeypatch) -> None:
    from vidassets.curate import scores as scores_module

    real = scores_module._model_score

    def broken(name, model, frames, settings):
        if name == "nsfw":
            raise MemoryError("out of memory")
        return real(name, model, frames, settings)

    monkeypatch.setattr(scores_module, "_model_score", broken)
    clips = len(_tables(world).read_all("clips"))
    scored = _model_scored(world)  # the others are skipped by the cascade: no model, no failure
    change = {"scores.nsfw_kill_threshold": 0.7, "execution.max_runs": 2}
    first, _ = _rerun(world, **change)
    second, plan = _rerun(world, **change)
    third, plan3 = _rerun(world, **change)
    assert _extra(first, "clip_scores", "rows_computed") == clips and _extra(first, "clip_scores", "retry_pending") == scored
    assert _extra(second, "clip_scores", "rows_computed") == scored == plan["clip_scores"].rows_to_compute
    assert _extra(second, "clip_scores", "retry_pending") == 0  # the budget is spent
    assert _extra(third, "clip_scores", "rows_computed") == 0 == plan3["clip_scores"].rows_to_compute
    assert _extra(third, "clip_scores", "retries_exhausted") == scored
    nsfw = _tables(world).read_all("clip_scores").query("score == 'nsfw' and status != 'skipped'")
    assert len(nsfw) == scored and set(nsfw.runs) == {2} and set(nsfw.status) == {"error"}


def test_a_source_that_cannot_be_read_once_is_probed_again(world: Path, demo_bucket: Path, monkeypatch) -> None:
    from vidassets.media import source as step  # step_source reads the video through source_spec

    drop = world / "bucket/raw/web/drop-0009"
    drop.mkdir(parents=True)
    shutil.copy(demo_bucket / "raw/licensed/drop-0002/compilation_hardcuts.mp4", drop / "compilation_hardcuts.mp4")
    (drop / "_SUCCESS").write_bytes(b"")
    real = step.source_spec

    def unreachable(bucket, row, scratch=None):
        raise ConnectionResetError("connection reset by peer")  # injected: the bucket dropped the request

    monkeypatch.setattr(step, "source_spec", unreachable)
    summary, _ = _rerun(world)
    probe = _tables(world).read("video_probe", "web/drop-0009")
    assert list(probe.status) == ["quarantined"] and list(probe.failure) == ["transient"]
    assert "cannot read source" in probe.reason.iloc[0] and _extra(summary, "video_probe", "retry_pending") == 1
    monkeypatch.setattr(step, "source_spec", real)
    summary, plan = _rerun(world)
    probe = _tables(world).read("video_probe", "web/drop-0009")
    assert list(probe.status) == ["ok"] and list(probe.runs) == [2]
    assert _extra(summary, "video_probe", "rows_computed") == 1 == plan["video_probe"].rows_to_compute
    assert len(_tables(world).read("clips", "web/drop-0009")) > 0
