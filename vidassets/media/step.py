"""The incremental step runner every row-producing stage uses (no Dagster).

A step takes the items it should hold rows for, keeps the stored rows it may reuse (same producer
and input versions, not a transient failure with runs left; see ``storage.rows``), computes the
rest, and turns every failure into a row with a status, a reason and a failure class instead of an
exception. It owns the sandboxed worker and the scratch directory (both started only when some
item needs them) and counts what it did in one ``StepStats``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import pandas as pd

from vidassets.media.sandbox import Sandbox
from vidassets.media.source import source_spec
from vidassets.storage.objects import ReadOnlyBucket
from vidassets.storage.rows import FINAL, TRANSIENT, Reuse, RowVersion, StepStats

Item = TypeVar("Item")
Log = Callable[[str], None]


class Failure(Exception):
    """Raised by a compute function for an item that cannot be computed: becomes a row."""

    def __init__(self, reason: str, transient: bool, **fields: Any):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient
        self.fields = fields


class Step:
    """One step over keyed rows of one table partition."""

    def __init__(self, previous: pd.DataFrame | list[dict], key: Callable[[Mapping[str, Any]], Hashable],
                 max_runs: int, memory_mb: int = 4096, log: Log = lambda _: None):
        self.stats = StepStats()
        self.reuse = Reuse(previous, key, max_runs, self.stats)
        self.memory_mb = memory_mb
        self.log = log
        self._sandbox: Sandbox | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(self.memory_mb)
        return self._sandbox

    @property
    def scratch(self) -> str:
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="vidassets-")
        return self._scratch.name

    @contextlib.contextmanager
    def source(self, bucket: ReadOnlyBucket, video: Mapping[str, Any]) -> Iterator[dict]:
        """The video's source spec for the sandbox; a source that cannot be read is a transient failure."""
        try:
            with source_spec(bucket, video, self.scratch) as spec:
                yield spec
        except OSError as exc:  # the object vanished or cannot be fetched: try again on a later run
            raise Failure(f"cannot read source: {exc}", transient=True) from exc

    def run(self, items: Iterable[Item], key: Callable[[Item], Hashable], version: RowVersion | Callable[[Item], RowVersion],
            compute: Callable[[Item], dict[str, Any]], failed: Callable[[Item, Failure], dict[str, Any]],
            label: Callable[[Item], str] = str) -> list[dict[str, Any]]:
        """One row per item: the stored row when reusable, else ``compute(item)``; a ``Failure`` (or
        any exception, as a transient failure) becomes ``failed(item, failure)``."""
        rows = []
        for item in items:
            k = key(item)
            v = version(item) if callable(version) else version
            kept = self.reuse.take(k, v)
            if kept is not None:
                rows.append(kept)
                continue
            started = time.perf_counter()
            try:
                row = compute(item)
                failure = row.pop("failure", None)
            except Failure as exc:
                row, failure = {**failed(item, exc), **exc.fields}, (TRANSIENT if exc.transient else FINAL)
            except Exception as exc:  # noqa: BLE001 - one item's bug is a row, not a crashed step
                exc_failure = Failure(f"{exc.__class__.__name__}: {exc}"[:300], transient=True)
                row, failure = failed(item, exc_failure), TRANSIENT
            if "seconds" in row and row["seconds"] is None:
                row["seconds"] = round(time.perf_counter() - started, 4)
            rows.append(self.reuse.stamp(k, row, v, failure))
            self.log(f"{label(item)}: {row.get('status')}" + (f" ({row.get('reason')})" if failure else ""))
        return rows

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
