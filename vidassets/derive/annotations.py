"""annotations for one partition: camera motion, four-level captions and tags for the selected
clips, in tier order (T0 first), from saved context frames only (no decode).

Each kind has its own backend (offline rule-based, or a VLM behind an OpenAI-compatible endpoint)
and its own producer version. Rows are keyed by (clip_id, kind, producer_version) and appended: a
new captioner adds rows beside the old ones, which stay queryable (a recipe picks the version).
A row whose key already exists with a final status (ok, partial or invalid) is reused; transport
errors are retried on the next run. Validation failures are rows with reasons, never a crashed run.

Captions are judged per level (``levels``: each level's status): word bounds are targets with a
tolerance, a level outside it is unusable without voiding the others (row status ``partial``). A VLM
reply with problems gets a repair request (the reply, what is wrong with it) and the best of both
replies is kept, per level for captions."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import AnnotationSettings
from vidassets.derive.labels import (
    CAMERA_EFFECTS,
    CAMERA_SINGLE,
    CAPTION_WORDS,
    JSON_SCHEMAS,
    SCHEMA_VERSIONS,
    TAG_FIELDS,
    TAG_SINGLE,
    VALIDATORS,
    judge_caption_levels,
    usable,
)
from vidassets.media.image import is_image
from vidassets.runtime.engine import LocalEngine
from vidassets.runtime.step import Step, count_remote
from vidassets.storage.blobs import load_images
from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import FINAL, TRANSIENT, RowVersion, StepStats, records

KINDS = ("camera", "captions", "tags")

SYSTEM_PROMPT = (
    "You annotate short video clips for a video-generation training set. You see frames sampled from "
    "one clip with their timestamps. Reply with a single JSON object that matches the requested schema "
    "exactly: no extra fields, no prose around it. Use 'unknown' whenever the frames do not show it.")


def _labels(options: Mapping[str, tuple[str, ...]]) -> str:
    return "\n".join(f"- {k}: {' | '.join(v)} | unknown" for k, v in options.items())


CAMERA_PROMPT = (
    "Describe the camera's motion in this clip (not the subjects' motion). Fields and allowed labels:\n"
    f"{_labels(CAMERA_SINGLE)}\n- effects: a list of {' / '.join(CAMERA_EFFECTS)}, or [\"none\"], or [\"unknown\"]\n"
    "Single-label fields take exactly one label.")
CAPTION_PROMPT = (
    "Write four captions of this clip, describing only what is visible.\n"
    + "\n".join(f"- {level}: {lo}-{hi} words" for level, (lo, hi) in CAPTION_WORDS.items())
    + "\nlevel_0 is the gist; level_1 adds subjects, setting and camera; level_2 tells how the clip unfolds "
    "over time using the timestamps; level_3 is dense: subjects, actions, setting, lighting, colours, "
    "camera and any text on screen. The measured camera motion of this clip is: {camera}")
TAG_NOTES: dict[str, dict[str, str]] = {
    "domain": {
        "real_world": "camera-captured footage (phones, film cameras, dashcams, drones); a filmed screen too",
        "animation": "authored 2D/3D animation, anime, cartoons, stop motion",
        "game": "video-game or game-engine footage, even captured from a screen",
        "screen_recording": "direct capture of software, websites, documents, slides (gameplay is game)",
        "synthetic_render": "non-game CGI, 3D or product renders, simulations",
        "mixed": "several domains each take a substantial part of the picture (not small overlays)"},
    "scene": {
        "general_indoor": "inside, when no more specific scene dominates",
        "general_outdoor": "outside, when no more specific scene dominates",
        "urban": "streets, architecture, crowds, built environment (driving not the focus)",
        "nature": "landscape, forest, mountains, sea, sky, plants, wildlife habitat",
        "driving": "roads, traffic, dashcam or cockpit views where driving or navigation is the focus",
        "sports": "organised sport, exercise, fitness, competition",
        "food": "food preparation, eating, restaurants, ingredients",
        "product": "an object or product shown off or demonstrated",
        "portrait": "person-centred close-up, talking head, interview, presenter",
        "screen": "screens, UI, documents or slides dominate",
        "other": "a clear scene none of the others fits"},
    "subjects": {
        "person": "humans or human-like characters", "vehicle": "cars, bikes, trains, aircraft, boats",
        "animal": "any animal", "object": "a salient foreground object, tool, toy, device (not clutter)",
        "food": "food, drink, ingredients", "landscape": "scenery, sky, water, terrain as a main subject",
        "building": "buildings, rooms, bridges, architecture",
        "text": "text itself is a salient subject (sign, title card, slide, large overlay)",
        "screen": "a salient screen or screen-captured interface", "robot": "robots, robotic arms, autonomous machines",
        "other": "a clear major subject none of the others fits"},
    "actions": {
        "talking": "speaking, presenting, singing, addressing the camera",
        "locomotion": "walking, running, jumping, dancing steps, moving through space",
        "driving": "driving, riding, traffic movement, road navigation",
        "sports": "sport, exercise, athletic motion", "cooking": "cooking, food preparation, plating",
        "object_manipulation": "hands, tools or robots handling, assembling, opening or operating objects",
        "natural_motion": "water, fire, smoke, weather, moving plants, animal or environment motion",
        "camera_motion_only": "the camera's movement is the main change; subjects and scene are mostly still",
        "timelapse": "time-lapse or clearly sped-up change",
        "none": "no meaningful action of subjects or scene", "other": "a clear action none of the others fits"},
    "style": {
        "photorealistic": "realistic imagery not clearly one of the other styles",
        "cinematic": "deliberate film-like lighting, grading, composition (only when it stands out)",
        "documentary": "factual, vlog, news, tutorial or observational footage",
        "anime": "anime style", "cartoon": "cartoon or other non-anime animation",
        "cg_render": "CGI, 3D render, simulation", "gameplay": "game visuals, HUDs, game-engine look",
        "graphic": "slides, diagrams, charts, mostly flat graphics"},
    "text": {
        "none": "no visible text", "incidental": "small or background text, not central",
        "subtitle": "persistent, central subtitles or captions", "screen_ui": "software, web, app or game interface text",
        "document": "slides, pages, posters, forms, even on a screen", "signage": "signs, billboards, placards",
        "overlay_text": "large titles, meme or sticker text overlaid (not subtitles, UI, documents or signs)"},
    "watermark": {
        "none": "no watermark or ownership mark", "logo": "an overlaid channel or source logo (not logos on products)",
        "text_watermark": "repeated, semi-transparent or ownership text", "platform_watermark": "a platform, app or stock-media mark"},
}
"""What each tag label means (the design's tag prompt, Appx. D.3, in brief); keys are exactly the
labels of ``TAG_SINGLE`` / ``TAG_MULTI``."""


def _tag_lines() -> str:
    def field(name: str) -> str:
        kind = "one label" if name in TAG_SINGLE else "a list of labels"
        notes = "".join(f"\n  - {label}: {note}" for label, note in TAG_NOTES[name].items())
        return f"- {name} ({kind}):{notes}\n  - unknown: the frames cannot tell"
    return "\n".join(field(name) for name in TAG_FIELDS)


TAG_PROMPT = (
    "Tag this clip as a whole (not a single frame). Single-label fields take the dominant label: sustained "
    "and central, not brief or in the background. subjects and actions are lists of every major label, kept "
    "concise. Use 'other' when the evidence is clear but fits no label and 'unknown' only when it is "
    "insufficient; 'unknown' never appears with other labels, and among actions 'none' never appears with "
    "others.\n" + _tag_lines())
PROMPTS = {"camera": CAMERA_PROMPT, "captions": CAPTION_PROMPT, "tags": TAG_PROMPT}
STILL_NOTE = (
    "\n\nThis sample is one still image, not video frames: there is no camera motion and no time. "
    "Describe the picture as it is; where a field asks about motion or how it unfolds, describe the scene.")
"""Appended to the caption and tag prompts for a still image (a 1-frame sample)."""
NOT_FOR_IMAGES = {"camera": "a still image has no camera motion"}
REPAIR_PROMPT = (
    "\n\nYour previous reply was:\n{previous}\nIt has these problems: {problems}. Reply again with the "
    "complete JSON object for the same frames, fixing these problems and keeping what was right.")


def verdict(kind: str, value: Any, tolerance: float) -> tuple[str, str | None, dict[str, str] | None]:
    """(status, reason, per-level status) of one annotation value. Camera and tags are valid or not
    as a whole; captions are judged per level: ``ok`` when every level is usable, ``partial`` when
    some are, ``invalid`` when none is."""
    if kind != "captions":
        errors = VALIDATORS[kind](value)
        return ("invalid", "; ".join(errors), None) if errors else ("ok", None, None)
    levels = judge_caption_levels(value, tolerance)
    bad = [f"{level}: {status.split(': ', 1)[-1]}" for level, status in levels.items() if not usable(status)]
    extra = sorted(set(value) - set(levels)) if isinstance(value, Mapping) else []
    if extra:
        bad.append(f"unexpected field(s) {extra} (ignored)")
    good = sum(usable(x) for x in levels.values())
    status = "ok" if good == len(levels) else "partial" if good else "invalid"
    return status, "; ".join(bad) or None, levels


def repaired(kind: str, before: Any, after: Any, tolerance: float) -> Any:
    """The value kept after a repair request: captions level by level (the better status of the two
    replies, the first on a tie); other kinds the repaired reply unless it is worse."""
    rank = {"ok": 2, "partial": 1}
    if kind == "captions" and isinstance(before, Mapping) and isinstance(after, Mapping):
        old, new = judge_caption_levels(before, tolerance), judge_caption_levels(after, tolerance)

        def level_rank(status: str) -> int:
            return 2 if status == "ok" else 1 if usable(status) else 0

        return {level: after.get(level) if level_rank(new[level]) > level_rank(old[level]) else before.get(level)
                for level in old}
    if before is None:
        return after
    worse = rank.get(verdict(kind, after, tolerance)[0], 0) < rank.get(verdict(kind, before, tolerance)[0], 0)
    return before if worse else after


def kind_versions(a: AnnotationSettings) -> dict[str, str]:
    """Producer version per annotation kind (model id + revision + prompt digest + request format +
    schema)."""
    from vidassets.derive.camera_motion import RuleBasedCameraMotion
    from vidassets.derive.rule_annotator import RuleBasedAnnotator

    camera = RuleBasedCameraMotion().version if a.camera == "rule_based" else vlm_version("camera", a.vlm)
    captions = (f"{RuleBasedAnnotator.version_captions}+{SCHEMA_VERSIONS['captions']}" if a.captions == "rule_based"
                else vlm_version("captions", a.vlm)) + f"+words-tol{a.caption_word_tolerance:g}"
    tags = (f"{RuleBasedAnnotator.version_tags}+{SCHEMA_VERSIONS['tags']}" if a.tags == "rule_based"
            else vlm_version("tags", a.vlm))
    own = {"camera": camera, "captions": captions, "tags": tags}
    # a kind that is given the camera record expires with it; the others do not
    return {kind: f"{v}+ctx-{camera}" if reads_camera(kind, a) else v for kind, v in own.items()}


def vlm_version(kind: str, v: Any) -> str:
    """A VLM annotator's version: what it asks (prompts, the JSON schema's digest), how (the request
    format: frames as one video or timed images, how the schema is sent), of which model, with which
    sampling and repair budget."""
    from vidassets.models.vlm import endpoint_request_format, prompt_digest

    schema = prompt_digest(json.dumps(JSON_SCHEMAS[kind], sort_keys=True))
    return (f"{kind}-vlm-{v.model}@{v.model_revision}"
            f"+prompt-{prompt_digest(SYSTEM_PROMPT, PROMPTS[kind], REPAIR_PROMPT, STILL_NOTE)}"
            f"+frames{v.max_frames}+t{v.temperature:g}+tokens{v.max_tokens}+req-{endpoint_request_format(v)}"
            f"+repair{v.repair_attempts}+{SCHEMA_VERSIONS[kind]}-{schema}")


def reads_camera(kind: str, a: AnnotationSettings) -> bool:
    """Captions see the camera record (the VLM prompt quotes it, the rule-based captioner words it);
    rule-based tags use it to tell a still scene; the VLM tag prompt never sees it."""
    return kind == "captions" or (kind == "tags" and a.tags == "rule_based")


@dataclass
class ClipFrames:
    row: dict
    times: list[float]
    frames: list[np.ndarray]


def annotate_partition(objects: ObjectStore, selected: list[dict], clips: pd.DataFrame, context_frames: pd.DataFrame,
                       previous: pd.DataFrame, versions: Mapping[str, RowVersion], backends: Backends, max_runs: int,
                       log: Callable[[str], None] = lambda _: None, engine: Any = None) -> tuple[list[dict], StepStats]:
    """Rows of every kind for the selected clips; rows of other producer versions stay beside them.
    Transport errors are transient failures (retried by later runs), invalid replies final.

    Clips with a kind due go to the engine in chunks (``Backends.chunk`` clips: the VLM's concurrency,
    shared among the engine's parallel chunks); a chunk loads its clips' context frames once and
    runs the due kinds in order, camera first (captions and tags are given the camera record)."""
    started = time.perf_counter()
    engine = engine or LocalEngine()
    step = Step(previous, lambda r: (r["clip_id"], r["kind"], r["producer_version"]), max_runs, engine=engine)
    stats = step.stats
    stats.rows_in = len(selected)
    clip_by_id = {r["clip_id"]: r for r in records(clips)}
    frames_by_asset = {a: g.sort_values("frame_index") for a, g in context_frames.groupby("asset_id")} if len(context_frames) else {}
    jobs: list[_Job] = []
    for sel in selected:
        due = step.due(((sel["clip_id"], kind, versions[kind].producer), versions[kind], kind) for kind in KINDS)
        if due:
            row = clip_by_id[sel["clip_id"]]
            frames = frames_by_asset.get(row["asset_id"])
            inside = (frames[(frames.frame_index >= row["first_frame"]) & (frames.frame_index <= row["last_frame"])]
                      if frames is not None else pd.DataFrame(columns=["time_s", "blob_key"]))
            jobs.append(_Job({**row, **sel}, [float(t) - row["start_s"] for t in inside.time_s], list(inside.blob_key),
                             due))
    camera_of = {r["clip_id"]: json.loads(r["value"]) for r in step.kept if r["kind"] == "camera" and r["status"] == "ok"}
    for job in jobs:
        job.camera = camera_of.get(job.row["clip_id"])
    size = backends.chunk(engine)
    chunks = [jobs[i:i + size] for i in range(0, len(jobs), size)]
    for kind in KINDS:
        todo = sum(kind in job.kinds for job in jobs)
        if todo:
            log(f"{kind}: annotating {todo} clip(s) with {versions[kind].producer}")
    count_remote(stats, engine, len(chunks))
    outcomes = engine.map(_Annotate(objects, backends, engine), chunks, lambda c: f"{len(c)} clip(s)", log)
    new_rows: list[dict] = []
    by_kind: dict[str, int] = {}
    for chunk, outcome in zip(chunks, outcomes, strict=True):
        if outcome.row is not None:
            stats.model_calls += outcome.row["calls"]
            results = outcome.row["rows"]
        else:  # the chunk itself failed (its worker died, a bug): each due annotation is a retried error row
            results = [(job.row["clip_id"], kind, _row(job.row, kind, "error", None, outcome.reason, {}, len(job.keys)))
                       for job in chunk for kind in job.kinds]
        for clip_id, kind, row in results:
            status = row["status"]
            failure = TRANSIENT if status == "error" else FINAL if status not in ("ok", "partial", "not_applicable") else None
            new_rows.append(step.stamp((clip_id, kind, versions[kind].producer), row, versions[kind], failure))
            by_kind[kind] = by_kind.get(kind, 0) + 1
    rows = step.complete(new_rows)
    stats.extra["computed_by_kind"] = by_kind
    stats.seconds = time.perf_counter() - started
    return sorted(rows, key=lambda r: (r["clip_id"], r["kind"], r["producer_version"])), stats


@dataclass
class _Job:
    """One selected clip with annotation kinds due: its row, context frame times and blob keys."""
    row: dict
    times: list[float]
    keys: list[str]
    kinds: list[str]
    camera: dict | None = None
    """The clip's stored camera record (when camera is not due itself)."""


class _Annotate:
    """The due kinds of a chunk of clips, camera first (picklable: it may run as a Ray task). Returns
    ``rows`` as (clip_id, kind, row) and the model ``calls`` made."""

    def __init__(self, objects: ObjectStore, backends: Backends, engine: Any):
        self.objects, self.backends = objects, backends
        self.concurrency = backends.concurrency(engine)

    def __call__(self, chunk: list[_Job]) -> dict:
        backends = self.backends.fresh(self.concurrency)
        items = {job.row["clip_id"]: ClipFrames(job.row, job.times, load_images(self.objects, job.keys)) for job in chunk}
        camera_of = {job.row["clip_id"]: job.camera for job in chunk if job.camera is not None}
        out: list[tuple[str, str, dict]] = []
        for kind in KINDS:
            due = [items[job.row["clip_id"]] for job in chunk if kind in job.kinds]
            if not due:
                continue
            for item, (status, value, reason, meta) in zip(due, backends.run(kind, due, camera_of), strict=True):
                out.append((item.row["clip_id"], kind, _row(item.row, kind, status, value, reason, meta, len(item.frames))))
                if kind == "camera" and status == "ok":
                    camera_of[item.row["clip_id"]] = value
        return {"rows": out, "calls": backends.requests}


def _row(r: dict, kind: str, status: str, value: Any, reason: str | None, meta: dict, frames: int) -> dict:
    return {
        "clip_id": r["clip_id"], "asset_id": r["asset_id"], "source_shard": r["source_shard"], "tier": r.get("tier"),
        "kind": kind, "status": status, "reason": reason,
        "value": json.dumps(value, sort_keys=True) if value is not None else None,
        "raw_reply": meta.get("raw"), "model_id": meta.get("model_id", ""), "prompt_version": meta.get("prompt", "none"),
        "schema_version": SCHEMA_VERSIONS[kind], "frames": frames, "attempts": int(meta.get("attempts", 1)),
        "evidence": json.dumps(meta.get("evidence") or {}, sort_keys=True),
        "levels": json.dumps(meta["levels"], sort_keys=True) if meta.get("levels") else None,
    }


# ---------------------------------------------------------------- backends

class Backends:
    """Runs one annotation kind over a batch of clips with the configured backend. Returns per clip
    (status, value, reason, meta)."""

    def __init__(self, config: AnnotationSettings, scores: pd.DataFrame, analysis: pd.DataFrame, probe: pd.DataFrame,
                 client: Any = None):
        self.config = config
        self.requests = 0
        self._client, self._injected, self._concurrency = client, client is not None, 0
        self._scores = {cid: g for cid, g in scores.groupby("clip_id")} if len(scores) else {}
        self._fps = dict(zip(analysis.asset_id, analysis.fps, strict=True)) if len(analysis) else {}
        self._size = {r["asset_id"]: (r["display_width"] or r["width"] or 0, r["display_height"] or r["height"] or 0)
                      for r in records(probe)} if len(probe) else {}

    def uses_vlm(self) -> bool:
        return any(getattr(self.config, kind) == "vlm" for kind in KINDS)

    def chunk(self, engine: Any) -> int:
        """Clips per engine item: the VLM's concurrency (one chunk keeps it busy); rule-based kinds
        are CPU work, a few clips per item amortise the item's cost."""
        return max(1, self.config.vlm.max_concurrency) if self.uses_vlm() else 8

    def concurrency(self, engine: Any) -> int:
        """Requests in flight per chunk, so that the endpoint sees about ``vlm.max_concurrency`` in
        all while the engine runs chunks side by side."""
        if not self.uses_vlm():
            return 1
        return max(1, -(-self.config.vlm.max_concurrency // max(1, engine.parallelism)))

    def fresh(self, concurrency: int) -> Backends:
        """A copy for one chunk: its own request count, the client built here (on the worker: the
        endpoint's key is read from that process's environment, never shipped)."""
        copy = Backends.__new__(Backends)
        copy.__dict__.update(self.__dict__)
        copy.requests, copy._concurrency = 0, concurrency
        return copy

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if not self._injected:
            state["_client"] = None
        return state

    def client(self):
        if self._client is None:
            from vidassets.models.vlm import OpenAIChatClient

            self._client = OpenAIChatClient.for_endpoint(self.config.vlm, self._concurrency or None)
        return self._client

    def run(self, kind: str, items: list[ClipFrames], camera_of: dict[str, dict]) -> list[tuple]:
        """One (status, value, reason, meta) per item; a kind that does not apply to a still image
        is a ``not_applicable`` row for it, with no model call."""
        skip = [kind in NOT_FOR_IMAGES and is_image(item.row) for item in items]
        applies = [item for item, skipped in zip(items, skip, strict=True) if not skipped]
        backend = getattr(self.config, kind)
        done = iter(self._vlm(kind, applies, camera_of) if backend == "vlm"
                    else [self._rule(kind, item, camera_of) for item in applies])
        return [("not_applicable", None, NOT_FOR_IMAGES[kind], {"model_id": "none"}) if skipped else next(done)
                for skipped in skip]

    def _rule(self, kind: str, item: ClipFrames, camera_of: dict[str, dict]) -> tuple:
        from vidassets.derive.camera_motion import RuleBasedCameraMotion
        from vidassets.derive.rule_annotator import RuleBasedAnnotator

        if not item.frames:
            return "no_frames", None, "no context frames inside the clip", {"model_id": "rule-based"}
        if kind == "camera":
            model = RuleBasedCameraMotion()
            value, evidence = model(item.times, item.frames)
            meta = {"model_id": model.model_id, "evidence": evidence}
        else:
            annotator = RuleBasedAnnotator()
            facts = self.facts(item, camera_of.get(item.row["clip_id"], {}))
            value = annotator.tags(facts) if kind == "tags" else annotator.captions(facts)
            meta = {"model_id": annotator.model_id}
        status, reason, meta["levels"] = verdict(kind, value, self.config.caption_word_tolerance)
        return status, value, reason, meta

    def facts(self, item: ClipFrames, camera: dict):
        from vidassets.derive.rule_annotator import ClipFacts, frame_looks

        r = item.row
        group = self._scores.get(r["clip_id"])
        values, evidence = {}, {}
        if group is not None:
            for s in group.itertuples():
                values[s.score] = None if pd.isna(s.value) else float(s.value)
                evidence[s.score] = json.loads(s.evidence) if s.evidence else {}
        w, h = self._size.get(r["asset_id"], (0, 0))
        return ClipFacts(still=is_image(r), duration_s=float(r["duration_s"]), fps=float(self._fps.get(r["asset_id"]) or 0.0),
                         width=int(w or 0), height=int(h or 0), scores=values, evidence=evidence, camera=camera,
                         looks=frame_looks(item.times, item.frames))

    def _vlm(self, kind: str, items: list[ClipFrames], camera_of: dict[str, dict]) -> list[tuple]:
        """One request per clip; replies with problems get up to ``repair_attempts`` repair requests
        (the previous reply and its problems appended to the prompt), keeping the best of them."""
        from vidassets.models.vlm import endpoint_request_format, prompt_digest

        v = self.config.vlm
        tolerance = self.config.caption_word_tolerance
        # what the model was shown: the prompt texts and the request format (video or timed images)
        prompt_id = f"{prompt_digest(SYSTEM_PROMPT, PROMPTS[kind], REPAIR_PROMPT, STILL_NOTE)}+{endpoint_request_format(v)}"
        out: list[tuple | None] = [None] * len(items)
        asks: dict[int, tuple[list, list, str]] = {}
        for i, item in enumerate(items):
            if not item.frames:
                out[i] = ("no_frames", None, "no context frames inside the clip", {"model_id": v.model})
                continue
            pick = np.unique(np.linspace(0, len(item.frames) - 1, min(v.max_frames, len(item.frames))).round().astype(int))
            prompt = PROMPTS[kind]
            if kind == "captions":
                prompt = prompt.replace("{camera}", json.dumps(camera_of.get(item.row["clip_id"], "unknown"), sort_keys=True))
            if is_image(item.row):
                prompt += STILL_NOTE
            asks[i] = ([item.frames[j] for j in pick], [item.times[j] for j in pick], prompt)
        state: dict[int, dict] = {}  # per clip: value so far, raw replies, attempts, seconds
        pending = {i: asks[i][2] for i in asks}
        for round_ in range(1 + v.repair_attempts):
            if not pending:
                break
            replies = self._send(kind, {i: (asks[i][0], asks[i][1], prompt) for i, prompt in pending.items()})
            pending = {}
            for i, reply in replies.items():
                s = state.setdefault(i, {"value": None, "raw": [], "attempts": 0, "seconds": 0.0, "error": None,
                                         "invalid": None})
                s["raw"].append(reply.raw)
                s["attempts"] += reply.attempts
                s["seconds"] += reply.seconds
                if reply.error:
                    if s["value"] is None:
                        s["error"] = reply.error
                    continue
                if reply.invalid:
                    if s["value"] is None:
                        s["invalid"] = reply.invalid
                    problems = reply.invalid
                else:
                    s["value"] = reply.value if round_ == 0 else repaired(kind, s["value"], reply.value, tolerance)
                    s["error"] = s["invalid"] = None
                    status, problems, _ = verdict(kind, s["value"], tolerance)
                    if status == "ok":
                        continue
                previous = reply.raw if reply.raw is not None else json.dumps(s["value"])
                pending[i] = asks[i][2] + REPAIR_PROMPT.format(previous=previous, problems=problems)
        for i, s in state.items():
            meta = {"model_id": f"{v.model}@{v.model_revision}", "prompt": prompt_id,
                    "raw": s["raw"][0] if len(s["raw"]) == 1 else json.dumps(s["raw"]),
                    "attempts": s["attempts"], "evidence": {"seconds": round(s["seconds"], 3), "replies": len(s["raw"])}}
            if s["value"] is None and s["error"]:
                out[i] = ("error", None, s["error"], meta)
            elif s["value"] is None:
                out[i] = ("invalid", None, s["invalid"], meta)
            else:
                status, reason, meta["levels"] = verdict(kind, s["value"], tolerance)
                out[i] = (status, s["value"], reason, meta)
        return out  # type: ignore[return-value]

    def _send(self, kind: str, asks: dict[int, tuple[list, list, str]]) -> dict[int, Any]:
        from vidassets.models.vlm import VlmRequest

        client = self.client()
        order = sorted(asks)
        before = client.requests_sent
        replies = client.complete_all([VlmRequest(kind, SYSTEM_PROMPT, asks[i][2], asks[i][0], asks[i][1],
                                                  JSON_SCHEMAS[kind]) for i in order])
        self.requests += client.requests_sent - before
        return dict(zip(order, replies, strict=True))


def schema_pass_rates(rows: pd.DataFrame) -> dict[str, float]:
    """kind -> share of the judged rows whose value passed the kind's schema (``ok`` or ``partial``).
    Not judged: transport errors (retried) and rows of a kind that does not apply to the item
    (``not_applicable``: camera motion of a still image)."""
    if not len(rows):
        return {}
    judged = rows[~rows.status.isin(["error", "not_applicable"])]
    return {kind: round(float(group.status.isin(["ok", "partial"]).mean()), 4) for kind, group in judged.groupby("kind")}
