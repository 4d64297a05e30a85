"""Spoken language (and a transcript) from any OpenAI-compatible transcription server
(``POST {endpoint}/audio/transcriptions``, multipart, ``response_format=verbose_json``: the reply
names the ``language``), e.g. a vLLM or faster-whisper server running Whisper. Standard library only;
retries with backoff on transport errors / 429 / 5xx.

``NoTranscriber`` is the offline placeholder: it detects nothing and says so (its version is
``language-placeholder-none``); rows it writes carry ``language: null``."""

from __future__ import annotations

import io
import json
import os
import time
import urllib.error
import urllib.request
import uuid
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from vidassets.models import record_calls

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
PLACEHOLDER_VERSION = "language-placeholder-none"


@dataclass
class Transcript:
    ok: bool
    language: str | None = None
    text: str | None = None
    error: str | None = None
    attempts: int = 0


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """16-bit PCM mono WAV of float samples in [-1, 1]."""
    pcm = (np.clip(np.asarray(samples, dtype=np.float32), -1, 1) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


def _multipart(fields: dict[str, str], file_name: str, data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{file_name}"\r\n'
                 f"Content-Type: audio/wav\r\n\r\n".encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


class OpenAITranscriber:
    def __init__(self, endpoint: str, model: str, revision: str = "unspecified", api_key_env: str | None = None,
                 timeout_seconds: float = 120.0, retries: int = 3, backoff_seconds: float = 1.0) -> None:
        self.url = endpoint.rstrip("/") + "/audio/transcriptions"
        self.model = model
        self.version = f"asr:{model}@{revision}+verbose_json"
        self._key = os.environ.get(api_key_env, "") if api_key_env else ""
        self.timeout, self.retries, self.backoff = timeout_seconds, retries, backoff_seconds
        self.calls = 0

    def __call__(self, samples: np.ndarray, rate: int) -> Transcript:
        body, content_type = _multipart({"model": self.model, "response_format": "verbose_json"}, "clip.wav",
                                        wav_bytes(samples, rate))
        headers = {"Content-Type": content_type}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last = "not sent"
        for attempt in range(1, self.retries + 2):
            self.calls += 1
            record_calls()
            try:
                request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    reply: dict[str, Any] = json.loads(response.read())
                language = reply.get("language")
                return Transcript(True, language=str(language).lower() if language else None, text=reply.get("text"),
                                  attempts=attempt)
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}"
                if exc.code not in RETRYABLE_STATUS:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = f"{exc.__class__.__name__}: {getattr(exc, 'reason', exc)}"
            except (ValueError, AttributeError) as exc:
                last = f"malformed transcription response: {exc!r}"
                break
            if attempt <= self.retries:
                time.sleep(self.backoff * 2 ** (attempt - 1))
        return Transcript(False, error=last, attempts=attempt)


class NoTranscriber:
    """Offline placeholder: no language is detected."""

    version = PLACEHOLDER_VERSION
    placeholder = True

    def __call__(self, samples: np.ndarray, rate: int) -> Transcript:
        return Transcript(True, language=None, text=None, attempts=0)
