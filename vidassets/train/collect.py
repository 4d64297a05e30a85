"""Retiring snapshots and collecting the shards no live snapshot references (no Dagster).

Shards live once in the CAS (``shards.CAS``) and snapshots reference them (``shards/v<N>/shards.json``,
``cas``). A snapshot is live until it is retired (``vidassets snapshot retire N``: a marker, nothing
deleted) and while a registered training run trains on it (``runs/``). ``collect_shards`` deletes a
CAS shard only after it has been referenced by no live snapshot for a whole lease (first seen
unreferenced: ``shards/cas/_unreferenced.json``), so a snapshot being written, or a loader still
reading a just-retired snapshot, never loses a shard under it. A retired snapshot's own directory
(the hard links energon indexes, a local store's view of its shards) goes a lease after retirement.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vidassets.storage.objects import ObjectStore
from vidassets.train.runs import read_runs
from vidassets.train.shards import CAS
from vidassets.train.snapshot import SNAPSHOTS, snapshot_versions

UNREFERENCED = f"{CAS}/_unreferenced.json"
DEFAULT_LEASE_S = 7 * 24 * 3600


def retired_key(version: int) -> str:
    return f"{SNAPSHOTS}/v{version}/retired.json"


def retire_snapshot(objects: ObjectStore, version: int, reason: str = "") -> None:
    if version not in snapshot_versions(objects):
        raise ValueError(f"no snapshot v{version} (known: {snapshot_versions(objects)})")
    objects.put_bytes(retired_key(version), json.dumps({"retired": time.time(), "reason": reason}).encode())


def live_snapshots(objects: ObjectStore) -> list[int]:
    """Snapshots not retired, and retired ones a registered run trains on."""
    trained_on = {run.snapshot for run in read_runs(objects)}
    return [v for v in snapshot_versions(objects) if not objects.exists(retired_key(v)) or v in trained_on]


def collect_shards(objects: ObjectStore, lease_s: float = DEFAULT_LEASE_S, now: float | None = None) -> dict[str, Any]:
    """Delete the CAS shards no live snapshot has referenced for ``lease_s`` seconds; returns what
    was kept, started its lease, and deleted (shards and bytes)."""
    now = time.time() if now is None else now
    live = live_snapshots(objects)
    referenced: set[str] = set()
    for version in live:
        key = f"shards/v{version}/shards.json"
        if objects.exists(key):
            referenced |= set(json.loads(objects.get_bytes(key)).get("cas", []))
    since: dict[str, float] = json.loads(objects.get_bytes(UNREFERENCED)) if objects.exists(UNREFERENCED) else {}
    out = {"live_snapshots": live, "referenced": 0, "leased": 0, "deleted": 0, "bytes_deleted": 0}
    for info in list(objects.list(f"{CAS}/")):
        if not info.key.endswith(".tar"):
            continue
        if info.key in referenced:
            since.pop(info.key, None)
            out["referenced"] += 1
            continue
        first = since.setdefault(info.key, now)
        if now - first < lease_s:
            out["leased"] += 1
            continue
        objects.delete(info.key)
        objects.delete(info.key.removesuffix(".tar") + ".members.json")
        since.pop(info.key)
        out["deleted"] += 1
        out["bytes_deleted"] += info.size
    for version in sorted(set(snapshot_versions(objects)) - set(live)):  # a retired snapshot's links, after its lease
        if now - json.loads(objects.get_bytes(retired_key(version)))["retired"] < lease_s:
            continue
        for info in list(objects.list(f"shards/v{version}/")):
            if info.key.endswith(".tar") or "/.nv-meta/" in info.key:
                objects.delete(info.key)
    objects.put_bytes(UNREFERENCED, json.dumps(since, indent=1).encode())
    return out
