"""In-process materialization of the whole graph over every drop of a bucket (what the CLI and the
demo run). Adds partitions exactly as the bucket sensor would, runs each partition's assets, then
the global ones, and collects a per-stage summary from the materialization metadata."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import AssetKey, AssetsDefinition, DagsterInstance, DagsterRunStatus, materialize

from vidassets import catalog
from vidassets.config import Settings
from vidassets.config import dagster_home as dagster_home_dir
from vidassets.graph import build_definitions
from vidassets.ingest.drops import DropListing, list_drops
from vidassets.partitions import source_shards
from vidassets.resources import BucketResource
from vidassets.storage.drop_batches import DropBatches


@dataclass
class StageSummary:
    asset: str
    runs: int = 0
    rows_in: int = 0
    rows_out: int = 0
    seconds: float = 0.0
    failures: int = 0
    extra: dict[str, int] = field(default_factory=dict)


@dataclass
class RunSummary:
    drops: list[str]
    skipped_incomplete: list[str]
    stages: dict[str, StageSummary]
    seconds: float
    failed_partitions: list[str] = field(default_factory=list)
    reads: Any = None
    """What each asset read in this run (``vidassets.stages.declared.ReadLog``): settings and tables."""

    @property
    def ok(self) -> bool:
        return not self.failed_partitions

    def render(self) -> str:
        lines = [f"drops materialized: {len(self.drops)}  ({', '.join(self.drops) or 'none'})"]
        if self.skipped_incomplete:
            lines.append(f"incomplete drops skipped: {', '.join(self.skipped_incomplete)}")
        lines.append(f"{'stage':<22}{'runs':>6}{'rows in':>10}{'rows out':>10}{'seconds':>10}  notes")
        for s in self.stages.values():
            notes = ", ".join(f"{k}={v}" for k, v in s.extra.items())
            if s.failures:
                notes = f"FAILED x{s.failures}; {notes}"
            lines.append(f"{s.asset:<22}{s.runs:>6}{s.rows_in:>10}{s.rows_out:>10}{s.seconds:>10.2f}  {notes}")
        lines.append(f"total {self.seconds:.1f} s" + ("" if self.ok else f"; FAILED partitions: {self.failed_partitions}"))
        return "\n".join(lines)


def local_instance(dagster_home: str | None = None) -> DagsterInstance:
    """The Dagster instance for CLI runs: ``$DAGSTER_HOME`` if set, else ``.vidassets/dagster_home``
    (SQLite storage, created on first use)."""
    home = Path(dagster_home_dir(dagster_home)).absolute()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n")
    return DagsterInstance.from_config(str(home))


# Assets that run only when named (a snapshot is a release, not a by-product of every run).
ON_REQUEST = {a.name for a in catalog.of_kind("on_request")}

# Counters worth showing per stage in the summary (summed over partitions).
_NOTE_KEYS = ("exact_duplicates", "eval_rows", "rows_reused", "rows_computed", "rows_failed", "retry_pending",
              "retries_exhausted", "waiting_for_score_retry", "frames_decoded", "frames_counted", "context_frames",
              "model_calls", "safety_kills", "score_errors", "new_clips", "perceptual_links", "semantic_links",
              "clip_decodes", "read_from_ladder", "read_from_raw", "raw_frames_decoded", "reused_files", "shot_model_frames",
              "near_duplicates", "contains", "near_duplicates_not_analysed", "whole_grid_retakes", "whole_grid_borrowed",
              "whole_grid_retake_failures", "whole_grid_borrow_failures", "fingerprint_packs_read", "fingerprints_read",
              "fingerprint_packs_unreadable", "near_index_drops_synced", "items_on_ray")


def materialize_bucket(
    settings: Settings,
    instance: DagsterInstance,
    select: Sequence[str] | None = None,
    complete_only: bool = False,
    log: Callable[[str], None] = print,
    log_level: str = "WARNING",
    retry_quarantined: bool = False,
    add_partitions: bool = True,
) -> RunSummary:
    started = time.perf_counter()
    defs = build_definitions(settings)
    resources = defs.resources or {}
    bucket_resource = resources["bucket"]
    assert isinstance(bucket_resource, BucketResource)
    # only global assets named in select (e.g. a snapshot): no bucket listing
    listing = list_drops(bucket_resource.open(), settings.bucket) if add_partitions else DropListing([], [], [])
    drops = _drops_to_run(listing, complete_only, log)
    if not drops and add_partitions:
        log(f"no drops found: expected raw/<source_tier>/<drop_id>/ folders in {settings.bucket.uri}")
    partition_of = _partitions_of(drops, settings, instance, resources["store"].objects())
    assets = [a for a in (defs.assets or []) if isinstance(a, AssetsDefinition)]
    names = [k.to_user_string() for a in assets for k in a.keys]
    unknown = sorted(set(select or []) - set(names))
    if unknown:
        raise ValueError(f"unknown asset(s) in --select: {unknown}; known: {sorted(names)}")
    stages = {n: StageSummary(n) for n in names if (not select and n not in ON_REQUEST) or (select and n in select)}
    phases = _phases(select)
    runner = _PhaseRunner([*assets, *(defs.asset_checks or [])], instance, resources, stages, log, log_level,
                          retry_quarantined)
    # inventory first, for every drop: a canonical copy that moves (a better copy in a later drop)
    # is released by its holder and claimed by the new drop before anything is decoded
    partitions = list(dict.fromkeys(partition_of.values()))
    pending = partition_of.requested({r for key in partitions for r in runner.run(phases["inventory"], key)})
    for _ in range(4):
        if not pending:
            break
        known = set(partitions) | set(instance.get_dynamic_partitions(source_shards.name))
        pending = partition_of.requested({r for key in pending if key in known
                                          for r in runner.run(phases["inventory"], key)})
    # near-duplicate decisions are made per drop against every drop's fingerprints: a drop whose
    # decision a later drop changed (a better copy arrived) runs its chain again (rows reused)
    pending = partition_of.requested({r for key in partitions for r in runner.run(phases["partitioned"], key)})
    for _ in range(4):
        if not pending:
            break
        pending = partition_of.requested({r for key in pending if key in partitions
                                          for r in runner.run(phases["partitioned"], key)})
    runner.run(phases["global"], None)
    for key in partitions:
        runner.run(phases["after_global"], key)
    runner.run(phases["final"], None)
    return RunSummary(drops, [d.key for d in listing.incomplete] if complete_only else [], stages,
                      time.perf_counter() - started, runner.failed, resources["pipeline"].reads)


class _Partitions(dict):
    """Drop -> its partition for this run's drops (``vidassets.storage.drop_batches``)."""

    def __init__(self, mapping: dict[str, str], batches: DropBatches):
        super().__init__(mapping)
        self.batches = batches

    def requested(self, drops: set[str]) -> list[str]:
        """The partitions to run again for drops a step named (any drop of the bucket)."""
        return sorted(set(self.batches.partition_of(drops).values()))


def _partitions_of(drops: list[str], settings: Settings, instance: DagsterInstance, objects) -> _Partitions:
    """Each drop's partition, as the bucket sensor assigns them: drops that are partitions keep theirs,
    the others join batches of ``bucket.drops_per_partition`` (a drop of its own at 1); the partitions
    Dagster does not have yet are added."""
    batches = DropBatches(objects)
    existing = set(instance.get_dynamic_partitions(source_shards.name))
    assigned = batches.assign([d for d in drops if d not in existing], settings.bucket.drops_per_partition)
    mapping = {d: d if d in existing else assigned[d] for d in drops}
    new = [p for p in dict.fromkeys(mapping.values()) if p not in existing]
    if new:
        instance.add_dynamic_partitions(source_shards.name, new)
    return _Partitions(mapping, batches)


def _drops_to_run(listing: DropListing, complete_only: bool, log: Callable[[str], None]) -> list[str]:
    drops = [d.key for d in listing.complete]
    if not complete_only:
        for d in listing.incomplete:
            log(f"note: drop {d.key} has no completion marker; ingesting it because it was asked for explicitly")
        drops = sorted(drops + [d.key for d in listing.incomplete])
    for name in listing.invalid_names:
        log(f"warning: skipping {name}: its name cannot be a partition key")
    return drops


def _phases(select: Sequence[str] | None) -> dict[str, list[AssetKey]]:
    """The catalog's assets in the order a bucket is materialized: every drop's inventory, each drop's
    chain up to its scores and embeddings, the global assets, each drop's work on its selected clips,
    then (only when named) the on-request assets that read those."""
    late = {a.name for a in catalog.after_global()}
    final = catalog.downstream(late) - late
    inventory = {a.name for a in catalog.of_kind("partitioned") if not a.deps}

    def keys(names) -> list[AssetKey]:
        return [AssetKey(n) for n in catalog.NAMES if n in names]

    return {
        "inventory": keys(inventory),
        "partitioned": keys({a.name for a in catalog.of_kind("partitioned")} - late - inventory),
        "global": keys({a.name for a in catalog.ASSETS if not a.partitioned} - final),
        "after_global": keys(late),
        "final": keys({n for n in final if select and n in select}),
    }


class _PhaseRunner:
    """Runs one phase's chosen assets (and their checks) for one partition and records what they did."""

    def __init__(self, everything: list, instance: DagsterInstance, resources: dict, stages: dict[str, StageSummary],
                 log: Callable[[str], None], log_level: str, retry_quarantined: bool):
        self.everything, self.instance, self.resources, self.stages = everything, instance, resources, stages
        self.log, self.log_level, self.retry_quarantined = log, log_level, retry_quarantined
        self.failed: list[str] = []

    def run(self, phase: list[AssetKey], partition: str | None) -> list[str]:
        """Materialize the phase's chosen assets; returns the drops a canonical copy asks to ingest again."""
        chosen = [k for k in phase if k.to_user_string() in self.stages]
        if not chosen:
            return []
        label = partition or "global"
        self.log(f"[{label}] materializing {', '.join(k.to_user_string() for k in chosen)}")
        # every run gets the whole graph and selects the phase's assets; their checks run with them
        # (blocking ones can fail the run)
        result = materialize(
            self.everything, instance=self.instance, resources=self.resources, partition_key=partition,
            selection=chosen, raise_on_error=False, tags={"vidassets/launched_by": "cli"},
            run_config=_run_config([k.to_user_string() for k in chosen], self.log_level, self.retry_quarantined))
        durations = {ev.step_key: ev.event_specific_data.duration_ms / 1000 for ev in result.all_events
                     if ev.event_type_value == "STEP_SUCCESS" and ev.step_key}
        for key in chosen:
            _record(self.stages[key.to_user_string()], result, key, durations)
        self._report(result, label)
        requests = []
        for key in chosen:
            for m in result.asset_materializations_for_node(key.path[-1]):
                value = m.metadata.get("canonical_requests")
                requests += list(getattr(value, "value", value) or [])
        return requests

    def _report(self, result, label: str) -> None:
        evaluations = [ev.event_specific_data for ev in result.all_events
                       if ev.event_type_value == "ASSET_CHECK_EVALUATION"]
        for check in evaluations:
            if not check.passed:
                self.log(f"[{label}] check {check.check_name} on {check.asset_key.to_user_string()} FAILED "
                         f"({check.severity.value}): {dict((k, v.value) for k, v in check.metadata.items())}")
        if evaluations:
            self.log(f"[{label}] checks: {sum(c.passed for c in evaluations)}/{len(evaluations)} passed")
        if result.dagster_run.status != DagsterRunStatus.SUCCESS:
            self.failed.append(label)
            for ev in result.all_events:
                if ev.event_type_value == "STEP_FAILURE":
                    self.log(f"[{label}] step {ev.step_key} failed: {ev.event_specific_data.error.message.strip()}")


def _run_config(assets: list[str], log_level: str, retry_quarantined: bool) -> dict:
    config: dict = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if "video_probe" in assets:
        config["ops"] = {"video_probe": {"config": {"retry_quarantined": retry_quarantined}}}
    return config


def _record(stage: StageSummary, result, key: AssetKey, durations: dict[str, float]) -> None:
    node = key.path[-1]
    mats = [m for m in result.asset_materializations_for_node(node) if m.asset_key == key]
    if not mats:
        stage.failures += 1
        return
    meta = mats[-1].metadata
    stage.runs += 1
    stage.rows_in += int(meta["rows_in"].value) if "rows_in" in meta else 0
    stage.rows_out += int(meta["rows_out"].value) if "rows_out" in meta else 0
    stage.seconds += durations.get(node, 0.0)
    for note in _NOTE_KEYS:
        if note in meta:
            stage.extra[note] = stage.extra.get(note, 0) + int(meta[note].value)
    if "rows_by_status" in meta:
        for status, count in meta["rows_by_status"].value.items():
            if status not in ("ok", "clips"):
                stage.extra[status] = stage.extra.get(status, 0) + int(count)
