"""Awkward and hostile test videos, generated with PyAV (and a few written byte by byte)."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidassets.demo.bucket import encode


def _frames(n: int, w: int, h: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
    for i in range(n):
        yield np.roll(base, i * 2, axis=1)


def vfr_mp4(path: Path, n: int = 60) -> list[float]:
    """H.264 in MP4 whose frame intervals alternate 20 ms / 60 ms; returns the frame times."""
    times, t = [], 0.0
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.options = {"preset": "ultrafast", "bf": "0"}
        for i, rgb in enumerate(_frames(n, 160, 120)):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            frame.pts = int(round(t * 1000))
            frame.time_base = Fraction(1, 1000)
            times.append(t)
            out.mux(stream.encode(frame))
            t += 0.02 if i % 2 == 0 else 0.06
        out.mux(stream.encode(None))
    return times


def make_awkward_files(root: Path, sample: Path) -> dict[str, Path]:
    """name -> path of every awkward case; ``sample`` is a real H.264 MP4 to derive from."""
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        files[name] = root / name
        files[name].write_bytes(data)

    put("empty.mp4", b"")
    put("random.mp4", os.urandom(20000))
    put("page.mp4", b"<!DOCTYPE html><html><body>404 not found</body></html>\n" * 20)
    put("playlist.mp4", f"ffconcat version 1.0\nfile '{sample}'\n".encode())
    files["fifo.mp4"] = root / "fifo.mp4"
    os.mkfifo(files["fifo.mp4"])
    for name, kwargs in {
        "one_frame.mp4": dict(n=1, codec="libx264", size=(160, 120)),
        "tiny_32x24.mp4": dict(n=30, codec="libx264", size=(32, 24)),
        "mpeg2.ts": dict(n=60, codec="mpeg2video", size=(320, 240), container_format="mpegts"),
        "vp9.webm": dict(n=60, codec="libvpx-vp9", size=(320, 240), options={"deadline": "realtime", "cpu-used": "8"}),
        "mjpeg.avi": dict(n=60, codec="mjpeg", size=(320, 240), pix_fmt="yuvj420p"),
        "hevc.mp4": dict(n=60, codec="libx265", size=(320, 240), options={"preset": "ultrafast", "x265-params": "log-level=error"}),
    }.items():
        n, codec, size = kwargs.pop("n"), kwargs.pop("codec"), kwargs.pop("size")
        files[name] = root / name
        encode(_frames(n, *size), files[name], codec, 25, **kwargs)
    files["vfr.mp4"] = root / "vfr.mp4"
    vfr_mp4(files["vfr.mp4"])
    whole = root / "_whole.mp4"
    encode(_frames(60, 160, 120), whole, "libx264", 25, options={"preset": "ultrafast"})
    data = whole.read_bytes()
    whole.unlink()
    put("truncated_index_at_end.mp4", data[: len(data) // 2])  # PyAV writes moov last: nothing to salvage
    return files


_CONTAINER_BOXES = {b"moov", b"trak", b"mdia", b"minf", b"dinf"}


def _rewrite_boxes(data: bytes, edit) -> bytes:
    """Rewrite an ISO-BMFF box tree: containers on the path to ``dref`` are rebuilt (sizes fixed),
    ``edit(payload)`` replaces each dref payload. Boxes after moov keep their offsets only when moov
    is last, which is how PyAV writes MP4 (no faststart)."""
    out, pos = b"", 0
    while pos + 8 <= len(data):
        size, kind = int.from_bytes(data[pos:pos + 4], "big"), data[pos + 4:pos + 8]
        size = size or len(data) - pos
        payload = data[pos + 8:pos + size]
        if kind in _CONTAINER_BOXES:
            payload = _rewrite_boxes(payload, edit)
        elif kind == b"dref":
            payload = edit(payload)
        out += (8 + len(payload)).to_bytes(4, "big") + kind + payload
        pos += size
    return out + data[pos:]


def mov_with_external_reference(source: Path, path: Path, url: str) -> None:
    """A copy of an MP4 whose video data reference points at ``url`` (an external 'url ' entry
    instead of the self-contained flag): a reader that followed it would fetch the URL."""
    data = source.read_bytes()
    moov = data.rfind(b"moov") - 4
    assert moov > data.find(b"mdat"), "moov must come after mdat"
    location = url.encode() + b"\0"
    entry = (12 + len(location)).to_bytes(4, "big") + b"url " + b"\0\0\0\0" + location  # flags 0: external
    rewritten = _rewrite_boxes(data[moov:], lambda payload: payload[:4] + (1).to_bytes(4, "big") + entry)
    path.write_bytes(data[:moov] + rewritten)


def speech_samples(text: str, rate: int = 16000) -> np.ndarray:
    """Speech from Debian's espeak-ng TTS, as mono float32 at ``rate``."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True)
        return read_audio_samples(wav, rate)


def read_audio_samples(path: Path, rate: int = 16000) -> np.ndarray:
    with av.open(str(path)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks = [f.to_ndarray().ravel() for frame in container.decode(audio=0) for f in resampler.resample(frame)]
    return np.concatenate(chunks).astype(np.float32)


def music_samples(seconds: float, rate: int = 16000) -> np.ndarray:
    """A synthetic tune: harmonic notes (C major arpeggio) of 0.5 s with a decaying envelope."""
    notes = [261.63, 329.63, 392.0, 523.25]
    t = np.arange(int(0.5 * rate)) / rate
    beats = []
    for i in range(int(seconds * 2)):
        f = notes[i % len(notes)]
        beats.append(sum(0.12 * np.sin(2 * np.pi * f * h * t) / h for h in (1, 2, 3)) * (0.6 + 0.4 * np.exp(-3 * t)))
    return np.concatenate(beats).astype(np.float32)


def video_with_audio(path: Path, frames: list[np.ndarray], audio: np.ndarray, rate: int = 16000,
                     fps: int = 25) -> Path:
    """H.264 + AAC in MP4: ``frames`` (RGB) and mono ``audio`` (float32 at ``rate``), both from t=0."""
    with av.open(str(path), "w") as out:
        vs = out.add_stream("libx264", rate=fps)
        vs.width, vs.height, vs.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        vs.options = {"preset": "ultrafast"}
        aus = out.add_stream("aac", rate=rate, layout="mono")
        for rgb in frames:
            out.mux(vs.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")))
        out.mux(vs.encode(None))
        size = aus.codec_context.frame_size or 1024
        pts = 0
        for start in range(0, len(audio), size):
            chunk = np.ascontiguousarray(audio[start:start + size].reshape(1, -1).astype(np.float32))
            frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
            frame.sample_rate, frame.pts = rate, pts
            pts += chunk.shape[1]
            out.mux(aus.encode(frame))
        out.mux(aus.encode(None))
    return path
