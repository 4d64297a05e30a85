"""Derive stage on real footage: annotations (offline backend and a VLM client against a local
chat-completions server), shape-bucketed latents that round-trip through the same diffusers VAE,
caption text embeddings, and row-exact reuse when selection or the captioner changes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from vidassets.config import ConfigError, load_settings
from vidassets.curate.selection import load_recipe
from vidassets.demo.bucket import decode_rgb, encode
from vidassets.derive.camera_motion import RuleBasedCameraMotion, unknown_camera
from vidassets.derive.labels import (
    CAMERA_SINGLE,
    validate_camera,
    validate_captions,
    validate_tags,
)
from vidassets.derive.latents import center_crop, load_latents, nearest_bucket, sample_frames, spatial_buckets
from vidassets.models.vlm import OpenAIChatClient, VlmRequest, parse_json_reply
from vidassets.storage import TableStore, open_object_store
from vidassets_tests.chat_server import LoopbackChatServer
from vidassets_tests.conftest import free_port, graph_settings, run_graph, small_bucket

# ---------------------------------------------------------------- a chat-completions server


class ChatServer(LoopbackChatServer):
    """Stands in for a model server (vLLM/SGLang) speaking the OpenAI chat-completions protocol:
    no VLM weights are reachable offline. It answers from canned, schema-shaped replies and can
    fail on purpose (HTTP 503, non-JSON, invalid labels) so the client's handling is exercised."""

    def __init__(self):
        self.requests: list[dict] = []
        self.failures: list[int] = []  # HTTP statuses to answer with before succeeding
        self.bad_caption_once = False
        self.in_flight = self.max_in_flight = 0
        self.delay = 0.0
        self.lock = threading.Lock()
        super().__init__()

    def handle(self, path: str, body: dict, auth: str | None) -> tuple[int, str | None]:
        with self.lock:
            self.requests.append({"path": path, "body": body, "auth": auth})
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            status = self.failures.pop(0) if self.failures else 200
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        return (200, self.reply(body)) if status == 200 else (status, None)

    def reply(self, body: dict) -> str:
        kind = body.get("response_format", {}).get("json_schema", {}).get("name", "captions")
        if kind == "camera":
            return json.dumps({**{k: v[-1] for k, v in CAMERA_SINGLE.items()}, "effects": ["none"]})
        if kind == "tags":
            return json.dumps({"domain": "real_world", "scene": "urban", "subjects": ["person", "vehicle"],
                               "actions": ["driving"], "style": "documentary", "text": "none", "watermark": "none"})
        with self.lock:
            bad, self.bad_caption_once = self.bad_caption_once, False
        words = lambda n, w: " ".join([w] * n)  # noqa: E731
        captions = {"level_0": "Cyclists ride past.", "level_1": words(30, "ride"), "level_2": words(70, "then"),
                    "level_3": words(150, "dense")}
        if bad:
            captions["level_1"] = "too short"
        return "```json\n" + json.dumps(captions) + "\n```"

    def close(self) -> None:
        super().close()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    server = ChatServer()
    yield server
    server.close()


# ---------------------------------------------------------------- schemas


def test_camera_schema_rejects_extra_fields_unknown_labels_and_mixed_none() -> None:
    good = {**{k: "unknown" for k in CAMERA_SINGLE}, "effects": ["none"]}
    assert validate_camera(good) == [] and validate_camera(unknown_camera()) == []
    assert any("unexpected" in e for e in validate_camera({**good, "mood": "happy"}))
    assert any("pan" in e for e in validate_camera({**good, "pan": "pan-up"}))
    assert any("missing" in e for e in validate_camera({k: v for k, v in good.items() if k != "zoom"}))
    assert any("'none'" in e for e in validate_camera({**good, "effects": ["none", "motion-blur"]}))
    assert any("'unknown'" in e for e in validate_camera({**good, "effects": ["unknown", "motion-blur"]}))
    assert validate_camera({**good, "effects": ["motion-blur", "dolly-zoom"]}) == []


def test_tag_and_caption_schemas() -> None:
    tags = {"domain": "real_world", "scene": "nature", "subjects": ["animal"], "actions": ["none"],
            "style": "documentary", "text": "none", "watermark": "logo"}
    assert validate_tags(tags) == []
    assert validate_tags({**tags, "actions": ["none", "locomotion"]})
    assert validate_tags({**tags, "subjects": ["unknown", "animal"]})
    assert validate_tags({**tags, "subjects": ["none"]})  # 'none' belongs to actions only
    assert validate_tags({**tags, "domain": "space"})
    caps = {"level_0": "A dog runs.", "level_1": " ".join(["w"] * 25), "level_2": " ".join(["w"] * 60),
            "level_3": " ".join(["w"] * 120)}
    assert validate_captions(caps) == []
    # word bounds are targets: within the tolerance (default ±50%) a level is kept, off target
    assert validate_captions({**caps, "level_0": " ".join(["w"] * 20), "level_3": " ".join(["w"] * 201)}) == []
    assert any("level_0" in e for e in validate_captions({**caps, "level_0": " ".join(["w"] * 29)}))
    assert any("level_3" in e for e in validate_captions({**caps, "level_3": " ".join(["w"] * 301)}))


def test_a_caption_level_outside_its_target_voids_only_that_level() -> None:
    """The seed's own median captions (~60 and ~100 words at levels 1 and 2) are off target, kept;
    one level far outside voids that level alone (row status partial), and snapshots/text read the
    other levels."""
    import pandas as pd

    from vidassets.derive.annotations import verdict
    from vidassets.derive.labels import caption_texts, judge_caption_levels

    words = lambda n: " ".join(["w"] * n)  # noqa: E731
    seed_like = {"level_0": "A dog runs.", "level_1": words(60), "level_2": words(100), "level_3": words(150)}
    levels = judge_caption_levels(seed_like)
    assert levels["level_1"].startswith("off_target") and levels["level_2"] == "ok"
    assert verdict("captions", seed_like, 0.5)[0] == "ok"
    one_bad = {**seed_like, "level_2": words(400)}
    status, reason, levels = verdict("captions", one_bad, 0.5)
    assert status == "partial" and "level_2" in reason and levels["level_2"].startswith("invalid")
    assert verdict("captions", {**seed_like, "level_1": words(60)}, 0.0)[0] == "partial"  # strict bounds: opt in
    assert verdict("captions", "not json", 0.5)[0] == "invalid"
    table = pd.DataFrame([{"clip_id": "c", "kind": "captions", "producer_version": "v", "status": status,
                           "reason": reason, "value": json.dumps(one_bad), "levels": json.dumps(levels)}])
    assert caption_texts(table, "v", "level_1")[0] == {"c": words(60)}
    texts, missing = caption_texts(table, "v", "level_2")
    assert texts == {} and "400 words" in missing["c"]


# ---------------------------------------------------------------- offline camera motion on real footage


def _context(path: Path, fps_out: float = 2.0) -> tuple[list[float], list[np.ndarray]]:
    import av

    times, frames = [], []
    with av.open(str(path)) as c:
        vs = c.streams.video[0]
        next_t = 0.0
        for frame in c.decode(vs):
            t = float(frame.pts * vs.time_base)
            if t + 1e-6 >= next_t:
                times.append(t)
                frames.append(frame.to_ndarray(format="rgb24"))
                next_t += 1 / fps_out
    return times, frames


def test_offline_camera_motion_pan_and_still_on_real_footage(demo_bucket: Path, tmp_path: Path) -> None:
    still = next(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", start=40))
    big = cv2.resize(still, (still.shape[1] * 2, still.shape[0] * 2), interpolation=cv2.INTER_CUBIC)
    w, h = still.shape[1] // 2 * 2, still.shape[0] // 2 * 2
    # the camera pans right across a real frame: the window slides right 6 px per frame at 25 fps
    pan = (big[h // 2 : h // 2 + h, x : x + w] for x in range(0, 6 * 75, 6))
    encode(pan, tmp_path / "pan.mp4", "libx264", 25, options={"preset": "veryfast", "crf": "20"})
    encode((still[:h, :w] for _ in range(75)), tmp_path / "still.mp4", "libx264", 25, options={"preset": "veryfast"})
    model = RuleBasedCameraMotion()
    record, evidence = model(*_context(tmp_path / "pan.mp4"))
    assert validate_camera(record) == []
    assert record["pan"] == "pan-right", evidence
    assert record["tilt"] == "no-tilt" and record["zoom"] == "no-zoom" and record["motion_type"] == "simple-motion"
    record, evidence = model(*_context(tmp_path / "still.mp4"))
    assert record["motion_type"] == "no-motion" and record["steadiness"] == "static", evidence
    assert record["pan"] == "no-pan" and record["dolly"] == "no-dolly" and record["speed"] == "none"
    # the same pan reversed is a pan left
    frames = _context(tmp_path / "pan.mp4")
    record, _ = model(frames[0], frames[1][::-1])
    assert record["pan"] == "pan-left"


# ---------------------------------------------------------------- the VLM client


def test_vlm_client_retries_parses_and_bounds_concurrency(chat_server: ChatServer, monkeypatch) -> None:
    monkeypatch.setenv("TEST_VLM_KEY", "sekrit")
    client = OpenAIChatClient(chat_server.endpoint, "qwen-vl-test", api_key_env="TEST_VLM_KEY", retries=2,
                              backoff_seconds=0.01, max_concurrency=2, timeout_seconds=5)
    frame = np.full((32, 48, 3), 128, np.uint8)
    request = VlmRequest("captions", "sys", "prompt", [frame, frame], [0.0, 0.5], {"type": "object"})
    chat_server.failures = [503]
    reply = client.complete(request)
    assert reply.ok and reply.attempts == 2 and reply.value["level_0"] == "Cyclists ride past."
    sent = chat_server.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer sekrit"
    parts = sent["body"]["messages"][1]["content"]
    videos = [p for p in parts if p["type"] == "video_url"]  # the frames as one video (vLLM's video/jpeg form)
    assert len(videos) == 1 and videos[0]["video_url"]["url"].startswith("data:video/jpeg;base64,")
    assert len(videos[0]["video_url"]["url"].split(",")) == 3 and sent["body"]["media_io_kwargs"]["video"]["fps"] == 2
    assert sent["body"]["response_format"]["json_schema"]["name"] == "captions"
    chat_server.failures = [500, 502, 503]  # more failures than the retry budget: an error, not a crash
    reply = client.complete(request)
    assert not reply.ok and "HTTP 503" in reply.error and reply.attempts == 3
    chat_server.failures = [400]  # a client error is not retried
    before = len(chat_server.requests)
    assert not client.complete(request).ok and len(chat_server.requests) == before + 1
    chat_server.delay = 0.1
    replies = client.complete_all([request] * 6)
    assert all(r.ok for r in replies) and chat_server.max_in_flight <= 2
    dead = OpenAIChatClient(f"http://127.0.0.1:{free_port()}/v1", "m", retries=1, backoff_seconds=0.01)
    reply = dead.complete(request)
    assert not reply.ok and reply.error and reply.attempts == 2
    with pytest.raises(ValueError, match="not JSON"):
        parse_json_reply("Sure! Here are your captions.")


# ---------------------------------------------------------------- buckets and config


def test_shape_buckets_and_frame_sampling() -> None:
    buckets = spatial_buckets(("16:9", "9:16", "1:1", "4:3"), 480)
    assert [(b.width, b.height) for b in buckets] == [(848, 480), (480, 848), (480, 480), (640, 480)]
    assert nearest_bucket(1920, 1080, buckets).aspect_ratio == "16:9"
    assert nearest_bucket(1080, 1920, buckets).aspect_ratio == "9:16"
    assert nearest_bucket(640, 272, buckets).aspect_ratio == "16:9"
    assert nearest_bucket(176, 144, buckets).aspect_ratio == "4:3"
    assert center_crop(640, 272, buckets[0]) == (79, 0, 481, 272)
    assert center_crop(176, 144, buckets[2]) == (16, 0, 144, 144)
    assert sample_frames(10, 109, (17, 33, 49, 81), 25, None)[::40] == [10, 60, 109]
    assert len(sample_frames(0, 99, (17, 33, 49, 81), 25, None)) == 81
    assert sample_frames(0, 10, (17, 33), 25, None) is None
    at_12 = sample_frames(0, 99, (17, 33, 49, 81), 24, 12)  # 100 frames at 24 fps, sampled at 12 fps
    assert len(at_12) == 49 and np.all(np.diff(at_12) == 2) and at_12[0] in (1, 2)  # centred: 1.5 rounds either way


def test_bad_derive_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"latents\.frame_buckets"):
        load_settings(env={}, overrides={"latents.frame_buckets": [16, 33]})
    with pytest.raises(ConfigError, match=r"annotations\.vlm"):
        load_settings(env={}, overrides={"annotations.captions": "vlm"})
    with pytest.raises(ConfigError, match=r"latents\.dtype"):
        load_settings(env={}, overrides={"latents.dtype": "int4"})
    with pytest.raises(ConfigError, match=r"latents\.vae_path"):
        load_settings(env={}, overrides={"latents.vae_path": "/nonexistent/vae"})
    with pytest.raises(ConfigError, match=r"text_embeddings\.model_path"):
        load_settings(env={}, overrides={"text_embeddings.model_path": "/nonexistent/encoder"})
    with pytest.raises(ConfigError, match=r"latents\.read_from"):
        load_settings(env={}, overrides={"latents.read_from": "rungs"})
    with pytest.raises(ConfigError, match=r"ladder\.preset"):  # would only fail at the first encode otherwise
        load_settings(env={}, overrides={"ladder.preset": "fastest"})


# ---------------------------------------------------------------- the assets on real footage


@pytest.fixture(scope="module")
def derived(demo_bucket: Path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("derive")
    bucket = small_bucket(demo_bucket, tmp)
    run_graph(graph_settings(bucket, tmp), tmp)
    return tmp


def _tables(tmp: Path) -> TableStore:
    return TableStore(open_object_store(str(tmp / "store")))


def test_selected_clips_get_all_three_annotations_with_versions(derived: Path) -> None:
    tables = _tables(derived)
    chosen = set(tables.read("selection").query("decision == 'pass'").clip_id)
    ann = tables.read_all("annotations")
    assert chosen and set(ann.clip_id) == chosen
    assert (ann.status == "ok").all(), ann[ann.status != "ok"][["clip_id", "kind", "reason"]]
    assert sorted(ann.groupby("clip_id").kind.apply(sorted).iloc[0]) == ["camera", "captions", "tags"]
    assert ann.producer_version.str.contains("rule-based").all() and (ann.schema_version != "").all()
    for row in ann.itertuples():
        value = json.loads(row.value)
        assert {"camera": validate_camera, "captions": validate_captions, "tags": validate_tags}[row.kind](value) == []
        assert (row.kind == "captions") == isinstance(row.levels, str)  # captions carry their per-level status
    text = _tables(derived).read_all("text_embeddings")
    assert set(text.clip_id) == chosen and (text.caption_level == "level_1").all() and (text.dim == 384).all()
    vectors = np.stack([np.frombuffer(v, "<f4") for v in text.vector])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_latents_are_exactly_what_the_vae_returns_and_decode_to_the_bucket(derived: Path) -> None:
    import torch

    from vidassets.derive.latents import pick_rung
    from vidassets.media.clip_reader import read_sequential_frames
    from vidassets.resources import Models

    settings = graph_settings(derived / "bucket", derived)
    tables, objects = _tables(derived), open_object_store(str(derived / "store"))
    lat = tables.read_all("latents")
    ok = lat[lat.status == "ok"]
    assert len(ok) == len(set(tables.read("selection").query("decision == 'pass'").clip_id)) >= 1
    assert set(ok.bucket) <= {"f9_112x64", "f17_112x64", "f9_80x64", "f17_80x64", "f9_64x64", "f17_64x64",
                              "f9_64x112", "f17_64x112", "f9_64x80", "f17_64x80"}
    vae = Models(settings).vae(settings.latents)
    assert "random-init" in vae.version and vae.version in ok.producer_version.iloc[0]
    # every clip read its frames from its smallest rung that holds the 64 px bucket: no raw decode
    ladder = tables.read_all("clip_ladder")
    assert ok.frames_from.str.startswith("ladder:").all(), ok[["clip_id", "frames_from"]]
    for row in ok.itertuples():
        rungs = [r for r in ladder[ladder.clip_id == row.clip_id].to_dict("records") if r["status"] == "ok"]
        assert row.frames_from == "ladder:" + pick_rung(rungs, 64, None)["rung"]
    row = ok.iloc[0]
    stored, meta = load_latents(objects, row.latent_key)
    assert stored.dtype == torch.bfloat16 and list(stored.shape) == json.loads(row.latent_shape)
    assert list(stored.shape) == [4, (row.frames - 1) // 4 + 1, row.height // 8, row.width // 8]
    assert meta["clip_id"] == row.clip_id and float(meta["std"]) == pytest.approx(row["std"])
    # read the same frames of the same rung again and encode them: bit-identical after the dtype cast
    rung = ladder[(ladder.clip_id == row.clip_id) & (ladder.rung == row.frames_from.split(":", 1)[1])].iloc[0]
    indices = json.loads(row.frame_indices)
    assert indices[-1] < rung.frames and len(indices) == row.frames
    again = read_sequential_frames({"path": objects.local_path(rung.blob_key)}, indices, json.loads(row.crop),
                                   (int(row.width), int(row.height)))
    frames = again["frames"]
    assert frames.shape == (row.frames, row.height, row.width, 3)
    assert row.frames_decoded == again["frames_decoded"] == indices[-1] + 1
    assert torch.equal(vae.encode(frames).to(torch.bfloat16), stored)
    decoded = vae.decode(stored.float())
    assert decoded.shape == (row.frames, row.height, row.width, 3) and decoded.dtype == np.uint8


def test_clips_of_one_bucket_encode_in_one_vae_run_as_they_encode_alone(derived: Path) -> None:
    """On a GPU the VAE encodes a bucket's clips together (``models.batch_frames`` frames a run); on
    the CPU one clip a run. Both give each clip its latents (within float rounding), its own row."""
    import torch

    from vidassets.curate.selection import selected_in_order
    from vidassets.derive.latents import encode_partition
    from vidassets.media import drop_steps as media_work
    from vidassets.resources import Models
    from vidassets.storage.objects import ReadOnlyBucket
    from vidassets.storage.rows import RowVersion
    from vidassets.versions import Versions

    settings = graph_settings(derived / "bucket", derived)
    tables, objects = _tables(derived), open_object_store(str(derived / "store"))
    versions = Versions(settings)
    key = tables.read_all("latents").query("status == 'ok'").source_shard.value_counts().index[0]
    probe = tables.read("video_probe", key)
    dims = {r["asset_id"]: (r["display_width"], r["display_height"]) for r in media_work.records(probe)}
    videos = {v["asset_id"]: {**v, "display_width": dims[v["asset_id"]][0], "display_height": dims[v["asset_id"]][1]}
              for v in media_work.canonical_videos(tables.read("eval_split", key), tables.read("raw_inventory", key))}
    vae = Models(settings).vae(settings.latents)
    runs = {}
    for batch in (1, 10_000):
        before = vae.batches
        rows, stats = encode_partition(
            ReadOnlyBucket(open_object_store(str(derived / "bucket"))), objects,
            selected_in_order(tables.read("selection"), key), tables.read("clips", key),
            tables.read("video_analysis", key), videos, pd.DataFrame(), lambda clip, b=batch: {64: RowVersion(f"batch{b}")},
            settings.latents, settings.probe, lambda: vae, 3, packet_index=tables.read_or_empty("frame_index", key),
            ladder=tables.read("clip_ladder", key), ladder_version_of=lambda c: versions.window_row("clip_ladder", c),
            batch_frames=batch)
        runs[batch] = (pd.DataFrame(rows).set_index("clip_id"), stats, vae.batches - before)
    (alone, alone_stats, alone_runs), (together, together_stats, together_runs) = runs[1], runs[10_000]
    ok = alone[alone.status == "ok"]
    assert len(ok) >= 2 and set(together.status) == set(alone.status) == {"ok"}
    assert alone_runs == alone_stats.extra["model_batches"] == len(ok)
    assert together_runs == together_stats.extra["model_batches"] == ok.bucket.nunique() < len(ok)
    assert alone_stats.model_calls == together_stats.model_calls == len(ok)
    for clip_id, row in ok.iterrows():
        other = together.loc[clip_id]
        assert (row.bucket, row.frame_indices, row.crop, row.frames_decoded) == \
               (other.bucket, other.frame_indices, other.crop, other.frames_decoded)
        a, b = load_latents(objects, row.latent_key)[0], load_latents(objects, other.latent_key)[0]
        assert a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=1e-3, rtol=1e-2)  # bf16 files: an ulp apart at most


def test_raw_reader_skips_unwanted_nonreference_frames_exactly(derived: Path) -> None:
    """The raw path (``latents.read_from: raw``, or no rung large enough): seek to the keyframe before
    the first sampled frame; never decoding the unwanted non-reference frames changes no pixel."""
    from vidassets.derive.latents import sample_frames
    from vidassets.media.clip_reader import read_frames
    from vidassets.media.drop_steps import read_parquet_blob
    from vidassets.media.packet_index import nonref_between

    tables, objects = _tables(derived), open_object_store(str(derived / "store"))
    clips = tables.read_all("clips")
    clip = clips.loc[clips.num_frames.idxmax()]
    analysis = tables.read("video_analysis", clip.source_shard).set_index("asset_id").loc[clip.asset_id]
    pts = read_parquet_blob(objects, analysis.signals_blob)["pts"].tolist()
    spec = {"path": str(derived / "bucket" / "raw/licensed/drop-0001" / Path(analysis.uri).name)}
    indices = sample_frames(int(clip.first_frame), int(clip.last_frame), [9, 17], float(analysis.fps), None)
    plain = read_frames(spec, pts, indices, int(analysis.rotation or 0), None, (64, 48))
    index_blob = tables.read("frame_index", clip.source_shard).set_index("asset_id").loc[clip.asset_id, "index_blob"]
    skip = nonref_between(read_parquet_blob(objects, index_blob), pts[indices[0]], pts[indices[-1]])
    skipping = read_frames(spec, pts, indices, int(analysis.rotation or 0), None, (64, 48), skip)
    assert skip and np.array_equal(skipping["frames"], plain["frames"])
    assert skipping["frames_decoded"] < plain["frames_decoded"]


def test_selection_change_derives_only_newly_admitted_clips(derived: Path, tmp_path: Path) -> None:
    tables = _tables(derived)
    before = set(tables.read("selection").query("decision == 'pass'").clip_id)
    recipe = load_recipe().model_dump()
    recipe.update(score_rules=[], perceptual_dedup={"enabled": False}, semantic_dedup={"enabled": False})
    path = tmp_path / "everything.yaml"
    path.write_text(json.dumps(recipe))
    skipped = tables.read_all("clip_scores").query("status == 'skipped'")
    summary = run_graph(graph_settings(derived / "bucket", derived, **{"selection.recipe": str(path)}), derived)
    after = set(tables.read("selection").query("decision == 'pass'").clip_id)
    admitted = after - before
    assert before < after and admitted
    assert summary.stages["latents"].extra["model_calls"] == len(admitted)
    assert summary.stages["annotations"].extra["rows_reused"] == 3 * len(before)
    assert summary.stages["text_embeddings"].extra["model_calls"] == len(admitted)
    # the recipe has no formula rule left: exactly the model scores the cascade had skipped are computed
    assert summary.stages["clip_scores"].extra.get("rows_computed", 0) == len(skipped)
    assert (summary.stages["clip_scores"].extra.get("model_calls", 0) > 0) == bool(len(skipped))
    assert not len(tables.read_all("clip_scores").query("status == 'skipped'"))
    for upstream in ("clip_embeddings", "video_analysis"):
        assert summary.stages[upstream].extra.get("model_calls", 0) == 0
    lat = tables.read_all("latents")
    assert set(lat.clip_id) == after


def test_new_captioner_appends_captions_and_reembeds_only_text(derived: Path, chat_server: ChatServer) -> None:
    tables = _tables(derived)
    old = tables.read_all("annotations")
    chosen = set(tables.read("selection").query("decision == 'pass'").clip_id)
    chat_server.bad_caption_once = True
    settings = graph_settings(derived / "bucket", derived, **{
        "annotations.captions": "vlm", "annotations.tags": "vlm",
        "annotations.vlm": {"endpoint": chat_server.endpoint, "model": "test-vl", "model_revision": "r1",
                            "max_concurrency": 2, "backoff_seconds": 0.01}})
    summary = run_graph(settings, derived, select=["annotations", "latents", "text_embeddings"])
    new = tables.read_all("annotations")
    # captions + tags (camera rows reused), and one repair request for the caption with a short level_1
    assert len(chat_server.requests) == 2 * len(chosen) + 1
    prompts = [" ".join(p.get("text", "") for p in r["body"]["messages"][-1]["content"]) for r in chat_server.requests]
    repairs = [p for p in prompts if "Your previous reply was" in p]
    assert len(repairs) == 1 and "too short" in repairs[0] and "level_1: 2 words" in repairs[0]
    assert summary.stages["latents"].extra["model_calls"] == 0
    # old rows stay, new versions sit beside them
    assert set(map(tuple, old[["clip_id", "kind", "producer_version"]].values)) <= set(
        map(tuple, new[["clip_id", "kind", "producer_version"]].values))
    vlm_caps = new[(new.kind == "captions") & new.producer_version.str.contains("vlm-test-vl@r1")]
    assert len(vlm_caps) == len(chosen)
    assert (vlm_caps.status == "ok").all()  # the repair fixed it
    repaired = vlm_caps[vlm_caps.attempts == 2]
    assert len(repaired) == 1 and json.loads(repaired.evidence.iloc[0])["replies"] == 2
    assert (vlm_caps.model_id == "test-vl@r1").all() and (vlm_caps.prompt_version != "none").all()
    assert len(new[(new.kind == "camera")]) == len(old[old.kind == "camera"])
    text = tables.read_all("text_embeddings")
    assert summary.stages["text_embeddings"].extra["model_calls"] == len(chosen)
    assert set(text.caption_version) >= {vlm_caps.producer_version.iloc[0]}


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "fp8_e4m3"])
def test_latents_files_keep_their_dtype_and_stats(dtype: str, tmp_path: Path) -> None:
    import torch

    from vidassets.derive.latents import DTYPES, latent_stats, latents_bytes

    objects = open_object_store(str(tmp_path))
    latents = torch.randn(4, 3, 8, 14)
    latents[0, 0, 0, 0] = float("nan")
    stats = latent_stats(latents)
    assert stats["nan_count"] == 1 and stats["inf_count"] == 0 and abs(stats["mean"]) < 0.2
    objects.put_bytes("l.safetensors", latents_bytes(latents, dtype, {"std": str(stats["std"])}))
    stored, meta = load_latents(objects, "l.safetensors")
    assert stored.dtype == getattr(torch, DTYPES[dtype]) and stored.shape == latents.shape
    assert float(meta["std"]) == stats["std"]


def test_a_camera_change_expires_only_the_annotations_that_see_the_camera_record() -> None:
    """Captions are given the camera record (both backends) and rule-based tags use it; the VLM tag
    prompt never sees it, so VLM tags keep their version when the camera annotator changes."""
    from vidassets.config import AnnotationSettings
    from vidassets.derive.annotations import PROMPTS, kind_versions

    vlm = {"endpoint": "http://127.0.0.1:9/v1", "model": "test-vl", "model_revision": "r1"}
    for tags in ("vlm", "rule_based"):
        before = kind_versions(AnnotationSettings(camera="rule_based", captions="vlm", tags=tags, vlm=vlm))
        after = kind_versions(AnnotationSettings(camera="vlm", captions="vlm", tags=tags, vlm=vlm))
        assert before["camera"] != after["camera"] and before["captions"] != after["captions"]
        assert (before["tags"] == after["tags"]) is (tags == "vlm"), tags
    assert "{camera}" in PROMPTS["captions"] and "{camera}" not in PROMPTS["tags"]
