"""Bytes a one-drop snapshot writes when shards are shared across snapshots (issue 44, item 2).

A synthetic corpus of ``--drops`` drops of ``--per-drop`` samples (random bf16 latents of Wan-VAE
shape for 17 frames at 480x848, 16x5x60x106, about 1 MB each, a 384-d text embedding), written through
``write_shards`` (the code ``training_shards`` runs) as snapshot A; then one more drop lands and
snapshot B (A's samples + the new drop's) is written. Side by side in one run: B through the shared
CAS (what vidassets does) and B written whole into a fresh store (every snapshot copying every
latent again, as before). Target: B's bytes written <= 1.2x the new drop's own latents.
Results: ``bench/results/snapshot.json``.

    python bench/snapshot.py [--drops 100] [--per-drop 5]
"""

from __future__ import annotations

import argparse
import json
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
from vidassets.train.shards import write_shards  # noqa: E402

SHAPE = (16, 5, 60, 106)


def drop_samples(objects, drop: int, per_drop: int, rng: np.random.Generator) -> tuple[pd.DataFrame, dict, int]:
    rows, vectors, latent_bytes = [], {}, 0
    for i in range(per_drop):
        clip = f"{drop:06d}{i:026x}"
        bucket = "f17_848x480" if i % 4 else "f17_480x848"
        key = latent_key(clip, "bench", bucket)
        data = latents_bytes(torch.from_numpy(rng.standard_normal(SHAPE, dtype=np.float32)), "bf16", {})
        objects.put_bytes(key, data)
        latent_bytes += len(data)
        rows.append({"clip_id": clip, "asset_id": f"{drop:06d}{i:058x}", "source_uri": f"file:///raw/{drop}/{i}.mp4",
                     "source_shard": f"web/drop-{drop:06d}", "tier": "T1", "stream": "web", "bucket": bucket,
                     "first_frame": 0, "last_frame": 100, "latent_key": key, "latent_version": "bench",
                     "latent_shape": json.dumps(SHAPE), "dtype": "bf16", "license": "cc-by",
                     "captions": '{"level_1": "a clip"}', "caption_version": "c"})
        vectors[clip] = rng.standard_normal(384).astype(np.float32)
    return pd.DataFrame(rows), vectors, latent_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drops", type=int, default=100)
    parser.add_argument("--per-drop", type=int, default=5)
    parser.add_argument("--shard-mb", type=float, default=256.0)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "snapshot.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shard_bytes = int(args.shard_mb * 1024 * 1024)
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        tmp = Path(tmp)
        objects = open_object_store(str(tmp / "store"))
        parts, vectors = [], {}
        for drop in range(args.drops):
            frame, v, _ = drop_samples(objects, drop, args.per_drop, rng)
            parts.append(frame)
            vectors |= v
        a = pd.concat(parts, ignore_index=True)
        started = time.perf_counter()
        first = write_shards(objects, tmp / "store" / "shards" / "v1", a, vectors, shard_bytes)
        a_seconds = time.perf_counter() - started
        frame, v, new_latent_bytes = drop_samples(objects, args.drops, args.per_drop, rng)
        vectors |= v
        b = pd.concat([a, frame], ignore_index=True)
        started = time.perf_counter()
        shared = write_shards(objects, tmp / "store" / "shards" / "v2", b, vectors, shard_bytes)
        shared_seconds = time.perf_counter() - started
        # the baseline: B written whole (no earlier shards to reference), into a store of its own
        fresh = open_object_store(str(tmp / "fresh"))
        for key in sorted(b.latent_key):
            fresh.put_bytes(key, objects.get_bytes(key))
        started = time.perf_counter()
        whole = write_shards(fresh, tmp / "fresh" / "shards" / "v2", b, vectors, shard_bytes)
        whole_seconds = time.perf_counter() - started
    ratio = shared.bytes_written / new_latent_bytes
    result = {**provenance(sys.argv), "settings": vars(args),
              "figures": {
                  "snapshot_a": {"samples": len(a), "shards": first.new_shards, "bytes_written": first.bytes_written,
                                 "seconds": round(a_seconds, 2)},
                  "new_drop_latent_bytes": new_latent_bytes,
                  "snapshot_b_shared": {"new_shards": shared.new_shards, "reused_shards": shared.reused_shards,
                                        "bytes_written": shared.bytes_written, "bytes_reused": shared.bytes_reused,
                                        "seconds": round(shared_seconds, 2)},
                  "snapshot_b_whole": {"new_shards": whole.new_shards, "bytes_written": whole.bytes_written,
                                       "seconds": round(whole_seconds, 2)}},
              "ratios": {"b_shared_bytes_over_new_drop_latents": round(ratio, 3),
                         "b_whole_bytes_over_b_shared_bytes": round(whole.bytes_written / shared.bytes_written, 1),
                         "b_whole_seconds_over_b_shared_seconds": round(whole_seconds / shared_seconds, 1)},
              "verdict": {"one-drop snapshot writes <= 1.2x the drop's own latents": {"value": round(ratio, 3),
                                                                                       "met": ratio <= 1.2}}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("figures", "ratios", "verdict")}, indent=1))


if __name__ == "__main__":
    main()
