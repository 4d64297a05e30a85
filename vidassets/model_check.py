"""``vidassets models check``: every model the settings configure, loaded once and run once on a tiny
input, before a pipeline run finds a missing file or a wrong layout hours in.

A *slot* is one place the pipeline uses a model (``scores.text``, ``latents.vae``, ...): the
registry kind and arguments its settings name, and the setting that names its weights. Each slot is
built through the same ``ModelRegistry.get`` the stages use, so the version printed is the version
rows get. A slot fails on a missing file, a layout its loader refuses, or a model placed on a GPU
that runs on the CPU (an ONNX session without the CUDA provider, torch weights left on the CPU).
Endpoint slots (the VLM, the transcription server) are listed with their URL; they are not called."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vidassets.config import Settings


@dataclass(frozen=True)
class Slot:
    name: str
    kind: str
    args: tuple
    field: str
    """The setting that names its weights (what an error points at)."""


@dataclass
class SlotCheck:
    slot: str
    kind: str
    ok: bool
    version: str | None = None
    weights: str | None = None
    device: str | None = None
    dtype: str | None = None
    provider: str | None = None
    forward_ms: float | None = None
    error: str | None = None


def configured_slots(settings: Settings) -> list[Slot]:
    """Every model slot ``settings`` configure, in pipeline order (the kinds and arguments the
    stages ask the registry for, from the same functions)."""
    from vidassets.curate.embeddings import embedder_kind
    from vidassets.curate.scores import model_kinds
    from vidassets.derive.audio_annotations import tagger_model, whisper_model
    from vidassets.derive.latents import vae_model
    from vidassets.derive.text_embeddings import encoder_model
    from vidassets.media.analysis import MODEL_DETECTORS

    s = settings
    slots = []
    if s.analysis.detector in MODEL_DETECTORS:
        slots.append(Slot("analysis.shots", "transnetv2", (), "analysis.detector"))
    for name, (kind, *args) in model_kinds(s.scores).items():
        slots.append(Slot(f"scores.{name}", kind, tuple(args), "scores.aesthetic_head" if name == "quality" else "scores"))
    kind, *args = embedder_kind(s.embeddings.model, s.embeddings.weights, s.embeddings.video_frames)
    slots.append(Slot("embeddings", kind, tuple(args), "embeddings.weights"))
    kind, *args = vae_model(s.latents)
    slots.append(Slot("latents.vae", kind, tuple(args), "latents.vae_path"))
    kind, args = encoder_model(s.text_embeddings)
    slots.append(Slot("text_embeddings", kind, args, "text_embeddings.model_path"))
    slots.append(Slot("audio_annotations.vad", "silero-vad", (s.audio_annotations.vad_threshold,),
                      "audio_annotations.vad_threshold"))
    for name, found in (("tagger", tagger_model(s.audio_annotations)), ("whisper", whisper_model(s.audio_annotations))):
        if found:
            slots.append(Slot(f"audio_annotations.{name}", found[0], tuple(found[1:]), f"audio_annotations.{name}.model_dir"))
    return slots


def endpoints(settings: Settings) -> list[tuple[str, str, str]]:
    """(slot, URL, model) of the configured model servers (listed, not called)."""
    out = []
    if settings.annotations.vlm is not None:
        out.append(("annotations.vlm", settings.annotations.vlm.endpoint, settings.annotations.vlm.model))
    if settings.caption_qc.judge is not None:
        out.append(("caption_qc.judge", settings.caption_qc.judge.endpoint, settings.caption_qc.judge.model))
    if settings.audio_annotations.transcription is not None:
        t = settings.audio_annotations.transcription
        out.append(("audio_annotations.transcription", t.endpoint, t.model))
    return out


def check_models(settings: Settings, registry: Any) -> list[SlotCheck]:
    """Each slot built once through ``registry`` and run once on a tiny input."""
    return [check_slot(slot, registry) for slot in configured_slots(settings)]


def check_slot(slot: Slot, registry: Any) -> SlotCheck:
    from vidassets.models.registry import KINDS

    result = SlotCheck(slot.name, slot.kind, ok=False)
    try:
        result.version = registry.version(slot.kind, *slot.args)
        result.weights = next((p[1:] for p in result.version.split("+") if p.startswith("w")), None)
        model = registry.get(slot.kind, *slot.args)
        placement = model.placement
        result.device, result.dtype = placement.device, placement.dtype
        result.provider = _provider(model, KINDS[slot.kind].onnx)
        started = time.perf_counter()
        PROBES.get(slot.kind, _frames_probe)(model)
        result.forward_ms = round((time.perf_counter() - started) * 1000, 1)
        if placement.cuda and result.provider not in ("CUDAExecutionProvider", "torch:cuda"):
            raise RuntimeError(f"placed on {placement.device} but runs on {result.provider}")
        result.ok = True
    except Exception as exc:  # a check reports every slot, then fails: one bad slot never hides the next
        result.error = f"{slot.field}: {type(exc).__name__}: {exc}"
    return result


def _provider(model: Any, onnx: bool) -> str:
    """Where the model computes: its ONNX session's first provider, or the device of its torch weights."""
    if onnx:
        session = getattr(model, "session", None)
        return session.get_providers()[0] if session is not None else "onnx:unknown"
    devices = {p.device.type for m in _torch_modules(model) for p in m.parameters()}
    if not devices:
        return "cpu (no torch weights)"
    return "torch:" + ("cuda" if devices == {"cuda"} else "+".join(sorted(devices)))


def _torch_modules(model: Any) -> list:
    import torch

    found, seen = [], set()
    stack = [model]
    while stack:  # the wrapper's modules, one or two attributes deep (a wrapper may hold a wrapper)
        obj = stack.pop()
        for value in getattr(obj, "__dict__", {}).values():
            if isinstance(value, torch.nn.Module) and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
            elif hasattr(value, "__dict__") and type(value).__module__.startswith("vidassets.models") and id(value) not in seen:
                seen.add(id(value))
                stack.append(value)
    return found


def _probe_frames(n: int = 2, size: int = 64) -> list[np.ndarray]:
    """Tiny deterministic RGB frames: a colour gradient with edges (every frame model accepts it)."""
    y, x = np.mgrid[0:size, 0:size]
    frame = np.stack([x * 4 % 256, y * 4 % 256, (x + y) * 2 % 256], axis=-1).astype(np.uint8)
    return [np.roll(frame, i * 3, axis=1) for i in range(n)]


def _probe_audio(seconds: float = 1.0, rate: int = 16000) -> np.ndarray:
    """A second of a 440 Hz tone with a little noise."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.01 * np.random.default_rng(0).standard_normal(len(t))).astype(np.float32)


def _frames_probe(model: Any) -> None:
    model(_probe_frames())


def _vae_probe(model: Any) -> None:
    frames = getattr(model, "temporal_compression", 4) + 1
    side = max(32, getattr(model, "spatial_compression", 8) * 2)
    clip = np.stack([f[:side, :side] for f in _probe_frames(frames, side)])
    model.encode(clip)


PROBES: dict[str, Callable[[Any], None]] = {
    "transnetv2": lambda m: m(np.zeros((10, 27, 48, 3), np.uint8)),
    "vae": _vae_probe,
    "sentence-transformer": lambda m: m(["a person rides a bike down a hill"]),
    "t5-tokens": lambda m: m.token_states(["a person rides a bike down a hill"]),
    "silero-vad": lambda m: m.probabilities(np.zeros(16000, np.float32)),
    "ast-audioset": lambda m: m(_probe_audio(), 16000),
    "whisper": lambda m: m(_probe_audio(), 16000),
}
"""A tiny forward per kind; a kind not named runs on two small frames."""


def render(checks: list[SlotCheck], servers: list[tuple[str, str, str]]) -> str:
    lines = [f"{'slot':<24} {'ok':<4} {'weights':<12} {'device':<7} {'dtype':<5} {'provider':<22} {'ms':>7}  version"]
    for c in checks:
        lines.append(f"{c.slot:<24} {'ok' if c.ok else 'FAIL':<4} {c.weights or '-':<12} {c.device or '-':<7} "
                     f"{c.dtype or '-':<5} {c.provider or '-':<22} {c.forward_ms if c.forward_ms is not None else '-':>7}"
                     f"  {c.version or '-'}{'  (PLACEHOLDER)' if c.version and 'random-init' in c.version else ''}")
        if c.error:
            lines.append(f"    error: {c.error}")
    for slot, url, model in servers:
        lines.append(f"{slot:<30} {'srv':<4} endpoint {url} model {model} (not called)")
    return "\n".join(lines)


def as_json(checks: list[SlotCheck], servers: list[tuple[str, str, str]]) -> dict:
    return {"models": [asdict(c) for c in checks],
            "endpoints": [{"slot": s, "endpoint": u, "model": m} for s, u, m in servers]}
