"""Grow a store of ``global_delta.py`` to more drops, in chunks that survive a stop (issue 43: the
figure at 10^5 drops).

    python bench/grow_store.py --work /tmp/gd5 --to 100000 [--chunk 2000]

``global_delta.py`` builds its store of N drops by cloning one curated drop N - 1 times, then running
the global stages once over every drop: at 10^5 drops, most of a day on 2 cores (a clone spends most
of its time in pandera validating frames that differ from the seed's only in ids, hashes and
vectors; the first global run reads each drop's five small tables).

This grows the largest store ``global_delta.py`` built under ``--work`` instead, the way a bucket
grows: drops land ``--chunk`` at a time, and after each chunk the global stages run for the drops
that landed, the same code a new drop meets, so the store ends as the real stages leave it (their
state, indexes, journal cursors). Two processes share the work (``--workers``): each writes half a
chunk's clones, then the global stages that depend on none of each other (by the catalog's deps:
dedup, clusters, decontamination) run side by side, then those after them (selection). Clones are ``automation.clone``'s rows; the seed's five frames are
read once, and only the first clone of each start is validated against the schemas, its parquet
bytes compared with the unvalidated write's (they must be equal, else the run stops); later clones
are written unvalidated (identical dtypes, new values).

Progress is saved after each chunk's global run (``progress.json``): a stop loses the chunk under way,
whose drops are written again on the next start. Nothing is missed: a file written before the stop
stays, with its journal record, which is newer than the last read of every stage that had not yet
taken it (a stage that had, reads it no more). What each chunk cost is kept there too, and written, once the store is
complete, to ``bench/results/grow_store.json``: per drop, the clone and each global stage's
seconds when drops arrive ``--chunk`` at a time (a backfill of the global stages). The result is ``<work>/n<TO>/store`` and its ``bucket``, which
``global_delta.py --as-is`` measures (no copy is kept: the bench lands its drops on the store).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from unittest import mock

import automation as scale
import numpy as np
from common import REPO, write_results
from dagster import DagsterInstance

from vidassets import catalog
from vidassets.runner import materialize_bucket
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.parquet import to_parquet_bytes


class SeedOnce:
    """The store as ``automation.clone`` uses it, with the seed drop's tables read once."""

    def __init__(self, tables: TableStore):
        self.tables = tables
        self.seed = {t: tables.read(t, scale.SEED) for t in scale.CLONED_TABLES}

    def read(self, table: str, partition: str):
        assert partition == scale.SEED, partition
        return self.seed[table]

    def write(self, table: str, partition: str, frame) -> None:
        self.tables.write(table, partition, frame)


def clone_checked(tables: TableStore, i: int) -> None:
    """Clone drop ``i`` validated, and check that the unvalidated write makes the same bytes."""
    written: dict[str, bytes] = {}
    seeded = SeedOnce(tables)
    unvalidated = SeedOnce(tables)
    unvalidated.write = lambda table, partition, frame: written.__setitem__(table, to_parquet_bytes(frame))
    scale.clone(unvalidated, i, np.random.default_rng(i))
    scale.clone(seeded, i, np.random.default_rng(i))
    for table, data in written.items():
        stored = tables.objects.get_bytes(tables.key(table, scale.drop_key(i)))
        if stored != data:
            raise SystemExit(f"{table}: an unvalidated clone differs from the validated one; validate every clone")


@contextlib.contextmanager
def unvalidated():
    with mock.patch.object(TableStore, "_validated", staticmethod(lambda table, rows: rows)):
        yield


def waves(stages: list[str]) -> list[list[str]]:
    """``stages`` in waves by the catalog's deps: each wave's stages depend on none of each other's
    (they run side by side), only on stages of earlier waves."""
    deps = {a.name: set(a.deps) & set(stages) for a in catalog.ASSETS if a.name in stages}
    done: set[str] = set()
    out = []
    while len(done) < len(stages):
        wave = [s for s in stages if s not in done and deps[s] <= done]
        assert wave, f"a cycle among {stages}"
        out.append(wave)
        done |= set(wave)
    return out


def _clone_range(store: str, lo: int, hi: int) -> None:
    """Clones ``lo`` .. ``hi - 1``, unvalidated (a worker process: ``grow`` checked the first)."""
    seeded = SeedOnce(TableStore(open_object_store(store)))
    with unvalidated():
        for i in range(lo, hi):
            scale.clone(seeded, i, np.random.default_rng(i))


def _global_stages(root: str, stages: tuple[str, ...]) -> dict:
    """``stages`` materialized for the drops that landed (a worker process), as a new drop meets them."""
    # disposed here: Dagster's in-memory event log holds a SQLite connection for the instance's
    # life, which the garbage collector would otherwise close from another thread (SQLAlchemy's
    # "SQLite objects created in a thread" warnings)
    with DagsterInstance.ephemeral() as instance:
        summary = materialize_bucket(scale.settings_for(Path(root), str(Path(root) / "bucket")), instance,
                                     select=list(stages), add_partitions=False, log=lambda _: None)
    return {"ok": summary.ok, "why": "" if summary.ok else summary.render(),
            "stages_s": {k: round(v.seconds, 1) for k, v in summary.stages.items()}}


def _all_ok(runs: list[dict]) -> dict[str, float]:
    for run in runs:
        if not run["ok"]:
            raise SystemExit(run["why"])
    return {k: v for run in runs for k, v in run["stages_s"].items()}


def grow(work: Path, to: int, chunk: int, log=print, workers: int = 2) -> Path:
    """Grow to ``to`` drops, ``chunk`` at a time. With ``workers`` > 1, each chunk's clones are
    split among that many processes, and the global stages run in ``waves``, a wave's stages side by
    side; 1 runs everything in this process, in the runner's order."""
    root = work / f"n{to}"
    progress = root / "progress.json"
    if not progress.exists():
        sizes = sorted(int(p.name[1:]) for p in work.glob("n*") if (p / "store.base").exists() and int(p.name[1:]) < to)
        if not sizes:
            raise SystemExit(f"no store under {work} to grow: run global_delta.py --work {work} first")
        start = sizes[-1]
        root.mkdir(exist_ok=True)
        shutil.rmtree(root / "store", ignore_errors=True)
        log(f"copying the store of {start} drops")
        shutil.copytree(work / f"n{start}/store.base", root / "store")
        shutil.copy(work / f"n{start}/recipe.yaml", root / "recipe.yaml")
        progress.write_text(json.dumps({"from": start, "done": start, "chunks": []}))
    state = json.loads(progress.read_text())
    store = str(root / "store")
    tables = TableStore(open_object_store(store))
    first = True
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))) \
            if workers > 1 else None
        while state["done"] < to:
            lo, hi = state["done"], min(state["done"] + chunk, to)
            began = time.perf_counter()
            if first:
                clone_checked(tables, lo)
                first = False
                lo += 1
            if pool is None:
                _clone_range(store, lo, hi)
            else:
                cut = [lo + (hi - lo) * k // workers for k in range(workers + 1)]
                for done in [pool.submit(_clone_range, store, a, b) for a, b in itertools.pairwise(cut)]:
                    done.result()
            cloned = time.perf_counter()
            if pool is None:
                stages_s = _all_ok([_global_stages(str(root), tuple(scale.GLOBAL))])
            else:
                stages_s = {}
                for wave in waves(scale.GLOBAL):  # each stage a task: the pool balances them
                    stages_s |= _all_ok([f.result() for f in [pool.submit(_global_stages, str(root), (stage,))
                                                              for stage in wave]])
            state["done"] = hi
            state["chunks"].append({"to": hi, "clone_s": round(cloned - began, 1),
                                    "global_s": round(time.perf_counter() - cloned, 1), "stages_s": stages_s,
                                    "workers": workers})
            tmp = progress.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=1))
            os.replace(tmp, progress)
            log(f"{hi} drops: clones {cloned - began:.0f} s, global stages {time.perf_counter() - cloned:.0f} s")
    scale.bucket_dirs(root, to)
    return root


def chunk_figures(state: dict, chunk: int) -> dict:
    """Seconds per drop of the chunks' clones and global stages (each chunk's drops: the steps
    between its ``to`` and the one before), medians over the chunks."""
    import statistics

    done, per = state["from"], {"clone": [], "global": [], **{s: [] for s in scale.GLOBAL}}
    for c in state["chunks"]:
        drops = c["to"] - done
        done = c["to"]
        per["clone"].append(c["clone_s"] / drops)
        per["global"].append(c["global_s"] / drops)
        for stage, seconds in c["stages_s"].items():
            per[stage].append(seconds / drops)
    return {"from_drops": state["from"], "to_drops": state["done"], "chunk_drops": chunk, "chunks": len(state["chunks"]),
            "hours": round(sum(c["clone_s"] + c["global_s"] for c in state["chunks"]) / 3600, 2),
            "ms_per_drop_median": {k: round(1000 * statistics.median(v), 1) for k, v in per.items() if v},
            "ms_per_drop_first_last_chunk": {k: [round(1000 * v[0], 1), round(1000 * v[-1], 1)] for k, v in per.items() if v}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--to", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2, help="processes for the clones and the independent "
                        "global stages (1: all in this one, in the runner's order)")
    args = parser.parse_args()
    root = grow(Path(args.work), args.to, args.chunk, log=lambda m: print(m, flush=True), workers=args.workers)
    print(f"{root}/store holds {args.to} drops", flush=True)
    figures = chunk_figures(json.loads((root / "progress.json").read_text()), args.chunk)
    write_results(REPO / "bench/results/grow_store.json", sys.argv, figures,
                  note="a stop and restart re-runs the chunk under way; its time is not counted twice")


if __name__ == "__main__":
    main()
