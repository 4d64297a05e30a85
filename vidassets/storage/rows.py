"""Row reuse and retry rules, the same for every row-producing stage.

Every derived row carries ``producer_version`` (its producer's own version), ``input_version`` (a
digest of the versions of everything it was computed from), ``runs`` (how many runs computed it
under that version) and, when it failed, ``failure``: ``transient`` (I/O, timeout, out of memory, a
lost worker: worth trying again) or ``final`` (the input itself is bad: trying again gives the same
answer). A stored row is reused when both versions match and it is not a transient failure with
runs left; everything else is computed again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

TRANSIENT = "transient"
FINAL = "final"


@dataclass(frozen=True)
class RowVersion:
    """What a row must carry to be reused: its producer's own version and its inputs' digest."""

    producer: str
    inputs: str = ""


def records(frame: pd.DataFrame | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Table rows as dicts, with pandas' missing values as None."""
    if isinstance(frame, pd.DataFrame):
        if not len(frame):
            return []
        # vectorised: missing values of every column become None (cells holding lists or bytes are kept)
        return frame.astype(object).where(frame.notna(), None).to_dict("records")
    rows = [dict(r) for r in frame]
    return [{k: (None if _isna(v) else v) for k, v in r.items()} for r in rows]


def _isna(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def matches(row: Mapping[str, Any], version: RowVersion) -> bool:
    return row.get("producer_version") == version.producer and (row.get("input_version") or "") == version.inputs


def retry_due(row: Mapping[str, Any], max_runs: int) -> bool:
    """A transient failure with runs left."""
    return row.get("failure") == TRANSIENT and int(row.get("runs") or 0) < max_runs


@dataclass
class StepStats:
    """What one step did, reported the same way by every stage (see ``metadata``)."""

    rows_in: int = 0
    reused: int = 0
    computed: int = 0
    failed: int = 0
    """Rows computed this run that failed (transient or final)."""
    retry_pending: int = 0
    """Rows written with a transient failure and runs left: a later run tries them again."""
    retries_exhausted: int = 0
    frames_decoded: int = 0
    model_calls: int = 0
    seconds: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def count(self, status: str) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1

    def add(self, key: str, n: int | float = 1) -> None:
        self.extra[key] = self.extra.get(key, 0) + n

    def merge(self, counters: dict[str, int | float]) -> None:
        """Counters an item reported (``frames_decoded`` and ``model_calls`` are fields, the rest extra)."""
        for key, n in counters.items():
            if key in ("frames_decoded", "model_calls"):
                setattr(self, key, getattr(self, key) + n)
            else:
                self.add(key, n)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "rows_in": self.rows_in, "rows_reused": self.reused, "rows_computed": self.computed,
            "rows_failed": self.failed, "retry_pending": self.retry_pending,
            "retries_exhausted": self.retries_exhausted, "frames_decoded": self.frames_decoded,
            "model_calls": self.model_calls,
        }
        if self.by_status:
            meta["rows_by_status"] = dict(sorted(self.by_status.items()))
        if self.seconds:
            meta["seconds"] = round(self.seconds, 3)
        meta.update(self.extra)
        return meta


class Reuse:
    """The stored rows of one table (partition), and which of them a step may keep.

    ``key`` maps a row to its identity (e.g. ``clip_id`` or ``(clip_id, score)``). ``take(key,
    version)`` returns the stored row when it may be reused (counting it), else None; after a
    compute, ``stamp`` sets the version columns, counting runs on from a failed row of the same
    version. ``keep_other_versions`` keeps rows of other producer versions (tables that hold several
    versions side by side, such as annotations, where the recipe chooses one).
    """

    def __init__(self, previous: pd.DataFrame | list[dict], key: Callable[[Mapping[str, Any]], Hashable],
                 max_runs: int, stats: StepStats | None = None):
        self.key = key
        self.max_runs = max_runs
        self.stats = stats if stats is not None else StepStats()
        self.rows = records(previous) if isinstance(previous, pd.DataFrame) else list(previous)
        self._by_key: dict[Hashable, dict] = {}
        for row in self.rows:
            self._by_key[key(row)] = row

    def prior(self, key: Hashable) -> dict | None:
        return self._by_key.get(key)

    def reusable(self, key: Hashable, version: RowVersion) -> bool:
        row = self._by_key.get(key)
        return row is not None and matches(row, version) and not retry_due(row, self.max_runs)

    def take(self, key: Hashable, version: RowVersion) -> dict | None:
        if not self.reusable(key, version):
            return None
        row = self._by_key[key]
        self.stats.reused += 1
        if row.get("failure") == TRANSIENT:
            self.stats.retries_exhausted += 1
        return row

    def stamp(self, key: Hashable, row: dict, version: RowVersion, failure: str | None = None) -> dict:
        """Set the version columns of a freshly computed row (and count it)."""
        prior = self._by_key.get(key)
        earlier = int(prior.get("runs") or 0) if prior is not None and matches(prior, version) and prior.get("failure") else 0
        row.update(producer_version=version.producer, input_version=version.inputs, runs=earlier + 1, failure=failure)
        self.stats.computed += 1
        if failure:
            self.stats.failed += 1
            if failure == TRANSIENT and row["runs"] < self.max_runs:
                self.stats.retry_pending += 1
        return row

    def others(self, written: Iterable[Mapping[str, Any]]) -> list[dict]:
        """Stored rows whose key the step did not write (other versions kept side by side)."""
        keys = {self.key(r) for r in written}
        return [r for r in self.rows if self.key(r) not in keys]


def current_rows(table: pd.DataFrame, version: str | Iterable[str], statuses: Iterable[str] = ("ok",)) -> pd.DataFrame:
    """The rows of ``table`` that its producer's current ``version`` (or any of several: latents, one
    per resolution) wrote with one of ``statuses``: what readers of a derived table take (older
    versions' rows stay beside them, unread)."""
    if not len(table):
        return table
    versions = [version] if isinstance(version, str) else list(version)
    return table[table.producer_version.isin(versions) & table.status.isin(list(statuses))]
