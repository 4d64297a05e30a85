"""Cut shots into training windows. A clip is (asset_id, first_frame, last_frame), inclusive frame
indices in presentation order; nothing is re-encoded to define it."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

VERSION = "segmentation-v1"


def clip_id(asset_id: str, first_frame: int, last_frame: int, segmentation_version: str) -> str:
    key = f"{asset_id}:{first_frame}:{last_frame}:{segmentation_version}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def cut_windows(
    shots: Sequence[Sequence[int]],
    frame_times: Sequence[float],
    min_seconds: float,
    max_seconds: float,
    trim_frames: int = 0,
) -> list[tuple[int, int, int]]:
    """(first_frame, last_frame, shot_index) windows: each shot trimmed by ``trim_frames`` next to
    each cut, split evenly into the fewest windows no longer than ``max_seconds``, windows shorter
    than ``min_seconds`` dropped. Durations use frame times, so VFR footage is measured right."""
    n = len(frame_times)
    if n == 0:
        return []
    step = _frame_step(frame_times)
    windows: list[tuple[int, int, int]] = []
    for shot_index, (first, last) in enumerate(shots):
        if shot_index > 0:
            first += trim_frames
        if shot_index < len(shots) - 1:
            last -= trim_frames
        if last < first:
            continue
        duration = _span(frame_times, first, last, step)
        if duration + 1e-9 < min_seconds:
            continue
        parts = max(1, math.ceil(duration / max_seconds - 1e-9))
        count = last - first + 1
        bounds = [first + round(i * count / parts) for i in range(parts + 1)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b - 1 >= a and _span(frame_times, a, b - 1, step) + 1e-9 >= min_seconds:
                windows.append((a, b - 1, shot_index))
    return windows


def _frame_step(frame_times: Sequence[float]) -> float:
    if len(frame_times) < 2:
        return 0.0
    return (frame_times[-1] - frame_times[0]) / (len(frame_times) - 1)


def _span(frame_times: Sequence[float], first: int, last: int, step: float) -> float:
    """Seconds from the start of ``first`` to the end of ``last``."""
    end = frame_times[last + 1] if last + 1 < len(frame_times) else frame_times[last] + step
    return float(end - frame_times[first])


def clip_rows(
    asset_id: str,
    shots: Sequence[Sequence[int]],
    frame_times: Sequence[float],
    params: Mapping[str, Any],
    segmentation_version: str,
) -> list[dict[str, Any]]:
    step = _frame_step(frame_times)
    rows = []
    for first, last, shot in cut_windows(shots, frame_times, params["min_seconds"], params["max_seconds"], params["trim_frames"]):
        rows.append({
            "clip_id": clip_id(asset_id, first, last, segmentation_version),
            "asset_id": asset_id,
            "shot_index": shot,
            "first_frame": first,
            "last_frame": last,
            "num_frames": last - first + 1,
            "start_s": round(float(frame_times[first]), 6),
            "end_s": round(float(frame_times[first]) + _span(frame_times, first, last, step), 6),
        })
    return rows


def image_clip(asset_id: str, shots: Sequence[Sequence[int]], frame_times: Sequence[float],
               params: Mapping[str, Any], segmentation_version: str) -> list[dict[str, Any]]:
    """A still image is one 1-frame clip (no duration bounds apply: an image has no duration)."""
    if not len(frame_times):
        return []
    return [{"clip_id": clip_id(asset_id, 0, 0, segmentation_version), "asset_id": asset_id, "shot_index": 0,
             "first_frame": 0, "last_frame": 0, "num_frames": 1, "start_s": 0.0, "end_s": 0.0}]
