"""What one new drop costs dedup as the drops before it grow, through the real update code on
synthetic drops (issue 43, item 1: "10^5 simulated through the real stage code on synthetic tables").

    python bench/dedup_delta.py [--sizes 100,1000,10000] [--drops-timed 40] [--state sqlite:///...]

One state (dedup's SQL database) grows drop after drop: drops of ``--clips`` clips (4, as the
automation bench's) with ``--frames`` sampled frames each and ``--dim``-float embeddings (1280, as
the demo's embedder); every tenth drop holds near copies of the drop before it (a few bits flipped,
a little noise), so groups form and merge. The state is built to each size in batches (one update of
many drops, as a first run over a bucket), then ``--drops-timed`` single new drops each run what the
``dedup_groups`` step runs: ``dedup.update`` told the drop that changed (as the step's journal of
its inputs tells it), the group rows of the drops it changed, ``written()``, on one held connection.
Reported per size: the median wall and CPU seconds per new drop, what it read of the state
(postings probed, stored clips, vectors, lists), and the ratio to the smallest size (target <= 1.3);
the postings' level merges (``POSTING_LEVELS``) fall on some drops: ``--drops-timed`` of them are
timed in a row (40 by default: a first-level merge about every 35 drops of this shape), so the mean
(``mean_wall_s``) carries the merges and the median does not; ``max_wall_s`` is the drop that merged.

Then a takedown and a re-cut at each size (``--taken-out`` of each, drops spread over the state, each
a near copy or the source of one, so a group splits): a covered drop removed (``taken_out_wall_s``: the
update told it changed, its group rows, ``written()``) and a covered drop whose tables changed
(``rebuilt_wall_s``: taken out and added again as new clips, one update). The code before this
rebuilt the whole state from the tables for either: ``build_s`` (the state built in batches to this
size) is of that order. Writes bench/results/dedup_delta.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--drops-timed", type=int, default=40)
    parser.add_argument("--taken-out", type=int, default=10, help="drops removed, and drops rebuilt, timed per size")
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=7)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--state", default=None, help="dedup's state database (default: a new SQLite file)")
    parser.add_argument("--out", default=str(REPO / "bench/results/dedup_delta.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    state = DedupState(args.state or f"sqlite:///{tempfile.mkdtemp(prefix='dedup-delta-')}/dedup.sqlite")
    drops, params, version = Drops(args.clips, args.frames, args.dim), DedupSettings(), RowVersion("bench", "bench")
    fingerprints: dict[str, str] = {}
    figures: dict[str, dict] = {}
    began = time.perf_counter()
    landed = 0  # drops landed so far (names are never reused: a drop taken out leaves its index)

    def step(changed: str) -> dict:
        """One run of the step for ``changed``, timed, with what it read."""
        wall, cpu = time.perf_counter(), cpu_seconds()
        with state.database.held():  # as the step holds it
            done = dedup.update(state, "bench", fingerprints, drops, params, changed=[changed])
            rows = dedup.group_rows(state, version, done.changed_shards)
            state.written()
        return {"wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu, "rows": len(rows),
                "rebuilt": done.done["rebuilt"], "taken_out": done.done["taken_out_partitions"], **state.counters}

    for size in sizes:
        built = time.perf_counter()
        while landed < size:
            batch = range(landed, min(size, landed + BUILD_BATCH))
            fingerprints.update({name(i): "v1" for i in batch})
            landed = batch[-1] + 1
            dedup.update(state, "bench", fingerprints, drops, params, changed=[name(i) for i in batch])
            state.written()
        build_s = time.perf_counter() - built
        runs = []
        for _ in range(args.drops_timed):
            fingerprints[newest := name(landed)] = "v1"
            landed += 1
            runs.append(step(newest))
        assert not any(r["rebuilt"] for r in runs), "a timed drop rebuilt the state"
        # near copies and their sources (index 8 or 9 mod 10), spread over the state, not taken out before
        sources = [i for i in range(landed) if i % 10 in (8, 9) and fingerprints.get(name(i)) == "v1"]
        picked = sources[::max(1, len(sources) // (2 * args.taken_out))][:2 * args.taken_out]
        removed, rebuilt = [], []
        for i in picked[0::2]:
            del fingerprints[name(i)]
            removed.append(step(name(i)))
        for i in picked[1::2]:
            fingerprints[name(i)] = "v2"  # its tables rewritten (the same clips, cut again)
            rebuilt.append(step(name(i)))
        assert all(r["taken_out"] == 1 and not r["rebuilt"] for r in removed + rebuilt), "a takedown rebuilt the state"
        figures[str(size)] = {
            "drops_before": size, "clips_before": size * args.clips, "build_s": round(build_s, 1),
            **{k: round(statistics.median(r[k] for r in runs), 4) for k in ("wall_s", "cpu_s")},
            **{k: int(statistics.median(r[k] for r in runs)) for k in
               ("postings_probed", "clips_read", "vectors_read", "lists_read", "rows")},
            "mean_wall_s": round(statistics.mean(r["wall_s"] for r in runs), 4),
            "max_wall_s": round(max(r["wall_s"] for r in runs), 4),
            "postings_merged_max": max(r["postings_merged"] for r in runs),
            **{f"taken_out_{k}": round(statistics.median(r[k] for r in removed), 4) for k in ("wall_s", "cpu_s")},
            "taken_out_clips_read": int(statistics.median(r["clips_read"] for r in removed)),
            **{f"rebuilt_{k}": round(statistics.median(r[k] for r in rebuilt), 4) for k in ("wall_s", "cpu_s")},
            "taken_out_drops": len(removed), "rebuilt_drops": len(rebuilt)}
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
                         "near_copy_every": 10, "build_batch": BUILD_BATCH, "state": state.database.url.split(":")[0]})


if __name__ == "__main__":
    main()
