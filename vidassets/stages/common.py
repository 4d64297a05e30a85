"""What the stage modules share (Dagster side). Assets and checks are module-level functions that
register themselves with ``stage_asset`` / ``stage_check``; ``build_assets`` turns them into Dagster
definitions for one set of settings, every decorator argument (group, partitioning, deps, code
version, automation, op_tags, description) taken from the asset's catalog entry. Every step
reports its ``StepStats`` the same way (``result``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import pandas as pd
from dagster import (
    AssetChecksDefinition,
    AssetsDefinition,
    AutomationCondition,
    FreshnessPolicy,
    MaterializeResult,
    asset,
    asset_check,
)

from vidassets import catalog
from vidassets.config import Settings
from vidassets.curate.selection import selected_in_order
from vidassets.egress import role_of
from vidassets.partitions import per_drop, source_shards
from vidassets.storage import tables as table_files
from vidassets.storage.input_versions import StoredInputVersions, Where
from vidassets.storage.rows import StepStats, records
from vidassets.storage.tables import JOURNAL_LAG_NS, partition_fingerprints
from vidassets.versions import Versions

EAGER = AutomationCondition.eager() | AutomationCondition.code_version_changed()

Extra = Callable[[Settings, Versions], dict[str, Any]]
_ASSETS: dict[str, tuple[Callable, Extra | None]] = {}
_CHECKS: list[tuple[str, Callable, dict[str, Any], Callable[[Settings], str] | None]] = []


def versions_metadata(key: str, attribute: str) -> Extra:
    """``@asset`` metadata naming the versions the asset's rows carry (``Versions.<attribute>``)."""
    return lambda settings, versions: {"metadata": {key: getattr(versions, attribute)}}


def stage_asset(name: str, extra: Extra | None = None) -> Callable[[Callable], Callable]:
    """Register a module-level function as the body of the catalog asset ``name``; ``extra`` gives
    further ``@asset`` arguments that depend on the settings (a freshness policy, metadata)."""
    catalog.entry(name)  # a name the catalog does not know fails at import

    def register(fn: Callable) -> Callable:
        _ASSETS[name] = (fn, extra)
        return fn

    return register


def stage_check(asset_name: str, description: str | Callable[[Settings], str], blocking: bool = False) -> Callable:
    """Register a module-level function as an asset check on ``asset_name`` (its description may be
    written from the settings' thresholds)."""

    def register(fn: Callable) -> Callable:
        text = description if callable(description) else None
        _CHECKS.append((asset_name, fn, {"blocking": blocking, "description": None if text else description}, text))
        return fn

    return register


def build_assets(settings: Settings, versions: Versions) -> tuple[list[AssetsDefinition], list[AssetChecksDefinition]]:
    """The catalog's assets (in catalog order) and the registered checks, for these settings (the
    stage modules register them when imported: ``vidassets.graph`` imports every one)."""
    missing = sorted(set(catalog.NAMES) ^ set(_ASSETS))
    if missing:
        raise AssertionError(f"the catalog and the stage modules disagree on {missing}")
    assets = {}
    for name in catalog.NAMES:
        fn, extra = _ASSETS[name]
        body = per_drop(fn) if catalog.entry(name).partitioned else fn
        assets[name] = asset(**asset_args(name, settings, versions, **(extra(settings, versions) if extra else {})))(body)
    built = []
    for asset_name, fn, args, text in _CHECKS:
        described = {**args, "description": text(settings)} if text else args
        body = per_drop(fn, check=True) if catalog.entry(asset_name).partitioned else fn
        built.append(asset_check(asset=assets[asset_name], name=fn.__name__, **described)(body))
    return list(assets.values()), built


def asset_args(name: str, settings: Settings, versions: Versions, **extra: Any) -> dict[str, Any]:
    """``@asset`` keyword arguments of a catalog asset: group, partitioning, deps, code version (its
    full version), automation, Kubernetes op_tags and description."""
    entry = catalog.entry(name)
    args: dict[str, Any] = {
        "name": name, "group_name": entry.group, "deps": list(entry.deps), "code_version": versions.full(name),
        "op_tags": settings.compute.op_tags(name, entry.profile, entry.vault, role_of(settings, name)), "description": entry.description,
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


def selected_or_keep(run, table: str, version: str) -> tuple[list[dict], pd.DataFrame, MaterializeResult | None]:
    """(this partition's selected clips, the table's previous rows, None), or, when nothing here is
    selected (yet), keep the previous rows as they are and return the result to report."""
    selected = selected_in_order(run.which.read_groups("selection", [run.key]), run.key)
    if selected:
        return selected, run.tables.previous(table, run.key), None
    previous = run.tables.read_or_empty(table, run.key)
    rows = records(previous)
    run.tables.write(table, run.key, rows)
    return selected, previous, result(StepStats(), rows, version, selected=selected)


JOURNAL_KEEP_NS = 7 * 24 * 3600 * 10**9
"""How long the tables' journal keeps its records: a global stage that last ran longer ago lists
its inputs whole once."""


def _partitioned(table: str) -> bool:
    return any(a.partitioned for a in catalog.ASSETS if table in a.tables or table in a.vault_tables)


class GlobalInputs:
    """What a global asset read last time: its full version and the version of every partition of
    each input table, and when (``StoredInputVersions``). When nothing changed, its stored rows
    stand and the step computes nothing. Only the first run (or one after ``JOURNAL_KEEP_NS``) lists
    the inputs whole; later runs ask the tables' journal which partitions were written since
    (``TableStore.written_since``), look up the versions of those alone and read the stored
    versions of their buckets, so finding a new drop costs the drop, not the bucket."""

    def __init__(self, objects, name: str, full_version: str, inputs: list[tuple[Any, str]]):
        self.objects, self.full_version = objects, full_version
        self.stored = StoredInputVersions(objects, f"state/inputs/{name}")
        self.legacy = f"state/inputs/{name}.parquet"  # the whole-file form before the buckets
        self.started = table_files.journal_clock()
        self.inputs = inputs
        cursor = self.stored.read_at
        self.whole: dict[Where, dict[str, str]] = {}
        """Inputs listed whole this run (tables without partitions, or no journal to ask)."""
        self.delta: dict[Where, dict[str, str | None]] = {}
        """Inputs read through the journal: the current version of each partition written since
        the last read (None: removed)."""
        self.touched: dict[Where, set[str] | None] = {}
        """Per input, the partitions whose version may differ from the last run's read (None: no read
        to compare with)."""
        self.counts: dict[Where, int] = {}
        self.tables_listed = self.partitions_looked_up = 0
        same = self.stored.version == full_version
        for tables, table in inputs:
            where = (self._where(tables), table)
            known = self.stored.known(where)
            written = tables.written_since(table, cursor - JOURNAL_LAG_NS) \
                if known and cursor and _partitioned(table) else None
            if written is None:
                listed = self.whole[where] = tables.versions(table)
                before = self.stored.every(where) if known else None
                self.touched[where] = None if before is None else {
                    p for p in before.keys() | listed.keys() if before.get(p) != listed.get(p)}
                same = same and before == listed
                self.tables_listed += 1
                if _partitioned(table):
                    self.counts[where] = len(listed)
                continue
            self.touched[where] = set(written)
            current = self.delta[where] = {part: tables.version(table, part) for part in sorted(written)}
            before = self.stored.versions_of(where, written)
            self.partitions_looked_up += len(written)
            self.counts[where] = self.stored.counts[where] + sum(
                (v is not None) - (p in before) for p, v in current.items())
            same = same and all(before.get(p) == v for p, v in current.items())
        self.same = same

    def _where(self, tables) -> str:
        """An input store's name in the stored versions: "" for the stage's own store (so a store
        moved or copied elsewhere keeps them), else its URI (the eval vault)."""
        return "" if tables.uri == self.objects.uri else tables.uri

    def version(self, where: Where, part: str) -> str | None:
        """The version of partition ``part`` of input ``where`` this run found."""
        if where in self.whole:
            return self.whole[where].get(part)
        if part in self.delta[where]:
            return self.delta[where][part]
        return self.stored.versions_of(where, [part]).get(part)

    def every(self, where: Where) -> dict[str, str]:
        """Every partition's version of input ``where`` (reads the stored versions whole)."""
        if where in self.whole:
            return self.whole[where]
        return self.stored.overlaid(where, self.delta[where])

    def fingerprints(self, tables, names: tuple[str, ...], over: str | None = None) -> Mapping[str, str]:
        """``partition_fingerprints`` of input tables from the versions this found (no second
        listing). Over a table read through the journal, a mapping that reads the stored versions of
        a partition's bucket when asked for it, and all of them only when iterated."""
        store = self._where(tables)
        if over is None or (store, over) in self.whole:
            return partition_fingerprints(tables, names, over, listed={n: self.every((store, n)) for n in names})
        return InputFingerprints(self, tables, names, over)

    def changed(self, tables, names: tuple[str, ...]) -> set[str] | None:
        """The partitions of ``names`` added, rewritten or removed since the last run's read (None:
        unknown, a first run): what a stage keeping its own state needs to look at."""
        found: set[str] = set()
        for name in names:
            touched = self.touched[self._where(tables), name]
            if touched is None:
                return None
            found |= touched
        return found

    def unchanged(self, output: Any, table: str) -> bool:
        return self.same and output.exists(table)

    def metadata(self) -> dict[str, int]:
        """How the inputs were found: tables listed whole, partitions looked up through the journal,
        buckets of stored versions read."""
        return {"input_tables_listed": self.tables_listed, "input_partitions_looked_up": self.partitions_looked_up,
                "input_version_buckets_read": self.stored.buckets_read}

    def remember(self) -> None:
        """Store the versions read (when this run started: the next one asks the journal from then),
        and let the journal drop what no run that recent needs."""
        partitioned = {w for w in self.counts}
        self.stored.write(self.full_version, self.started,
                          whole={w: v for w, v in self.whole.items() if w not in partitioned},
                          listed={w: v for w, v in self.whole.items() if w in partitioned},
                          changed=self.delta, counts=self.counts)
        for key in (self.legacy, self.legacy.replace(".parquet", ".json")):  # the forms kept before
            self.objects.delete(key)
        for tables, table in self.inputs:
            if _partitioned(table):
                tables.prune_journal(table, self.started - JOURNAL_KEEP_NS)


class InputFingerprints(Mapping):
    """Partition -> fingerprint of a global stage's input tables (``partition_fingerprints``), over
    the partitions of one table read through the journal: its length from the stored count, a
    partition's fingerprint from its bucket, the whole (every bucket read) only when iterated."""

    def __init__(self, seen: GlobalInputs, tables: Any, names: tuple[str, ...], over: str):
        self.seen, self.tables, self.names, self.over = seen, tables, names, over
        self.store = seen._where(tables)
        self._whole: dict[str, str] | None = None

    def __len__(self) -> int:
        return self.seen.counts[self.store, self.over]

    def __getitem__(self, part: str) -> str:
        if self._whole is not None:
            return self._whole[part]
        if self.seen.version((self.store, self.over), part) is None:
            raise KeyError(part)
        return "|".join(str(self.seen.version((self.store, name), part)) for name in self.names)

    def whole(self) -> dict[str, str]:
        if self._whole is None:
            self._whole = partition_fingerprints(self.tables, self.names, self.over,
                                                 listed={n: self.seen.every((self.store, n)) for n in self.names})
        return self._whole

    def __iter__(self):
        return iter(self.whole())

    def items(self):
        return self.whole().items()


def kept(tables, table: str, version: str, seen: GlobalInputs) -> MaterializeResult:
    """A global asset whose inputs did not change: its stored rows stand (counted from the table's
    index, not read)."""
    count = tables.row_count(table)
    return result(StepStats(rows_in=count, reused=count), range(count), version, inputs_unchanged=True,
                  **seen.metadata())
