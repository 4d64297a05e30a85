"""Client for any OpenAI-compatible chat-completions server (vLLM, SGLang, TGI, llama.cpp, …)
serving a vision-language model. Bounded concurrency, retries with exponential backoff on transport
errors / 429 / 5xx, per-request timeouts; replies are constrained by a JSON schema where the server
supports it and always validated here.

A clip's frames go in one of two forms (``frames_as``):

- ``video`` (default): ONE ``video_url`` content part whose URL is ``data:video/jpeg;base64,`` and
  the frames' base64 JPEGs joined by commas, the form vLLM decodes into a frame sequence (its
  ``VideoMediaIO``: the ``video/jpeg`` media type splits on commas). The sampling rate, derived from
  the frame times, goes where vLLM passes it to the model's processor: ``media_io_kwargs.video``
  (``fps`` and ``num_frames``: the jpeg sequence's metadata, from which Qwen2.5-VL's processor takes
  ``sampled_fps`` and so the seconds per temporal patch of its M-RoPE) and ``mm_processor_kwargs``
  (``fps``, read directly by the Qwen2.5-VL processor of older vLLM / transformers; with
  ``do_sample_frames: false`` so no server resamples the frames). A text part before the video gives
  the frame times, as the design's prompts do. One frame (a still image) goes as an image part.
- ``images``: a "Frame at t s:" text part and an ``image_url`` part per frame, for servers without
  video input.

The schema goes as OpenAI ``response_format`` (``json_schema``, which vLLM and SGLang honour) or, with
``structured_outputs="vllm"``, as vLLM's own ``structured_outputs: {"json": schema}`` (the field that
replaced ``guided_json``, removed in vLLM 0.12). ``request_format`` names the choice; it is part of
every VLM annotation version.

Standard library only (urllib + threads), so it runs wherever the pipeline runs."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from vidassets.config import secret
from vidassets.models import record_calls
from vidassets.models.http import post_with_retries

FRAMES_AS = ("video", "images")
STRUCTURED_OUTPUTS = ("response_format", "vllm")
JPEG_QUALITY = 85
FRAME_LINE = "Frame at {time:.2f} s:"
"""Before each frame's image part (``images``, and the single frame of a still)."""
VIDEO_LINE = "The video below is {count} frames sampled at {fps:.3g} fps; their times in the clip (s): {times}."
"""Before the video part (``video``): the frame times, which a sampling rate alone cannot tell."""
REQUEST_LAYOUT = "openai-chat-v2"
"""Bump when the body's layout changes in a way the texts above do not show."""


def request_format(frames_as: str = "video", structured_outputs: str = "response_format", json_schema: bool = True,
                   jpeg_quality: int = JPEG_QUALITY) -> str:
    """The request format as a version fragment: how frames and the schema are sent, the JPEG quality
    and a digest of the texts the client adds. Annotations of another format are other annotations."""
    _check_option("frames_as", frames_as, FRAMES_AS)
    _check_option("structured_outputs", structured_outputs, STRUCTURED_OUTPUTS)
    texts = prompt_digest(REQUEST_LAYOUT, FRAME_LINE, VIDEO_LINE if frames_as == "video" else "")
    return f"{frames_as}-jpeg{jpeg_quality}-{texts}+so-{structured_outputs if json_schema else 'none'}"


def _check_option(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} (annotations.vlm.{name}) must be one of {list(allowed)}, not {value!r}")


def sampling_fps(times: Sequence[float]) -> float:
    """Frames per second of frames sampled at ``times`` (seconds, increasing): frame intervals over the
    time they span, i.e. the rate of evenly sampled frames with the same first and last time."""
    if len(times) < 2:
        raise ValueError(f"a sampling rate needs two frame times or more, got {len(times)}")
    steps = np.diff(np.asarray(times, dtype=np.float64))
    if not (steps > 0).all():
        raise ValueError(f"frame times must increase to form a video, got {list(times)}")
    return round(float((len(times) - 1) / (times[-1] - times[0])), 6)


@dataclass(frozen=True)
class VlmRequest:
    """One chat request: the clip's frames (RGB uint8) at ``times`` (seconds in the clip, increasing),
    the prompt, and the JSON schema of the reply. The frame rate sent with a video is derived from
    ``times``."""

    kind: str  # camera | captions | tags
    system: str
    prompt: str
    frames: Sequence[np.ndarray]  # RGB uint8
    times: Sequence[float]
    schema: dict[str, Any]
    audio_wav: bytes | None = None
    """The clip's audio as WAV, sent as an ``input_audio`` content part (audio captions)."""

    @property
    def fps(self) -> float:
        return sampling_fps(self.times)


@dataclass
class VlmReply:
    ok: bool
    value: Any = None
    raw: str | None = None
    error: str | None = None  # transport failure after all retries (the row is retried next run)
    invalid: str | None = None  # the server answered, but not with parseable JSON
    attempts: int = 0
    seconds: float = 0.0


class OpenAIChatClient:
    @classmethod
    def for_endpoint(cls, endpoint: Any, max_concurrency: int | None = None) -> OpenAIChatClient:
        """The client of one configured endpoint (``annotations.vlm``, ``caption_qc.judge``: endpoint,
        model, key variable, timeouts, retries, sampling, request format); ``max_concurrency``
        overrides its own."""
        e = endpoint
        return cls(e.endpoint, e.model, e.api_key_env, e.timeout_seconds, e.retries, e.backoff_seconds,
                   max_concurrency or e.max_concurrency, e.max_tokens, e.temperature, use_json_schema=e.json_schema,
                   **endpoint_format(e))

    def __init__(self, endpoint: str, model: str, api_key_env: str | None = None, timeout_seconds: float = 120.0,
                 retries: int = 3, backoff_seconds: float = 1.0, max_concurrency: int = 8, max_tokens: int = 1024,
                 temperature: float = 0.0, jpeg_quality: int = JPEG_QUALITY, use_json_schema: bool = True,
                 frames_as: str = "video", structured_outputs: str = "response_format"):
        _check_option("frames_as", frames_as, FRAMES_AS)
        _check_option("structured_outputs", structured_outputs, STRUCTURED_OUTPUTS)
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model = model
        self._key = secret(api_key_env)
        self.timeout, self.retries, self.backoff = timeout_seconds, retries, backoff_seconds
        self.max_concurrency, self.max_tokens, self.temperature = max_concurrency, max_tokens, temperature
        self.jpeg_quality, self.use_json_schema = jpeg_quality, use_json_schema
        self.frames_as, self.structured_outputs = frames_as, structured_outputs
        self.requests_sent = 0

    @property
    def request_format(self) -> str:
        return request_format(self.frames_as, self.structured_outputs, self.use_json_schema, self.jpeg_quality)

    def payload(self, request: VlmRequest) -> dict[str, Any]:
        """The chat-completions body of one request: system message, then one user message with the
        frames (one video part, or timed image parts), the audio, and the prompt last."""
        as_video = self.frames_as == "video" and len(request.frames) > 1
        content = self._video_parts(request) if as_video else self._image_parts(request)
        if request.audio_wav is not None:
            content.append({"type": "input_audio", "input_audio": {
                "data": base64.b64encode(request.audio_wav).decode(), "format": "wav"}})
        content.append({"type": "text", "text": request.prompt})
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": request.system}, {"role": "user", "content": content}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if as_video:
            fps = request.fps
            body["media_io_kwargs"] = {"video": {"fps": fps, "num_frames": len(request.frames)}}
            body["mm_processor_kwargs"] = {"fps": fps, "do_sample_frames": False}
        if self.use_json_schema and self.structured_outputs == "vllm":
            body["structured_outputs"] = {"json": request.schema}
        elif self.use_json_schema:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": request.kind, "schema": request.schema, "strict": True}}
        return body

    def _image_parts(self, request: VlmRequest) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        for t, rgb in zip(request.times, request.frames, strict=True):
            content.append({"type": "text", "text": FRAME_LINE.format(time=t)})
            content.append({"type": "image_url", "image_url": {
                "url": "data:image/jpeg;base64," + _jpeg_base64(rgb, self.jpeg_quality)}})
        return content

    def _video_parts(self, request: VlmRequest) -> list[dict[str, Any]]:
        """The frame times, then the frames as one ``video/jpeg`` data URL (base64 JPEGs, comma-joined)."""
        if len(request.frames) != len(request.times):
            raise ValueError(f"{len(request.frames)} frames but {len(request.times)} frame times")
        if len({np.asarray(f).shape for f in request.frames}) > 1:
            raise ValueError("the frames of one video must share a size")
        times = ", ".join(f"{t:.2f}" for t in request.times)
        line = VIDEO_LINE.format(count=len(request.frames), fps=request.fps, times=times)
        url = "data:video/jpeg;base64," + ",".join(_jpeg_base64(rgb, self.jpeg_quality) for rgb in request.frames)
        return [{"type": "text", "text": line}, {"type": "video_url", "video_url": {"url": url}}]

    def complete(self, request: VlmRequest) -> VlmReply:
        started = time.monotonic()
        body = json.dumps(self.payload(request)).encode()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        text, error, attempts = post_with_retries(
            self.url, body, headers, self.timeout, self.retries, self.backoff,
            lambda raw: json.loads(raw)["choices"][0]["message"]["content"], self._count, "chat-completions response")
        if error is not None:
            return VlmReply(False, error=error, attempts=attempts, seconds=time.monotonic() - started)
        try:
            value = parse_json_reply(text)
        except ValueError as exc:
            return VlmReply(False, raw=text, invalid=str(exc), attempts=attempts, seconds=time.monotonic() - started)
        return VlmReply(True, value=value, raw=text, attempts=attempts, seconds=time.monotonic() - started)

    def _count(self) -> None:
        self.requests_sent += 1
        record_calls()

    def complete_all(self, requests: Sequence[VlmRequest], on_done: Callable[[int], None] | None = None) -> list[VlmReply]:
        """All requests with at most ``max_concurrency`` in flight; replies in request order."""
        with ThreadPoolExecutor(max_workers=max(1, self.max_concurrency)) as pool:
            futures = [pool.submit(self.complete, r) for r in requests]
            replies = []
            for i, f in enumerate(futures):
                replies.append(f.result())
                if on_done:
                    on_done(i)
        return replies


def parse_json_reply(text: str) -> Any:
    """The JSON object in a model reply (tolerates a Markdown code fence around it)."""
    stripped = text.strip()
    fenced = re.match(r"^```(?:json)?\s*(.*?)\s*```$", stripped, re.S)
    if fenced:
        stripped = fenced.group(1)
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise ValueError(f"reply is not JSON ({exc.msg} at {exc.pos}): {text[:120]!r}") from None


def endpoint_format(endpoint: Any) -> dict[str, str]:
    """``frames_as`` and ``structured_outputs`` of an endpoint's settings."""
    return {"frames_as": endpoint.frames_as, "structured_outputs": endpoint.structured_outputs}


def endpoint_request_format(endpoint: Any) -> str:
    """``request_format`` of an endpoint's settings (what a version built from settings names)."""
    return request_format(json_schema=endpoint.json_schema, **endpoint_format(endpoint))


def _jpeg_base64(rgb: np.ndarray, quality: int) -> str:
    frame = np.asarray(rgb)
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"a frame must be RGB uint8 (height, width, 3), got {frame.dtype} {frame.shape}")
    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("cannot encode frame as JPEG")
    return base64.b64encode(jpeg.tobytes()).decode()


def prompt_digest(*texts: str) -> str:
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:8]
