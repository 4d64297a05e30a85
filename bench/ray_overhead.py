"""What handing a step's items to Ray costs, against the local engine, side by side in one process.

    python bench/ray_overhead.py [--items 1000] [--work-ms 20] [--cpus 2]

1. A synthetic stage: ``Step.run`` over ``--items`` items whose compute burns ``--work-ms`` of CPU
   (a row per item, as a media step writes), on the local engine (one item after the other in this
   process) and on the Ray engine (a local Ray instance with ``--cpus`` CPUs, started here), with
   the default in-flight bound and a larger one. Reports wall seconds, items/s, and Ray's
   throughput over local's. Then the same with no-op items: the per-item scheduling overhead
   (wall ms per item, and the driver's own CPU ms per item: what bounds one driver's rate).
2. The demo: the per-video media stages (probe, packet index, fingerprint, analysis; inventory and
   clips around them) over the demo bucket through the real graph, local vs Ray, wall seconds.
3. Projection to a 100-node cluster (16 CPUs each) from the measured numbers: the driver's ceiling
   (items/s one step's driver can submit and collect), the cluster's ceiling for analysis items
   (per-item CPU of the demo's analysis pass), and the expected throughput (the smaller).

Target: Ray's synthetic-stage throughput per CPU >= 0.9x the local engine's. The last line is the
figures as JSON (also written under "figures", with the target's verdict, to
bench/results/ray_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import REPO, cpu_seconds, write_results

from vidassets.runtime.engine import LocalEngine, RayEngine
from vidassets.runtime.step import Step
from vidassets.storage.rows import RowVersion

VERSION = RowVersion("bench", "in")


def burn(ms: float) -> int:
    """Spin for ``ms`` of this process's CPU time; returns the loop count (the 'result')."""
    end, n = time.process_time() + ms / 1000, 0
    while time.process_time() < end:
        n += 1
    return n


class Work:
    """A picklable compute function: one row per item after ``ms`` of CPU."""

    def __init__(self, ms: float):
        self.ms = ms

    def __call__(self, item: int) -> dict:
        burn(self.ms) if self.ms else 0
        return {"item": item, "status": "ok", "value": item * 2}


def synthetic(engine, items: int, ms: float) -> dict:
    step = Step([], lambda r: r["item"], 3, engine=engine)
    wall, cpu = time.perf_counter(), cpu_seconds()
    rows = step.run(range(items), lambda i: i, VERSION, Work(ms), lambda i, exc: {"item": i, "status": "failed"})
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    assert [r["item"] for r in rows] == list(range(items)) and all(r["status"] == "ok" for r in rows)
    return {"wall_s": round(wall, 3), "items_per_s": round(items / wall, 1),
            "wall_ms_per_item": round(wall * 1000 / items, 3), "driver_cpu_ms_per_item": round(cpu * 1000 / items, 3)}


def ray_processes() -> dict[int, str]:
    """This machine's Ray processes by pid: ``worker`` (the processes running tasks) or ``system``
    (raylet, GCS server, log monitor, …)."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        name = proc.info["name"] or ""
        if "default_worker.py" in line or name.startswith("ray::"):
            found[proc.info["pid"]] = "worker"
        elif proc.info["pid"] != os.getpid() and (name in ("raylet", "gcs_server") or "site-packages/ray/" in line):
            found[proc.info["pid"]] = "system"  # raylet, GCS, log monitor, agents: whatever Ray started
    return found


def process_cpu(pids: dict[int, str]) -> dict[str, float]:
    """CPU seconds so far (user + system) of ``pids``, summed per kind."""
    import psutil

    total: dict[str, float] = {"worker": 0.0, "system": 0.0}
    for pid, kind in pids.items():
        try:
            times = psutil.Process(pid).cpu_times()
            total[kind] += times.user + times.system
        except psutil.Error:
            pass
    return total


def where_cpu_went(engine, items: int, ms: float, cpus: int) -> dict:
    """The synthetic stage on Ray with every process's CPU accounted: the tasks' own work (items x
    ms), the workers' time beyond it (receiving, running and returning a task), the driver (this
    process: submitting, collecting, writing rows) and Ray's system processes, against the CPU the
    run had (wall x cpus; the rest is idle). Per-CPU efficiency is work / (wall x cpus)."""
    pids = ray_processes()
    before, driver = process_cpu(pids), cpu_seconds()
    figures = synthetic(engine, items, ms)
    after, driver = process_cpu(pids), cpu_seconds() - driver
    work = items * ms / 1000
    available = figures["wall_s"] * cpus
    spent = {"task_work_s": round(work, 3),
             "worker_overhead_s": round(after["worker"] - before["worker"] - work, 3),
             "driver_s": round(driver, 3), "ray_system_s": round(after["system"] - before["system"], 3)}
    spent["idle_s"] = round(available - sum(spent.values()), 3)
    return {**figures, "cpu_available_s": round(available, 3), "cpu_spent": spent,
            "per_cpu_efficiency": round(work / available, 3),
            "worker_overhead_ms_per_item": round(spent["worker_overhead_s"] * 1000 / items, 3),
            "worker_efficiency": round(work / (work + max(spent["worker_overhead_s"], 0.0)), 3),
            "ray_processes": {k: sum(1 for v in pids.values() if v == k) for k in ("worker", "system")}}


def demo_graph(engine: str, work: Path, bucket: Path) -> dict:
    from vidassets.config import load_settings
    from vidassets.runner import local_instance, materialize_bucket

    stages = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_fingerprint", "video_analysis", "clips"]
    settings = load_settings(env={}, overrides={
        "bucket.uri": str(bucket), "store.uri": str(work / "store"), "store.eval_vault_uri": str(work / "vault"),
        "eval.fraction": 0.0, "execution.engine": engine, "execution.ray.address": "auto" if engine == "ray" else None})
    wall = time.perf_counter()
    summary = materialize_bucket(settings, local_instance(str(work / "home")), log=lambda _: None, select=stages)
    assert summary.ok, summary.render()
    wall = time.perf_counter() - wall
    analysed = summary.stages["video_analysis"].rows_out
    return {"wall_s": round(wall, 2), "videos_analysed": analysed,
            "stage_seconds": {k: round(v.seconds, 2) for k, v in summary.stages.items() if k in stages}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    import sys

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    out: dict = {"ray": ray.__version__, "items": args.items, "work_ms": args.work_ms, "cpus": args.cpus}
    ray_default = RayEngine("auto")
    ray_wide = RayEngine("auto", max_in_flight=64)
    synthetic(ray_default, 50, 0)  # warm the worker pool (process start is not per-item cost)
    out["synthetic"] = {
        "local": synthetic(LocalEngine(), args.items, args.work_ms),
        f"ray_in_flight_{ray_default.max_in_flight}": synthetic(ray_default, args.items, args.work_ms),
        "ray_in_flight_64": synthetic(ray_wide, args.items, args.work_ms),
    }
    s = out["synthetic"]
    best_ray = max(v["items_per_s"] for k, v in s.items() if k.startswith("ray"))
    out["ray_over_local_throughput"] = round(best_ray / s["local"]["items_per_s"], 3)
    out["ray_over_local_per_cpu"] = round(best_ray / args.cpus / s["local"]["items_per_s"], 3)
    out["cpu_accounting"] = where_cpu_went(ray_wide, args.items, args.work_ms, args.cpus)
    spent = out["cpu_accounting"]["cpu_spent"]
    verdict = {"Ray throughput per CPU >= 0.9x local's": {
        "ratio": out["ray_over_local_per_cpu"], "target": ">= 0.9", "met": out["ray_over_local_per_cpu"] >= 0.9,
        "cause": (f"on {args.cpus} cores the tasks' {spent['task_work_s']} CPU-s share the machine with the driver "
                  f"({spent['driver_s']} s), Ray's system processes ({spent['ray_system_s']} s) and the workers' "
                  f"own per-task handling ({spent['worker_overhead_s']} s); idle {spent['idle_s']} s. A worker "
                  f"alone spends {out['cpu_accounting']['worker_efficiency']} of its CPU on the work: on a cluster "
                  "node whose driver and GCS run elsewhere, that is its per-CPU efficiency")}}
    out["noop"] = {"local": synthetic(LocalEngine(), args.items, 0),
                   "ray_in_flight_64": synthetic(ray_wide, args.items, 0)}
    print(f"synthetic stage, {args.items} items x {args.work_ms} ms CPU: "
          + ", ".join(f"{k} {v['wall_s']} s ({v['items_per_s']} items/s)" for k, v in s.items())
          + f"; Ray/local throughput {out['ray_over_local_throughput']}, per CPU {out['ray_over_local_per_cpu']}")
    noop = out["noop"]["ray_in_flight_64"]
    print(f"no-op items on Ray: {noop['wall_ms_per_item']} ms wall and {noop['driver_cpu_ms_per_item']} ms driver CPU per item")

    from vidassets.demo.bucket import build_demo_bucket

    with tempfile.TemporaryDirectory(prefix="ray-overhead-") as tmp:
        root = Path(tmp)
        build_demo_bucket(root / "bucket", REPO / ".vidassets" / "cache")
        out["demo"] = {engine: demo_graph(engine, root / engine, root / "bucket") for engine in ("local", "ray")}
    d = out["demo"]
    out["demo"]["ray_over_local_wall"] = round(d["ray"]["wall_s"] / d["local"]["wall_s"], 3)
    print(f"demo media stages: local {d['local']['wall_s']} s, ray {d['ray']['wall_s']} s "
          f"(ray/local wall {d['ray_over_local_wall']})")

    # 3. projection: one step's driver submits and collects; the cluster computes
    nodes, cpus_per_node = 100, 16
    driver_ceiling = 1000 / max(noop["driver_cpu_ms_per_item"], 1e-3)
    analysis_s = d["local"]["stage_seconds"]["video_analysis"] / max(1, d["local"]["videos_analysed"])
    cluster_ceiling = nodes * cpus_per_node / analysis_s
    out["projection_100_nodes"] = {
        "cpus": nodes * cpus_per_node, "driver_items_per_s": round(driver_ceiling, 1),
        "analysis_s_per_demo_video": round(analysis_s, 3),
        "cluster_analysis_items_per_s": round(cluster_ceiling, 1),
        "expected_items_per_s": round(min(driver_ceiling, cluster_ceiling), 1),
        "bound_by": "driver" if driver_ceiling < cluster_ceiling else "cluster",
        "note": "demo videos are a few seconds long; a 10-minute 720p video costs ~100x the analysis CPU, "
                "moving the bound further to the cluster side"}
    p = out["projection_100_nodes"]
    print(f"100 nodes x 16 CPUs: driver ceiling {p['driver_items_per_s']} items/s, cluster ceiling "
          f"{p['cluster_analysis_items_per_s']} analysis items/s -> {p['expected_items_per_s']} ({p['bound_by']}-bound)")
    ray.shutdown()
    write_results(REPO / "bench/results/ray_overhead.json", sys.argv, out, verdict, settings=vars(args))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
