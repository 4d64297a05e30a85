"""Dagster resources: the output store (catalog + blobs + eval vault) and the read-only input bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dagster import ConfigurableResource
from dagster_aws.s3 import S3Resource

from vidassets.storage import ReadOnlyBucket, TableStore, open_object_store
from vidassets.storage.objects import ObjectStore


def _client_factory(uri: str, s3: S3Resource | None):
    if urlparse(uri).scheme != "s3":
        return None
    return lambda: (s3 or S3Resource()).get_client()


class StoreResource(ConfigurableResource):
    """Where vidassets writes: ``root`` holds tables and blobs; ``eval_vault_root`` is a separate
    root that only the eval carve-out (and decontamination) may write or read."""

    root: str
    eval_vault_root: str
    s3_endpoint_url: str | None = None

    def _s3(self) -> S3Resource:
        return S3Resource(endpoint_url=self.s3_endpoint_url) if self.s3_endpoint_url else S3Resource()

    def objects(self) -> ObjectStore:
        return open_object_store(self.root, _client_factory(self.root, self._s3()))

    def tables(self) -> TableStore:
        return TableStore(self.objects())

    def eval_vault(self) -> TableStore:
        return TableStore(open_object_store(self.eval_vault_root, _client_factory(self.eval_vault_root, self._s3())))


class BucketResource(ConfigurableResource):
    """The input bucket (local directory or ``s3://bucket/prefix``); read-only by construction."""

    root: str
    s3_endpoint_url: str | None = None

    def open(self) -> ReadOnlyBucket:
        s3 = S3Resource(endpoint_url=self.s3_endpoint_url) if self.s3_endpoint_url else S3Resource()
        return ReadOnlyBucket(open_object_store(self.root, _client_factory(self.root, s3)))


def absolute_uri(uri: str) -> str:
    """Local paths become absolute (runs may start in another working directory)."""
    return uri if urlparse(uri).scheme in ("s3", "file") else str(Path(uri).expanduser().absolute())


def build_resources(bucket_uri: str, store_uri: str, vault_uri: str, s3_endpoint_url: str | None = None) -> dict[str, Any]:
    bucket_uri, store_uri, vault_uri = (absolute_uri(u) for u in (bucket_uri, store_uri, vault_uri))
    return {
        "bucket": BucketResource(root=bucket_uri, s3_endpoint_url=s3_endpoint_url),
        "store": StoreResource(root=store_uri, eval_vault_root=vault_uri, s3_endpoint_url=s3_endpoint_url),
    }
