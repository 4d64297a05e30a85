"""Checks that tell the truth: a rule's kill rate counts only the clips its score was computed for."""

from __future__ import annotations

import math

from vidassets.curate.scores import rule_kill_rates
from vidassets.curate.selection import ScoreRule


def _row(score: str, value: float | None, status: str) -> dict:
    return {"score": score, "value": math.nan if value is None else value, "status": status}


def test_cascade_skips_errors_and_not_applicable_scores_are_no_kills() -> None:
    quality, nsfw = ScoreRule(score="quality", min=0.5), ScoreRule(score="nsfw", max=0.2)
    rows = [_row("quality", 0.9, "ok"), _row("quality", 0.2, "ok"),
            _row("quality", None, "skipped"), _row("quality", None, "skipped"),  # a cheaper rule rejected them
            _row("quality", None, "error"), _row("quality", None, "not_applicable"),
            _row("nsfw", 0.1, "ok")]
    rates = rule_kill_rates(rows, [quality, nsfw])
    assert rates == {"quality>=0.5": (0.5, 2), "nsfw<=0.2": (0.0, 1)}
    assert rule_kill_rates([_row("quality", None, "skipped")], [quality]) == {}  # nothing computed: no rate


def test_schema_pass_rates_judge_only_what_applies() -> None:
    import pandas as pd

    from vidassets.derive.annotations import schema_pass_rates

    rows = pd.DataFrame({"kind": ["camera"] * 4 + ["captions"] * 4,
                         "status": ["ok", "ok", "ok", "not_applicable",  # a still image has no camera motion
                                    "ok", "partial", "invalid", "error"]})  # error: transport, retried
    assert schema_pass_rates(rows) == {"camera": 1.0, "captions": round(2 / 3, 4)}
    assert schema_pass_rates(rows.iloc[0:0]) == {}
