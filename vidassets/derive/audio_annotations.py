"""The audio stack over each selected clip's kept audio (``clip_audio`` rows with status ok): one row
per (clip, kind, producer version), each kind with its own version and reused while the clip's audio
window and that version are unchanged.

kinds: ``speech`` (Silero VAD spans and share), ``tags`` (speech / music / ambience / silence shares,
rule-based over the VAD spans), ``loudness`` (EBU R128 integrated LUFS, peak, clipping), ``language``
(an OpenAI-compatible transcription server; offline: a placeholder that detects nothing),
``audio_caption`` (rule-based placeholder, or the captioner's endpoint hearing the audio) and
``av_caption`` (the clip's video caption joined with its audio caption; or fused by the endpoint).

Samples are decoded once per clip (in the sandbox) and only when some kind of it is due.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vidassets.config import AudioAnnotationSettings, VlmSettings
from vidassets.derive import audio_labels
from vidassets.runtime.engine import Failure, LocalEngine
from vidassets.runtime.step import Step, count_remote
from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import FINAL, TRANSIENT, RowVersion, StepStats

KINDS = ("speech", "tags", "loudness", "language", "audio_caption", "av_caption")
RATE = 16000
CAPTION_SYSTEM = "You describe the sound of short video clips for a training dataset, in plain English."
AUDIO_CAPTION_PROMPT = ("Describe what can be heard in this clip's audio in one or two sentences: speech (and its "
                        "language), music (genre, instruments), ambient sound, their loudness. Reply as JSON: "
                        '{"caption": "..."}')
FUSE_PROMPT = ("Write one caption of the clip that combines what is seen and what is heard, two to three "
               'sentences. Video caption: {video}\nAudio caption: {audio}\nReply as JSON: {{"caption": "..."}}')
CAPTION_SCHEMA = {"type": "object", "properties": {"caption": {"type": "string"}}, "required": ["caption"],
                  "additionalProperties": False}


def tagger_model(a: AudioAnnotationSettings) -> tuple | None:
    """Registry kind and arguments of the configured AudioSet tagger, or None."""
    return ("ast-audioset", a.tagger.model_dir, a.tagger.threshold, a.tagger.top_k) if a.tagger else None


def whisper_model(a: AudioAnnotationSettings) -> tuple | None:
    """Registry kind and arguments of the configured local Whisper, or None."""
    w = a.whisper
    return ("whisper", w.model_dir, w.task, w.language, w.max_new_tokens) if w else None


def kind_versions(a: AudioAnnotationSettings, vlm: VlmSettings | None, vad_version: str, video_caption_version: str,
                  pyloudnorm_version: str, tagger_version: str | None = None,
                  whisper_version: str | None = None) -> dict[str, str]:
    """Producer version per kind; kinds built on others name them (``tagger_version`` /
    ``whisper_version``: the local AST / Whisper models' versions, when configured)."""
    from vidassets.models.transcriber import PLACEHOLDER_VERSION
    from vidassets.models.vlm import prompt_digest

    language = (whisper_version or f"asr:{a.transcription.model}@{a.transcription.model_revision}+verbose_json"
                if a.whisper or a.transcription else PLACEHOLDER_VERSION)
    tags = f"{audio_labels.TAGS_VERSION}+{vad_version}" + (f"+{tagger_version}" if tagger_version else "")
    if a.captions == "vlm" and vlm is not None:
        schema = f"+req-{vlm.structured_outputs}" if vlm.json_schema else "+req-free"  # no frames: only the schema form
        caption = (f"audio-caption-vlm-{vlm.model}@{vlm.model_revision}"
                   f"+prompt-{prompt_digest(CAPTION_SYSTEM, AUDIO_CAPTION_PROMPT)}+t{vlm.temperature:g}{schema}")
        fused = (f"av-caption-vlm-{vlm.model}@{vlm.model_revision}+prompt-{prompt_digest(CAPTION_SYSTEM, FUSE_PROMPT)}"
                 f"+t{vlm.temperature:g}{schema}")
    else:
        caption = f"{audio_labels.AUDIO_CAPTION_RULES_VERSION}+{tags}+{language}"
        fused = audio_labels.AV_CAPTION_RULES_VERSION
    return {
        "speech": vad_version,
        "tags": tags,
        "loudness": f"{audio_labels.LOUDNESS_VERSION}@pyloudnorm=={pyloudnorm_version}",
        "language": f"{language}+{vad_version}",  # asked only where the VAD heard speech
        "audio_caption": caption,
        "av_caption": f"{fused}+audio-{caption}+video-{video_caption_version}",
    }


@dataclass
class AudioModels:
    vad: Callable[[], Any]
    transcriber: Callable[[], Any]
    captioner: Callable[[], Any] | None = None
    """The chat-completions client (``audio_annotations.captions: vlm``), or None for the rule-based placeholders."""
    tagger: Callable[[], Any] | None = None
    """The AudioSet tagger (``audio_annotations.tagger``), or None: the rule-based shares only."""
    requests: int = 0
    transcription_failures: list[str] = field(default_factory=list)


def annotate_audio(selected: list[dict], audio_rows: list[dict], video_captions: Mapping[str, str],
                   previous: Any, versions: Callable[[dict, str], RowVersion], settings: AudioAnnotationSettings,
                   models: AudioModels, decode: Callable[[dict], np.ndarray], max_runs: int,
                   log: Callable[[str], None] = lambda _: None, engine: Any = None) -> tuple[list[dict], StepStats]:
    """Rows of every kind for the selected clips whose audio was kept. ``decode(audio_row)`` returns the
    clip's audio as 16 kHz mono float32; ``versions(audio_row, kind)`` each row's version. Clips with
    a kind due go to the engine one by one (model actors on Ray: they keep the VAD loaded)."""
    started = time.perf_counter()
    engine = engine or LocalEngine()
    step = Step(previous, lambda r: (r["clip_id"], r["kind"], r["producer_version"]), max_runs, engine=engine)
    stats = step.stats
    stats.rows_in = len(selected)
    kept_audio = {r["clip_id"]: r for r in audio_rows if r.get("audio_status") == "ok" and r.get("blob_key")}
    tiers = set(settings.caption_tiers) if settings.caption_tiers is not None else None
    written: list[dict] = []
    jobs: list[_AudioJob] = []
    for sel in selected:
        audio = kept_audio.get(sel["clip_id"])
        if audio is None:
            continue
        audio = {**audio, "tier": sel.get("tier")}
        wanted = [k for k in KINDS if not (k in ("audio_caption", "av_caption") and tiers is not None
                                           and sel.get("tier") not in tiers)]
        keys = {k: (sel["clip_id"], k, versions(audio, k).producer) for k in wanted}
        due = step.due((keys[k], versions(audio, k), k) for k in wanted)
        if due:
            kept = {k: step.prior(keys[k]) for k in wanted if k not in due}
            jobs.append(_AudioJob(audio, due, {k: versions(audio, k).producer for k in due},
                                  {k: json.loads(r["value"]) for k, r in kept.items() if r.get("value")},
                                  video_captions.get(sel["clip_id"])))
    count_remote(stats, engine, len(jobs))
    outcomes = engine.map(_AudioKinds(settings, models, decode), jobs, lambda j: j.audio["clip_id"], log, models=True)
    for job, outcome in zip(jobs, outcomes, strict=True):
        clip_id = job.audio["clip_id"]
        if outcome.row is not None:
            stats.model_calls += outcome.row["calls"]
            computed = outcome.row["kinds"]
        else:  # the audio could not be read now (or the worker died): every due kind is retried next run
            computed = {k: ("error", None, outcome.reason, "") for k in job.kinds}
        for kind in job.kinds:
            status, value, reason, model_id = computed[kind]
            failure = TRANSIENT if status == "error" else FINAL if status != "ok" else None
            version = versions(job.audio, kind)
            written.append(step.stamp((clip_id, kind, version.producer),
                                       _row(job.audio, kind, status, value, reason, model_id), version, failure))
            stats.add(f"computed_{kind}")
        log(f"audio annotations {clip_id}: {', '.join(job.kinds)}")
    rows = step.complete(written)
    stats.seconds = time.perf_counter() - started
    return sorted(rows, key=lambda r: (r["clip_id"], r["kind"], r["producer_version"])), stats


@dataclass
class _AudioJob:
    """One clip's kept audio row and the kinds due for it (with the values of those reused)."""
    audio: dict
    kinds: list[str]
    producers: dict[str, str]
    values: dict[str, Any]
    video_caption: str | None


class _AudioKinds:
    """The due kinds of one clip: its audio decoded once, then each kind in order, later kinds
    built on earlier ones (picklable: it may run on a Ray model actor, which keeps the VAD loaded).
    Returns ``kinds``: kind -> (status, value, reason, model id), and the model ``calls`` made."""

    def __init__(self, settings: AudioAnnotationSettings, models: AudioModels, decode: Callable[[dict], np.ndarray]):
        self.settings, self.models, self.decode = settings, models, decode

    def __call__(self, job: _AudioJob) -> dict:
        try:
            samples = self.decode(job.audio)
        except Exception as exc:  # noqa: BLE001 - the blob could not be read now: retried next run
            raise Failure(f"audio unreadable: {exc}", transient=True) from exc
        before = self.models.requests
        values, out = dict(job.values), {}
        captions = {job.audio["clip_id"]: job.video_caption} if job.video_caption else {}
        for kind in job.kinds:
            out[kind] = _compute(kind, samples, len(samples) / RATE, values, job.audio, captions, self.settings,
                                 self.models, job.producers[kind])
            if out[kind][0] == "ok":
                values[kind] = out[kind][1]
        return {"kinds": out, "calls": self.models.requests - before}


class ClipAudioReader:
    """A clip's kept audio blob as 16 kHz mono float32, decoded in the step's sandbox (picklable: on
    a Ray worker the step is that worker's own)."""

    def __init__(self, objects: ObjectStore, step: Any, limits: dict):
        self.objects, self.step, self.limits = objects, step, limits

    def __call__(self, audio: dict) -> np.ndarray:
        from vidassets.derive.latents import blob_spec
        from vidassets.runtime import tasks

        with blob_spec(self.objects, audio["blob_key"], self.step.scratch) as spec:
            found = tasks.read_audio(self.step.sandbox, spec, self.limits, audio.get("duration_s"), RATE)
        if not found.ok:
            raise RuntimeError(found.error or "worker failed")
        return np.asarray(found.value["samples"], dtype=np.float32)


def _compute(kind: str, samples: np.ndarray, duration: float, values: dict[str, Any], audio: dict,
             video_captions: Mapping[str, str], settings: AudioAnnotationSettings, models: AudioModels,
             version: str) -> tuple[str, Any, str | None, str]:
    """(status, value, reason, model id) of one kind; ``values`` holds the kinds computed before."""
    if kind == "speech":
        spans = models.vad().segments(samples)
        models.requests += 1
        return "ok", audio_labels.speech_value(spans, duration), None, version
    spans = (values.get("speech") or {}).get("segments") or []
    if kind == "tags":
        if "speech" not in values:
            return "error", None, "no speech record to build on", version
        value = audio_labels.tags(samples, RATE, spans)
        if models.tagger is not None:
            models.requests += 1
            value["audioset"] = models.tagger()(samples, RATE).value()
        return "ok", value, None, version
    if kind == "loudness":
        return "ok", audio_labels.loudness(samples, RATE), None, version
    if kind == "language":
        if "speech" not in values:
            return "error", None, "no speech record to build on", version
        if not spans:
            return "ok", {"language": None, "reason": "no speech"}, None, version
        speech = np.concatenate([samples[int(a * RATE): int(b * RATE)] for a, b in spans])
        transcriber = models.transcriber()
        if getattr(transcriber, "placeholder", False):
            return "ok", {"language": None, "placeholder": "no transcription endpoint configured"}, None, version
        models.requests += 1
        found = transcriber(speech, RATE)
        if not found.ok:
            return "error", None, found.error, version
        return "ok", {"language": found.language, "text": found.text}, None, version
    if kind == "audio_caption":
        if models.captioner is None:
            if not all(k in values for k in ("tags", "loudness", "language")):
                return "error", None, "tags, loudness or language missing", version
            text = audio_labels.rule_audio_caption(values["tags"], values["loudness"], values["language"].get("language"))
            return "ok", {"caption": text}, None, version
        return _ask(models, AUDIO_CAPTION_PROMPT, samples, version)
    if kind == "av_caption":
        audio_caption = (values.get("audio_caption") or {}).get("caption")
        video_caption = video_captions.get(audio["clip_id"])
        if audio_caption is None:
            return "error", None, "no audio caption to join", version
        if models.captioner is None or not video_caption:
            return "ok", {"caption": audio_labels.join_captions(video_caption, audio_caption),
                          "has_video_caption": bool(video_caption)}, None, version
        return _ask(models, FUSE_PROMPT.format(video=video_caption, audio=audio_caption), None, version)
    raise ValueError(f"unknown audio annotation kind {kind!r}")


def _ask(models: AudioModels, prompt: str, samples: np.ndarray | None, version: str) -> tuple[str, Any, str | None, str]:
    from vidassets.models.transcriber import wav_bytes
    from vidassets.models.vlm import VlmRequest

    request = VlmRequest("audio_caption", CAPTION_SYSTEM, prompt, [], [], CAPTION_SCHEMA,
                         audio_wav=wav_bytes(samples, RATE) if samples is not None else None)
    models.requests += 1
    reply = models.captioner().complete(request)
    if reply.error:
        return "error", None, reply.error, version
    if not reply.ok or not isinstance(reply.value, dict) or not str(reply.value.get("caption") or "").strip():
        return "invalid", None, reply.invalid or f"no caption in reply: {str(reply.raw)[:120]!r}", version
    return "ok", {"caption": str(reply.value["caption"]).strip()}, None, version


def _row(audio: dict, kind: str, status: str, value: Any, reason: str | None, model_id: str) -> dict:
    return {"clip_id": audio["clip_id"], "asset_id": audio["asset_id"], "source_shard": audio["source_shard"],
            "tier": audio.get("tier"), "kind": kind, "status": status, "reason": reason,
            "value": json.dumps(value, sort_keys=True) if value is not None else None, "model_id": model_id,
            "seconds": None}
