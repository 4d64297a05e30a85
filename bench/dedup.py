"""Dedup at scale: 1,000,000 synthetic clips (8 PDQ hashes each + 256-d embeddings) with planted
near-duplicate clusters, deduplicated by vidassets' own incremental code path
(``vidassets.curate.dedup.update``) on this machine.

    python bench/dedup.py [--clips 1000000] [--partitions 20] [--clusters 50000]

Planted clusters have 2-4 members. A member's frames are its cluster's base hashes with 4-12 random
bits flipped (so members differ by up to 24 bits, like re-encodes), and its embedding is the base
vector plus noise (cosine to the base ~0.98). Everything else is independent random data.
Reports wall time, peak RSS, and recall of planted pairs (both members in one group), per method.
Targets: < 10 min, < 8 GiB, recall >= 0.99.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import pandas as pd

from vidassets.config import DedupSettings
from vidassets.curate import dedup

FRAMES = 8
DIM = 256


def make_partition(rng: np.random.Generator, first_clip: int, n: int, cluster_of: np.ndarray,
                   base_hashes: np.ndarray, base_vectors: np.ndarray) -> dedup.PartitionFeatures:
    ids = np.arange(first_clip, first_clip + n)
    hashes = rng.integers(0, 256, size=(n, FRAMES, 32), dtype=np.uint8)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    planted = cluster_of[ids] >= 0
    for row in np.flatnonzero(planted):
        c = cluster_of[ids[row]]
        frames = np.unpackbits(base_hashes[c], axis=1)
        for f in range(FRAMES):
            flips = rng.choice(256, size=rng.integers(4, 13), replace=False)
            frames[f, flips] ^= 1
        hashes[row] = np.packbits(frames, axis=1)
        vectors[row] = base_vectors[c] + 0.2 * rng.standard_normal(DIM).astype(np.float32) / np.sqrt(DIM)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    clip_ids = [f"c{i:09d}" for i in ids]
    clips = pd.DataFrame({"clip_id": clip_ids, "asset_id": clip_ids, "source_shard": "bench/p",
                          "first_frame": 0, "last_frame": FRAMES - 1})
    flat = hashes.reshape(-1, 32)
    frames = pd.DataFrame({"asset_id": np.repeat(clip_ids, FRAMES), "frame_index": np.tile(np.arange(FRAMES), n),
                           "pdq_hash": [h.tobytes().hex() for h in flat]})
    embeddings = pd.DataFrame({"clip_id": clip_ids, "status": "ok", "dim": DIM,
                               "vector": [v.astype("<f4").tobytes() for v in vectors]})
    return dedup.PartitionFeatures(clips, frames, embeddings)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clips", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--clusters", type=int, default=50_000)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    n = args.clips
    # plant clusters of 2-4 members on random clips
    cluster_of = np.full(n, -1, np.int64)
    sizes = rng.integers(2, 5, size=args.clusters)
    members = rng.permutation(n)[: sizes.sum()]
    cluster_of[members] = np.repeat(np.arange(args.clusters), sizes)
    base_hashes = rng.integers(0, 256, size=(args.clusters, FRAMES, 32), dtype=np.uint8)
    base_vectors = rng.standard_normal((args.clusters, DIM)).astype(np.float32)
    base_vectors /= np.linalg.norm(base_vectors, axis=1, keepdims=True)
    per = n // args.partitions
    bounds = {f"bench/p{i:04d}": (i * per, n if i == args.partitions - 1 else (i + 1) * per) for i in range(args.partitions)}
    generate_seconds = 0.0

    def load(part: str) -> dedup.PartitionFeatures:
        nonlocal generate_seconds
        started = time.perf_counter()
        lo, hi = bounds[part]
        feats = make_partition(rng, lo, hi - lo, cluster_of, base_hashes, base_vectors)
        generate_seconds += time.perf_counter() - started
        return feats

    started = time.perf_counter()
    state, done = dedup.update(dedup.DedupState(), "bench", {p: "v1" for p in bounds}, load, DedupSettings())
    wall = time.perf_counter() - started - generate_seconds
    started = time.perf_counter()
    rows = dedup.group_rows(state, "bench")
    rows_seconds = time.perf_counter() - started
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
    pdq_group = np.array([r["pdq_group"] for r in rows])
    sem_group = np.array([r["semantic_group"] for r in rows])
    index_of = {c: i for i, c in enumerate(state.clip_ids)}
    order = np.array([index_of[f"c{i:09d}"] for i in range(n)])
    by_cluster = pd.Series(np.arange(n))[cluster_of >= 0].groupby(cluster_of[cluster_of >= 0]).apply(list)
    total = pdq_hit = sem_hit = 0
    for group in by_cluster:
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                a, b = order[group[i]], order[group[j]]
                total += 1
                pdq_hit += pdq_group[a] == pdq_group[b]
                sem_hit += sem_group[a] == sem_group[b]
    planted_clips = int((cluster_of >= 0).sum())
    false_pdq = sum(1 for r in rows if r["pdq_group_size"] > 1) - planted_clips
    print(f"clips {n:,} ({n * FRAMES:,} PDQ hashes, {DIM}-d embeddings), {args.partitions} partitions, "
          f"{args.clusters:,} planted clusters ({total:,} planted pairs)")
    print(f"dedup wall {wall:.1f} s (+ group table {rows_seconds:.1f} s; data generation {generate_seconds:.1f} s excluded)")
    print(f"peak RSS {peak_gib:.2f} GiB (includes the generated data)")
    print(f"links: perceptual {done['perceptual_links']:,}, semantic {done['semantic_links']:,}")
    print(f"recall of planted pairs: perceptual {pdq_hit / total:.4f}, semantic {sem_hit / total:.4f}")
    print(f"clips grouped beyond the planted ones (perceptual): {max(false_pdq, 0)}")


if __name__ == "__main__":
    main()
