"""The one shared decode pass over a video. Runs inside the sandboxed worker.

Every frame is decoded once (frame threading; no NONREF skipping, because shot detection and
motion need every frame) and from that single pass come:

- shot boundaries as frame indices, from a PySceneDetect detector fed our own frames
  (``process_frame`` at analysis width, default 320 px, upright);
- per-frame signals for later scores: luma mean/median/p5/p95, dark and bright pixel shares,
  motion (mean absolute difference of consecutive blurred luma frames, 0–255 scale) and the
  detector's scene-change strength (content value);
- the same motion and scene-change strength on a fixed time grid (``signal_fps``, default 8 fps:
  the first frame at or after each grid time, differenced against the previous grid frame, motion
  scaled to one grid step), so scores built on them do not depend on the source frame rate;
- context frames sampled at a fixed rate (default 2 fps, short side 256, upright) as JPEG bytes,
  each with its PDQ perceptual hash.

Frame index i is the i-th frame in presentation order; its pts is returned so that readers can
seek to exactly that frame later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from vidassets.media.source import open_container

if TYPE_CHECKING:  # the settings load in the pass itself: the sandbox's other tasks do not pay for them
    from vidassets.config import AnalysisSettings

VERSION = "analysis-v4"
"""v2: reusable buffers, histogram remap, no deblocking on non-reference frames when every output is shrunk
2x. Computing the signals in batches left every output bit-identical (tested), so it stayed v2.
v3: motion and scene-change strength on a fixed time grid (``grid_motion``, ``grid_scene``).
v4: full-range frames (JPEG images, MJPEG) are converted as full range (v3 read them as 16-235: darker,
flatter context frames and colour signals)."""

SIGNAL_NAMES = ("luma_mean", "luma_median", "luma_p5", "luma_p95", "dark_share", "bright_share", "motion", "scene_score")
GRID_NAMES = ("grid_motion", "grid_scene")
"""Per-frame columns set on grid frames only (NaN elsewhere)."""


def _even(x: float) -> int:
    return max(2, int(round(x / 2)) * 2)


def analysis_size(width: int, height: int, rotation: int, target_width: int) -> tuple[int, int]:
    """Coded-orientation (w, h) to scale to so that the upright frame is ``target_width`` wide."""
    upright_w, upright_h = (height, width) if rotation in (90, 270) else (width, height)
    scale = min(1.0, target_width / upright_w)
    uw, uh = _even(upright_w * scale), _even(upright_h * scale)
    return (uh, uw) if rotation in (90, 270) else (uw, uh)


def context_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    scale = min(1.0, short_side / min(width, height))
    return _even(width * scale), _even(height * scale)


def upright(image: np.ndarray, rotation: int) -> np.ndarray:
    """Rotate a decoded (coded-orientation) image by the display rotation (clockwise degrees)."""
    k = (rotation // 90) % 4
    return np.ascontiguousarray(np.rot90(image, k=-k)) if k else image


def _with_fast_score(detector_class: type) -> type:
    """A PySceneDetect content detector whose per-frame score (the weighted mean absolute HSV
    difference to the previous frame) is computed by us, for a whole batch of frames at once
    (``FrameSignals``), and handed in through ``precomputed_score`` before ``process_frame``. Same
    numbers as the library's three int32 numpy passes. Without a precomputed score (or with edge
    weights / a stats manager, which need the image) it scores the frame itself."""

    class FastScore(detector_class):
        precomputed_score: float | None = None

        def _calculate_frame_score(self, timecode, frame_img: np.ndarray) -> float:
            score, self.precomputed_score = self.precomputed_score, None
            if score is None or self._weights.delta_edges > 0.0 or self.stats_manager is not None:
                return super()._calculate_frame_score(timecode, frame_img)
            return score

    FastScore.__name__ = f"Fast{detector_class.__name__}"
    return FastScore


MODEL_DETECTORS = ("transnetv2", "ensemble")
"""Detectors that read the TransNetV2 network's per-frame probabilities (computed by the caller from the
48x27 frames this pass returns: the network runs where the models run, batched, on the GPU when present)."""
SHOT_FRAME_SIZE = (48, 27)
"""(width, height) of the frames handed to the shot network (TransNetV2's input)."""


def make_detector(a: AnalysisSettings):
    """The PySceneDetect detector of the pass. It runs for every setting: its per-frame scene-change
    strength is a signal; its cuts are the shots for adaptive / content and one vote in the ensemble."""
    from scenedetect import AdaptiveDetector, ContentDetector

    if a.detector == "content":
        return _with_fast_score(ContentDetector)(threshold=a.content_threshold, min_scene_len=a.min_scene_len_frames)
    return _with_fast_score(AdaptiveDetector)(
        adaptive_threshold=a.adaptive_threshold, min_content_val=a.min_content_val,
        min_scene_len=a.min_scene_len_frames,
    )


SMALL_FRAME_PIXELS = 640 * 360  # at or below this, decode single-threaded
_LEVELS = np.arange(256, dtype=np.float32)
_DARK_MAX = int(math.ceil(0.03 * 255)) - 1  # levels 0..7 are below 0.03
_BRIGHT_MIN = int(math.floor(0.97 * 255)) + 1  # levels 248..255 are above 0.97
_LIMITED_TO_FULL = np.clip((np.arange(256) - 16) * 255.0 / 219.0 + 0.5, 0, 255).astype(np.uint8)
# for each full-range level j, the last coded 16-235 level whose full-range value is <= j (-1: none)
_FULL_TO_LAST_LIMITED = np.searchsorted(_LIMITED_TO_FULL, np.arange(256), side="right") - 1
_LEVELS64, _MAPPED_LEVELS = np.arange(256, dtype=np.float64), _LIMITED_TO_FULL.astype(np.float64)
LIMITED_RANGE_GAIN = 255.0 / 219.0  # a luma difference on the 16-235 scale, expressed on 0-255


class FrameShrinker:
    """Decoded frames -> (BGR, luma, luma_is_limited) at one fixed size, reusing its buffers.

    For 8-bit 4:2:0 frames the planes are read in place, box-filtered with OpenCV into one
    preallocated I420 buffer and converted with one ``cvtColor``; the luma is that buffer's Y plane as
    coded (16-235 for ``yuv420p``), so no per-frame range conversion is done: statistics map the
    histogram instead (exact) and differences are scaled by ``LIMITED_RANGE_GAIN``. Other formats
    take the generic swscale path. The returned arrays are overwritten by the next call.
    """

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        n = width * height
        self._i420 = np.empty((height * 3 // 2, width), np.uint8)
        flat = self._i420.reshape(-1)
        self._y = self._i420[:height]
        self._u = flat[n : n + n // 4].reshape(height // 2, width // 2)
        self._v = flat[n + n // 4 :].reshape(height // 2, width // 2)
        self._bgr = np.empty((height, width, 3), np.uint8)

    def __call__(self, frame) -> tuple[np.ndarray, np.ndarray, bool]:
        import cv2

        if self._u.size and shrink_i420(frame, self._y, self._u, self._v):
            cv2.cvtColor(self._i420, cv2.COLOR_YUV2BGR_I420, dst=self._bgr)
            return self._bgr, self._y, True
        bgr = frame.to_ndarray(width=self.width, height=self.height, format="bgr24")
        return bgr, cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY), False


class FrameSignals:
    """Per-frame signals and shot cuts, computed ``batch`` frames at a time.

    Each decoded frame is shrunk to analysis size straight into its slot of one stacked 4:2:0
    image (Y planes of all slots, then U, then V: itself a valid I420 image ``batch`` frames tall),
    so the colour conversions, frame differences and their per-frame sums run once per batch, and
    the luma statistics are computed for the whole batch in numpy (5-10% less CPU for the whole pass
    on the samples; what remains is per-pixel work). Values are the same as per-frame computation:
    every operation is per-pixel or per-frame (the blur runs per slot, so frames never bleed into
    each other).

    Signals are orientation-independent (histograms, mean absolute differences, a symmetric blur),
    so frames stay in coded orientation here; the detector's images are not upright either (its
    score is precomputed, see ``_with_fast_score``).
    """

    def __init__(self, width: int, height: int, detector, fps: float, batch: int = 16, grid_fps: float = 8.0,
                 shot_frame_size: tuple[int, int] | None = None) -> None:
        from scenedetect.common import FrameTimecode

        w, h, n = width, height, batch
        self.width, self.height, self.batch = w, h, n
        self.detector = detector
        self._rate = FrameTimecode(0, fps=float(fps))  # timecodes borrow its rate (no re-parsing)
        self._timecode = FrameTimecode
        weights = getattr(detector, "_weights", (1.0, 1.0, 1.0, 0.0))
        total = sum(abs(x) for x in weights) or 1.0
        self._hsv_weights = np.array(weights[:3], np.float64) / total
        pixels = n * w * h
        self._i420 = np.empty((n * h * 3 // 2, w), np.uint8)
        flat = self._i420.reshape(-1)
        self._y = self._i420[: n * h].reshape(n, h, w)
        self._u = flat[pixels : pixels + pixels // 4].reshape(n, h // 2, w // 2)
        self._v = flat[pixels + pixels // 4 :].reshape(n, h // 2, w // 2)
        self._bgr = np.empty((n * h, w, 3), np.uint8)
        # row block 0 of these holds the previous batch's last frame, so differences span batches
        self._hsv = np.empty(((n + 1) * h, w, 3), np.uint8)
        self._blurred = np.empty(((n + 1) * h, w), np.uint8)
        self._limited = np.zeros(n, bool)
        self._given_bgr: dict[int, np.ndarray] = {}  # slots whose frame was not 8-bit 4:2:0
        self._count = 0
        self.frames = 0  # frames whose signals are final
        self.cuts: list[int] = []
        self._signals: list[np.ndarray] = []
        self._fps = float(fps)
        self._times = np.zeros(n, np.float64)
        self._grid_step = 1.0 / grid_fps
        self._next_grid = 0.0
        self._grid_prev: tuple[float, np.ndarray, np.ndarray] | None = None  # time, blurred luma, HSV
        self.grid: list[tuple[int, float, float]] = []  # (frame index, motion per grid step, scene strength)
        self._shot_frame_size = shot_frame_size  # (w, h) in coded orientation, or None
        self._shot_frames: list[np.ndarray] = []

    def add(self, frame, time_s: float | None = None) -> None:
        """Shrink ``frame`` (shown at ``time_s`` from the first frame) into the next slot; a full batch
        is processed at once."""
        import cv2

        k = self._count
        self._times[k] = (self.frames + k) / self._fps if time_s is None else time_s
        self._limited[k] = shrink_i420(frame, self._y[k], self._u[k], self._v[k])
        if not self._limited[k]:
            # other layouts / depths / full range (JPEG, MJPEG, 10-bit, 4:4:4): swscale to BGR, luma from it
            bgr = frame.to_ndarray(width=self.width, height=self.height, format="bgr24")
            self._given_bgr[k] = bgr
            cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY, dst=self._y[k])
        self._count += 1
        if self._count == self.batch:
            self.flush()

    def flush(self) -> None:
        """Process the frames collected so far (call once more after the last frame)."""
        import cv2

        k, w, h = self._count, self.width, self.height
        if k == 0:
            return
        rows = k * h
        cv2.cvtColor(self._i420, cv2.COLOR_YUV2BGR_I420, dst=self._bgr)  # whole stack; slots past k unused
        for j, bgr in self._given_bgr.items():
            self._bgr[j * h : (j + 1) * h] = bgr
        self._given_bgr.clear()
        cv2.cvtColor(self._bgr[:rows], cv2.COLOR_BGR2HSV, dst=self._hsv[h : rows + h])
        for j in range(k):
            cv2.GaussianBlur(self._y[j], (5, 5), 0, dst=self._blurred[(j + 1) * h : (j + 2) * h])
        pixels = float(w * h)
        hsv_diff = cv2.absdiff(self._hsv[h : rows + h], self._hsv[:rows])
        blur_diff = cv2.absdiff(self._blurred[h : rows + h], self._blurred[:rows])
        # per-frame sums, one sumElems per slot: cv2.reduce to row sums is ~20x slower here
        hsv_sums = np.array([cv2.sumElems(hsv_diff[j * h : (j + 1) * h])[:3] for j in range(k)])
        motion = np.array([cv2.sumElems(blur_diff[j * h : (j + 1) * h])[0] for j in range(k)]) / pixels
        limited = self._limited[:k]
        motion[limited] *= LIMITED_RANGE_GAIN
        scores = hsv_sums @ self._hsv_weights / pixels
        if self.frames == 0:  # the first frame has nothing before it
            motion[0] = scores[0] = 0.0
        hist = np.stack([cv2.calcHist([self._y[j]], [0], None, [256], [0, 256]).ravel() for j in range(k)])
        scene = np.empty(k, np.float64)
        for j in range(k):
            self.detector.precomputed_score = float(scores[j])
            timecode = self._timecode(self.frames + j, fps=self._rate)
            found = self.detector.process_frame(timecode, self._bgr[j * h : (j + 1) * h])
            if found:
                self.cuts.extend(int(tc.frame_num) for tc in found)
            value = getattr(self.detector, "_frame_score", None)
            scene[j] = float(value) if value is not None else 0.0
        self._signals.append(np.column_stack([luma_stats_batch(hist, limited), motion, scene]).astype(np.float32))
        if self._shot_frame_size is not None:
            sw, sh = self._shot_frame_size
            small = np.empty((k, sh, sw, 3), np.uint8)
            for j in range(k):
                cv2.resize(self._bgr[j * h : (j + 1) * h], (sw, sh), dst=small[j], interpolation=cv2.INTER_AREA)
            self._shot_frames.append(small[..., ::-1])  # RGB
        for j in range(k):
            if self._times[j] + 1e-6 >= self._next_grid:
                self._grid_frame(j, bool(limited[j]))
        self._hsv[:h] = self._hsv[rows : rows + h]
        self._blurred[:h] = self._blurred[rows : rows + h]
        self.frames += k
        self._count = 0

    def _grid_frame(self, j: int, limited: bool) -> None:
        """Slot ``j`` is the first frame at or after the next grid time: difference it against the
        previous grid frame (motion scaled from the actual gap to one grid step)."""
        import cv2

        h, t = self.height, float(self._times[j])
        blurred = self._blurred[(j + 1) * h : (j + 2) * h]
        hsv = self._hsv[(j + 1) * h : (j + 2) * h]
        motion = scene = 0.0
        if self._grid_prev is not None:
            before, prev_blurred, prev_hsv = self._grid_prev
            pixels = float(self.width * h)
            motion = cv2.sumElems(cv2.absdiff(blurred, prev_blurred))[0] / pixels
            motion *= (LIMITED_RANGE_GAIN if limited else 1.0) * self._grid_step / max(t - before, 1e-6)
            scene = float(np.asarray(cv2.sumElems(cv2.absdiff(hsv, prev_hsv))[:3]) @ self._hsv_weights / pixels)
        self.grid.append((self.frames + j, motion, scene))
        self._grid_prev = (t, blurred.copy(), hsv.copy())
        self._next_grid += self._grid_step
        while self._next_grid <= t:
            self._next_grid += self._grid_step

    def shot_frames(self) -> np.ndarray | None:
        """Every frame at the shot network's size, RGB, coded orientation (None when not asked for)."""
        if self._shot_frame_size is None:
            return None
        sw, sh = self._shot_frame_size
        return np.ascontiguousarray(np.concatenate(self._shot_frames)) if self._shot_frames else np.zeros((0, sh, sw, 3), np.uint8)

    def signals(self) -> np.ndarray:
        """Per-frame signals: the ``SIGNAL_NAMES`` columns, then ``GRID_NAMES`` (NaN off the grid)."""
        per_frame = np.concatenate(self._signals) if self._signals else np.zeros((0, len(SIGNAL_NAMES)), np.float32)
        grid = np.full((len(per_frame), len(GRID_NAMES)), np.nan, np.float32)
        for index, motion, scene in self.grid:
            grid[index] = (motion, scene)
        return np.column_stack([per_frame, grid]).astype(np.float32)


def shots_of(cuts: list[int], n: int) -> list[list[int]]:
    """[first, last] frame of each shot of an ``n``-frame video cut before each frame in ``cuts``."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < n}), n]
    return [[bounds[i], bounds[i + 1] - 1] for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]


def network_cuts(probabilities: np.ndarray, threshold: float, merge_frames: int = 3) -> list[int]:
    """Cuts (first frame of a new shot) from per-frame shot-end probabilities: one per run of frames at
    or above ``threshold``, after the run's most probable frame (a dissolve's frames form one run).
    Runs whose cuts lie within ``merge_frames`` of each other are one transition, cut at the later
    (a flash right before a cut raises the flash onset too)."""
    above = np.asarray(probabilities) >= threshold
    cuts: list[int] = []
    i, n = 0, len(above)
    while i < n:
        if above[i]:
            j = i
            while j + 1 < n and above[j + 1]:
                j += 1
            cut = i + int(np.argmax(probabilities[i : j + 1])) + 1
            if cuts and cut - cuts[-1] <= merge_frames:
                cuts[-1] = cut
            else:
                cuts.append(cut)
            i = j + 1
        else:
            i += 1
    return [c for c in cuts if c < n]


ENSEMBLE_SNAP_FRAMES = 3
"""A PySceneDetect cut within this many frames of a network cut is the same transition (the network
places it: PySceneDetect fires on the first changed frame, which a flash before a cut moves)."""
FLASH_RISE, FLASH_RETURN, FLASH_FRAMES = 0.10, 0.05, 3
"""A flash: mean luma (0-1) rises by ``FLASH_RISE`` from one frame to the next and comes back within
``FLASH_RETURN`` of where it was inside ``FLASH_FRAMES`` frames. PySceneDetect cuts there; the ensemble does not."""


def is_flash(luma: np.ndarray, cut: int) -> bool:
    """Whether a brightness spike that returns starts at ``cut`` or the frame before it."""
    n = len(luma)
    for f in (cut - 1, cut):
        if 1 <= f < n and luma[f] - luma[f - 1] >= FLASH_RISE:
            if any(abs(luma[g] - luma[f - 1]) <= FLASH_RETURN for g in range(f + 1, min(f + 1 + FLASH_FRAMES, n))):
                return True
    return False


def final_cuts(a: AnalysisSettings, scenedetect_cuts: list[int], probabilities: np.ndarray | None,
               luma: np.ndarray) -> list[int]:
    """The shot cuts of the configured detector over a video whose per-frame mean luma is ``luma``:
    PySceneDetect's, the network's (``transnet_threshold``), or the ensemble: the network's cuts plus
    each PySceneDetect cut that is neither near one of them nor a flash. The network finds cuts with
    the colour statistics unchanged (one palette) and ignores flashes; PySceneDetect finds the jump
    cuts inside one scene the network was trained to pass over (docs/stages.md compares the detectors)."""
    n = len(luma)
    if a.detector not in MODEL_DETECTORS:
        return scenedetect_cuts
    if probabilities is None or len(probabilities) != n:
        raise ValueError(f"analysis.detector {a.detector} needs one shot probability per frame")
    network = network_cuts(probabilities, a.transnet_threshold)
    cuts = set(network)
    if a.detector == "ensemble":
        cuts |= {c for c in scenedetect_cuts
                 if not any(abs(c - x) <= ENSEMBLE_SNAP_FRAMES for x in network) and not is_flash(luma, c)}
    return sorted(x for x in cuts if 0 < x < n)


JPEG_RANGE = 2
"""FFmpeg's AVCOL_RANGE_JPEG: full-range (0-255) samples."""


def full_range(frame) -> bool:
    """Whether a decoded frame's samples are full range (``yuvj*`` formats, or flagged so)."""
    return frame.color_range == JPEG_RANGE or frame.format.name.startswith("yuvj")


def shrink_i420(frame, y: np.ndarray, u: np.ndarray, v: np.ndarray) -> bool:
    """Shrink a limited-range (16-235) 8-bit 4:2:0 frame's planes into ``y``, ``u``, ``v`` (the
    target sizes); False, with nothing written, for any other pixel format or a full-range frame
    (``yuvj420p``: JPEG, MJPEG; OpenCV's I420 conversion assumes limited range)."""
    if frame.format.name != "yuv420p" or full_range(frame):
        return False
    cw, ch = (frame.width + 1) // 2, (frame.height + 1) // 2
    shrink(_plane(frame, 0, frame.width, frame.height), y.shape[1], y.shape[0], y)
    shrink(_plane(frame, 1, cw, ch), u.shape[1], u.shape[0], u)
    shrink(_plane(frame, 2, cw, ch), v.shape[1], v.shape[0], v)
    return True


def shrink(image: np.ndarray, width: int, height: int, out: np.ndarray | None = None) -> np.ndarray:
    """Box-filtered downscale: exact 2x halvings (bilinear at a factor of 2 averages 2x2 blocks),
    then one bilinear resize for the remaining factor (< 2, where bilinear barely aliases; OpenCV's
    area filter costs 3-4x more at fractional factors). ~10x cheaper than one INTER_AREA resize. With
    ``out`` the result is written there (a C-contiguous ``height`` x ``width`` array)."""
    import cv2

    while image.shape[1] >= 2 * width and image.shape[0] >= 2 * height:
        half = (image.shape[1] // 2, image.shape[0] // 2)
        last = half == (width, height) and out is not None
        image = cv2.resize(image, half, dst=out if last else None, interpolation=cv2.INTER_LINEAR)
    if (image.shape[1], image.shape[0]) != (width, height):
        image = cv2.resize(image, (width, height), dst=out, interpolation=cv2.INTER_LINEAR)
    elif out is not None and image is not out:
        out[...] = image
    return out if out is not None else image


def _plane(frame, index: int, width: int, height: int) -> np.ndarray:
    plane = frame.planes[index]
    return np.frombuffer(plane, np.uint8).reshape(height, plane.line_size)[:, :width]


def luma_histogram(luma: np.ndarray, limited: bool = False) -> np.ndarray:
    """256-bin histogram of full-range luma; a 16-235 plane's histogram is remapped (exactly the
    histogram of the range-converted plane, without converting the pixels)."""
    import cv2

    hist = cv2.calcHist([luma], [0], None, [256], [0, 256]).ravel()
    return np.bincount(_LIMITED_TO_FULL, weights=hist, minlength=256) if limited else hist


def luma_stats(gray: np.ndarray, limited: bool = False) -> tuple[float, float, float, float, float, float]:
    """mean, median, p5, p95 (all 0–1) and the shares of pixels below 0.03 / above 0.97."""
    hist = luma_histogram(gray, limited)
    cdf = np.cumsum(hist)
    total = float(cdf[-1])
    p5, p50, p95 = np.searchsorted(cdf, (0.05 * total, 0.5 * total, 0.95 * total))
    return (
        float(hist @ _LEVELS) / total / 255.0,
        float(p50) / 255.0,
        float(p5) / 255.0,
        float(p95) / 255.0,
        float(cdf[_DARK_MAX]) / total,
        float(total - cdf[_BRIGHT_MIN - 1]) / total,
    )


def luma_stats_batch(hist: np.ndarray, limited: np.ndarray) -> np.ndarray:
    """``luma_stats`` for a (frames, 256) stack of luma histograms -> (frames, 6). Rows where
    ``limited`` is set count 16-235 levels; they are read through the full-range map: the level
    sum uses the mapped levels, and since the map is monotonic the full-range cumulative histogram
    at level j is the raw one at the last raw level mapping to <= j (exact, no pixel converted)."""
    hist = hist.astype(np.float64)
    raw_cdf = np.zeros((hist.shape[0], 257))  # column 0: nothing counted yet
    np.cumsum(hist, axis=1, out=raw_cdf[:, 1:])
    cdf = np.where(limited[:, None], raw_cdf[:, _FULL_TO_LAST_LIMITED + 1], raw_cdf[:, 1:])
    total = raw_cdf[:, -1]
    level_sum = np.where(limited, hist @ _MAPPED_LEVELS, hist @ _LEVELS64)
    p5, p50, p95 = ((cdf < q * total[:, None]).sum(axis=1) for q in (0.05, 0.5, 0.95))
    return np.column_stack([
        level_sum / total / 255.0, p50 / 255.0, p5 / 255.0, p95 / 255.0,
        cdf[:, _DARK_MAX] / total, (total - cdf[:, _BRIGHT_MIN - 1]) / total,
    ])


def analyze_source(spec: Mapping[str, Any], params: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """Decode once; return shots, per-frame signals, frame pts and context frames (JPEG + PDQ).
    ``params``: ``analysis`` settings (keys left out take the settings' defaults) and ``safe_mode``
    (single-threaded, bit-exact decode: the retry path)."""
    import cv2
    import pdqhash
    from scenedetect.common import FrameTimecode

    from vidassets.config import AnalysisSettings

    safe_mode = bool(params.get("safe_mode"))
    a = AnalysisSettings.model_validate({k: v for k, v in params.items() if k != "safe_mode"})
    rotation = int(facts.get("rotation") or 0)
    max_frames = int(facts.get("counted_frames") or 0) * 2 + 16  # a decode bomb cannot run away
    context_fps = a.context_fps
    jpeg_params = [int(cv2.IMWRITE_JPEG_QUALITY), a.jpeg_quality]
    pdq_side = a.pdq_short_side
    with open_container(spec) as container:
        vs = container.streams.video[0]
        cc = vs.codec_context
        if safe_mode:
            cc.thread_count, cc.thread_type = 1, "SLICE"
        elif int(cc.width) * int(cc.height) <= SMALL_FRAME_PIXELS:
            cc.thread_count = 1  # frame threading costs more CPU than it saves on small frames (measured 15-20%)
        else:
            cc.thread_count, cc.thread_type = a.decode_threads, "FRAME"
        fps = float(vs.average_rate or vs.base_rate or facts.get("fps_avg") or 25.0)
        time_base = float(vs.time_base) if vs.time_base else 1.0 / fps
        aw, ah = analysis_size(int(cc.width), int(cc.height), rotation, a.width)
        cw, ch = context_size(int(cc.width), int(cc.height), a.context_short_side)
        if a.skip_nonref_deblocking and not safe_mode and \
                min(int(cc.width), int(cc.height)) >= 2 * min(cw, ch):
            # every frame handed on is shrunk at least 2x, which averages away what the in-loop
            # deblocking filter would have smoothed; skipping it on frames nothing references saves
            # 6-10% of an H.264 decode and cannot drift (measured: mean |diff| 0.02 levels at full size)
            cc.options = {**cc.options, "skip_loop_filter": "noref"}
        detector = make_detector(a)
        shot_size = None
        if a.detector in MODEL_DETECTORS:  # the network reads upright frames: shrink to the rotated size
            shot_size = SHOT_FRAME_SIZE[::-1] if rotation in (90, 270) else SHOT_FRAME_SIZE
        analysis = FrameSignals(aw, ah, detector, fps, batch=a.batch_frames, grid_fps=a.signal_fps,
                                shot_frame_size=shot_size)
        shrink_context = FrameShrinker(cw, ch)
        pts_list: list[int] = []
        context: list[dict[str, Any]] = []
        errors: list[str] = []
        state = {"next_ctx": 0.0, "first_pts": None}

        def handle(frame) -> None:
            index = len(pts_list)
            pts = frame.pts if frame.pts is not None else (pts_list[-1] + 1 if pts_list else 0)
            if state["first_pts"] is None:
                state["first_pts"] = pts
            pts_list.append(int(pts))
            t = (pts - state["first_pts"]) * time_base
            analysis.add(frame, t)
            if t + 1e-6 >= state["next_ctx"]:
                ctx_bgr = upright(shrink_context(frame)[0], rotation)
                rgb = cv2.cvtColor(ctx_bgr, cv2.COLOR_BGR2RGB)
                ok, jpeg = cv2.imencode(".jpg", ctx_bgr, jpeg_params)
                small = min(rgb.shape[:2]) > pdq_side
                pdq_input = shrink(rgb, *context_size(rgb.shape[1], rgb.shape[0], pdq_side)) if small else rgb
                hash_bits, quality = pdqhash.compute(pdq_input)
                context.append({
                    "frame_index": index, "time_s": round(t, 6), "jpeg": jpeg.tobytes() if ok else b"",
                    "pdq": np.packbits(hash_bits.astype(np.uint8)).tobytes().hex(), "pdq_quality": int(quality),
                    "width": int(rgb.shape[1]), "height": int(rgb.shape[0]),
                })
                state["next_ctx"] += 1.0 / context_fps
                while state["next_ctx"] <= t:
                    state["next_ctx"] += 1.0 / context_fps

        stopped = None
        try:
            for packet in container.demux(vs):
                try:
                    frames = packet.decode()
                except Exception as exc:  # noqa: BLE001 - skip a corrupt packet, keep going
                    errors.append(f"{exc.__class__.__name__}: {str(exc)[:120]}")
                    continue
                for frame in frames:
                    handle(frame)
                if len(pts_list) >= max_frames:
                    stopped = f"stopped after {max_frames} frames (probe counted {facts.get('counted_frames')})"
                    break
        except Exception as exc:  # noqa: BLE001 - demux failed mid-file: flush what the decoder holds
            errors.append(f"demux: {exc.__class__.__name__}: {str(exc)[:120]}")
            try:
                for frame in cc.decode(None):
                    handle(frame)
            except Exception as flush_exc:  # noqa: BLE001
                errors.append(f"flush: {flush_exc.__class__.__name__}")
        analysis.flush()
        n = len(pts_list)
        cuts = list(analysis.cuts)
        if n:
            cuts.extend(int(tc.frame_num) for tc in detector.post_process(FrameTimecode(n - 1, fps=fps)))
    cuts = sorted({c for c in cuts if 0 < c < n})
    shot_frames = analysis.shot_frames()
    if shot_frames is not None and rotation % 360:
        shot_frames = np.ascontiguousarray(np.rot90(shot_frames, k=-((rotation // 90) % 4), axes=(1, 2)))
    return {
        "frames_decoded": n,
        "fps": fps,
        "time_base": time_base,
        "analysis_size": [int(aw), int(ah)],
        "frame_pts": np.asarray(pts_list, dtype=np.int64),
        "signals": analysis.signals(),
        "cuts": cuts,
        "shots": shots_of(cuts, n),
        "shot_frames": shot_frames,
        "context": context,
        "decode_errors": errors[:20],
        "decode_error_count": len(errors),
        "stopped": stopped,
    }
