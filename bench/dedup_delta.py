"""What one new drop costs dedup as the drops before it grow, through the real update code on
synthetic drops (issue 43, item 1: "10^5 simulated through the real stage code on synthetic tables").

    python bench/dedup_delta.py [--sizes 100,1000,10000] [--drops-timed 40] [--taken-out 10] [--work DIR]

One state (dedup's SQL database) per size, grown drop after drop: drops of ``--clips`` clips (4, as
the automation bench's) with ``--frames`` sampled frames each and ``--dim``-float embeddings (1280,
as the demo's embedder); every tenth drop holds near copies of the drop before it (a few bits
flipped, a little noise), so groups form and merge. Each state is built to its size in batches (one
update of many drops, as a first run over a bucket), then ``--drops-timed`` single new drops each run
what the ``dedup_groups`` step runs (``Grown.step``), the sizes interleaved drop by drop so drift on a
shared machine hits every size alike.
Reported per size: the median wall and CPU seconds per new drop, what it read of the state
(postings probed, stored clips, vectors, lists), and the ratio to the smallest size (target <= 1.3);
the postings' level merges (``POSTING_LEVELS``) fall on some drops: ``--drops-timed`` of them are
timed per size (40 by default: a first-level merge about every 35 drops of this shape), so the mean
(``mean_wall_s``) carries the merges and the median does not; ``max_wall_s`` is the drop that merged.

Then takedowns and re-cuts, interleaved likewise (``--taken-out`` of each per size, drops spread over
the state, each a near copy or the source of one, so a group splits): a covered drop removed (``taken_out_wall_s``: the
update told it changed, its group rows, ``written()``) and a covered drop whose tables changed
(``rebuilt_wall_s``: taken out and added again as new clips, one update). The code before this
rebuilt the whole state from the tables for either: ``build_s`` (the state built in batches to this
size) is of that order. Writes bench/results/dedup_delta.json.

With ``--work``, a state an earlier run stopped while building (``n<size>.sqlite``) is built on from
the drops it covers, so a large size can be built across several runs (``build_s`` is then this
run's part; ``drops_built_before_this_run`` says how many drops were there already).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import REPO, cpu_seconds, write_results

from vidassets.config import DedupSettings
from vidassets.curate import dedup
from vidassets.curate.dedup_state import DedupState
from vidassets.storage.rows import RowVersion

TARGET = 1.3
BUILD_BATCH = 500


class Drops:
    """Synthetic drops: clips, their sampled frames' PDQ hashes and embeddings."""

    def __init__(self, clips: int, frames: int, dim: int, seed: int = 0):
        self.clips, self.frames, self.dim, self.seed = clips, frames, dim, seed

    def arrays(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, i])
        if i % 10 == 9:  # near copies of the drop before
            hashes, vectors = self.arrays(i - 1)
            flips = (rng.random(hashes.shape + (8,)) < 0.01)
            hashes = hashes ^ np.packbits(flips, axis=-1).reshape(hashes.shape)
            vectors = vectors + rng.normal(scale=0.01, size=vectors.shape).astype(np.float32)
        else:
            hashes = rng.integers(0, 256, (self.clips, self.frames, 32), dtype=np.uint8)
            vectors = rng.normal(size=(self.clips, self.dim)).astype(np.float32)
        return hashes, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def __call__(self, part: str) -> dedup.PartitionFeatures:
        i = int(part.rsplit("-", 1)[1])
        hashes, vectors = self.arrays(i)
        clips, frames = [], []
        for c in range(self.clips):
            asset = f"{part}-a{c}"
            clips.append({"clip_id": f"{part}-c{c}", "asset_id": asset, "source_shard": part,
                          "first_frame": 0, "last_frame": self.frames - 1})
            frames += [{"asset_id": asset, "frame_index": f, "pdq_hash": hashes[c, f].tobytes().hex()}
                       for f in range(self.frames)]
        embeddings = pd.DataFrame({"clip_id": [c["clip_id"] for c in clips], "status": "ok", "dim": self.dim,
                                   "vector": [v.astype("<f4").tobytes() for v in vectors]})
        return dedup.PartitionFeatures(pd.DataFrame(clips), pd.DataFrame(frames), embeddings)


def name(i: int) -> str:
    return f"web/drop-{i:07d}"


class Grown:
    """One state grown to its size, and the runs of the ``dedup_groups`` step timed on it: what the
    step runs (``dedup.update`` told the drop that changed, as the step's journal of its inputs
    tells it; the group rows of the drops it changed; ``written()``) on one held connection."""

    def __init__(self, state: DedupState):
        # a state an earlier run left under --work (stopped while building) goes on from its drops;
        # one that was timed (drops taken out, re-cut or landed past the build) is not reused
        self.state, self.landed = state, int(state.meta().get("drops", 0))  # names never reused: a drop taken out leaves its index
        self.fingerprints = {name(i): "v1" for i in range(self.landed)}
        if self.landed and state.covered() != self.fingerprints:
            raise SystemExit(f"{state.database.url}: not a state this bench only built; delete it")

    def build(self, size: int, drops: Drops, params: DedupSettings) -> None:
        while self.landed < size:
            batch = range(self.landed, min(size, self.landed + BUILD_BATCH))
            self.fingerprints.update({name(i): "v1" for i in batch})
            self.landed = batch[-1] + 1
            dedup.update(self.state, "bench", self.fingerprints, drops, params, changed=[name(i) for i in batch])
            self.state.written()

    def step(self, changed: str, drops: Drops, params: DedupSettings, version: RowVersion) -> dict:
        """One run of the step for ``changed``, timed, with what it read."""
        state = self.state
        wall, cpu = time.perf_counter(), cpu_seconds()
        with state.database.held():  # as the step holds it
            done = dedup.update(state, "bench", self.fingerprints, drops, params, changed=[changed])
            rows = dedup.group_rows(state, version, done.changed_shards)
            state.written()
        return {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu, "rows": len(rows),
                "rebuilt": done.done["rebuilt"], "taken_out": done.done["taken_out_partitions"], **state.counters}

    def new_drop(self, drops: Drops, params: DedupSettings, version: RowVersion) -> dict:
        self.fingerprints[newest := name(self.landed)] = "v1"
        self.landed += 1
        return self.step(newest, drops, params, version)

    def spread_near_copies(self, count: int) -> list[int]:
        """``count`` near copies and their sources (index 8 or 9 mod 10), spread over the state."""
        sources = [i for i in range(self.landed) if i % 10 in (8, 9) and self.fingerprints.get(name(i)) == "v1"]
        return sources[::max(1, len(sources) // count)][:count]

    def take_down(self, i: int, drops: Drops, params: DedupSettings, version: RowVersion) -> dict:
        del self.fingerprints[name(i)]
        return self.step(name(i), drops, params, version)

    def recut(self, i: int, drops: Drops, params: DedupSettings, version: RowVersion) -> dict:
        self.fingerprints[name(i)] = "v2"  # its tables rewritten (the same clips, cut again)
        return self.step(name(i), drops, params, version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--drops-timed", type=int, default=40)
    parser.add_argument("--taken-out", type=int, default=10, help="drops removed, and drops rebuilt, timed per size")
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=7)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--work", default=None, help="where the states' SQLite files go (default: a temp dir)")
    parser.add_argument("--out", default=str(REPO / "bench/results/dedup_delta.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="dedup-delta-"))
    drops, params, version = Drops(args.clips, args.frames, args.dim), DedupSettings(), RowVersion("bench", "bench")
    began = time.perf_counter()
    grown = {size: Grown(DedupState(f"sqlite:///{work}/n{size}.sqlite")) for size in sizes}
    build_s, resumed = {}, {size: g.landed for size, g in grown.items()}  # drops covered before this run
    for size, g in grown.items():
        built = time.perf_counter()
        g.build(size, drops, params)
        build_s[size] = time.perf_counter() - built
        print(f"{size}: built in {build_s[size]:.0f} s", flush=True)
    runs: dict[int, list[dict]] = {size: [] for size in sizes}
    removed: dict[int, list[dict]] = {size: [] for size in sizes}
    rebuilt: dict[int, list[dict]] = {size: [] for size in sizes}
    for _ in range(args.drops_timed):  # sizes interleaved: drift on the machine hits every size alike
        for size, g in grown.items():
            runs[size].append(g.new_drop(drops, params, version))
    picked = {size: g.spread_near_copies(2 * args.taken_out) for size, g in grown.items()}
    for j in range(args.taken_out):
        for size, g in grown.items():
            if 2 * j + 1 < len(picked[size]):
                removed[size].append(g.take_down(picked[size][2 * j], drops, params, version))
                rebuilt[size].append(g.recut(picked[size][2 * j + 1], drops, params, version))
    figures: dict[str, dict] = {}
    for size in sizes:
        assert not any(r["rebuilt"] for r in runs[size]), "a timed drop rebuilt the state"
        assert all(r["taken_out"] == 1 and not r["rebuilt"] for r in removed[size] + rebuilt[size]), \
            "a takedown rebuilt the state"
        figures[str(size)] = {
            "drops_before": size, "clips_before": size * args.clips, "build_s": round(build_s[size], 1),
            "drops_built_before_this_run": resumed[size],
            **{k: round(statistics.median(r[k] for r in runs[size]), 4) for k in ("wall_s", "cpu_s")},
            **{k: int(statistics.median(r[k] for r in runs[size])) for k in
               ("postings_probed", "clips_read", "vectors_read", "lists_read", "rows")},
            "mean_wall_s": round(statistics.mean(r["wall_s"] for r in runs[size]), 4),
            "max_wall_s": round(max(r["wall_s"] for r in runs[size]), 4),
            "postings_merged_max": max(r["postings_merged"] for r in runs[size]),
            **{f"taken_out_{k}": round(statistics.median(r[k] for r in removed[size]), 4) for k in ("wall_s", "cpu_s")},
            "taken_out_clips_read": int(statistics.median(r["clips_read"] for r in removed[size])),
            **{f"rebuilt_{k}": round(statistics.median(r[k] for r in rebuilt[size]), 4) for k in ("wall_s", "cpu_s")},
            "taken_out_drops": len(removed[size]), "rebuilt_drops": len(rebuilt[size])}
        print(size, figures[str(size)], flush=True)
    base = figures[str(sizes[0])]
    verdict = {}
    for size in sizes[1:]:
        for k in ("wall_s", "cpu_s", "mean_wall_s", "taken_out_wall_s", "rebuilt_wall_s"):
            ratio = figures[str(size)][k] / base[k]
            verdict[f"{k} {size}/{sizes[0]}"] = {"ratio": round(ratio, 3), "target": TARGET, "met": ratio <= TARGET}
    print(verdict)
    write_results(args.out, sys.argv, figures, verdict, wall_s=round(time.perf_counter() - began, 1),
                  shape={"clips_per_drop": args.clips, "frames_per_clip": args.frames, "dim": args.dim,
                         "taken_out_and_rebuilt_per_size": args.taken_out,
                         "near_copy_every": 10, "build_batch": BUILD_BATCH, "state": "sqlite", "interleaved": True})


if __name__ == "__main__":
    main()
