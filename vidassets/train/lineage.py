"""Lineage queries over the catalog (DuckDB over the Parquet tables, not Dagster internals):
everything known about one training sample, from its source object to the snapshots holding it."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pandas as pd

from vidassets import catalog
from vidassets.storage.parquet import from_parquet_bytes
from vidassets.storage.tables import TableStore
from vidassets.train.runs import runs_of_clip
from vidassets.train.snapshot import read_snapshot, snapshot_versions


def _connect(tables: TableStore) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for name in catalog.all_tables():  # every table the catalog declares, so none can be forgotten
        frame = tables.read_all(name)
        con.register(name, frame)
    return con


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records", date_format="iso"))


def sample_lineage(tables: TableStore, clip_id: str) -> dict[str, Any]:
    """Source uri, drop, license (and the near-duplicate copies of its footage with theirs), every score with version, dedup groups, annotations with versions,
    latent key, ladder rungs, audio, the snapshots containing it (or excluding it, with why) and the
    registered training runs that saw it, with their steps."""
    con = _connect(tables)
    clip = con.execute("SELECT * FROM clips WHERE clip_id = ?", [clip_id]).df()
    if clip.empty:
        raise KeyError(f"no clip {clip_id!r} in {tables.uri}")
    asset_id = clip.asset_id.iloc[0]
    out: dict[str, Any] = {"clip": _records(clip)[0]}
    out["sources"] = _records(con.execute(
        "SELECT uri, source_shard, source_tier, drop_id, license, territory, crawl_url, duplicate_of, object_version, "
        "producer_version FROM raw_inventory WHERE asset_id = ? ORDER BY uri", [asset_id]).df())
    prints = tables.read_all("video_fingerprints")
    copies = (prints[prints.near_duplicate_of == asset_id][["asset_id", "uri", "source_tier", "match"]]
              if len(prints) and "near_duplicate_of" in prints else pd.DataFrame(columns=["asset_id", "uri"]))
    licenses = tables.read_all("raw_inventory")
    if len(copies) and len(licenses):  # the near-duplicate copies decided onto this footage, with their licenses
        copies = copies.merge(licenses[["uri", "license"]], on="uri", how="left")
    out["near_duplicate_copies"] = _records(copies.sort_values("uri"))
    out["probe"] = _records(con.execute(
        "SELECT status, reason, codec, width, height, fps_avg, duration_s, producer_version FROM video_probe "
        "WHERE asset_id = ?", [asset_id]).df())
    out["scores"] = _records(con.execute(
        "SELECT score, value, kill, status, producer_version FROM clip_scores WHERE clip_id = ? ORDER BY score",
        [clip_id]).df())
    out["dedup"] = _records(con.execute("SELECT * EXCLUDE (asset_id, source_shard) FROM dedup_groups WHERE clip_id = ?",
                                        [clip_id]).df())
    out["decontamination"] = _records(con.execute("SELECT * FROM decontamination WHERE clip_id = ?", [clip_id]).df())
    out["selection"] = _records(con.execute(
        "SELECT decision, first_failed_rule, tier, rank_score, recipe, recipe_hash, producer_version FROM selection "
        "WHERE clip_id = ?", [clip_id]).df())
    out["annotations"] = _records(con.execute(
        "SELECT kind, status, reason, model_id, prompt_version, schema_version, producer_version, value "
        "FROM annotations WHERE clip_id = ? ORDER BY kind, producer_version", [clip_id]).df())
    out["latents"] = _records(con.execute(
        "SELECT status, bucket, frames_from, latent_key, latent_shape, dtype, mean, std, producer_version FROM latents "
        "WHERE clip_id = ?", [clip_id]).df())
    out["text_embeddings"] = _records(con.execute(
        "SELECT caption_version, caption_level, text_sha256, producer_version FROM text_embeddings WHERE clip_id = ?",
        [clip_id]).df())
    out["ladder"] = _records(con.execute(
        "SELECT rung, status, width, height, fps, blob_key, producer_version FROM clip_ladder WHERE clip_id = ?",
        [clip_id]).df())
    out["audio"] = _records(con.execute(
        "SELECT audio_status, reason, blob_key, loudness_dbfs, producer_version FROM clip_audio WHERE clip_id = ?",
        [clip_id]).df())
    snapshots = []
    for version in snapshot_versions(tables.objects):
        samples = read_snapshot(tables.objects, version)
        if clip_id in set(samples.clip_id):
            entry: dict[str, Any] = {"snapshot": version, "included": True}
            shards_key = f"shards/v{version}/index.parquet"
            if tables.objects.exists(shards_key):
                index = from_parquet_bytes(tables.objects.get_bytes(shards_key))
                hit = index[index.clip_id == clip_id]
                rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items() if k != "clip_id"}
                        for _, row in hit.iterrows()]
                if rows:  # one per latents resolution; "shard": the primary one's
                    entry["shard"] = next((r for r in rows if r.get("primary", True)), rows[0])
                    entry["shards"] = rows
            snapshots.append(entry)
            continue
        excluded = read_snapshot(tables.objects, version, "excluded")
        hit = excluded[excluded.clip_id == clip_id]
        if len(hit):
            snapshots.append({"snapshot": version, "included": False, "reason": hit.reason.iloc[0],
                              "detail": hit.detail.iloc[0]})
    out["snapshots"] = snapshots
    out["training_runs"] = runs_of_clip(tables.objects, clip_id)  # which registered runs saw it, at which steps
    return out
