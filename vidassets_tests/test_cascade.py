"""Cheap-first scoring through Dagster on real footage: formula scores first, models only for clips
that pass the recipe's formula gates, and the costly models (NSFW, faces) only for clips that also
pass its rules on the cheap ones (text, quality); a recipe that admits more clips computes exactly
their missing scores (and plan-change says how many); a tighter recipe makes no model call."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from vidassets.change_plan import plan_change
from vidassets.curate.scores import FORMULA_SCORES, MODEL_SCORES
from vidassets.curate.selection import load_recipe
from vidassets.storage import TableStore, open_object_store
from vidassets_tests.conftest import CURATE_STAGES, graph_settings, run_graph, small_bucket


def _recipe(tmp: Path, name: str, rules: list[dict]) -> str:
    recipe = load_recipe().model_dump()
    recipe["score_rules"] = rules
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(recipe))
    return str(path)


def test_cascade_runs_models_only_for_clips_past_the_formula_gates(demo_bucket: Path, tmp_path: Path) -> None:
    bucket = small_bucket(demo_bucket, tmp_path)
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    # 1. a recipe whose formula gate no real clip passes: every model score is skipped, no model runs
    shut = _recipe(tmp_path, "shut", [{"score": "optical", "max": 0.01}, {"score": "quality", "min": 0.1}])
    first = run_graph(graph_settings(bucket, tmp_path, **{"selection.recipe": shut}), tmp_path, select=CURATE_STAGES)
    scores = tables.read_all("clip_scores")
    clips = scores.clip_id.nunique()
    assert first.stages["clip_scores"].extra.get("model_calls", 0) == 0
    skipped = scores[scores.score.isin(MODEL_SCORES)]
    assert (skipped.status == "skipped").all() and len(skipped) == 4 * clips
    assert skipped.reason.str.contains("cascade: optical<=0.01 failed").all()
    assert (scores[scores.score.isin(FORMULA_SCORES)].status == "ok").all()
    selection = tables.read("selection")
    assert (selection.first_failed_rule == "optical<=0.01").all()
    assert all(json.loads(o)["quality>=0.1"].startswith("skipped (optical<=0.01") for o in selection.rule_outcomes)

    # 2. a recipe admitting the clips with motion at or above the median: exactly their model scores run
    values = scores[scores.score == "motion"].set_index("clip_id").value
    threshold = float(values.median())
    admitted = set(values[values >= threshold].index)
    assert 0 < len(admitted) < clips
    half = _recipe(tmp_path, "half", [{"score": "motion", "min": threshold}, {"score": "quality", "min": 0.0}])
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": half})
    plan = {p.asset: p for p in plan_change(tables, settings)}
    assert f"model scores for {len(admitted)} clip(s)" in plan["clip_scores"].reason
    second = run_graph(settings, tmp_path, select=CURATE_STAGES)
    stage = second.stages["clip_scores"]
    assert stage.extra["model_calls"] > 0
    assert stage.extra["rows_computed"] == plan["clip_scores"].rows_to_compute == 4 * clips  # re-decided skipped rows
    scores = tables.read_all("clip_scores")
    model = scores[scores.score.isin(MODEL_SCORES)]
    ran = set(model[model.status == "ok"].clip_id)
    assert ran == admitted
    assert set(model[model.status == "skipped"].clip_id) == set(values.index) - admitted
    selection = tables.read("selection").set_index("clip_id")
    assert (selection.loc[sorted(admitted), "first_failed_rule"].fillna("") != "skipped:quality").all()
    assert (selection.decision == "pass").sum() >= 1

    # 3. a tighter rule on a cheap model's score (a gate of the costly models): the skipped rows are
    # decided again (skipped again), every other row is kept, no model call
    model_only = _recipe(tmp_path, "model_only", [{"score": "motion", "min": threshold}, {"score": "quality", "min": 0.05}])
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": model_only})
    redecided = 4 * (clips - len(admitted))
    plan = {p.asset: p for p in plan_change(tables, settings)}["clip_scores"]
    assert plan.rows_to_compute == redecided and "now admit" not in plan.reason
    third = run_graph(settings, tmp_path, select=CURATE_STAGES)
    assert third.stages["clip_scores"].extra.get("model_calls", 0) == 0
    assert third.stages["clip_scores"].extra.get("rows_computed", 0) == redecided
    # ... and a rule on a score no other waits for (faces: the last tier) leaves clip_scores as it is
    last_tier = _recipe(tmp_path, "last_tier", [{"score": "motion", "min": threshold}, {"score": "quality", "min": 0.05},
                                                {"score": "faces", "max": 0.9}])
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": last_tier})
    assert {p.asset: p for p in plan_change(tables, settings)}["clip_scores"].rows_to_compute == 0

    # 4. cascade off: the skipped clips get their model scores; admitted clips keep theirs
    kept = scores[scores.status == "ok"].set_index(["clip_id", "score"]).value
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": model_only, "scores.cascade": False})
    fourth = run_graph(settings, tmp_path, select=CURATE_STAGES)
    assert fourth.stages["clip_scores"].extra["rows_computed"] == 4 * (clips - len(admitted))
    scores = tables.read_all("clip_scores")
    assert (scores.status == "ok").all()
    pd.testing.assert_series_equal(scores.set_index(["clip_id", "score"]).value.loc[kept.index], kept)


def test_costly_models_run_only_for_clips_past_the_cheap_models_gates(demo_bucket: Path, tmp_path: Path) -> None:
    bucket = small_bucket(demo_bucket, tmp_path)
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    # 1. a quality rule no real clip passes: text and quality run on every clip, NSFW and faces on none
    shut = _recipe(tmp_path, "shut", [{"score": "quality", "min": 1.0}])
    first = run_graph(graph_settings(bucket, tmp_path, **{"selection.recipe": shut}), tmp_path, select=CURATE_STAGES)
    scores = tables.read_all("clip_scores")
    clips = scores.clip_id.nunique()
    cheap, costly = scores[scores.score.isin(["text", "quality"])], scores[scores.score.isin(["nsfw", "faces"])]
    assert (cheap.status == "ok").all() and len(cheap) == 2 * clips
    assert (costly.status == "skipped").all() and len(costly) == 2 * clips
    assert costly.reason.str.contains("cascade: quality>=1 failed").all()
    assert first.stages["clip_scores"].extra["skipped"] == 2 * clips and first.stages["clip_scores"].extra["model_calls"] > 0
    assert (tables.read("selection").first_failed_rule == "quality>=1").all()

    # 2. a rule admitting the clips of quality at or above the median: NSFW and faces run for exactly those
    quality = cheap[cheap.score == "quality"].set_index("clip_id").value
    threshold = float(quality.median())
    admitted = set(quality[quality >= threshold].index)
    assert 0 < len(admitted) < clips
    half = _recipe(tmp_path, "half", [{"score": "quality", "min": threshold}])
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": half})
    plan = {p.asset: p for p in plan_change(tables, settings)}["clip_scores"]
    assert f"model scores for {len(admitted)} clip(s)" in plan.reason and plan.rows_to_compute == 2 * clips
    second = run_graph(settings, tmp_path, select=CURATE_STAGES)
    assert second.stages["clip_scores"].extra["model_calls"] > 0
    scores = tables.read_all("clip_scores")
    costly = scores[scores.score.isin(["nsfw", "faces"])]
    assert set(costly[costly.status == "ok"].clip_id) == admitted
    assert set(costly[costly.status == "skipped"].clip_id) == set(quality.index) - admitted
    # the cheap models' rows were kept as they were
    pd.testing.assert_frame_equal(scores[scores.score.isin(["text", "quality"])].reset_index(drop=True),
                                  cheap.reset_index(drop=True))
