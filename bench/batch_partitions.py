"""What a batch partition costs over a partition per drop (``bucket.drops_per_partition``, issue 43
item 4): a bucket of K drops of real (generated) video, the partitioned chain run once over them as
one batch and, in a second store, as K partitions; then the same step again with nothing changed,
timed per asset: the batch's step (every drop's body, each reusing its rows) against one drop's
step. The difference is what the drops already in a batch add to a step of a new drop that joins it
(on average (K - 1) / 2 of them).

Usage: ``python bench/batch_partitions.py --drops 10 --reps 3``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from automation import CHAIN, settings_for  # noqa: E402
from common import write_results  # noqa: E402
from dagster import AssetKey, DagsterInstance, materialize  # noqa: E402

from vidassets.demo.bucket import encode  # noqa: E402
from vidassets.graph import build_definitions  # noqa: E402
from vidassets.runner import materialize_bucket  # noqa: E402

MEASURES = ("vidassets.partitions", "vidassets.stages.common", "vidassets.storage.drop_batches")
"""The code a batch step runs around each drop's body (docs/gen.py: staleness)."""


def moving_texture(seed: int, frames: int = 50, w: int = 192, h: int = 108):
    """A random texture panning right, different per seed (no two drops are duplicates)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, size=(h // 4, w // 4, 3), dtype=np.uint8).repeat(4, 0).repeat(4, 1)
    for i in range(frames):
        yield np.roll(base, i * 3, axis=1)


def bucket_of(root: Path, drops: int) -> Path:
    bucket = root / "bucket"
    for i in range(drops):
        drop = bucket / "raw" / f"web/drop-{i:04d}"
        drop.mkdir(parents=True)
        encode(moving_texture(i), drop / "texture.mp4", "libx264", 25, options={"preset": "veryfast"})
        (drop / "_SUCCESS").write_bytes(b"")
    return bucket


def step_seconds(result) -> dict[str, float]:
    return {ev.step_key: ev.event_specific_data.duration_ms / 1000 for ev in result.all_events
            if ev.event_type_value == "STEP_SUCCESS" and ev.step_key}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drops", type=int, default=10, help="K: the drops of the batch")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "batch_partitions.json"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vidassets-bench-batches-"))
    bucket = bucket_of(root, args.drops)
    setups = {}
    for k in (1, args.drops):
        where = root / f"k{k}"
        where.mkdir()
        settings = settings_for(where, str(bucket))
        settings = settings.model_copy(update={"bucket": settings.bucket.model_copy(update={"drops_per_partition": k})})
        instance = DagsterInstance.ephemeral()
        started = time.perf_counter()
        summary = materialize_bucket(settings, instance, select=CHAIN, log=lambda _: None)
        assert summary.ok, summary.render()
        defs = build_definitions(settings)
        partition = instance.get_dynamic_partitions("source_shard")[0]
        setups[k] = (defs, instance, partition, round(time.perf_counter() - started, 1))
    seconds: dict[int, list[dict[str, float]]] = {k: [] for k in setups}
    walls: dict[int, list[float]] = {k: [] for k in setups}
    for _ in range(args.reps):  # alternated: the machine's drift hits both alike
        for k, (defs, instance, partition, _) in setups.items():
            started = time.perf_counter()
            result = materialize(list(defs.assets), instance=instance, resources=defs.resources,
                                 partition_key=partition, selection=[AssetKey(n) for n in CHAIN])
            walls[k].append(time.perf_counter() - started)
            assert result.success
            seconds[k].append(step_seconds(result))
    per_asset = {name: {str(k): round(statistics.median(s[name] for s in seconds[k]), 4) for k in setups}
                 for name in CHAIN}
    k = args.drops
    one, batch = (sum(v[str(x)] for v in per_asset.values()) for x in (1, k))
    per_drop = (batch - one) / (k - 1)
    figures = {
        "drops_per_batch": k, "assets": len(CHAIN), "reps": args.reps,
        "first_run_s": {str(x): setups[x][3] for x in setups},
        "step_s_unchanged": per_asset,
        "steps_s_one_drop": round(one, 3), "steps_s_batch": round(batch, 3),
        "unchanged_drop_s_per_chain": round(per_drop, 4),
        "new_drop_in_open_batch_extra_s_mean": round(per_drop * (k - 1) / 2, 3),
        "run_wall_s": {str(x): round(statistics.median(walls[x]), 3) for x in setups},
    }
    write_results(args.out, sys.argv, figures, engine="local, in-process steps",
                  note="steps of the partitioned chain (raw_inventory to clip_embeddings) with nothing changed")
    shutil.rmtree(root, ignore_errors=True)
    print(figures)


if __name__ == "__main__":
    main()
