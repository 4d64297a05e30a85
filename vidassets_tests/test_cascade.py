"""Cheap-first scoring through Dagster on real footage: formula scores first, models only for clips
that pass the recipe's formula gates; a recipe that admits more clips computes exactly their model
scores (and plan-change says how many); a recipe change on model scores makes no model call."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from vidassets.curate.scores import FORMULA_SCORES, MODEL_SCORES
from vidassets.curate.selection import load_recipe
from vidassets.plan import plan_change
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

    # 3. a recipe change on a model score only: clip_scores keeps every row, no model call
    model_only = _recipe(tmp_path, "model_only", [{"score": "motion", "min": threshold}, {"score": "quality", "min": 0.05}])
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": model_only})
    assert {p.asset: p for p in plan_change(tables, settings)}["clip_scores"].rows_to_compute == 0
    third = run_graph(settings, tmp_path, select=CURATE_STAGES)
    assert third.stages["clip_scores"].extra.get("model_calls", 0) == 0
    assert third.stages["clip_scores"].extra.get("rows_computed", 0) == 0

    # 4. cascade off: the skipped clips get their model scores; admitted clips keep theirs
    kept = scores[scores.status == "ok"].set_index(["clip_id", "score"]).value
    settings = graph_settings(bucket, tmp_path, **{"selection.recipe": model_only, "scores.cascade": False})
    fourth = run_graph(settings, tmp_path, select=CURATE_STAGES)
    assert fourth.stages["clip_scores"].extra["rows_computed"] == 4 * (clips - len(admitted))
    scores = tables.read_all("clip_scores")
    assert (scores.status == "ok").all()
    pd.testing.assert_series_equal(scores.set_index(["clip_id", "score"]).value.loc[kept.index], kept)
