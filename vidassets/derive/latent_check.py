"""The latent-statistics check (no Dagster): every cohort of latents — the rows one encode run wrote
under one VAE version — is compared per channel with that version's reference, so a stale or
wrong checkpoint (weights that do not belong to the version's config, a bad conversion, a dtype
that overflows) is caught before a training run reads it.

The reference of a version is what its checkpoint declares (``latents_mean`` / ``latents_std`` in
the diffusers config of real weights, the statistics a trainer normalises latents with) or, where
nothing is declared (the random-init placeholder), the first cohort of that version with enough
clips, frozen once under ``checks/latent_reference/``. A cohort fails when a channel's mean moves
more than ``max_shift`` reference standard deviations, a channel's spread differs from the
reference by more than the factor ``max_std_ratio``, or any value is NaN/Inf.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from vidassets.storage.objects import ObjectStore
from vidassets.storage.rows import current_rows

REFERENCES = "checks/latent_reference"


def declared_reference(vae_class: str | None, vae_path: str | None) -> dict[str, Any] | None:
    """What a real checkpoint's normalised latents should look like per channel: a VAE whose
    pipeline normalises with per-channel statistics (Wan: (z - mean) / std; LTX-Video: times its
    scaling factor too) stores latents of mean 0 and std 1 (LTX: the scaling factor) per channel.
    None for the placeholder and for scale-only normalisations (no per-channel statistics)."""
    from vidassets.models.vae import CLASS_DEFAULTS, declared_config, normalisation_name, resolve_class

    if not vae_path:
        return None
    cls = resolve_class(vae_class, vae_path)
    config = declared_config(vae_path)
    name = normalisation_name(cls, config)
    if name not in ("meanstd", "meanstd-scale"):
        return None
    channels = len(config.get("latents_mean") or []) or int(
        config.get("z_dim") or config.get("latent_channels") or CLASS_DEFAULTS[cls].get("z_dim", 128))
    scale = float(config.get("scaling_factor", 1.0)) if name == "meanstd-scale" else 1.0
    return {"source": f"the checkpoint's {name} normalisation: mean 0, std {scale:g} a channel",
            "channel_mean": [0.0] * channels, "channel_std": [scale] * channels}


def cohorts(latents: pd.DataFrame, version: str) -> dict[str, dict[str, Any]]:
    """Per encode run of ``version``: clips, the mean over clips of each channel's mean, the root
    mean square of each channel's spread (within-clip std and between-clip spread of the means),
    NaN/Inf counts and the drops it covers."""
    if not len(latents) or "channel_mean" not in latents:
        return {}
    rows = current_rows(latents, version)
    rows = rows[rows.channel_mean.notna()]
    out = {}
    for run, group in rows.groupby(rows.encode_run.fillna("unknown")):
        means = np.array([json.loads(v) for v in group.channel_mean], dtype=float)
        stds = np.array([json.loads(v) for v in group.channel_std], dtype=float)
        spread = np.sqrt(np.nanmean(stds ** 2, axis=0) + np.nanvar(means, axis=0))
        out[str(run)] = {"clips": len(group), "channel_mean": np.nanmean(means, axis=0).round(6).tolist(),
                         "channel_std": spread.round(6).tolist(),
                         "nan_or_inf": int(group.nan_count.fillna(0).sum() + group.inf_count.fillna(0).sum()),
                         "drops": sorted(set(group.source_shard)), "clip_ids": sorted(group.clip_id)[:5]}
    return out


def reference(objects: ObjectStore, version: str, declared: dict[str, Any] | None,
              found: dict[str, dict[str, Any]], min_clips: int) -> dict[str, Any] | None:
    """The version's reference: declared, else the frozen first cohort (frozen now from the
    earliest-named cohort with ``min_clips`` if there is none yet)."""
    if declared is not None:
        return declared
    key = f"{REFERENCES}/{hashlib.sha256(version.encode()).hexdigest()[:24]}.json"
    if objects.exists(key):
        return json.loads(objects.get_bytes(key))
    ready = [(run, c) for run, c in sorted(found.items()) if c["clips"] >= min_clips and not c["nan_or_inf"]]
    if not ready:
        return None
    run, first = ready[0]
    frozen = {"source": f"first cohort of the version (encode run {run}, {first['clips']} clips)", "version": version,
              "channel_mean": first["channel_mean"], "channel_std": first["channel_std"]}
    objects.put_if_absent(key, json.dumps(frozen, indent=1).encode())
    return json.loads(objects.get_bytes(key))


def judge(cohort: dict[str, Any], ref: dict[str, Any], max_shift: float, max_std_ratio: float) -> list[str]:
    """What is wrong with a cohort against the reference (empty: it passes)."""
    problems = []
    if cohort["nan_or_inf"]:
        problems.append(f"{cohort['nan_or_inf']} NaN/Inf values")
    mean, std = np.array(cohort["channel_mean"]), np.array(cohort["channel_std"])
    ref_mean, ref_std = np.array(ref["channel_mean"]), np.array(ref["channel_std"])
    if mean.shape != ref_mean.shape:
        return [*problems, f"{len(mean)} latent channels, the reference has {len(ref_mean)}"]
    shift = np.abs(mean - ref_mean) / np.maximum(ref_std, 1e-6)
    ratio = np.maximum(std, 1e-9) / np.maximum(ref_std, 1e-9)
    for c in np.flatnonzero(shift > max_shift):
        problems.append(f"channel {c} mean {mean[c]:+.3f} is {shift[c]:.1f} reference std from {ref_mean[c]:+.3f}")
    for c in np.flatnonzero((ratio > max_std_ratio) | (ratio < 1 / max_std_ratio)):
        problems.append(f"channel {c} spread {std[c]:.3f} is {ratio[c]:.2f}x the reference {ref_std[c]:.3f}")
    return problems


def check(objects: ObjectStore, latents: pd.DataFrame, version: str, vae_class: str | None, vae_path: str | None,
          max_shift: float, max_std_ratio: float, min_clips: int) -> dict[str, Any]:
    """Every cohort of ``version`` judged; ``failed`` names each bad cohort (its encode run, drops,
    clips) with its problems."""
    found = cohorts(latents, version)
    ref = reference(objects, version, declared_reference(vae_class, vae_path), found, min_clips)
    judged, failed = {}, {}
    for run, cohort in found.items():
        if ref is None or (cohort["clips"] < min_clips and not cohort["nan_or_inf"]):
            judged[run] = "too few clips to judge" if ref is not None else "no reference yet"
            continue
        problems = judge(cohort, ref, max_shift, max_std_ratio)
        judged[run] = "ok" if not problems else "failed"
        if problems:
            failed[run] = {"drops": cohort["drops"], "clips": cohort["clips"], "examples": cohort["clip_ids"],
                           "problems": problems}
    return {"cohorts": judged, "failed": failed, "reference": None if ref is None else ref["source"],
            "channels": None if ref is None else len(ref["channel_mean"]),
            "max_shift": max_shift if math.isfinite(max_shift) else None}
