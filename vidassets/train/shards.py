"""Training shards: WebDataset tars shared across snapshots. Every shard lives once in ``CAS``, named
by the digest of its members; it holds one shape bucket's samples of one source drop (the mixture is
not baked in), in a hashed order, so a snapshot whose drop did not change references that drop's
shards and writes only new or changed drops'. A snapshot's directory holds its index Parquet (clip
-> shard, member, byte offset) and, on a local store, hard links to its shards per bucket, each
directory prepared for NVIDIA megatron-energon (its ``.nv-meta`` index, via ``energon prepare``);
``exports`` writes the other trainers' formats, ``collect`` deletes what no live snapshot references.

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
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vidassets.derive.latents import DTYPES, load_latents
from vidassets.derive.text_embeddings import load_states
from vidassets.storage.blobs import vector_of
from vidassets.storage.objects import ObjectStore

VERSION = "shards-v2"  # v2: content-addressed, one drop per shard, shared across snapshots; a sample per resolution


def _order_key(clip_id: str) -> str:
    """A sample's place in its drop's shards: a hash, so neighbours in a shard are not neighbours in the source."""
    return hashlib.sha256(clip_id.encode()).hexdigest()


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


CAS = "shards/cas"
"""Where every shard lives once, named by the digest of what it holds: ``cas/<bucket>/<digest>.tar``
and ``<digest>.members.json`` (each member's byte range). Snapshots reference them."""


@dataclass
class ShardsWritten:
    index: pd.DataFrame
    """One row per sample and resolution: its shard (relative to the snapshot's directory) and members' byte ranges."""
    shards: list[str]
    """The CAS keys the snapshot references."""
    new_shards: int = 0
    bytes_written: int = 0
    reused_shards: int = 0
    bytes_reused: int = 0


def _sample_bytes(sample: Any) -> int:
    """A bucket's latents size per sample (its shape and dtype: one per bucket), for the shard split."""
    import torch

    shape = json.loads(sample.latent_shape) if isinstance(sample.latent_shape, str) else [1]
    dtype = str(getattr(sample, "dtype", "bf16"))
    width = torch.empty(0, dtype=getattr(torch, DTYPES.get(dtype, dtype))).element_size()
    return int(np.prod(shape)) * width + 4096  # + text embedding, json and tar headers


def shard_parts(samples: pd.DataFrame, max_shard_bytes: int) -> list[tuple[str, pd.DataFrame]]:
    """The shards' memberships, a function of the samples only: per (bucket, source drop), the drop's
    samples in a fixed order split into parts of at most ``max_shard_bytes``. A drop that did not
    change gives the same parts, so a later snapshot references them instead of writing them again."""
    parts = []
    for (bucket, _), group in samples.groupby(["bucket", "source_shard"], sort=True, dropna=False):
        ordered = group.assign(_k=[_order_key(c) for c in group.clip_id]).sort_values("_k").drop(columns="_k")
        per_part = max(1, max_shard_bytes // _sample_bytes(next(ordered.itertuples())))
        parts += [(str(bucket), ordered.iloc[i:i + per_part]) for i in range(0, len(ordered), per_part)]
    return parts


def _records(objects: ObjectStore, part: pd.DataFrame, text_vectors: Mapping[str, np.ndarray],
             variant_vectors: Mapping[str, Mapping[str, np.ndarray]], text_states: Mapping[str, Mapping[str, str]],
             default_level: str | None, bucket: str, load: bool) -> tuple[str, list[dict]]:
    """The part's digest (of every member's identity) and, with ``load``, its records to write."""
    identity, records = [], []
    for sample in part.itertuples():
        meta = {
            "clip_id": sample.clip_id, "bucket": bucket, "stream": sample.stream, "tier": sample.tier,
            "captions": json.loads(sample.captions) if isinstance(sample.captions, str) else None,
            "caption_version": sample.caption_version, "latent_key": sample.latent_key,
            "latent_version": sample.latent_version,
            "resolution": None if pd.isna(r := getattr(sample, "resolution", None)) else int(r),
            "lineage": {"asset_id": sample.asset_id, "source_uri": sample.source_uri,
                        "source_shard": sample.source_shard, "license": sample.license,
                        "copies": json.loads(c) if isinstance(c := getattr(sample, "copies", None), str) else [],
                        "first_frame": int(sample.first_frame), "last_frame": int(sample.last_frame)},
        }
        vector = text_vectors.get(sample.clip_id)
        variants = dict(sorted(variant_vectors.get(sample.clip_id, {}).items()))
        states = dict(sorted(text_states.get(sample.clip_id, {}).items()))
        identity.append([meta, _digest_array(vector), {k: _digest_array(v) for k, v in variants.items()}, states,
                         default_level])
        if not load:
            continue
        array, dtype = latents_array(objects, sample.latent_key)
        meta = {**meta, "latents_dtype": dtype, "latents_shape": list(array.shape)}
        record = {"__key__": sample.clip_id, "latents.npy": array, "json": meta}
        if vector is not None:
            record["text.npy"] = np.asarray(vector, dtype=np.float32)
        for level, other in variants.items():
            record[f"text-{level}.npy"] = np.asarray(other, dtype=np.float32)
        for level, key in states.items():
            tokens, max_tokens = load_states(objects, key)
            tokens_array, states_dtype = states_array(tokens)
            record["text_states.npy" if level == default_level else f"text_states-{level}.npy"] = tokens_array
            meta.setdefault("text_states", {"dtype": states_dtype, "max_tokens": max_tokens,
                                            "tokens": {}})["tokens"][level] = len(tokens_array)
        records.append(record)
    blob = json.dumps([VERSION, identity], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest(), records


def _digest_array(array: np.ndarray | None) -> str | None:
    return None if array is None else hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()[:32]


def write_shards(objects: ObjectStore, out_dir: Path, samples: pd.DataFrame,
                 text_vectors: Mapping[str, np.ndarray], max_shard_bytes: int,
                 variant_vectors: Mapping[str, Mapping[str, np.ndarray]] | None = None,
                 text_states: Mapping[str, Mapping[str, str]] | None = None,
                 default_level: str | None = None) -> ShardsWritten:
    """The shards of ``samples`` (one row per sample and resolution): each part (``shard_parts``) is
    written to the CAS once, under the digest of what it holds, and referenced thereafter. In
    ``out_dir`` (the snapshot's directory, local): per bucket, the snapshot's shards as hard links
    (a local store: no bytes copied) prepared for megatron-energon. On an object store without local
    paths (S3) the index names the CAS objects (``../cas/...``, relative to the snapshot's prefix).
    ``variant_vectors``: clip -> caption level -> text embedding of the other levels the recipe's
    caption variants may show (members ``<key>.text-<level>.npy``). ``text_states``: clip -> caption
    level -> the stored token states of that caption (``default_level``'s as ``text_states.npy``)."""
    import webdataset as wds

    done = ShardsWritten(pd.DataFrame(), [])
    rows, buckets = [], set()
    for bucket, part in shard_parts(samples, max_shard_bytes):
        digest, _ = _records(objects, part, text_vectors, variant_vectors or {}, text_states or {}, default_level,
                             bucket, load=False)
        key = f"{CAS}/{bucket}/{digest}.tar"
        members_key = f"{CAS}/{bucket}/{digest}.members.json"
        if objects.exists(members_key):  # written by an earlier snapshot (the members file goes last)
            written = json.loads(objects.get_bytes(members_key))
            done.reused_shards += 1
            done.bytes_reused += written["size"]
        else:
            _, records = _records(objects, part, text_vectors, variant_vectors or {}, text_states or {},
                                  default_level, bucket, load=True)
            with tempfile.TemporaryDirectory(prefix="vidassets-shard-") as tmp:
                path = Path(tmp) / "shard.tar"
                with wds.TarWriter(str(path)) as sink:
                    for record in records:
                        sink.write(record)
                written = {"size": path.stat().st_size, "members": _index_tar(path)}
                objects.put_bytes(key, path.read_bytes())
                objects.put_bytes(members_key, json.dumps(written).encode())
                done.bytes_written += written["size"]
            done.new_shards += 1
        members = written["members"]
        local = objects.local_path(key)
        if local is not None:  # the snapshot's own view of it: a hard link energon indexes
            link = out_dir / bucket / f"shard-{digest[:20]}.tar"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                os.link(local, link)
            shard = link.relative_to(out_dir).as_posix()
            buckets.add(bucket)
        else:
            shard = f"../cas/{bucket}/{digest}.tar"
        done.shards.append(key)
        for m in members:
            rows.append({"clip_id": m["clip_id"], "bucket": bucket, "shard": shard,
                         "latents_offset": m["latents"][0], "latents_size": m["latents"][1],
                         "text_offset": m["text"][0] if m["text"] else -1, "text_size": m["text"][1] if m["text"] else 0,
                         "text_levels": json.dumps(m["text_levels"], sort_keys=True),
                         "text_states": json.dumps(m["text_states"], sort_keys=True)})
    for bucket in sorted(buckets):
        _prepare_energon(out_dir / bucket)
    index = pd.DataFrame(rows, columns=["clip_id", "bucket", "shard", "latents_offset", "latents_size",
                                        "text_offset", "text_size", "text_levels", "text_states"])
    extra = [c for c in ("resolution", "primary") if c in samples]
    done.index = index.merge(samples[["clip_id", "bucket", "stream", *extra]], on=["clip_id", "bucket"])
    return done


def _prepare_energon(bucket_dir: Path) -> None:
    energon = Path(sys.executable).parent / "energon"
    command = [str(energon) if energon.exists() else "energon", "prepare", str(bucket_dir), "--non-interactive",
               "--split-ratio", "1,0,0", "--sample-type", "CrudeWebdataset", "--no-progress", "--force-overwrite"]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise RuntimeError(f"energon prepare failed for {bucket_dir}: {proc.stderr[-1500:]}")


def _index_tar(path: Path) -> list[dict[str, Any]]:
    """Per sample of one tar: the byte offset and size of its latents, text, other levels' text and
    token states members (random access without a tar scan)."""
    rows: dict[str, dict[str, Any]] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            if not member.name.endswith(".npy"):
                continue
            stem, _, part = member.name[: -len(".npy")].rpartition(".")
            row = rows.setdefault(stem, {"clip_id": stem, "latents": None, "text": None, "text_levels": {},
                                         "text_states": {}})
            where = [member.offset_data, member.size]
            if part in ("latents", "text"):
                row[part] = where
            elif part.startswith("text-"):
                row["text_levels"][part[len("text-"):]] = where
            elif part == "text_states" or part.startswith("text_states-"):
                row["text_states"][part[len("text_states-"):]] = where  # "" the default level
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
