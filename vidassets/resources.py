"""Dagster resources: the output store (catalog + blobs), the eval vault (eval side only) and the
read-only input bucket."""

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
    """Where vidassets writes: ``root`` holds tables and blobs. It cannot reach the eval vault:
    that is a separate resource (``eval_vault``) that only the eval-side steps are given."""

    root: str
    s3_endpoint_url: str | None = None

    def _s3(self) -> S3Resource:
        return S3Resource(endpoint_url=self.s3_endpoint_url) if self.s3_endpoint_url else S3Resource()

    def objects(self) -> ObjectStore:
        return open_object_store(self.root, _client_factory(self.root, self._s3()))

    def tables(self) -> TableStore:
        return TableStore(self.objects())


class EvalVaultResource(ConfigurableResource):
    """The eval vault: its own root (a second bucket or prefix) and its own credentials, given only
    to the eval side (``catalog.VAULT_ASSETS``: carve-out, eval features, decontamination). On S3 the
    client uses ``<credentials_env>AWS_ACCESS_KEY_ID`` / ``…SECRET_ACCESS_KEY`` / ``…SESSION_TOKEN``
    when set (the vault's own key pair), else the default credential chain."""

    root: str
    s3_endpoint_url: str | None = None
    credentials_env: str = "VIDASSETS_VAULT_"

    def _client(self):
        import os

        import boto3

        keys = {name.lower(): os.environ.get(f"{self.credentials_env}{name}")
                for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
        if keys["aws_access_key_id"] and keys["aws_secret_access_key"]:
            return boto3.client("s3", endpoint_url=self.s3_endpoint_url, **{k: v for k, v in keys.items() if v})
        return (S3Resource(endpoint_url=self.s3_endpoint_url) if self.s3_endpoint_url else S3Resource()).get_client()

    def tables(self) -> TableStore:
        factory = self._client if urlparse(self.root).scheme == "s3" else None
        return TableStore(open_object_store(self.root, factory))


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
        "store": StoreResource(root=store_uri, s3_endpoint_url=s3_endpoint_url),
        "eval_vault": EvalVaultResource(root=vault_uri, s3_endpoint_url=s3_endpoint_url),
    }
