"""The curriculum part of a recipe (no Dagster): which stream each sample belongs to, the mixture of
streams in each training phase, which caption level a sample shows in each epoch, and the limits the
realized-stream monitor holds a plan to.

A *stream* is an expression over what a sample is: its selection tier, source tier, modality (video,
or image: a 1-frame sample), semantic cluster group, duration and audio fields; the first stream
whose conditions all hold names the sample's stream, a sample matching none keeps its source tier.
A *phase* runs until a step (the last one to the end of training) with its own mixture (stream ->
weight), the tiers it admits and how many epochs a stream may repeat in it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LEVELS = ("level_0", "level_1", "level_2", "level_3")
Level = Literal["level_0", "level_1", "level_2", "level_3"]
AudioTag = Literal["speech", "music", "ambience", "silence"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Stream(BaseModel):
    """A named stream: every condition given must hold (unset = any)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    tiers: list[str] | None = None
    """The sample's selection tier (T0, T1, ...) is one of these."""
    source_tiers: list[str] | None = None
    modality: Literal["video", "image"] | None = None
    cluster_groups: list[str] | None = None
    """The sample's semantic cluster belongs to one of these groups (``curriculum.cluster_groups``)."""
    min_duration_s: float | None = Field(default=None, ge=0)
    max_duration_s: float | None = Field(default=None, gt=0)
    min_speech_share: float | None = Field(default=None, ge=0, le=1)
    max_speech_share: float | None = Field(default=None, ge=0, le=1)
    audio_tags: list[AudioTag] | None = None
    """The clip's dominant audio tag is one of these."""
    languages: list[str] | None = None
    """The detected spoken language is one of these (ISO codes as the transcription server names them)."""

    def admits(self, sample: Mapping[str, Any]) -> bool:
        def within(value: Any, low: float | None, high: float | None) -> bool:
            if low is None and high is None:
                return True
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return False
            return (low is None or value >= low) and (high is None or value <= high)

        for field, wanted in (("tier", self.tiers), ("source_tier", self.source_tiers),
                              ("cluster_group", self.cluster_groups), ("audio_tag", self.audio_tags),
                              ("language", self.languages)):
            if wanted is not None and sample.get(field) not in wanted:
                return False
        if self.modality is not None and (sample.get("modality") or "video") != self.modality:
            return False
        return (within(sample.get("duration_s"), self.min_duration_s, self.max_duration_s)
                and within(sample.get("speech_share"), self.min_speech_share, self.max_speech_share))


class Phase(_Strict):
    name: str = Field(min_length=1)
    until_step: int | None = Field(default=None, ge=1)
    """The first step of the next phase; null only for the last phase (it runs to the end)."""
    mixture: dict[str, float] = {}
    """Stream -> weight (shares of every global batch, over the phase); empty = proportional to each
    stream's sample count among the samples the phase admits."""
    tiers: list[str] | None = None
    """Selection tiers whose samples this phase may serve (null = all): tiers gate phases."""
    max_epochs: dict[str, float] = {}
    """Stream -> epochs it may repeat within this phase (the plan's check fails beyond)."""
    resolution: int | None = Field(default=None, ge=16)
    """The latents short side this phase trains at (one of ``latents.resolutions``; low first, as
    video DiTs train in resolution phases); null = each sample's first configured resolution."""

    @model_validator(mode="after")
    def _weights(self) -> Phase:
        bad = {k: v for k, v in self.mixture.items() if not (v >= 0 and math.isfinite(v))}
        if bad:
            raise ValueError(f"phase {self.name!r}: mixture weights must be finite and >= 0, not {bad}")
        if self.mixture and not sum(self.mixture.values()) > 0:
            raise ValueError(f"phase {self.name!r}: mixture weights sum to 0")
        return self


class Monitor(_Strict):
    """What the realized-stream monitor reports over a window of steps, and where it fails a plan."""

    window_steps: int = Field(default=200, ge=2)
    max_lags: int = Field(default=4, ge=1)
    """Lags k = 1..max_lags of the autocorrelation reported."""
    max_autocorrelation: float = Field(default=0.5, gt=0, le=1)
    """Largest |lag-k autocorrelation| of stream, cluster or source asset ids along the sample
    sequence allowed (0 = independent draws, 1 = long runs of one value), measured beyond what the
    shape buckets force (a bucket holding one source makes its batches one source by necessity)."""
    max_repeats_in_window: int = Field(default=1, ge=0)
    """Times one clip may appear inside the window beyond what its stream's size forces (the passes
    the window makes over the clip's queue, rounded up)."""
    share_tolerance: float = Field(default=0.02, ge=0, le=1)
    """Largest gap between a stream's realized share in the window and its phase weight."""


class Curriculum(_Strict):
    streams: list[Stream] = []
    """First match names a sample's stream; samples matching none keep their source tier."""
    cluster_groups: dict[str, list[int]] = {}
    """Group name -> semantic cluster ids (of ``clip_clusters``); clusters in no group are ``other``."""
    cluster_targets: dict[str, float] = {}
    """Target share per cluster group for the coverage report (normalised); empty = uniform over clusters."""
    phases: list[Phase] = []
    """In order; empty = one phase, mixture proportional to sample counts, every tier."""
    caption_variants: dict[Level, float] = {}
    """Caption level -> weight: the level a sample shows is drawn per (sample, epoch); empty = always
    the recipe's ``captions.level``."""
    monitor: Monitor = Monitor()

    @model_validator(mode="after")
    def _phases(self) -> Curriculum:
        names = [s.name for s in self.streams]
        if len(set(names)) != len(names):
            raise ValueError(f"stream names must be unique: {names}")
        if len({p.name for p in self.phases}) != len(self.phases):
            raise ValueError("phase names must be unique")
        bounds = [p.until_step for p in self.phases]
        if any(b is None for b in bounds[:-1]):
            raise ValueError("every phase but the last needs until_step")
        given = [b for b in bounds if b is not None]
        if given != sorted(set(given)):
            raise ValueError(f"phases' until_step must increase: {bounds}")
        if any(w < 0 for w in self.caption_variants.values()) or (self.caption_variants and
                                                                  not sum(self.caption_variants.values()) > 0):
            raise ValueError("caption_variants weights must be >= 0 and not all 0")
        known = set(self.cluster_groups)
        for s in self.streams:
            unknown = sorted(set(s.cluster_groups or []) - known - {"other"})
            if unknown:
                raise ValueError(f"stream {s.name!r} names cluster group(s) {unknown} not in cluster_groups")
        return self

    def caption_levels(self, default: str) -> list[str]:
        """Levels a sample may show (the ones ``text_embeddings`` encodes), ``default`` first."""
        chosen = [lv for lv in LEVELS if self.caption_variants.get(lv, 0) > 0]
        return [default, *[lv for lv in chosen if lv != default]]


def cluster_group(cluster: Any, groups: Mapping[str, Sequence[int]]) -> str | None:
    """The group a cluster id belongs to (``other`` when none lists it; None without a cluster)."""
    try:
        cluster = int(cluster)
    except (TypeError, ValueError):  # None, NaN, pandas' NA: the sample has no cluster (yet)
        return None
    return next((name for name, ids in groups.items() if cluster in ids), "other")


def stream_of(sample: Mapping[str, Any], streams: Sequence[Stream]) -> str:
    return next((s.name for s in streams if s.admits(sample)), str(sample.get("source_tier")))


def caption_level(seed: int, clip_id: str, epoch: int, variants: Mapping[str, float], default: str) -> str:
    """The caption level a sample shows in an epoch: drawn with the variant weights from a hash of
    (seed, clip, epoch), so it is the same on every rank and on every resume."""
    if not variants:
        return default
    levels = [lv for lv in LEVELS if variants.get(lv, 0) > 0]
    u = int.from_bytes(hashlib.sha256(f"{seed}\x00{clip_id}\x00{epoch}".encode()).digest()[:8], "little") / 2**64
    total = sum(variants[lv] for lv in levels)
    acc = 0.0
    for lv in levels:
        acc += variants[lv] / total
        if u < acc:
            return lv
    return levels[-1]
