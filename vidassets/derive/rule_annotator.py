"""Offline captions and tags composed from measured signals (rule-based; no weights, no model).

It describes only what was measured (camera motion, brightness, colour, motion amount, faces,
on-screen text, quality, duration, frame size) and answers ``unknown`` where a measurement cannot
tell (domain, scene, most subjects and actions). Its version string says ``rule-based`` so nobody
mistakes its captions for a captioning model's; a VLM backend replaces it through configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from vidassets.derive.labels import CAPTION_WORDS, word_count

_HUES = ((10, "red"), (25, "orange"), (35, "yellow"), (85, "green"), (100, "cyan"), (130, "blue"),
         (150, "purple"), (170, "magenta"), (180, "red"))


@dataclass
class FrameLook:
    time_s: float
    brightness: float  # mean V, 0-255
    saturation: float  # mean S, 0-255
    hue: str
    sharpness: float


@dataclass
class ClipFacts:
    """What the rule-based annotator knows about one clip."""

    duration_s: float
    fps: float
    width: int
    height: int
    scores: Mapping[str, float | None] = field(default_factory=dict)
    evidence: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    camera: Mapping[str, Any] = field(default_factory=dict)
    looks: list[FrameLook] = field(default_factory=list)
    still: bool = False
    """A still image (one frame): no duration, frame rate or camera to describe."""


def frame_looks(times: Sequence[float], frames: Sequence[np.ndarray]) -> list[FrameLook]:
    looks = []
    for t, rgb in zip(times, frames, strict=True):
        hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
        h, s, v = hsv[..., 0].ravel(), hsv[..., 1].ravel().astype(np.float64), hsv[..., 2].ravel()
        weights = s * (v > 40)
        hist = np.bincount(h, weights=weights, minlength=180)
        peak = int(np.argmax(hist)) if weights.sum() > 0 else 0
        hue = next(name for bound, name in _HUES if peak < bound)
        gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
        looks.append(FrameLook(float(t), float(v.mean()), float(s.mean()), hue,
                               float(cv2.Laplacian(gray, cv2.CV_64F).var())))
    return looks


def _light(b: float) -> str:
    return "very dark" if b < 50 else "dim" if b < 100 else "evenly lit" if b < 170 else "bright"


def _colour(look: FrameLook) -> str:
    if look.saturation < 25:
        return "nearly colourless"
    return f"{'vivid' if look.saturation > 110 else 'muted'} {look.hue}"


_CAMERA_WORDS = {
    "pan-left": "pans left", "pan-right": "pans right", "tilt-up": "tilts up", "tilt-down": "tilts down",
    "zoom-in": "zooms in", "zoom-out": "zooms out", "roll-CW": "rolls clockwise", "roll-CCW": "rolls counter-clockwise",
}


def camera_phrase(camera: Mapping[str, Any]) -> str:
    moves = [_CAMERA_WORDS[camera.get(k)] for k in ("pan", "tilt", "zoom", "roll") if camera.get(k) in _CAMERA_WORDS]
    if camera.get("motion_type") == "no-motion":
        return "a static camera"
    if not moves:
        return "a camera with slight movement" if camera.get("motion_type") == "minor-motion" else "a moving camera"
    speed = camera.get("speed")
    adverb = {"slow": "slowly ", "fast": "quickly "}.get(speed, "")
    return f"a camera that {adverb}{' and '.join(moves)}"


_STEADY = {"static": "The camera is fixed.", "no-shaking": "The camera moves smoothly, without shake.",
           "minimal-shaking": "The camera shakes a little.", "unsteady": "The camera is unsteady.",
           "very-unsteady": "The camera shakes strongly."}


class RuleBasedAnnotator:
    """``tags(facts)`` and ``captions(facts)`` from measurements only. Tags use only the labels of
    ``TAG_SINGLE`` / ``TAG_MULTI`` (the design's Table 5) and say ``unknown`` wherever a
    measurement cannot tell the label."""

    version_tags = "tags-rule-based-v2"
    version_captions = "captions-rule-based-v1"
    model_id = "rule-based:signals"

    def tags(self, facts: ClipFacts) -> dict[str, Any]:
        """Faces make ``person`` a subject; text covering over a tenth of the frame makes ``text`` one
        (salient) and a little text is ``incidental`` (its role beyond that is not measured); a still
        scene from a still camera has no action, a moving camera over a still scene is
        ``camera_motion_only``. Domain, scene, style and watermark are not measured."""
        faces, text_share = _faces(facts), _text_share(facts)
        subjects = (["person"] if faces else []) + (["text"] if text_share is not None and text_share > 0.1 else [])
        motion = facts.scores.get("static")
        scene_still = motion is not None and motion < 0.2 and facts.camera.get("scene_dynamics") == "static"
        camera = facts.camera.get("motion_type")
        actions = (["none"] if scene_still and camera == "no-motion" else
                   ["camera_motion_only"] if scene_still and camera in ("simple-motion", "complex-motion") else ["unknown"])
        text = ("unknown" if text_share is None or text_share > 0.1 else "incidental" if text_share > 0.01 else "none")
        return {"domain": "unknown", "scene": "unknown", "subjects": subjects or ["unknown"], "actions": actions,
                "style": "unknown", "text": text, "watermark": "unknown"}

    def captions(self, facts: ClipFacts) -> dict[str, str]:
        looks = facts.looks
        mean_b = float(np.mean([x.brightness for x in looks])) if looks else 128.0
        main = max(looks, key=lambda x: x.saturation) if looks else None
        shot = ("A still image" if facts.still else
                f"A {facts.duration_s:.0f}-second shot from {camera_phrase(facts.camera)}")
        tone = f"{_light(mean_b)}, {_colour(main)} tones" if main else _light(mean_b)
        level_0 = f"{shot}; {tone}."
        seen = _seen(facts)
        dyn = {"static": "The scene itself stays still", "mostly-static": "Little in the scene moves",
               "dynamic": "Parts of the scene move on their own"}.get(facts.camera.get("scene_dynamics"), "")
        size = _size(facts)
        level_1 = " ".join(filter(None, [
            level_0,
            size,
            f"It shows {' and '.join(seen)}." if seen else "No faces or on-screen text were detected.",
            f"{dyn}." if dyn else "",
            _STEADY.get(facts.camera.get("steadiness"), ""),
        ]))
        timeline = self._timeline(facts)
        level_2 = " ".join([level_0, *timeline[:3], size])
        level_2 = _fit(level_2, [*timeline[3:], *_details(facts)], CAPTION_WORDS["level_2"])
        level_3 = _fit(" ".join([level_1, *timeline]), _details(facts) + _frame_notes(facts), CAPTION_WORDS["level_3"])
        return {"level_0": _fit(level_0, [], CAPTION_WORDS["level_0"]), "level_1": _fit(level_1, _details(facts),
                CAPTION_WORDS["level_1"]), "level_2": level_2, "level_3": level_3}

    def _timeline(self, facts: ClipFacts) -> list[str]:
        looks = facts.looks
        if len(looks) < 2:
            return []
        thirds = np.array_split(np.arange(len(looks)), 3 if len(looks) >= 3 else 2)
        names = ["At the start", "In the middle", "Towards the end"] if len(thirds) == 3 else ["At the start", "At the end"]
        out = []
        for name, idx in zip(names, thirds, strict=True):
            if not len(idx):
                continue
            part = [looks[i] for i in idx]
            b = float(np.mean([x.brightness for x in part]))
            t0, t1 = part[0].time_s, part[-1].time_s
            span = f"{t0:.1f} s" if t1 - t0 < 0.05 else f"{t0:.1f}-{t1:.1f} s"
            out.append(f"{name} ({span}) the picture is {_light(b)} with {_colour(part[len(part) // 2])} tones.")
        first, last = looks[0].brightness, looks[-1].brightness
        if abs(last - first) > 20:
            out.append(f"Overall it gets {'brighter' if last > first else 'darker'} over time.")
        else:
            out.append("The lighting stays about the same throughout.")
        return out


def _faces(facts: ClipFacts) -> int:
    return int(facts.evidence.get("faces", {}).get("max_faces", 0) or 0)


def _text_share(facts: ClipFacts) -> float | None:
    """The share of the frame text covers (95th percentile over frames); None when not measured."""
    text = facts.evidence.get("text")
    return None if text is None else float(text.get("text_share_q95", 0.0) or 0.0)


def _seen(facts: ClipFacts) -> list[str]:
    """What the captions say was detected: a face, several faces, on-screen text (as captions
    rule-based v1 words it)."""
    faces, share = _faces(facts), float(facts.evidence.get("text", {}).get("text_share_q95", 0.0) or 0.0)
    return ((["a visible face"] if faces else []) + (["several faces"] if faces >= 4 else [])
            + (["on-screen text"] if share > 0.01 else []))


def _size(facts: ClipFacts) -> str:
    if facts.still:
        return f"The image is {facts.width} by {facts.height} pixels."
    return f"The frame is {facts.width} by {facts.height} pixels at {facts.fps:.0f} frames per second."


def _details(facts: ClipFacts) -> list[str]:
    s = facts.scores
    out = []
    if s.get("quality") is not None:
        q = s["quality"]
        out.append(f"The measured image quality is {'high' if q > 0.6 else 'moderate' if q > 0.3 else 'low'}.")
    if s.get("motion") is not None:
        out.append(f"Measured motion is {'strong' if s['motion'] > 0.6 else 'moderate' if s['motion'] > 0.3 else 'low'}.")
    if facts.looks:
        sharp = float(np.median([x.sharpness for x in facts.looks]))
        out.append(f"{'The image looks' if facts.still else 'Frames look'} {'sharp' if sharp > 300 else 'soft' if sharp > 60 else 'blurry'}.")
    if not facts.still:
        out.append(f"The clip lasts {facts.duration_s:.1f} seconds.")
    return out


def _frame_notes(facts: ClipFacts) -> list[str]:
    if facts.still:
        return [f"The picture is {_light(x.brightness)} and {_colour(x)}." for x in facts.looks]
    return [f"At {x.time_s:.1f} s the frame is {_light(x.brightness)} and {_colour(x)}." for x in facts.looks]


def _fit(text: str, extra: list[str], bounds: tuple[int, int]) -> str:
    """Add measured sentences until the text reaches the level's minimum; cut at the maximum."""
    low, high = bounds
    for sentence in extra:
        if word_count(text) >= low:
            break
        text = f"{text} {sentence}"
    filler = ("These details were measured from sampled frames, not described by a captioning model.")
    while word_count(text) < low:
        text = f"{text} {filler}"
    words = text.split()
    if len(words) > high:
        text = " ".join(words[:high]).rstrip(",;") + ("" if words[high - 1].endswith(".") else ".")
    return text
