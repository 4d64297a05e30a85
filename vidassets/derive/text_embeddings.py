"""text_embeddings for one partition: the recipe's caption level of the recipe's captioner version,
encoded by the configured text encoder, for the selected clips. Rows are keyed by (clip_id,
caption version, level, encoder version); a row is reused while its caption text is unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pandas as pd

from vidassets.curate.embeddings import vector_bytes
from vidassets.derive.labels import caption_texts
from vidassets.storage.rows import Reuse, RowVersion, StepStats

VERSION = "text-embed-v1"


def embed_captions(selected: list[dict], annotations: pd.DataFrame, caption_version: str, level: str,
                   previous: pd.DataFrame, version: str, encoder_factory: Callable[[], Any], max_runs: int,
                   ) -> tuple[list[dict], StepStats]:
    """The chosen caption level of each selected clip, embedded. A row's input is the caption text
    itself (its sha256): it is reused while the text and the encoder are unchanged."""
    stats = StepStats(rows_in=len(selected))
    captions, _ = caption_texts(annotations, caption_version, level)
    reuse = Reuse(previous, lambda r: (r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"]),
                  max_runs, stats)
    todo, kept = [], []
    for sel in selected:
        text = captions.get(sel["clip_id"])
        if text is None:
            stats.add("missing_caption")
            continue
        key = (sel["clip_id"], caption_version, level, version)
        row_version = RowVersion(version, "text-" + hashlib.sha256(text.encode()).hexdigest())
        prior = reuse.take(key, row_version)
        if prior is not None:
            kept.append(prior)
        else:
            todo.append((sel, text, key, row_version))
    new_rows = []
    if todo:
        encoder = encoder_factory()
        vectors = encoder([t for _, t, _, _ in todo])
        stats.model_calls += len(todo)
        for (sel, _, key, row_version), vec in zip(todo, vectors, strict=True):
            row = {"clip_id": sel["clip_id"], "asset_id": sel["asset_id"], "source_shard": sel["source_shard"],
                   "tier": sel.get("tier"), "caption_version": caption_version, "caption_level": level,
                   "text_sha256": row_version.inputs[len("text-"):], "dim": int(vec.shape[0]),
                   "vector": vector_bytes(vec)}
            new_rows.append(reuse.stamp(key, row, row_version))
    rows = reuse.others(kept + new_rows) + kept + new_rows
    return sorted(rows, key=lambda r: (r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"])), stats
