"""Drops (source shards): ``raw/<source_tier>/<drop_id>/`` in the bucket, and when one is complete.

A drop is complete, and may be ingested, when:

- ``completion: marker`` (default): its marker object (``_SUCCESS`` by default) exists. Writers
  upload every file first and the marker last, so a half-uploaded drop is never ingested.
- ``completion: quiet``: it holds at least one object and none changed for ``quiet_seconds``,
  for buckets whose writers leave no marker.

The partition key of a drop is ``<source_tier>/<drop_id>``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Container
from dataclasses import dataclass

from vidassets.config import BucketSettings
from vidassets.storage.objects import ReadOnlyBucket

RAW_PREFIX = "raw"
PROVENANCE_SIDECAR = "_provenance.json"
# Names Dagster refuses in partition keys, plus anything that could not round-trip as a path.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+=:-]*$")


@dataclass(frozen=True)
class Drop:
    source_tier: str
    drop_id: str

    @property
    def key(self) -> str:
        return f"{self.source_tier}/{self.drop_id}"

    @property
    def prefix(self) -> str:
        return f"{RAW_PREFIX}/{self.source_tier}/{self.drop_id}"

    @classmethod
    def from_key(cls, key: str) -> Drop:
        tier, sep, drop_id = key.partition("/")
        if not sep or not valid_name(tier) or not valid_name(drop_id):
            raise ValueError(f"not a source shard key (<source_tier>/<drop_id>): {key!r}")
        return cls(tier, drop_id)


def valid_name(name: str) -> bool:
    return bool(_SAFE_NAME.match(name)) and "..." not in name


@dataclass(frozen=True)
class DropListing:
    complete: list[Drop]
    incomplete: list[Drop]
    invalid_names: list[str]  # directories whose names cannot be partition keys


def list_drops(bucket: ReadOnlyBucket, settings: BucketSettings, now: float | None = None,
               known: Container[str] = frozenset()) -> DropListing:
    """Every drop in the bucket, split by completeness, in key order. Drops whose key is in
    ``known`` (already ingested) are not checked again: listing a bucket of N drops costs its
    paginated directory listing plus one completeness check per *new* drop."""
    complete: list[Drop] = []
    incomplete: list[Drop] = []
    invalid: list[str] = []
    for tier in bucket.list_dirs(RAW_PREFIX):
        if not valid_name(tier):
            invalid.append(f"{RAW_PREFIX}/{tier}")
            continue
        for drop_id in bucket.list_dirs(f"{RAW_PREFIX}/{tier}"):
            if not valid_name(drop_id):
                invalid.append(f"{RAW_PREFIX}/{tier}/{drop_id}")
                continue
            drop = Drop(tier, drop_id)
            (complete if drop.key in known or is_complete(bucket, drop, settings, now) else incomplete).append(drop)
    return DropListing(complete, incomplete, invalid)


def is_complete(bucket: ReadOnlyBucket, drop: Drop, settings: BucketSettings, now: float | None = None) -> bool:
    if settings.completion == "marker":
        return bucket.exists(f"{drop.prefix}/{settings.marker}")
    now = time.time() if now is None else now
    newest = max((info.mtime for info in bucket.list(drop.prefix)), default=None)
    return newest is not None and now - newest >= settings.quiet_seconds
