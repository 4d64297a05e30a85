"""The training-run registry (no Dagster): which run trained on which snapshot, plan and steps.

A run is registered once (``vidassets run register``) with the plan file it follows
(``plans/v<N>/<digest>.json``, written by ``train_plan``: snapshot, seed, batch, world size, total
steps) and the steps it trains; its record is one object under ``runs/`` (create-if-absent: a run id
is never reused). From the records and the plans, ``training_runs`` lists the runs,
``runs_of_clip`` says which runs see a sample and at which steps (``vidassets lineage sample``), and
``runs_meeting`` which runs in flight will still meet samples a takedown just took down: their
loaders skip them (``PlanDataset(takedowns=...)``, counted), so no run needs a restart.

Finding a sample's steps replays the plan over the run's steps (``TrainPlan.step`` per step): at
10^5 steps a few seconds per run; a per-snapshot inverse index is the next step past that.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from vidassets.config import TrainSettings
from vidassets.storage.objects import ObjectStore

RUNS = "runs"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class TrainingRun:
    run_id: str
    snapshot: int
    plan: str
    """The plan file's key (``plans/v<N>/<digest>.json``)."""
    first_step: int
    last_step: int
    """Inclusive: the steps this run trains."""
    seed: int
    global_batch: int
    world_size: int
    registered: str = ""
    note: str = ""


def plan_files(objects: ObjectStore, snapshot: int) -> list[str]:
    return sorted(i.key for i in objects.list(f"plans/v{snapshot}/") if i.key.endswith(".json"))


def register_run(objects: ObjectStore, run_id: str, snapshot: int, plan: str | None = None,
                 steps: tuple[int, int] | None = None, note: str = "") -> TrainingRun:
    """Record a run following ``plan`` (default: the snapshot's only plan file) over ``steps``
    (first, last inclusive; default: the plan's whole ``total_steps``). A ValueError names what is
    wrong: a bad or taken run id, a plan that does not exist or is of another snapshot, steps
    outside the plan."""
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r}: letters, digits, '.', '_' and '-' only (at most 128)")
    if plan is None:
        found = plan_files(objects, snapshot)
        if len(found) != 1:
            raise ValueError(f"snapshot v{snapshot} has {len(found)} plan files ({found or 'materialize train_plan'}): "
                             "name one with --plan")
        plan = found[0]
    if not objects.exists(plan):
        raise ValueError(f"no plan file {plan!r}")
    spec = json.loads(objects.get_bytes(plan))
    if int(spec["snapshot"]) != snapshot:
        raise ValueError(f"plan {plan} is of snapshot v{spec['snapshot']}, not v{snapshot}")
    first, last = steps if steps is not None else (0, int(spec["total_steps"]) - 1)
    if not 0 <= first <= last < int(spec["total_steps"]):
        raise ValueError(f"steps {first}:{last} lie outside the plan's 0:{int(spec['total_steps']) - 1}")
    run = TrainingRun(run_id, snapshot, plan, first, last, int(spec["seed"]), int(spec["global_batch"]),
                      int(spec["world_size"]), datetime.now(UTC).isoformat(timespec="seconds"), note)
    if not objects.put_if_absent(f"{RUNS}/{run_id}.json", json.dumps(asdict(run), indent=1).encode()):
        raise ValueError(f"run id {run_id!r} is already registered")
    return run


def read_runs(objects: ObjectStore) -> list[TrainingRun]:
    return [TrainingRun(**json.loads(objects.get_bytes(i.key)))
            for i in sorted(objects.list(f"{RUNS}/"), key=lambda i: i.key) if i.key.endswith(".json")]


def training_runs(objects: ObjectStore) -> pd.DataFrame:
    """The ``training_runs`` table: one row per registered run."""
    columns = list(TrainingRun.__dataclass_fields__)
    return pd.DataFrame([asdict(r) for r in read_runs(objects)], columns=columns)


def _plan(objects: ObjectStore, run: TrainingRun, plans: dict) -> Any:
    from vidassets.train.build import build_plan

    key = (run.snapshot, run.seed, run.global_batch)
    if key not in plans:
        settings = TrainSettings(seed=run.seed, global_batch=run.global_batch, world_size=run.world_size)
        plans[key] = build_plan(objects, run.snapshot, settings)
    return plans[key]


def steps_of(objects: ObjectStore, run: TrainingRun, clip_ids: set[str], plans: dict | None = None,
             from_step: int | None = None) -> dict[str, list[int]]:
    """clip_id -> the steps of ``run`` (from ``from_step`` on) whose batch holds it."""
    plan = _plan(objects, run, plans if plans is not None else {})
    found: dict[str, list[int]] = {}
    for step in range(max(run.first_step, from_step or 0), run.last_step + 1):
        for clip in set(plan.step(step).clip_ids) & clip_ids:
            found.setdefault(clip, []).append(step)
    return found


def runs_of_clip(objects: ObjectStore, clip_id: str) -> list[dict[str, Any]]:
    """The runs whose steps hold ``clip_id``, with those steps."""
    out, plans = [], {}
    for run in read_runs(objects):
        steps = steps_of(objects, run, {clip_id}, plans).get(clip_id)
        if steps:
            out.append({"run_id": run.run_id, "snapshot": run.snapshot, "plan": run.plan, "steps": steps})
    return out


def runs_meeting(objects: ObjectStore, clip_ids: set[str]) -> list[dict[str, Any]]:
    """The registered runs that hold any of ``clip_ids`` in their steps: run, how many such samples,
    their first step. (A run past those steps has met them already: the registry cannot know where
    a run is; its loader skips what it has not met yet.)"""
    out, plans = [], {}
    for run in read_runs(objects):
        found = steps_of(objects, run, clip_ids, plans)
        if found:
            out.append({"run_id": run.run_id, "snapshot": run.snapshot, "samples": len(found),
                        "first_step": min(min(s) for s in found.values())})
    return out
