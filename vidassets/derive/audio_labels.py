"""What is in a clip's kept audio, from 16 kHz mono samples (no Dagster, no models but what is passed
in): EBU R128 loudness, content tags, and the rule-based captions that stand in for a captioning
model offline.

- **Loudness**: integrated loudness in LUFS per ITU-R BS.1770-4 / EBU R128 (K-weighting, 400 ms
  blocks, absolute and relative gates; ``pyloudnorm``), sample peak in dBFS and the share of clipped
  samples. Under 0.4 s or fully gated (silence): no integrated loudness.
- **Tags** (rule-based, named as such in its version): each 0.5 s window is ``silence`` (RMS below
  -50 dBFS), ``speech`` (half of it inside a Silero VAD speech span), ``music`` (tonal: low
  spectral flatness, sustained energy) or ``ambience``; the clip gets each label's share and the
  dominant label.
- **Captions** (placeholders, named as such): a sentence from the tags, loudness and language; the
  audio-visual caption joins the video caption and the audio caption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

TAGS_VERSION = "audio-tags-rules-v1"
LOUDNESS_VERSION = "ebu-r128-v1"
AUDIO_CAPTION_RULES_VERSION = "audio-caption-rules-v1-placeholder"
AV_CAPTION_RULES_VERSION = "av-caption-join-v1-placeholder"
LABELS = ("speech", "music", "ambience", "silence")
WINDOW_S = 0.5
SILENCE_DBFS = -50.0
TONAL_FLATNESS = 0.12


def loudness(samples: np.ndarray, rate: int) -> dict[str, Any]:
    import pyloudnorm

    x = np.asarray(samples, dtype=np.float64).ravel()
    peak = float(np.max(np.abs(x))) if len(x) else 0.0
    out: dict[str, Any] = {
        "integrated_lufs": None,
        "peak_dbfs": round(float(20 * np.log10(peak)), 2) if peak > 0 else None,
        "clipping_share": round(float(np.mean(np.abs(x) >= 0.999)), 6) if len(x) else 0.0,
        "duration_s": round(len(x) / rate, 3),
    }
    if len(x) >= int(0.4 * rate):
        value = pyloudnorm.Meter(rate).integrated_loudness(x)
        if np.isfinite(value):
            out["integrated_lufs"] = round(float(value), 2)
    return out


def _windows(x: np.ndarray, rate: int) -> np.ndarray:
    size = int(WINDOW_S * rate)
    n = len(x) // size
    return x[: n * size].reshape(n, size) if n else np.zeros((0, size), np.float32)


def tags(samples: np.ndarray, rate: int, speech_spans: Sequence[Sequence[float]]) -> dict[str, Any]:
    x = np.asarray(samples, dtype=np.float32).ravel()
    frames = _windows(x, rate)
    if not len(frames):
        return {"label": "silence" if not len(x) or float(np.max(np.abs(x))) < 1e-4 else "ambience",
                "shares": {}, "windows": 0}
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12)
    level = 20 * np.log10(rms)
    spectrum = np.abs(np.fft.rfft(frames * np.hanning(frames.shape[1]), axis=1)) + 1e-9
    flatness = np.exp(np.mean(np.log(spectrum), axis=1)) / np.mean(spectrum, axis=1)
    labels = []
    for i in range(len(frames)):
        a, b = i * WINDOW_S, (i + 1) * WINDOW_S
        inside = sum(max(0.0, min(b, e) - max(a, s)) for s, e in speech_spans)
        if level[i] < SILENCE_DBFS:
            labels.append("silence")
        elif inside >= WINDOW_S / 2:
            labels.append("speech")
        elif flatness[i] < TONAL_FLATNESS:
            labels.append("music")
        else:
            labels.append("ambience")
    shares = {k: round(labels.count(k) / len(labels), 4) for k in LABELS}
    label = max(LABELS, key=lambda k: (shares[k], -LABELS.index(k)))
    return {"label": label, "shares": shares, "windows": len(labels)}


def speech_value(spans: Sequence[Sequence[float]], duration_s: float) -> dict[str, Any]:
    speech_s = sum(e - s for s, e in spans)
    return {"speech": bool(spans), "speech_share": round(speech_s / duration_s, 4) if duration_s > 0 else 0.0,
            "speech_seconds": round(speech_s, 3), "segments": [list(s) for s in spans]}


def rule_audio_caption(tag: Mapping[str, Any], loud: Mapping[str, Any], language: str | None) -> str:
    shares = tag.get("shares") or {}
    present = [k for k in ("speech", "music", "ambience") if shares.get(k, 0) >= 0.2]
    if not present:
        return "Near silence."
    words = {"speech": "speech" + (f" (language: {language})" if language else ""), "music": "music",
             "ambience": "ambient sound"}
    parts = [words[k] for k in sorted(present, key=lambda k: -shares[k])]
    lufs = loud.get("integrated_lufs")
    volume = "" if lufs is None else " quiet" if lufs < -35 else " loud" if lufs > -14 else ""
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    sentence = f"{volume.strip().capitalize() + ' ' if volume else ''}{body}"
    return sentence[0].upper() + sentence[1:] + "."


def join_captions(video_caption: str | None, audio_caption: str | None) -> str | None:
    if not video_caption and not audio_caption:
        return None
    if not audio_caption:
        return video_caption
    if not video_caption:
        return f"Audio: {audio_caption}"
    return f"{video_caption.rstrip()} Audio: {audio_caption}"
