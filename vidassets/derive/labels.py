"""The three annotation schemas (camera motion, four-level captions, tags): label sets, strict
validators that return the reasons a reply fails, and JSON schemas a model server can be
constrained with. Pure Python; shared by every backend (offline rule-based and VLM)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

from vidassets.storage.rows import current_rows

UNKNOWN = "unknown"
NONE = "none"


def _axis(name: str, a: str, b: str) -> tuple[str, str, str]:
    return (f"{name}-{a}", f"{name}-{b}", f"no-{name}")


# ---------------------------------------------------------------- camera motion

CAMERA_SINGLE: dict[str, tuple[str, ...]] = {
    "motion_type": ("no-motion", "minor-motion", "simple-motion", "complex-motion"),
    "steadiness": ("static", "no-shaking", "minimal-shaking", "unsteady", "very-unsteady"),
    "pan": _axis("pan", "left", "right"),
    "tilt": _axis("tilt", "up", "down"),
    "roll": _axis("roll", "CW", "CCW"),
    "dolly": _axis("dolly", "in", "out"),
    "pedestal": _axis("pedestal", "up", "down"),
    "truck": _axis("truck", "left", "right"),
    "zoom": _axis("zoom", "in", "out"),
    "arc": _axis("arc", "CW", "CCW"),
    **{f"{kind}_tracking": (f"{kind}-tracking", f"no-{kind}-tracking")
       for kind in ("arc", "lead", "tail", "side", "aerial", "pan", "tilt")},
    "subject_size_change": ("subject-larger", "subject-smaller", "no-subject-change"),
    "speed": ("slow", "regular", "fast", "none"),
    "scene_dynamics": ("static", "mostly-static", "dynamic"),
}
CAMERA_EFFECTS = ("frame-freezing", "dolly-zoom", "motion-blur")
CAMERA_FIELDS = (*CAMERA_SINGLE, "effects")

# ---------------------------------------------------------------- tags

# The tag taxonomy of the design (seed 002, Appx. C.3, Table 5), label for label and in its order;
# ``unknown`` is added to every field by the validators and schemas, as the table lists it last.
TAG_SINGLE: dict[str, tuple[str, ...]] = {
    "domain": ("real_world", "animation", "game", "screen_recording", "synthetic_render", "mixed"),
    "scene": ("general_indoor", "general_outdoor", "urban", "nature", "driving", "sports", "food", "product",
              "portrait", "screen", "other"),
    "style": ("photorealistic", "cinematic", "documentary", "anime", "cartoon", "cg_render", "gameplay", "graphic"),
    "text": ("none", "incidental", "subtitle", "screen_ui", "document", "signage", "overlay_text"),
    "watermark": ("none", "logo", "text_watermark", "platform_watermark"),
}
TAG_MULTI: dict[str, tuple[str, ...]] = {
    "subjects": ("person", "vehicle", "animal", "object", "food", "landscape", "building", "text", "screen", "robot",
                 "other"),
    "actions": ("talking", "locomotion", "driving", "sports", "cooking", "object_manipulation", "natural_motion",
                "camera_motion_only", "timelapse", "none", "other"),
}
TAG_FIELDS = ("domain", "scene", "subjects", "actions", "style", "text", "watermark")
"""Table 5's field order (also the order of the tag JSON schema, so a constrained model decides the
domain first)."""

SCHEMA_VERSIONS = {"camera": "annotation-schema-v1", "captions": "annotation-schema-v1", "tags": "tag-schema-v2-table5"}
"""Version of each kind's label sets and validation (part of its producer version and stored in its
rows): the tag labels changed to Table 5 without touching the camera or caption schemas."""

# ---------------------------------------------------------------- captions

CAPTION_WORDS: dict[str, tuple[int, int]] = {  # inclusive word-count bounds per level
    "level_0": (1, 19),
    "level_1": (20, 50),
    "level_2": (50, 100),
    "level_3": (100, 200),
}
CAPTION_LEVELS = tuple(CAPTION_WORDS)


def word_count(text: str) -> int:
    return len(re.findall(r"\S+", text))


# ---------------------------------------------------------------- validators

def _check_keys(reply: Mapping[str, Any], fields: tuple[str, ...], errors: list[str]) -> None:
    extra = sorted(set(reply) - set(fields))
    missing = [f for f in fields if f not in reply]
    if extra:
        errors.append(f"unexpected field(s) {extra}")
    if missing:
        errors.append(f"missing field(s) {missing}")


def _check_single(name: str, value: Any, allowed: tuple[str, ...], errors: list[str]) -> None:
    if value not in (*allowed, UNKNOWN):
        errors.append(f"{name}: {value!r} is not one of {[*allowed, UNKNOWN]}")


def _check_multi(name: str, value: Any, allowed: tuple[str, ...], errors: list[str], none_ok: bool) -> None:
    if not isinstance(value, list) or not value:
        errors.append(f"{name}: must be a non-empty list")
        return
    for label in value:
        if label not in (*allowed, UNKNOWN, *((NONE,) if none_ok else ())):
            errors.append(f"{name}: {label!r} is not an allowed label")
    if len(set(value)) != len(value):
        errors.append(f"{name}: repeated labels")
    if len(value) > 1 and UNKNOWN in value:
        errors.append(f"{name}: 'unknown' cannot be combined with other labels")
    if len(value) > 1 and NONE in value:
        errors.append(f"{name}: 'none' cannot be combined with other labels")


def validate_camera(reply: Any) -> list[str]:
    """Reasons the camera record is invalid (empty list: valid)."""
    if not isinstance(reply, Mapping):
        return ["camera record must be a JSON object"]
    errors: list[str] = []
    _check_keys(reply, CAMERA_FIELDS, errors)
    for name, allowed in CAMERA_SINGLE.items():
        if name in reply:
            _check_single(name, reply[name], allowed, errors)
    if "effects" in reply:
        _check_multi("effects", reply["effects"], CAMERA_EFFECTS, errors, none_ok=True)
    return errors


def validate_tags(reply: Any) -> list[str]:
    if not isinstance(reply, Mapping):
        return ["tags must be a JSON object"]
    errors: list[str] = []
    _check_keys(reply, TAG_FIELDS, errors)
    for name, allowed in TAG_SINGLE.items():
        if name in reply:
            _check_single(name, reply[name], allowed, errors)
    for name, allowed in TAG_MULTI.items():
        if name in reply:
            # 'none' is a label of its own only among actions ("nothing happens")
            _check_multi(name, reply[name], tuple(a for a in allowed if a != NONE), errors, none_ok=NONE in allowed)
    return errors


CAPTION_WORD_TOLERANCE = 0.5
"""Word bounds are targets: a level up to this share outside them is kept and marked ``off_target``."""


def judge_caption_levels(reply: Any, tolerance: float = CAPTION_WORD_TOLERANCE) -> dict[str, str]:
    """Status of each caption level on its own: ``ok`` (within its word target), ``off_target: …``
    (outside the target by at most ``tolerance``: kept), ``invalid: …`` (missing, empty, or further
    out). One bad level never voids the others."""
    if not isinstance(reply, Mapping):
        return {level: "invalid: captions must be a JSON object" for level in CAPTION_LEVELS}
    out = {}
    for level, (low, high) in CAPTION_WORDS.items():
        text = reply.get(level)
        if level not in reply:
            out[level] = "invalid: missing"
            continue
        if not isinstance(text, str) or not text.strip():
            out[level] = "invalid: must be a non-empty string"
            continue
        n = word_count(text)
        if low <= n <= high:
            out[level] = "ok"
        elif max(1.0, low * (1 - tolerance)) <= n <= high * (1 + tolerance):
            out[level] = f"off_target: {n} words, target {low}-{high}"
        else:
            out[level] = f"invalid: {n} words, target {low}-{high} (±{tolerance:.0%} accepted)"
    return out


def usable(level_status: str) -> bool:
    return level_status == "ok" or level_status.startswith("off_target")


def validate_captions(reply: Any, tolerance: float = CAPTION_WORD_TOLERANCE) -> list[str]:
    """Reasons the caption record is not fully usable: unexpected fields and every level that is
    not usable (empty list: every level usable, some perhaps off target)."""
    if not isinstance(reply, Mapping):
        return ["captions must be a JSON object"]
    errors: list[str] = []
    extra = sorted(set(reply) - set(CAPTION_LEVELS))
    if extra:
        errors.append(f"unexpected field(s) {extra}")
    errors += [f"{level}: {status[len('invalid: '):]}" for level, status in judge_caption_levels(reply, tolerance).items()
               if not usable(status)]
    return errors


VALIDATORS = {"camera": validate_camera, "captions": validate_captions, "tags": validate_tags}


def usable_captions(value: str, levels: str | None) -> str:
    """A caption row's value (JSON) with every unusable level set to null."""
    record = json.loads(value)
    if not levels:
        return value
    status = json.loads(levels)
    return json.dumps({k: v if usable(status.get(k, "invalid")) else None for k, v in record.items()}, sort_keys=True)


def caption_texts(annotations: Any, caption_version: str, level: str) -> tuple[dict[str, str], dict[str, str]]:
    """(clip_id -> text of ``level``, clip_id -> why it has none) over the caption rows of
    ``caption_version`` in an annotations table: a level counts when it is usable, whatever the
    other levels are (rows without per-level status count when their status is ok)."""
    texts: dict[str, str] = {}
    missing: dict[str, str] = {}
    if not len(annotations):
        return texts, missing
    rows = annotations[(annotations.kind == "captions") & (annotations.producer_version == caption_version)]
    for r in rows.itertuples():
        levels = json.loads(r.levels) if getattr(r, "levels", None) else None
        status = levels.get(level, "invalid: missing") if levels else ("ok" if r.status == "ok" else f"invalid: {r.reason}")
        if r.status in ("ok", "partial") and usable(status):
            texts[r.clip_id] = json.loads(r.value)[level]
        else:
            missing[r.clip_id] = f"{r.status}: {status.split(': ', 1)[-1] if status != 'ok' else r.reason}"
    return texts, missing


# ---------------------------------------------------------------- JSON schemas (for constrained decoding)

def _enum(values: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "string", "enum": [*values, UNKNOWN]}


def _array(values: tuple[str, ...]) -> dict[str, Any]:
    # no "uniqueItems": vLLM's default grammar backend (xgrammar) cannot enforce it; repeated labels
    # are caught by the validators (and sent back in a repair request)
    return {"type": "array", "items": {"type": "string", "enum": [*values, UNKNOWN]}, "minItems": 1}


def _object(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


JSON_SCHEMAS: dict[str, dict[str, Any]] = {
    "camera": _object({**{k: _enum(v) for k, v in CAMERA_SINGLE.items()}, "effects": _array((*CAMERA_EFFECTS, NONE))}),
    "tags": _object({k: _enum(TAG_SINGLE[k]) if k in TAG_SINGLE else _array(TAG_MULTI[k]) for k in TAG_FIELDS}),
    "captions": _object({level: {"type": "string"} for level in CAPTION_LEVELS}),
}


def current_captions(annotations: pd.DataFrame, version: str) -> pd.DataFrame:
    """The caption rows of captioner ``version`` that hold a caption (``ok``, or ``partial``: some
    levels), from an annotations table: what every reader of captions takes."""
    if not len(annotations):
        return annotations
    return current_rows(annotations[annotations.kind == "captions"], version, ("ok", "partial"))
