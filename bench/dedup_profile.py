"""Where one drop's dedup update spends its time, by part, at two state sizes (the cause behind
``bench/dedup_delta.py``'s ratios).

    python bench/dedup_profile.py [--sizes 100,1000] [--drops 20]

Builds dedup's state to each size with ``bench/dedup_delta.py``'s synthetic drops, then profiles
``--drops`` single-drop updates (told the drop that changed, as the step is) with cProfile and
reports per update, in milliseconds: the whole update with its group rows and ``written()`` on one
held connection (``Database.held``, as the step runs it), the SQLite commits, the connections
returned to the pool (one per use), the SQLite connections closed (the held one, once: the
write-ahead log written back), the postings lookups (``DedupState.posting_pairs``), the writing transaction (``DedupState.add``) and the
centroid and vector reads. Writes bench/results/dedup_profile.json (no target: a breakdown).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time

from common import REPO, write_results
from dedup_delta import Drops, name

from vidassets.config import DedupSettings
from vidassets.curate import dedup
from vidassets.curate.dedup_state import DedupState
from vidassets.storage.rows import RowVersion

PARTS = {"commits": ("~", "<method 'commit' of 'sqlite3.Connection' objects>"),
         "connections_closed": ("sqlalchemy/pool/base.py", "_checkin"),
         "sqlite_closes": ("~", "<method 'close' of 'sqlite3.Connection' objects>"),
         "postings_lookups": ("vidassets/curate/dedup_state.py", "posting_pairs"),
         "write_transaction": ("vidassets/curate/dedup_state.py", "add"),
         "centroids_read": ("vidassets/curate/dedup_state.py", "centroids"),
         "vectors_read": ("vidassets/curate/dedup_state.py", "vectors_in")}
"""Each part: (the file its function is in, as cProfile names it, the function)."""


def one_drop(state: DedupState, fingerprints: dict[str, str], drops: Drops, params: DedupSettings,
             version: RowVersion) -> None:
    """What the ``dedup_groups`` step runs for one new drop."""
    fingerprints[newest := name(len(fingerprints))] = "v1"
    with state.database.held():
        done = dedup.update(state, "bench", fingerprints, drops, params, changed=[newest])
        dedup.group_rows(state, version, done.changed_shards)
        state.written()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--drops", type=int, default=20)
    args = parser.parse_args()
    drops, params, version = Drops(4, 7, 1280), DedupSettings(), RowVersion("bench", "bench")
    figures = {}
    for size in (int(s) for s in args.sizes.split(",")):
        state = DedupState(f"sqlite:///{tempfile.mkdtemp(prefix='dedup-profile-')}/dedup.sqlite")
        fingerprints: dict[str, str] = {}
        while len(fingerprints) < size:
            batch = [name(i) for i in range(len(fingerprints), min(size, len(fingerprints) + 500))]
            fingerprints.update(dict.fromkeys(batch, "v1"))
            dedup.update(state, "bench", fingerprints, drops, params, changed=batch)
            state.written()

        one_drop(state, fingerprints, drops, params, version)  # warm
        profile = cProfile.Profile()
        began = time.perf_counter()
        profile.enable()
        for _ in range(args.drops):
            one_drop(state, fingerprints, drops, params, version)
        profile.disable()
        wall = time.perf_counter() - began
        stats = pstats.Stats(profile).stats  # (file, line, function) -> (cc, nc, tottime, cumtime, callers)
        found = {part: [v for (file, _, fn), v in stats.items() if file.endswith(where) and fn == function]
                 for part, (where, function) in PARTS.items()}
        part_ms = {part: round(1000 * sum(v[3] for v in hits) / args.drops, 2) for part, hits in found.items()}
        calls = {part: round(sum(v[1] for v in hits) / args.drops, 1) for part, hits in found.items()}
        figures[str(size)] = {"drops_before": size, "update_ms_profiled": round(1000 * wall / args.drops, 2),
                              "ms_per_update": part_ms, "calls_per_update": calls}
        print(size, figures[str(size)], flush=True)
    write_results(REPO / "bench" / "results" / "dedup_profile.json", sys.argv, figures, {}, settings=vars(args))


if __name__ == "__main__":
    main()
