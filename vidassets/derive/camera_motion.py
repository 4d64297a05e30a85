"""Offline camera-motion annotator (rule-based, no weights): global motion between consecutive
context frames, then rules that map it to the camera-motion schema.

Per frame pair: corner tracks (Shi-Tomasi + pyramidal Lucas-Kanade) fitted with a RANSAC
similarity transform (translation, scale, rotation); phase correlation when too few corners track.
Rates are normalised by frame size and by the time between the frames. A single 2-D similarity
cannot tell a pan from a truck or a zoom from a dolly, so the translational axes it cannot separate
are answered ``unknown`` rather than guessed (``no-…`` when the camera does not move at all).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import cv2
import numpy as np

from vidassets.derive.labels import CAMERA_SINGLE


@dataclass(frozen=True)
class CameraRules:
    pan_rate: float = 0.02  # share of the frame width per second counted as a pan
    tilt_rate: float = 0.02
    zoom_rate: float = 0.02  # |log scale| per second
    roll_rate: float = 1.0  # degrees per second
    still_rate: float = 0.005  # below this on every axis the camera does not move
    jitter: tuple[float, float, float] = (0.003, 0.01, 0.03)  # no-shaking / minimal / unsteady bounds
    speed: tuple[float, float] = (0.05, 0.25)  # slow / regular bounds (share of frame per second)
    dynamics: tuple[float, float] = (0.02, 0.10)  # moving-pixel share after alignment: static / mostly-static
    freeze_diff: float = 0.3  # mean abs luma difference below which a pair is a frozen frame


@dataclass
class PairMotion:
    dt: float
    dx: float  # content translation, share of width per second (+: content moves right)
    dy: float  # share of height per second (+: content moves down)
    zoom: float  # log scale per second (+: content grows)
    roll: float  # degrees per second (+: content turns clockwise on screen)
    step_dx: float  # the same translation per pair, for jitter
    step_dy: float
    moving_share: float  # pixels still changing after aligning with the fitted motion
    diff: float  # mean abs luma difference before alignment
    method: str


def _gray(rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)


def estimate_pair(prev: np.ndarray, nxt: np.ndarray, dt: float) -> PairMotion:
    """Global motion from ``prev`` to ``nxt`` (grayscale images of one size)."""
    h, w = prev.shape
    matrix, method = None, "phase_correlation"
    corners = cv2.goodFeaturesToTrack(prev, maxCorners=400, qualityLevel=0.01, minDistance=6, blockSize=7)
    if corners is not None and len(corners) >= 12:
        tracked, status, _ = cv2.calcOpticalFlowPyrLK(prev, nxt, corners, None, winSize=(21, 21), maxLevel=4)
        good = status.ravel() == 1
        if good.sum() >= 12:
            matrix, inliers = cv2.estimateAffinePartial2D(corners[good], tracked[good], method=cv2.RANSAC,
                                                          ransacReprojThreshold=2.0, maxIters=2000, confidence=0.99)
            if matrix is not None and inliers is not None and inliers.sum() >= 8:
                method = "tracks"
            else:
                matrix = None
    if matrix is None:
        window = cv2.createHanningWindow((w, h), cv2.CV_32F)
        (sx, sy), _ = cv2.phaseCorrelate(prev.astype(np.float32), nxt.astype(np.float32), window)
        matrix = np.array([[1.0, 0.0, sx], [0.0, 1.0, sy]])
    a, b = matrix[0, 0], matrix[1, 0]
    scale = float(np.hypot(a, b)) or 1.0
    angle = float(np.degrees(np.arctan2(b, a)))
    center = np.array([w / 2.0, h / 2.0])
    moved = matrix[:, :2] @ center + matrix[:, 2] - center
    aligned = cv2.warpAffine(prev, matrix, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    margin = (slice(h // 8, h - h // 8), slice(w // 8, w - w // 8))  # borders hold warp fill, not content
    residual = cv2.absdiff(aligned, nxt)[margin]
    dt = max(dt, 1e-3)
    return PairMotion(dt=dt, dx=float(moved[0] / w / dt), dy=float(moved[1] / h / dt), zoom=float(np.log(scale) / dt),
                      roll=angle / dt, step_dx=float(moved[0] / w), step_dy=float(moved[1] / h),
                      moving_share=float((residual > 25).mean()),
                      diff=float(cv2.absdiff(prev, nxt).mean()), method=method)


class RuleBasedCameraMotion:
    """``__call__(times, frames) -> (camera record, evidence)``; frames are RGB uint8, one size."""

    def __init__(self, rules: CameraRules | None = None):
        self.rules = rules or CameraRules()
        digest = hashlib.sha256(json.dumps(asdict(self.rules), sort_keys=True).encode()).hexdigest()[:8]
        self.version = f"camera-rule-based-v1+{digest}+opencv=={cv2.__version__}"
        self.model_id = "rule-based:global-motion"

    def __call__(self, times: Sequence[float], frames: Sequence[np.ndarray]) -> tuple[dict, dict]:
        if len(frames) < 2:
            return unknown_camera(), {"pairs": 0, "reason": "fewer than two context frames"}
        grays = [_gray(f) for f in frames]
        pairs = [estimate_pair(grays[i], grays[i + 1], float(times[i + 1] - times[i])) for i in range(len(grays) - 1)]
        return self.classify(pairs), _evidence(pairs)

    def classify(self, pairs: list[PairMotion]) -> dict:
        r = self.rules
        dx = float(np.median([p.dx for p in pairs]))
        dy = float(np.median([p.dy for p in pairs]))
        zoom = float(np.median([p.zoom for p in pairs]))
        roll = float(np.median([p.roll for p in pairs]))
        jitter = float(np.hypot(np.std([p.step_dx for p in pairs]), np.std([p.step_dy for p in pairs])))
        moving = float(np.median([p.moving_share for p in pairs]))
        active = {
            "pan": abs(dx) >= r.pan_rate, "tilt": abs(dy) >= r.tilt_rate,
            "zoom": abs(zoom) >= r.zoom_rate, "roll": abs(roll) >= r.roll_rate,
        }
        magnitude = float(np.hypot(dx, dy) + abs(zoom))
        still = magnitude < r.still_rate and abs(roll) < r.roll_rate / 4 and jitter < r.jitter[0]
        n_active = sum(active.values())
        record = unknown_camera()
        # content moving right means the camera turned left; content growing means zooming in
        record["pan"] = ("pan-left" if dx > 0 else "pan-right") if active["pan"] else "no-pan"
        record["tilt"] = ("tilt-up" if dy > 0 else "tilt-down") if active["tilt"] else "no-tilt"
        record["zoom"] = ("zoom-in" if zoom > 0 else "zoom-out") if active["zoom"] else "no-zoom"
        record["roll"] = ("roll-CCW" if roll > 0 else "roll-CW") if active["roll"] else "no-roll"
        if still:
            record["motion_type"], record["steadiness"], record["speed"] = "no-motion", "static", "none"
            for name, labels in CAMERA_SINGLE.items():  # a camera that does not move does none of these
                if record[name] == "unknown" and labels[-1].startswith("no-"):
                    record[name] = labels[-1]
        else:
            record["motion_type"] = ("minor-motion" if n_active == 0 else
                                     "simple-motion" if n_active == 1 else "complex-motion")
            lo, mid, hi = r.jitter
            record["steadiness"] = ("no-shaking" if jitter < lo else "minimal-shaking" if jitter < mid else
                                    "unsteady" if jitter < hi else "very-unsteady")
            record["speed"] = "slow" if magnitude < r.speed[0] else "regular" if magnitude < r.speed[1] else "fast"
        frozen = sum(p.diff < r.freeze_diff for p in pairs)
        record["effects"] = ["frame-freezing"] if 0 < frozen < len(pairs) and not still else ["none"]
        record["scene_dynamics"] = ("static" if moving < r.dynamics[0] else
                                    "mostly-static" if moving < r.dynamics[1] else "dynamic")
        return record


def unknown_camera() -> dict:
    return {**{name: "unknown" for name in CAMERA_SINGLE}, "effects": ["unknown"]}


def _evidence(pairs: list[PairMotion]) -> dict:
    return {
        "pairs": len(pairs),
        "pan_rate": round(float(np.median([p.dx for p in pairs])), 5),
        "tilt_rate": round(float(np.median([p.dy for p in pairs])), 5),
        "zoom_rate": round(float(np.median([p.zoom for p in pairs])), 5),
        "roll_rate": round(float(np.median([p.roll for p in pairs])), 4),
        "jitter": round(float(np.hypot(np.std([p.step_dx for p in pairs]), np.std([p.step_dy for p in pairs]))), 5),
        "moving_share": round(float(np.median([p.moving_share for p in pairs])), 4),
        "methods": sorted({p.method for p in pairs}),
    }
