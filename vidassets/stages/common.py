"""Helpers shared by the stage modules (Dagster side): each asset's decorator arguments come from
its catalog entry, and every step reports its ``StepStats`` the same way."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
from dagster import AutomationCondition, FreshnessPolicy, MaterializeResult

from vidassets import catalog
from vidassets.config import Settings
from vidassets.curate.selection import selected_in_order
from vidassets.media.analysis import MODEL_DETECTORS
from vidassets.models.registry import ModelRegistry
from vidassets.partitions import source_shards
from vidassets.runtime.engine import Engine, engine_for
from vidassets.storage.rows import StepStats, records
from vidassets.storage.tables import partition_fingerprints
from vidassets.versions import Versions

EAGER = AutomationCondition.eager() | AutomationCondition.code_version_changed()


def asset_args(name: str, settings: Settings, versions: Versions, **extra: Any) -> dict[str, Any]:
    """``@asset`` keyword arguments of a catalog asset: group, partitioning, deps, code version (its
    full version), automation, Kubernetes op_tags and description."""
    entry = catalog.entry(name)
    args: dict[str, Any] = {
        "name": name, "group_name": entry.group, "deps": list(entry.deps), "code_version": versions.full(name),
        "op_tags": settings.compute.op_tags(name, entry.profile, entry.vault), "description": entry.description,
    }
    if entry.partitioned:
        args["partitions_def"] = source_shards
    if entry.kind != "on_request":
        # a drop's chain runs eagerly; the global assets run once per batch of finished drops
        # (global_stages_sensor) and the work on selected clips per changed drop (selected_clips_sensor):
        # never eagerly for every drop when a global asset updates, nor before selection has seen a drop
        eager = entry.partitioned and entry.deps and entry not in catalog.after_global()
        args["automation_condition"] = EAGER if eager else AutomationCondition.code_version_changed()
    args.update(extra)
    return args


def model_registry(settings: Settings) -> ModelRegistry:
    """The models of these settings, placed on ``models.device`` in ``models.compute_dtype``."""
    m = settings.models
    return ModelRegistry(m.device, m.compute_dtype, m.onnx_threads, m.torch_threads, m.batch_frames)


def step_engine(settings: Settings) -> Engine:
    """The engine ``execution.engine`` names for the per-video media steps (a Ray engine joins or
    starts its cluster once per process)."""
    ex = settings.execution
    if ex.engine == "local":
        return engine_for("local")
    r = ex.ray
    return _ray_engine(r.address, r.max_in_flight, r.num_cpus_per_task, r.task_retries, r.model_actors,
                       r.gpus_per_model_actor)


@functools.lru_cache(maxsize=4)
def _ray_engine(*args: Any) -> Engine:
    return engine_for("ray", *args)


def shot_model(settings: Settings) -> Callable[[np.ndarray], np.ndarray] | None:
    """TransNetV2 for the analysis pass when the configured detector reads it (built on first use)."""
    if settings.analysis.detector not in MODEL_DETECTORS:
        return None
    registry = model_registry(settings)
    return lambda frames: registry.get("transnetv2")(frames)


def freshness(hours: float) -> FreshnessPolicy:
    """A Dagster time-window freshness policy failing after ``hours``, warning at half."""
    return FreshnessPolicy.time_window(fail_window=timedelta(hours=hours), warn_window=timedelta(hours=hours / 2))


def result(stats: StepStats, rows: list[dict] | pd.DataFrame, version: str, selected: list[dict] | None = None,
           **extra: Any) -> MaterializeResult:
    """The materialization metadata every row-producing step reports. Steps on selected clips pass
    ``selected``: rows they keep for clips no longer selected (a clip that flipped to reject keeps
    its derived rows) are counted as ``rows_not_current``; no snapshot takes them."""
    if selected is not None:
        chosen = {r["clip_id"] for r in selected}
        extra["rows_not_current"] = sum(r["clip_id"] not in chosen for r in records(rows))
    return MaterializeResult(metadata={**stats.metadata(), "rows_out": len(rows), **extra, "producer_version": version})


def selected_or_keep(tables, table: str, key: str, version: str) -> tuple[list[dict], pd.DataFrame, MaterializeResult | None]:
    """(this partition's selected clips, the table's previous rows, None), or, when nothing here is
    selected (yet), keep the previous rows as they are and return the result to report."""
    selected = selected_in_order(tables.read_or_empty("selection"), key)
    if selected:
        return selected, tables.previous(table, key), None
    previous = tables.read_or_empty(table, key)
    rows = records(previous)
    tables.write(table, key, rows)
    return selected, previous, result(StepStats(), rows, version, selected=selected)


class GlobalInputs:
    """What a global asset read last time (its full version and the identity of every input table
    file): when nothing changed, its stored rows stand and the step computes nothing."""

    def __init__(self, store, name: str, full_version: str, inputs: list[tuple[Any, str]]):
        self.objects = store.objects()
        self.key = f"state/inputs/{name}.json"
        self.listed = {(tables.uri, table): tables.versions(table) for tables, table in inputs}
        listing = [(label, table, sorted(self.listed[tables.uri, table].items()))
                   for label, (tables, table) in enumerate(inputs)]
        self.digest = hashlib.sha256(json.dumps([full_version, listing]).encode()).hexdigest()

    def fingerprints(self, tables, names: tuple[str, ...], over: str | None = None) -> dict[str, str]:
        """``partition_fingerprints`` of input tables from the listing this made (no second listing)."""
        return partition_fingerprints(tables, names, over, listed={n: self.listed[tables.uri, n] for n in names})

    def unchanged(self, output: Any, table: str) -> bool:
        return (output.exists(table) and self.objects.exists(self.key)
                and self.objects.get_bytes(self.key).decode() == self.digest)

    def remember(self) -> None:
        self.objects.put_bytes(self.key, self.digest.encode())


def kept(tables, table: str, version: str) -> MaterializeResult:
    """A global asset whose inputs did not change: its stored rows stand."""
    rows = tables.read(table)
    return result(StepStats(rows_in=len(rows), reused=len(rows)), rows, version, inputs_unchanged=True)
