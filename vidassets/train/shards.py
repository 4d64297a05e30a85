"""Training shards for a snapshot: WebDataset tars, one directory per shape bucket (only shape decides
shard membership; the mixture is not baked in), samples scattered pseudo-randomly inside the bucket
with a seed derived from the snapshot version (breaks source locality), each directory prepared for
NVIDIA megatron-energon (its ``.nv-meta`` index, via ``energon prepare``), plus an index Parquet
(clip -> shard, member, byte offset); ``exports`` writes the other trainers' formats.

A sample: ``<key>.latents.npy`` (the stored latents; bf16 travels as its uint16 bit pattern, dtype
named in the json), ``<key>.text.npy`` (caption text embedding, float32), with a per-token text
encoder ``<key>.text_states.npy`` (the caption's own token states, tokens x dim, bf16 as its uint16
bit pattern; ``padded_text_states`` pads them to the encoder's text length with the mask, as Wan's
pipeline does), ``<key>.json`` (clip_id, bucket, stream, tier, all caption levels of the chosen
version, lineage refs and versions). The other caption levels a curriculum may show travel as
``text-<level>.npy`` / ``text_states-<level>.npy``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vidassets.derive.latents import load_latents
from vidassets.derive.text_embeddings import load_states
from vidassets.storage.blobs import vector_of
from vidassets.storage.objects import ObjectStore

VERSION = "shards-v1"


def _order_key(version: int, clip_id: str) -> str:
    return hashlib.sha256(f"{version}\x00{clip_id}".encode()).hexdigest()


def latents_array(objects: ObjectStore, key: str) -> tuple[np.ndarray, str]:
    import torch

    tensor, _ = load_latents(objects, key)
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy(), "bfloat16"
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8).numpy(), "float8_e4m3fn"
    return tensor.numpy(), str(tensor.dtype).replace("torch.", "")


def restore_latents(array: np.ndarray, dtype: str):
    """The latents tensor from a shard's ``.npy`` and the json's dtype."""
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype == "bfloat16":
        return tensor.view(torch.bfloat16)
    if dtype == "float8_e4m3fn":
        return tensor.view(torch.float8_e4m3fn)
    return tensor


def states_array(states) -> tuple[np.ndarray, str]:
    """Token states as a shard member: bf16 as its uint16 bit pattern, and the dtype's name."""
    import torch

    if states.dtype == torch.bfloat16:
        return states.view(torch.uint16).numpy(), "bfloat16"
    return states.numpy(), str(states.dtype).replace("torch.", "")


def padded_text_states(array: np.ndarray, dtype: str, max_tokens: int):
    """A shard's token states member as the trainer takes it: (max_tokens, dim) in the stored dtype,
    zero past the caption's tokens, and the (max_tokens,) bool attention mask."""
    from vidassets.models.text_encoder import padded_states

    return padded_states(restore_latents(array, dtype), max_tokens)


def write_shards(objects: ObjectStore, out_dir: Path, version: int, samples: pd.DataFrame,
                 text_vectors: Mapping[str, np.ndarray], max_shard_bytes: int,
                 variant_vectors: Mapping[str, Mapping[str, np.ndarray]] | None = None,
                 text_states: Mapping[str, Mapping[str, str]] | None = None, default_level: str | None = None) -> pd.DataFrame:
    """Write every bucket's shards under ``out_dir/<bucket>/``; returns the index (one row per sample).
    ``variant_vectors``: clip -> caption level -> text embedding of the other levels the recipe's
    caption variants may show (members ``<key>.text-<level>.npy``). ``text_states``: clip -> caption
    level -> the stored token states of that caption (``default_level``'s as ``text_states.npy``)."""
    import webdataset as wds

    rows = []
    for bucket, group in samples.groupby("bucket", sort=True):
        bucket_dir = out_dir / bucket
        bucket_dir.mkdir(parents=True, exist_ok=True)
        ordered = group.assign(_k=[_order_key(version, c) for c in group.clip_id]).sort_values("_k")
        pattern = str(bucket_dir / "shard-%06d.tar")
        with wds.ShardWriter(pattern, maxsize=max_shard_bytes, maxcount=1_000_000, verbose=0) as sink:
            for sample in ordered.itertuples():
                array, dtype = latents_array(objects, sample.latent_key)
                meta = {
                    "clip_id": sample.clip_id, "bucket": bucket, "stream": sample.stream, "tier": sample.tier,
                    "captions": json.loads(sample.captions) if isinstance(sample.captions, str) else None,
                    "caption_version": sample.caption_version, "latents_dtype": dtype,
                    "latents_shape": list(array.shape), "latent_key": sample.latent_key,
                    "latent_version": sample.latent_version, "snapshot": version,
                    "resolution": None if pd.isna(r := getattr(sample, "resolution", None)) else int(r),
                    "lineage": {"asset_id": sample.asset_id, "source_uri": sample.source_uri,
                                "source_shard": sample.source_shard, "license": sample.license,
                                "copies": json.loads(c) if isinstance(c := getattr(sample, "copies", None), str) else [],
                                "first_frame": int(sample.first_frame), "last_frame": int(sample.last_frame)},
                }
                record = {"__key__": sample.clip_id, "latents.npy": array, "json": meta}
                vector = text_vectors.get(sample.clip_id)
                if vector is not None:
                    record["text.npy"] = np.asarray(vector, dtype=np.float32)
                for level, other in sorted((variant_vectors or {}).get(sample.clip_id, {}).items()):
                    record[f"text-{level}.npy"] = np.asarray(other, dtype=np.float32)
                for level, key in sorted((text_states or {}).get(sample.clip_id, {}).items()):
                    states, max_tokens = load_states(objects, key)
                    array, states_dtype = states_array(states)
                    record["text_states.npy" if level == default_level else f"text_states-{level}.npy"] = array
                    meta.setdefault("text_states", {"dtype": states_dtype, "max_tokens": max_tokens,
                                                    "tokens": {}})["tokens"][level] = len(array)
                sink.write(record)
        _prepare_energon(bucket_dir)
        rows += _index_tars(bucket_dir, out_dir, bucket)
    index = pd.DataFrame(rows, columns=["clip_id", "bucket", "shard", "latents_offset", "latents_size",
                                        "text_offset", "text_size", "text_levels", "text_states"])
    extra = [c for c in ("resolution", "primary") if c in samples]
    return index.merge(samples[["clip_id", "bucket", "stream", *extra]], on=["clip_id", "bucket"])


def _prepare_energon(bucket_dir: Path) -> None:
    energon = Path(sys.executable).parent / "energon"
    command = [str(energon) if energon.exists() else "energon", "prepare", str(bucket_dir), "--non-interactive",
               "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset", "--no-progress", "--force-overwrite"]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise RuntimeError(f"energon prepare failed for {bucket_dir}: {proc.stderr[-1500:]}")


def _index_tars(bucket_dir: Path, root: Path, bucket: str) -> list[dict[str, Any]]:
    """Per sample: its shard and the byte offset/size of its latents and text members (random access)."""
    rows: dict[str, dict[str, Any]] = {}
    levels: dict[str, dict[str, list[int]]] = {}
    states: dict[str, dict[str, list[int]]] = {}  # "" the default level
    for tar_path in sorted(bucket_dir.glob("shard-*.tar")):
        with tarfile.open(tar_path) as tar:
            for member in tar:
                stem, _, part = member.name[: -len(".npy")].rpartition(".") if member.name.endswith(".npy") else ("", "", "")
                if part in ("latents", "text"):
                    row = rows.setdefault(stem, {"clip_id": stem, "bucket": bucket,
                                                 "shard": tar_path.relative_to(root).as_posix(),
                                                 "text_offset": -1, "text_size": 0})
                    row[f"{part}_offset"], row[f"{part}_size"] = member.offset_data, member.size
                elif part.startswith("text-"):
                    levels.setdefault(stem, {})[part[len("text-"):]] = [member.offset_data, member.size]
                elif part == "text_states" or part.startswith("text_states-"):
                    states.setdefault(stem, {})[part[len("text_states-"):]] = [member.offset_data, member.size]
    for stem, row in rows.items():
        row["text_levels"] = json.dumps(levels.get(stem, {}), sort_keys=True)
        row["text_states"] = json.dumps(states.get(stem, {}), sort_keys=True)
    return list(rows.values())


def read_member(root: Path, shard: str, offset: int, size: int) -> np.ndarray:
    """One ``.npy`` member by byte offset (no tar scan)."""
    with open(root / shard, "rb") as f:
        f.seek(offset)
        return np.load(io.BytesIO(f.read(size)))


def text_vectors_for(text_embeddings: pd.DataFrame, samples: pd.DataFrame) -> dict[str, np.ndarray]:
    if not len(text_embeddings) or not len(samples):
        return {}
    wanted = samples[["clip_id", "text_sha256", "caption_version", "caption_level", "text_embedding_version"]]
    merged = text_embeddings[text_embeddings.vector.notna()].merge(wanted, left_on=["clip_id", "text_sha256", "caption_version", "caption_level",
                                                    "producer_version"],
                                   right_on=["clip_id", "text_sha256", "caption_version", "caption_level",
                                             "text_embedding_version"])
    return {r.clip_id: vector_of(r.vector) for r in merged.itertuples()}


def variant_vectors_for(text_embeddings: pd.DataFrame, samples: pd.DataFrame,
                        levels: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """clip -> level -> the text embedding of exactly the caption text of that level the sample
    carries (``captions``), for each of ``levels``."""
    merged = _level_rows(text_embeddings, samples, levels)
    out: dict[str, dict[str, np.ndarray]] = {}
    for r in merged.itertuples():
        out.setdefault(r.clip_id, {})[r.caption_level] = vector_of(r.vector)
    return out


def text_states_for(text_embeddings: pd.DataFrame, samples: pd.DataFrame, levels: list[str]) -> dict[str, dict[str, str]]:
    """clip -> level -> the token states key of exactly the caption text of that level the sample
    carries, for each of ``levels`` (empty for a pooled encoder, whose rows have no states)."""
    if "token_key" not in text_embeddings:
        return {}
    merged = _level_rows(text_embeddings[text_embeddings.token_key.notna()], samples, levels)
    out: dict[str, dict[str, str]] = {}
    for r in merged.itertuples():
        out.setdefault(r.clip_id, {})[r.caption_level] = r.token_key
    return out


def _level_rows(text_embeddings: pd.DataFrame, samples: pd.DataFrame, levels: list[str]) -> pd.DataFrame:
    """The text_embeddings rows holding exactly the caption text of each of ``levels`` each sample carries."""
    if not levels or not len(text_embeddings) or not len(samples):
        return pd.DataFrame(columns=["clip_id", "caption_level", "vector", "token_key"])
    wanted = []
    for r in samples[["clip_id", "captions", "caption_version", "text_embedding_version"]].itertuples():
        texts = json.loads(r.captions) if isinstance(r.captions, str) else {}
        for level in levels:
            if texts.get(level):
                wanted.append({"clip_id": r.clip_id, "caption_level": level, "caption_version": r.caption_version,
                               "producer_version": r.text_embedding_version,
                               "text_sha256": hashlib.sha256(texts[level].encode()).hexdigest()})
    if not wanted:
        return pd.DataFrame(columns=["clip_id", "caption_level", "vector", "token_key"])
    ok = text_embeddings[text_embeddings.vector.notna()]
    return ok.merge(pd.DataFrame(wanted), on=["clip_id", "caption_level", "caption_version", "producer_version",
                                               "text_sha256"])
