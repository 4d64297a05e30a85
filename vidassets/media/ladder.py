"""Resolution ladder for one clip from ONE decode: the clip's frames are decoded once (seek to the
keyframe before it, checked as every reader checks it, see ``clip_reader.ClipFrames``; decode forward,
stop after the last frame a rung shows, never decoding non-reference frames no rung shows), rotated upright, retimed to each rung's frame rate by picking the source frame shown
at each output tick, and scaled + encoded per rung on one thread per rung. Runs inside the sandbox
worker (it decodes untrusted input)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from vidassets.media.analysis import JPEG_RANGE, full_range, upright

MPEG_RANGE = 1
"""FFmpeg's AVCOL_RANGE_MPEG: limited-range (16-235) samples, what every rung's stream declares."""

VERSION = "ladder-v2"
"""v2: full-range sources (MJPEG, full-range H.264) are converted to the limited range the rung's stream
declares; v1 wrote their full-range samples into a limited-range stream (rungs ~9 levels off; other
sources are bit-identical)."""


def rung_yuv(reformatter, source, width: int, height: int):
    """A decoded frame scaled (swscale's area filter) to limited-range 4:2:0, what a rung's stream
    declares: full-range sources (``yuvj420p``, or flagged full range) are converted, not copied."""
    return reformatter.reformat(source, width, height, "yuv420p", interpolation="AREA",
                                src_color_range=JPEG_RANGE if full_range(source) else MPEG_RANGE,
                                dst_color_range=MPEG_RANGE)


def rung_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(w, h) with the short side ``short_side`` (never above the source), both even."""
    short = min(short_side, min(width, height))
    scale = short / min(width, height)
    w, h = width * scale, height * scale
    return max(2, int(round(w / 2)) * 2), max(2, int(round(h / 2)) * 2)


def output_ticks(frame_times: Sequence[float], first: int, last: int, fps: float) -> list[int]:
    """Source frame index shown at each output tick of a ``fps`` timeline starting at the clip's first
    frame (frames are dropped or repeated to retime; the clip's duration is kept)."""
    times = np.asarray(frame_times[first : last + 1], dtype=np.float64)
    step = float(np.median(np.diff(times))) if len(times) > 1 else 1.0 / fps
    duration = times[-1] - times[0] + step
    n_out = max(1, int(round(duration * fps)))
    ticks = times[0] + np.arange(n_out) / fps
    idx = np.searchsorted(times, ticks + 1e-6, side="right") - 1
    return [first + int(i) for i in np.clip(idx, 0, len(times) - 1)]


class _RungEncoder:
    """One rung's scaler + encoder on its own thread (PyAV and OpenCV release the GIL while they
    work), fed the shared decoded frames through a small queue. With one encoder thread each, the
    rungs of a clip encode in parallel at single-thread CPU cost."""

    def __init__(self, path: str, rung: Mapping[str, Any], width: int, height: int, codec: str, crf: int,
                 preset: str, threads: int) -> None:
        import queue
        import threading

        import av

        self.path, self.width, self.height = path, width, height
        self.written = 0
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._out = av.open(path, "w", options={"movflags": "+faststart"})
        rate = Fraction(rung["fps"]).limit_denominator(1001)
        self._stream = self._out.add_stream(codec, rate=rate)
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "yuv420p"
        self._stream.options = {"crf": str(crf), "preset": preset, **({"threads": str(threads)} if threads else {})}
        self._time_base = 1 / rate  # pts counts output frames of this rung
        self._thread = threading.Thread(target=self._run, name=f"rung-{rung['name']}", daemon=True)
        self._thread.start()

    def put(self, source, count: int) -> None:
        """``source``: a decoded ``av.VideoFrame`` (scaled by swscale) or an upright RGB array."""
        if self.error is None:
            self._queue.put((source, count))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        import av
        import cv2
        from av.video.reformatter import VideoReformatter

        reformatter = VideoReformatter()  # one swscale context per thread: never shared
        ended = False  # close() was seen: nothing more will come
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    ended = True
                    break
                source, count = item
                if isinstance(source, np.ndarray):
                    interp = cv2.INTER_AREA if self.width < source.shape[1] else cv2.INTER_CUBIC
                    scaled = cv2.resize(source, (self.width, self.height), interpolation=interp)
                    frame = reformatter.reformat(av.VideoFrame.from_ndarray(scaled, format="rgb24"), format="yuv420p")
                else:
                    frame = rung_yuv(reformatter, source, self.width, self.height)
                frame.time_base = self._time_base
                for _ in range(count):
                    frame.pts = self.written
                    self._out.mux(self._stream.encode(frame))
                    self.written += 1
            self._out.mux(self._stream.encode(None))
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.error = exc
            while not ended and self._queue.get() is not None:  # drain so the producer never blocks
                pass
        finally:
            self._out.close()


def ladder_clip(spec: Mapping[str, Any], frame_pts: Sequence[int], frame_times: Sequence[float], first_frame: int,
                last_frame: int, rotation: int, rungs: Sequence[Mapping[str, Any]], codec: str, crf: int,
                preset: str, crop: Sequence[int] | None, out_dir: str, threads: int = 1,
                nonref_pts: Sequence[int] = ()) -> dict[str, Any]:
    """Sandbox task. ``rungs``: [{name, short_side, fps}]. Writes one MP4 per rung into ``out_dir``;
    returns per rung its path, size, frame count and rate, plus how many frames were decoded.

    The clip is decoded once; every rung is scaled and encoded from those frames on its own thread
    (``threads`` encoder threads each; 0 = the encoder's choice). Packets of non-reference frames in
    ``nonref_pts`` (from the packet index) that no rung shows (the lead-in before the clip, frames
    dropped by retiming) are never decoded: nothing refers to them, so skipping them is exact."""
    from vidassets.media.clip_reader import ClipFrames, crop_and_resize

    plans = [output_ticks(frame_times, first_frame, last_frame, float(r["fps"])) for r in rungs]
    repeats = [np.bincount(np.asarray(p) - first_frame, minlength=last_frame - first_frame + 1) for p in plans]
    shown = [first_frame + int(j) for j in np.flatnonzero(np.sum(repeats, axis=0))]
    # the frames every rung shows, found as the analysis pass numbered them (a checked seek, pts matching)
    frames = ClipFrames(spec, frame_pts, shown, nonref_pts)
    encoders: list[_RungEncoder] = []
    direct = not rotation and not crop  # plain frames go to swscale as decoded
    try:
        for index, frame in frames:
            source = frame
            if not direct:
                source = crop_and_resize(upright(frame.to_ndarray(format="rgb24"), rotation), crop, None)
            if not encoders:
                src_w, src_h = (frame.width, frame.height) if direct else (source.shape[1], source.shape[0])
                for r in rungs:
                    w, h = rung_size(src_w, src_h, int(r["short_side"]))
                    encoders.append(_RungEncoder(os.path.join(out_dir, f"{r['name']}.mp4"), r, w, h, codec, crf,
                                                 preset, threads))
            for encoder, rep in zip(encoders, repeats, strict=True):
                count = int(rep[index - first_frame])
                if count:
                    encoder.put(source, count)
    finally:
        errors = []
        for encoder in encoders:
            try:
                encoder.close()
            except Exception as exc:  # noqa: BLE001 - close every encoder, then report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]
    if frames.missing:
        raise ValueError(f"{len(frames.missing)} of the clip's frames were not found in the source "
                         f"(first: {frames.missing[:5]})")
    result = []
    for r, encoder in zip(rungs, encoders, strict=True):
        result.append({"name": r["name"], "path": encoder.path, "width": encoder.width, "height": encoder.height,
                       "fps": float(r["fps"]), "frames": encoder.written, "bytes": os.path.getsize(encoder.path),
                       "duration_s": encoder.written / float(r["fps"])})
    return {"rungs": result, "frames_decoded": frames.decoded, "source_frames": last_frame - first_frame + 1}


def nearest_aspect(width: int, height: int, ratios: Sequence[str]) -> str:
    target = math.log(width / height)
    return min(ratios, key=lambda r: abs(math.log(int(r.split(":")[0]) / int(r.split(":")[1])) - target))


def center_crop(width: int, height: int, aspect: str) -> tuple[int, int, int, int]:
    """[x, y, w, h] of the largest centred window of ``aspect`` (e.g. "16:9") in a width x height frame."""
    aw, ah = (int(v) for v in aspect.split(":"))
    target = aw / ah
    if width / height > target:
        w = min(width, round(height * target))
        return (width - w) // 2, 0, w, height
    h = min(height, round(width / target))
    return 0, (height - h) // 2, width, h
