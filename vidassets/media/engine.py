"""Where a step's per-item work runs (no Dagster): in this process (``local``) or spread over a Ray
cluster (``ray``: a local one for ``dagster dev`` and tests, a KubeRay one on Kubernetes).

An engine maps a compute function over items and hands back, in item order, one ``Outcome`` per
item: the row, or the failure (a ``Failure`` the compute raised, or any other exception as a
transient failure). On Ray each item is one task; the compute function is put in the object store
once and shared by every task; at most ``max_in_flight`` tasks are pending at a time (the driver
waits for one to finish before it submits the next), and a task whose worker died is retried by
Ray ``task_retries`` times before it becomes a transient-failure row like a lost sandbox worker.
The sandbox guarantees hold on a Ray worker as here: the compute function starts the same sandboxed
decoding process there (limits, watchdog, format whitelist, scrubbed environment).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Log = Callable[[str], None]


class Failure(Exception):
    """Raised by a compute function for an item that cannot be computed: becomes a row."""

    def __init__(self, reason: str, transient: bool, **fields: Any):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient
        self.fields = fields


@dataclass
class Outcome:
    """One item's result: ``row`` when computed, else the failure's ``reason``, whether it is
    ``transient`` and the extra row ``fields`` it carries."""

    row: dict[str, Any] | None = None
    reason: str | None = None
    transient: bool = True
    fields: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    """Wall seconds of the compute, measured where it ran."""


def run_one(compute: Callable[[Any], dict[str, Any]], item: Any) -> Outcome:
    """``compute(item)`` with every exception turned into an outcome (one item's bug is a row)."""
    started = time.perf_counter()
    try:
        outcome = Outcome(row=compute(item))
    except Failure as exc:
        outcome = Outcome(reason=exc.reason, transient=exc.transient, fields=exc.fields)
    except Exception as exc:  # noqa: BLE001
        outcome = Outcome(reason=f"{exc.__class__.__name__}: {exc}"[:300], transient=True)
    outcome.seconds = time.perf_counter() - started
    return outcome


class LocalEngine:
    """Items one after the other in this process."""

    name = "local"

    def map(self, compute: Callable[[Any], dict[str, Any]], items: Sequence[Any], label: Callable[[Any], str] = str,
            log: Log = lambda _: None) -> Iterable[Outcome]:
        for item in items:
            yield run_one(compute, item)


def _ray_task(compute: Callable[[Any], dict[str, Any]], item: Any) -> Outcome:  # runs on a Ray worker
    return run_one(compute, item)


class RayEngine:
    """Items as Ray tasks with bounded in-flight work; progress is logged every ``progress_seconds``."""

    name = "ray"

    def __init__(self, address: str | None = None, max_in_flight: int = 0, num_cpus_per_task: float = 1.0,
                 task_retries: int = 3, progress_seconds: float = 10.0):
        import ray

        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False if address is None else None)
        self._ray = ray
        self.max_in_flight = max_in_flight or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        self.progress_seconds = progress_seconds
        self._remote = ray.remote(_ray_task).options(num_cpus=num_cpus_per_task, max_retries=task_retries,
                                                       retry_exceptions=False)

    def map(self, compute: Callable[[Any], dict[str, Any]], items: Sequence[Any], label: Callable[[Any], str] = str,
            log: Log = lambda _: None) -> Iterable[Outcome]:
        ray = self._ray
        if not items:
            return []
        shared = ray.put(compute)  # one copy of the function and what it closes over, for every task
        outcomes: list[Outcome | None] = [None] * len(items)
        pending: dict[Any, int] = {}
        submitted = done = failed = 0
        last_report = time.monotonic()
        while done < len(items):
            while submitted < len(items) and len(pending) < self.max_in_flight:
                pending[self._remote.remote(shared, items[submitted])] = submitted
                submitted += 1
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - the worker died (retries spent) or Ray lost the task
                    outcome = Outcome(reason=f"ray task lost: {exc.__class__.__name__}: {exc}"[:300], transient=True)
                outcomes[index] = outcome
                done += 1
                failed += outcome.row is None
            if time.monotonic() - last_report >= self.progress_seconds or done == len(items):
                log(f"ray: {done}/{len(items)} items done, {failed} failed, {len(pending)} in flight")
                last_report = time.monotonic()
        return outcomes


Engine = LocalEngine | RayEngine


def engine_for(name: str, address: str | None = None, max_in_flight: int = 0, num_cpus_per_task: float = 1.0,
               task_retries: int = 3) -> Engine:
    """The engine ``execution.engine`` names (``local`` or ``ray``)."""
    if name == "local":
        return LocalEngine()
    if name == "ray":
        return RayEngine(address, max_in_flight, num_cpus_per_task, task_retries)
    raise ValueError(f"execution.engine: unknown engine {name!r} (use local or ray)")
