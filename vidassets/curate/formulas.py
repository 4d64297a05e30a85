"""Clip scores computed from saved per-frame signals and the packet index (no decode, no model).

Every score lies in [0, 1], higher = preferred by a recipe, and comes with its evidence (the raw
measurements it was computed from). Notation: G(x; a, b) = clip((x - a) / (b - a), 0, 1) is a
clipped-linear growth, L = 1 - G its decay, Q_p the p-th percentile over the clip's frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VERSIONS = {"optical": "optical-v1", "motion": "motion-v2", "static": "static-v2",
            "bitrate": "bitrate-per-pixel-v2"}
"""Producer version of each formula score (bump the one whose formula changes). motion-v2 and
static-v2 read the fixed time grid instead of source-rate frames; bitrate-v2 is rate-free (bits per
pixel per second, at the reference rate) where v1 was bits per pixel per frame."""


def grow(x: np.ndarray | float, a: float, b: float) -> np.ndarray | float:
    """G(x; a, b)."""
    return np.clip((np.asarray(x, dtype=np.float64) - a) / (b - a), 0.0, 1.0)


def decay(x: np.ndarray | float, a: float, b: float) -> np.ndarray | float:
    """L(x; a, b) = 1 - G(x; a, b)."""
    return 1.0 - grow(x, a, b)


def midtone(m: np.ndarray) -> np.ndarray:
    """T(m): 0 outside [0.05, 0.95], 1 on [0.2, 0.8], linear in between."""
    m = np.asarray(m, dtype=np.float64)
    return np.minimum(grow(m, 0.05, 0.2), decay(m, 0.8, 0.95))


def optical(median: np.ndarray, dark: np.ndarray, bright: np.ndarray, p5: np.ndarray, p95: np.ndarray) -> tuple[float, dict]:
    """Exposure e = T(m) L(d; .05, .5) L(b; .05, .5) and contrast c = G(I95 - I5; .05, .25) per
    frame; clip score = Q20(e) * Q20(c)."""
    exposure = midtone(median) * decay(dark, 0.05, 0.5) * decay(bright, 0.05, 0.5)
    contrast = grow(np.asarray(p95) - np.asarray(p5), 0.05, 0.25)
    q_e, q_c = float(np.percentile(exposure, 20)), float(np.percentile(contrast, 20))
    return q_e * q_c, {"exposure_q20": round(q_e, 6), "contrast_q20": round(q_c, 6),
                       "median_luma_mean": round(float(np.mean(median)), 6),
                       "dark_share_mean": round(float(np.mean(dark)), 6), "bright_share_mean": round(float(np.mean(bright)), 6)}


def grid_rows(signals: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time_s, grid_motion, grid_scene) of the clip's grid frames, from its slice of the per-frame
    signals table (the grid columns are NaN off the grid)."""
    on = ~np.isnan(np.asarray(signals["grid_motion"], dtype=np.float64))
    return tuple(np.asarray(signals[c], dtype=np.float64)[on] for c in ("time_s", "grid_motion", "grid_scene"))


def cut_steps(grid_scene: np.ndarray, threshold: float, ratio: float, reach: int = 2) -> np.ndarray:
    """Grid steps that look like a cut: scene-change strength at least ``threshold`` and at least
    ``ratio`` x the median of the up to ``reach`` steps on each side (a spike, not fast motion,
    whose strength stays high over neighbouring steps too)."""
    scene = np.asarray(grid_scene, dtype=np.float64)
    out = np.zeros(len(scene), bool)
    for i, value in enumerate(scene):
        if value < threshold:
            continue
        around = np.concatenate([scene[max(i - reach, 0) : i], scene[i + 1 : i + 1 + reach]])
        out[i] = not len(around) or value >= ratio * float(np.median(around))
    return out


def motion(grid_motion: np.ndarray, grid_scene: np.ndarray, cut_threshold: float, cut_ratio: float = 3.0,
           ) -> tuple[float, dict]:
    """On the fixed time grid (``analysis.signal_fps``): v = mean motion (0-255 scale) per grid step;
    r = share of grid steps that look like a cut (``cut_steps``);
    score = (1 - 2^(-max(v,0)/8)) L(r; 0, .05). Inputs are the clip's grid frames; the first is left
    out (its difference reaches back to the grid frame before the clip, in the previous shot), so
    the same footage scores the same at any source frame rate."""
    inner_motion = np.asarray(grid_motion[1:], dtype=np.float64)
    cuts = cut_steps(np.asarray(grid_scene[1:], dtype=np.float64), cut_threshold, cut_ratio)
    v = float(inner_motion.mean()) if len(inner_motion) else 0.0
    r = float(cuts.mean()) if len(cuts) else 0.0
    score = (1.0 - 2.0 ** (-max(v, 0.0) / 8.0)) * float(decay(r, 0.0, 0.05))
    return score, {"mean_motion": round(v, 6), "cut_step_share": round(r, 6), "cut_threshold": cut_threshold,
                   "cut_ratio": cut_ratio, "grid_steps": len(inner_motion)}


def static(grid_times: np.ndarray, grid_motion: np.ndarray, still_motion: float = 0.5,
           jump_motion: float = 8.0) -> tuple[float, dict]:
    """Near-static clips and slideshows (held frames with rare jumps), on the clip's grid frames
    (the first left out, as in ``motion``). A step is *held* when its motion is below
    ``still_motion``; a *jump* is motion above ``jump_motion``. Score = L(held share; 0.5, 0.95):
    1 for moving footage, 0 when 95% of steps are held."""
    times = np.asarray(grid_times, dtype=np.float64)
    inner = np.asarray(grid_motion[1:], dtype=np.float64)
    if len(inner) == 0:
        return 0.0, {"held_share": 1.0, "longest_still_s": 0.0, "jumps": 0, "is_static": True, "is_slideshow": False}
    held = inner < still_motion
    jumps = int((inner > jump_motion).sum())
    longest, start = 0.0, None
    for i, h in enumerate(held, start=1):  # step i spans times[i-1] .. times[i]
        start = (i - 1 if start is None else start) if h else None
        if start is not None:
            longest = max(longest, float(times[i] - times[start]))
    held_share = float(held.mean())
    is_static = held_share >= 0.95 and jumps == 0
    is_slideshow = held_share >= 0.8 and jumps >= 1
    return float(decay(held_share, 0.5, 0.95)), {
        "held_share": round(held_share, 6), "longest_still_s": round(longest, 4),
        "jumps": jumps, "is_static": bool(is_static), "is_slideshow": bool(is_slideshow),
    }


# Typical bits per pixel of watchable footage per codec; the score is relative to it, so a
# codec that needs fewer bits for the same quality is not penalised.
REFERENCE_BPP = {"h264": 0.10, "hevc": 0.06, "vp9": 0.06, "av1": 0.05, "mpeg4": 0.15, "mpeg2video": 0.25,
                 "mpeg1video": 0.3, "mjpeg": 1.0, "prores": 1.5, "vp8": 0.1}


REFERENCE_FPS = 30.0
"""The bit rate is compared at this frame rate: bits per pixel per second / 30 is bits per pixel per
frame for 30 fps footage, and the same footage at the same bits per second scores the same at 24,
30 or 60 fps (bits per frame would penalise 60 fps by 2.5x against 24 fps)."""


def bitrate_per_pixel(packet_sizes: np.ndarray, width: int, height: int, seconds: float,
                      codec: str) -> tuple[float, dict]:
    """bits / (w h seconds REFERENCE_FPS) over the clip's own packets (rate-free), normalised by
    the codec's reference: score = G(bpp / ref; 0.1, 0.5)."""
    if not seconds or seconds <= 0:
        raise ValueError(f"bitrate needs the clip's duration, got {seconds!r} s")
    bits = float(np.asarray(packet_sizes, dtype=np.float64).sum()) * 8
    bpp = bits / max(width * height * seconds * REFERENCE_FPS, 1)
    ref = REFERENCE_BPP.get(codec, 0.1)
    return float(grow(bpp / ref, 0.1, 0.5)), {"bits_per_pixel_at_30fps": round(bpp, 6),
                                               "bits_per_second": round(bits / seconds, 1), "codec": codec,
                                               "reference_bpp": ref}


def quantile(values: np.ndarray, p: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), p)) if len(values) else 0.0
