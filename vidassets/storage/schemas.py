"""pandera schemas of every catalog table, keyed by table name. Tables are validated on write."""

from __future__ import annotations

import pandera.pandas as pa

SHA256_HEX = r"^[0-9a-f]{64}$"
SAMPLE_MEDIA_TYPES = ("video", "image")
MEDIA_TYPES = (*SAMPLE_MEDIA_TYPES, "other")
"""What an inventoried object is (by its name); the probe confirms it from the bytes. An image is a
1-frame sample everywhere after the probe (``media_type`` of probe, analysis and clip rows)."""


def _text(nullable: bool = False, **kw) -> pa.Column:
    return pa.Column(str, nullable=nullable, **kw)


# Provenance columns travel with the asset through every later table (joined by asset_id / uri).
PROVENANCE_COLUMNS = {
    "license": _text(nullable=True),
    "territory": _text(nullable=True),
    "crawl_url": _text(nullable=True),
    "generated_by": _text(nullable=True),  # the model that generated it (synthetic material)
    "provenance": _text(),  # the merged sidecar entry as JSON, all keys included
}

raw_inventory = pa.DataFrameSchema(
    {
        "uri": _text(unique=True),
        "key": _text(),  # bucket-relative key of the object (the tar for a member)
        "member": _text(nullable=True),  # path inside the tar, for tar members
        "member_offset": pa.Column("Int64", nullable=True),  # data offset in an uncompressed tar
        "container": _text(checks=pa.Check.isin(["file", "tar_member", "tar"])),
        "media_type": _text(checks=pa.Check.isin(list(MEDIA_TYPES))),
        "size": pa.Column("int64", pa.Check.ge(0)),
        "object_version": _text(),
        "asset_id": _text(nullable=True, checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "source_tier": _text(),
        "drop_id": _text(),
        "status": _text(checks=pa.Check.isin(["ok", "error", "refused"])),
        "reason": _text(nullable=True),
        "duplicate_of": _text(nullable=True, checks=pa.Check.str_matches(SHA256_HEX)),
        "duplicate_of_uri": _text(nullable=True),
        **PROVENANCE_COLUMNS,
        "synthetic": pa.Column("boolean", nullable=True),  # model-generated: never routed to eval
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    checks=[
        pa.Check(lambda df: (df["status"] != "ok") | df["asset_id"].notna(), error="ok rows need an asset_id"),
        pa.Check(lambda df: (df["status"] == "ok") | df["reason"].notna(), error="failed rows need a reason"),
    ],
    name="raw_inventory",
)

_split_columns = {
    "uri": _text(unique=True),
    "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
    "source_shard": _text(),
    "split": _text(),
    "duplicate_of": _text(nullable=True, checks=pa.Check.str_matches(SHA256_HEX)),
    "producer_version": _text(),
}

# Train side: the only rows every later training-facing stage reads.
eval_split = pa.DataFrameSchema(
    {**_split_columns, "split": _text(checks=pa.Check.eq("train"))},
    coerce=True,
    strict=True,
    name="eval_split",
)

# Written only to the eval vault root.
eval_assets = pa.DataFrameSchema(
    {**_split_columns, "split": _text(checks=pa.Check.eq("eval"))},
    coerce=True,
    strict=True,
    name="eval_assets",
)

def _num(dtype: str = "float64", nullable: bool = True, **kw) -> pa.Column:
    return pa.Column(dtype, nullable=nullable, **kw)


_ASSET_KEYS = {
    "asset_id": _text(unique=True, checks=pa.Check.str_matches(SHA256_HEX)),
    "uri": _text(),
    "source_shard": _text(),
}

video_probe = pa.DataFrameSchema(
    {
        **_ASSET_KEYS,
        "status": _text(checks=pa.Check.isin(["ok", "salvaged", "quarantined"])),
        "reason": _text(nullable=True),
        "attempts": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "media_type": _text(nullable=True, checks=pa.Check.isin(list(SAMPLE_MEDIA_TYPES))),  # null: a row from before images
        "container": _text(nullable=True),
        "codec": _text(nullable=True),
        "profile": _text(nullable=True),
        "pix_fmt": _text(nullable=True),
        "width": _num("Int64"),
        "height": _num("Int64"),
        "display_width": _num("Int64"),
        "display_height": _num("Int64"),
        "rotation": _num("Int64", checks=pa.Check.isin([0, 90, 180, 270])),
        "fps_avg": _num(),
        "fps_base": _num(),
        "vfr": pa.Column("boolean", nullable=True),
        "duration_s": _num(),
        "declared_frames": _num("Int64"),
        "counted_frames": _num("Int64"),
        "count_method": _text(nullable=True),
        "has_audio": pa.Column("boolean", nullable=True),
        "audio_codec": _text(nullable=True),
        "bitrate": _num("Int64"),
        "frames_decoded": _num("int64", nullable=False),
        "seconds": _num(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    checks=[pa.Check(lambda df: (df["status"] == "ok") | df["reason"].notna(), error="non-ok rows need a reason")],
    name="video_probe",
)

frame_index = pa.DataFrameSchema(
    {
        **_ASSET_KEYS,
        "index_blob": _text(nullable=True),
        "status": _text(checks=pa.Check.isin(["ok", "partial", "failed"])),
        "reason": _text(nullable=True),
        "codec": _text(nullable=True),
        "packets": _num("Int64"),
        "keyframes": _num("Int64"),
        "gop_mean": _num(),
        "gop_max": _num("Int64"),
        "keyframe_interval_s": _num(),
        "i_share": _num(),
        "p_share": _num(),
        "b_share": _num(),
        "frame_types_known": _num(),
        "nonref_share": _num(),
        "vfr": pa.Column("boolean", nullable=True),
        "duration_s": _num(),
        "bitrate_bps": _num(),
        "bits_per_pixel": _num(),
        "seconds": _num(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="frame_index",
)

video_fingerprints = pa.DataFrameSchema(
    {
        **_ASSET_KEYS,
        "status": _text(checks=pa.Check.isin(["ok", "failed"])),
        "reason": _text(nullable=True),
        "samples": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "frames_decoded": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "fingerprint_blob": _text(nullable=True),  # JSON: sample times, PDQ hashes (whole, square, inner), Chromaprint
        "fingerprint_pack": _text(nullable=True),  # every hash of the drop's fingerprints in one object (decisions read it)
        "whole_grid": pa.Column("boolean", nullable=True),  # sampled on the whole grid (else within the decode budget)
        "has_audio_fingerprint": pa.Column("boolean", nullable=True),
        "duration_s": _num(),
        "width": _num("Int64"),
        "height": _num("Int64"),
        "bits_per_pixel": _num(),
        "quality_key": _num(),  # bits per pixel x pixels: the canonical rule's first criterion
        "source_tier": _text(nullable=True),
        # the decision, recomputed by every run against every drop's fingerprints
        "near_duplicate_of": _text(nullable=True, checks=pa.Check.str_matches(SHA256_HEX)),
        "near_duplicate_of_uri": _text(nullable=True),
        "match": _text(nullable=True),  # JSON: shares, speed, offset, spans, audio share of the match
        "contains": _text(nullable=True),  # JSON list: videos this one contains, with the time spans
        "contained_in": _text(nullable=True),  # JSON list: videos that contain this one, with the spans there
        "synthetic": pa.Column("boolean", nullable=True),  # model-generated (tagged at ingest): the firewall's registry
        "generated_match": _text(nullable=True),  # JSON list: model-generated videos this real one matches
        "blocked": _text(nullable=True, required=False),  # blocked:<list>: matches a safety hash list (or is a copy of one)
        "group_size": _num("Int64"),
        "seconds": _num(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    checks=[pa.Check(lambda df: (df["status"] == "ok") | df["reason"].notna(), error="failed rows need a reason")],
    name="video_fingerprints",
)

safety_reports = pa.DataFrameSchema(
    {
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "uri": _text(),
        "source_shard": _text(),
        "list": _text(),  # the hash list's name (its file's stem)
        "list_entry": _text(nullable=True),  # the matched entry (PDQ hex); null for a copy tied to a match
        "list_item": _text(nullable=True),  # the entry's metadata as the list gave it
        "distance": _num("Int64"),  # Hamming distance of the closest sampled frame
        "tied_to": _text(nullable=True),  # a copy blocked with a matched video: that video's asset_id
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="safety_reports",
)

video_analysis = pa.DataFrameSchema(
    {
        **_ASSET_KEYS,
        "status": _text(checks=pa.Check.isin(["ok", "partial", "failed"])),
        "reason": _text(nullable=True),
        "attempts": _num("int64", nullable=False),
        "frames_decoded": _num("int64", nullable=False),
        "media_type": _text(nullable=True, checks=pa.Check.isin(list(SAMPLE_MEDIA_TYPES))),
        "counted_frames": _num("Int64"),
        "fps": _num(),
        "rotation": _num("Int64"),
        "analysis_width": _num("Int64"),
        "analysis_height": _num("Int64"),
        "num_shots": _num("Int64"),
        "cut_frames": _text(),  # JSON list of frame indices where a new shot starts
        "cut_seconds": _text(),  # the same cuts in seconds from the first frame, for display
        "shots": _text(),  # JSON [[first_frame, last_frame], ...], inclusive
        "signals_blob": _text(nullable=True),  # Parquet: frame_index, pts, time_s and per-frame signals
        "context_frames": _num("int64", nullable=False),
        "decode_errors": _num("int64", nullable=False),
        "seconds": _num(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="video_analysis",
)

context_frames = pa.DataFrameSchema(
    {
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "frame_index": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "time_s": _num(nullable=False),
        "blob_key": _text(),
        "width": _num("int64", nullable=False),
        "height": _num("int64", nullable=False),
        "pdq_hash": _text(checks=pa.Check.str_matches(r"^[0-9a-f]{64}$")),
        "pdq_quality": _num("int64", nullable=False),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["asset_id", "frame_index"],
    name="context_frames",
)

clips = pa.DataFrameSchema(
    {
        "clip_id": _text(unique=True),
        **{k: v for k, v in _ASSET_KEYS.items() if k != "asset_id"},
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "shot_index": _num("int64", nullable=False),
        "media_type": _text(nullable=True, checks=pa.Check.isin(list(SAMPLE_MEDIA_TYPES))),  # image: one 1-frame clip
        "first_frame": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "last_frame": _num("int64", nullable=False),
        "num_frames": _num("int64", nullable=False, checks=pa.Check.gt(0)),
        "first_pts": _num("int64", nullable=False),
        "last_pts": _num("int64", nullable=False),
        "start_s": _num(nullable=False),
        "end_s": _num(nullable=False),
        "duration_s": _num(nullable=False),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    checks=[pa.Check(lambda df: df["last_frame"] >= df["first_frame"], error="last_frame before first_frame")],
    name="clips",
)

clip_scores = pa.DataFrameSchema(
    {
        "clip_id": _text(),
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "score": _text(checks=pa.Check.isin(["optical", "motion", "static", "bitrate", "text", "quality", "nsfw", "faces"])),
        "value": _num(checks=[pa.Check.ge(0.0), pa.Check.le(1.0)]),
        "kill": pa.Column("boolean", nullable=False),
        "status": _text(checks=pa.Check.isin(["ok", "error", "no_frames", "skipped", "not_applicable"])),
        "reason": _text(nullable=True),
        "evidence": _text(),  # JSON: the raw measurements behind the value
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "score"],
    checks=[pa.Check(lambda df: (df["status"] != "ok") | df["value"].notna(), error="ok scores need a value")],
    name="clip_scores",
)

clip_embeddings = pa.DataFrameSchema(
    {
        "clip_id": _text(unique=True),
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "status": _text(checks=pa.Check.isin(["ok", "no_frames", "error"])),
        "reason": _text(nullable=True, required=False),  # why an item has no vector
        "frames": _num("int64", nullable=False),
        "dim": _num("int64", nullable=False),
        "vector": pa.Column(object),  # float32 little-endian bytes, L2-normalised
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="clip_embeddings",
)

dedup_groups = pa.DataFrameSchema(
    {
        "clip_id": _text(unique=True),
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "pdq_group": _text(),  # id = smallest member clip_id, which is also the group's representative
        "pdq_group_size": _num("int64", nullable=False, checks=pa.Check.ge(1)),
        "pdq_evidence": _text(),  # JSON [closest linked clip, share of frames matched] or null
        "semantic_group": _text(nullable=True),
        "semantic_group_size": _num("int64", nullable=False),
        "semantic_evidence": _text(),  # JSON [closest linked clip, cosine] or null
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="dedup_groups",
)

golden_captions = pa.DataFrameSchema(  # eval vault: eval clips with human reference captions
    {
        "golden_id": _text(unique=True),
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "first_frame": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "last_frame": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "captions": _text(),  # JSON: level -> reference text
        "added": _text(),
    },
    coerce=True,
    strict=True,
    checks=[pa.Check(lambda df: df["last_frame"] >= df["first_frame"], error="last_frame before first_frame")],
    name="golden_captions",
)

caption_qc = pa.DataFrameSchema(  # eval vault: judged captions per captioner version and judge
    {
        "kind": _text(checks=pa.Check.isin(["golden", "sample"])),
        "item_id": _text(),  # golden_id or clip_id
        "captions_version": _text(),
        "caption_level": _text(),
        "judge_version": _text(),
        "status": _text(checks=pa.Check.isin(["ok", "skipped", "error", "invalid", "no_caption"])),
        "score": _num(),
        "errors": _text(nullable=True),  # JSON list of the judge's findings
        "reason": _text(nullable=True),
        "caption": _text(nullable=True),
        "reference": _text(nullable=True),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["kind", "item_id", "captions_version", "judge_version"],
    name="caption_qc",
)

clip_clusters = pa.DataFrameSchema(
    {
        "clip_id": _text(unique=True),
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "cluster": _num("int64", nullable=False, checks=pa.Check.ge(0)),
        "cosine": _num("float64", nullable=False),  # to its centroid
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="clip_clusters",
)

selection = pa.DataFrameSchema(
    {
        "clip_id": _text(unique=True),
        "asset_id": _text(nullable=True),
        "source_shard": _text(nullable=True),
        "decision": _text(checks=pa.Check.isin(["pass", "reject"])),
        "first_failed_rule": _text(nullable=True),
        "rule_outcomes": _text(),
        "tier": _text(nullable=True),
        "rank_score": _num(),
        "recipe": _text(),
        "recipe_hash": _text(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    checks=[pa.Check(lambda df: (df["decision"] == "pass") == df["first_failed_rule"].isna(),
                     error="rejected clips name their first failed rule")],
    name="selection",
)

eval_embeddings = pa.DataFrameSchema(
    {
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "segment": _num("int64", nullable=False),  # one row per segment of the eval video (its shots, windowed)
        "first_frame": _num("int64", nullable=False),
        "last_frame": _num("int64", nullable=False),
        "status": _text(checks=pa.Check.isin(["ok", "no_frames", "error"])),
        "reason": _text(nullable=True, required=False),  # why an item has no vector
        "frames": _num("int64", nullable=False),
        "dim": _num("int64", nullable=False),
        "vector": pa.Column(object),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["asset_id", "segment"],
    name="eval_embeddings",
)

decontamination = pa.DataFrameSchema(
    {
        "clip_id": _text(unique=True),
        "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        "source_shard": _text(),
        "contaminated": pa.Column("boolean", nullable=False),
        "method": _text(nullable=True),  # perceptual, semantic or perceptual+semantic
        "perceptual_share": _num(),  # share of the clip's sampled frames with a PDQ match in eval material
        "perceptual_eval_asset": _text(nullable=True),
        "cosine": _num(),  # best cosine to an eval segment's embedding
        "semantic_eval_asset": _text(nullable=True),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    name="decontamination",
)

_CLIP_KEYS = {
    "clip_id": _text(),
    "asset_id": _text(checks=pa.Check.str_matches(SHA256_HEX)),
    "source_shard": _text(),
    "tier": _text(nullable=True),
}

annotations = pa.DataFrameSchema(
    {
        **_CLIP_KEYS,
        "kind": _text(checks=pa.Check.isin(["camera", "captions", "tags"])),
        "status": _text(checks=pa.Check.isin(["ok", "partial", "invalid", "error", "no_frames", "not_applicable"])),
        "reason": _text(nullable=True),
        "value": _text(nullable=True),  # JSON record of the kind's schema (also kept for invalid replies)
        "levels": _text(nullable=True),  # captions: JSON status per level (ok / off_target: … / invalid: …)
        "raw_reply": _text(nullable=True),  # a model server's reply text, as received
        "model_id": _text(),
        "prompt_version": _text(),
        "schema_version": _text(),
        "frames": _num("int64", nullable=False),
        "attempts": _num("int64", nullable=False),
        "evidence": _text(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "kind", "producer_version"],
    checks=[pa.Check(lambda df: ~df["status"].isin(["ok", "partial"]) | df["value"].notna(),
                     error="ok and partial annotations need a value"),
            pa.Check(lambda df: (df["status"] == "ok") | df["reason"].notna(), error="failed annotations need a reason")],
    name="annotations",
)

latents = pa.DataFrameSchema(
    {
        **_CLIP_KEYS,
        "status": _text(checks=pa.Check.isin(["ok", "too_short", "error"])),
        "reason": _text(nullable=True),
        "resolution": _num("Int64", required=False),  # the short side encoded at (latents.resolutions)
        "bucket": _text(nullable=True),  # f<frames>_<width>x<height>
        "frames": _num("Int64"),
        "width": _num("Int64"),
        "height": _num("Int64"),
        "aspect_ratio": _text(nullable=True),
        "crop": _text(nullable=True),  # JSON [x, y, w, h] in upright pixels of the file read
        "frame_indices": _text(nullable=True),  # JSON list of the encoded frames' indices in the file read
        "latent_key": _text(nullable=True),
        "latent_shape": _text(nullable=True),  # JSON [C, T, H, W]
        # the file the frames were read from: "raw" (the source) or "ladder:<rung>" (that clip_ladder rung)
        "frames_from": _text(nullable=True, checks=pa.Check.str_matches(r"^(raw|ladder:.+)$")),
        "dtype": _text(),
        "mean": _num(),
        "std": _num(),
        "channel_mean": _text(nullable=True, required=False),  # JSON, one per latent channel
        "channel_std": _text(nullable=True, required=False),
        "encode_run": _text(nullable=True, required=False),  # the run that wrote the row: its cohort
        "nan_count": _num("Int64"),
        "inf_count": _num("Int64"),
        "frames_decoded": _num("int64", nullable=False),
        "seconds": _num(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "producer_version"],
    checks=[pa.Check(lambda df: (df["status"] != "ok") | df["latent_key"].notna(), error="ok latents need a key")],
    name="latents",
)

text_embeddings = pa.DataFrameSchema(
    {
        **_CLIP_KEYS,
        "caption_version": _text(),
        "caption_level": _text(checks=pa.Check.isin(["level_0", "level_1", "level_2", "level_3"])),
        "text_sha256": _text(checks=pa.Check.str_matches(SHA256_HEX)),
        # absent in tables written before encode failures were rows: every row there is ok
        "status": _text(checks=pa.Check.isin(["ok", "error"]), required=False),
        "reason": _text(nullable=True, required=False),  # why a row has no vector
        "dim": _num("int64", nullable=True),
        "vector": pa.Column(object, nullable=True),  # float32 little-endian bytes, L2-normalised
        # a per-token encoder's states object (tokens x dim) and the length a trainer pads them to;
        # absent in tables written before per-token encoders, null for a pooled encoder
        "token_key": _text(nullable=True, required=False),
        "tokens": _num("Int64", nullable=True, required=False),
        "max_tokens": _num("Int64", nullable=True, required=False),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "caption_version", "caption_level", "producer_version"],
    name="text_embeddings",
)

clip_ladder = pa.DataFrameSchema(
    {
        **_CLIP_KEYS,
        "rung": _text(),  # <short side>p<fps>, e.g. 512p24
        "status": _text(checks=pa.Check.isin(["ok", "error"])),
        "reason": _text(nullable=True),
        "short_side": _num("Int64"),
        "width": _num("Int64"),
        "height": _num("Int64"),
        "fps": _num(),
        "source_fps": _num(),
        "frames": _num("Int64"),
        "bytes": _num("Int64"),
        "bitrate_bps": _num(),
        "duration_s": _num(),
        "aspect_ratio": _text(),  # nearest configured ratio
        "crop": _text(),  # JSON [x, y, w, h] of that ratio in upright source pixels
        "crop_baked": pa.Column("boolean", nullable=False),
        "blob_key": _text(nullable=True),
        "frames_decoded": _num("int64", nullable=False),  # by the one decode that produced all of the clip's rungs
        "encoder_version": _text(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "rung", "producer_version"],
    checks=[pa.Check(lambda df: (df["status"] != "ok") | df["blob_key"].notna(), error="ok rungs need a blob")],
    name="clip_ladder",
)

clip_audio = pa.DataFrameSchema(
    {
        **_CLIP_KEYS,
        "audio_status": _text(checks=pa.Check.isin(["ok", "none", "silent", "broken", "unsynced"])),
        "reason": _text(nullable=True),
        "drift_ms": _num(),
        "codec": _text(nullable=True),
        "rate": _num("Int64"),
        "channels": _num("Int64"),
        "blob_key": _text(nullable=True),
        "duration_s": _num(),
        "loudness_dbfs": _num(),
        "peak_dbfs": _num(),
        "silence_share": _num(),
        "clipping_share": _num(),
        "content_guess": _text(nullable=True),  # speech / music / ambience / silence (rule-based)
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "producer_version"],
    name="clip_audio",
)

audio_annotations = pa.DataFrameSchema(
    {
        **_CLIP_KEYS,
        "kind": _text(checks=pa.Check.isin(["speech", "tags", "loudness", "language", "audio_caption", "av_caption"])),
        "status": _text(checks=pa.Check.isin(["ok", "invalid", "error"])),
        "reason": _text(nullable=True),
        "value": _text(nullable=True),  # JSON record of the kind
        "model_id": _text(),
        "seconds": _num(),
        "producer_version": _text(),
    },
    coerce=True,
    strict=True,
    unique=["clip_id", "kind", "producer_version"],
    name="audio_annotations",
)


def _with_row_versions(schema: pa.DataFrameSchema) -> pa.DataFrameSchema:
    """Every derived row says what it read and how often it was tried (see ``storage.rows``)."""
    return schema.add_columns({
        "input_version": _text(nullable=True),
        "runs": _num("Int64", checks=pa.Check.ge(0)),
        "failure": _text(nullable=True, checks=pa.Check.isin(["transient", "final"])),
    })


SCHEMAS: dict[str, pa.DataFrameSchema] = {
    "raw_inventory": raw_inventory,
    "eval_split": eval_split,
    "eval_assets": eval_assets,
    "video_probe": video_probe,
    "frame_index": frame_index,
    "video_fingerprints": video_fingerprints,
    "video_analysis": video_analysis,
    "context_frames": context_frames,
    "clips": clips,
    "clip_scores": clip_scores,
    "clip_embeddings": clip_embeddings,
    "dedup_groups": dedup_groups,
    "selection": selection,
    "decontamination": decontamination,
    "annotations": annotations,
    "latents": latents,
    "text_embeddings": text_embeddings,
    "clip_clusters": clip_clusters,
    "golden_captions": golden_captions,
    "caption_qc": caption_qc,
    "clip_ladder": clip_ladder,
    "clip_audio": clip_audio,
    "audio_annotations": audio_annotations,
    # views of selection: the same rows split by decision
    "selection_pass": selection,
    "selection_reject": selection,
    "safety_reports": safety_reports,
    # eval vault copies of the media tables (same shapes, written only under the vault root)
    "eval_video_probe": video_probe,
    "eval_video_analysis": video_analysis,
    "eval_context_frames": context_frames,
    "eval_embeddings": eval_embeddings,
}

SCHEMAS = {name: _with_row_versions(schema) if "producer_version" in schema.columns else schema
           for name, schema in SCHEMAS.items()}
