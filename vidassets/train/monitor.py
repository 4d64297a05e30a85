"""The realized-stream monitor (no Dagster): what a plan actually serves over a window of steps.

For the sample sequence of steps [start, stop) (each step's global batch in canonical order) it
reports, for stream id, semantic cluster id and source asset id, the lag-k autocorrelation
*within* batches (sample i and i+k of one step) and *across* batches (the sample at one position
of step s and of step s+k); the clips served more than once inside the window; and each stream's
realized share against the share its phase configures. Chance agreement is taken within the shape
buckets of each pair (a batch is one bucket). A clip may repeat inside the window as
often as its queue's passes over the window force (a stream of 10 clips drawn 40 times in the window
serves each clip 4 times) plus ``max_repeats_in_window``; more is a finding. A categorical autocorrelation is
(P[x_t = x_t+k] - P_chance) / (1 - P_chance): 0 for independent draws, 1 when a value always
repeats, negative when values avoid each other.

``findings`` lists what breaks the recipe's ``curriculum.monitor`` limits; the plan's blocking asset
check fails on any.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

FIELDS = {"stream": "stream", "cluster": "cluster", "source": "asset_id"}


def categorical_autocorrelation(pairs: Sequence[tuple[Any, Any]], values: Sequence[Any],
                                groups: Sequence[tuple[Any, Any]] | None = None,
                                grouped_values: Sequence[tuple[Any, Any]] | None = None) -> float | None:
    """Autocorrelation of a categorical variable from the pairs at some lag. The chance that a pair
    agrees by itself comes from the values' marginal; with ``groups`` (the shape bucket of each
    pair's two samples) and ``grouped_values`` ((bucket, value) of every sample), from the marginals
    within those buckets: a bucket that holds one source only makes its batches one source by
    necessity, not by a bad order. None where no variation is possible."""
    if not pairs or not values:
        return None
    if groups is None or grouped_values is None:
        counts = np.array(list(Counter(values).values()), dtype=float)
        expected = float(((counts / counts.sum()) ** 2).sum())
    else:
        by_group: dict[Any, Counter] = {}
        for group, value in grouped_values:
            by_group.setdefault(group, Counter())[value] += 1
        share = {g: {v: n / sum(c.values()) for v, n in c.items()} for g, c in by_group.items()}
        agree: dict[tuple[Any, Any], float] = {}
        for key in set(groups):
            a, b = share.get(key[0], {}), share.get(key[1], {})
            agree[key] = sum(p * b.get(v, 0.0) for v, p in a.items())
        expected = sum(agree[key] for key in groups) / len(groups)
    if expected >= 1.0 - 1e-9:  # every pair must agree: no variation to correlate
        return None
    same = sum(a == b for a, b in pairs) / len(pairs)
    return round((same - expected) / (1.0 - expected), 4)


def inspect_plan(plan: Any, start: int, stop: int, limits: Any) -> dict[str, Any]:
    """The monitor's report for steps [start, stop) of ``plan`` under ``limits`` (a ``Monitor``)."""
    if stop <= start:
        raise ValueError(f"empty step window {start}:{stop}")
    attrs = plan.samples.drop_duplicates("clip_id").set_index("clip_id")  # (a row per latents resolution)
    lookup = {name: attrs[column].to_dict() if column in attrs else {} for name, column in FIELDS.items()}
    steps = [plan.step(s) for s in range(start, stop)]
    rows: dict[str, list[list[Any]]] = {name: [] for name in FIELDS}
    for sl in steps:
        rows["stream"].append(list(sl.streams))
        for name in ("cluster", "source"):
            rows[name].append([_clean(lookup[name].get(c)) for c in sl.clip_ids])
    autocorrelation: dict[str, dict[str, dict[int, float | None]]] = {}
    buckets = [sl.bucket for sl in steps]
    for name, batches in rows.items():
        flat = [v for batch in batches for v in batch]
        if all(v is None for v in flat):
            continue
        grouped = [(buckets[s], v) for s, batch in enumerate(batches) for v in batch]
        within, across = {}, {}
        for k in range(1, limits.max_lags + 1):
            pairs = [(s, i, s, i + k) for s, b in enumerate(batches) for i in range(len(b) - k)]
            within[k] = _autocorrelation(batches, buckets, pairs, flat, grouped)
            pairs = [(s, i, s + k, i) for s in range(len(batches) - k)
                     for i in range(min(len(batches[s]), len(batches[s + k])))]
            across[k] = _autocorrelation(batches, buckets, pairs, flat, grouped)
        autocorrelation[name] = {"within_batch": within, "across_batches": across}
    served = Counter(c for sl in steps for c in sl.clip_ids)
    # a queue smaller than what the window draws from it repeats its clips by necessity: a clip is
    # flagged when served more often than its queue's passes over the window allow
    passes: Counter[tuple[str, str, str]] = Counter()
    queue_of: dict[str, tuple[str, str, str]] = {}
    for sl in steps:
        phase = next(p for p in plan.phases if p.spec.name == sl.phase)
        for clip, stream in zip(sl.clip_ids, sl.streams, strict=True):
            key = (sl.phase, sl.bucket, stream)
            passes[key] += 1 / phase.sizes.get((sl.bucket, stream), 1)
            queue_of.setdefault(clip, key)
    allowed = {c: math.ceil(passes[queue_of[c]] - 1e-9) + limits.max_repeats_in_window for c in served}
    repeated = {c: n for c, n in served.items() if n > allowed[c]}
    realized = Counter(s for sl in steps for s in sl.streams)
    total = sum(realized.values())
    expected: Counter[str] = Counter()
    for sl in steps:  # each step weighs its phase's configured shares
        phase = next(p for p in plan.phases if p.spec.name == sl.phase)
        for stream, share in phase.shares.items():
            expected[stream] += share * len(sl.clip_ids)
    shares = {s: {"realized": round(realized.get(s, 0) / total, 4), "configured": round(expected[s] / total, 4)}
              for s in sorted(set(realized) | set(expected))}
    findings = []
    for name, parts in autocorrelation.items():
        for part, by_lag in parts.items():
            for k, r in by_lag.items():
                if r is not None and abs(r) > limits.max_autocorrelation:
                    findings.append(f"{name} lag-{k} autocorrelation {part.replace('_', ' ')} is {r:+.2f} "
                                    f"(limit {limits.max_autocorrelation:g})")
    if repeated:
        worst = max(repeated, key=lambda c: (repeated[c] - allowed[c], c))
        findings.append(f"{len(repeated)} clip(s) served more often than their stream's passes allow within "
                        f"{stop - start} steps (worst: {worst} {repeated[worst]}x, allowed "
                        f"{allowed[worst]}x)")
    for stream, s in shares.items():
        gap = abs(s["realized"] - s["configured"])
        if gap > limits.share_tolerance:
            findings.append(f"stream {stream} realized share {s['realized']:.4f} vs configured {s['configured']:.4f}")
    return {"steps": [start, stop], "samples": total, "phases": sorted({sl.phase for sl in steps}),
            "autocorrelation": autocorrelation, "max_repeats": max(served.values()) if served else 0,
            "repeated_clips": len(repeated), "repeated_examples": sorted(repeated, key=lambda c: (-repeated[c], c))[:10],
            "stream_shares": shares, "findings": findings, "passed": not findings,
            "limits": limits.model_dump() if hasattr(limits, "model_dump") else dict(limits)}


def _autocorrelation(batches: list[list[Any]], buckets: list[str], pairs: list[tuple[int, int, int, int]],
                     flat: list[Any], grouped: list[tuple[str, Any]]) -> float | None:
    return categorical_autocorrelation([(batches[s][i], batches[t][j]) for s, i, t, j in pairs], flat,
                                       [(buckets[s], buckets[t]) for s, _, t, _ in pairs], grouped)


def _clean(value: Any) -> Any:
    import pandas as pd

    if value is None or (np.ndim(value) == 0 and pd.isna(value)):  # None, NaN, pandas' NA
        return None
    return value.item() if hasattr(value, "item") else value


def plot_report(report: dict[str, Any], plan: Any, path: Any) -> None:
    """A PNG (to a path or a binary file) for the report: realized vs configured stream shares and
    the autocorrelation by lag."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    streams = list(report["stream_shares"])
    x = np.arange(len(streams))
    left.bar(x - 0.2, [report["stream_shares"][s]["configured"] for s in streams], 0.4, label="configured")
    left.bar(x + 0.2, [report["stream_shares"][s]["realized"] for s in streams], 0.4, label="realized")
    left.set_xticks(x, streams, rotation=30, ha="right")
    left.set_title(f"stream shares, steps {report['steps'][0]}:{report['steps'][1]}")
    left.legend()
    for name, parts in report["autocorrelation"].items():
        for part, style in (("within_batch", "-"), ("across_batches", "--")):
            lags = sorted(parts[part])
            right.plot(lags, [parts[part][k] if parts[part][k] is not None else np.nan for k in lags], style,
                       marker="o", label=f"{name} ({part.replace('_', ' ')})")
    limit = report["limits"]["max_autocorrelation"]
    right.axhline(limit, color="red", lw=0.8)
    right.axhline(-limit, color="red", lw=0.8)
    right.set_xlabel("lag")
    right.set_title("autocorrelation")
    right.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
