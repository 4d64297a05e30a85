"""Storage: object stores (local | S3), catalog tables with pandera schemas, content-addressed blobs.

The tables (pandas and pandera) load on first use: the sandboxed media worker reads sources through
``storage.objects`` and should not pay for them at every start."""

from typing import TYPE_CHECKING, Any

from vidassets.storage.objects import (
    LocalObjectStore,
    ObjectInfo,
    ObjectStore,
    ReadOnlyBucket,
    S3ObjectStore,
    open_object_store,
)

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name in ("TableStore", "put_blob"):
        from vidassets.storage import tables

        return getattr(tables, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
