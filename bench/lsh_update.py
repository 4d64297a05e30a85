"""Perceptual dedup's LSH candidates for one new drop against a large stored state: keys narrowed
while they are built against every stored frame's whole keys (the baseline), side by side in one
process.

    python bench/lsh_update.py [--stored-clips 1000000] [--new-clips 100 1000 50000] [--baseline-rev d795059]

Past ``EXACT_LIMIT`` sampled frames, ``dedup.update`` proposes candidate clip pairs with 65 bit-sampling
tables of 28 bits (``lsh_tables`` at the default ``max_hamming``). The baseline (``_lsh_candidates``
of ``--baseline-rev``, loaded from git into this process) builds every table's key for every stored
frame at each update; now a stored frame is dropped as soon as its partial key matches no new
frame's. Synthetic: ``--stored-clips`` clips of 8 random PDQ hashes, then a new drop of each size in
``--new-clips`` whose first half are near copies of stored clips (every frame 16 bits off). Reported
per drop size: CPU and wall seconds of each, their ratio, the pairs (asserted equal) and the planted
copies found.

The last line is the figures as JSON (also written under "figures" to ``--out``,
bench/results/lsh_update.json; no target is stated, so its verdict is empty).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from common import REPO, cpu_seconds, module_at, write_results

from vidassets.config import DedupSettings
from vidassets.curate import dedup

FRAMES = 8


def state(stored: int, new: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, set[tuple[int, int]]]:
    hashes = rng.integers(0, 256, size=((stored + new) * FRAMES, 32), dtype=np.uint8)
    planted = set()
    for i in range(new // 2):
        source = int(rng.integers(stored))
        bits = np.unpackbits(hashes[source * FRAMES:(source + 1) * FRAMES], axis=1)
        for line in bits:
            line[rng.choice(256, 16, replace=False)] ^= 1
        hashes[(stored + i) * FRAMES:(stored + i + 1) * FRAMES] = np.packbits(bits, axis=1)
        planted.add((source, stored + i))
    return hashes, np.repeat(np.arange(stored + new, dtype=np.int64), FRAMES), planted


def timed(fn, *args) -> tuple[np.ndarray, float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    out = fn(*args)
    return out, round(cpu_seconds() - cpu, 2), round(time.perf_counter() - wall, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stored-clips", type=int, default=1_000_000)
    parser.add_argument("--new-clips", type=int, nargs="+", default=[100, 1000, 50_000])
    parser.add_argument("--baseline-rev", default="d795059")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "lsh_update.json"))
    args = parser.parse_args()
    before = module_at(args.baseline_rev, "vidassets/curate/dedup.py")._lsh_candidates
    tables = dedup.lsh_tables(DedupSettings().max_hamming)
    report = {"stored_clips": args.stored_clips, "frames_per_clip": FRAMES, "tables": tables, "bits": dedup.LSH_BITS,
              "baseline_rev": args.baseline_rev, "drops": {}}
    for new in args.new_clips:
        hashes, owner, planted = state(args.stored_clips, new, np.random.default_rng(new))
        first_new = args.stored_clips
        old, old_cpu, old_wall = timed(before, hashes, owner, first_new, tables)
        now, now_cpu, now_wall = timed(dedup._lsh_candidates, hashes, owner, first_new, tables)
        assert np.array_equal(old, now), "narrowed keys must give the whole keys' pairs"
        found = {tuple(p) for p in now.tolist()}
        report["drops"][new] = {"baseline_cpu_s": old_cpu, "baseline_wall_s": old_wall, "now_cpu_s": now_cpu,
                                "now_wall_s": now_wall, "cpu_baseline_over_now": round(old_cpu / max(now_cpu, 1e-9), 1),
                                "pairs": len(found), "planted_found": sum(p in found for p in planted),
                                "planted": len(planted)}
        print(f"new drop of {new} clips: {json.dumps(report['drops'][new])}", flush=True)
    write_results(Path(args.out), sys.argv, report, {}, settings=vars(args))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
