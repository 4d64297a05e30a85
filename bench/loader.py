"""The training loader, side by side in one run:
(a) samples/s reading latents from local shards by byte offset (PlanDataset), vs
(b) reading the same samples' latents straight from their per-clip safetensors blobs; and
time to the first batch when resuming at step 1,000,000 vs step 0 (target: within 2x, no replay).

    python bench/loader.py [--samples 4000] [--steps 200]

The corpus is synthetic (random bf16 latents of Wan-VAE shape for 17 frames at 480x848:
16x5x60x106), written through the same code as `latents` (safetensors blobs) and
`training_shards` (WebDataset tars + energon index); two buckets, three streams.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from vidassets.derive.latents import latent_key, latents_bytes, load_latents
from vidassets.storage import open_object_store
from vidassets.train.loader import PlanDataset
from vidassets.train.plan import Mixture, TrainPlan
from vidassets.train.shards import write_shards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        objects = open_object_store(str(tmp / "store"))
        rng = np.random.default_rng(0)
        rows = []
        shape = (16, 5, 60, 106)
        for i in range(args.samples):
            clip = f"{i:032x}"
            bucket = "f17_848x480" if i % 4 else "f17_480x848"
            key = latent_key(clip, "bench", bucket)
            objects.put_bytes(key, latents_bytes(torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)), "bf16", {}))
            rows.append({"clip_id": clip, "asset_id": f"{i:064x}", "source_uri": f"file:///raw/{i}.mp4",
                         "source_shard": "t/d", "source_tier": "t", "drop_id": "d", "license": "cc-by",
                         "tier": "T1", "stream": ["web", "licensed", "synthetic"][i % 3], "bucket": bucket,
                         "first_frame": 0, "last_frame": 100, "latent_key": key, "latent_version": "bench",
                         "captions": '{"level_1": "x"}', "caption_version": "c"})
        samples = pd.DataFrame(rows)
        root = tmp / "shards"
        t0 = time.perf_counter()
        index = write_shards(objects, root, 1, samples, {}, 256 * 1024 * 1024)
        (root / "shards.json").write_text('{"latents_dtype": "bfloat16"}')
        print(f"{args.samples} samples of {shape} bf16: shards written in {time.perf_counter() - t0:.1f} s")
        plan = TrainPlan(samples.merge(index[["clip_id", "shard"]], on="clip_id")[["clip_id", "bucket", "stream", "shard"]],
                         Mixture({"web": 0.5, "licensed": 0.3, "synthetic": 0.2}), seed=0, global_batch=args.batch,
                         snapshot_version=1)
        bucket_of = dict(zip(samples.clip_id, samples.bucket, strict=True))

        def from_shards() -> float:
            t0 = time.perf_counter()
            n = sum(len(b["clip_ids"]) for b in PlanDataset(plan, root, index, rank=0, world_size=1, steps=args.steps))
            return n / (time.perf_counter() - t0)

        def from_blobs() -> float:
            t0 = time.perf_counter()
            m = 0
            for step in range(args.steps):
                batch = [load_latents(objects, latent_key(clip, "bench", bucket_of[clip]))[0]
                         for clip in plan.rank_batch(step, 0, 1)]
                torch.stack(batch)
                m += len(batch)
            return m / (time.perf_counter() - t0)

        shards_rate = blob_rate = 0.0
        for _ in range(3):  # interleaved, best of three: page cache and plan caches warm for both
            shards_rate = max(shards_rate, from_shards())
            blob_rate = max(blob_rate, from_blobs())
        print(f"(a) shards by byte offset:   {shards_rate:8.1f} samples/s")
        print(f"(b) per-clip latents blobs:  {blob_rate:8.1f} samples/s   (a)/(b) = {shards_rate / blob_rate:.2f}")
        times = {}
        for start in (0, 1_000_000):
            fresh = TrainPlan(plan.samples, plan.mixture, 0, args.batch, 1)  # cold caches, as after a restart
            t0 = time.perf_counter()
            next(iter(PlanDataset(fresh, root, index, rank=0, world_size=1, start_step=start, steps=1)))
            times[start] = time.perf_counter() - t0
        ratio = times[1_000_000] / times[0]
        print(f"time to first batch: step 0 {times[0] * 1000:.1f} ms, step 1,000,000 {times[1_000_000] * 1000:.1f} ms, "
              f"ratio {ratio:.2f} (target <= 2: {'MET' if ratio <= 2 else 'NOT MET'})")


if __name__ == "__main__":
    main()
