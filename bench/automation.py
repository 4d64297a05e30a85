"""Automation at scale: what one new drop costs as the bucket grows (issue 15).

For each N, on SQLite and (``--postgres``) on a real PostgreSQL server:

1. **A store of N drops**: one drop of real files (the demo's carphone.mp4) curated up to its scores
   and embeddings with the real graph, then cloned N times under new drop keys with fresh ids,
   PDQ hashes and embeddings (every tenth clone a near copy of the one before, so duplicate groups
   exist), so the global stages see N drops of realistic rows.
2. **A Dagster instance** holding N ``source_shard`` partitions and the materialization history of
   every partitioned asset of each (what N drops leave behind), and a **bucket** listing N drops:
   a local directory and (``--s3``) the moto S3 server on loopback (listing paginated).
3. **One new drop lands**, and we time what the daemon does for it, one tick each:
   - ``bucket_drop_sensor`` (list N drops, add the new one),
   - the automation sensor (``evaluate_automation_conditions`` over N partitions) and which
     partitions it requests,
   - ``global_stages_sensor`` and ``selected_clips_sensor``,
   - the global stages (dedup, decontamination, selection) materialized for the new drop's rows,
     ``--reps`` times on copies of the same store (restored, the new drop cloned, the disk synced
     before the clock starts: else the first fsync flushes a freshly written store, a cost no real
     store has), each step's time split into the stage's own code (its asset body, timed inside the
     step) and what Dagster does around it against an instance holding N drops of history,
   - GraphQL: the asset page of ``clips`` (partition stats, N partitions) from a real webserver.
   Runs per new drop = runs requested by those ticks (the real-daemon test counts the same with
   ``dagster dev``).

Above ``--dagster-only-above`` drops (default 1,000) only Dagster's side is measured (the instance's
history, the bucket listing, the ticks, GraphQL): cloning a store of 10^4 drops takes hours here. On
PostgreSQL the history is written in batched inserts (``store_event_batch``).

Results go to ``--out`` as JSON and PNG plots (docs/scale.md).
Usage: ``python bench/automation.py --sizes 10,100,1000 --postgres --s3``, then
``python bench/automation.py --sizes 10000 --postgres --no-sqlite --s3 --append``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import HOUR_NS, clock_shifted  # noqa: E402
from dagster import (  # noqa: E402
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    SensorResult,
    build_sensor_context,
    evaluate_automation_conditions,
)

from vidassets import catalog  # noqa: E402
from vidassets.config import load_settings  # noqa: E402
from vidassets.graph import build_definitions  # noqa: E402
from vidassets.partitions import source_shards  # noqa: E402
from vidassets.runner import local_instance, materialize_bucket  # noqa: E402
from vidassets.storage import TableStore, open_object_store  # noqa: E402
from vidassets_tests.conftest import (  # noqa: E402
    SAMPLE_CACHE,
    SMALL_LATENTS,
    free_port,
    postgres_dagster_yaml,
    postgres_server,
)

GLOBAL = [a.name for a in catalog.of_kind("global")]
PARTITIONED = [a.name for a in catalog.ASSETS if a.partitioned]
CHAIN = [a.name for a in catalog.feeding_global()]
CLONED_TABLES = ("raw_inventory", "clips", "context_frames", "clip_embeddings", "clip_scores")
SEED = "web/drop-00000"
TARGET = 1.3
"""What one new drop may cost at the largest size measured, over the smallest (issue 43)."""
TESTER_TICK = True  # also time the bare testing call (``--no-tester``: it re-reads every key ~600 times a tick)
REPS = 3
"""Timed global runs per size (``--reps``), each on a copy of the same store."""


def drop_key(i: int) -> str:
    return f"web/drop-{i:05d}"


def settings_for(root: Path, bucket_uri: str):
    """Compute-light settings: small latents and rungs, and a recipe without score thresholds (every
    clip is decided by duplicates alone, so a near copy can flip an old drop's clip)."""
    recipe = root / "recipe.yaml"
    if not recipe.exists():
        from vidassets.curate.selection import load_recipe

        recipe.write_text(json.dumps(load_recipe().model_copy(update={"name": "bench", "score_rules": []})
                                     .model_dump(mode="json")))
    return load_settings(env={}, overrides={
        "bucket.uri": bucket_uri, "store.uri": str(root / "store"), "store.eval_vault_uri": str(root / "vault"),
        "eval.fraction": 0.0, "selection.recipe": str(recipe), **SMALL_LATENTS})


def seed_store(root: Path) -> None:
    """The real graph on one drop of a real file, up to scores and embeddings."""
    from vidassets.demo.bucket import build_demo_bucket

    demo = root / "demo" / "bucket"
    build_demo_bucket(demo, SAMPLE_CACHE)
    drop = root / "seed-bucket/raw" / SEED
    drop.mkdir(parents=True)
    for name in ("carphone.mp4", "bikes.mp4"):
        shutil.copy(demo / "raw/licensed/drop-0001" / name, drop / name)
    (drop / "_SUCCESS").write_bytes(b"")
    settings = settings_for(root, str(root / "seed-bucket"))
    summary = materialize_bucket(settings, local_instance(str(root / "seed-home")),
                                 select=[*CHAIN], log=lambda _: None)
    assert summary.ok, summary.render()


def clone(tables: TableStore, i: int, rng: np.random.Generator) -> None:
    """Drop ``i``: the seed drop's rows under new ids, PDQ hashes and embeddings; every tenth clone a
    near copy of the one before (a few bits / a little noise), so duplicate groups form."""
    key = drop_key(i)
    near = i % 10 == 0 and i > 1
    masks: dict[str, bytes] = {}

    def new_id(old: str) -> str:
        return hashlib.sha256(f"{old}:clone{i}".encode()).hexdigest()[: len(old)]

    def mask(asset: str) -> np.ndarray:
        if asset not in masks:
            seeded = np.random.default_rng(int(hashlib.sha256(f"{asset}:{i - near}".encode()).hexdigest()[:8], 16))
            masks[asset] = seeded.integers(0, 256, 32, dtype=np.uint8)
        return masks[asset]

    for table in CLONED_TABLES:
        frame = tables.read(table, SEED).copy()
        if table == "context_frames":
            hashes = []
            for asset, h in zip(frame.asset_id, frame.pdq_hash, strict=True):
                bits = np.frombuffer(bytes.fromhex(h), np.uint8) ^ mask(asset)
                if near:
                    bits = bits.copy()
                    bits[int(rng.integers(32))] ^= 1
                hashes.append(bits.tobytes().hex())
            frame["pdq_hash"] = hashes
        if table == "clip_embeddings":
            vectors = []
            for clip, v in zip(frame.clip_id, frame.vector, strict=True):
                seeded = np.random.default_rng(int(hashlib.sha256(f"{clip}:{i - near}".encode()).hexdigest()[:8], 16))
                vec = seeded.normal(size=len(v) // 4).astype(np.float32)
                if near:
                    vec = vec + rng.normal(scale=0.01, size=vec.shape).astype(np.float32)
                vectors.append((vec / np.linalg.norm(vec)).astype(np.float32).tobytes() if v else v)
            frame["vector"] = vectors
        for column in ("clip_id", "asset_id"):
            if column in frame:
                frame[column] = [new_id(c) for c in frame[column]]
        if "source_shard" in frame:
            frame["source_shard"] = key
        if table == "raw_inventory":
            frame["drop_id"] = key.split("/")[-1]
            frame["key"] = [k.replace(SEED, key) for k in frame.key]
            frame["uri"] = [u.replace(SEED, key) for u in frame.uri]
        tables.write(table, key, frame)


def history(instance: DagsterInstance, keys: list[str], batch: int = 2_000) -> None:
    """What N finished drops leave in the instance: their partitions and a materialization of every
    partitioned asset of each, then one of each global asset. Written in batches of ``batch`` events
    per statement where the event log supports it (PostgreSQL's ``store_event_batch``), the same rows
    a materialization reported one at a time writes."""
    from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
    from dagster._core.events.log import EventLogEntry
    from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID

    instance.add_dynamic_partitions(source_shards.name, keys)
    storage = instance.event_log_storage

    def entry(name: str, key: str | None) -> EventLogEntry:
        event = DagsterEvent(event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
                             event_specific_data=StepMaterializationData(AssetMaterialization(name, partition=key)),
                             job_name=RUNLESS_JOB_NAME)
        return EventLogEntry(user_message="", level=20, job_name=RUNLESS_JOB_NAME, run_id=RUNLESS_RUN_ID,
                             error_info=None, timestamp=time.time(), step_key=None, dagster_event=event)

    if type(storage).__module__.startswith("dagster_postgres"):  # SQLite's batch stores one at a time
        pending = []
        for key in keys:
            pending += [entry(name, key) for name in PARTITIONED]
            if len(pending) >= batch:
                storage.store_event_batch(pending)
                pending = []
        if pending:
            storage.store_event_batch(pending)
    else:
        for key in keys:
            for name in PARTITIONED:
                instance.report_runless_asset_event(AssetMaterialization(name, partition=key))
    for name in GLOBAL:
        instance.report_runless_asset_event(AssetMaterialization(name))


def bucket_dirs(root: Path, n: int) -> Path:
    bucket = root / "bucket"
    for i in range(n + 1):
        drop = bucket / "raw" / drop_key(i)
        drop.mkdir(parents=True, exist_ok=True)
        (drop / "_SUCCESS").write_bytes(b"")
        (drop / "a.mp4").write_bytes(b"\0" * 16)
    return bucket


@contextlib.contextmanager
def s3_bucket(n: int, name: str):
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      VIDASSETS_S3_ENDPOINT_URL=endpoint)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=name)  # moto's servers in one process share one backend: a bucket per size
    for i in range(n + 1):
        for file in ("_SUCCESS", "a.mp4"):
            client.put_object(Bucket=name, Key=f"raw/{drop_key(i)}/{file}", Body=b"")
    try:
        yield f"s3://{name}"
    finally:
        server.stop()
        os.environ.pop("VIDASSETS_S3_ENDPOINT_URL", None)


@contextlib.contextmanager
def partition_keys_read_once_per_tick(instance: DagsterInstance):
    """The automation daemon evaluates a tick, and serializes its cursor, through a per-tick caching
    queryer (``CachingInstanceQueryer.get_dynamic_partitions``): the dynamic partition keys are read
    from the database once a tick. Dagster's testing entry point ``evaluate_automation_conditions``
    serializes the cursor against the bare instance instead, re-reading every key once per condition
    node (634 reads of N keys a tick here). This gives the testing entry point the daemon's cache
    (the bench times both: ``automation_tick_s`` as the daemon pays it, ``automation_tick_tester_s``
    the bare testing call)."""
    read = instance.get_dynamic_partitions
    cache: dict[str, list[str]] = {}

    def cached(partitions_def_name: str) -> list[str]:
        if partitions_def_name not in cache:
            cache[partitions_def_name] = read(partitions_def_name)
        return cache[partitions_def_name]

    instance.get_dynamic_partitions = cached
    try:
        yield
    finally:
        del instance.get_dynamic_partitions


def timed(fn, repeat: int = 1):
    times, out = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def bucket_tick(settings, instance: DagsterInstance) -> tuple[float, int]:
    defs = build_definitions(settings)
    sensor = next(s for s in defs.sensors if s.name == "bucket_drop_sensor")
    seconds, result = timed(lambda: sensor(build_sensor_context(instance=instance, definitions=defs,
                                                                resources=defs.resources)), repeat=3)
    return seconds, len(result.run_requests) if isinstance(result, SensorResult) else 0


def graphql_seconds(root: Path, home: Path, settings_env: dict[str, str]) -> float | None:
    """Median seconds of the asset page query of ``clips`` against a real webserver."""
    port = free_port()
    env = {**os.environ, **settings_env, "DAGSTER_HOME": str(home)}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dagster-webserver"), "-m", "vidassets.definitions",
                             "-h", "127.0.0.1", "-p", str(port)], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    query = {"query": "query { assetNodeOrError(assetKey: {path: [\"clips\"]}) { ... on AssetNode { "
                      "partitionStats { numMaterialized numPartitions numFailed numMaterializing } "
                      "assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions } } } } }"}
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            return None

        def ask():
            request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", json.dumps(query).encode(),
                                             {"Content-Type": "application/json"})
            body = json.loads(urllib.request.urlopen(request, timeout=300).read())
            assert "errors" not in body, body
            return body

        ask()  # the first query loads the code location
        seconds, _ = timed(ask, repeat=3)
        return seconds
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def one_size(n: int, backend: str, s3: bool, work: Path, seed_root: Path, pg_port: int | None,
             dagster_only: bool = False) -> dict:
    """One N. ``dagster_only``: the instance, bucket and ticks only (no store of N drops, no global
    stages, no runs count): what Dagster itself costs at sizes where cloning the store takes hours."""
    root = work / f"{backend}-{n}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copytree(seed_root / "store", root / "store")
    out: dict = {"n": n, "backend": backend, "dagster_only": dagster_only}
    home = root / "home"
    home.mkdir()
    if backend == "postgres":
        db = f"bench_{n}_{int(time.time())}"
        bindir = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin/createdb"))[-1]).parent
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(pg_port), "-U", "vidassets", db],
                       check=True)
        (home / "dagster.yaml").write_text(postgres_dagster_yaml(pg_port, db))
    else:
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.from_config(str(home))
    tables = TableStore(open_object_store(str(root / "store")))
    rng = np.random.default_rng(n)
    started = time.perf_counter()
    # the old drops landed two hours ago and the global stages last ran an hour ago (the journal's
    # clock shifted for those writes): the journal's look-back window of the timed run then holds the
    # new drop alone, as in a store where drops land less often than that (``global_delta.py``)
    with clock_shifted(2 * HOUR_NS):
        for i in range(1, 0 if dagster_only else n):
            clone(tables, i, rng)
    out["clone_seconds"] = round(time.perf_counter() - started, 2)
    old = [drop_key(i) for i in range(n)]
    started = time.perf_counter()
    history(instance, old)
    out["history_seconds"] = round(time.perf_counter() - started, 2)

    bucket = bucket_dirs(root, n)  # the N old drops and the new one, drop n
    settings = settings_for(root, str(bucket))
    new = drop_key(n)
    # the global stages over the N old drops (their state), untimed
    if not dagster_only:
        with clock_shifted(HOUR_NS):
            assert materialize_bucket(settings, DagsterInstance.ephemeral(), select=GLOBAL, add_partitions=False,
                                      log=lambda _: None).ok
        shutil.copytree(root / "store", root / "store.base")

    # 1. the bucket sensor sees the new drop (local listing; S3 listing through moto)
    out["bucket_tick_s"], requested = bucket_tick(settings, instance)
    assert requested == 1, requested
    if s3:
        with s3_bucket(n, f"bench-{backend}-{n}") as uri:
            out["bucket_tick_s3_s"], requested = bucket_tick(settings_for(root, uri), instance)
            assert requested == 1, requested
    # 2. its ingest lands; the automation sensor's tick over N + 1 partitions
    defs = build_definitions(settings)
    baseline = evaluate_automation_conditions(defs, instance)
    instance.add_dynamic_partitions(source_shards.name, [new])
    for name in ("raw_inventory", "eval_split"):
        instance.report_runless_asset_event(AssetMaterialization(name, partition=new))
    with partition_keys_read_once_per_tick(instance):
        out["automation_tick_s"], evaluation = timed(lambda: evaluate_automation_conditions(
            defs, instance, cursor=baseline.cursor))
    if TESTER_TICK:
        out["automation_tick_tester_s"], _ = timed(lambda: evaluate_automation_conditions(defs, instance,
                                                                                         cursor=baseline.cursor))
    requested_parts = {p for name in catalog.NAMES for p in evaluation.get_requested_partitions(AssetKey(name))}
    out["automation_requested_partitions"] = sorted(str(p) for p in requested_parts)
    # 3. its chain ran: the global-stages sensor asks for one run; the global stages run for its rows
    for name in CHAIN:
        if name not in ("raw_inventory", "eval_split"):
            instance.report_runless_asset_event(AssetMaterialization(name, partition=new))
    sensors = {s.name: s for s in defs.sensors}
    out["global_sensor_tick_s"], result = timed(
        lambda: sensors["global_stages_sensor"](build_sensor_context(instance=instance, definitions=defs,
                                                                       resources=defs.resources)))
    global_runs = len(result.run_requests) if isinstance(result, SensorResult) else 0
    env = {"VIDASSETS_BUCKET": str(bucket), "VIDASSETS_STORE": str(root / "store"),
           "VIDASSETS_EVAL_VAULT": str(root / "vault")}
    if dagster_only:
        out["global_runs_requested"] = global_runs
        out["graphql_asset_page_s"] = graphql_seconds(root, home, env)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    def tables_of() -> TableStore:
        return TableStore(open_object_store(str(root / "store")))

    reps = []
    figures, summary = timed_global_run(root, settings, instance, tables_of, n)
    reps.append(figures)
    out["selection_clips_decided"] = summary.stages["selection"].extra.get("rows_computed")
    # 4. the selected-clips sensor asks for the work on the drops whose decisions changed
    out["selected_sensor_tick_s"], result = timed(
        lambda: sensors["selected_clips_sensor"](build_sensor_context(instance=instance, definitions=defs,
                                                                       resources=defs.resources)))
    changed = len(result.run_requests) if isinstance(result, SensorResult) else 0
    out["runs_per_new_drop"] = 1 + len({p for p in requested_parts if p}) + global_runs + changed
    out["drops_changed"] = changed
    for _ in range(REPS - 1):  # the same new drop again on the same store (the instance holds one more run)
        reps.append(timed_global_run(root, settings, instance, tables_of, n)[0])
    out["reps"] = len(reps)
    out["global_stages_s"] = statistics.median(r["global_stages_s"] for r in reps)
    out["global_stages_s_each"] = [round(r["global_stages_s"], 3) for r in reps]
    for key in ("global_step_s", "global_body_s"):
        out[key] = {name: round(statistics.median(r[key][name] for r in reps), 4) for name in reps[0][key]}
        out[f"{key}_each"] = {name: [round(r[key][name], 4) for r in reps] for name in reps[0][key]}
    out["global_partitions_looked_up"] = reps[0]["global_partitions_looked_up"]  # the new drop's alone
    out["global_dagster_s"] = {name: round(out["global_step_s"][name] - out["global_body_s"][name], 4)
                               for name in out["global_step_s"]}
    # 5. the asset page of an asset with N + 1 partitions
    out["graphql_asset_page_s"] = graphql_seconds(root, home, env)
    for key, value in list(out.items()):
        if isinstance(value, float):
            out[key] = round(value, 4)
    return out


@contextlib.contextmanager
def bodies_timed(names: list[str], seconds: dict[str, list[float]]):
    """While open, the asset bodies of ``names`` (the stage code each Dagster step runs) record their
    own wall time in ``seconds`` (the definitions built meanwhile use the timed bodies)."""
    import functools

    from vidassets.stages import common

    saved = {name: common._ASSETS[name] for name in names}

    def timed_body(name: str, fn):
        @functools.wraps(fn)  # Dagster reads the body's parameters through ``__wrapped__``
        def body(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds.setdefault(name, []).append(time.perf_counter() - started)
        return body

    for name, (fn, extra) in saved.items():
        common._ASSETS[name] = (timed_body(name, fn), extra)
    try:
        yield
    finally:
        common._ASSETS.update(saved)


def timed_global_run(root: Path, settings, instance: DagsterInstance, tables_of, n: int) -> tuple[dict, object]:
    """The global stages for new drop ``n`` on a fresh copy of the store after the N old drops' run
    (``store.base``), the disk synced first: the run's wall seconds, each step's Dagster seconds and
    its body's own seconds."""
    shutil.rmtree(root / "store")
    shutil.copytree(root / "store.base", root / "store")
    clone(tables_of(), n, np.random.default_rng(n))
    os.sync()
    bodies: dict[str, list[float]] = {}
    with bodies_timed(GLOBAL, bodies):
        started = time.perf_counter()
        summary = materialize_bucket(settings, instance, select=GLOBAL, add_partitions=False, log=lambda _: None)
        wall = time.perf_counter() - started
    assert summary.ok, summary.render()
    steps = {name: summary.stages[name].seconds for name in GLOBAL if name in summary.stages}
    return {"global_stages_s": wall, "global_step_s": steps,
            "global_body_s": {name: sum(bodies.get(name, [])) for name in steps},
            "global_partitions_looked_up": {name: instance.get_latest_materialization_event(AssetKey(name))
                                            .asset_materialization.metadata["input_partitions_looked_up"].value
                                            for name in steps}}, summary


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("automation_tick_s", "automation tick as the daemon pays it (s)"), ("bucket_tick_s", "bucket sensor tick, local (s)"),
               ("bucket_tick_s3_s", "bucket sensor tick, S3/moto (s)"), ("global_stages_s", "global stages per new drop (s)"),
               ("graphql_asset_page_s", "GraphQL asset page (s)"), ("runs_per_new_drop", "runs per new drop")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, title) in zip(axes.ravel(), metrics, strict=True):
        for backend in sorted({r["backend"] for r in results}):
            rows = sorted((r for r in results if r["backend"] == backend and r.get(key) is not None), key=lambda r: r["n"])
            if rows:
                ax.plot([r["n"] for r in rows], [r[key] for r in rows], marker="o", label=backend)
        ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("drops (N)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "automation.png", dpi=90)


def main() -> None:
    global TESTER_TICK, REPS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--postgres", action="store_true", help="also on a real PostgreSQL server (Debian package)")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only (with --postgres)")
    parser.add_argument("--s3", action="store_true", help="also list the bucket through the moto S3 server")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--dagster-only-above", type=int, default=1000,
                        help="sizes above this: instance, bucket and ticks only (no store clone, no global stages)")
    parser.add_argument("--append", action="store_true", help="add to the results in --out instead of replacing them "
                        "(a Dagster-only row over a full row of the same size updates its Dagster-side numbers)")
    parser.add_argument("--no-tester", action="store_true", help="skip timing the bare testing call")
    parser.add_argument("--reps", type=int, default=REPS, help="timed global runs per size (on copies of one store)")
    args = parser.parse_args()
    TESTER_TICK, REPS = not args.no_tester, args.reps
    sizes = [int(s) for s in args.sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="vidassets-bench-automation-"))
    seed_root = work / "seed"
    if not (seed_root / "store").exists():
        # stamped three hours back, before the old drops: a timed run's journal look-back must hold
        # the new drop alone (the seed drop's records, written now, would be looked up again each run)
        with clock_shifted(3 * HOUR_NS):
            seed_store(seed_root)
    from common import write_results  # bench/common.py (on the path: this script's folder)

    stored = json.loads((out / "automation.json").read_text()) if args.append and (out / "automation.json").exists() else {}
    results: list[dict] = stored.get("figures", {}).get("rows", []) if isinstance(stored, dict) else stored
    backends = ([] if args.no_sqlite else ["sqlite"]) + (["postgres"] if args.postgres else [])
    with contextlib.ExitStack() as stack:
        pg_port = stack.enter_context(postgres_server()) if args.postgres else None
        for backend in backends:
            for n in sizes:
                row = one_size(n, backend, args.s3, work, seed_root, pg_port, dagster_only=n > args.dagster_only_above)
                print(json.dumps(row), flush=True)
                earlier = [r for r in results if (r["n"], r["backend"]) == (n, backend)]
                if earlier and row["dagster_only"] and not earlier[0].get("dagster_only"):
                    # Dagster's side re-measured over a full row: keep its store-side numbers
                    row = {**earlier[0], **row, "dagster_only": False, "dagster_side_remeasured": True}
                results = [r for r in results if (r["n"], r["backend"]) != (n, backend)] + [row]
                write_results(out / "automation.json", sys.argv, {"rows": results}, verdicts(results))
    plot(results, out)


def verdicts(rows: list[dict]) -> dict:
    """Per backend, the targets these rows can judge: each global stage's step and the global run per
    new drop at the largest full size over the smallest (<= TARGET), and the runs a new drop costs
    (its ingest, its chain, one global run, one run per drop whose decisions changed). The
    automation tick's target (<= 10 s at 10^4 drops) is judged in the real daemon
    (bench/daemon_ticks.py); the ticks here are in-process."""
    out: dict = {}
    for backend in sorted({r["backend"] for r in rows}):
        full = sorted((r for r in rows if r["backend"] == backend and not r.get("dagster_only")), key=lambda r: r["n"])
        if len(full) >= 2:
            low, high = full[0], full[-1]
            pairs = [("global stages per new drop", low["global_stages_s"], high["global_stages_s"])]
            pairs += [(f"{name} step", low["global_step_s"][name], high["global_step_s"][name]) for name in GLOBAL
                      if name in low["global_step_s"] and name in high["global_step_s"]]
            pairs += [(f"{name} stage code", low["global_body_s"][name], high["global_body_s"][name]) for name in GLOBAL
                      if name in low.get("global_body_s", {}) and name in high.get("global_body_s", {})]
            for label, a, b in pairs:
                ratio = b / a
                out[f"{backend}: {label} {high['n']}/{low['n']}"] = {
                    "ratio": round(ratio, 3), "target": TARGET, "met": ratio <= TARGET}
        for r in full:
            out[f"{backend}: runs for the new drop at {r['n']} = 3 + drops changed"] = {
                "runs": r["runs_per_new_drop"], "drops_changed": r["drops_changed"],
                "met": r["runs_per_new_drop"] == 3 + r["drops_changed"]}
    return out


if __name__ == "__main__":
    main()
