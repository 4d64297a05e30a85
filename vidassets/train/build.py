"""Glue between a snapshot, its shards and its plan (no Dagster): build or reuse shards for a
snapshot version, and build the plan from the snapshot and the shard index."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from vidassets.config import TrainSettings

if TYPE_CHECKING:
    from vidassets.curate.selection import Recipe
from vidassets.curate.curriculum import Curriculum
from vidassets.derive.latents import DTYPES
from vidassets.derive.text_embeddings import load_states
from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
from vidassets.storage.tables import TableStore
from vidassets.train.exports import vjepa_list, write_vjepa_list
from vidassets.train.plan import PhaseSpec, TrainPlan, single_phase
from vidassets.train.shards import (
    states_array,
    text_states_for,
    text_vectors_for,
    variant_vectors_for,
    write_shards,
)
from vidassets.train.snapshot import SNAPSHOTS, read_snapshot, samples_at_resolutions


def shards_prefix(version: int) -> str:
    return f"shards/v{version}"


def read_index(objects: ObjectStore, version: int) -> pd.DataFrame:
    key = f"{shards_prefix(version)}/index.parquet"
    if not objects.exists(key):
        raise FileNotFoundError(f"no shards for snapshot v{version}: materialize training_shards first")
    return from_parquet_bytes(objects.get_bytes(key))


def build_shards(tables: TableStore, version: int, shard_mb: float) -> dict:
    """Shards for snapshot ``version`` (reused when they exist with the same shard size)."""
    objects = tables.objects
    prefix = shards_prefix(version)
    meta_key = f"{prefix}/shards.json"
    if objects.exists(meta_key):
        meta = json.loads(objects.get_bytes(meta_key))
        if meta.get("shard_mb") == shard_mb:
            return {**meta, "reused": True}
        raise FileExistsError(f"shards of snapshot v{version} exist with shard_mb={meta.get('shard_mb')}; "
                              "shards are immutable: make a new snapshot to re-shard")
    samples = read_snapshot(objects, version)
    text = tables.read_all("text_embeddings")
    vectors = text_vectors_for(text, samples)
    recipe = snapshot_recipe(objects, version)
    levels = recipe.curriculum.caption_levels(recipe.captions.level)
    variants = variant_vectors_for(text, samples, levels[1:])
    states = text_states_for(text, samples, levels)
    local_root = getattr(objects, "root", None)  # a local store: the snapshot's directory in place
    local = Path(local_root) / prefix if local_root is not None else None
    with tempfile.TemporaryDirectory(prefix="vidassets-shards-") as tmp:
        root = Path(local) if local else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        written = write_shards(objects, root, samples_at_resolutions(samples), vectors, int(shard_mb * 1024 * 1024),
                               variants, states, levels[0])
        index = written.index
        streams = sorted(samples.stream.unique())
        vjepa, vjepa_skipped = vjepa_list(samples, tables.read_all("clip_ladder"), objects.local_path, streams)
        meta = {"snapshot": version, "shard_mb": shard_mb, "samples": int(index.clip_id.nunique()),
                "members": len(index), "resolutions": sorted(int(r) for r in index.resolution.dropna().unique()),
                "buckets": sorted(index.bucket.unique()),
                "shards": int(index.shard.nunique()), "streams": streams,
                "latents_dtype": str(samples.dtype.iloc[0]) if len(samples) else "bf16", "reused": False,
                "cas": written.shards, "new_shards": written.new_shards, "bytes_written": written.bytes_written,
                "reused_shards": written.reused_shards, "bytes_reused": written.bytes_reused}
        meta["latents_dtype"] = DTYPES.get(meta["latents_dtype"], meta["latents_dtype"])
        meta["vjepa_list"] = {"samples": len(vjepa), "skipped": len(vjepa_skipped)}
        meta["text_states"] = _states_meta(objects, text, states)
        (root / "index.parquet").write_bytes(to_parquet_bytes(index, compression="snappy"))
        write_vjepa_list(vjepa, vjepa_skipped, streams, root)
        (root / "shards.json").write_text(json.dumps(meta, indent=1))  # last: the snapshot's shards are complete
        if not local:  # an object store without a local path (S3): upload the snapshot's files
            for path in sorted(root.rglob("*"), key=lambda p: p.name == "shards.json"):  # shards.json last
                if path.is_file():
                    objects.put_bytes(f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())
    return meta


def _states_meta(objects: ObjectStore, text: pd.DataFrame, states: dict[str, dict[str, str]]) -> dict | None:
    """The token states' padded length and stored dtype (one encoder per snapshot), or None without states."""
    keys = sorted({key for levels in states.values() for key in levels.values()})
    if not keys:
        return None
    lengths = sorted(text[text.token_key.isin(keys)].max_tokens.dropna().astype(int).unique())
    if len(lengths) != 1:
        raise ValueError(f"a snapshot's token states must share one text length, found {lengths}")
    states, _ = load_states(objects, keys[0])
    return {"max_tokens": int(lengths[0]), "dtype": states_array(states)[1]}


PLAN_COLUMNS = ["clip_id", "asset_id", "stream", "tier", "cluster", "captions"]


def build_plan(objects: ObjectStore, version: int, t: TrainSettings) -> TrainPlan:
    """The plan of snapshot ``version``: its own recipe's curriculum (phases, mixtures, caption
    variants: frozen with the snapshot) over its samples and shard index."""
    samples = read_snapshot(objects, version)
    samples = samples[[c for c in PLAN_COLUMNS if c in samples]]
    index = read_index(objects, version)
    if "resolution" not in index:  # shards written before latents.resolutions: one resolution
        index = index.assign(resolution=pd.Series(pd.NA, index=index.index, dtype="Int64"), primary=True)
    samples = samples.merge(index[["clip_id", "bucket", "shard", "resolution", "primary"]], on="clip_id")
    recipe = snapshot_recipe(objects, version)
    return TrainPlan(samples, phase_specs(recipe.curriculum), t.seed, t.global_batch, version,
                     caption_variants=dict(recipe.curriculum.caption_variants), caption_default=recipe.captions.level)


def phase_specs(curriculum: Curriculum) -> list[PhaseSpec]:
    if not curriculum.phases:
        return single_phase()
    specs, start = [], 0
    for phase in curriculum.phases:
        specs.append(PhaseSpec(phase.name, start, phase.until_step, dict(phase.mixture),
                               tuple(phase.tiers) if phase.tiers is not None else None, dict(phase.max_epochs),
                               phase.resolution))
        start = phase.until_step or start
    return specs


def snapshot_recipe(objects: ObjectStore, version: int) -> Recipe:
    """The recipe a snapshot was made with (its frozen copy)."""
    from vidassets.curate.selection import recipe_from_text

    return recipe_from_text(objects.get_bytes(f"{SNAPSHOTS}/v{version}/recipe.yaml").decode(), f"snapshot v{version}")
