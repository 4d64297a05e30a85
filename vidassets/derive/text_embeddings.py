"""text_embeddings for one partition: the recipe's caption level of the recipe's captioner version,
encoded by the configured text encoder, for the selected clips. Rows are keyed by (clip_id,
caption version, level, encoder version); a row is reused while its caption text is unchanged."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from vidassets.curate.embeddings import vector_bytes
from vidassets.media.partition import records


@dataclass
class TextEmbedStats:
    clips: int = 0
    computed: int = 0
    reused: int = 0
    missing_caption: int = 0
    model_calls: int = 0


def embed_captions(selected: list[dict], annotations: pd.DataFrame, caption_version: str, level: str,
                   previous: pd.DataFrame, version: str, encoder_factory: Callable[[], Any],
                   ) -> tuple[list[dict], TextEmbedStats]:
    stats = TextEmbedStats(clips=len(selected))
    captions: dict[str, str] = {}
    if len(annotations):
        ok = annotations[(annotations.kind == "captions") & (annotations.status == "ok")
                         & (annotations.producer_version == caption_version)]
        captions = {r.clip_id: json.loads(r.value)[level] for r in ok.itertuples()}
    old = ({(r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"]): r for r in records(previous)}
           if len(previous) else {})
    todo, new_rows = [], []
    for sel in selected:
        text = captions.get(sel["clip_id"])
        if text is None:
            stats.missing_caption += 1
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        prior = old.get((sel["clip_id"], caption_version, level, version))
        if prior is not None and prior["text_sha256"] == digest:
            stats.reused += 1
            continue
        todo.append((sel, text, digest))
    if todo:
        encoder = encoder_factory()
        vectors = encoder([t for _, t, _ in todo])
        stats.model_calls += len(todo)
        for (sel, _, digest), vec in zip(todo, vectors, strict=True):
            new_rows.append({"clip_id": sel["clip_id"], "asset_id": sel["asset_id"], "source_shard": sel["source_shard"],
                             "tier": sel.get("tier"), "caption_version": caption_version, "caption_level": level,
                             "text_sha256": digest, "dim": int(vec.shape[0]), "vector": vector_bytes(vec),
                             "producer_version": version})
        stats.computed = len(new_rows)
    fresh = {(r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"]) for r in new_rows}
    rows = [r for k, r in old.items() if k not in fresh] + new_rows
    return sorted(rows, key=lambda r: (r["clip_id"], r["caption_version"], r["caption_level"])), stats
