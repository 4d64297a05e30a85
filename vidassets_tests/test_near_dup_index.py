"""The persistent near-duplicate index (``vidassets.ingest.near_dup_index``) on SQLite and a real
PostgreSQL server: what it finds equals the exhaustive search on real footage, a decision through it
reads only the drops that share frames with the new one, and it is a cache of the fingerprint
tables (lost, it is rebuilt; stale, it is brought up to date)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from vidassets.config import NearDuplicateSettings
from vidassets.ingest.near_dup_index import (
    PLAN,
    TABLES,
    Found,
    IndexedVideo,
    NearDuplicateIndex,
    frame_recall,
    lsh_keys,
    pair_recall,
)
from vidassets_tests.conftest import SAMPLE_CACHE, postgres_server

SIZE = (320, 180)


@pytest.fixture(scope="module")
def variant_set(tmp_path_factory: pytest.TempPathFactory):
    from vidassets.demo.near_dup_set import build_set

    return build_set(tmp_path_factory.mktemp("near_dup"), SAMPLE_CACHE, originals=4, seconds=8.0, size=SIZE,
                     variant_of=0)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with postgres_server() as port:
        yield f"postgresql://vidassets@127.0.0.1:{port}/dagster"


def _flip(hashes: np.ndarray, bits: int, rng: np.random.Generator) -> np.ndarray:
    unpacked = np.unpackbits(hashes, axis=1)
    for row in unpacked:
        row[rng.choice(256, bits, replace=False)] ^= 1
    return np.packbits(unpacked, axis=1)


def _random_drop(drop: int, rng: np.random.Generator, videos: int = 5) -> list[IndexedVideo]:
    return [IndexedVideo(f"a{drop}-{i}", f"blob{drop}-{i}", f"a{drop}-{i}", rng.integers(0, 256, (30, 32), np.uint8))
            for i in range(videos)]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_index_finds_copies_and_groups_and_rewrites_only_what_changed(engine: str, tmp_path: Path,
                                                                         request) -> None:
    url = f"sqlite:///{tmp_path / 'index.sqlite'}" if engine == "sqlite" else request.getfixturevalue("postgres_url")
    index = NearDuplicateIndex(url)
    for drop in index.indexed():  # (a module-scoped server: start from an empty index)
        index.remove_drop(drop)
    rng = np.random.default_rng(7)
    source = rng.integers(0, 256, (30, 32), np.uint8)
    for drop in range(6):
        videos = _random_drop(drop, rng)
        if drop == 2:
            videos[0] = IndexedVideo("master", "blob-master", "master", source)
        if drop == 4:  # an older copy of the master's footage, decided a near-duplicate of it
            videos[1] = IndexedVideo("reupload", "blob-reupload", "master", _flip(source, 12, rng))
        index.put_drop(f"d{drop}", "v1", videos)
    assert index.indexed() == {f"d{d}": "v1" for d in range(6)}
    query = _flip(source, 31, rng)[:8]  # a new copy: 8 sampled frames, each 31 bits away
    found = index.neighbours(query, 52, skip_drop="d9")
    assert {(f.drop, f.asset_id) for f in found} == {("d2", "master"), ("d4", "reupload")}
    assert index.neighbours(rng.integers(0, 256, (8, 32), np.uint8), 52) == []  # different footage: nothing
    # a group comes whole from one member: the canonical and every copy pointing at it
    assert {(f.drop, f.asset_id) for f in index.groups([Found("d4", "reupload")])} == {("d2", "master"),
                                                                                       ("d4", "reupload")}
    assert {f.asset_id for f in index.groups([Found("d4", "reupload")], skip_drop="d2")} == {"reupload"}
    # a drop decided again (same fingerprints, another canonical): no hashing, only the canonical moves
    hashed = index.counters.videos_hashed
    again = [IndexedVideo(v.asset_id, v.blob, "a4-0" if v.asset_id == "reupload" else v.canonical, v.hashes)
             for v in [IndexedVideo("reupload", "blob-reupload", "x", np.zeros((1, 32), np.uint8)),
                       *_random_drop(4, np.random.default_rng(0))[2:]]]
    index.put_drop("d4", "v2", again)
    assert index.counters.videos_hashed == hashed  # same blobs: their frames and postings kept
    assert {f.asset_id for f in index.groups([Found("d2", "master")])} == {"master"}
    assert {f.asset_id for f in index.neighbours(query, 52)} == {"master", "reupload"}  # its frames kept
    # the drop's videos that left it leave the index with their postings
    index.put_drop("d4", "v3", [])
    assert {f.asset_id for f in index.neighbours(query, 52)} == {"master"}
    # sync: drops gone from the tables are forgotten, changed ones re-indexed from what ``load`` gives
    loads: list[str] = []
    changed = index.sync({"d2": "v1", "d3": "v1-rewritten"}, lambda d: loads.append(d) or _random_drop(3, rng))
    assert changed == ["d3"] == loads and index.indexed() == {"d2": "v1", "d3": "v1-rewritten"}
    # a second process sees the same index
    assert NearDuplicateIndex(url).indexed() == index.indexed()


def test_the_plan_reaches_its_recall_and_a_new_plan_starts_over(tmp_path: Path) -> None:
    """Stated recall from the plan (bits drawn without replacement): a pair with 4 matching frames
    31 bits apart is found with probability >= 0.99; measured on 2,000 such frame pairs."""
    assert pair_recall([31] * 4) >= 0.99 and frame_recall(10) > 0.999
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (2000, 32), np.uint8)
    b = _flip(a, 31, rng)
    shared = (lsh_keys(a) == lsh_keys(b)).any(axis=1).mean()
    assert abs(shared - frame_recall(31)) < 0.04, (shared, frame_recall(31))
    assert (lsh_keys(a) >> 24).max() == TABLES - 1
    url = f"sqlite:///{tmp_path / 'index.sqlite'}"
    index = NearDuplicateIndex(url)
    index.put_drop("d0", "v1", _random_drop(0, rng))
    with index.engine.begin() as db:  # an index written by another plan
        db.exec_driver_sql("UPDATE nd_meta SET value = 'lsh-old' WHERE name = 'plan'")
    reopened = NearDuplicateIndex(url)
    assert reopened.indexed() == {}  # emptied: sync re-indexes every drop under the plan
    with reopened.engine.connect() as db:
        assert db.exec_driver_sql("SELECT value FROM nd_meta").scalar() == PLAN


def test_on_real_footage_the_index_finds_what_the_exhaustive_search_finds(variant_set, tmp_path: Path) -> None:
    """Every variant of the variant set (re-encodes, rescales, crops, overlays, trims, speed changes)
    and the four originals, each its own drop; for each video, the videos the index returns equal
    those an exhaustive search over every stored hash finds within ``max_hamming``."""
    import faiss

    from vidassets.ingest.near_duplicates import KINDS
    from vidassets_tests.test_near_duplicates import _fingerprint

    settings = NearDuplicateSettings()
    hashes = {}
    for item, path in variant_set:
        fp, _ = _fingerprint(path)
        hashes[item.name] = np.concatenate([getattr(fp, k) for k in KINDS])
    names = sorted(hashes)
    index = NearDuplicateIndex(f"sqlite:///{tmp_path / 'index.sqlite'}")
    for name in names:
        index.put_drop(name, "v1", [IndexedVideo(name, name, name, hashes[name])])
    every = faiss.IndexBinaryFlat(256)
    every.add(np.concatenate([hashes[n] for n in names]))
    owner = np.repeat(np.arange(len(names)), [len(hashes[n]) for n in names])
    pairs = 0
    for name in names:
        _, _, ids = every.range_search(hashes[name], settings.max_hamming + 1)
        exhaustive = {names[j] for j in np.unique(owner[ids])} - {name}
        found = {f.asset_id for f in index.neighbours(hashes[name], settings.max_hamming, skip_drop=name)}
        assert found == exhaustive, name
        pairs += len(exhaustive)
    assert pairs >= 2 * (len(names) - 4)  # every variant pairs with its original at least


def test_a_decision_through_the_index_reads_only_the_drops_sharing_frames(variant_set, tmp_path: Path) -> None:
    """Six older drops, one of which holds the original of this drop's copy: the decision reads that
    drop's rows and pack only, and decides as it does from every drop's rows."""
    from vidassets.ingest.near_duplicates import KINDS, Neighbourhood, Prints, decide, indexed_videos
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.tables import put_blob
    from vidassets_tests.test_near_duplicates import _fingerprint

    store = LocalObjectStore(str(tmp_path / "store"))
    files = {item.name: p for item, p in variant_set}

    def row(name: str, shard: str) -> dict:
        fp, value = _fingerprint(files[name])
        blob = put_blob(store, "video_fingerprints", json.dumps(
            {k: value[k] for k in ("times", "full", "square", "inner", "quality", "audio")}).encode(), ".json")
        return {"status": "ok", "asset_id": name.ljust(64, "0")[:64], "uri": f"file:///b/{name}", "source_shard": shard,
                "fingerprint_blob": blob, "duration_s": fp.duration_s, "whole_grid": True,
                "quality_key": 2.0 if name == "orig-00.mp4" else 1.0, "source_tier": "crawl"}

    rng = np.random.default_rng(5)
    older: dict[str, list[dict]] = {"crawl/orig": [row("orig-00.mp4", "crawl/orig")]}
    for k, name in enumerate(("orig-01.mp4", "orig-02.mp4", "orig-03.mp4")):
        older[f"crawl/other-{k}"] = [row(name, f"crawl/other-{k}")]
    for k in range(2):  # drops of unrelated footage (random hashes), packed as the stage packs them
        shard = f"crawl/noise-{k}"
        fake = {"times": [0.5 * i for i in range(16)], "audio": None, "quality": [100] * 16}
        for kind in KINDS:
            fake[kind] = rng.integers(0, 256, (16, 32), np.uint8).tobytes().hex()
        blob = put_blob(store, "video_fingerprints", json.dumps(fake).encode(), ".json")
        older[shard] = [{"status": "ok", "asset_id": f"noise{k}".ljust(64, "0"), "uri": f"file:///b/noise{k}",
                         "source_shard": shard, "fingerprint_blob": blob, "duration_s": 8.0, "whole_grid": True,
                         "quality_key": 1.0, "source_tier": "crawl"}]
    index = NearDuplicateIndex(f"sqlite:///{tmp_path / 'index.sqlite'}")
    for shard, rows in older.items():
        Prints(store).write_pack(rows)
        index.put_drop(shard, "v1", indexed_videos(rows, Prints(store)))
    here = [row("orig-00-reencode.mp4", "crawl/new")]
    read: list[str] = []

    def read_drop(shard: str) -> list[dict]:
        read.append(shard)
        return [dict(r) for r in older[shard]]

    prints = Prints(store)
    neighbours = Neighbourhood(index, read_drop, "crawl/new", NearDuplicateSettings().max_hamming, prints)
    through_index = [dict(r) for r in here]
    outcome = decide(through_index, neighbours, prints, NearDuplicateSettings(), ("crawl",))
    assert read == ["crawl/orig"] and neighbours.drops == {"crawl/orig"} and prints.packs_read == 1
    assert outcome.near_duplicates == 1 and through_index[0]["near_duplicate_of"] == older["crawl/orig"][0]["asset_id"]
    everything = [dict(r) for r in here]
    decide(everything, [dict(r) for rows in older.values() for r in rows], Prints(store), NearDuplicateSettings(),
           ("crawl",))
    decision = ("near_duplicate_of", "group_size", "match", "contains", "contained_in", "generated_match")
    assert [everything[0][c] for c in decision] == [through_index[0][c] for c in decision]


def test_a_lost_index_is_rebuilt_from_the_tables_and_decides_the_same(variant_set, tmp_path: Path) -> None:
    """Through the graph: two drops, then the index file is deleted and a third drop brings the
    master of a copy in the first: the index is rebuilt from the stored tables (both older drops
    synced), and the master becomes canonical as it does with the index intact."""
    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import graph_settings, run_graph

    files = {item.name: p for item, p in variant_set}
    bucket = tmp_path / "bucket/raw/crawl"
    for drop, names in (("drop-0001", ("orig-00-reencode.mp4",)), ("drop-0002", ("orig-01.mp4",))):
        (bucket / drop).mkdir(parents=True)
        for name in names:
            shutil.copy(files[name], bucket / drop / name)
    settings = graph_settings(tmp_path / "bucket", tmp_path)
    select = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_fingerprint"]
    run_graph(settings, tmp_path, select=select)
    index_file = Path(settings.store.index_url()[len("sqlite:///"):])
    assert index_file.is_file() and NearDuplicateIndex(settings.store.index_url()).indexed().keys() == {
        "crawl/drop-0001", "crawl/drop-0002"}
    from vidassets.resources import _open_index

    _open_index.cache_clear()  # (this process keeps no connection to the deleted file)
    for path in index_file.parent.glob("near_duplicates.sqlite*"):
        path.unlink()
    (bucket / "drop-0003").mkdir()
    shutil.copy(files["orig-00.mp4"], bucket / "drop-0003" / "master.mp4")
    summary = run_graph(settings, tmp_path, select=select)
    assert summary.stages["video_fingerprint"].extra["near_index_drops_synced"] >= 2
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    master = tables.read("video_fingerprints", "crawl/drop-0003").iloc[0]
    copy = tables.read("video_fingerprints", "crawl/drop-0001").iloc[0]
    assert master.group_size == 2 and copy.near_duplicate_of == master.asset_id
    assert NearDuplicateIndex(settings.store.index_url()).indexed().keys() == {
        "crawl/drop-0001", "crawl/drop-0002", "crawl/drop-0003"}
