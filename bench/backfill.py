"""What a backfill of the whole graph over K drops launches from the UI, with the real daemon
(issue 15): `dagster dev` on a bucket of K drops of real files, the partitions added, then the
same GraphQL mutation the UI's Materialize → partitions dialog sends (launchPartitionBackfill with
the partition names and every partitioned and global asset), with the sensors and automation
running. Counts the runs the backfill launched (per partition and global) and the runs anything
else launched meanwhile, and checks that the global assets ran once.

The drops carry no ``_SUCCESS`` marker, so the bucket sensor leaves them to the backfill. With
``--drops-per-partition K`` > 1 the drops are put in batches first (``DropBatches.assign``, as the bucket
sensor does) and the backfill names the batches' partitions, as a user picking them in the UI would.
Usage: ``python bench/backfill.py --drops 3`` (prints one JSON line; about a minute per drop here);
``python bench/backfill.py --drops 4 --drops-per-partition 2 --out bench/results/backfill_k2.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import write_results  # noqa: E402
from dagster import DagsterInstance, DagsterRunStatus  # noqa: E402

from vidassets import catalog  # noqa: E402
from vidassets.jobs import JOBS  # noqa: E402
from vidassets.partitions import source_shards  # noqa: E402
from vidassets.storage import open_object_store  # noqa: E402
from vidassets.storage.drop_batches import DropBatches  # noqa: E402
from vidassets_tests.conftest import SAMPLE_CACHE, dagster_dev_env, dagster_dev_server  # noqa: E402

MEASURES = ("vidassets.sensors", "vidassets.automation", "vidassets.partitions", "vidassets.graph",
            "vidassets.stages.common")
"""The code that decides which runs a backfill and the sensors launch (docs/gen.py: staleness)."""

DONE = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
FILES = ["raw/licensed/drop-0001/carphone.mp4", "raw/licensed/drop-0002/carphone_vp9.webm",
         "raw/licensed/drop-0002/bigbuckbunny_neardup.mp4", "raw/licensed/drop-0001/bikes.mp4"]
MUTATION = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""


def graphql(port: int, query: str, variables: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", json.dumps(
        {"query": query, "variables": variables}).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drops", type=int, default=3)
    parser.add_argument("--drops-per-partition", type=int, default=1, help="bucket.drops_per_partition")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "backfill.json"))
    args = parser.parse_args()
    from vidassets.demo.bucket import build_demo_bucket

    tmp = Path(tempfile.mkdtemp(prefix="vidassets-bench-backfill-"))
    demo = tmp / "demo" / "bucket"
    build_demo_bucket(demo, SAMPLE_CACHE)
    keys = [f"web/drop-{i:04d}" for i in range(args.drops)]
    for i, key in enumerate(keys):
        drop = tmp / "bucket/raw" / key
        drop.mkdir(parents=True)
        source = demo / FILES[i % len(FILES)]
        shutil.copy(source, drop / source.name)
    assets = [a.name for a in catalog.ASSETS if a.kind != "on_request"]
    per_partition = args.drops_per_partition
    partitions = sorted(set(DropBatches(open_object_store(str(tmp / "store"))).assign(keys, per_partition).values()))
    with dagster_dev_env(tmp, tmp / "bucket", {"bucket": {"drops_per_partition": per_partition}}) as env:
        instance = DagsterInstance.get()
        instance.add_dynamic_partitions(source_shards.name, partitions)  # before the server starts
        with dagster_dev_server(tmp, env, tmp / "dagster-dev.log") as port:
            deadline = time.monotonic() + 900  # the webserver loads the code location first
            while True:
                try:
                    answer = graphql(port, MUTATION, {"params": {
                        "partitionNames": partitions, "assetSelection": [{"path": [n]} for n in assets], "fromFailure": False}})
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(2)
            result = answer["data"]["launchPartitionBackfill"]
            assert result["__typename"] == "LaunchBackfillSuccess", answer
            started = time.monotonic()
            quiet_since, last = time.monotonic(), -1
            while time.monotonic() - started < 3600:
                runs = instance.get_runs()
                active = [r for r in runs if r.status not in DONE]
                if active or len(runs) != last:
                    quiet_since, last = time.monotonic(), len(runs)
                elif time.monotonic() - quiet_since > 60:
                    break
                time.sleep(3)
            seconds = time.monotonic() - started - 60
    runs = instance.get_runs()

    def assets_of(run) -> tuple[str, ...]:
        return tuple(sorted({k.to_user_string() for k in (run.asset_selection or ())} or JOBS.get(run.job_name, ())))

    backfill = [r for r in runs if r.tags.get("dagster/backfill")]
    other = [r for r in runs if not r.tags.get("dagster/backfill")]
    shapes = Counter((("global" if not r.tags.get("dagster/partition") else "per drop"), assets_of(r)) for r in backfill)
    global_names = {a.name for a in catalog.of_kind("global")}
    global_runs = [r for r in runs if set(assets_of(r)) & global_names]
    figures = {
        "drops": args.drops, "drops_per_partition": per_partition, "partitions": len(partitions), "seconds": round(seconds), "backfill_runs": len(backfill),
        "backfill_run_shapes": [{"kind": k, "assets": list(a), "runs": n} for (k, a), n in sorted(shapes.items())],
        "other_runs": [{"partition": r.tags.get("dagster/partition"), "assets": list(assets_of(r)),
                        "status": r.status.value} for r in other],
        "global_runs": len(global_runs),
        "failed": [r.run_id for r in runs if r.status != DagsterRunStatus.SUCCESS],
    }
    verdict = {"the global assets ran once": {"value": len(global_runs), "met": len(global_runs) == 1},
               "no run failed": {"value": len(figures["failed"]), "met": not figures["failed"]},
               "nothing but the backfill launched a run": {"value": len(other), "met": not other}}
    write_results(args.out, sys.argv, figures, verdict, server="dagster dev (webserver + daemon), the repo dagster.yaml")
    print(json.dumps({**figures, "verdict": verdict}, indent=1))


if __name__ == "__main__":
    main()
