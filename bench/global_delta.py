"""What one new drop costs each global stage as the bucket grows (issue 43, item 2).

    python bench/global_delta.py [--sizes 100,1000] [--reps 3]

For each N: a store of N drops (bench/automation.py's: one drop of real files curated by the real
graph up to scores and embeddings, cloned N-1 times under new ids, hashes and embeddings, every tenth
clone a near copy of the one before), the global stages run once over it, then one new drop lands
and each global stage (dedup_groups, clip_clusters, decontamination, selection) runs for it alone,
in its own materialization, timed: Dagster's step time of the stage, and the wall and CPU time of the
call (which adds Dagster's run overhead, the same at every N).

The sizes and the two modes below are interleaved rep by rep (each rep runs every size and mode in
turn), so drift on a shared machine hits every figure alike; each stage's step times per rep are kept
beside their median (``step_s_each``).

Two ways of finding what changed, side by side on the same store (the modes alternate rep by rep):

- ``journal`` (HEAD): the tables' journal names the partitions written since the stage's last run;
  only those are looked up (``GlobalInputs``).
- ``listing`` (the baseline, the code before the journal): every partition of every input table is
  listed (forced by removing the stage's stored input versions, which makes ``GlobalInputs`` list).

Each rep lands its drop on the store as the reps before left it (no copy: a store of 10^5 drops is
tens of GB), so the store grows by two drops a rep, a rounding error against N. A rep's new drop is
a near copy of the drop landed just before it (untimed, with a global run), so every rep's drop
flips an older clip, as the bench's every tenth clone does. The journal's clock is moved ahead for
each rep (``Landing``): the drop before lands at S and its global run starts at S + 16 min, the timed
drop lands at S + 20 min, where S is half an hour past the last read of any global stage in that
store. So the journal's look-back window (``JOURNAL_LAG_NS``, 15 minutes) holds the timed drop alone,
as it does when drops land less often than that; drops landing faster are looked up again within
the window (cost per drop in the window). The stores ``build`` writes are stamped two hours and one
hour back; ``grow_store.py``'s at the time it ran.

Target (issue 43): each stage's cost per new drop at 10^3 drops (and beyond) <= 1.3x its cost at
10^2. Writes bench/results/global_delta.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import automation as scale  # bench/automation.py: the store of N drops
import numpy as np
from common import HOUR_NS, REPO, clock_shifted, cpu_seconds
from dagster import AssetKey, DagsterInstance

from vidassets import catalog
from vidassets.runner import materialize_bucket
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.input_versions import StoredInputVersions

TARGET = 1.3
MEASURES = ("vidassets.stages.curate", "vidassets.stages.common", "vidassets.curate.dedup",
            "vidassets.curate.dedup_state", "vidassets.curate.clusters", "vidassets.curate.decontamination",
            "vidassets.curate.selection", "vidassets.curate.selection_state", "vidassets.storage.tables",
            "vidassets.storage.sql", "vidassets.storage.partition_map", "vidassets.storage.input_versions",
            "vidassets.runtime.engine", "vidassets.storage.grouped", "vidassets.storage.objects",
            "vidassets.curate.eval_leaks")
"""The code these figures describe, which the bench reaches through the runner (its results go stale
when it changes: docs/gen.py)."""


def build(work: Path, seed: Path, n: int) -> tuple[Path, Path]:
    """A store of ``n`` drops whose global stages have run, and the bucket (n + 1 drops: the new one)."""
    root = work / f"n{n}"
    root.mkdir()
    shutil.copytree(seed / "store", root / "store")
    tables = TableStore(open_object_store(str(root / "store")))
    rng = np.random.default_rng(n)
    with clock_shifted(2 * HOUR_NS):
        for i in range(1, n):
            scale.clone(tables, i, rng)
    bucket = scale.bucket_dirs(root, n)
    with clock_shifted(HOUR_NS):
        summary = materialize_bucket(scale.settings_for(root, str(bucket)), DagsterInstance.ephemeral(),
                                     select=scale.GLOBAL, add_partitions=False, log=lambda _: None)
    assert summary.ok, summary.render()
    shutil.copytree(root / "store", root / "store.base")
    return root, bucket


def refreshed(root: Path, bucket: Path) -> tuple[Path, Path]:
    """A store built by an earlier run of this bench (``--work``), brought to this code as a real
    store would be by its first runs after an upgrade: its global tables moved into buckets
    (``TableStore.to_buckets``), then one old drop rewritten (drop 10, a near copy: new bits flipped)
    and the global stages run for it, so each one's state and cursors are this code's. The store is
    copied from ``store.base`` when there is one (``build`` keeps it), else refreshed where it is
    (``grow_store.py`` keeps none); it still holds N drops."""
    if (root / "store.base").exists():
        shutil.rmtree(root / "store", ignore_errors=True)
        shutil.copytree(root / "store.base", root / "store")
        (root / "landed.json").unlink(missing_ok=True)
    tables = TableStore(open_object_store(str(root / "store")))
    for table in (t for a in catalog.of_kind("global") for t in a.tables):
        tables.to_buckets(table)
    land = Landing(root)
    with land.at(0):
        scale.clone(tables, 10, np.random.default_rng(time.time_ns()))
    with land.at(16):
        summary = materialize_bucket(scale.settings_for(root, str(bucket)), DagsterInstance.ephemeral(),
                                     select=scale.GLOBAL, add_partitions=False, log=lambda _: None)
    assert summary.ok, summary.render()
    return root, bucket


class Landing:
    """Where the next drop lands on a store (``landed.json``: the next free drop number) and the
    journal's clock for it: ``at(minutes)`` shifts the clock to S + ``minutes``, S being half an
    hour past the latest read of any global stage of the store (their stored input versions'
    ``read_at``) when the Landing was made."""

    def __init__(self, root: Path, n: int | None = None):
        self.root, self.record = root, root / "landed.json"
        self.next = json.loads(self.record.read_text())["next"] if self.record.exists() else n
        objects = open_object_store(str(root / "store"))
        last = max(StoredInputVersions(objects, f"state/inputs/{name}").read_at for name in scale.GLOBAL)
        self.start = max(time.time_ns(), last) + 30 * 60 * 10**9

    @contextlib.contextmanager
    def at(self, minutes: float):
        with clock_shifted(time.time_ns() - (self.start + int(minutes * 60 * 10**9))):
            yield

    def take(self) -> int:
        """The next drop number that is a multiple of ten (its clone is a near copy of the one before,
        ``automation.clone``) and leaves the one before it free."""
        number = -(-(self.next + 1) // 10) * 10
        self.next = number + 1
        self.record.write_text(json.dumps({"next": self.next}))
        return number


def one_new_drop(root: Path, bucket: Path, n: int, mode: str) -> dict[str, dict]:
    """Land a drop (after its untimed near original), run each global stage for it; per stage its
    times. The store holds N drops and those landed by earlier reps."""
    land = Landing(root, n)
    number = land.take()
    tables = TableStore(open_object_store(str(root / "store")))
    settings = scale.settings_for(root, str(bucket))
    with land.at(0):
        scale.clone(tables, number - 1, np.random.default_rng(number - 1))
    with land.at(16):
        summary = materialize_bucket(settings, DagsterInstance.ephemeral(), select=scale.GLOBAL,
                                     add_partitions=False, log=lambda _: None)
    assert summary.ok, summary.render()
    if mode == "listing":
        shutil.rmtree(root / "store/state/inputs")
    figures = {}
    with land.at(20):
        scale.clone(tables, number, np.random.default_rng(number))
        # the drop's pages on disk before the clock starts (else the first fsync a stage makes flushes
        # what the untimed run above wrote)
        os.sync()
        for stage in scale.GLOBAL:
            instance = DagsterInstance.ephemeral()
            wall, cpu = time.perf_counter(), cpu_seconds()
            summary = materialize_bucket(settings, instance, select=[stage], add_partitions=False, log=lambda _: None)
            wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
            assert summary.ok, summary.render()
            meta = instance.get_latest_materialization_event(AssetKey(stage)).asset_materialization.metadata
            figures[stage] = {"step_s": summary.stages[stage].seconds, "call_wall_s": wall, "call_cpu_s": cpu,
                              "input_tables_listed": meta["input_tables_listed"].value,
                              "input_partitions_looked_up": meta["input_partitions_looked_up"].value}
            if "clips_flipped" in meta:  # clips of older drops the new drop beat (its near original's)
                figures[stage]["clips_flipped"] = meta["clips_flipped"].value
    return figures


def median_of(runs: list[dict[str, dict]]) -> dict[str, dict]:
    out = {}
    for stage in runs[0]:
        out[stage] = {k: round(statistics.median(r[stage][k] for r in runs), 4) if "_s" in k else runs[0][stage][k]
                      for k in runs[0][stage]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--work", default=None, help="keep the stores here (default: a temporary directory)")
    parser.add_argument("--as-is", action="store_true",
                        help="use the stores under --work as they are (an earlier run refreshed them with this code, "
                             "or grow_store.py built them)")
    parser.add_argument("--out", default=str(REPO / "bench/results/global_delta.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "vidassets", "bench", ":!bench/results"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip())  # read before: the code measured
    with contextlib.ExitStack() as stack:
        work = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        seed = work / "seed"
        if not (seed / "store").exists():
            with clock_shifted(3 * HOUR_NS):
                scale.seed_store(seed)
        assert len(TableStore(open_object_store(str(seed / "store"))).read("clips", scale.SEED)), "the seed has no clips"
        results = {}
        stores = {}
        for n in sizes:
            built = time.perf_counter()
            root = work / f"n{n}"
            if not (root / "store.base").exists() and not (root / "store").exists():
                stores[n] = build(work, seed, n)
            elif args.as_is and (root / "store").exists():
                stores[n] = (root, root / "bucket")
            else:
                stores[n] = refreshed(root, root / "bucket")
            print(f"N={n}: store ready in {time.perf_counter() - built:.0f} s", flush=True)
        runs = {n: {mode: [] for mode in ("journal", "listing")} for n in sizes}
        for rep in range(args.reps):  # sizes and modes interleaved: drift on the machine hits all alike
            for n in sizes:
                for mode in runs[n]:
                    runs[n][mode].append(one_new_drop(*stores[n], n, mode))
            print(f"rep {rep + 1}/{args.reps} done", flush=True)
        for n in sizes:
            results[n] = {mode: median_of(r) for mode, r in runs[n].items()}
            for mode, r in runs[n].items():  # the spread the medians come from
                for stage in results[n][mode]:
                    results[n][mode][stage]["step_s_each"] = [round(x[stage]["step_s"], 4) for x in r]
            print(json.dumps({n: results[n]}, indent=1), flush=True)
    base = sizes[0]
    verdict = {}
    for n in sizes[1:]:
        for stage in scale.GLOBAL:
            for figure in ("step_s", "call_cpu_s"):
                ratio = results[n]["journal"][stage][figure] / results[base]["journal"][stage][figure]
                verdict[f"{stage} {figure} {n}/{base}"] = {
                    "ratio": round(ratio, 3), "target": TARGET, "met": ratio <= TARGET,
                    "listing_ratio": round(results[n]["listing"][stage][figure]
                                           / results[base]["listing"][stage][figure], 3)}
    out = {"commit": commit + ("+dirty" if dirty else ""), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": {"cpu_count": os.cpu_count(), "cpu_model": _cpu_model(), "platform": platform.platform()},
           "reps": args.reps, "figures": {str(n): r for n, r in results.items()}, "verdict": verdict,
           "wall_s": round(time.perf_counter() - started, 1)}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(verdict, indent=1))


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
