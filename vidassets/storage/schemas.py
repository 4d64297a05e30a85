"""pandera schemas of every catalog table, keyed by table name. Tables are validated on write."""

from __future__ import annotations

import pandera.pandas as pa

SHA256_HEX = r"^[0-9a-f]{64}$"


def _text(nullable: bool = False, **kw) -> pa.Column:
    return pa.Column(str, nullable=nullable, **kw)


# Provenance columns travel with the asset through every later table (joined by asset_id / uri).
PROVENANCE_COLUMNS = {
    "license": _text(nullable=True),
    "territory": _text(nullable=True),
    "crawl_url": _text(nullable=True),
    "provenance": _text(),  # the merged sidecar entry as JSON, all keys included
}

raw_inventory = pa.DataFrameSchema(
    {
        "uri": _text(unique=True),
        "key": _text(),  # bucket-relative key of the object (the tar for a member)
        "member": _text(nullable=True),  # path inside the tar, for tar members
        "member_offset": pa.Column("Int64", nullable=True),  # data offset in an uncompressed tar
        "container": _text(checks=pa.Check.isin(["file", "tar_member", "tar"])),
        "media_type": _text(checks=pa.Check.isin(["video", "other"])),
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

SCHEMAS: dict[str, pa.DataFrameSchema] = {
    "raw_inventory": raw_inventory,
    "eval_split": eval_split,
    "eval_assets": eval_assets,
}
