"""Object stores (local dir and a real S3 server), tables with schemas, atomic writes, blobs."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pandera.errors
import pytest

from vidassets.storage import LocalObjectStore, ReadOnlyBucket, S3ObjectStore, TableStore, put_blob
from vidassets.storage.objects import open_object_store


@pytest.fixture(params=["local", "s3"])
def objects(request, tmp_path: Path):
    if request.param == "local":
        return LocalObjectStore(tmp_path / "store")
    client = request.getfixturevalue("s3_client")
    bucket = request.getfixturevalue("s3_bucket_name")
    return S3ObjectStore(client, bucket, "some/prefix")


def _inventory_row(**kw) -> dict:
    row = {
        "uri": "file:///b/raw/t/d/a.mp4", "key": "raw/t/d/a.mp4", "container": "file", "media_type": "video",
        "size": 3, "object_version": "1:3", "asset_id": "a" * 64, "source_shard": "t/d", "source_tier": "t",
        "drop_id": "d", "status": "ok", "provenance": "{}", "producer_version": "inventory-test",
    }
    row.update(kw)
    return row


def test_put_get_list_and_conditional_create(objects) -> None:
    objects.put_bytes("a/b/one.bin", b"1")
    objects.put_bytes("a/two.bin", b"22")
    assert objects.get_bytes("a/b/one.bin") == b"1"
    assert [(i.key, i.size) for i in objects.list("a")] == [("a/b/one.bin", 1), ("a/two.bin", 2)]
    assert objects.list_dirs("a") == ["b"]
    assert objects.read_range("a/two.bin", 1, 1) == b"2"
    assert objects.put_if_absent("a/claim", b"first") is True
    assert objects.put_if_absent("a/claim", b"second") is False
    assert objects.get_bytes("a/claim") == b"first"
    assert objects.exists("a/claim") and not objects.exists("a/nothing")
    with pytest.raises(ValueError, match=r"\.\."):
        objects.get_bytes("a/../../etc/passwd")


def test_table_roundtrip_validates_schema(objects) -> None:
    tables = TableStore(objects)
    tables.write("raw_inventory", "t/d", [_inventory_row()])
    assert tables.partitions("raw_inventory") == ["t/d"]
    back = tables.read("raw_inventory", "t/d")
    assert back.loc[0, "asset_id"] == "a" * 64 and back.loc[0, "duplicate_of"] is None
    with pytest.raises(pandera.errors.SchemaErrors, match="asset_id"):
        tables.write("raw_inventory", "t/d", [_inventory_row(asset_id="not-a-sha")])
    with pytest.raises(ValueError, match="not in its schema"):
        tables.write("raw_inventory", "t/d", [_inventory_row(typo_column=1)])
    # the failed writes left the earlier table as it was
    assert tables.read("raw_inventory", "t/d").loc[0, "asset_id"] == "a" * 64


def test_ok_rows_need_asset_id_and_failed_rows_need_reason(tmp_path: Path) -> None:
    tables = TableStore(LocalObjectStore(tmp_path))
    with pytest.raises(pandera.errors.SchemaErrors, match="ok rows need an asset_id"):
        tables.write("raw_inventory", "t/d", [_inventory_row(asset_id=None)])
    with pytest.raises(pandera.errors.SchemaErrors, match="failed rows need a reason"):
        tables.write("raw_inventory", "t/d", [_inventory_row(status="error", asset_id=None)])


def test_crash_mid_write_leaves_no_table(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)

    def half_then_crash(f) -> None:
        f.write(b"PAR1 half a parquet file")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        store.put_with("tables/x/p.parquet", half_then_crash)
    assert not store.exists("tables/x/p.parquet")
    assert list(store.list("")) == []  # no temp file left behind either
    # an existing table survives a crashed rewrite untouched
    store.put_bytes("tables/x/p.parquet", b"old")
    with pytest.raises(RuntimeError):
        store.put_with("tables/x/p.parquet", half_then_crash)
    assert store.get_bytes("tables/x/p.parquet") == b"old"


def test_table_write_that_fails_validation_never_touches_storage(tmp_path: Path, monkeypatch) -> None:
    store = LocalObjectStore(tmp_path)
    writes = []
    monkeypatch.setattr(store, "put_bytes", lambda *a: writes.append(a))
    with pytest.raises(pandera.errors.SchemaErrors):
        TableStore(store).write("raw_inventory", "t/d", [_inventory_row(size=-1)])
    assert writes == []


def test_blobs_are_content_addressed(objects) -> None:
    key = put_blob(objects, "frames", b"pixels", ".jpg")
    assert key.startswith("blobs/frames/") and key.endswith(".jpg")
    assert put_blob(objects, "frames", b"pixels", ".jpg") == key
    assert objects.get_bytes(key) == b"pixels"


def test_read_only_bucket_has_no_write_methods(tmp_path: Path) -> None:
    bucket = ReadOnlyBucket(LocalObjectStore(tmp_path))
    for name in ("put_bytes", "put_if_absent", "put_with", "delete"):
        assert not hasattr(bucket, name)


def test_local_listing_refuses_fifos_and_outside_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "bucket"
    root.mkdir()
    (root / "real.mp4").write_bytes(b"x")
    os.mkfifo(root / "pipe.mp4")
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    (root / "escape.mp4").symlink_to(secret)
    (root / "inside.mp4").symlink_to(root / "real.mp4")
    infos = {i.key: i for i in LocalObjectStore(root).list()}
    assert infos["real.mp4"].refusal is None
    assert infos["inside.mp4"].refusal is None
    assert "fifo" in infos["pipe.mp4"].refusal
    assert "outside the bucket" in infos["escape.mp4"].refusal
    with pytest.raises(OSError, match="outside"):
        LocalObjectStore(root).open_read("escape.mp4")
    with pytest.raises(OSError, match="fifo"):
        LocalObjectStore(root).open_read("pipe.mp4")  # returns at once instead of blocking


def test_open_object_store_rejects_unknown_schemes() -> None:
    with pytest.raises(ValueError, match="gs"):
        open_object_store("gs://bucket/x")
    with pytest.raises(ValueError, match="bucket name"):
        open_object_store("s3:///no-bucket")


def test_read_all_concatenates_partitions(tmp_path: Path) -> None:
    tables = TableStore(LocalObjectStore(tmp_path))
    tables.write("raw_inventory", "t/d1", [_inventory_row()])
    tables.write("raw_inventory", "t/d2", [_inventory_row(uri="file:///b/raw/t/d2/b.mp4", source_shard="t/d2")])
    frame = tables.read_all("raw_inventory")
    assert isinstance(frame, pd.DataFrame) and sorted(frame.source_shard) == ["t/d", "t/d2"]


def test_table_reads_start_no_native_threads(tmp_path: Path) -> None:
    """pyarrow's reader thread pools abort the interpreter at exit now and then (SIGABRT, "terminate called
    without an active exception"); a `vidassets table` that printed its rows then exited -6 in CI. Reads must
    stay on the calling thread. Counted in a fresh process: in this one another test may have started them."""
    import subprocess
    import sys

    tables = TableStore(LocalObjectStore(tmp_path))
    tables.write("raw_inventory", "t/d", [_inventory_row()])
    script = """
import os, sys
import pandas as pd
from vidassets.storage import LocalObjectStore, TableStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
def threads(): return len(os.listdir("/proc/self/task"))
blob = to_parquet_bytes(pd.DataFrame({"x": range(100_000), "y": ["text"] * 100_000}))
before = threads()
assert len(from_parquet_bytes(blob)) == 100_000
assert len(TableStore(LocalObjectStore(sys.argv[1])).read("raw_inventory", "t/d")) == 1
print(before, threads())
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert after == before
