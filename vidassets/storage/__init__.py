"""Storage: object stores (local | S3), catalog tables with pandera schemas, content-addressed blobs."""

from vidassets.storage.objects import (
    LocalObjectStore,
    ObjectInfo,
    ObjectStore,
    ReadOnlyBucket,
    S3ObjectStore,
    open_object_store,
)
from vidassets.storage.tables import TableStore, put_blob

__all__ = [
    "LocalObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "ReadOnlyBucket",
    "S3ObjectStore",
    "TableStore",
    "open_object_store",
    "put_blob",
]
