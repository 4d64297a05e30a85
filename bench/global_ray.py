"""The global stages' work on Ray as the clips grow: a time and memory model fitted at two sizes,
checked at a third, projected to 10^9 clips (issue 43, item 3).

    python bench/global_ray.py [--fit 20000,100000] [--check 400000] [--dim 1280] [--cpus 2]

What a full rebuild of the global stages computes (a version bump: every clip is new), through the
stages' own engine functions on a local Ray cluster of ``--cpus`` CPUs (``RayEngine``: one task per
item, the compute put in the object store once):

- ``dedup`` band join among the new clips (``dedup._among_new``: tasks of ``TABLES_PER_TASK`` of
  the 135 planned tables over every frame's band keys), the exact check of its candidate pairs
  (``dedup.pair_shares``: batches of ``PAIRS_PER_TASK`` pairs carrying their clips' frames) and the
  semantic neighbour search (``dedup.nearest``: every clip's ``semantic_k`` + 1 nearest, slices of
  ``SEMANTIC_SLICE`` vectors each its own index);
- ``clip_clusters``' assignment (``clusters.assign_drops``: one task per drop, each reading its
  drop's embeddings from a parquet file where it runs);
- ``decontamination``'s matching (``EvalMatch``: every clip's frames and vectors against an eval set
  of ``--eval-assets`` assets).

Synthetic clips: 8 PDQ hashes each, 5% planted near-copy pairs (Hamming 24, found by the join and
verified), vectors around 2,000 centres; drops of ``--drop-clips`` clips. Per part: the wall time,
the driver's CPU, the peak resident memory of the driver and of the busiest Ray worker, the bytes the
driver holds per clip. The model per part is ``b * n^p`` seconds fitted at the ``--fit`` sizes (two or more; the
exponent measured), checked against the ``--check`` size (error stated),
then projected to 10^7 and 10^9 clips on the stated cluster (``--cluster-cpus`` CPUs, the measured
per-CPU throughput; memory: the driver's arrays at that size, which is what bounds the present code).

Writes bench/results/global_ray.json; the target (model error <= 25% at the check size) is met or
not met per part, and what 10^7 clips would hold in memory is stated against this machine's.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import REPO, cpu_seconds, write_results

from vidassets.config import ClusterSettings, DecontaminationSettings, DedupSettings
from vidassets.curate import clusters, dedup
from vidassets.curate.decontamination import EvalMatch
from vidassets.media.fingerprint import band_keys
from vidassets.runtime.engine import RayEngine, all_or_fail
from vidassets.storage.rows import RowVersion

MEASURES = ("vidassets.curate.dedup", "vidassets.curate.clusters", "vidassets.curate.decontamination",
            "vidassets.runtime.engine", "vidassets.media.fingerprint")
"""The code these figures describe (their results go stale when it changes: docs/gen.py)."""

FRAMES = 8
TARGET_ERROR = 0.25
PARTS = ("band_keys", "band_join", "pair_check", "neighbour_search", "cluster_assignment", "decontamination")
IN_DRIVER = {"band_keys"}
"""Parts the step's own process computes (dedup keys every new frame before it hands the join out):
they do not spread over a cluster."""


def clips_of(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hashes (n*8, 32) uint8, owner, vectors (n, dim) float32 unit-norm) with planted pairs."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 256, size=(n * FRAMES, 32), dtype=np.uint8)
    for c in range(int(n * 0.05 / 2)):  # clip 2c+1 a near copy of clip 2c: 24 of 256 bits flipped per frame
        bits = np.unpackbits(hashes[2 * c * FRAMES:(2 * c + 1) * FRAMES], axis=1)
        flip = np.argsort(rng.random(bits.shape), axis=1)[:, :24]
        np.put_along_axis(bits, flip, 1 - np.take_along_axis(bits, flip, axis=1), axis=1)
        hashes[(2 * c + 1) * FRAMES:(2 * c + 2) * FRAMES] = np.packbits(bits, axis=1)
    owner = np.repeat(np.arange(n, dtype=np.int64), FRAMES)
    centres = rng.standard_normal((2000, dim)).astype(np.float32)
    vectors = np.empty((n, dim), np.float32)
    for lo in range(0, n, 100_000):
        hi = min(n, lo + 100_000)
        vectors[lo:hi] = centres[rng.integers(0, len(centres), hi - lo)] + rng.standard_normal((hi - lo, dim),
                                                                                                dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return hashes, owner, vectors


class ParquetDrops:
    """A drop's ``clip_embeddings`` rows from its parquet file (picklable: read where the task runs)."""

    def __init__(self, root: str):
        self.root = root

    def __call__(self, part: str) -> pd.DataFrame:
        return pd.read_parquet(f"{self.root}/{part}.parquet")


def write_drops(root: Path, vectors: np.ndarray, drop_clips: int) -> list[str]:
    drops = []
    for d, lo in enumerate(range(0, len(vectors), drop_clips)):
        part = f"d{d:06d}"
        chunk = vectors[lo:lo + drop_clips]
        pd.DataFrame({"clip_id": [f"{part}-c{i:06d}" for i in range(len(chunk))], "asset_id": "a", "source_shard": part,
                      "status": "ok", "dim": chunk.shape[1], "vector": [v.tobytes() for v in chunk],
                      "producer_version": "e"}).to_parquet(root / f"{part}.parquet")
        drops.append(part)
    return drops


def worker_peak_mib(ray) -> float:
    """The largest peak resident memory of the cluster's worker processes so far (MiB)."""

    @ray.remote(num_cpus=0)
    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    # every worker process that ran a task reports its own peak; idle workers are started fresh (small)
    return max(ray.get([peak.remote() for _ in range(8)]))


def timed(part: str, out: dict, fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), cpu_seconds()
    found = fn(*args, **kwargs)
    out[part] = {"wall_s": round(time.perf_counter() - wall, 3), "driver_cpu_s": round(cpu_seconds() - cpu, 3)}
    print(f"  {part}: {out[part]['wall_s']} s", flush=True)
    return found


def one_size(n: int, args, engine: RayEngine, ray) -> dict:
    settings, tables = DedupSettings(), dedup.lsh_tables(DedupSettings().max_hamming)
    hashes, owner, vectors = clips_of(n, args.dim, seed=n)
    out: dict = {}
    keys = timed("band_keys", out, band_keys, hashes, np.stack(dedup.lsh_plan(tables)))
    pairs = timed("band_join", out, dedup._among_new, keys, owner, engine)
    held = {"hashes": hashes.nbytes, "band_keys": keys.nbytes, "vectors": vectors.nbytes}
    del keys
    shares = timed("pair_check", out, dedup.pair_shares, hashes, owner, pairs, settings.max_hamming, engine)
    planted = int(n * 0.05 / 2)
    linked = pairs[shares >= settings.min_frame_share]
    found = int(np.sum((linked[:, 1] == linked[:, 0] + 1) & (linked[:, 0] % 2 == 0) & (linked[:, 1] < 2 * planted)))
    k = settings.semantic_k + 1
    timed("neighbour_search", out, dedup.nearest, vectors, np.arange(n), np.arange(n), k, engine)
    with tempfile.TemporaryDirectory(dir=args.work) as root:
        drops = write_drops(Path(root), vectors, args.drop_clips)
        c = ClusterSettings()
        centroids = clusters.train(vectors[:c.train_sample], c)
        task = functools.partial(clusters.assign_drops, ParquetDrops(root), centroids, RowVersion("p", "i"))
        rows = timed("cluster_assignment", out, all_or_fail, task, [[d] for d in drops], engine, "assignment")
        assigned = sum(len(r["rows"]) for r in rows)
    rng, assets = np.random.default_rng(1), min(args.eval_assets, n)
    eval_hashes = rng.integers(0, 256, size=(assets * FRAMES, 32), dtype=np.uint8)
    eval_owner = [f"e{i}" for i in range(assets) for _ in range(FRAMES)]
    eval_vectors = vectors[rng.choice(n, assets, replace=False)]  # eval copies of training clips: found
    match = EvalMatch(hashes, owner, vectors, np.arange(n), DecontaminationSettings().max_hamming)
    slices = [("hashes", eval_hashes, eval_owner), ("vectors", eval_vectors, [f"e{i}" for i in range(assets)])]
    matched = timed("decontamination", out, all_or_fail, match, slices, engine, "matching")
    out["checks"] = {"candidate_pairs": len(pairs), "planted_pairs": planted, "planted_found": found,
                     "clips_assigned": assigned, "eval_vector_matches": int(sum(v >= 0.999 for v in matched[1]["value"]))}
    out["driver_bytes_per_clip"] = {k: round(v / n, 1) for k, v in held.items()}
    out["driver_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["worker_peak_mib"] = round(worker_peak_mib(ray))
    return out


def state_bytes_per_clip(hashes: np.ndarray, vectors: np.ndarray, drops: int, root: str) -> dict:
    """Dedup's stored state per clip (its SQL database: clips with their hashes, postings, vectors,
    groups) after ``dedup.update`` took the clips as ``drops`` drops, one run each (as drops land)."""
    from vidassets.curate.dedup_state import DedupState

    n = len(vectors)
    per = n // drops
    parts = {}
    for d in range(drops):
        part, clips = f"d{d:04d}", range(d * per, (d + 1) * per)
        ids, assets = [f"d{d:04d}-c{c}" for c in clips], [f"a{c}".ljust(64, "0") for c in clips]
        parts[part] = dedup.PartitionFeatures(
            pd.DataFrame({"clip_id": ids, "asset_id": assets, "source_shard": part, "first_frame": 0,
                          "last_frame": FRAMES - 1}),
            pd.DataFrame({"asset_id": np.repeat(assets, FRAMES), "frame_index": np.tile(np.arange(FRAMES), per),
                          "pdq_hash": [h.tobytes().hex() for h in hashes[clips.start * FRAMES:clips.stop * FRAMES]]}),
            pd.DataFrame({"clip_id": ids, "status": "ok", "dim": vectors.shape[1],
                          "vector": [v.tobytes() for v in vectors[clips.start:clips.stop]]}))
    path = Path(root) / "dedup.sqlite"
    state = DedupState(f"sqlite:///{path}")
    started = time.perf_counter()
    for d in range(drops):
        dedup.update(state, "v", {p: "1" for p in list(parts)[:d + 1]}, parts.__getitem__, DedupSettings())
    state.database.engine.dispose()
    size = path.stat().st_size
    return {"clips": drops * per, "drops": drops, "bytes_per_clip": round(size / (drops * per)),
            "postings_per_clip": round(_postings(path) / (drops * per), 1),
            "updates_wall_s": round(time.perf_counter() - started, 1)}


def _postings(path: Path) -> int:
    import sqlite3

    from vidassets.curate.dedup_state import POSTING_LEVELS

    with sqlite3.connect(path) as db:
        return sum(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table, _ in POSTING_LEVELS)


def fit(sizes: list[int], figures: dict, part: str) -> tuple[float, float]:
    """(b, p) of wall = b * n^p, least squares in log-log over the fitted sizes (through both at
    two; three or more keep one noisy size from deciding the exponent): the exponent is measured,
    not assumed (the band join sorts, n log n; random LSH candidates grow as n^2 and with them the
    pair check; the neighbour search probes lists of sqrt(n) vectors per query, n^1.5)."""
    x = np.log(np.asarray(sizes, np.float64))
    y = np.log(np.asarray([figures[str(n)][part]["wall_s"] for n in sizes], np.float64))
    p, log_b = np.polyfit(x, y, 1)
    return float(math.exp(log_b)), float(p)


def predict(bp: tuple[float, float], part: str, n: float) -> float:
    """The model's wall seconds at ``n`` clips. Past ``SEMANTIC_SLICE`` vectors the neighbour
    search is one index per slice and every query searches every slice: each slice costs what one
    of ``SEMANTIC_SLICE`` does, n / slice of them for n queries each, so the cost grows as n^2."""
    b, p = bp
    if part == "neighbour_search" and n > dedup.SEMANTIC_SLICE:
        return b * dedup.SEMANTIC_SLICE ** p * (n / dedup.SEMANTIC_SLICE) ** 2
    return b * n ** p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit", default="20000,100000")
    parser.add_argument("--check", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    parser.add_argument("--drop-clips", type=int, default=1000)
    parser.add_argument("--eval-assets", type=int, default=2000)
    parser.add_argument("--state-clips", type=int, default=20_000, help="clips taken into a real dedup state")
    parser.add_argument("--cluster-cpus", type=int, default=1600, help="the cluster projected to: 100 nodes x 16 CPUs")
    parser.add_argument("--work", default=None, help="where the drops' parquet files go (default: the temp dir)")
    args = parser.parse_args()
    import ray

    started = time.perf_counter()
    ray.init(num_cpus=args.cpus, log_to_driver=False, include_dashboard=False)
    engine = RayEngine()
    sizes = [int(s) for s in args.fit.split(",")]
    one_size(1000, args, engine, ray)  # warm-up: the workers start and import once, outside the figures
    figures = {}
    for n in [*sizes, args.check]:
        print(f"{n} clips", flush=True)
        figures[str(n)] = one_size(n, args, engine, ray)
    models, verdict, projection = {}, {}, {}
    for part in PARTS:
        bp = fit(sizes, figures, part)
        measured = figures[str(args.check)][part]["wall_s"]
        predicted = predict(bp, part, args.check)
        error = abs(predicted - measured) / measured
        models[part] = {"b_s": bp[0], "exponent": round(bp[1], 3), f"predicted_s_at_{args.check}": round(predicted, 3)}
        verdict[f"{part} model error at {args.check}"] = {"error": round(error, 3), "target": TARGET_ERROR,
                                                          "met": error <= TARGET_ERROR}
        # a Ray part's CPU-seconds here (wall x CPUs) spread over the cluster's CPUs; a driver part as is
        spread = 1 if part in IN_DRIVER else args.cpus / args.cluster_cpus
        projection[part] = {f"{n:.0e}": {"cluster_wall_h": round(predict(bp, part, n) * spread / 3600, 3)}
                            for n in (1e7, 1e9)}
    hashes, _, vectors = clips_of(args.state_clips, args.dim, seed=3)
    with tempfile.TemporaryDirectory(dir=args.work) as root:
        state = state_bytes_per_clip(hashes, vectors, args.state_clips // args.drop_clips, root)
    print(f"dedup state: {state}", flush=True)
    per_clip = figures[str(args.check)]["driver_bytes_per_clip"]
    memory = {f"{n:.0e}": {"driver_gib": round(sum(per_clip.values()) * n / 2**30, 1),
                           "dedup_state_tib": round(state["bytes_per_clip"] * n / 2**40, 2)} for n in (1e7, 1e9)}
    machine_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    verdict["10^7 clips fit this machine's memory in one driver"] = {
        "driver_gib": memory["1e+07"]["driver_gib"], "machine_gib": round(machine_gib, 1),
        "met": memory["1e+07"]["driver_gib"] < machine_gib}
    out = {"figures": figures, "dedup_state": state, "models": models, "projection": projection, "memory": memory,
           "cluster": {"cpus": args.cluster_cpus, "measured_cpus": args.cpus}, "wall_s": round(time.perf_counter() - started, 1)}
    write_results(REPO / "bench/results/global_ray.json", sys.argv, out, verdict, settings=vars(args))
    print(json.dumps({"models": models, "verdict": verdict, "projection": projection, "memory": memory}, indent=1))


if __name__ == "__main__":
    main()
