"""Parquet bytes in and out, the one place the project touches pyarrow's reader and writer.

Reads run on the calling thread (``ParquetFile.read(use_threads=False)``): our tables and blobs are
small, and pyarrow's background thread pools, once started, can abort the interpreter at exit
("terminate called without an active exception", SIGABRT; apache/arrow#34314). That turned a
finished ``vidassets table`` into exit -6 a few percent of the time; a short-lived step process
would fail the same way.
"""

from __future__ import annotations

import io

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def to_parquet_bytes(frame: pd.DataFrame, compression: str = "zstd", meta: dict[str, str] | None = None) -> bytes:
    """``frame`` as Parquet; ``meta`` goes into the file's key-value metadata (``parquet_meta``)."""
    buffer = io.BytesIO()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if meta:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               **{k.encode(): v.encode() for k, v in meta.items()}})
    pq.write_table(table, buffer, compression=compression)
    return buffer.getvalue()


def parquet_meta(data: bytes, key: str) -> str | None:
    """One key of the file's key-value metadata (written by ``to_parquet_bytes(meta=...)``)."""
    found = (pq.ParquetFile(pa.BufferReader(data)).schema_arrow.metadata or {}).get(key.encode())
    return found.decode() if found is not None else None


def from_parquet_bytes(data: bytes) -> pd.DataFrame:
    table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)  # read_table starts an IO thread
    return table.to_pandas(use_threads=False)
