"""text_embeddings for one partition: the recipe's caption level (and the levels its caption variants
may show) of the recipe's captioner version, encoded by the configured text encoder, for the
selected clips. Rows are keyed by (clip_id,
caption version, level, encoder version); a row is reused while its caption text is unchanged.

The texts to encode go to the engine in batches of the encoder's batch size (model actors on Ray):
batches are cut the same way on every engine, so the vectors are the same bit for bit."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from vidassets.curate.embeddings import vector_bytes
from vidassets.derive.labels import caption_texts
from vidassets.runtime.engine import LocalEngine
from vidassets.runtime.step import Step, count_remote
from vidassets.storage.rows import TRANSIENT, RowVersion, StepStats

VERSION = "text-embed-v1"


def embed_captions(selected: list[dict], annotations: pd.DataFrame, caption_version: str, levels: Sequence[str],
                   previous: pd.DataFrame, version: str, encoder_factory: Callable[[], Any], max_runs: int,
                   batch_size: int = 64, engine: Any = None) -> tuple[list[dict], StepStats]:
    """Each of the given caption ``levels`` of each selected clip, embedded (the recipe's level and
    the levels its caption variants may show). A row's input is the caption text itself (its
    sha256): it is reused while the text and the encoder are unchanged. A batch that fails is an
    ``error`` row per clip (a transient failure: retried by the next run)."""
    step = Step(previous, lambda r: (r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"]),
                max_runs, engine=engine)
    stats = step.stats
    stats.rows_in = len(selected) * len(levels)
    wanted = []
    for level in levels:
        captions, _ = caption_texts(annotations, caption_version, level)
        for sel in selected:
            text = captions.get(sel["clip_id"])
            if text is None:
                stats.add("missing_caption")
                continue
            key = (sel["clip_id"], caption_version, level, version)
            row_version = RowVersion(version, "text-" + hashlib.sha256(text.encode()).hexdigest())
            wanted.append((key, row_version, (sel, text, key, row_version)))
    todo = step.due(wanted)
    batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
    engine = engine or LocalEngine()
    count_remote(stats, engine, len(batches))
    outcomes = engine.map(_EncodeTexts(encoder_factory), [[text for _, text, _, _ in b] for b in batches],
                          lambda texts: f"{len(texts)} caption(s)", models=True)
    new_rows = []
    for batch, outcome in zip(batches, outcomes, strict=True):
        vectors = outcome.row["vectors"] if outcome.row is not None else [None] * len(batch)
        stats.model_calls += len(batch) if outcome.row is not None else 0
        for (sel, _, key, row_version), vec in zip(batch, vectors, strict=True):
            row = {"clip_id": sel["clip_id"], "asset_id": sel["asset_id"], "source_shard": sel["source_shard"],
                   "tier": sel.get("tier"), "caption_version": caption_version, "caption_level": key[2],
                   "text_sha256": row_version.inputs[len("text-"):],
                   "status": "ok" if vec is not None else "error",
                   "reason": None if vec is not None else outcome.reason,
                   "dim": int(vec.shape[0]) if vec is not None else None,
                   "vector": vector_bytes(vec) if vec is not None else None}
            new_rows.append(step.stamp(key, row, row_version, None if vec is not None else TRANSIENT))
    rows = step.complete(new_rows)
    return sorted(rows, key=lambda r: (r["clip_id"], r["caption_version"], r["caption_level"], r["producer_version"])), stats


def text_ok(table: pd.DataFrame) -> pd.Series:
    """Rows of a text_embeddings table that hold a vector (tables written before encode failures
    were rows have no status column: every row there is ok)."""
    if "status" not in table.columns:
        return pd.Series(True, index=table.index)
    return table.status.fillna("ok") == "ok"


class _EncodeTexts:
    """One batch of caption texts through the encoder (picklable: it may run on a Ray model actor,
    whose process keeps the encoder it built)."""

    def __init__(self, encoder_factory: Callable[[], Any]):
        self.encoder_factory = encoder_factory

    def __call__(self, texts: list[str]) -> dict:
        return {"vectors": list(self.encoder_factory()(texts))}
