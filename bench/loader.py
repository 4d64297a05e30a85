"""The training loader reading shards locally and from S3, side by side in one run (issue 44, item 3).

A synthetic snapshot (random bf16 latents of Wan-VAE shape for 17 frames at 480x848, 16x5x60x106,
about 1 MB a sample, with a 384-d text embedding), written by the same code as ``training_shards``
(WebDataset tars + energon index), is read by ``PlanDataset``:

- **local**: the shard directory on disk;
- **S3**: the same shards on the moto S3 server on loopback (boto3 over HTTP, one range request per
  sample), without prefetch and with ``--prefetch`` steps read ahead on ``--threads`` threads.

Figures per source: samples/s reading back to back; with a training step of ``--compute-ms`` between
batches, the mean and p95 time a step waited on data (``fetch_wait_s``); time to the first batch at
step 0 and at step 1,000,000 (a cold plan, as after a restart: no replay). Results:
``bench/results/loader.json``.

    python bench/loader.py [--samples 600] [--steps 40] [--batch 8] [--compute-ms 100]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, provenance  # noqa: E402

from vidassets.derive.latents import latent_key, latents_bytes  # noqa: E402
from vidassets.storage import open_object_store  # noqa: E402
from vidassets.storage.objects import S3ObjectStore, s3_client  # noqa: E402
from vidassets.train.loader import PlanDataset, StoreShards  # noqa: E402
from vidassets.train.plan import TrainPlan, single_phase  # noqa: E402
from vidassets.train.shards import write_shards  # noqa: E402

SHAPE = (16, 5, 60, 106)


def corpus(tmp: Path, n: int, shard_mb: float) -> tuple[Path, pd.DataFrame, pd.DataFrame]:
    objects = open_object_store(str(tmp / "store"))
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        clip = f"{i:032x}"
        bucket = "f17_848x480" if i % 4 else "f17_480x848"
        key = latent_key(clip, "bench", bucket)
        objects.put_bytes(key, latents_bytes(torch.from_numpy(rng.standard_normal(SHAPE, dtype=np.float32)), "bf16", {}))
        rows.append({"clip_id": clip, "asset_id": f"{i:064x}", "source_uri": f"file:///raw/{i}.mp4",
                     "source_shard": "t/d", "source_tier": "t", "drop_id": "d", "license": "cc-by",
                     "tier": "T1", "stream": ["web", "licensed", "synthetic"][i % 3], "bucket": bucket,
                     "first_frame": 0, "last_frame": 100, "latent_key": key, "latent_version": "bench",
                     "latent_shape": json.dumps(SHAPE), "dtype": "bf16",
                     "captions": '{"level_1": "x"}', "caption_version": "c"})
    samples = pd.DataFrame(rows)
    vectors = {c: rng.standard_normal(384).astype(np.float32) for c in samples.clip_id}
    root = tmp / "shards"
    index = write_shards(objects, root, samples, vectors, int(shard_mb * 1024 * 1024)).index
    (root / "shards.json").write_text('{"latents_dtype": "bfloat16"}')
    return root, samples, index


def plan_of(samples: pd.DataFrame, index: pd.DataFrame, batch: int) -> TrainPlan:
    merged = samples[["clip_id", "stream", "tier", "captions"]].merge(index[["clip_id", "bucket", "shard"]], on="clip_id")
    return TrainPlan(merged, single_phase({"web": 0.5, "licensed": 0.3, "synthetic": 0.2}), seed=0,
                     global_batch=batch, snapshot_version=1)


def measure(name: str, make, plan_samples: pd.DataFrame, batch: int, steps: int, compute_s: float) -> dict:
    """Throughput back to back, waits with a training step between batches, first-batch times."""
    best = 0.0
    for _ in range(2):  # best of two: the page cache and the server warm for every source alike
        loader = make(plan_of_cached(plan_samples, batch), steps=steps)
        started = time.perf_counter()
        n = sum(len(b["clip_ids"]) for b in loader)
        best = max(best, n / (time.perf_counter() - started))
    loader = make(plan_of_cached(plan_samples, batch), steps=steps)
    waits = []
    for b in loader:
        waits.append(b["fetch_wait_s"])
        time.sleep(compute_s)  # the training step
    first = {}
    for start in (0, 1_000_000):
        fresh = TrainPlan(plan_samples, single_phase({"web": 0.5, "licensed": 0.3, "synthetic": 0.2}), 0, batch, 1)
        started = time.perf_counter()
        next(iter(make(fresh, steps=1, start_step=start)))
        first[start] = time.perf_counter() - started
    out = {"samples_per_s": round(best, 1), "fetch_wait_mean_ms": round(1000 * statistics.mean(waits[1:]), 2),
           "fetch_wait_p95_ms": round(1000 * float(np.percentile(waits[1:], 95)), 2),
           "first_batch_step0_ms": round(1000 * first[0], 1), "first_batch_step1e6_ms": round(1000 * first[1_000_000], 1),
           "first_batch_ratio_1e6_over_0": round(first[1_000_000] / first[0], 2)}
    print(name, json.dumps(out))
    return out


_plans: dict = {}


def plan_of_cached(plan_samples: pd.DataFrame, batch: int) -> TrainPlan:
    if batch not in _plans:
        _plans[batch] = TrainPlan(plan_samples, single_phase({"web": 0.5, "licensed": 0.3, "synthetic": 0.2}), 0, batch, 1)
    return _plans[batch]


def moto_calibration(client) -> dict[str, float]:
    """ms per 1 MiB range GET from objects of 2, 16 and 128 MiB on this server."""
    client.create_bucket(Bucket="calibration")
    out = {}
    for mib in (2, 16, 128):
        client.put_object(Bucket="calibration", Key=f"o{mib}", Body=os.urandom(mib << 20))
        started = time.perf_counter()
        for i in range(5):
            start = (i % (mib - 1)) << 20
            client.get_object(Bucket="calibration", Key=f"o{mib}", Range=f"bytes={start}-{start + (1 << 20) - 1}")["Body"].read()
        out[str(mib)] = round((time.perf_counter() - started) / 5 * 1000, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--compute-ms", type=float, default=100.0, help="the training step between batches")
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--shard-mb", type=float, default=16.0,
                        help="shard size: moto reads a whole object per range request (see moto_range_ms)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "loader.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # its own process (not a thread of this one): the server's Python does not share the loader's GIL
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = s3_client(f"http://127.0.0.1:{port}")
        for _ in range(100):
            try:
                client.list_buckets()
                break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.1)
        moto_range_ms = moto_calibration(client)
        client.create_bucket(Bucket="shards")
        with tempfile.TemporaryDirectory() as tmp:
            root, samples, index = corpus(Path(tmp), args.samples, args.shard_mb)
            started = time.perf_counter()
            for path in sorted(root.rglob("*")):
                if path.is_file():
                    client.upload_file(str(path), "shards", f"v1/{path.relative_to(root).as_posix()}")
            upload_s = time.perf_counter() - started
            plan_samples = plan_of(samples, index, args.batch).samples
            remote = StoreShards(S3ObjectStore(client, "shards"), "v1")
            compute = args.compute_ms / 1000
            figures = {
                "local": measure("local", lambda plan, **kw: PlanDataset(plan, root, index, 0, 1, **kw),
                                 plan_samples, args.batch, args.steps, compute),
                "s3": measure("s3", lambda plan, **kw: PlanDataset(plan, remote, index, 0, 1, fetch_threads=1, **kw),
                              plan_samples, args.batch, args.steps, compute),
                f"s3_prefetch{args.prefetch}": measure(
                    "s3+prefetch", lambda plan, **kw: PlanDataset(plan, remote, index, 0, 1, prefetch_steps=args.prefetch,
                                                                  fetch_threads=args.threads, **kw),
                    plan_samples, args.batch, args.steps, compute),
            }
    finally:
        server.terminate()
        server.wait()
    prefetched = figures[f"s3_prefetch{args.prefetch}"]
    result = {**provenance(sys.argv), "settings": vars(args), "sample_bytes": int(np.prod(SHAPE)) * 2,
              "upload_seconds": round(upload_s, 1), "figures": figures,
              "moto_range_ms": {"note": "moto's own cost of a 1 MiB range GET by object size: it reads the whole "
                                        "object per request (S3 does not), so the S3 figures here are a floor set "
                                        "by moto, with shards of --shard-mb", "by_object_mib": moto_range_ms},
              "ratios": {"s3_over_local_samples_per_s": round(figures["s3"]["samples_per_s"] / figures["local"]["samples_per_s"], 2),
                         "s3_prefetch_over_local_samples_per_s": round(prefetched["samples_per_s"] / figures["local"]["samples_per_s"], 2),
                         "s3_prefetch_over_s3_samples_per_s": round(prefetched["samples_per_s"] / figures["s3"]["samples_per_s"], 2)},
              "verdict": {
                  "time to first batch at step 10^6 within 2x of step 0 (every source)": all(
                      f["first_batch_ratio_1e6_over_0"] <= 2 for f in figures.values()),
                  "prefetch hides the S3 fetch behind the training step (mean wait < 10% of the step)":
                      prefetched["fetch_wait_mean_ms"] < 0.1 * args.compute_ms}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"ratios": result["ratios"], "verdict": result["verdict"]}, indent=1))


if __name__ == "__main__":
    main()
