"""Decontamination: match every train clip against eval-vault material, perceptually (PDQ of
sampled frames) and semantically (embeddings). Matched clips are recorded and excluded from
selection; a blocking asset check fails if any selected clip matches eval material.

Eval features (probe, analysis, context frames, embeddings of eval videos) live only in the eval
vault; this module reads them next to train-side features and writes only the match table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from vidassets.config import DecontaminationSettings
from vidassets.curate.embeddings import vector_of
from vidassets.storage.rows import RowVersion

VERSION = "decontamination-v1"
EVAL_FEATURES_VERSION = "eval-features-v1"


def match(train_clips: pd.DataFrame, train_frames: pd.DataFrame, train_embeddings: pd.DataFrame,
          eval_frames: pd.DataFrame, eval_embeddings: pd.DataFrame, params: DecontaminationSettings,
          version: RowVersion) -> list[dict[str, Any]]:
    """One row per train clip: whether it matches eval material, how, and the closest eval asset."""
    import faiss

    eval_hashes = np.stack([np.frombuffer(bytes.fromhex(h), np.uint8) for h in eval_frames.pdq_hash]) \
        if len(eval_frames) else np.zeros((0, 32), np.uint8)
    eval_owner = list(eval_frames.asset_id) if len(eval_frames) else []
    binary = faiss.IndexBinaryFlat(256)
    if len(eval_hashes):
        binary.add(eval_hashes)
    ok_eval = eval_embeddings[eval_embeddings.status == "ok"] if len(eval_embeddings) else eval_embeddings
    eval_vectors = np.stack([vector_of(v) for v in ok_eval.vector]) if len(ok_eval) else None
    eval_vector_owner = list(ok_eval.asset_id) if len(ok_eval) else []
    vectors = {r.clip_id: vector_of(r.vector) for r in train_embeddings.itertuples() if r.status == "ok"} \
        if len(train_embeddings) else {}
    frames_by_asset = {a: g for a, g in train_frames.groupby("asset_id")} if len(train_frames) else {}
    rows = []
    for clip in train_clips.itertuples():
        frames = frames_by_asset.get(clip.asset_id)
        hashes = [] if frames is None else list(
            frames[(frames.frame_index >= clip.first_frame) & (frames.frame_index <= clip.last_frame)].pdq_hash)
        perceptual_share, perceptual_asset = 0.0, None
        if hashes and len(eval_hashes):
            queries = np.stack([np.frombuffer(bytes.fromhex(h), np.uint8) for h in hashes])
            lims, _, found = binary.range_search(queries, params.max_hamming + 1)
            hits: dict[str, int] = {}
            for q in range(len(queries)):
                for owner in {eval_owner[i] for i in found[lims[q] : lims[q + 1]]}:
                    hits[owner] = hits.get(owner, 0) + 1
            if hits:
                perceptual_asset, count = max(hits.items(), key=lambda kv: (kv[1], kv[0]))
                perceptual_share = count / len(queries)
        cosine, semantic_asset = 0.0, None
        vec = vectors.get(clip.clip_id)
        if vec is not None and eval_vectors is not None:
            sims = eval_vectors @ vec
            best = int(np.argmax(sims))
            cosine, semantic_asset = float(sims[best]), eval_vector_owner[best]
        perceptual = perceptual_share >= params.min_frame_share
        semantic = cosine >= params.min_cosine
        rows.append({
            "clip_id": clip.clip_id, "asset_id": clip.asset_id, "source_shard": clip.source_shard,
            "contaminated": bool(perceptual or semantic),
            "method": "+".join(m for m, hit in (("perceptual", perceptual), ("semantic", semantic)) if hit) or None,
            "perceptual_share": round(perceptual_share, 4), "perceptual_eval_asset": perceptual_asset,
            "cosine": round(cosine, 4), "semantic_eval_asset": semantic_asset,
            "producer_version": version.producer, "input_version": version.inputs, "runs": 1,
        })
    return rows
