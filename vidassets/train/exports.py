"""A snapshot exported for the trainers users run (no Dagster). Each export is a directory its
trainer's own dataset class reads as it stands; beside it, ``<name>.json`` says which snapshot,
caption level and files it holds, and every sample left out with the reason.

- **V-JEPA 2** (``vjepa_videos.csv``): ``VideoDataset`` in facebookresearch/vjepa2
  ``src/datasets/video_dataset.py`` reads ``pd.read_csv(path, header=None, delimiter=" ")``: a
  local video file per line and an integer label (here the sample's stream).
- **DiffSynth-Studio** (``metadata.csv``): the Wan / DiT fine-tuning scripts' ``UnifiedDataset``
  (``diffsynth/core/data/unified_dataset.py``) reads ``pandas.read_csv`` with a ``video`` column
  (joined to ``--dataset_base_path``) and a ``prompt`` column; other columns pass through to the
  sample. The video is a file holding exactly the clip (a ladder rung); the trainer decodes and
  resizes it.
- **NeMo AutoModel** (a latent cache): ``TextToVideoDataset``
  (``nemo_automodel/components/datasets/diffusion/text_to_video_dataset.py``) reads
  ``metadata.json`` (``{"shards": [...]}``), each shard a JSON list of items with ``cache_file``,
  ``bucket_resolution`` (width, height) and ``aspect_ratio``; each cache file is a ``torch.save``
  dict holding ``video_latents`` (1, C, T, H, W) and ``text_embeddings`` (1, L, D), with
  ``text_mask`` (1, L). The latents are the snapshot's own (the VAE's normalised latents, as the
  trainer's preprocessing would write them); the text is the caption's per-token states padded to
  the encoder's length, as Wan's pipeline hands them to its transformer. No video is decoded or
  encoded again.

Video files are copied from the store into ``clips/`` (a hard link when the store is on the same
disk), so every export works from any store, S3 included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from vidassets.derive.latents import bucket_shape, load_latents
from vidassets.derive.text_embeddings import load_states
from vidassets.models.text_encoder import padded_states
from vidassets.storage.objects import ObjectStore
from vidassets.storage.tables import TableStore
from vidassets.train.shards import text_states_for
from vidassets.train.snapshot import samples_at_resolutions

VJEPA_LIST = "vjepa_videos.csv"
DIFFSYNTH_METADATA = "metadata.csv"
NEMO_METADATA = "metadata.json"
NEMO_SHARD_ITEMS = 10_000
"""Items per NeMo metadata shard file."""


def ok_rungs(ladder: pd.DataFrame, short_side: int | None = None) -> dict[str, str]:
    """clip_id -> the blob key of its ladder rung: with ``short_side``, the smallest ok rung at least
    that tall (else its largest); without, the smallest (a file holding exactly the clip)."""
    if not len(ladder):
        return {}
    ok = ladder[ladder.status == "ok"].sort_values(["short_side", "rung"])
    chosen: dict[str, str] = {}
    for clip_id, rungs in ok.groupby("clip_id", sort=False):
        if short_side is None:
            chosen[clip_id] = rungs.blob_key.iloc[0]
        else:
            tall = rungs[rungs.short_side >= short_side]
            chosen[clip_id] = (tall if len(tall) else rungs).blob_key.iloc[0 if len(tall) else -1]
    return chosen


class LocalCopies:
    """Store blobs as files under ``directory/clips/``: a hard link when the store is a local disk
    and the same file system, else a copy."""

    def __init__(self, objects: ObjectStore, directory: Path):
        self.objects = objects
        self.clips = directory.absolute() / "clips"
        self.clips.mkdir(parents=True, exist_ok=True)

    def __call__(self, blob_key: str) -> str:
        target = self.clips / Path(blob_key).name
        if not target.exists():
            source = self.objects.local_path(blob_key)
            try:
                if source is None:
                    raise OSError("not local")
                os.link(source, target)
            except OSError:
                target.write_bytes(self.objects.get_bytes(blob_key))
        return str(target)


def caption_of(sample: Any) -> str | None:
    """The caption text a sample shows: its ``caption_level`` of ``captions``."""
    captions = json.loads(sample.captions) if isinstance(sample.captions, str) else {}
    return captions.get(sample.caption_level) or None


def _video_files(samples: pd.DataFrame, rung: Mapping[str, str],
                 local_path: Callable[[str], str | None]) -> tuple[list[tuple[Any, str]], dict[str, str]]:
    """(sample, local file) of every video sample with a rung on local disk, and the others with why."""
    out, skipped = [], {}
    for s in samples.itertuples():
        if getattr(s, "modality", "video") == "image":
            skipped[s.clip_id] = "a still image (the export lists video files; images train from the shards)"
        elif s.clip_id not in rung:
            skipped[s.clip_id] = "no ok ladder rung (the export needs a file holding exactly the clip)"
        elif (path := local_path(rung[s.clip_id])) is None:
            skipped[s.clip_id] = "rung not on local disk: export it with `vidassets export <trainer> --to DIR`"
        else:
            out.append((s, path))
    return out, skipped


# ---------------------------------------------------------------- V-JEPA 2

def vjepa_list(samples: pd.DataFrame, ladder: pd.DataFrame, local_path: Callable[[str], str | None],
               streams: list[str]) -> tuple[pd.DataFrame, dict[str, str]]:
    """The V-JEPA 2 video list: each sample's smallest ok ladder rung and its stream's index.
    ``local_path(blob_key)`` gives the rung's local file, or None. Returns (path, label, clip_id)
    rows and the samples left out with the reason (also: whitespace in the path, which that reader
    would split)."""
    files, skipped = _video_files(samples, ok_rungs(ladder), local_path)
    rows = []
    for s, path in files:
        if any(c.isspace() for c in path):
            skipped[s.clip_id] = f"whitespace in {path!r} (the reader splits lines on spaces)"
        else:
            rows.append({"path": path, "label": streams.index(s.stream), "clip_id": s.clip_id})
    return pd.DataFrame(rows, columns=["path", "label", "clip_id"]), skipped


def write_vjepa_list(entries: pd.DataFrame, skipped: Mapping[str, str], streams: list[str], directory: Path) -> None:
    """``vjepa_videos.csv`` in the reader's format (``path label``, space-separated, no header) and
    ``vjepa_videos.json`` beside it: label -> stream, the clip of every line, what was left out."""
    lines = "".join(f"{r.path} {int(r.label)}\n" for r in entries.itertuples())
    (directory / VJEPA_LIST).write_text(lines)
    legend = {"labels": dict(enumerate(streams)), "clip_ids": list(entries.clip_id), "skipped": dict(skipped)}
    (directory / "vjepa_videos.json").write_text(json.dumps(legend, indent=1))


def export_vjepa(tables: TableStore, samples: pd.DataFrame, version: int, directory: Path) -> dict:
    """Every sample's smallest rung in ``directory/clips/`` and the V-JEPA 2 list of those files."""
    streams = sorted(samples.stream.unique())
    entries, skipped = vjepa_list(samples, tables.read_all("clip_ladder"), LocalCopies(tables.objects, directory), streams)
    write_vjepa_list(entries, skipped, streams, directory.absolute())
    return {"snapshot": version, "samples": len(entries), "skipped": len(skipped),
            "list": str(directory.absolute() / VJEPA_LIST)}


# ---------------------------------------------------------------- DiffSynth-Studio (Wan and other DiTs)

def export_diffsynth(tables: TableStore, samples: pd.DataFrame, version: int, directory: Path,
                     short_side: int | None = None) -> dict:
    """``directory/metadata.csv`` (``video`` relative to ``directory``, ``prompt``, then clip_id,
    stream and tier) and the rung files in ``directory/clips/``: by default each clip's largest
    rung (the trainer resizes down), with ``short_side`` the smallest at least that tall."""
    directory = directory.absolute()
    ladder = tables.read_all("clip_ladder")
    if short_side is None and len(ladder):
        short_side = int(ladder.short_side.max())
    files, skipped = _video_files(samples, ok_rungs(ladder, short_side), LocalCopies(tables.objects, directory))
    rows = []
    for s, path in files:
        prompt = caption_of(s)
        if prompt is None:
            skipped[s.clip_id] = f"no {s.caption_level} caption (the trainer needs a prompt)"
            continue
        rows.append({"video": Path(path).relative_to(directory).as_posix(), "prompt": prompt, "clip_id": s.clip_id,
                     "stream": s.stream, "tier": s.tier})
    frame = pd.DataFrame(rows, columns=["video", "prompt", "clip_id", "stream", "tier"])
    frame.to_csv(directory / DIFFSYNTH_METADATA, index=False)
    legend = _legend(samples, version, "diffsynth", len(frame), skipped, short_side=short_side)
    (directory / "diffsynth.json").write_text(json.dumps(legend, indent=1))
    return {**{k: legend[k] for k in ("snapshot", "samples", "skipped")},
            "metadata": str(directory / DIFFSYNTH_METADATA),
            "train_with": f"--dataset_base_path {directory} --dataset_metadata_path {directory / DIFFSYNTH_METADATA}"}


# ---------------------------------------------------------------- NeMo AutoModel (latent cache)

def export_nemo(tables: TableStore, samples: pd.DataFrame, version: int, directory: Path,
                model_type: str = "wan", resolution: int | None = None) -> dict:
    """A NeMo AutoModel latent cache of the snapshot: ``directory/metadata.json``, its shard lists,
    and one ``<W>x<H>/<clip>.meta`` per sample (its latents at ``resolution``, default each sample's
    primary one, and caption token states). Samples whose caption has no per-token states (a pooled
    text encoder), or no latents at ``resolution``, are left out with the reason."""
    import torch

    at = samples_at_resolutions(samples)
    at = at[at.primary.astype(bool)] if resolution is None else at[at.resolution == resolution]
    skipped = {c: f"no latents at resolution {resolution}" for c in sorted(set(samples.clip_id) - set(at.clip_id))}
    samples = at
    directory = directory.absolute()
    directory.mkdir(parents=True, exist_ok=True)
    objects = tables.objects
    levels = sorted(samples.caption_level.dropna().unique())
    states = text_states_for(tables.read_all("text_embeddings"), samples, levels)
    items = []
    for s in samples.itertuples():
        prompt, key = caption_of(s), states.get(s.clip_id, {}).get(s.caption_level)
        if prompt is None:
            skipped[s.clip_id] = f"no {s.caption_level} caption"
            continue
        if key is None:
            skipped[s.clip_id] = ("no per-token text states (a DiT trainer takes the encoder's token states: "
                                  "set text_embeddings to a T5/umT5 model)")
            continue
        latents, _ = load_latents(objects, s.latent_key)
        tokens, max_tokens = load_states(objects, key)
        padded, mask = padded_states(tokens, max_tokens)
        frames, width, height = bucket_shape(s.bucket)
        cache_file = directory / f"{width}x{height}" / f"{s.clip_id}.meta"
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"video_latents": latents.unsqueeze(0), "text_embeddings": padded.unsqueeze(0),
                    "text_mask": mask.unsqueeze(0).to(torch.int64), "bucket_resolution": (width, height),
                    "aspect_ratio": round(width / height, 4), "num_frames": frames, "prompt": prompt,
                    "model_type": model_type, "model_version": s.latent_version, "clip_id": s.clip_id}, cache_file)
        items.append({"cache_file": str(cache_file), "bucket_resolution": [width, height],
                      "aspect_ratio": round(width / height, 4), "num_frames": frames, "prompt": prompt,
                      "clip_id": s.clip_id, "stream": s.stream, "tier": s.tier, "source_uri": s.source_uri})
    shards = []
    for n, start in enumerate(range(0, len(items), NEMO_SHARD_ITEMS)):
        name = f"metadata_shard_{n:04d}.json"
        (directory / name).write_text(json.dumps(items[start:start + NEMO_SHARD_ITEMS], indent=1))
        shards.append(name)
    legend = _legend(samples, version, "nemo", len(items), skipped, model_type=model_type, resolution=resolution)
    (directory / NEMO_METADATA).write_text(json.dumps({"shards": shards, "vidassets": legend}, indent=1))
    return {**{k: legend[k] for k in ("snapshot", "samples", "skipped")}, "metadata": str(directory / NEMO_METADATA)}


def _legend(samples: pd.DataFrame, version: int, trainer: str, written: int, skipped: Mapping[str, str],
            **settings: Any) -> dict:
    return {"snapshot": version, "trainer": trainer, "samples": written, "skipped": len(skipped),
            "caption_version": next(iter(samples.caption_version), None),
            "caption_level": next(iter(samples.caption_level), None),
            **settings, "skipped_samples": dict(skipped)}
