"""Caption QC (no Dagster): a judge scores how faithfully a caption describes its clip.

- ``EndpointJudge``: a vision-language model behind an OpenAI-compatible chat-completions endpoint
  (``caption_qc.judge``), of another model family than the captioner (a model grading its own
  family's captions is lenient with its own mistakes). It sees the clip's frames, the caption and,
  for the golden set, the human reference caption; it replies ``{"score": 0..1, "errors": [...]}``.
- ``RuleBasedJudge``: the offline **placeholder**: it can only compare a caption with a reference
  (content-word F1, stop words removed), so it scores the golden set and leaves the sample unjudged.

The golden set (``golden_captions`` in the eval vault: eval clips with reference captions) is
captioned by every captioner version and judged against its references; a seeded sample of the
selected clips' captions is judged against their frames.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vidassets.config import model_family
from vidassets.derive.labels import current_captions
from vidassets.runtime.step import Step
from vidassets.storage.rows import TRANSIENT, RowVersion, StepStats

VERSION = "caption-qc-v1"
JUDGE_SYSTEM = ("You grade captions of short video clips for a video-generation training set. You see frames "
                "sampled from one clip with their timestamps. Judge only what the frames show.")
JUDGE_PROMPT = ("Caption to grade:\n{caption}\n{reference}Rate how faithfully the caption describes the clip: 1.0 when "
                "everything it states is visible and nothing important is missing, 0.0 when it is mostly wrong. "
                'Reply with a JSON object: {{"score": <number between 0 and 1>, "errors": [<each wrong or '
                'unsupported statement>]}}')
REFERENCE_LINE = "A human wrote this reference caption of the same clip:\n{reference}\n"
JUDGE_SCHEMA = {"type": "object", "properties": {"score": {"type": "number"},
                                                 "errors": {"type": "array", "items": {"type": "string"}}},
                "required": ["score", "errors"], "additionalProperties": False}
STOP_WORDS = frozenset("""a an the and or but of to in on at by for with from into over under as is are was were be been
being it its this that these those there here while then than so very some any each one two three his her their
they them he she we you i clip video shows shown seen frame frames camera""".split())


@dataclass
class Verdict:
    status: str  # ok | skipped | error | invalid
    score: float | None = None
    errors: list[str] | None = None
    reason: str | None = None


def content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP_WORDS and len(w) > 1]


class RuleBasedJudge:
    """Offline placeholder: content-word F1 of the caption against the reference."""

    version = "caption-judge-rules-v1-placeholder"
    model_family = None

    def judge(self, caption: str, frames: list[np.ndarray], times: list[float], reference: str | None) -> Verdict:
        if reference is None:
            return Verdict("skipped", reason="placeholder judge: judging against frames needs caption_qc.judge")
        got, want = set(content_words(caption)), set(content_words(reference))
        if not got or not want:
            return Verdict("ok", 0.0, ["no content words"] if not got else [])
        common = len(got & want)
        precision, recall = common / len(got), common / len(want)
        score = 0.0 if not common else 2 * precision * recall / (precision + recall)
        return Verdict("ok", round(score, 4), sorted(got - want)[:10])


class EndpointJudge:
    def __init__(self, settings: Any, client: Any = None):
        from vidassets.models.vlm import OpenAIChatClient, endpoint_request_format, prompt_digest

        self.settings = settings
        self.client = client or OpenAIChatClient.for_endpoint(settings)
        self.version = (f"caption-judge-vlm-{settings.model}@{settings.model_revision}"
                        f"+prompt-{prompt_digest(JUDGE_SYSTEM, JUDGE_PROMPT, REFERENCE_LINE)}"
                        f"+frames{settings.max_frames}+t{settings.temperature:g}+req-{endpoint_request_format(settings)}")
        self.model_family = model_family(settings.model)

    def judge(self, caption: str, frames: list[np.ndarray], times: list[float], reference: str | None) -> Verdict:
        from vidassets.models.vlm import VlmRequest

        if not frames:
            return Verdict("skipped", reason="no frames of the clip")
        pick = np.unique(np.linspace(0, len(frames) - 1, min(self.settings.max_frames, len(frames))).round().astype(int))
        prompt = JUDGE_PROMPT.format(caption=caption, reference=REFERENCE_LINE.format(reference=reference)
                                     if reference else "")
        reply = self.client.complete(VlmRequest("caption_judge", JUDGE_SYSTEM, prompt, [frames[i] for i in pick],
                                                [times[i] for i in pick], JUDGE_SCHEMA))
        if reply.error:
            return Verdict("error", reason=reply.error)
        value = reply.value if reply.ok else None
        if not isinstance(value, dict) or not isinstance(value.get("score"), int | float) \
                or not 0 <= float(value["score"]) <= 1:
            return Verdict("invalid", reason=reply.invalid or f"no score in [0, 1] in reply: {str(reply.raw)[:120]!r}")
        return Verdict("ok", round(float(value["score"]), 4), [str(e) for e in value.get("errors") or []][:10])


def judge_for(settings: Any, client: Any = None) -> RuleBasedJudge | EndpointJudge:
    """The judge of ``caption_qc.judge`` (its endpoint's ``client`` when one is built already), else
    the rule-based placeholder."""
    return EndpointJudge(settings, client) if settings is not None else RuleBasedJudge()


def sample_clips(clip_ids: list[str], size: int, seed: int, version: str) -> list[str]:
    """A seeded sample of clips for one captioner version: the same clips while they exist, new
    clips enter by their hash (a growing corpus keeps most of the sample)."""
    def rank(c: str) -> str:
        return hashlib.sha256(f"{seed}\x00{version}\x00{c}".encode()).hexdigest()

    return sorted(clip_ids, key=rank)[:size]


def caption_of(value: str | None, level: str) -> str | None:
    if not value:
        return None
    text = json.loads(value).get(level)
    return text if isinstance(text, str) and text.strip() else None


def judge_all(golden: list[dict], golden_frames: Callable[[dict], tuple[list[float], list[np.ndarray]]],
              caption_golden: Callable[[dict, list[float], list[np.ndarray]], tuple[str | None, str | None]],
              sample: list[dict], sample_frames: Callable[[dict], tuple[list[float], list[np.ndarray]]],
              judge: Any, captions_version: str, level: str, previous: Any, version: str,
              max_runs: int) -> tuple[list[dict], StepStats]:
    """Rows for the golden set (captioned now by ``caption_golden``, judged against each reference)
    and for the sample (``{clip_id, caption}``, judged against its frames). A row is reused while
    the captioner version, the judge version and what it judged (reference or caption text) are
    unchanged; judge errors are retried by later runs."""
    step = Step(previous, lambda r: (r["kind"], r["item_id"], r["captions_version"], r["judge_version"]), max_runs)
    stats = step.stats
    stats.rows_in = len(golden) + len(sample)
    rows: list[dict] = []

    def row(kind: str, item_id: str, verdict: Verdict | None, caption: str | None, reference: str | None,
            inputs: str, status: str | None = None, reason: str | None = None) -> None:
        r = {"kind": kind, "item_id": item_id, "captions_version": captions_version, "caption_level": level,
             "judge_version": judge.version, "status": status or verdict.status,
             "score": verdict.score if verdict else None,
             "errors": json.dumps(verdict.errors) if verdict and verdict.errors is not None else None,
             "reason": reason or (verdict.reason if verdict else None), "caption": caption, "reference": reference}
        failure = TRANSIENT if r["status"] == "error" else None
        rows.append(step.stamp((kind, item_id, captions_version, judge.version), r, RowVersion(version, inputs), failure))

    wanted = []
    for g in golden:
        reference = json.loads(g["captions"]).get(level)
        inputs = "golden-" + hashlib.sha256(json.dumps([g["asset_id"], int(g["first_frame"]), int(g["last_frame"]),
                                                        reference]).encode()).hexdigest()
        wanted.append((("golden", g["golden_id"], captions_version, judge.version), RowVersion(version, inputs),
                       (g, reference, inputs)))
    for g, reference, inputs in step.due(wanted):
        times, frames = golden_frames(g)
        if reference is None:
            row("golden", g["golden_id"], None, None, None, inputs, "skipped", f"no reference caption at {level}")
            continue
        caption, why = caption_golden(g, times, frames)
        if caption is None:
            row("golden", g["golden_id"], None, None, reference, inputs, "no_caption", why)
            continue
        row("golden", g["golden_id"], judge.judge(caption, frames, times, reference), caption, reference, inputs)
    wanted = []
    for s in sample:
        inputs = "caption-" + hashlib.sha256(s["caption"].encode()).hexdigest()
        wanted.append((("sample", s["clip_id"], captions_version, judge.version), RowVersion(version, inputs), (s, inputs)))
    for s, inputs in step.due(wanted):
        times, frames = sample_frames(s)
        row("sample", s["clip_id"], judge.judge(s["caption"], frames, times, None), s["caption"], None, inputs)
    return step.complete(rows), stats


def summary(rows: Any, captions_version: str, judge_version: str) -> dict[str, Any]:
    """Mean judged score and counts of the golden set and the sample for one captioner version."""
    import pandas as pd

    table = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows
    out: dict[str, Any] = {"captions_version": captions_version, "judge_version": judge_version}
    for kind in ("golden", "sample"):
        mine = table[(table.kind == kind) & (table.captions_version == captions_version)
                     & (table.judge_version == judge_version)] if len(table) else table
        scored = mine[mine.status == "ok"] if len(mine) else mine
        out[kind] = {"judged": len(scored), "rows": len(mine),
                     "mean_score": round(float(scored.score.mean()), 4) if len(scored) else None}
    return out


def caption_with(backends: Any, row: dict, times: list[float], frames: list[np.ndarray],
                 level: str) -> tuple[str | None, str | None]:
    """The configured captioner's caption (``level``) of a clip outside the catalog (a golden clip):
    the camera record first, as the annotations stage gives it to the captioner. (text, None) or
    (None, why there is none)."""
    from vidassets.derive.annotations import ClipFrames

    item = ClipFrames(row, times, frames)
    camera_of: dict[str, Any] = {}
    status, value, reason, _ = backends.fresh(1).run("camera", [item], camera_of)[0]
    if status == "ok":
        camera_of[row["clip_id"]] = value
    status, value, reason, _ = backends.fresh(1).run("captions", [item], camera_of)[0]
    if status not in ("ok", "partial") or not isinstance(value, dict) or not value.get(level):
        return None, reason or f"captioner returned {status}"
    return str(value[level]), None


def frames_in(table: Any, objects: Any, asset_id: str, first: int, last: int, start_s: float):
    """(times from ``start_s``, RGB frames) of the saved context frames of ``asset_id`` within frames
    ``first``..``last`` (``table``: a context-frames table)."""
    from vidassets.storage.blobs import load_images

    inside = table[(table.asset_id == asset_id) & (table.frame_index >= first) & (table.frame_index <= last)] \
        if len(table) else table
    inside = inside.sort_values("frame_index") if len(inside) else inside
    return [float(t) - start_s for t in inside.time_s] if len(inside) else [], \
        load_images(objects, inside.blob_key) if len(inside) else []


def caption_qc_rows(tables: Any, vault: Any, backends: Any, judge: Any, qc: Any, captions_version: str,
                    version: str, max_runs: int) -> tuple[list[dict], StepStats]:
    """Caption QC of one captioner version: the vault's golden clips captioned now and judged against
    their references, and a seeded sample of the selected clips' captions judged against their saved
    frames. ``tables``: the store's (annotations, clips, context frames); ``vault``: the eval vault's
    (golden captions, eval analysis and context frames, the previous QC rows)."""

    from vidassets.storage.rows import records

    analysis = vault.read_all("eval_video_analysis")
    fps = dict(zip(analysis.asset_id, analysis.fps, strict=True)) if len(analysis) else {}
    eval_frames = vault.read_all("eval_context_frames")

    def golden_frames(g: dict):
        start = int(g["first_frame"]) / float(fps.get(g["asset_id"]) or 1.0)
        return frames_in(eval_frames, vault.objects, g["asset_id"], int(g["first_frame"]), int(g["last_frame"]), start)

    def caption_golden(g: dict, times, frames):
        n = int(g["last_frame"]) - int(g["first_frame"]) + 1
        row = {"clip_id": g["golden_id"], "asset_id": g["asset_id"], "source_shard": "eval",
               "duration_s": n / float(fps.get(g["asset_id"]) or 1.0)}
        return caption_with(backends, row, times, frames, qc.level)

    annotations = tables.read_all("annotations")
    captions = current_captions(annotations, captions_version)
    texts = {r.clip_id: caption_of(r.value, qc.level) for r in captions.itertuples()}
    chosen = sample_clips(sorted(c for c, t in texts.items() if t), qc.sample_size, qc.seed, captions_version)
    clip_rows = {r["clip_id"]: r for r in records(tables.read_all("clips"))}
    context_frames = tables.read_all("context_frames")

    def sample_frames(s: dict):
        c = clip_rows[s["clip_id"]]
        return frames_in(context_frames, tables.objects, c["asset_id"], int(c["first_frame"]), int(c["last_frame"]),
                         float(c["start_s"]))

    return judge_all(records(vault.read_or_empty("golden_captions")), golden_frames, caption_golden,
                     [{"clip_id": c, "caption": texts[c]} for c in chosen if c in clip_rows], sample_frames, judge,
                     captions_version, qc.level, vault.read_or_empty("caption_qc"), version, max_runs)
