"""clip_scores for one partition: every score of every clip, from saved signals, the packet index
and saved context frames (no decode). One row per (clip, score) with value, evidence, status and
the score's own producer version; rows whose version is unchanged are reused as they are.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import ScoreSettings
from vidassets.curate import formulas
from vidassets.media.drop_steps import read_parquet_blob
from vidassets.media.image import is_image
from vidassets.models.registry import ModelRegistry
from vidassets.runtime.engine import Engine, LocalEngine, groups
from vidassets.runtime.step import Step, count_remote
from vidassets.storage.blobs import load_images
from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import FINAL, TRANSIENT, RowVersion, StepStats, records

AESTHETIC_HEADS = {"aesthetic_laion": "laion", "aesthetic_v2_5": "v2.5"}
"""``scores.quality_model`` -> the head family ``models.aesthetic`` loads."""
MODEL_VERSIONS = {"text": "text-area-v1", "quality": "quality-v1", "aesthetic": "aesthetic-v2", "nsfw": "nsfw-v1",
                  "faces": "faces-v1"}
"""Producer version of each model score's formula over its model outputs (the model's own version is
added by ``vidassets.versions``)."""

FORMULA_SCORES = ("optical", "motion", "static", "bitrate")
CASCADE_TIERS = (FORMULA_SCORES, ("text", "quality"), ("nsfw", "faces"))
"""The cheap-first order: a score is computed only for clips that pass the recipe's rules on the
scores of earlier tiers (formulas from saved signals; then the cheap models, text detection and
BRISQUE; then the costly ones, NSFW on every context frame and the face detector: ~70% of the model
time, bench/scores.py)."""
MODEL_SCORES = tuple(name for tier in CASCADE_TIERS[1:] for name in tier)
SCORE_NAMES = FORMULA_SCORES + MODEL_SCORES
TIER = {name: i for i, names in enumerate(CASCADE_TIERS) for name in names}
NOT_FOR_IMAGES = {"motion": "a still image has no motion", "static": "a still image has no motion",
                  "bitrate": "a still image has no bitrate (its compression is not a video codec's)"}
"""Scores that do not apply to a 1-frame sample: an image gets a ``not_applicable`` row for each
(selection rules on them pass it by); every other score reads its one context frame."""


def model_kinds(sc: ScoreSettings) -> dict[str, tuple]:
    """Registry kind and arguments of the model behind each model score."""
    quality = ("brisque",) if sc.quality_model == "brisque" else \
        ("aesthetic", AESTHETIC_HEADS[sc.quality_model], sc.aesthetic_head, sc.aesthetic_tower)
    return {"text": ("ppocrv4-det", sc.text_limit_side, sc.text_min_score), "quality": quality,
            "nsfw": ("open_nsfw",), "faces": ("nudenet-faces", sc.face_min_score)}


def _models(sc: ScoreSettings, registry: ModelRegistry) -> dict[str, Callable]:
    return {name: functools.partial(registry.get, *kind) for name, kind in model_kinds(sc).items()}


Gate = tuple[str, float | None, float | None]
"""A formula gate of the recipe: (score, min, max)."""


def gate_name(gate: Gate) -> str:
    score, low, high = gate
    return f"{score}{f'>={low:g}' if low is not None else ''}{f'<={high:g}' if high is not None else ''}"


def cascade_failure(gates: list[Gate], values: dict[str, float | None], tier: int = len(CASCADE_TIERS)) -> str | None:
    """The first gate on a score of a tier before ``tier`` that a clip fails (a missing value passes:
    a score is never skipped on one that could not be computed), or None."""
    for gate in gates:
        score, low, high = gate
        if TIER[score] >= tier:
            continue
        value = values.get(score)
        if value is not None and ((low is not None and value < low) or (high is not None and value > high)):
            return gate_name(gate)
    return None


def cascade_gates(sc: ScoreSettings, score_rules) -> list[Gate]:
    """The recipe's rules on scores that some later tier waits for, when the cascade is on (else
    none: every model runs)."""
    if not sc.cascade:
        return []
    return [(r.score, r.min, r.max) for r in score_rules if TIER[r.score] < len(CASCADE_TIERS) - 1]


def gates_digest(gates: list[Gate]) -> str:
    return ",".join(gate_name(g) for g in gates) or "none"


def skipped_under_other_gates(row: dict | None, gates: str) -> bool:
    """A stored row the cascade skipped under gates other than ``gates`` (a ``gates_digest``): it is
    decided again (skipped again, or its model runs)."""
    return row is not None and row.get("status") == "skipped" and json.loads(row["evidence"] or "{}").get("gates") != gates


def score_partition(
    objects: ObjectStore,
    clips: pd.DataFrame,
    analysis: pd.DataFrame,
    frame_index: pd.DataFrame,
    probe: pd.DataFrame,
    context_frames: pd.DataFrame,
    previous: pd.DataFrame,
    versions: dict[str, RowVersion],
    settings: ScoreSettings,
    max_runs: int,
    registry: ModelRegistry,
    gates: list[Gate] | None = None,
    engine: Engine | None = None,
) -> tuple[list[dict], StepStats]:
    """Every score of every clip; a stored (clip, score) row is reused while its score's version and
    inputs are unchanged. A score that cannot be computed is a row with ``status`` error (transient:
    retried) or no_frames (final).

    Cheap first (``gates``: the recipe's rules on scores of all but the last of ``CASCADE_TIERS``,
    when ``scores.cascade`` is on): tier by tier, a clip failing a gate on an earlier tier's score
    gets the scores of the later tiers as rows with status ``skipped`` (the gate in ``reason``) and
    no model call. Skipped rows are decided again whenever the gates change, so a recipe that admits
    such a clip computes exactly its missing scores."""
    gates = gates or []
    cascade = gates_digest(gates)
    step = Step(previous, lambda r: (r["clip_id"], r["score"]), max_runs, engine=engine)
    stats = step.stats
    stats.rows_in = len(clips)
    analysis_by_asset = {r["asset_id"]: r for r in records(analysis)}
    index_by_asset = {r["asset_id"]: r for r in records(frame_index)}
    probe_by_asset = {r["asset_id"]: r for r in records(probe)}
    frames_by_asset = {a: g.sort_values("frame_index") for a, g in context_frames.groupby("asset_id")} if len(context_frames) else {}
    rows: list[dict] = []
    signals_cache: dict[str, pd.DataFrame] = {}
    packets_cache: dict[str, pd.DataFrame] = {}
    by_score: dict[str, int] = {}
    kills = skipped = 0
    jobs: list[tuple[dict, list[str], list[str], dict]] = []  # clip, model scores to compute, its frames, values known
    for clip in records(clips):
        keys = {name: (clip["clip_id"], name) for name in SCORE_NAMES}
        again = {n for n in SCORE_NAMES if skipped_under_other_gates(step.prior(keys[n]), cascade)}  # decide again
        due = again | set(step.due((keys[n], versions[n], n) for n in SCORE_NAMES if n not in again))
        todo = [n for n in SCORE_NAMES if n in due]
        values: dict[str, float | None] = {n: step.prior(keys[n])["value"] if step.prior(keys[n])["status"] == "ok"
                                           else None for n in SCORE_NAMES if n not in due}
        if not todo:
            continue
        asset = clip["asset_id"]
        if is_image(clip):
            for name in [n for n in todo if n in NOT_FOR_IMAGES]:
                row = _row(clip, name, None, {"media_type": "image"}, "not_applicable", NOT_FOR_IMAGES[name])
                rows.append(step.stamp((clip["clip_id"], name), row, versions[name]))
                by_score[name] = by_score.get(name, 0) + 1
            todo = [n for n in todo if n not in NOT_FOR_IMAGES]
        for name in [n for n in todo if n in FORMULA_SCORES]:
            row, failure = _formula_row(name, objects, clip, analysis_by_asset[asset], index_by_asset.get(asset),
                                        probe_by_asset[asset], settings, signals_cache, packets_cache)
            values[name] = row["value"] if row["status"] == "ok" else None
            rows.append(step.stamp((clip["clip_id"], name), row, versions[name], failure))
            by_score[name] = by_score.get(name, 0) + 1
        model_todo = []
        for name in [n for n in todo if n in MODEL_SCORES]:
            gate = cascade_failure(gates, values, TIER[name])  # on what is known now; later tiers wait for the models
            if gate is None:
                model_todo.append(name)
            else:
                rows.append(step.stamp((clip["clip_id"], name), _skipped(clip, name, cascade, gate), versions[name]))
                by_score[name] = by_score.get(name, 0) + 1
                skipped += 1
        if model_todo:
            frames = frames_by_asset.get(asset)
            inside = [] if frames is None else list(
                frames[(frames.frame_index >= clip["first_frame"]) & (frames.frame_index <= clip["last_frame"])].blob_key)
            jobs.append((clip, model_todo, inside, values))
    # the model scores on the engine (model actors on Ray; here one group after the other), clips
    # grouped so that one model run holds frames of several clips
    engine = engine or LocalEngine()
    todo = groups(jobs, lambda job: len(job[2]), registry.batch_frames)
    outcomes = engine.map(_ModelScores(objects, settings, registry, gates), todo, models=True)
    count_remote(stats, engine, len(jobs))
    for group, outcome in zip(todo, outcomes, strict=True):
        scored = outcome.row["scores"] if outcome.row is not None else [
            {name: (_row(clip, name, None, {}, "error", outcome.reason), TRANSIENT) for name in names}
            for clip, names, _, _ in group]
        for (clip, _, _, _), clip_scores in zip(group, scored, strict=True):
            for name, (row, failure) in clip_scores.items():
                rows.append(step.stamp((clip["clip_id"], name), row, versions[name], failure))
                by_score[name] = by_score.get(name, 0) + 1
                kills += int(row["kill"])
                skipped += int(row["status"] == "skipped")
        if outcome.row is not None:
            stats.model_calls += outcome.row["calls"]
            stats.add("model_batches", outcome.row["batches"])
    rows = step.kept + rows
    order = {clip_id: i for i, clip_id in enumerate(clips.clip_id)} if len(clips) else {}
    rows.sort(key=lambda r: (order.get(r["clip_id"], len(order)), SCORE_NAMES.index(r["score"])))  # same rows, same file
    stats.extra.update(safety_kills=kills, computed_by_score=by_score, skipped_by_cascade=skipped,
                       score_errors=sum(r["status"] not in ("ok", "skipped", "not_applicable") for r in rows))
    for row in rows:
        stats.count(row["status"])
    return rows, stats


class _ModelScores:
    """The model scores of a group of clips from their saved context frames (picklable: it may run
    on a Ray model actor, whose process keeps the models it built). Each model runs once over the
    frames of every clip in the group that needs it (its batches span clips); when that run fails,
    clip by clip, so that only the clip that fails gets an ``error`` row. Models run tier by tier
    (``CASCADE_TIERS``): a clip failing a gate on an earlier tier's score gets ``skipped`` rows.
    Returns ``scores`` (per clip: name -> (row, failure class)), the frames the models ran on
    (``calls``) and their runs (``batches``)."""

    def __init__(self, objects: ObjectStore, settings: ScoreSettings, registry: ModelRegistry, gates: list[Gate]):
        self.objects, self.settings, self.registry, self.gates = objects, settings, registry, gates

    def __call__(self, group: list[tuple[dict, list[str], list[str], dict]]) -> dict:
        scores: list[dict[str, tuple[dict, str | None]]] = [{} for _ in group]
        values = [dict(known) for _, _, _, known in group]
        digest = gates_digest(self.gates)
        contexts: list[list[np.ndarray]] = []
        for (clip, names, frame_keys, _), clip_scores in zip(group, scores, strict=True):
            try:
                contexts.append(load_images(self.objects, frame_keys))
            except Exception as exc:  # noqa: BLE001 - a frame that cannot be read fails its own clip, retried
                contexts.append([])
                reason = f"cannot read context frames: {exc.__class__.__name__}: {exc}"[:300]
                clip_scores.update({name: (_row(clip, name, None, {}, "error", reason), TRANSIENT) for name in names})
        models = _models(self.settings, self.registry)
        calls = batches = 0
        for name in MODEL_SCORES:  # tier by tier
            wanted = [i for i, (_, names, _, _) in enumerate(group) if name in names and name not in scores[i]]
            for i in list(wanted):
                gate = cascade_failure(self.gates, values[i], TIER[name])
                if gate is not None:
                    scores[i][name] = _skipped(group[i][0], name, digest, gate), None
                    wanted.remove(i)
            for i in wanted:
                if not contexts[i]:
                    scores[i][name] = _row(group[i][0], name, None, {"frames": 0}, "no_frames",
                                           "no context frames in this clip"), FINAL
            live = [i for i in wanted if contexts[i]]
            if not live:
                continue
            inputs = [model_frames(name, contexts[i], self.settings) for i in live]
            try:
                model = models[name]()
                before, runs_before = model.calls, model.batches
                outputs = _per_clip(model, inputs)
                calls, batches = calls + model.calls - before, batches + model.batches - runs_before
            except Exception as exc:  # noqa: BLE001 - a failed score is a row, not a crash
                outputs = [exc] * len(live)
            for i, frames, out in zip(live, inputs, outputs, strict=True):
                clip = group[i][0]
                try:
                    if isinstance(out, Exception):
                        raise out
                    value, evidence, kill = _model_score(name, out, len(frames), self.settings)
                    scores[i][name] = _row(clip, name, value, evidence, "ok", None, kill), None
                    values[i][name] = scores[i][name][0]["value"]
                except Exception as exc:  # noqa: BLE001 - one clip's failed score is a row, not a crash
                    scores[i][name] = _row(clip, name, None, {}, "error", f"{exc.__class__.__name__}: {exc}"[:300]), TRANSIENT
        return {"scores": scores, "calls": calls, "batches": batches}


def _per_clip(model: Callable, inputs: list[list[np.ndarray]]) -> list:
    """Per-frame outputs of ``model`` for each clip's frames, from one run over all of them; when that
    run fails, one run per clip (a clip whose run fails gets its exception instead of outputs)."""
    try:
        flat = list(model([f for frames in inputs for f in frames]))
    except Exception:  # noqa: BLE001 - find the clip that fails
        out: list = []
        for frames in inputs:
            try:
                out.append(list(model(frames)))
            except Exception as exc:  # noqa: BLE001
                out.append(exc)
        return out
    bounds = np.cumsum([0] + [len(frames) for frames in inputs])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _formula_row(name: str, objects: ObjectStore, clip: dict, analysis: dict, index: dict | None, probe: dict,
                 sc: ScoreSettings, signals_cache: dict, packets_cache: dict) -> tuple[dict, str | None]:
    try:
        value, evidence = _formula(name, objects, clip, analysis, index, probe, sc, signals_cache, packets_cache)
        return _row(clip, name, value, evidence, "ok", None), None
    except Exception as exc:  # noqa: BLE001 - one clip's failed score is a row, not a crash
        return _row(clip, name, None, {}, "error", f"{exc.__class__.__name__}: {exc}"[:300]), TRANSIENT


def model_frames(name: str, frames: list[np.ndarray], sc: ScoreSettings) -> list[np.ndarray]:
    """The context frames a model score reads: at most ``scores.model_frames``, evenly spaced, except
    NSFW (a safety kill reads every frame)."""
    cap = sc.model_frames
    if name == "nsfw" or not cap or len(frames) <= cap:
        return frames
    return [frames[i] for i in np.linspace(0, len(frames) - 1, cap).round().astype(int)]


def _skipped(clip: dict, name: str, gates: str, failed: str) -> dict:
    return _row(clip, name, None, {"gates": gates, "failed": failed}, "skipped", f"cascade: {failed} failed, model not run")


def _row(clip: dict, name: str, value: float | None, evidence: dict, status: str, reason: str | None,
         kill: bool = False) -> dict:
    return {"clip_id": clip["clip_id"], "asset_id": clip["asset_id"], "source_shard": clip["source_shard"],
            "score": name, "value": None if value is None else round(float(value), 6), "kill": bool(kill),
            "status": status, "reason": reason, "evidence": json.dumps(evidence, sort_keys=True)}


def _formula(name: str, objects: ObjectStore, clip: dict, analysis: dict, index: dict | None, probe: dict,
             sc: ScoreSettings, signals_cache: dict, packets_cache: dict) -> tuple[float, dict]:
    if name == "bitrate":
        if not index or not index.get("index_blob"):
            raise ValueError("no packet index for this video")
        if index["index_blob"] not in packets_cache:
            packets_cache[index["index_blob"]] = read_parquet_blob(objects, index["index_blob"])
        packets = packets_cache[index["index_blob"]]
        inside = packets[(packets.pts >= clip["first_pts"]) & (packets.pts <= clip["last_pts"])]
        return formulas.bitrate_per_pixel(inside["size"].to_numpy(), int(probe["width"]), int(probe["height"]),
                                          float(clip["duration_s"]), str(probe["codec"]))
    key = analysis["signals_blob"]
    if key not in signals_cache:
        signals_cache[key] = read_parquet_blob(objects, key)
    s = signals_cache[key].iloc[clip["first_frame"] : clip["last_frame"] + 1]
    if name == "optical":
        return formulas.optical(s.luma_median.to_numpy(), s.dark_share.to_numpy(), s.bright_share.to_numpy(),
                                s.luma_p5.to_numpy(), s.luma_p95.to_numpy())
    times, grid_motion, grid_scene = formulas.grid_rows(s)
    if name == "motion":
        return formulas.motion(grid_motion, grid_scene, sc.motion_cut_threshold, sc.motion_cut_ratio)
    if name == "static":
        return formulas.static(times, grid_motion, sc.still_motion, sc.jump_motion)
    raise KeyError(name)


def _model_score(name: str, outputs: list, frames: int, sc: ScoreSettings) -> tuple[float, dict, bool]:
    """A model score, its evidence and whether it kills the clip, from the model's per-frame outputs."""
    if name == "text":
        shares = np.asarray(outputs)
        q95 = formulas.quantile(shares, 95)
        return 1.0 - q95, {"text_share_q95": round(q95, 6), "text_share_max": round(float(shares.max()), 6),
                           "frames": frames}, False
    if name == "quality" and sc.quality_model in AESTHETIC_HEADS:
        per_frame = np.asarray(outputs)  # already in [0, 1]
        return formulas.quantile(per_frame, 20), {"aesthetic_median": round(float(np.median(per_frame)), 4),
                                                  "frames": frames, "model": sc.quality_model}, False
    if name == "quality":
        raw = np.asarray(outputs)
        per_frame = formulas.decay(raw, sc.quality_best, sc.quality_worst)
        return formulas.quantile(per_frame, 20), {"brisque_median": round(float(np.median(raw)), 4),
                                                  "brisque_max": round(float(raw.max()), 4), "frames": frames}, False
    if name == "nsfw":
        probs = np.asarray(outputs)
        worst = float(probs.max())
        return 1.0 - formulas.quantile(probs, 95), {"nsfw_max": round(worst, 6), "frames": frames,
                                                    "kill_threshold": sc.nsfw_kill_threshold}, worst >= sc.nsfw_kill_threshold
    if name == "faces":
        counts = [c for c, _ in outputs]
        largest = max((share for _, share in outputs), default=0.0)
        return largest, {"max_faces": int(max(counts, default=0)), "frames_with_faces": int(sum(c > 0 for c in counts)),
                         "largest_face_share": round(largest, 6), "frames": frames}, False
    raise KeyError(name)


def rule_kill_rates(rows: Sequence[Mapping[str, Any]], rules: Sequence[Any]) -> dict[str, tuple[float, int]]:
    """rule name -> (share of the clips its score was computed for that the rule rejects, how many
    such clips). Only ``ok`` rows count: a cascade skip (the model not run because a cheaper rule
    already rejected the clip), an error or a not-applicable score is no kill of this rule."""
    rates = {}
    for rule in rules:
        values = [r["value"] for r in rows if r["score"] == rule.score and r["status"] == "ok"]
        if values:
            rates[rule.name] = (sum(not rule.check(v) for v in values) / len(values), len(values))
    return rates
