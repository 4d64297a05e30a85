"""VLM requests in the form vLLM serves Qwen2.5-VL-class models, checked against a real loopback
HTTP server that decodes them the way vLLM does: a clip's frames as ONE ``video_url`` part whose
``data:video/jpeg;base64,`` URL holds the frames' base64 JPEGs joined by commas, the sampling rate in
``media_io_kwargs.video`` / ``mm_processor_kwargs``, the reply schema as ``response_format`` or vLLM's
``structured_outputs``; the timed-images form for servers without video; and the tag labels of the
design's Table 5 (seed 002, Appx. C.3), written out here from the seed, not imported from the code."""

from __future__ import annotations

import base64
import json

import cv2
import numpy as np
import pandas as pd
import pytest

from vidassets.config import AnnotationSettings, VlmSettings
from vidassets.demo.bucket import decode_rgb
from vidassets.derive.annotations import TAG_NOTES, Backends, ClipFrames, vlm_version
from vidassets.derive.labels import JSON_SCHEMAS, TAG_FIELDS, validate_tags
from vidassets.derive.rule_annotator import ClipFacts, RuleBasedAnnotator, frame_looks
from vidassets.models.vlm import OpenAIChatClient, VlmRequest, request_format, sampling_fps
from vidassets_tests.chat_server import LoopbackChatServer
from vidassets_tests.conftest import SAMPLE_CACHE

# Table 5 of the design (seed 002): "subjects and actions are multi-label fields; all other fields
# are single-label". Every field lists unknown.
TABLE_5 = {
    "domain": ["real_world", "animation", "game", "screen_recording", "synthetic_render", "mixed", "unknown"],
    "scene": ["general_indoor", "general_outdoor", "urban", "nature", "driving", "sports", "food", "product",
              "portrait", "screen", "other", "unknown"],
    "subjects": ["person", "vehicle", "animal", "object", "food", "landscape", "building", "text", "screen", "robot",
                 "other", "unknown"],
    "actions": ["talking", "locomotion", "driving", "sports", "cooking", "object_manipulation", "natural_motion",
                "camera_motion_only", "timelapse", "none", "other", "unknown"],
    "style": ["photorealistic", "cinematic", "documentary", "anime", "cartoon", "cg_render", "gameplay", "graphic",
              "unknown"],
    "text": ["none", "incidental", "subtitle", "screen_ui", "document", "signage", "overlay_text", "unknown"],
    "watermark": ["none", "logo", "text_watermark", "platform_watermark", "unknown"],
}
MULTI_LABEL = {"subjects", "actions"}

TAGS_REPLY = {"domain": "real_world", "scene": "portrait", "subjects": ["person", "vehicle"], "actions": ["talking"],
              "style": "documentary", "text": "none", "watermark": "none"}
CAPTIONS_REPLY = {"level_0": "A man talks on a phone in a car.", "level_1": " ".join(["talks"] * 30),
                  "level_2": " ".join(["then"] * 70), "level_3": " ".join(["dense"] * 150)}


def decode_video_url(url: str) -> list[np.ndarray]:
    """The frames of a ``video_url`` data URL as vLLM reads it: RFC 2397 ``data:<type>;base64,<data>``;
    for ``video/jpeg`` the data is base64 JPEGs joined by commas, one per frame (RGB)."""
    assert url.startswith("data:")
    spec, _, data = url[5:].partition(",")
    media_type, _, encoding = spec.rpartition(";")
    assert (media_type, encoding) == ("video/jpeg", "base64"), spec
    frames = []
    for part in data.split(","):
        jpeg = np.frombuffer(base64.b64decode(part, validate=True), np.uint8)
        frames.append(cv2.cvtColor(cv2.imdecode(jpeg, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))
    return frames


class VllmLikeServer(LoopbackChatServer):
    """A loopback chat-completions server that records each body and answers like vLLM: it decodes
    a video part's frames (refusing, as vLLM would, a ``num_frames`` that does not match the frames
    sent), and replies with schema-shaped JSON for the kind it was asked for."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.videos: list[list[np.ndarray]] = []
        super().__init__()

    def handle(self, path: str, body: dict, auth: str | None) -> tuple[int, str | None]:
        self.bodies.append(body)
        return self.answer(body)

    def answer(self, body: dict) -> tuple[int, str]:
        parts = body["messages"][-1]["content"]
        for part in parts:
            if part["type"] == "video_url":
                frames = decode_video_url(part["video_url"]["url"])
                wanted = body.get("media_io_kwargs", {}).get("video", {}).get("num_frames", 32)
                if wanted != len(frames):
                    return 400, f"num_frames {wanted} but {len(frames)} frames sent"
                self.videos.append(frames)
        schema = (body.get("response_format", {}).get("json_schema", {}).get("schema")
                  or body.get("structured_outputs", {}).get("json") or {})
        kind = "tags" if "domain" in schema.get("properties", {}) else "captions"
        return 200, json.dumps(TAGS_REPLY if kind == "tags" else CAPTIONS_REPLY)

    def close(self) -> None:
        super().close()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = VllmLikeServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def clip() -> tuple[list[np.ndarray], list[float]]:
    """Six real frames of the carphone sample (176x144, 29.97 fps), every 15th: 0.5 s apart."""
    frames = list(decode_rgb(SAMPLE_CACHE / "carphone.mp4", limit=76))[::15]
    return frames, [i * 15 * 1001 / 30000 for i in range(len(frames))]


def _jpeg_roundtrip(rgb: np.ndarray) -> np.ndarray:
    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 85])
    return cv2.cvtColor(cv2.imdecode(jpeg, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


# ---------------------------------------------------------------- the request body


def test_frames_go_as_one_video_part_with_their_sampling_rate(server: VllmLikeServer, clip) -> None:
    frames, times = clip
    client = OpenAIChatClient(server.endpoint, "Qwen/Qwen2.5-VL-7B-Instruct", retries=0)
    reply = client.complete(VlmRequest("tags", "sys", "Tag this clip.", frames, times, JSON_SCHEMAS["tags"]))
    assert reply.ok and reply.value == TAGS_REPLY
    body = server.bodies[-1]
    parts = body["messages"][1]["content"]
    assert [p["type"] for p in parts] == ["text", "video_url", "text"] and parts[-1]["text"] == "Tag this clip."
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    # the server decoded exactly the clip's frames, in order (JPEG at quality 85: what the client encodes)
    (decoded,) = server.videos
    assert len(decoded) == len(frames)
    for i, frame in enumerate(decoded):
        assert np.array_equal(frame, _jpeg_roundtrip(frames[i]))
        errors = [np.abs(frame.astype(int) - f.astype(int)).mean() for f in frames]
        assert int(np.argmin(errors)) == i and errors[i] < 3
    fps = 30000 / 1001 / 15
    assert body["media_io_kwargs"] == {"video": {"fps": pytest.approx(fps, abs=1e-5), "num_frames": 6}}
    assert body["mm_processor_kwargs"] == {"fps": pytest.approx(fps, abs=1e-5), "do_sample_frames": False}
    assert "0.00, 0.50, 1.00, 1.50, 2.00, 2.50" in parts[0]["text"] and "2 fps" in parts[0]["text"]
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "tags", "schema": JSON_SCHEMAS["tags"], "strict": True}}
    assert "structured_outputs" not in body


def test_vllm_structured_outputs_and_timed_images(server: VllmLikeServer, clip) -> None:
    frames, times = clip
    request = VlmRequest("captions", "sys", "Caption it.", frames[:3], times[:3], JSON_SCHEMAS["captions"])
    native = OpenAIChatClient(server.endpoint, "m", retries=0, structured_outputs="vllm")
    assert native.complete(request).value == CAPTIONS_REPLY
    assert server.bodies[-1]["structured_outputs"] == {"json": JSON_SCHEMAS["captions"]}
    assert "response_format" not in server.bodies[-1]

    images = OpenAIChatClient(server.endpoint, "m", retries=0, frames_as="images")
    assert images.complete(request).ok
    body = server.bodies[-1]
    parts = body["messages"][1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"] * 3 + ["text"]
    assert [p["text"] for p in parts[0:6:2]] == ["Frame at 0.00 s:", "Frame at 0.50 s:", "Frame at 1.00 s:"]
    for part, frame in zip(parts[1:6:2], frames[:3], strict=True):
        prefix, _, data = part["image_url"]["url"].partition(",")
        assert prefix == "data:image/jpeg;base64"
        jpeg = np.frombuffer(base64.b64decode(data), np.uint8)
        assert np.array_equal(cv2.cvtColor(cv2.imdecode(jpeg, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB),
                              _jpeg_roundtrip(frame))
    assert "media_io_kwargs" not in body and "mm_processor_kwargs" not in body
    assert len(server.videos) == 1  # the structured-outputs request's video only

    bare = OpenAIChatClient(server.endpoint, "m", retries=0, use_json_schema=False)
    assert bare.complete(request).ok
    assert not {"response_format", "structured_outputs"} & set(server.bodies[-1])


def test_a_still_or_no_frames_sends_no_video_and_bad_input_is_named(server: VllmLikeServer, clip) -> None:
    frames, times = clip
    client = OpenAIChatClient(server.endpoint, "m", retries=0)
    assert client.complete(VlmRequest("tags", "s", "p", frames[:1], [0.0], JSON_SCHEMAS["tags"])).ok
    assert [p["type"] for p in server.bodies[-1]["messages"][1]["content"]] == ["text", "image_url", "text"]
    assert "media_io_kwargs" not in server.bodies[-1]
    audio_only = client.payload(VlmRequest("audio_caption", "s", "p", [], [], {"type": "object"}, audio_wav=b"RIFF"))
    assert [p["type"] for p in audio_only["messages"][1]["content"]] == ["input_audio", "text"]
    with pytest.raises(ValueError, match="must increase"):
        client.payload(VlmRequest("tags", "s", "p", frames[:2], [1.0, 1.0], {}))
    with pytest.raises(ValueError, match="share a size"):
        client.payload(VlmRequest("tags", "s", "p", [frames[0], frames[1][:64]], [0.0, 0.5], {}))
    with pytest.raises(ValueError, match=r"annotations\.vlm\.frames_as"):
        OpenAIChatClient(server.endpoint, "m", frames_as="gif")
    with pytest.raises(ValueError, match=r"annotations\.vlm\.structured_outputs"):
        OpenAIChatClient(server.endpoint, "m", structured_outputs="guided_json")
    assert sampling_fps([0.0, 0.25, 0.5]) == 4.0


def test_one_request_per_clip_and_kind_through_the_annotator(server: VllmLikeServer, clip) -> None:
    frames, times = clip
    settings = AnnotationSettings(captions="vlm", tags="vlm", vlm={
        "endpoint": server.endpoint, "model": "Qwen/Qwen2.5-VL-7B-Instruct", "max_frames": 4, "retries": 0})
    backends = Backends(settings, pd.DataFrame(), pd.DataFrame(), pd.DataFrame())
    items = [ClipFrames({"clip_id": f"c{i}", "asset_id": "a"}, times, frames) for i in range(2)]
    for kind, expected in (("tags", TAGS_REPLY), ("captions", CAPTIONS_REPLY)):
        before = len(server.bodies)
        results = backends.run(kind, items, {})
        assert [r[0] for r in results] == ["ok", "ok"] and results[0][1] == expected
        assert len(server.bodies) == before + 2  # one request per clip (all four caption levels in it)
    # max_frames 4 of the six, evenly spread: frames 0, 2, 3, 5 at their own times
    picked = [0, 2, 3, 5]
    assert all(np.array_equal(v[j], _jpeg_roundtrip(frames[i])) for v in server.videos for j, i in enumerate(picked))
    body = server.bodies[-1]
    expected_fps = 3 / (times[5] - times[0])
    assert body["media_io_kwargs"]["video"] == {"fps": pytest.approx(expected_fps, abs=1e-5), "num_frames": 4}


def test_the_request_format_is_part_of_the_version() -> None:
    def endpoint(**kw):
        return VlmSettings(endpoint="http://vlm:8000/v1", model="Qwen/Qwen2.5-VL-7B-Instruct", model_revision="r1", **kw)

    default = vlm_version("tags", endpoint())
    assert default == vlm_version("tags", endpoint(frames_as="video", structured_outputs="response_format"))
    others = {vlm_version("tags", endpoint(frames_as="images")), vlm_version("tags", endpoint(structured_outputs="vllm")),
              vlm_version("tags", endpoint(json_schema=False))}
    assert len(others) == 3 and default not in others
    assert request_format("video") in default and "tag-schema-v2" in default
    assert request_format("images") != request_format("video")
    assert OpenAIChatClient("http://127.0.0.1:9/v1", "m", frames_as="images").request_format == request_format("images")


# ---------------------------------------------------------------- Table 5


def test_tag_schema_enums_are_table_5() -> None:
    props = JSON_SCHEMAS["tags"]["properties"]
    assert list(props) == list(TABLE_5) == list(TAG_FIELDS)
    for field, labels in TABLE_5.items():
        if field in MULTI_LABEL:
            assert props[field]["type"] == "array" and props[field]["items"]["enum"] == labels, field
        else:
            assert props[field] == {"type": "string", "enum": labels}, field
        assert [*TAG_NOTES[field], "unknown"] == labels, field  # the prompt defines every label
    assert JSON_SCHEMAS["tags"]["required"] == list(TABLE_5)
    assert validate_tags(TAGS_REPLY) == []
    assert validate_tags({**TAGS_REPLY, "scene": "outdoor"})  # a label of the former set
    assert validate_tags({**TAGS_REPLY, "actions": ["none", "talking"]})
    assert validate_tags({**TAGS_REPLY, "subjects": ["unknown", "person"]})
    assert validate_tags({**TAGS_REPLY, "subjects": ["none"]})  # 'none' is an action label only
    assert validate_tags({**TAGS_REPLY, "subjects": ["person", "person"]})


def test_rule_based_tags_use_only_table_5_labels(clip) -> None:
    frames, times = clip
    looks = frame_looks(times, frames)
    annotator = RuleBasedAnnotator()
    seen: dict[str, set[str]] = {field: set() for field in TABLE_5}
    for faces in (0, 1, 5):
        for share in (None, 0.0, 0.05, 0.3):
            for motion, scene in (("no-motion", "static"), ("simple-motion", "static"), ("minor-motion", "dynamic")):
                evidence = {"faces": {"max_faces": faces}, **({"text": {"text_share_q95": share}} if share is not None else {})}
                facts = ClipFacts(duration_s=2.5, fps=29.97, width=176, height=144, scores={"static": 0.1},
                                  evidence=evidence, camera={"motion_type": motion, "scene_dynamics": scene},
                                  looks=looks)
                tags = annotator.tags(facts)
                assert validate_tags(tags) == [], tags
                for field, value in tags.items():
                    seen[field].update(value if isinstance(value, list) else [value])
    assert all(seen[field] <= set(TABLE_5[field]) for field in TABLE_5), seen
    assert seen["subjects"] == {"person", "text", "unknown"}
    assert seen["actions"] == {"none", "camera_motion_only", "unknown"}
    assert seen["text"] == {"none", "incidental", "unknown"}
