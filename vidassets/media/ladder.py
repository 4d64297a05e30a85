"""Resolution ladder for one clip from ONE decode: the clip's frames are decoded once (seek to the
keyframe before it, decode forward, stop after its last frame), rotated upright, retimed to each
rung's frame rate by picking the source frame shown at each output tick, scaled and fed to one
encoder per rung. Runs inside the sandbox worker (it decodes untrusted input)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from vidassets.media.analysis import upright
from vidassets.media.source import open_container


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


def ladder_clip(spec: Mapping[str, Any], frame_pts: Sequence[int], frame_times: Sequence[float], first_frame: int,
                last_frame: int, rotation: int, rungs: Sequence[Mapping[str, Any]], codec: str, crf: int,
                preset: str, crop: Sequence[int] | None, out_dir: str, threads: int = 0) -> dict[str, Any]:
    """Sandbox task. ``rungs``: [{name, short_side, fps}]. Writes one MP4 per rung into ``out_dir``;
    returns per rung its path, size, frame count and rate, plus how many frames were decoded."""
    import av
    import cv2

    plans = [output_ticks(frame_times, first_frame, last_frame, float(r["fps"])) for r in rungs]
    repeats = [np.bincount(np.asarray(p) - first_frame, minlength=last_frame - first_frame + 1) for p in plans]
    wanted = {int(frame_pts[i]): i for i in range(first_frame, last_frame + 1)}
    first_pts, last_pts = int(frame_pts[first_frame]), int(frame_pts[last_frame])
    outputs, streams, written = [], [], [0] * len(rungs)
    tick_bases = [1 / Fraction(r["fps"]).limit_denominator(1001) for r in rungs]
    decoded = 0
    seen = set()
    try:
        with open_container(spec) as container:
            vs = container.streams.video[0]
            vs.codec_context.thread_type = "FRAME"
            if first_frame > 0:
                container.seek(first_pts, stream=vs, backward=True, any_frame=False)
            for frame in container.decode(vs):
                decoded += 1
                if frame.pts is None or frame.pts not in wanted:
                    if frame.pts is not None and frame.pts > last_pts:
                        break
                    continue
                index = wanted[frame.pts]
                seen.add(index)
                # upright / cropped frames go through numpy; plain ones are scaled by swscale directly
                direct = not rotation and not crop
                image = None
                if not direct:
                    image = upright(frame.to_ndarray(format="rgb24"), rotation)
                    if crop:
                        x, y, w, h = (int(v) for v in crop)
                        image = image[y : y + h, x : x + w]
                src_w, src_h = (frame.width, frame.height) if direct else (image.shape[1], image.shape[0])
                if not streams:
                    for r in rungs:
                        w, h = rung_size(src_w, src_h, int(r["short_side"]))
                        path = os.path.join(out_dir, f"{r['name']}.mp4")
                        out = av.open(path, "w", options={"movflags": "+faststart"})
                        stream = out.add_stream(codec, rate=Fraction(r["fps"]).limit_denominator(1001))
                        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
                        stream.options = {"crf": str(crf), "preset": preset,
                                          **({"threads": str(threads)} if threads else {})}
                        outputs.append((out, path))
                        streams.append(stream)
                for k, (stream, rep) in enumerate(zip(streams, repeats, strict=True)):
                    count = int(rep[index - first_frame])
                    if not count:
                        continue
                    if direct:
                        video_frame = frame.reformat(width=stream.width, height=stream.height, format="yuv420p",
                                                     interpolation="AREA")
                    else:
                        interp = cv2.INTER_AREA if stream.width < image.shape[1] else cv2.INTER_CUBIC
                        scaled = cv2.resize(image, (stream.width, stream.height), interpolation=interp)
                        video_frame = av.VideoFrame.from_ndarray(scaled, format="rgb24").reformat(format="yuv420p")
                    video_frame.time_base = tick_bases[k]  # pts counts output frames of this rung
                    for _ in range(count):
                        video_frame.pts = written[k]
                        outputs[k][0].mux(stream.encode(video_frame))
                        written[k] += 1
                if frame.pts >= last_pts:
                    break
    finally:
        for (out, _), stream in zip(outputs, streams, strict=True):
            out.mux(stream.encode(None))
            out.close()
    if len(seen) != len(wanted):
        raise ValueError(f"{len(wanted) - len(seen)} of the clip's frames were not found in the source")
    result = []
    for r, (_, path), stream, n in zip(rungs, outputs, streams, written, strict=True):
        result.append({"name": r["name"], "path": path, "width": stream.width, "height": stream.height,
                       "fps": float(r["fps"]), "frames": n, "bytes": os.path.getsize(path),
                       "duration_s": n / float(r["fps"])})
    return {"rungs": result, "frames_decoded": decoded, "source_frames": len(wanted)}


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
