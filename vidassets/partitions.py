"""The one partitions definition: a dynamic partition per source shard (drop), ``<tier>/<drop_id>``,
or per batch of drops (``bucket.drops_per_partition`` > 1; ``vidassets.storage.drop_batches``).

Every stage body works on one drop. ``per_drop`` makes a batch's step run the body once per drop
of the batch (the body sees the drop as its partition key) and report one materialization (or check
result) for the batch: counts summed, rates averaged over the drops' rows, lists joined, and the
drops named."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, DynamicPartitionsDefinition, MaterializeResult

from vidassets.storage.drop_batches import DropBatches, is_batch

source_shards = DynamicPartitionsDefinition(name="source_shard")


class DropContext:
    """A step's context as one drop's body sees it: the drop as its partition key, the rest the
    batch step's own (log, asset key, resources)."""

    has_partition_key = True

    def __init__(self, context: Any, drop: str):
        self._context, self.partition_key = context, drop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class DropsFailed(RuntimeError):
    """Some drops of a batch failed; the others' rows are written."""


def per_drop(fn: Callable, check: bool = False) -> Callable:
    """``fn`` (an asset or check body over one drop) run for every drop of a batch partition; a
    drop's own partition (and an unpartitioned step) calls ``fn`` as it is. Every drop is run even
    when one fails (their tables are independent); then the step fails naming the drops that did.
    A body that takes no context does not look at partitions and is returned as it is."""
    if next(iter(inspect.signature(fn).parameters), None) != "context":
        return fn

    @functools.wraps(fn)
    def over_drops(context: Any, *args: Any, **kwargs: Any) -> Any:
        key = context.partition_key if context.has_partition_key else None
        if key is None or not is_batch(key):
            return fn(context, *args, **kwargs)
        if "store" not in kwargs:
            raise TypeError(f"{fn.__name__} runs on a batch of drops and must take the store resource")
        drops = DropBatches(kwargs["store"].objects()).drops_of(key)
        results, failed = [], {}
        for drop in drops:
            try:
                results.append((drop, fn(DropContext(context, drop), *args, **kwargs)))
            except Exception as exc:  # noqa: BLE001 - the batch's other drops still run; re-raised below
                context.log.error(f"{fn.__name__} failed on drop {drop}: {exc!r}")
                failed[drop] = exc
        if failed:
            first = next(iter(failed.values()))
            raise DropsFailed(f"{fn.__name__} failed on {len(failed)} of the {len(drops)} drops of {key}: "
                              f"{sorted(failed)} (first: {first!r}); the other drops' rows are written") from first
        return merged_checks(results) if check else merged_materializations(results)

    return over_drops


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def merged_metadata(per_drop: Sequence[Mapping[str, Any]], weights: Sequence[float]) -> dict[str, Any]:
    """One metadata dict for a batch: integers summed, floats averaged weighted by each drop's rows
    (a rate per row stays one), lists joined, dicts merged key by key, anything else kept when every
    drop agrees and listed when they differ."""
    keys = list(dict.fromkeys(k for meta in per_drop for k in meta))
    out: dict[str, Any] = {}
    for key in keys:
        pairs = [(_plain(meta[key]), w) for meta, w in zip(per_drop, weights, strict=True) if key in meta]
        values = [v for v, _ in pairs]
        if all(isinstance(v, bool) for v in values):
            out[key] = all(values)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            total = sum(w for _, w in pairs)
            out[key] = round(sum(v * w for v, w in pairs) / total if total else sum(values) / len(values), 4)
        elif all(isinstance(v, list) for v in values):
            out[key] = [x for v in values for x in v]
        elif all(isinstance(v, dict) for v in values):
            out[key] = merged_metadata(values, [1.0] * len(values))
        else:
            distinct = list(dict.fromkeys(str(v) for v in values))
            out[key] = distinct[0] if len(distinct) == 1 else distinct
    return out


def merged_materializations(results: Sequence[tuple[str, MaterializeResult]]) -> MaterializeResult:
    metas = [dict(r.metadata or {}) for _, r in results]
    weights = [float(_plain(m.get("rows_out", 0)) or 0) for m in metas]
    return MaterializeResult(metadata={**merged_metadata(metas, weights), "batch_drops": [d for d, _ in results]})


def merged_checks(results: Sequence[tuple[str, AssetCheckResult]]) -> AssetCheckResult:
    failing = [d for d, r in results if not r.passed]
    severities = [r.severity for _, r in results if not r.passed] or [AssetCheckSeverity.WARN]
    metas = [dict(r.metadata or {}) for _, r in results]
    return AssetCheckResult(
        passed=not failing,
        severity=AssetCheckSeverity.ERROR if AssetCheckSeverity.ERROR in severities else severities[0],
        metadata={**merged_metadata(metas, [1.0] * len(metas)), "batch_drops": len(results), "failing_drops": failing or "none"})
