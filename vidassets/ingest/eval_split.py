"""Eval carve-out: a salted hash of ``asset_id`` routes a fixed fraction of assets to the eval vault.

Routing depends on the asset's bytes and its source tier's share only (``eval.fraction``, or the
tier's own share in ``eval.fraction_by_tier``: a small licensed tier can give a larger share so that
it has eval material at all). Within a tier, exact duplicates (same ``asset_id``) always land on the
same side. Model-generated assets (``synthetic`` in the inventory) are never routed to eval: eval
material must be real footage. Changing the salt or a share re-routes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from vidassets.storage.schemas import SAMPLE_MEDIA_TYPES

VERSION = "eval-split-v1"


def is_eval(asset_id: str, salt: str, fraction: float) -> bool:
    if fraction <= 0.0:
        return False
    digest = hashlib.sha256(f"{salt}\x00{asset_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


Share = float | Callable[[str], float]
"""The eval share: one for every tier, or per source tier."""


def split_rows(
    inventory_rows: Iterable[dict[str, Any]], salt: str, fraction: Share, producer_version: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows) over the readable video and image rows of an inventory."""
    share = fraction if callable(fraction) else (lambda _tier: fraction)
    train: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for row in inventory_rows:
        if row["status"] != "ok" or row["media_type"] not in SAMPLE_MEDIA_TYPES:
            continue
        real = not bool(row.get("synthetic") or False)
        split = "eval" if real and is_eval(row["asset_id"], salt, share(row.get("source_tier", ""))) else "train"
        out = {
            "uri": row["uri"],
            "asset_id": row["asset_id"],
            "source_shard": row["source_shard"],
            "split": split,
            "duplicate_of": row.get("duplicate_of"),
            "producer_version": producer_version,
        }
        (evals if split == "eval" else train).append(out)
    return train, evals


def split_changes(previous: Iterable[dict[str, Any]], inventory_rows: Iterable[dict[str, Any]], salt: str,
                  fraction: Share, producer_version: str) -> list[dict[str, Any]]:
    """The routing rows (train and eval) that differ from ``previous`` (both sides): what a split
    with these settings computes anew."""
    before = {(r["uri"], r["split"], r["producer_version"]) for r in previous}
    train, evals = split_rows(inventory_rows, salt, fraction, producer_version)
    return [r for r in train + evals if (r["uri"], r["split"], r["producer_version"]) not in before]
