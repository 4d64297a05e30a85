"""Hashing throughput of raw_inventory vs `sha256sum` over the same files, in one run.

    python bench/inventory.py [--mb 512] [--reps 3]

Builds a drop in a temp dir: the real demo videos plus large random files (total ~--mb MB), one
tar shard holding copies of the videos (so tar member streaming is measured too). Both tools read
from a warm page cache; best of --reps runs each. Target: vidassets MB/s >= 0.8x sha256sum's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from common import write_results

from vidassets.config import IngestSettings, Settings
from vidassets.demo.bucket import fetch_samples
from vidassets.ingest.drops import Drop
from vidassets.ingest.inventory import inventory_drop
from vidassets.storage import LocalObjectStore, ReadOnlyBucket
from vidassets.versions import Versions

REPO = Path(__file__).resolve().parents[1]


def build_drop(root: Path, total_mb: int) -> list[Path]:
    drop = root / "raw/bench/drop-0001"
    drop.mkdir(parents=True)
    samples = fetch_samples(REPO / ".vidassets" / "cache")
    for name, path in samples.items():
        shutil.copyfile(path, drop / name)
    with tarfile.open(drop / "shard.tar", "w") as tar:
        for name, path in samples.items():
            tar.add(path, arcname=f"members/{name}")
    chunk = os.urandom(1 << 20)
    n_big = 4
    for i in range(n_big):
        with open(drop / f"big_{i}.mp4", "wb") as f:
            for j in range(total_mb // n_big):
                f.write(chunk[j % 7 :] + chunk[: j % 7])
    return sorted(p for p in drop.iterdir() if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bucket"
        files = build_drop(root, args.mb)
        total = sum(p.stat().st_size for p in files)
        subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        bucket = ReadOnlyBucket(LocalObjectStore(root))
        version = Versions(Settings()).own("raw_inventory")
        sha_best = ours_best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            subprocess.run(["sha256sum", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
            sha_best = min(sha_best, time.perf_counter() - t0)
            t0 = time.perf_counter()
            rows, stats = inventory_drop(bucket, Drop.from_key("bench/drop-0001"), IngestSettings(), version)
            ours_best = min(ours_best, time.perf_counter() - t0)
        assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
        mb = total / 1e6
        print(f"files: {len(files)} ({len(rows)} inventory rows incl. tar members), {mb:.0f} MB, best of {args.reps}")
        print(f"sha256sum          {mb / sha_best:8.1f} MB/s  ({sha_best:.2f} s)")
        print(f"vidassets inventory {mb / ours_best:7.1f} MB/s  ({ours_best:.2f} s)")
        ratio = sha_best / ours_best
        print(f"ratio vidassets / sha256sum = {ratio:.2f}  (target >= 0.80)")
    figures = {"files": len(files), "inventory_rows": len(rows), "mb": round(mb, 1), "reps": args.reps,
               "sha256sum": {"mb_per_s": round(mb / sha_best, 1), "seconds": round(sha_best, 3)},
               "vidassets_inventory": {"mb_per_s": round(mb / ours_best, 1), "seconds": round(ours_best, 3)},
               "ratio_vidassets_over_sha256sum": round(ratio, 3)}
    verdict = {"vidassets MB/s >= 0.8x sha256sum's": {"ratio": round(ratio, 3), "target": ">= 0.8",
                                                        "met": ratio >= 0.8}}
    write_results(REPO / "bench" / "results" / "inventory.json", sys.argv, figures, verdict, settings=vars(args))


if __name__ == "__main__":
    main()
