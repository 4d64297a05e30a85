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


def each(compute: Callable[[Any], dict[str, Any]], items: Sequence[Any]) -> list[Outcome]:
    """``run_one`` over items in this process: how a group that failed as a whole is taken apart
    (one item's bad input must not fail its neighbours)."""
    return [run_one(compute, item) for item in items]


def all_or_fail(compute: Callable[[Any], dict[str, Any]], items: Sequence[Any], engine: Any, what: str,
                label: Callable[[Any], str] = str) -> list[dict[str, Any]]:
    """``compute(item)`` of every item, in item order: here (``engine`` None) or as ``engine``'s
    tasks. For work whose parts are all needed (a global stage's join or search): a task the engine
    could not finish raises, naming ``what`` and the item, so the step fails and saves nothing."""
    if engine is None:
        return [compute(item) for item in items]
    found = []
    for item, outcome in zip(items, engine.map(compute, items, label=label), strict=True):
        if outcome.row is None:
            raise RuntimeError(f"{what} ({label(item)}): {outcome.reason}")
        found.append(outcome.row)
    return found


def groups(items: Sequence[Any], weight: Callable[[Any], int], limit: int) -> list[list[Any]]:
    """Consecutive items in groups that each reach ``limit`` total weight (the last may hold less; a
    limit of 1 puts every item in a group of its own). Model work groups clips by their frames so
    that one model run holds frames of several clips."""
    out: list[list[Any]] = []
    held = limit
    for item in items:
        if held >= limit:
            out.append([])
            held = 0
        out[-1].append(item)
        held += max(1, weight(item))
    return out


class LocalEngine:
    """Items one after the other in this process."""

    name = "local"
    parallelism = 1
    """Items in progress at once."""

    def map(self, compute: Callable[[Any], dict[str, Any]], items: Sequence[Any], label: Callable[[Any], str] = str,
            log: Log = lambda _: None, models: bool = False) -> Iterable[Outcome]:
        for item in items:
            yield run_one(compute, item)


def _ray_task(compute: Callable[[Any], dict[str, Any]], item: Any) -> Outcome:  # runs on a Ray worker
    return run_one(compute, item)


class _ModelActor:  # a Ray actor: its process keeps the models it built (the registry caches per process)
    def run(self, compute: Callable[[Any], dict[str, Any]], item: Any) -> Outcome:
        return run_one(compute, item)


class RayEngine:
    """Items as Ray tasks with bounded in-flight work; progress is logged every ``progress_seconds``.
    Model work (``map(..., models=True)``) goes to a pool of actors instead, each building its models
    once and keeping them for every item of the step, reserving ``gpus_per_model_actor`` of a GPU
    when the cluster has GPUs (several actors share one GPU) and restarted by Ray if its process
    dies. The pool lives for one step: its CPUs and GPU shares go back to the cluster when the step
    ends (a pool kept across steps would starve the next step's tasks on a small cluster)."""

    name = "ray"

    def __init__(self, address: str | None = None, max_in_flight: int = 0, num_cpus_per_task: float = 1.0,
                 task_retries: int = 3, model_actors: int = 0, gpus_per_model_actor: float = 0.25,
                 progress_seconds: float = 10.0):
        import ray

        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False,
                     include_dashboard=False if address is None else None)
        self._ray = ray
        resources = ray.cluster_resources()
        self.max_in_flight = max_in_flight or max(2, 2 * int(resources.get("CPU", 1)))
        self.parallelism = self.max_in_flight
        self.progress_seconds = progress_seconds
        self.task_retries = task_retries
        self._remote = ray.remote(_ray_task).options(num_cpus=num_cpus_per_task, max_retries=task_retries,
                                                       retry_exceptions=False)
        gpus = gpus_per_model_actor if resources.get("GPU", 0) > 0 else 0
        by_cpu = int(resources.get("CPU", 1) // num_cpus_per_task)
        by_gpu = int(resources.get("GPU", 0) // gpus) if gpus else by_cpu
        self.model_actors = model_actors or max(1, min(by_cpu, by_gpu))
        self._actor_options = {"num_cpus": num_cpus_per_task, "num_gpus": gpus, "max_restarts": task_retries,
                               "max_task_retries": task_retries}

    def map(self, compute: Callable[[Any], dict[str, Any]], items: Sequence[Any], label: Callable[[Any], str] = str,
            log: Log = lambda _: None, models: bool = False) -> Iterable[Outcome]:
        if not items:
            return []
        if not models:
            return self._map(compute, items, log, [])
        cls = self._ray.remote(_ModelActor).options(**self._actor_options)
        actors = [cls.remote() for _ in range(min(self.model_actors, len(items)))]
        try:
            return self._map(compute, items, log, actors)
        finally:
            for actor in actors:
                self._ray.kill(actor)

    def _map(self, compute: Callable[[Any], dict[str, Any]], items: Sequence[Any], log: Log,
             actors: list[Any]) -> list[Outcome]:
        ray = self._ray
        shared = ray.put(compute)  # one copy of the function and what it closes over, for every task
        load = [0] * len(actors)
        outcomes: list[Outcome | None] = [None] * len(items)
        pending: dict[Any, tuple[int, int]] = {}
        submitted = done = failed = 0
        last_report = time.monotonic()
        while done < len(items):
            while submitted < len(items) and len(pending) < self.max_in_flight:
                if actors:  # the least busy actor
                    slot = min(range(len(actors)), key=load.__getitem__)
                    load[slot] += 1
                    ref = actors[slot].run.remote(shared, items[submitted])
                else:
                    slot, ref = -1, self._remote.remote(shared, items[submitted])
                pending[ref] = (submitted, slot)
                submitted += 1
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                index, slot = pending.pop(ref)
                if slot >= 0:
                    load[slot] -= 1
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
               task_retries: int = 3, model_actors: int = 0, gpus_per_model_actor: float = 0.25) -> Engine:
    """The engine ``execution.engine`` names (``local`` or ``ray``)."""
    if name == "local":
        return LocalEngine()
    if name == "ray":
        return RayEngine(address, max_in_flight, num_cpus_per_task, task_retries, model_actors, gpus_per_model_actor)
    raise ValueError(f"execution.engine: unknown engine {name!r} (use local or ray)")
