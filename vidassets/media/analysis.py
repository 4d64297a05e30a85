"""The one shared decode pass over a video. Runs inside the sandboxed worker.

Every frame is decoded once (frame threading; no NONREF skipping, because shot detection and
motion need every frame) and from that single pass come:

- shot boundaries as frame indices, from a PySceneDetect detector fed our own frames
  (``process_frame`` at analysis width, default 320 px, upright);
- per-frame signals for later scores: luma mean/median/p5/p95, dark and bright pixel shares,
  motion (mean absolute difference of consecutive blurred luma frames, 0–255 scale) and the
  detector's scene-change strength (content value);
- context frames sampled at a fixed rate (default 2 fps, short side 256, upright) as JPEG bytes,
  each with its PDQ perceptual hash.

Frame index i is the i-th frame in presentation order; its pts is returned so that readers can
seek to exactly that frame later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from vidassets.media.source import open_container

SIGNAL_NAMES = ("luma_mean", "luma_median", "luma_p5", "luma_p95", "dark_share", "bright_share", "motion", "scene_score")


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
    difference to the previous frame) is computed with one OpenCV absdiff + mean on the 3-channel
    image instead of three int32 numpy passes. Same numbers; about 3x cheaper. Falls back to the
    library's own scoring when edge weights or a stats manager are in use."""
    import cv2

    class FastScore(detector_class):
        _previous_hsv: np.ndarray | None = None

        def _calculate_frame_score(self, timecode, frame_img: np.ndarray) -> float:
            weights = self._weights
            if weights.delta_edges > 0.0 or self.stats_manager is not None:
                return super()._calculate_frame_score(timecode, frame_img)
            hsv = cv2.cvtColor(frame_img, cv2.COLOR_BGR2HSV)
            previous, self._previous_hsv = self._previous_hsv, hsv
            if previous is None:
                return 0.0
            # sum / n: cv2.mean on a 3-channel image costs ~8x a plain sum here
            d_hue, d_sat, d_lum, _ = (v / (hsv.shape[0] * hsv.shape[1]) for v in cv2.sumElems(cv2.absdiff(hsv, previous)))
            total = sum(abs(w) for w in weights)
            return (d_hue * weights.delta_hue + d_sat * weights.delta_sat + d_lum * weights.delta_lum) / total

    FastScore.__name__ = f"Fast{detector_class.__name__}"
    return FastScore


def make_detector(params: Mapping[str, Any]):
    from scenedetect import AdaptiveDetector, ContentDetector

    min_len = int(params.get("min_scene_len_frames", 15))
    if params.get("detector", "adaptive") == "content":
        return _with_fast_score(ContentDetector)(threshold=float(params.get("content_threshold", 27.0)), min_scene_len=min_len)
    return _with_fast_score(AdaptiveDetector)(
        adaptive_threshold=float(params.get("adaptive_threshold", 3.0)),
        min_content_val=float(params.get("min_content_val", 15.0)),
        min_scene_len=min_len,
    )


SMALL_FRAME_PIXELS = 640 * 360  # at or below this, decode single-threaded
_LEVELS = np.arange(256, dtype=np.float32)
_DARK_MAX = int(math.ceil(0.03 * 255)) - 1  # levels 0..7 are below 0.03
_BRIGHT_MIN = int(math.floor(0.97 * 255)) + 1  # levels 248..255 are above 0.97
_LIMITED_TO_FULL = np.clip((np.arange(256) - 16) * 255.0 / 219.0 + 0.5, 0, 255).astype(np.uint8)
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

        fmt = frame.format.name
        w, h = self.width, self.height
        if fmt in ("yuv420p", "yuvj420p") and w % 2 == 0 and h % 2 == 0 and self._u.size:
            cw, ch = (frame.width + 1) // 2, (frame.height + 1) // 2
            shrink(_plane(frame, 0, frame.width, frame.height), w, h, self._y)
            shrink(_plane(frame, 1, cw, ch), w // 2, h // 2, self._u)
            shrink(_plane(frame, 2, cw, ch), w // 2, h // 2, self._v)
            cv2.cvtColor(self._i420, cv2.COLOR_YUV2BGR_I420, dst=self._bgr)
            return self._bgr, self._y, fmt == "yuv420p"
        bgr = frame.to_ndarray(width=w, height=h, format="bgr24")
        return bgr, cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY), False


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


def analyze_source(spec: Mapping[str, Any], params: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """Decode once; return shots, per-frame signals, frame pts and context frames (JPEG + PDQ)."""
    import cv2
    import pdqhash
    from scenedetect.common import FrameTimecode

    rotation = int(facts.get("rotation") or 0)
    max_frames = int(facts.get("counted_frames") or 0) * 2 + 16  # a decode bomb cannot run away
    context_fps = float(params.get("context_fps", 2.0))
    jpeg_params = [int(cv2.IMWRITE_JPEG_QUALITY), int(params.get("jpeg_quality", 90))]
    pdq_side = int(params.get("pdq_short_side", 128))
    with open_container(spec) as container:
        vs = container.streams.video[0]
        cc = vs.codec_context
        if params.get("safe_mode"):
            cc.thread_count, cc.thread_type = 1, "SLICE"
        elif int(cc.width) * int(cc.height) <= SMALL_FRAME_PIXELS:
            cc.thread_count = 1  # frame threading costs more CPU than it saves on small frames (measured 15-20%)
        else:
            cc.thread_count, cc.thread_type = int(params.get("decode_threads", 2)), "FRAME"
        fps = float(vs.average_rate or vs.base_rate or facts.get("fps_avg") or 25.0)
        time_base = float(vs.time_base) if vs.time_base else 1.0 / fps
        aw, ah = analysis_size(int(cc.width), int(cc.height), rotation, int(params.get("width", 320)))
        cw, ch = context_size(int(cc.width), int(cc.height), int(params.get("context_short_side", 256)))
        if params.get("skip_nonref_deblocking", True) and not params.get("safe_mode") and \
                min(int(cc.width), int(cc.height)) >= 2 * min(cw, ch):
            # every frame handed on is shrunk at least 2x, which averages away what the in-loop
            # deblocking filter would have smoothed; skipping it on frames nothing references saves
            # 6-10% of an H.264 decode and cannot drift (measured: mean |diff| 0.02 levels at full size)
            cc.options = {**cc.options, "skip_loop_filter": "noref"}
        detector = make_detector(params)
        shrink_analysis, shrink_context = FrameShrinker(aw, ah), FrameShrinker(cw, ch)
        signals: list[tuple[float, ...]] = []
        pts_list: list[int] = []
        context: list[dict[str, Any]] = []
        cuts: list[int] = []
        errors: list[str] = []
        state = {"prev": None, "next_ctx": 0.0, "first_pts": None}

        def handle(frame) -> None:
            index = len(pts_list)
            pts = frame.pts if frame.pts is not None else (pts_list[-1] + 1 if pts_list else 0)
            if state["first_pts"] is None:
                state["first_pts"] = pts
            pts_list.append(int(pts))
            t = (pts - state["first_pts"]) * time_base
            bgr, luma, limited = shrink_analysis(frame)
            bgr, luma = upright(bgr, rotation), upright(luma, rotation)
            blurred = cv2.GaussianBlur(luma, (5, 5), 0)
            motion = float(cv2.mean(cv2.absdiff(blurred, state["prev"]))[0]) if state["prev"] is not None else 0.0
            if limited:
                motion *= LIMITED_RANGE_GAIN
            state["prev"] = blurred
            found = detector.process_frame(FrameTimecode(index, fps=fps), bgr)
            if found:
                cuts.extend(int(tc.frame_num) for tc in found)
            score = getattr(detector, "_frame_score", None)
            signals.append((*luma_stats(luma, limited), motion, float(score) if score is not None else 0.0))
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
        n = len(pts_list)
        if n:
            cuts.extend(int(tc.frame_num) for tc in detector.post_process(FrameTimecode(n - 1, fps=fps)))
    cuts = sorted({c for c in cuts if 0 < c < n})
    bounds = [0, *cuts, n]
    shots = [[bounds[i], bounds[i + 1] - 1] for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]
    return {
        "frames_decoded": n,
        "fps": fps,
        "time_base": time_base,
        "analysis_size": [int(aw), int(ah)],
        "frame_pts": np.asarray(pts_list, dtype=np.int64),
        "signals": np.asarray(signals, dtype=np.float32).reshape(n, len(SIGNAL_NAMES)),
        "cuts": cuts,
        "shots": shots,
        "context": context,
        "decode_errors": errors[:20],
        "decode_error_count": len(errors),
        "stopped": stopped,
    }
