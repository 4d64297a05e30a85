"""Exact duplicates across every drop, first-seen wins.

The first partition to ingest an ``asset_id`` claims it in the store's asset registry
(``registry/assets/<aa>/<asset_id>.json``, created only if absent: an atomic link locally, a
conditional PUT on S3), so two drops ingested concurrently still agree on one canonical copy.
Re-ingesting the canonical drop finds its own claim and stays canonical, so results do not depend
on how often or in what order partitions are re-materialized. Within a drop, the lowest URI wins.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vidassets.storage.objects import ObjectStore


def claim_key(asset_id: str) -> str:
    return f"registry/assets/{asset_id[:2]}/{asset_id}.json"


def mark_exact_duplicates(rows: Sequence[dict[str, Any]], registry: ObjectStore) -> int:
    """Set ``duplicate_of`` / ``duplicate_of_uri`` on every non-canonical ok row; returns how many."""
    canonical_uri: dict[str, str] = {}
    duplicates = 0
    for row in sorted(rows, key=lambda r: r["uri"]):
        asset_id = row.get("asset_id")
        if row["status"] != "ok" or not asset_id:
            continue
        if asset_id not in canonical_uri:
            canonical_uri[asset_id] = _claim(registry, asset_id, row)
        owner = canonical_uri[asset_id]
        if owner != row["uri"]:
            row["duplicate_of"] = asset_id
            row["duplicate_of_uri"] = owner
            duplicates += 1
        else:
            row["duplicate_of"] = None
            row["duplicate_of_uri"] = None
    return duplicates


def _claim(registry: ObjectStore, asset_id: str, row: dict[str, Any]) -> str:
    record = {"uri": row["uri"], "source_shard": row["source_shard"], "size": row["size"]}
    key = claim_key(asset_id)
    if registry.put_if_absent(key, json.dumps(record, sort_keys=True).encode()):
        return row["uri"]
    return json.loads(registry.get_bytes(key))["uri"]
