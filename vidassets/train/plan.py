"""The deterministic training plan: a pure function of (snapshot samples, mixture, seed, global
batch) that says which samples every global step holds; ranks take fixed slices of each step.

- Every step is one shape bucket (all ranks get the same tensor shape). Buckets follow a fixed,
  smoothly interleaved cycle proportional to their sample counts.
- Inside a step, streams are stratified: each stream gets its weight's share of the global batch
  within +-1 sample (largest remainder), among the streams present in that bucket.
- Every (bucket, stream) queue has its own epoch counter; each epoch is a fresh seeded order
  (shards permuted, then a seeded shuffle inside each shard: a bounded shuffle buffer of one shard).
- Random access: step S's samples are computed from S directly (occurrences of its bucket before S
  come from the cycle's prefix counts), so resuming at step 10^6 costs what step 0 costs.
- Elastic: the global sequence does not depend on the world size; rank r of W takes positions
  r, r+W, r+2W, ... of each step's batch (the global batch must be divisible by W).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

VERSION = "plan-v1"


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()[:8], "little")


@dataclass(frozen=True)
class Mixture:
    weights: Mapping[str, float]  # stream -> weight
    max_epochs: Mapping[str, float] = field(default_factory=dict)  # stream -> epochs it may repeat, optional

    def digest(self) -> str:
        return hashlib.sha256(repr(sorted(self.weights.items())).encode()).hexdigest()[:12]


@dataclass
class StepSlice:
    step: int
    bucket: str
    clip_ids: list[str]  # the whole global batch, canonical order
    streams: list[str]
    epochs: list[int]


class TrainPlan:
    def __init__(self, samples: pd.DataFrame, mixture: Mixture, seed: int, global_batch: int,
                 snapshot_version: int, cycle_length: int = 1000):
        if global_batch < 1:
            raise ValueError("global_batch must be >= 1")
        unknown = sorted(set(samples.stream) - set(mixture.weights))
        if unknown:
            raise ValueError(f"mixture has no weight for stream(s) {unknown}")
        self.seed, self.global_batch, self.snapshot = seed, global_batch, snapshot_version
        self.mixture = mixture
        self.samples = samples
        # queues: (bucket, stream) -> shards -> clip ids (shard order as written, canonical)
        self.queues: dict[tuple[str, str], list[list[str]]] = {}
        shard_col = "shard" if "shard" in samples else None
        for (bucket, stream), group in samples.sort_values("clip_id").groupby(["bucket", "stream"]):
            if mixture.weights.get(stream, 0) <= 0:
                continue
            if shard_col:
                shards = [list(g.clip_id) for _, g in group.groupby(shard_col, sort=True)]
            else:
                shards = [list(group.clip_id)]
            self.queues[(bucket, stream)] = shards
        self.queue_sizes = {k: sum(len(s) for s in shards) for k, shards in self.queues.items()}
        self.buckets = sorted({b for b, _ in self.queues})
        if not self.buckets:
            raise ValueError("no samples with a positive mixture weight")
        sizes = np.array([sum(len(s) for (b, _), q in self.queues.items() if b == bucket for s in q)
                          for bucket in self.buckets], dtype=float)
        self.cycle = _smooth_cycle(sizes / sizes.sum(), cycle_length)
        counts = np.zeros((len(self.cycle) + 1, len(self.buckets)), dtype=np.int64)
        for i, b in enumerate(self.cycle):
            counts[i + 1] = counts[i]
            counts[i + 1, b] += 1
        self._prefix = counts
        self.quotas = {bucket: self._quotas(bucket) for bucket in self.buckets}

    def _quotas(self, bucket: str) -> dict[str, int]:
        streams = sorted(s for b, s in self.queues if b == bucket)
        w = np.array([self.mixture.weights[s] for s in streams], dtype=float)
        exact = w / w.sum() * self.global_batch
        base = np.floor(exact).astype(int)
        order = np.argsort(-(exact - base), kind="stable")
        for i in order[: self.global_batch - base.sum()]:
            base[i] += 1
        return dict(zip(streams, base.tolist(), strict=True))

    def bucket_at(self, step: int) -> tuple[str, int]:
        """(bucket, how many earlier steps used it)."""
        n = len(self.cycle)
        b = self.cycle[step % n]
        before = (step // n) * self._prefix[n, b] + self._prefix[step % n, b]
        return self.buckets[b], int(before)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - plans are few and long-lived
    def _epoch_order(self, bucket: str, stream: str, epoch: int) -> tuple[str, ...]:
        shards = self.queues[(bucket, stream)]
        rng = np.random.default_rng(_seed(self.seed, self.snapshot, bucket, stream, epoch))
        out: list[str] = []
        for shard in rng.permutation(len(shards)):
            items = shards[shard]
            out.extend(items[i] for i in rng.permutation(len(items)))
        return tuple(out)

    def step(self, step: int) -> StepSlice:
        bucket, before = self.bucket_at(step)
        clip_ids, streams, epochs = [], [], []
        for stream, quota in self.quotas[bucket].items():
            size = self.queue_sizes[(bucket, stream)]
            for k in range(quota):
                position = before * quota + k
                epoch, index = divmod(position, size)
                clip_ids.append(self._epoch_order(bucket, stream, epoch)[index])
                streams.append(stream)
                epochs.append(epoch)
        # interleave streams deterministically so each rank's slice is mixed too
        order = np.random.default_rng(_seed(self.seed, "interleave", step)).permutation(len(clip_ids))
        return StepSlice(step, bucket, [clip_ids[i] for i in order], [streams[i] for i in order],
                         [epochs[i] for i in order])

    def rank_batch(self, step: int, rank: int, world_size: int) -> list[str]:
        if self.global_batch % world_size:
            raise ValueError(f"global batch {self.global_batch} is not divisible by world size {world_size}")
        return self.step(step).clip_ids[rank::world_size]

    def epochs_at(self, step: int) -> dict[str, float]:
        """Epochs each stream has consumed (max over its buckets) after ``step`` steps."""
        out: dict[str, float] = {}
        n = len(self.cycle)
        for bucket, stream in self.queues:
            b = self.buckets.index(bucket)
            used = ((step // n) * self._prefix[n, b] + self._prefix[step % n, b]) * self.quotas[bucket][stream]
            out[stream] = max(out.get(stream, 0.0), used / self.queue_sizes[(bucket, stream)])
        return out

    def over_repeated(self, steps: int) -> dict[str, float]:
        """Streams that would exceed their ``max_epochs`` within ``steps`` steps."""
        epochs = self.epochs_at(steps)
        return {s: e for s, e in epochs.items() if s in self.mixture.max_epochs and e > self.mixture.max_epochs[s]}


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
        lines.append(f"{s}\t{sl.bucket}\t" + "\t".join(ranks))
    return ("\n".join(lines) + "\n").encode()
