"""The incremental step runner every row-producing stage uses (no Dagster).

A step takes the items it should hold rows for, keeps the stored rows it may reuse (same producer
and input versions, not a transient failure with runs left; see ``storage.rows``), computes the
rest, and turns every failure into a row with a status, a reason and a failure class instead of an
exception. It owns the sandboxed worker and the scratch directory (both started only when some
item needs them) and counts what it did in one ``StepStats``.

Items to compute go through an engine (``runtime.engine``): one after the other here, or as Ray tasks.
A compute function therefore returns everything through its row: counters under ``_stats`` (added
to the step's stats) and outputs that are not row columns under ``_side`` (kept in ``Step.side`` by
key). On a Ray worker the step travels without its stored rows, log or stats: what the compute
function reaches there is the sandbox and scratch directory of that worker process.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

import pandas as pd

from vidassets.runtime.engine import Failure, LocalEngine, Outcome, groups
from vidassets.runtime.sandbox import Sandbox
from vidassets.storage.rows import FINAL, TRANSIENT, Reuse, RowVersion, StepStats

Item = TypeVar("Item")
__all__ = ["Failure", "Step"]
Log = Callable[[str], None]


class Step:
    """One step over keyed rows of one table partition."""

    def __init__(self, previous: pd.DataFrame | list[dict], key: Callable[[Mapping[str, Any]], Hashable],
                 max_runs: int, memory_mb: int = 4096, log: Log = lambda _: None, engine: Any = None,
                 isolation: str = "auto"):
        self.stats = StepStats()
        self.reuse = Reuse(previous, key, max_runs, self.stats)
        self.memory_mb = memory_mb
        self.isolation = isolation
        self.log = log
        self.engine = engine or LocalEngine()
        self.side: dict[Hashable, Any] = {}
        self.kept: list[dict[str, Any]] = []
        """Stored rows ``due`` found reusable, in the order asked."""
        self._sandbox: Sandbox | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None

    def __reduce__(self):  # what travels to a Ray worker: the sandbox's settings only
        return (_worker_step, (self.memory_mb, self.isolation))

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(self.memory_mb, self.isolation)
        return self._sandbox

    @property
    def scratch(self) -> str:
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="vidassets-")
        return self._scratch.name

    # ------------------------------------------------------------------ row by row
    # Stages whose items give several rows each (a clip's rungs, scores, annotation kinds, caption
    # levels) plan and batch their own work but keep, stamp and complete their rows here.

    def due(self, wanted: Iterable[tuple[Hashable, RowVersion, Any]]) -> list[Any]:
        """Of the rows wanted (key, version, what to compute it from), keep the reusable ones
        (``kept``) and return what the others are computed from, in order."""
        todo = []
        for key, version, payload in wanted:
            row = self.reuse.take(key, version)
            if row is None:
                todo.append(payload)
            else:
                self.kept.append(row)
        return todo

    def complete(self, new: list[dict[str, Any]], status: str = "status") -> list[dict[str, Any]]:
        """The step's rows: stored rows of keys it did not write (other versions kept side by side),
        the kept rows, then ``new``; the kept and new rows counted by ``status``."""
        for row in self.kept + new:
            self.stats.count(str(row.get(status, "ok")))
        return self.with_others(self.kept + new)

    def take(self, key: Hashable, version: RowVersion) -> dict[str, Any] | None:
        """The stored row of ``key`` when it may be reused (counted as reused), else None."""
        return self.reuse.take(key, version)

    def prior(self, key: Hashable) -> dict[str, Any] | None:
        """The stored row of ``key`` whatever its version (None: there is none)."""
        return self.reuse.prior(key)

    def stamp(self, key: Hashable, row: dict[str, Any], version: RowVersion, failure: str | None = None) -> dict[str, Any]:
        """A freshly computed row with its version columns set (counted as computed / failed)."""
        return self.reuse.stamp(key, row, version, failure)

    def with_others(self, written: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The step's rows: the stored rows of keys it did not write (other versions kept side by
        side), then ``written``."""
        return self.reuse.others(written) + written

    def run(self, items: Iterable[Item], key: Callable[[Item], Hashable], version: RowVersion | Callable[[Item], RowVersion],
            compute: Callable[[Item], dict[str, Any]], failed: Callable[[Item, Failure], dict[str, Any]],
            label: Callable[[Item], str] = str, models: bool = False) -> list[dict[str, Any]]:
        """One row per item, in item order: the stored row when reusable, else ``compute(item)`` (on
        the step's engine; ``models``: on its model actors); a ``Failure`` (or any exception, as a
        transient failure) becomes ``failed(item, failure)``."""
        items = list(items)
        keys, versions, rows = self._reusable(items, key, version)
        todo = [i for i, row in enumerate(rows) if row is None]
        count_remote(self.stats, self.engine, len(todo))
        outcomes = self.engine.map(compute, [items[i] for i in todo], label, self.log, models=models)
        for i, outcome in zip(todo, outcomes, strict=True):
            rows[i] = self._row(items[i], keys[i], versions[i], outcome, failed, label)
        return rows

    def run_grouped(self, items: Iterable[Item], key: Callable[[Item], Hashable],
                    version: RowVersion | Callable[[Item], RowVersion],
                    compute_group: Callable[[list[Item]], dict[str, Any]], failed: Callable[[Item, Failure], dict[str, Any]],
                    weight: Callable[[Item], int], limit: int, label: Callable[[Item], str] = str,
                    models: bool = True) -> list[dict[str, Any]]:
        """``run`` for model work batched across items: the items to compute go to ``compute_group``
        in ``groups`` of at least ``limit`` weight (frames), one engine task each, so that one model
        run holds several items' frames. ``compute_group(items)`` returns ``outcomes`` (one
        ``Outcome`` per item, as ``run_one`` makes them) and group-wide counters under ``_stats``; a
        group lost as a whole (its worker died) fails each of its items."""
        items = list(items)
        keys, versions, rows = self._reusable(items, key, version)
        todo = groups([i for i, row in enumerate(rows) if row is None], lambda i: weight(items[i]), limit)
        count_remote(self.stats, self.engine, sum(map(len, todo)))
        outcomes = self.engine.map(compute_group, [[items[i] for i in group] for group in todo],
                                   lambda group: f"{label(group[0])} (+{len(group) - 1})", self.log, models=models)
        for group, outcome in zip(todo, outcomes, strict=True):
            if outcome.row is not None:
                self.stats.merge(outcome.row.get("_stats") or {})
                each = outcome.row["outcomes"]
            else:
                each = [Outcome(reason=outcome.reason, transient=outcome.transient, fields=outcome.fields)] * len(group)
            for i, item_outcome in zip(group, each, strict=True):
                rows[i] = self._row(items[i], keys[i], versions[i], item_outcome, failed, label)
        return rows

    def _reusable(self, items: list[Item], key: Callable[[Item], Hashable],
                  version: RowVersion | Callable[[Item], RowVersion]) -> tuple[list, list, list[dict[str, Any] | None]]:
        """Each item's key and version, and its stored row where it may be reused (else None)."""
        keys = [key(item) for item in items]
        versions = [version(item) if callable(version) else version for item in items]
        return keys, versions, [self.reuse.take(k, v) for k, v in zip(keys, versions, strict=True)]

    def _row(self, item: Item, k: Hashable, v: RowVersion, outcome: Outcome,
             failed: Callable[[Item, Failure], dict[str, Any]], label: Callable[[Item], str]) -> dict:
        if outcome.row is not None:
            row = outcome.row
            failure = row.pop("failure", None)
            self.stats.merge(row.pop("_stats", None) or {})
            if "_side" in row:
                self.side[k] = row.pop("_side")
        else:
            exc = Failure(outcome.reason or "failed", outcome.transient)
            row, failure = {**failed(item, exc), **outcome.fields}, (TRANSIENT if outcome.transient else FINAL)
        if "seconds" in row and row["seconds"] is None:
            row["seconds"] = round(outcome.seconds, 4)
        self.log(f"{label(item)}: {row.get('status')}" + (f" ({row.get('reason')})" if failure else ""))
        return self.reuse.stamp(k, row, v, failure)

    def finish(self, rows: list[dict[str, Any]], status: str = "status") -> list[dict[str, Any]]:
        self.stats.by_status.clear()
        for row in rows:
            self.stats.count(str(row.get(status)))
        return rows

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> Step:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def count_remote(stats: StepStats, engine: Any, items: int) -> None:
    """Items a step handed to a remote engine (``items_on_ray`` in its metadata)."""
    if items and engine.name != "local":
        stats.add(f"items_on_{engine.name}", items)


_WORKER_STEPS: dict[tuple[int, str], Step] = {}


def _worker_step(memory_mb: int, isolation: str = "auto") -> Step:
    """The step a compute function reaches on a Ray worker: one per worker process and sandbox
    setting, so its sandbox (and scratch directory) serve every task the worker runs."""
    if (memory_mb, isolation) not in _WORKER_STEPS:
        _WORKER_STEPS[memory_mb, isolation] = Step([], lambda r: None, 1, memory_mb, isolation=isolation)
    return _WORKER_STEPS[memory_mb, isolation]
