"""Automation ticks inside the real ``dagster-daemon`` over N drops on PostgreSQL (issue 15).

`bench/automation.py` times the daemon's evaluation code in-process; this starts the daemon itself
(``dagster-daemon run`` on vidassets.definitions, 5 s automation interval) against a real PostgreSQL
instance holding N ``source_shard`` partitions and a materialization of every partitioned asset of
each (the same history as bench/automation.py, batched), lets it tick, lands a new drop's ingest
(the tick that follows requests its chain), and reads every automation tick's duration from the
instance's tick records (start and end timestamps).

With ``--drops-per-partition K`` the N drops are batched K to a partition
(``bucket.drops_per_partition``; the assignment recorded in the store as the bucket sensor records
it): the instance then holds N / K partitions.

Usage: ``python bench/daemon_ticks.py --drops 10000 --seconds 90``;
``python bench/daemon_ticks.py --drops 100000 --drops-per-partition 10``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from automation import drop_key, history  # noqa: E402
from common import write_results  # noqa: E402
from dagster import AssetMaterialization, DagsterInstance  # noqa: E402

from vidassets.partitions import source_shards  # noqa: E402
from vidassets.storage import open_object_store  # noqa: E402
from vidassets.storage.drop_batches import DropBatches  # noqa: E402
from vidassets_tests.conftest import postgres_dagster_yaml, postgres_server  # noqa: E402

MEASURES = ("vidassets.sensors", "vidassets.automation", "vidassets.graph", "vidassets.stages.common",
            "vidassets.ingest.drops")
"""The code the daemon's ticks run (their results go stale when it changes: docs/gen.py)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drops", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=90, help="ticks before the new drop lands")
    parser.add_argument("--drops-per-partition", type=int, default=1)
    parser.add_argument("--out", help="results file (default: bench/results/daemon_ticks_<drops>[_k<K>].json)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vidassets-bench-daemon-"))
    with postgres_server() as port:
        db = f"daemon_{args.drops}"
        bindir = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin/createdb"))[-1]).parent
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "vidassets", db], check=True)
        home = root / "home"
        home.mkdir()
        (home / "dagster.yaml").write_text(postgres_dagster_yaml(port, db))
        instance = DagsterInstance.from_config(str(home))
        started = time.perf_counter()
        k = args.drops_per_partition
        batches = DropBatches(open_object_store(str(root / "store")))
        drops = [drop_key(i) for i in range(args.drops)]
        partition_of = batches.assign(drops, k) if k > 1 else {d: d for d in drops}
        history(instance, list(dict.fromkeys(partition_of.values())))
        history_seconds = time.perf_counter() - started
        (root / "vidassets.yaml").write_text(json.dumps({"execution": {"automation_interval_seconds": 5},
                                                         "bucket": {"sensor_interval_seconds": 3600,
                                                                    "drops_per_partition": k}}))
        (root / "bucket/raw").mkdir(parents=True)
        env = {**os.environ, "DAGSTER_HOME": str(home), "VIDASSETS_CONFIG": str(root / "vidassets.yaml"),
               "VIDASSETS_BUCKET": str(root / "bucket"), "VIDASSETS_STORE": str(root / "store"),
               "VIDASSETS_EVAL_VAULT": str(root / "vault")}
        with open(root / "daemon.log", "wb") as log:
            proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-m",
                                     "vidassets.definitions"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                time.sleep(args.seconds)
                new = batches.assign([drop_key(args.drops)], k)[drop_key(args.drops)]  # its partition
                if not instance.has_dynamic_partition(source_shards.name, new):
                    instance.add_dynamic_partitions(source_shards.name, [new])
                for name in ("raw_inventory", "eval_split"):
                    instance.report_runless_asset_event(AssetMaterialization(name, partition=new))
                time.sleep(40)
            finally:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=60)
        ticks = sorted((t.timestamp, t.end_timestamp - t.timestamp, len(t.run_ids or []))
                        for state in instance.all_instigator_state() if "automation" in state.instigator_name
                        for t in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=100)
                        if t.end_timestamp)
    seconds = [round(s, 3) for _, s, _ in ticks]
    figures = {"drops": args.drops, "drops_per_partition": k, "partitions": len(set(partition_of.values())),
               "history_seconds": round(history_seconds, 1), "automation_ticks_s": seconds,
               "median_s": round(statistics.median(seconds), 3) if seconds else None,
               "max_s": max(seconds, default=None),
               "tick_requesting_the_new_chain_s": [round(s, 3) for _, s, runs in ticks if runs]}
    verdict = {"automation tick <= 10 s in the real daemon": {
        "value": figures["max_s"], "met": bool(seconds) and max(seconds) <= 10}}
    out = args.out or str(REPO / "bench" / "results" / f"daemon_ticks_{args.drops}{f'_k{k}' if k > 1 else ''}.json")
    write_results(out, sys.argv, figures, verdict, backend="postgres", daemon="dagster-daemon run, 5 s interval")
    print(json.dumps({**figures, "verdict": verdict}, indent=1))


if __name__ == "__main__":
    main()
