"""Client for any OpenAI-compatible chat-completions server (vLLM, SGLang, TGI, llama.cpp, …)
serving a vision-language model: frames go in as image content parts, replies are constrained by
a JSON schema where the server supports it and always validated here. Bounded concurrency,
retries with exponential backoff on transport errors / 429 / 5xx, per-request timeouts.

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


@dataclass(frozen=True)
class VlmRequest:
    kind: str  # camera | captions | tags
    system: str
    prompt: str
    frames: Sequence[np.ndarray]  # RGB uint8
    times: Sequence[float]
    schema: dict[str, Any]
    audio_wav: bytes | None = None
    """The clip's audio as WAV, sent as an ``input_audio`` content part (audio captions)."""


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
        model, key variable, timeouts, retries, sampling); ``max_concurrency`` overrides its own."""
        e = endpoint
        return cls(e.endpoint, e.model, e.api_key_env, e.timeout_seconds, e.retries, e.backoff_seconds,
                   max_concurrency or e.max_concurrency, e.max_tokens, e.temperature, use_json_schema=e.json_schema)

    def __init__(self, endpoint: str, model: str, api_key_env: str | None = None, timeout_seconds: float = 120.0,
                 retries: int = 3, backoff_seconds: float = 1.0, max_concurrency: int = 8, max_tokens: int = 1024,
                 temperature: float = 0.0, jpeg_quality: int = 85, use_json_schema: bool = True):
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model = model
        self._key = secret(api_key_env)
        self.timeout, self.retries, self.backoff = timeout_seconds, retries, backoff_seconds
        self.max_concurrency, self.max_tokens, self.temperature = max_concurrency, max_tokens, temperature
        self.jpeg_quality, self.use_json_schema = jpeg_quality, use_json_schema
        self.requests_sent = 0

    def payload(self, request: VlmRequest) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for t, rgb in zip(request.times, request.frames, strict=True):
            content.append({"type": "text", "text": f"Frame at {t:.2f} s:"})
            content.append({"type": "image_url", "image_url": {"url": _data_url(rgb, self.jpeg_quality)}})
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
        if self.use_json_schema:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": request.kind, "schema": request.schema, "strict": True}}
        return body

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


def _data_url(rgb: np.ndarray, quality: int) -> str:
    ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("cannot encode frame as JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(jpeg.tobytes()).decode()


def prompt_digest(*texts: str) -> str:
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:8]
