"""Semantic clusters over the clip embeddings (no Dagster): spherical k-means in faiss, trained once
per clustering version, then every clip (of every later drop too) assigned to its nearest centroid.

The centroids are an object of their own (``clusters/<version digest>/``: ``centroids.npy`` and
``meta.json`` saying what they were trained on); they are trained the first time enough current
embeddings exist (at least ``k``) and never again for that version: a new drop is assigned to the
existing centroids (its clusters mean what they meant yesterday), and re-clustering is an explicit
bump of ``clusters.version``, which gives a new clustering version and re-assigns every clip.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import ClusterSettings
from vidassets.runtime.engine import all_or_fail
from vidassets.storage.blobs import vector_of
from vidassets.storage.input_versions import told_every_change
from vidassets.storage.objects import ObjectStore
from vidassets.storage.partition_map import PartitionMap
from vidassets.storage.rows import RowVersion

VERSION = "clusters-v1"


def centroids_prefix(version: str) -> str:
    return f"clusters/{hashlib.sha256(version.encode()).hexdigest()[:16]}"


def current_vectors(embeddings: pd.DataFrame) -> tuple[list[dict], np.ndarray]:
    """(rows, vectors) of the ok embeddings of one table (any partitions)."""
    if not len(embeddings):
        return [], np.zeros((0, 0), dtype=np.float32)
    ok = embeddings[(embeddings.status == "ok") & embeddings.vector.notna()].sort_values("clip_id")
    rows = ok[["clip_id", "asset_id", "source_shard", "producer_version"]].to_dict("records")
    vectors = np.stack([vector_of(v) for v in ok.vector]).astype(np.float32) if len(ok) else np.zeros((0, 0), np.float32)
    return rows, vectors


def train(vectors: np.ndarray, c: ClusterSettings) -> np.ndarray:
    """k unit-norm centroids (spherical k-means, seeded; at most ``c.train_sample`` vectors, chosen
    by a seeded draw so the same corpus gives the same centroids)."""
    import faiss

    if len(vectors) > c.train_sample:
        pick = np.random.default_rng(c.seed).choice(len(vectors), c.train_sample, replace=False)
        vectors = vectors[np.sort(pick)]
    kmeans = faiss.Kmeans(vectors.shape[1], c.k, niter=c.iterations, seed=c.seed, spherical=True,
                          min_points_per_centroid=1, max_points_per_centroid=max(256, len(vectors)))
    kmeans.train(np.ascontiguousarray(vectors, dtype=np.float32))
    centroids = kmeans.centroids.astype(np.float32)
    return centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)


def load_or_train(objects: ObjectStore, version: str, c: ClusterSettings,
                  all_vectors: Callable[[], np.ndarray]) -> tuple[np.ndarray | None, dict[str, Any]]:
    """The centroids of ``version`` (trained now from ``all_vectors()`` if they do not exist yet and
    at least ``k`` vectors do) and their meta; (None, reason) while too few vectors exist."""
    prefix = centroids_prefix(version)
    if objects.exists(f"{prefix}/meta.json"):
        meta = json.loads(objects.get_bytes(f"{prefix}/meta.json"))
        return np.load(io.BytesIO(objects.get_bytes(f"{prefix}/centroids.npy"))), meta
    vectors = all_vectors()
    if len(vectors) < c.k:
        return None, {"waiting": f"{len(vectors)} current embedding(s), clustering needs at least k={c.k}"}
    centroids = train(vectors, c)
    buffer = io.BytesIO()
    np.save(buffer, centroids)
    meta = {"version": version, "k": c.k, "trained_on": int(min(len(vectors), c.train_sample)),
            "available": int(len(vectors)), "trained": datetime.now(UTC).isoformat(timespec="seconds")}
    objects.put_if_absent(f"{prefix}/centroids.npy", buffer.getvalue())
    if not objects.put_if_absent(f"{prefix}/meta.json", json.dumps(meta, indent=1).encode()):  # trained concurrently
        return load_or_train(objects, version, c, all_vectors)
    return centroids, meta


def assign(rows: Sequence[Mapping[str, Any]], vectors: np.ndarray, centroids: np.ndarray,
           version: RowVersion) -> list[dict[str, Any]]:
    """One row per clip: its nearest centroid and the cosine to it."""
    if not len(rows):
        return []
    similarity = vectors @ centroids.T
    nearest = similarity.argmax(axis=1)
    out = []
    for row, cluster, cos in zip(rows, nearest, similarity[np.arange(len(rows)), nearest], strict=True):
        v = version
        out.append({"clip_id": row["clip_id"], "asset_id": row["asset_id"], "source_shard": row["source_shard"],
                    "cluster": int(cluster), "cosine": round(float(cos), 6),
                    "producer_version": v.producer, "input_version": v.inputs, "runs": 1})
    return out


def assign_drops(embeddings_of: Callable[[str], pd.DataFrame], centroids: np.ndarray, version: RowVersion,
                 drops: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """One task of the assignment (the engine's compute; picklable when ``embeddings_of`` is): the
    rows of ``drops``' current embeddings, read where the task runs."""
    frames = [embeddings_of(p) for p in drops]
    rows, vectors = current_vectors(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
    return {"rows": assign(rows, vectors, centroids, version)}


STATE_PREFIX = "state/clip_clusters"
"""Each drop's fingerprint and clips per cluster (a ``PartitionMap``), the version, drop count and
totals in its meta."""
LEGACY_STATE = "state/clip_clusters.json"  # the state as one file, before the PartitionMap: read as none


@dataclass
class Update:
    """What one run of ``clip_clusters`` assigns: the rows of the drops that changed (None while
    there are no centroids yet), the drops, the centroids' meta, the clips per cluster over every
    drop after it; ``remember()`` after the write."""
    rows: list[dict[str, Any]] | None
    changed: set[str]
    meta: dict[str, Any]
    clips_per_cluster: dict[int, int] = field(default_factory=dict)
    _save: Callable[[], None] = lambda: None
    drops_read: int = 0

    def remember(self) -> None:
        self._save()


def update(objects: ObjectStore, fingerprints: Mapping[str, str], embeddings_of: Callable[[str], pd.DataFrame],
           version: str, full_version: str, row_version: RowVersion, c: ClusterSettings,
           changed: Iterable[str] | None = None, engine: Any = None) -> Update:
    """Assign the clips of every drop whose embeddings changed since the last run (every drop when
    the clustering or what it reads has a new version) to the centroids of ``version`` (trained now
    from every drop's current embeddings if they do not exist yet): one task per drop on ``engine``
    (None: here, in order), each reading its drop through ``embeddings_of`` where it runs (so
    ``embeddings_of`` must pickle for a Ray engine); the rows are the same wherever they ran. The state keeps each drop's
    clips per cluster and their totals, so the totals never read the table. ``changed``: the drops
    whose fingerprint may differ from the last run's (None: unknown), so only their state is read;
    a drop count kept in the state catches a change it was not told of (every drop compared then)."""
    held = PartitionMap(objects, STATE_PREFIX)
    current = held.meta.get("version") == full_version
    incremental = False
    if current and changed is not None:
        asked = set(changed)
        before = held.get(asked)
        incremental = told_every_change(int(held.meta["drops"]), asked, before, fingerprints)
    if not incremental:
        before = held.every() if current else {}
        asked = set(before) | set(fingerprints)
    redo = {p for p in asked if p in fingerprints and before.get(p, {}).get("fingerprint") != fingerprints[p]}
    gone = {p for p in asked if p in before and p not in fingerprints}

    def vectors_of(parts) -> tuple[list[dict], np.ndarray]:
        frames = [embeddings_of(p) for p in sorted(parts) if p in fingerprints]
        return current_vectors(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())

    centroids, meta = load_or_train(objects, version, c, lambda: vectors_of(fingerprints)[1])
    if centroids is None:
        return Update(None, set(), meta, drops_read=len(before))
    task = functools.partial(assign_drops, embeddings_of, centroids, row_version)
    items = [[p] for p in sorted(redo)]
    found = all_or_fail(task, items, engine, "cluster assignment", label=lambda drops: drops[0])
    rows = sorted((row for part in found for row in part["rows"]), key=lambda row: row["clip_id"])
    counts: dict[str, dict[str, int]] = {p: {} for p in redo}
    for row in rows:
        drop = counts.setdefault(row["source_shard"], {})
        drop[str(row["cluster"])] = drop.get(str(row["cluster"]), 0) + 1
    totals: Counter[str] = Counter(held.meta["totals"]) if incremental else Counter()
    for part, value in before.items():
        if incremental and part in redo | gone:
            totals.subtract(value["clusters"])
        elif not incremental and part not in redo | gone:
            totals.update(value["clusters"])
    for drop in counts.values():
        totals.update(drop)
    totals = Counter({k: n for k, n in totals.items() if n > 0})

    def save() -> None:
        values = {p: {"fingerprint": fingerprints[p], "clusters": counts.get(p, {})} for p in redo}
        state = {"version": full_version, "drops": len(fingerprints), "totals": dict(totals)}
        if incremental:
            held.write({**values, **dict.fromkeys(gone)}, state)
        else:
            held.write({**{p: v for p, v in before.items() if p not in redo | gone}, **values}, state, whole=True)
        objects.delete(LEGACY_STATE)

    return Update(rows, redo | gone, meta, {int(k): n for k, n in sorted(totals.items(), key=lambda kv: int(kv[0]))},
                  save, drops_read=len(before))


def cluster_table(samples: pd.DataFrame, k: int | None, examples: int = 3) -> list[dict[str, Any]]:
    """Per cluster of a set of samples (``cluster``, ``tier``, ``clip_id``): size, share, tiers and a
    few example clips."""
    if not len(samples) or "cluster" not in samples:
        return []
    known = samples[samples.cluster.notna()]
    clusters = range(k) if k else sorted(known.cluster.astype(int).unique())
    out = []
    for cluster in clusters:
        members = known[known.cluster.astype(int) == cluster]
        out.append({"cluster": int(cluster), "size": len(members),
                    "share": round(len(members) / len(known), 4) if len(known) else 0.0,
                    "tiers": {str(t): int(n) for t, n in members.tier.fillna("none").value_counts().sort_index().items()},
                    "examples": sorted(members.clip_id)[:examples]})
    return out


def coverage(table: Sequence[Mapping[str, Any]], groups: Mapping[str, Sequence[int]], targets: Mapping[str, float],
             tolerance: float = 0.5) -> dict[str, Any]:
    """Each cluster group's share against its target (normalised; no targets = uniform over the
    clusters: each group's target is its number of clusters / k). A group is under-represented below
    (1 - tolerance) × target and over-represented above (1 + tolerance) × target."""
    if not table:
        return {"groups": {}, "under": [], "over": []}
    k = len(table)
    member = {int(c): name for name, ids in groups.items() for c in ids}
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for row in table:
        name = member.get(int(row["cluster"]), f"cluster-{row['cluster']}" if not groups else "other")
        sizes[name] = sizes.get(name, 0) + int(row["size"])
        counts[name] = counts.get(name, 0) + 1
    total = sum(sizes.values()) or 1
    if targets:
        norm = sum(targets.values())
        wanted = {name: targets.get(name, 0.0) / norm for name in sorted(set(sizes) | set(targets))}
    else:
        wanted = {name: counts[name] / k for name in sizes}
    report = {name: {"share": round(sizes.get(name, 0) / total, 4), "target": round(t, 4)} for name, t in wanted.items()}
    under = sorted(n for n, r in report.items() if r["share"] < (1 - tolerance) * r["target"])
    over = sorted(n for n, r in report.items() if r["target"] > 0 and r["share"] > (1 + tolerance) * r["target"])
    return {"groups": report, "under": under, "over": over}
