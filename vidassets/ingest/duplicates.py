"""Exact duplicates across every drop: one canonical copy per asset, by a rule, not by ingest order.

Every ok copy of an asset is registered in the store's asset registry
(``registry/assets/<aa>/<asset_id>/copies/<uri digest>.json``: its URI, drop, tier and license), so
the asset keeps the provenance of all its copies. The canonical copy is the best registered copy by
``ingest.tier_priority`` (e.g. licensed > partner > crawl; unlisted tiers after the listed ones, in
name order), then the lowest URI: the same whatever order the drops arrive in.

Exactly one drop holds an asset at a time, recorded in ``.../owner.json``. The holder is the only
drop that decodes and analyses the asset. When a better copy arrives in another drop, the change
goes through the holder: the better copy's drop asks the holder's drop to ingest again (``requests``);
the holder then *releases* the asset: it hands its rows of that asset over to the new holder's
partition (``TableStore.hand_over``: same bytes, so no re-decode) and records the new owner, who takes
it at its next ingest. A claim with no holder is taken create-if-absent (an atomic link locally, a
conditional PUT on S3), so two drops ingesting at once still agree on one holder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vidassets.storage.objects import ObjectStore


def asset_prefix(asset_id: str) -> str:
    return f"registry/assets/{asset_id[:2]}/{asset_id}"


def _copy_key(asset_id: str, uri: str) -> str:
    return f"{asset_prefix(asset_id)}/copies/{hashlib.sha256(uri.encode()).hexdigest()[:32]}.json"


def _owner_key(asset_id: str) -> str:
    return f"{asset_prefix(asset_id)}/owner.json"


def copies_of(registry: ObjectStore, asset_id: str) -> list[dict[str, Any]]:
    """Every registered copy of an asset (uri, source_shard, source_tier, license), by URI."""
    found = [json.loads(registry.get_bytes(info.key)) for info in registry.list(f"{asset_prefix(asset_id)}/copies/")]
    return sorted(found, key=lambda c: c["uri"])


def rank(tier_priority: Sequence[str]) -> Callable[[dict[str, Any]], tuple]:
    """Sort key of a copy under the canonical rule: tier priority, then URI."""
    order = {tier: i for i, tier in enumerate(tier_priority)}
    return lambda c: (order.get(c["source_tier"], len(order)), "" if c["source_tier"] in order else c["source_tier"],
                      c["uri"])


@dataclass
class CanonicalOutcome:
    duplicates: int = 0
    requests: set[str] = field(default_factory=set)
    """Drops that must ingest again: a holder that should release, or a drop that should claim."""
    released: dict[str, str] = field(default_factory=dict)
    """asset_id -> the drop it was released to."""


def mark_canonical(rows: Sequence[dict[str, Any]], previous: Sequence[dict[str, Any]], registry: ObjectStore,
                   tier_priority: Sequence[str], partition: str,
                   hand_over: Callable[[str, dict[str, Any]], None] = lambda asset, to: None) -> CanonicalOutcome:
    """Register this drop's copies (and forget copies gone since ``previous``), then set
    ``duplicate_of`` / ``duplicate_of_uri`` on every ok row that is not its asset's copy held here.
    ``hand_over(asset_id, new canonical copy)`` moves this drop's rows of a released asset."""
    out = CanonicalOutcome()
    here = [r for r in rows if r["status"] == "ok" and r.get("asset_id")]
    present = {r["uri"] for r in here}
    gone = [r for r in previous if r.get("status") == "ok" and r.get("asset_id") and r["uri"] not in present]
    for row in gone:
        registry.delete(_copy_key(row["asset_id"], row["uri"]))
    for row in here:
        record = {k: row.get(k) for k in ("uri", "source_shard", "source_tier", "license")}
        key = _copy_key(row["asset_id"], row["uri"])
        if not registry.exists(key):
            registry.put_bytes(key, json.dumps(record, sort_keys=True).encode())
    best_first = rank(tier_priority)
    holding: dict[str, str | None] = {}  # asset -> uri of the copy held here (None: held elsewhere / by nobody)
    for asset in sorted({r["asset_id"] for r in here} | {r["asset_id"] for r in gone}):
        copies = copies_of(registry, asset)
        best = min(copies, key=best_first) if copies else None
        holding[asset] = _settle(registry, asset, copies, best, partition, out, hand_over)
    for row in sorted(here, key=lambda r: r["uri"]):
        held = holding.get(row["asset_id"])
        if held == row["uri"]:
            row["duplicate_of"] = row["duplicate_of_uri"] = None
        else:
            owner = _read_owner(registry, row["asset_id"])
            row["duplicate_of"] = row["asset_id"]
            row["duplicate_of_uri"] = held or (owner["uri"] if owner else None)
            out.duplicates += 1
    return out


def _read_owner(registry: ObjectStore, asset: str) -> dict[str, Any] | None:
    key = _owner_key(asset)
    return json.loads(registry.get_bytes(key)) if registry.exists(key) else None


def _settle(registry: ObjectStore, asset: str, copies: list[dict], best: dict | None, partition: str,
            out: CanonicalOutcome, hand_over: Callable[[str, dict[str, Any]], None]) -> str | None:
    """Who holds ``asset`` after this drop's ingest; returns the URI of the copy held here, if any."""
    uris = {c["uri"] for c in copies}
    owner = _read_owner(registry, asset)
    if owner is not None and owner["uri"] not in uris:  # the held copy is gone
        if owner["source_shard"] == partition and best is not None and best["source_shard"] != partition:
            hand_over(asset, best)  # its rows are still here: pass them on
        registry.delete(_owner_key(asset))
        owner = None
    if best is None:
        return None
    if owner is None:
        if best["source_shard"] != partition:
            out.requests.add(best["source_shard"])  # the best copy's drop takes it
            return None
        if registry.put_if_absent(_owner_key(asset), json.dumps(best, sort_keys=True).encode()):
            return best["uri"]
        owner = _read_owner(registry, asset)  # claimed concurrently
        assert owner is not None
    if owner["source_shard"] == partition:
        if owner["uri"] == best["uri"]:
            return owner["uri"]
        if best["source_shard"] == partition:  # a better copy in this same drop
            registry.put_bytes(_owner_key(asset), json.dumps(best, sort_keys=True).encode())
            return best["uri"]
        hand_over(asset, best)  # release: rows first, then the record
        registry.put_bytes(_owner_key(asset), json.dumps(best, sort_keys=True).encode())
        out.released[asset] = best["source_shard"]
        out.requests.add(best["source_shard"])
        return None
    if owner["uri"] != best["uri"]:
        out.requests.add(owner["source_shard"])  # the holder must release (to us or a third drop)
    return None
