"""The audio path for one clip (sandbox task): does the source have audio, does its track line up
with the video, what is in it (loudness, silence, clipping, a speech/music/ambience guess), and the
clip's span resampled and encoded (Opus in Ogg by default).

Sync is judged from timestamps: the audio track's start and end against the video track's, in
seconds on the common container clock. A track that starts or ends more than the bound away from
the video (e.g. muxed with an offset) makes the clip ``unsynced``: it trains video-only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from vidassets.media.source import open_container

VERSION = "audio-v1"

SILENCE_DBFS = -50.0  # a 20 ms window quieter than this is silence
SILENT_TRACK_DBFS = -60.0  # a whole clip quieter than this is a silent track


def _track_span(container, stream) -> tuple[float | None, float | None]:
    """(first timestamp, end timestamp) of a stream in seconds, from its packets (demux only)."""
    start = end = None
    tb = float(stream.time_base)
    container.seek(0)
    for packet in container.demux(stream):
        if packet.pts is None:
            continue
        t = packet.pts * tb
        start = t if start is None else min(start, t)
        e = t + (packet.duration or 0) * tb
        end = e if end is None else max(end, e)
    return start, end


def audio_signals(samples: np.ndarray, rate: int) -> dict[str, Any]:
    """Light signals of mono float samples in [-1, 1]."""
    if samples.size == 0:
        return {"loudness_dbfs": None, "peak_dbfs": None, "silence_share": None, "clipping_share": None,
                "content_guess": "unknown"}
    window = max(1, rate // 50)
    n = samples.size // window
    frames = samples[: n * window].reshape(n, window) if n else samples.reshape(1, -1)
    rms = np.sqrt(np.mean(frames**2, axis=1) + 1e-12)
    level = 20 * np.log10(rms)
    total_rms = float(np.sqrt(np.mean(samples**2) + 1e-12))
    signals = {
        "loudness_dbfs": round(float(20 * np.log10(total_rms)), 2),
        "peak_dbfs": round(float(20 * np.log10(float(np.max(np.abs(samples))) + 1e-12)), 2),
        "silence_share": round(float(np.mean(level < SILENCE_DBFS)), 4),
        "clipping_share": round(float(np.mean(np.abs(samples) >= 0.999)), 6),
    }
    signals["content_guess"] = _guess(frames, level, rate)
    return signals


def _guess(frames: np.ndarray, level: np.ndarray, rate: int) -> str:
    """Rule-based: speech has syllable-rate (2-8 Hz) loudness modulation and many pauses; music is
    sustained and tonal (low spectral flatness); the rest is ambience."""
    active = level > SILENCE_DBFS
    if active.mean() < 0.05 or len(level) < 25:
        return "silence" if active.mean() < 0.05 else "unknown"
    spectrum = np.abs(np.fft.rfft(frames * np.hanning(frames.shape[1]), axis=1)) + 1e-9
    flatness = float(np.median(np.exp(np.mean(np.log(spectrum), axis=1)) / np.mean(spectrum, axis=1)))
    envelope = level - level.mean()
    modulation = np.abs(np.fft.rfft(envelope))
    freqs = np.fft.rfftfreq(len(envelope), d=1 / 50)
    band = modulation[(freqs >= 2) & (freqs <= 8)].sum() / (modulation[freqs > 0.5].sum() + 1e-9)
    pauses = float(np.mean(level < level.max() - 25))
    if band > 0.45 and pauses > 0.1:
        return "speech"
    if flatness < 0.1 and pauses < 0.1:
        return "music"
    return "ambience"


def extract_audio(spec: Mapping[str, Any], start_s: float, end_s: float, rate: int, channels: int,
                  codec: str, bitrate: int, max_drift_s: float, out_path: str) -> dict[str, Any]:
    """Sandbox task: the clip [start_s, end_s) of the first audio track (seconds on the video's clock
    as the analysis pass reported them, i.e. from the video's first frame)."""
    import av

    with open_container(spec) as container:
        if not container.streams.audio:
            return {"audio_status": "none", "reason": "the source has no audio track"}
        vs, aud = container.streams.video[0], container.streams.audio[0]
        v_start, v_end = _track_span(container, vs)
        a_start, a_end = _track_span(container, aud)
        if a_start is None:
            return {"audio_status": "broken", "reason": "the audio track has no timestamped packets"}
        drift = max(abs(a_start - (v_start or 0.0)), abs((a_end or 0.0) - (v_end or 0.0)))
        base = v_start or 0.0
        t0, t1 = base + start_s, base + end_s
        resampler = av.AudioResampler(format="flt", layout="mono" if channels == 1 else "stereo", rate=rate)
        chunks, first_time, errors = [], None, 0
        container.seek(max(0, int((t0 - 1.0) / float(aud.time_base))), stream=aud)
        for packet in container.demux(aud):
            try:
                decoded = packet.decode()
            except av.error.InvalidDataError:
                errors += 1
                continue
            for frame in decoded:
                if frame.pts is None:
                    continue
                t = frame.pts * float(frame.time_base)
                if t + frame.samples / frame.sample_rate <= t0:
                    continue
                if t >= t1:
                    break
                for out in resampler.resample(frame):
                    if first_time is None:
                        first_time = t
                    chunks.append(out.to_ndarray().reshape(-1, channels) if channels > 1 else out.to_ndarray().ravel())
            if packet.pts is not None and packet.pts * float(aud.time_base) >= t1:
                break
    if not chunks:
        return {"audio_status": "broken", "reason": f"no audio decoded in the clip span ({errors} packet errors)",
                "drift_s": round(drift, 4)}
    samples = np.concatenate(chunks)
    skip = max(0, int(round((t0 - first_time) * rate)))
    samples = samples[skip : skip + int(round((t1 - t0) * rate))]
    mono = samples if samples.ndim == 1 else samples.mean(axis=1)
    signals = audio_signals(mono.astype(np.float32), rate)
    _encode(samples, rate, channels, codec, bitrate, out_path)
    status, reason = "ok", None
    if drift > max_drift_s:
        status, reason = "unsynced", f"audio track is {drift * 1000:.0f} ms away from the video (bound {max_drift_s * 1000:.0f} ms)"
    elif signals["loudness_dbfs"] is not None and signals["loudness_dbfs"] < SILENT_TRACK_DBFS:
        status, reason = "silent", f"clip audio at {signals['loudness_dbfs']} dBFS"
    return {"audio_status": status, "reason": reason, "drift_s": round(drift, 4), "samples": int(len(samples)),
            "duration_s": round(len(samples) / rate, 4), "decode_errors": errors, "path": out_path, **signals}


def _encode(samples: np.ndarray, rate: int, channels: int, codec: str, bitrate: int, out_path: str) -> None:
    import av

    fmt = {"libopus": "ogg", "aac": "mp4", "flac": "flac"}.get(codec)
    # bitexact: no random Ogg stream serial, no encoder tag, so the same audio is the same bytes (and
    # the same content-addressed blob) in every run and on every worker
    with av.open(out_path, "w", format=fmt, options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono" if channels == 1 else "stereo")
        if codec != "flac":
            stream.bit_rate = bitrate
        size = stream.codec_context.frame_size or 960
        data = samples.reshape(-1, channels).astype(np.float32)
        pts = 0
        for start in range(0, len(data), size):
            chunk = np.ascontiguousarray(data[start : start + size].T if channels > 1 else data[start : start + size].reshape(1, -1))
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp" if channels > 1 else "flt",
                                               layout="mono" if channels == 1 else "stereo")
            frame.sample_rate, frame.pts = rate, pts
            pts += chunk.shape[-1]
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def read_audio(spec: Mapping[str, Any], rate: int, max_seconds: float = 600.0) -> dict[str, Any]:
    """Sandbox task: the first audio track of a file (a clip's kept audio) as mono float32 at ``rate``."""
    import av

    chunks: list[np.ndarray] = []
    total = 0
    with open_container(spec) as container:
        if not container.streams.audio:
            return {"samples": np.zeros(0, np.float32), "rate": rate}
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        for frame in container.decode(container.streams.audio[0]):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().ravel())
                total += chunks[-1].size
            if total >= max_seconds * rate:
                break
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().ravel())
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    return {"samples": samples[: int(max_seconds * rate)], "rate": rate}
