"""Spoken language (and a transcript) from any OpenAI-compatible transcription server
(``POST {endpoint}/audio/transcriptions``, multipart, ``response_format=verbose_json``: the reply
names the ``language``), e.g. a vLLM or faster-whisper server running Whisper. Standard library only;
retries with backoff on transport errors / 429 / 5xx.

``NoTranscriber`` is the offline placeholder: it detects nothing and says so (its version is
``language-placeholder-none``); rows it writes carry ``language: null``."""

from __future__ import annotations

import io
import json
import uuid
import wave
from dataclasses import dataclass

import numpy as np

from vidassets.config import secret
from vidassets.models import record_calls
from vidassets.models.http import post_with_retries

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
        self._key = secret(api_key_env)
        self.timeout, self.retries, self.backoff = timeout_seconds, retries, backoff_seconds
        self.calls = 0

    def __call__(self, samples: np.ndarray, rate: int) -> Transcript:
        body, content_type = _multipart({"model": self.model, "response_format": "verbose_json"}, "clip.wav",
                                        wav_bytes(samples, rate))
        headers = {"Content-Type": content_type}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        reply, error, attempts = post_with_retries(self.url, body, headers, self.timeout, self.retries, self.backoff,
                                                   json.loads, self._count, "transcription response")
        if error is not None or not isinstance(reply, dict):
            return Transcript(False, error=error or f"not a JSON object: {str(reply)[:80]!r}", attempts=attempts)
        language = reply.get("language")
        return Transcript(True, language=str(language).lower() if language else None, text=reply.get("text"),
                          attempts=attempts)

    def _count(self) -> None:
        self.calls += 1
        record_calls()


class NoTranscriber:
    """Offline placeholder: no language is detected."""

    version = PLACEHOLDER_VERSION
    placeholder = True

    def __call__(self, samples: np.ndarray, rate: int) -> Transcript:
        return Transcript(True, language=None, text=None, attempts=0)
