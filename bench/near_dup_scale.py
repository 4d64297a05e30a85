"""What one new drop's near-duplicate decision costs as the drops before it grow: through the
persistent near-duplicate index (now) against reading every older drop (the stage before it), side
by side in one process on the same local store.

    python bench/near_dup_scale.py [--drops 100 1000 3000] [--videos 10] [--seconds 10] [--new-drops 5]

The store grows drop by drop as the stage grows it: each older drop's ``video_fingerprints``
partition, its fingerprint pack and one fingerprint blob per video (random PDQ-sized hashes, a 2 fps
grid: 20 samples x 3 kinds for 10-s videos), and the index updated with ``put_drop`` (timed: the
write a drop's run adds). At each size, ``--new-drops`` new drops are decided (not stored), each of
``--videos`` videos of which two copy an older video (every hash 16 bits off): both ways must find the
same 2 near-duplicates and align the same pairs (checked).

- **now**: ``NearDuplicateIndex.sync`` against one listing of the partitions (nothing to re-index),
  then ``decide`` through a ``Neighbourhood``: the index's candidates and groups, the rows and
  packs of their drops only.
- **every drop** (the stage at the commit before the index): every older partition read
  (``read_all``), every pack, one faiss search over every stored hash.

Reported per size: median wall and CPU seconds of a decision, objects read, drops read, index
write per drop, index size on disk; and each figure over its value at the smallest size (target
for now: <= 1.3, the verdict). The last line is the figures as JSON (also written under "figures"
to ``--out``, bench/results/near_dup_scale.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import REPO, Counting, cpu_seconds, write_results

from vidassets.config import NearDuplicateSettings
from vidassets.ingest.near_dup_index import PLAN, NearDuplicateIndex
from vidassets.ingest.near_duplicates import KINDS, Neighbourhood, Prints, decide, indexed_videos
from vidassets.storage.objects import LocalObjectStore
from vidassets.storage.rows import records
from vidassets.storage.tables import TableStore, put_blob


class Store:
    """The growing store: drops of random videos, each written as the stage writes it."""

    def __init__(self, root: Path, videos: int, seconds: float, rng: np.random.Generator):
        (root / "store").mkdir(parents=True, exist_ok=True)
        self.objects = LocalObjectStore(str(root / "store"))
        self.tables = TableStore(self.objects)
        self.index = NearDuplicateIndex(f"sqlite:///{root / 'store' / 'near_duplicates.sqlite'}")
        self.db_file = root / "store" / "near_duplicates.sqlite"
        self.videos, self.samples, self.seconds, self.rng = videos, int(seconds * 2), seconds, rng
        self.drops = 0
        self.hashes: list[tuple[str, dict[str, np.ndarray]]] = []  # (asset id, hashes): what copies copy
        self.index_write_s: list[float] = []

    def row(self, asset: str, shard: str, hashes: dict[str, np.ndarray], quality: float) -> dict:
        times = [round(i / 2, 2) for i in range(self.samples)]
        blob = put_blob(self.objects, "video_fingerprints", json.dumps(
            {"times": times, **{k: hashes[k].tobytes().hex() for k in KINDS}, "quality": [90] * self.samples,
             "audio": None}).encode(), ".json")
        return {"status": "ok", "asset_id": asset, "uri": f"s3://raw/{shard}/{asset[:12]}.mp4", "source_shard": shard,
                "source_tier": "crawl", "synthetic": False, "fingerprint_blob": blob, "duration_s": self.seconds,
                "quality_key": quality, "whole_grid": True, "samples": self.samples, "frames_decoded": 0,
                "has_audio_fingerprint": False, "width": 1280, "height": 720, "producer_version": "bench",
                "near_duplicate_of": None}

    def random(self) -> dict[str, np.ndarray]:
        return {k: self.rng.integers(0, 256, (self.samples, 32), dtype=np.uint8) for k in KINDS}

    def grow(self, drops: int) -> None:
        while self.drops < drops:
            shard = f"crawl/drop-{self.drops:06d}"
            rows = []
            for v in range(self.videos):
                hashes = self.random()
                asset = f"{self.drops * self.videos + v:064x}"
                rows.append(self.row(asset, shard, hashes, 1.0 + float(self.rng.random())))
                if len(self.hashes) < 2000:
                    self.hashes.append((asset, hashes))
            prints = Prints(self.objects)
            prints.write_pack(rows)
            self.tables.write("video_fingerprints", shard, rows)
            start = time.perf_counter()
            self.index.put_drop(shard, self.tables.version("video_fingerprints", shard), indexed_videos(rows, prints))
            self.index_write_s.append(time.perf_counter() - start)
            self.drops += 1

    def new_drop(self, n: int) -> list[dict]:
        here = []
        for v in range(self.videos):
            if v < 2:  # a copy of an older video: every hash 16 bits off
                _, source = self.hashes[int(self.rng.integers(len(self.hashes)))]
                hashes = {}
                for k in KINDS:
                    bits = np.unpackbits(source[k], axis=1)
                    for line in bits:
                        line[self.rng.choice(256, 16, replace=False)] ^= 1
                    hashes[k] = np.packbits(bits, axis=1)
            else:
                hashes = self.random()
            here.append(self.row(f"new{n:04d}-{v}".ljust(64, "0"), f"crawl/new-{n}", hashes,
                                 0.5 if v < 2 else 1.0 + float(self.rng.random())))
        return here


def decide_now(store: Store, here: list[dict]) -> dict:
    counting = Counting(store.objects)
    tables = TableStore(counting)
    wall, cpu = time.perf_counter(), cpu_seconds()
    prints = Prints(counting)
    synced = store.index.sync(tables.versions("video_fingerprints"), lambda d: indexed_videos(
        records(tables.read("video_fingerprints", d)), prints))
    others = Neighbourhood(store.index, lambda d: records(tables.read("video_fingerprints", d)),
                           here[0]["source_shard"], NearDuplicateSettings().max_hamming, prints)
    outcome = decide([dict(r) for r in here], others, prints, NearDuplicateSettings(), ("crawl",))
    return {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu, "objects_read": counting.reads,
            "drops_read": len(others.drops), "synced": len(synced), "near_duplicates": outcome.near_duplicates,
            "pairs_aligned": outcome.pairs_aligned}


def decide_every_drop(store: Store, here: list[dict]) -> dict:
    counting = Counting(store.objects)
    tables = TableStore(counting)
    wall, cpu = time.perf_counter(), cpu_seconds()
    parts = tables.partitions("video_fingerprints")
    older = records(tables.read_all("video_fingerprints", parts))
    outcome = decide([dict(r) for r in here], older, Prints(counting), NearDuplicateSettings(), ("crawl",))
    return {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu, "objects_read": counting.reads,
            "drops_read": len(parts), "near_duplicates": outcome.near_duplicates,
            "pairs_aligned": outcome.pairs_aligned}


def median(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drops", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--videos", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--new-drops", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "near_dup_scale.json"))
    args = parser.parse_args()
    report: dict = {"plan": PLAN,
                    "videos_per_drop": args.videos, "seconds": args.seconds, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp), args.videos, args.seconds, np.random.default_rng(0))
        for drops in sorted(args.drops):
            store.grow(drops)
            now, every = [], []
            for n in range(args.new_drops):
                here = store.new_drop(n)
                now.append(decide_now(store, here))
                every.append(decide_every_drop(store, here))
                for key in ("near_duplicates", "pairs_aligned"):
                    assert now[-1][key] == every[-1][key], (key, now[-1], every[-1])
                assert now[-1]["near_duplicates"] == 2, now[-1]
            writes = store.index_write_s[-min(50, len(store.index_write_s)):]
            size = {"drops": drops, "stored_hashes": drops * args.videos * store.samples * len(KINDS),
                    "now": {k: median(now, k) for k in ("wall_s", "cpu_s", "objects_read", "drops_read")},
                    "every_drop": {k: median(every, k) for k in ("wall_s", "cpu_s", "objects_read", "drops_read")},
                    "index_write_per_drop_s": round(statistics.median(writes), 4),
                    "index_mb": round(sum(p.stat().st_size for p in store.db_file.parent.glob(
                        "near_duplicates.sqlite*")) / 2**20, 1)}
            size["every_drop_over_now_wall"] = round(size["every_drop"]["wall_s"] / max(size["now"]["wall_s"], 1e-9), 1)
            report["sizes"][str(drops)] = size
            print(json.dumps(size), flush=True)
    first = report["sizes"][str(min(args.drops))]
    report["growth_over_smallest"] = {
        drops: {"now_wall": round(s["now"]["wall_s"] / first["now"]["wall_s"], 2),
                "now_cpu": round(s["now"]["cpu_s"] / first["now"]["cpu_s"], 2),
                "index_write": round(s["index_write_per_drop_s"] / first["index_write_per_drop_s"], 2),
                "every_drop_wall": round(s["every_drop"]["wall_s"] / first["every_drop"]["wall_s"], 2)}
        for drops, s in report["sizes"].items()}
    worst = max(max(g["now_wall"], g["now_cpu"]) for g in report["growth_over_smallest"].values())
    verdict = {"a decision's wall and CPU at each size <= 1.3x the smallest size's": {
        "ratio": worst, "target": "<= 1.3", "met": worst <= 1.3}}
    write_results(Path(args.out), sys.argv, report, verdict, settings=vars(args), python=platform.python_version())
    print(json.dumps(report))


if __name__ == "__main__":
    main()
