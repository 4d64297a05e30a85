"""The deterministic training plan: a pure function of (snapshot samples, phases, seed, global
batch) that says which samples every global step holds; ranks take fixed slices of each step.

- Phases run one after the other (``PhaseSpec``: until a step, a mixture over streams, the tiers it
  admits); each phase has its own queues, so a phase starts a fresh pass over what it admits.
- Every step is one shape bucket (all ranks get the same tensor shape). A stream's weight is spread
  over the buckets it has samples in, in proportion to those samples; a bucket's frequency is the
  weight it holds, so the global share of every stream is its weight even when streams live in
  different buckets (images in 1-frame buckets, clips in others). Buckets follow a fixed, smoothly
  interleaved cycle.
- Inside a bucket, each stream's count per step comes from cumulative rounding down a balanced
  tree of streams: the counts of every stream over any run of steps are within a few samples of
  its exact share (a stream of weight 0.01 in a batch of 48 is served about every other step, not
  never), every step holds exactly the global batch, and the count of step n is computed from n
  directly.
- Every (phase, bucket, stream) queue has its own epoch counter; each epoch is a fresh seeded order
  (shards permuted, then a seeded shuffle inside each run of ``MIX_SHARDS`` shards: a bounded
  shuffle buffer of a few shards, which hold one source drop each).
- Caption variants: the caption level a sample shows is drawn per (sample, epoch) from the recipe's
  weights (``curriculum.caption_level``).
- Random access: step S's samples are computed from S directly, so resuming at step 10^6 costs what
  step 0 costs.
- Elastic: the global sequence does not depend on the world size; rank r of W takes positions
  r, r+W, r+2W, ... of each step's batch (the global batch must be divisible by W).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vidassets.curate.curriculum import caption_level

VERSION = "plan-v3"  # v2: phases, weight-proportional bucket frequencies, cumulative quotas, caption variants;
# v3: shuffled across MIX_SHARDS shards at a time, latents resolution per phase

MIX_SHARDS = 8
"""Shards shuffled together: a shard holds one source drop's samples (shards are shared across
snapshots per drop), so a step draws from several drops at once, as a loader's shuffle buffer over
several open shards would."""


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()[:8], "little")


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    start: int
    end: int | None  # first step after the phase; None = to the end of training
    weights: Mapping[str, float] = field(default_factory=dict)  # stream -> weight; empty = sample counts
    tiers: tuple[str, ...] | None = None  # selection tiers admitted; None = all
    max_epochs: Mapping[str, float] = field(default_factory=dict)
    resolution: int | None = None  # latents short side it trains at; None = the samples' primary (first configured)


def single_phase(weights: Mapping[str, float] | None = None, max_epochs: Mapping[str, float] | None = None) -> list[PhaseSpec]:
    return [PhaseSpec("all", 0, None, dict(weights or {}), None, dict(max_epochs or {}))]


@dataclass
class StepSlice:
    step: int
    phase: str
    bucket: str
    clip_ids: list[str]  # the whole global batch, canonical order
    streams: list[str]
    epochs: list[int]
    caption_levels: list[str]


class _Split:
    """Cumulative rounding of a total down a balanced binary tree of streams: ``counts(total)`` gives
    every stream's cumulative count, non-decreasing in ``total`` for each stream, summing to it."""

    def __init__(self, streams: Sequence[str], shares: Sequence[float]):
        self.streams = list(streams)
        self.shares = [float(s) for s in shares]

    def counts(self, total: int) -> dict[str, int]:
        out: dict[str, int] = {}

        def split(lo: int, hi: int, n: int) -> None:
            if hi - lo == 1:
                out[self.streams[lo]] = n
                return
            mid = (lo + hi) // 2
            left, whole = sum(self.shares[lo:mid]), sum(self.shares[lo:hi])
            k = min(n, math.floor(n * left / whole + 0.5)) if whole > 0 else 0
            split(lo, mid, k)
            split(mid, hi, n - k)

        split(0, len(self.streams), total)
        return out


def at_resolution(samples: pd.DataFrame, spec: PhaseSpec) -> pd.DataFrame:
    """The samples' rows (one per sample and latents resolution) a phase trains on: its resolution's,
    else each sample's primary. A ValueError names a resolution no sample has latents at."""
    if "resolution" not in samples:
        return samples
    if spec.resolution is None:
        return samples[samples.primary.astype(bool)]
    rows = samples[samples.resolution == spec.resolution]
    if not len(rows):
        have = sorted(int(r) for r in samples.resolution.dropna().unique())
        raise ValueError(f"phase {spec.name!r}: no sample has latents at resolution {spec.resolution} "
                         f"(the snapshot has {have or 'one unnamed resolution'}: add it to latents.resolutions)")
    return rows


class _Phase:
    """One phase's queues, bucket cycle and per-bucket stream splits."""

    def __init__(self, spec: PhaseSpec, samples: pd.DataFrame, global_batch: int, cycle_length: int):
        self.spec = spec
        admitted = at_resolution(samples, spec)
        admitted = admitted if spec.tiers is None else admitted[admitted.tier.isin(list(spec.tiers))]
        counts = admitted.stream.value_counts()
        weights = dict(spec.weights) or {str(s): float(n) for s, n in counts.items()}
        self.missing = sorted(s for s, w in weights.items() if w > 0 and s not in counts.index)
        self.weights = {s: float(w) for s, w in sorted(weights.items()) if w > 0 and s in counts.index}
        if not self.weights:
            raise ValueError(f"phase {spec.name!r}: no samples in any stream with a positive weight "
                             f"(weights {dict(spec.weights) or 'by count'}, streams present {sorted(counts.index)})")
        total = sum(self.weights.values())
        self.shares = {s: w / total for s, w in self.weights.items()}
        # queues: (bucket, stream) -> shards -> clip ids (shard order as written, canonical)
        self.queues: dict[tuple[str, str], list[list[str]]] = {}
        chosen = admitted[admitted.stream.isin(list(self.weights))]
        for (bucket, stream), group in chosen.sort_values("clip_id").groupby(["bucket", "stream"]):
            if "shard" in group:
                self.queues[(bucket, stream)] = [list(g.clip_id) for _, g in group.groupby("shard", sort=True)]
            else:
                self.queues[(bucket, stream)] = [list(group.clip_id)]
        self.sizes = {k: sum(len(s) for s in shards) for k, shards in self.queues.items()}
        per_stream = {s: sum(n for (_, st), n in self.sizes.items() if st == s) for s in self.weights}
        self.buckets = sorted({b for b, _ in self.queues})
        # the weight each stream puts in each bucket: its share, spread by where its samples are
        mass = {b: {s: self.shares[s] * self.sizes[(b, s)] / per_stream[s]
                    for s in self.weights if (b, s) in self.sizes} for b in self.buckets}
        frequency = np.array([sum(mass[b].values()) for b in self.buckets])
        self.cycle = _smooth_cycle(frequency / frequency.sum(), cycle_length)
        prefix = np.zeros((len(self.cycle) + 1, len(self.buckets)), dtype=np.int64)
        for i, b in enumerate(self.cycle):
            prefix[i + 1] = prefix[i]
            prefix[i + 1, b] += 1
        self._prefix = prefix
        self.global_batch = global_batch
        self.splits = {b: _Split(sorted(mass[b]), [mass[b][s] for s in sorted(mass[b])]) for b in self.buckets}

    def bucket_at(self, local_step: int) -> tuple[str, int]:
        """(bucket, how many earlier steps of this phase used it)."""
        n = len(self.cycle)
        b = self.cycle[local_step % n]
        before = (local_step // n) * self._prefix[n, b] + self._prefix[local_step % n, b]
        return self.buckets[b], int(before)

    def used(self, local_steps: int) -> dict[str, int]:
        """How many steps of each bucket the first ``local_steps`` steps hold."""
        n = len(self.cycle)
        return {bucket: int((local_steps // n) * self._prefix[n, b] + self._prefix[local_steps % n, b])
                for b, bucket in enumerate(self.buckets)}

    def served(self, bucket: str, occurrences: int) -> dict[str, int]:
        """Samples of each stream served by the first ``occurrences`` steps of ``bucket``."""
        return self.splits[bucket].counts(occurrences * self.global_batch)

    def epochs_after(self, local_steps: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for bucket, steps in self.used(local_steps).items():
            for stream, count in self.served(bucket, steps).items():
                out[stream] = max(out.get(stream, 0.0), count / self.sizes[(bucket, stream)])
        return out


class TrainPlan:
    def __init__(self, samples: pd.DataFrame, phases: Sequence[PhaseSpec], seed: int, global_batch: int,
                 snapshot_version: int, cycle_length: int = 1000, caption_variants: Mapping[str, float] | None = None,
                 caption_default: str = "level_1"):
        if global_batch < 1:
            raise ValueError("global_batch must be >= 1")
        if not phases:
            raise ValueError("a plan needs at least one phase")
        self.seed, self.global_batch, self.snapshot = seed, global_batch, snapshot_version
        self.samples = samples if "tier" in samples else samples.assign(tier=None)
        self.caption_variants, self.caption_default = dict(caption_variants or {}), caption_default
        self.phases = [_Phase(spec, self.samples, global_batch, cycle_length) for spec in phases]
        self.starts = [p.spec.start for p in self.phases]

    def phase_at(self, step: int) -> tuple[_Phase, int]:
        """(phase, step within it)."""
        i = max(0, int(np.searchsorted(self.starts, step, side="right")) - 1)
        return self.phases[i], step - self.starts[i]

    @functools.lru_cache(maxsize=256)  # noqa: B019 - plans are few and long-lived
    def _epoch_order(self, phase: str, bucket: str, stream: str, epoch: int) -> tuple[str, ...]:
        shards = next(p for p in self.phases if p.spec.name == phase).queues[(bucket, stream)]
        rng = np.random.default_rng(_seed(self.seed, self.snapshot, phase, bucket, stream, epoch))
        out: list[str] = []
        order = rng.permutation(len(shards))
        for start in range(0, len(order), MIX_SHARDS):  # a shuffle buffer of MIX_SHARDS shards
            items = [clip for shard in order[start:start + MIX_SHARDS] for clip in shards[shard]]
            out.extend(items[i] for i in rng.permutation(len(items)))
        return tuple(out)

    def quotas_at(self, step: int) -> dict[str, int]:
        phase, local = self.phase_at(step)
        bucket, before = phase.bucket_at(local)
        done, then = phase.served(bucket, before), phase.served(bucket, before + 1)
        return {s: then[s] - done[s] for s in then}

    def step(self, step: int) -> StepSlice:
        phase, local = self.phase_at(step)
        name = phase.spec.name
        bucket, before = phase.bucket_at(local)
        done, then = phase.served(bucket, before), phase.served(bucket, before + 1)
        clip_ids, streams, epochs, levels = [], [], [], []
        for stream in sorted(then):
            size = phase.sizes[(bucket, stream)]
            for position in range(done[stream], then[stream]):
                epoch, index = divmod(position, size)
                clip = self._epoch_order(name, bucket, stream, epoch)[index]
                clip_ids.append(clip)
                streams.append(stream)
                epochs.append(epoch)
                levels.append(caption_level(_seed(self.seed, name), clip, epoch, self.caption_variants,
                                            self.caption_default))
        # interleave streams deterministically so each rank's slice is mixed too
        order = np.random.default_rng(_seed(self.seed, "interleave", step)).permutation(len(clip_ids))
        return StepSlice(step, name, bucket, [clip_ids[i] for i in order], [streams[i] for i in order],
                         [epochs[i] for i in order], [levels[i] for i in order])

    def rank_batch(self, step: int, rank: int, world_size: int) -> list[str]:
        if self.global_batch % world_size:
            raise ValueError(f"global batch {self.global_batch} is not divisible by world size {world_size}")
        return self.step(step).clip_ids[rank::world_size]

    def epochs_at(self, step: int) -> dict[str, dict[str, float]]:
        """Phase -> epochs each stream has consumed in it (max over its buckets) after ``step`` steps."""
        out = {}
        for phase in self.phases:
            if step <= phase.spec.start:
                break
            end = step if phase.spec.end is None else min(step, phase.spec.end)
            out[phase.spec.name] = phase.epochs_after(end - phase.spec.start)
        return out

    def over_repeated(self, steps: int) -> dict[str, dict[str, float]]:
        """Phase -> streams that would exceed the phase's ``max_epochs`` within ``steps`` steps."""
        out = {}
        for phase in self.phases:
            epochs = self.epochs_at(steps).get(phase.spec.name, {})
            over = {s: e for s, e in epochs.items() if s in phase.spec.max_epochs and e > phase.spec.max_epochs[s]}
            if over:
                out[phase.spec.name] = over
        return out

    def describe(self) -> list[dict]:
        """Per phase: its steps, tiers, the stream shares it serves, streams named without samples,
        and its buckets."""
        return [{"phase": p.spec.name, "start": p.spec.start, "end": p.spec.end,
                 "tiers": list(p.spec.tiers) if p.spec.tiers is not None else None, "resolution": p.spec.resolution,
                 "shares": {s: round(v, 6) for s, v in p.shares.items()}, "streams_without_samples": p.missing,
                 "buckets": p.buckets, "cycle_length": len(p.cycle)} for p in self.phases]


def _smooth_cycle(shares: np.ndarray, length: int) -> list[int]:
    """A cycle of ``length`` bucket indices with each bucket's count proportional to its share and
    occurrences spread evenly (smooth weighted round robin)."""
    counts = np.maximum(1, np.round(shares * length)).astype(int)
    current = np.zeros(len(shares))
    total = counts.sum()
    cycle = []
    for _ in range(total):
        current += counts
        i = int(np.argmax(current))
        cycle.append(i)
        current[i] -= total
    return cycle


def plan_bytes(plan: TrainPlan, steps: Sequence[int], world_size: int) -> bytes:
    """Canonical serialisation of the given steps (for equality checks and manifests)."""
    lines = []
    for s in steps:
        sl = plan.step(s)
        ranks = [",".join(sl.clip_ids[r::world_size]) for r in range(world_size)]
        lines.append(f"{s}\t{sl.phase}\t{sl.bucket}\t" + "\t".join(ranks))
    return ("\n".join(lines) + "\n").encode()
