"""Object stores (local dir and a real S3 server), tables with schemas, atomic writes, blobs."""

from __future__ import annotations

import json
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


def test_read_all_concatenates_partitions(objects) -> None:
    """Read up to ``READS_IN_FLIGHT`` at once (the local store and a real S3 server): the same rows in
    partition order as one read after another, no thread left behind, and a partition that cannot be
    read fails the whole read (never a table with a drop silently missing)."""
    import threading

    tables = TableStore(objects)
    shards = [f"t/d{i:02d}" for i in range(40)]
    for shard in shards:
        tables.write("raw_inventory", shard, [_inventory_row(uri=f"file:///b/raw/{shard}/a.mp4", source_shard=shard,
                                                             asset_id=f"{len(shard) + int(shard[-2:]):064x}")])
    frame = tables.read_all("raw_inventory")
    assert isinstance(frame, pd.DataFrame) and list(frame.source_shard) == shards
    one_by_one = pd.concat([tables.read("raw_inventory", s) for s in shards], ignore_index=True)
    pd.testing.assert_frame_equal(frame, one_by_one)
    assert not [t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor")]
    objects.put_bytes(tables.key("raw_inventory", shards[17]), b"not parquet")
    with pytest.raises(Exception, match="(?i)parquet|magic"):
        tables.read_all("raw_inventory")


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


def _group_row(clip: str, shard: str, decision: str = "pass") -> dict:
    return {"clip_id": clip, "asset_id": "a" * 64, "source_shard": shard, "decision": decision,
            "first_failed_rule": None if decision == "pass" else "dup", "rule_outcomes": "{}", "tier": None,
            "rank_score": 1.0, "recipe": "r", "recipe_hash": "h", "producer_version": "selection-test"}


def test_a_global_table_written_by_groups_reads_as_its_full_rewrite(objects, monkeypatch) -> None:
    """Random group replacements (``GroupedTable``: a log entry and the buckets of those groups each,
    the bucket count doubling as groups grow) read back exactly as the table rewritten whole each
    time would, whole and by groups; a write rewrites only its groups' buckets; the identity changes
    with every write; ``changes_since`` names the groups written since a cursor with their rows, and
    "cannot tell" after a whole rewrite or once the log no longer reaches back; the log keeps KEEP_LOG
    entries; a write stopped after its log entry is seen by readers and finished by the next write;
    the index's row count (what a global stage whose inputs did not change reports) is the table's."""
    import random

    from vidassets.storage import grouped

    monkeypatch.setattr(grouped, "BUCKET_GROUPS", 2)
    monkeypatch.setattr(grouped, "KEEP_LOG", 4)
    tables = TableStore(objects)
    rng = random.Random(7)
    truth: dict[str, list[dict]] = {}
    seen_versions, cursor, since = set(), None, set()
    drops = [f"web/d{i}" for i in range(12)]

    def expected(only: set[str] | None = None) -> list[str]:
        return sorted(r["clip_id"] for shard, rs in truth.items() for r in rs if only is None or shard in only)

    bucket_writes: list[str] = []
    real_put = objects.put_bytes
    monkeypatch.setattr(objects, "put_bytes", lambda key, data: (bucket_writes.append(key) if "/_groups/b" in key else None,
                                                                real_put(key, data))[1])
    for step in range(30):
        shards = set(rng.sample(drops[: 3 + step // 3], rng.randint(1, 2)))
        rows = []
        for shard in sorted(shards):
            truth[shard] = [_group_row(f"{shard[-3:]}-{step}-{k}", shard, rng.choice(["pass", "reject"]))
                            for k in range(rng.randint(0, 3))]
            rows += truth[shard]
        buckets_before = tables._grouped("selection").index.get("buckets", 0)
        bucket_writes.clear()
        tables.write_groups("selection", rows, shards)
        buckets_now = tables._grouped("selection").index["buckets"]
        if buckets_before == buckets_now:  # no doubling: only the buckets of the groups written
            assert len(bucket_writes) == len({grouped.bucket_of(g, buckets_now) for g in shards}), bucket_writes
        back = tables.read("selection")
        assert list(back.clip_id) == expected()
        assert tables.row_count("selection") == len(expected()) == tables._grouped("selection").row_count()
        assert dict(zip(back.clip_id, back.decision, strict=True)) == {
            r["clip_id"]: r["decision"] for rs in truth.values() for r in rs}
        some = set(rng.sample(drops, 2))
        assert sorted(tables.read_groups("selection", some).clip_id) == expected(some)
        version = tables.version("selection")
        assert version not in seen_versions and tables.versions("selection") == {"_all": version}
        seen_versions.add(version)
        since |= shards
        if step % 3 == 2:  # a reader every third write: the groups written since its cursor, their rows now
            changes, now = tables.changes_since("selection", cursor)
            if cursor is None:
                assert changes is None
            else:
                assert changes[0] == since and sorted(changes[1].clip_id) == expected(since)
            cursor, since = now, set()
        assert len(list(objects.list("tables/selection/_delta"))) <= 4
    assert tables._grouped("selection").index["buckets"] >= 4  # doubled as the groups grew
    assert tables.changes_since("selection", {**cursor, "seq": cursor["seq"] - 4})[0] is not None  # kept: 4 back
    stale = tables.changes_since("selection", {**cursor, "seq": cursor["seq"] - 5})[0]
    assert stale is None  # the log no longer reaches back that far
    assert tables.partitions("selection") == ["_all"]
    # the key partitions lists reads (and reports) the whole table, as partition None does
    assert list(tables.read("selection", "_all").clip_id) == expected() == list(tables.read_all("selection").clip_id)
    assert tables.exists("selection", "_all") and tables.version("selection", "_all") == tables.version("selection")
    # rows outside the groups being replaced are refused (a clip must not appear in two groups)
    with pytest.raises(ValueError, match="outside the groups"):
        tables.write_groups("selection", [_group_row("x", "web/d99")], ["web/d1"])
    # a write stopped after its log entry: readers apply it, the next write finishes it
    table = tables._grouped("selection")
    real_apply = table._apply
    monkeypatch.setattr(table, "_apply", lambda *a: (_ for _ in ()).throw(RuntimeError("stopped")))
    with pytest.raises(RuntimeError):
        table.write(tables._validated("selection", [_group_row("cut", "web/d2")]), {"web/d2"}, "source_shard")
    truth["web/d2"] = [_group_row("cut", "web/d2")]
    assert list(tables.read("selection").clip_id) == expected()
    assert tables._grouped("selection").row_count() is None  # the index does not know: counted by a read
    assert tables.row_count("selection") == len(expected())
    assert list(tables.read_groups("selection", {"web/d2"}).clip_id) == ["cut"]
    monkeypatch.setattr(table, "_apply", real_apply)
    tables.write_groups("selection", [_group_row("after", "web/d3")], ["web/d3"])
    truth["web/d3"] = [_group_row("after", "web/d3")]
    assert list(tables.read("selection").clip_id) == expected()
    assert tables._grouped("selection").row_count() == len(expected())  # the next write finished it
    changes, now = tables.changes_since("selection", cursor)
    assert "web/d2" in changes[0] and "web/d3" in changes[0]
    # the latest write's rows (the schema check's view)
    assert list(tables.latest_rows("selection").clip_id) == ["after"]
    # a full write supersedes everything; a reader's cursor cannot tell across it
    tables.write_groups("selection", [_group_row("only", "web/d1")], None)
    assert list(tables.read("selection").clip_id) == ["only"]
    assert list(tables.latest_rows("selection").clip_id) == ["only"]
    assert tables.changes_since("selection", now)[0] is None
    tables.write("selection", None, [_group_row("whole", "web/d4")])  # a whole write of a table in buckets
    assert list(tables.read("selection").clip_id) == ["whole"]


def test_a_table_in_the_layout_before_the_buckets_moves_to_them_on_its_first_grouped_write(objects) -> None:
    """A base file and deltas (the layout before ``GroupedTable``) read as before; the first grouped
    write moves the rows into buckets, deletes the old files, and a cursor from the old layout is
    answered "cannot tell" (read whole once)."""
    from vidassets.storage.parquet import to_parquet_bytes

    tables = TableStore(objects)
    tables.write("selection", None, [_group_row("a1", "web/d1"), _group_row("b1", "web/d2")])  # the old base
    old_cursor = tables.changes_since("selection", None)[1]
    delta = tables._validated("selection", [_group_row("b2", "web/d2")])
    objects.put_bytes("tables/selection/_delta/000000000001.parquet", to_parquet_bytes(
        delta, meta={"vidassets.replaces": json.dumps(["web/d2"]), "vidassets.by": "source_shard"}))
    assert list(tables.read("selection").clip_id) == ["a1", "b2"]
    tables.write_groups("selection", [_group_row("c1", "web/d3")], ["web/d3"])
    assert list(tables.read("selection").clip_id) == ["a1", "b2", "c1"]
    assert not objects.exists("tables/selection/_all.parquet")
    assert tables.changes_since("selection", old_cursor)[0] is None
    assert sorted(tables.read_groups("selection", {"web/d2", "web/d3"}).clip_id) == ["b2", "c1"]
    assert [i.key.rsplit("/", 1)[-1] for i in objects.list("tables/selection/_delta")] == [
        "000000000002.parquet", "000000000003.parquet"]  # the move (whole), then the write: numbers continue


def test_a_listing_starts_after_a_key(objects) -> None:
    """``start_after`` lists only the keys after it, in key order (local store and a real S3 server)."""
    for key in ("a/1", "a/2", "a/20", "a/3", "b/1"):
        objects.put_bytes(key, b"x")
    assert [i.key for i in objects.list("a", start_after="a/2")] == ["a/20", "a/3"]
    assert [i.key for i in objects.list("a", start_after="a/")] == ["a/1", "a/2", "a/20", "a/3"]
    assert [i.key for i in objects.list("a", start_after="a/3")] == []
    assert [i.key for i in objects.list("a")] == ["a/1", "a/2", "a/20", "a/3"]


def test_the_journal_names_the_partitions_written_since_a_time(objects, monkeypatch) -> None:
    """A partition write records its key in the journal (local store and a real S3 server): a reader
    finds exactly the partitions written since a time, by listing the hours since then; identical
    rewrites record nothing; a pruned journal says so (None), so the reader lists everything."""
    import time

    from vidassets.storage import tables as tables_module

    tables = TableStore(objects)

    def write(shard: str, size: int = 3) -> None:
        tables.write("raw_inventory", shard, [_inventory_row(source_shard=shard, size=size)])

    write("t/one")
    write("t/two")
    middle = time.time_ns()
    write("t/three")
    write("t/one", size=4)  # rewritten with other rows
    write("t/two")  # identical: not rewritten, not recorded
    assert tables.written_since("raw_inventory", middle) == {"t/three", "t/one"}
    # the records before ``middle`` (same hour) are never listed: a reader's cost is what came after
    listed: list[str] = []
    real_list = objects.list
    monkeypatch.setattr(objects, "list", lambda prefix="", start_after=None: (
        listed.append(i.key) or i for i in real_list(prefix, start_after)))
    assert tables.written_since("raw_inventory", middle) == {"t/three", "t/one"}
    monkeypatch.undo()
    assert len(listed) == 2, listed
    assert tables.written_since("raw_inventory", 0) == {"t/one", "t/two", "t/three"}
    assert tables.written_since("raw_inventory", time.time_ns() + 10**9) == set()
    assert tables.written_since("clips", 0) == set()  # no write yet: nothing to look up

    # records a day old sit in an older hour: pruning deletes them and marks how far back it reaches
    day = 24 * 3600 * 10**9
    monkeypatch.setattr(tables_module, "journal_clock", lambda: middle - day)
    write("t/old")
    monkeypatch.undo()
    assert "t/old" in tables.written_since("raw_inventory", middle - 2 * day)
    assert tables.prune_journal("raw_inventory", middle - day // 2) == 1
    assert tables.written_since("raw_inventory", middle - 2 * day) is None  # before the pruned bound
    assert tables.written_since("raw_inventory", middle) == {"t/three", "t/one"}
    assert tables.prune_journal("raw_inventory", middle - day // 2) == 0
    # the journal is not a table: listing the table's partitions is unchanged
    assert sorted(tables.versions("raw_inventory")) == ["t/old", "t/one", "t/three", "t/two"]


def test_global_inputs_list_once_then_look_up_what_the_journal_names(tmp_path: Path, monkeypatch) -> None:
    """A global stage's inputs: listed whole on its first run; afterwards only the partitions the
    journal names are looked up, giving the same fingerprints as a full listing; a store copied
    elsewhere keeps its stored versions; a run with nothing written finds its inputs unchanged."""
    import shutil

    from vidassets.stages import common
    from vidassets.storage.tables import partition_fingerprints

    monkeypatch.setattr(common, "JOURNAL_LAG_NS", 0)  # every write here is a moment old
    tables = TableStore(LocalObjectStore(tmp_path / "store"))
    for shard in ("t/a", "t/b"):
        tables.write("raw_inventory", shard, [_inventory_row(source_shard=shard)])

    def inputs(store: TableStore) -> common.GlobalInputs:
        return common.GlobalInputs(store.objects, "some_stage", "v1", [(store, "raw_inventory")])

    first = inputs(tables)
    assert first.metadata() == {"input_tables_listed": 1, "input_partitions_looked_up": 0,
                                "input_version_buckets_read": 0} and not first.same
    first.remember()
    assert inputs(tables).same and inputs(tables).metadata()["input_partitions_looked_up"] == 0
    tables.write("raw_inventory", "t/c", [_inventory_row(source_shard="t/c")])
    tables.write("raw_inventory", "t/a", [_inventory_row(source_shard="t/a", size=9)])
    later = inputs(tables)
    assert later.metadata() == {"input_tables_listed": 0, "input_partitions_looked_up": 2,
                                "input_version_buckets_read": 1} and not later.same
    assert later.fingerprints(tables, ("raw_inventory",)) == partition_fingerprints(tables, ("raw_inventory",))
    lazy = later.fingerprints(tables, ("raw_inventory",), over="raw_inventory")  # read a bucket when asked
    assert len(lazy) == 3 and lazy["t/c"] == partition_fingerprints(tables, ("raw_inventory",))["t/c"]
    assert "t/z" not in lazy and dict(lazy) == partition_fingerprints(tables, ("raw_inventory",), over="raw_inventory")
    later.remember()
    shutil.copytree(tmp_path / "store", tmp_path / "moved")
    moved = TableStore(LocalObjectStore(tmp_path / "moved"))
    assert inputs(moved).metadata()["input_tables_listed"] == 0
    for folder in (tmp_path / "moved/state/inputs/some_stage").iterdir():  # the versions lost, the meta kept
        if folder.is_dir():
            shutil.rmtree(folder)
    lost = inputs(moved)
    assert lost.metadata()["input_tables_listed"] == 1 and lost.changed(moved, ("raw_inventory",)) is None
    assert common.GlobalInputs(tables.objects, "some_stage", "v2", [(tables, "raw_inventory")]).same is False


def test_stored_input_versions_read_and_write_the_buckets_a_change_falls_in(tmp_path: Path, monkeypatch) -> None:
    """A global stage's stored input versions: a run with one changed partition reads and rewrites
    that partition's bucket alone; the bucket count doubles as partitions grow (every bucket
    rewritten once, the old ones deleted); a removed partition leaves the count and its bucket."""
    from vidassets.storage import partition_map
    from vidassets.storage.input_versions import StoredInputVersions
    from vidassets.storage.partition_map import bucket_count, bucket_of

    monkeypatch.setattr(partition_map, "BUCKET_PARTITIONS", 4)
    objects = LocalObjectStore(tmp_path / "store")
    mine, vault = ("", "clips"), ("s3://vault", "eval_clips")
    parts = {f"d{i:03d}": f"v{i}" for i in range(20)}
    stored = StoredInputVersions(objects, "state/inputs/stage")
    stored.write("full1", 5, whole={("", "raw"): {"_all": "r1"}}, listed={mine: parts, vault: {"e1": "x"}}, changed={},
                 counts={mine: 20, vault: 1})
    files = sorted(info.key for info in objects.list("state/inputs/stage") if info.key.endswith(".parquet"))
    assert bucket_count(20) == 8 and len(files) == 8 + 1  # the vault's one bucket beside

    again = StoredInputVersions(objects, "state/inputs/stage")
    assert (again.version, again.read_at, again.whole, again.counts[mine]) == ("full1", 5, {("", "raw"): {"_all": "r1"}}, 20)
    assert again.versions_of(mine, ["d007", "nope"]) == {"d007": "v7"}
    assert again.buckets_read == len({bucket_of(p, 8) for p in ("d007", "nope")})
    before = {k: (tmp_path / "store" / k).stat().st_mtime_ns for k in files}
    again.write("full1", 6, whole={}, listed={}, changed={mine: {"d007": "w7", "d020": "v20", "d003": None}, vault: {}},
                counts={mine: 20, vault: 1})
    rewritten = {k for k in files if (tmp_path / "store" / k).stat().st_mtime_ns != before[k]}
    buckets = {bucket_of(p, 8) for p in ("d007", "d020", "d003")}
    assert len(rewritten) == len(buckets)
    expected = {**{p: v for p, v in parts.items() if p != "d003"}, "d007": "w7", "d020": "v20"}
    assert StoredInputVersions(objects, "state/inputs/stage").every(mine) == expected

    grown = StoredInputVersions(objects, "state/inputs/stage")
    more = {f"n{i:03d}": "n" for i in range(20)}
    grown.write("full1", 7, whole={}, listed={}, changed={mine: more, vault: {}}, counts={mine: 40, vault: 1})
    files = sorted(info.key for info in objects.list("state/inputs/stage") if info.key.endswith(".parquet"))
    assert len(files) == bucket_count(40) + 1 == 17
    assert StoredInputVersions(objects, "state/inputs/stage").every(mine) == {**expected, **more}
    assert StoredInputVersions(objects, "state/inputs/stage").every(vault) == {"e1": "x"}


def test_partition_map_finishes_a_write_that_stopped_half_way(tmp_path: Path, monkeypatch) -> None:
    """A write stopped after its index (changes and meta in it) but before its buckets: the next
    reader applies the changes, so the owner's meta (a total) and the values agree."""
    from vidassets.storage import partition_map
    from vidassets.storage.partition_map import PartitionMap

    monkeypatch.setattr(partition_map, "BUCKET_PARTITIONS", 2)
    objects = LocalObjectStore(tmp_path / "store")
    first = PartitionMap(objects, "state/thing")
    first.write({f"p{i}": {"n": i} for i in range(6)}, meta={"total": 15}, whole=True)
    assert (first.buckets, first.count) == (4, 6)

    stopping = PartitionMap(objects, "state/thing")
    monkeypatch.setattr(PartitionMap, "_apply", lambda self, changes: (_ for _ in ()).throw(OSError("stopped")))
    with pytest.raises(OSError, match="stopped"):
        stopping.write({"p1": {"n": 10}, "p5": None}, meta={"total": 15 - 1 + 10 - 5})
    monkeypatch.undo()
    monkeypatch.setattr(partition_map, "BUCKET_PARTITIONS", 2)
    after = PartitionMap(objects, "state/thing")
    values = after.every()
    assert after.meta["total"] == sum(v["n"] for v in values.values()) == 19 and after.count == len(values) == 5
    assert json.loads(objects.get_bytes("state/thing/index.json"))["pending"] == {}
    assert after.get(["p1", "nope"]) == {"p1": {"n": 10}}


def test_told_every_change_counts_arrivals_and_departures_against_the_drops_there_are() -> None:
    """The check each global stage makes before it compares only the drops it was told of: the kept
    count plus the told arrivals less the told departures must be the current count."""
    from vidassets.storage.input_versions import told_every_change

    current = {"d0", "d1", "d2", "d3"}
    # d0-d2 were covered (count 3), d3 arrived and is named
    assert told_every_change(3, ["d3"], set(), current)
    # d3 arrived but the stage was told of nothing: the count is off by one
    assert not told_every_change(3, [], set(), current)
    # d1 was removed and named (held in the state, gone now), d3 named as arrived
    after = current - {"d1"}
    assert told_every_change(3, ["d1", "d3"], {"d1"}, after)
    # d1 removed without being named
    assert not told_every_change(3, ["d3"], set(), after)
    # a named drop that was rebuilt (held before and now) changes no count
    assert told_every_change(4, ["d2"], {"d2"}, current)


def test_a_held_database_shares_one_connection_and_commits_as_before(tmp_path: Path) -> None:
    """``Database.held``: every use inside shares one SQLite connection (a step's uses of its state),
    what it commits is seen by another connection at once, nesting is harmless, and on leaving (also
    by an error) each use opens its own connection again."""
    from vidassets.storage.sql import Database

    url = f"sqlite:///{tmp_path}/state.sqlite"
    database, other = Database(url), Database(url)
    database.create(["CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"], lock=1)

    def connection_id() -> int:
        with database.engine.connect() as db:
            return id(db.connection.dbapi_connection)

    def count(d: Database) -> int:
        with d.engine.connect() as db:
            return int(db.execute(d.sql("SELECT COUNT(*) FROM t")).scalar())

    with database.held():
        first = connection_id()
        with database.held():  # nested: the same connection
            assert connection_id() == first
        with database.engine.begin() as db:
            database.many(db, "INSERT INTO t (k, v) VALUES (?, ?)", [(1, "a"), (2, "b")])
        assert connection_id() == first and count(database) == 2
        assert count(other) == 2  # committed: another connection sees it while this one is held
    assert count(database) == 2
    with pytest.raises(RuntimeError), database.held():
        raise RuntimeError("a step fails")
    with database.engine.begin() as db:
        database.many(db, "INSERT INTO t (k, v) VALUES (?, ?)", [(3, "c")])
    assert count(other) == 3


def test_drops_are_batched_in_arrival_order_per_tier_and_never_move(tmp_path: Path) -> None:
    from vidassets.storage.drop_batches import DropBatches, is_batch

    objects = LocalObjectStore(tmp_path)
    assert DropBatches(objects).assign(["web/a", "web/b"], 1) == {"web/a": "web/a", "web/b": "web/b"}
    assert not list(objects.list("state"))  # one partition per drop: nothing recorded
    first = DropBatches(objects).assign(["web/d1", "lic/x1", "web/d2", "web/d3"], 2)
    assert first == {"web/d1": "web/~batch-000000", "lic/x1": "lic/~batch-000000", "web/d2": "web/~batch-000000",
                     "web/d3": "web/~batch-000001"}
    assert all(is_batch(p) for p in first.values()) and not is_batch("web/d1")
    batches = DropBatches(objects)  # read back from the store
    assert batches.drops_of("web/~batch-000000") == ["web/d1", "web/d2"]
    assert batches.drops_of("web/d9") == ["web/d9"] and batches.drops_of("web/~batch-000009") == []
    # a larger K later moves no drop: the open batch fills up to the new size, then new batches
    later = DropBatches(objects).assign(["web/d1", "web/d4", "web/d5", "web/d6"], 3)
    assert later == {"web/d1": "web/~batch-000000", "web/d4": "web/~batch-000001", "web/d5": "web/~batch-000001",
                     "web/d6": "web/~batch-000002"}
    assert DropBatches(objects).partition_of(["web/d3", "web/zz"]) == {"web/d3": "web/~batch-000001", "web/zz": "web/zz"}
    with pytest.raises(ValueError, match="drops_per_partition"):
        DropBatches(objects).assign(["web/d7"], 0)


def test_a_batch_assignment_stopped_before_its_record_is_made_again_in_place(tmp_path: Path, monkeypatch) -> None:
    """Members are written before the drop -> partition record: a stop between the two leaves the
    drop unrecorded, and the next assignment lists it once, in the same batch."""
    from vidassets.storage.drop_batches import DropBatches

    objects = LocalObjectStore(tmp_path)
    DropBatches(objects).assign(["web/d1"], 3)
    real_put = LocalObjectStore.put_bytes

    def stop_at_record(self, key, data):
        if key.endswith("drops.parquet"):
            raise OSError("stopped")
        return real_put(self, key, data)

    monkeypatch.setattr(LocalObjectStore, "put_bytes", stop_at_record)
    with pytest.raises(OSError):
        DropBatches(objects).assign(["web/d2"], 3)
    monkeypatch.setattr(LocalObjectStore, "put_bytes", real_put)
    assert "web/d2" not in DropBatches(objects).recorded()
    assert DropBatches(objects).assign(["web/d2"], 3) == {"web/d2": "web/~batch-000000"}
    assert DropBatches(objects).drops_of("web/~batch-000000") == ["web/d1", "web/d2"]
