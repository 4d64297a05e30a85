"""Frozen dataset snapshots (``snapshots/v<N>/`` in the store) and takedowns. No Dagster here.

A snapshot is a manifest over the catalog: every training sample (a selected clip with latents)
with its provenance, shape bucket, mixture stream, tier and the producer version of every score,
annotation, latent and text embedding it uses, plus the recipe that produced it. It never copies
media: samples point at content-addressed blobs, so two snapshots share their latents. Snapshots
are immutable (written once, under a new version number).

A snapshot is published only when it passes the eval-leakage check (no sample matches eval material,
every sample's asset was routed to train by the carve-out): the check runs before ``meta.json`` is written, and a
failing snapshot is kept for inspection under its number with ``failed.json`` instead. Readers only
see published snapshots (those with ``meta.json``).

Takedowns are tombstones, one object each under ``takedowns/tombstones/`` (written create-if-absent,
so concurrent writers never lose one another's): an asset_id, a source shard, a source tier or a
license. A shard, tier or license tombstone takes down the *copies* it matches; an asset is out when
every copy of it is (or its asset_id is tombstoned), and otherwise keeps a remaining copy as its
source. The next snapshot excludes every derived sample of such assets, with the reason recorded,
and nothing is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from vidassets.curate.curriculum import Curriculum, cluster_group, stream_of
from vidassets.derive.labels import caption_texts, current_captions, usable_captions
from vidassets.derive.text_embeddings import text_ok
from vidassets.storage.objects import ObjectStore
from vidassets.storage.parquet import from_parquet_bytes, to_parquet_bytes
from vidassets.storage.rows import RowVersion, matches, records
from vidassets.storage.tables import TableStore

VERSION = "snapshot-v1"

TOMBSTONES = "takedowns/tombstones/"
LEGACY_TOMBSTONES = "takedowns/tombstones.json"  # one shared file (read-modify-write): still read
SNAPSHOTS = "snapshots"
KINDS = ("asset_id", "source_shard", "source_tier", "license")


@dataclass(frozen=True)
class Tombstone:
    kind: str  # asset_id | source_shard | source_tier | license
    value: str
    reason: str
    added: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"takedown kind must be one of {KINDS}, not {self.kind!r}")


def _tombstone_key(kind: str, value: str) -> str:
    return f"{TOMBSTONES}{hashlib.sha256(f'{kind}={value}'.encode()).hexdigest()[:32]}.json"


def read_tombstones(objects: ObjectStore) -> list[Tombstone]:
    stones = [Tombstone(**t) for t in json.loads(objects.get_bytes(LEGACY_TOMBSTONES))] \
        if objects.exists(LEGACY_TOMBSTONES) else []
    for info in objects.list(TOMBSTONES):
        if info.key.endswith(".json"):
            stones.append(Tombstone(**json.loads(objects.get_bytes(info.key))))
    unique = {(s.kind, s.value): s for s in sorted(stones, key=lambda s: (s.added, s.kind, s.value), reverse=True)}
    return sorted(unique.values(), key=lambda s: (s.added, s.kind, s.value))


def add_tombstone(objects: ObjectStore, kind: str, value: str, reason: str) -> Tombstone:
    """Write one tombstone as its own object (create-if-absent): two writers at once both land; the
    same (kind, value) twice keeps the first."""
    stone = Tombstone(kind, value, reason, datetime.now(UTC).isoformat(timespec="seconds"))
    key = _tombstone_key(kind, value)
    if not objects.put_if_absent(key, json.dumps(asdict(stone), indent=1).encode()):
        return Tombstone(**json.loads(objects.get_bytes(key)))
    return stone


def clear_tombstones(objects: ObjectStore) -> None:
    """Lift every takedown (tests, and an operator starting over)."""
    for info in list(objects.list(TOMBSTONES)):
        objects.delete(info.key)
    if objects.exists(LEGACY_TOMBSTONES):
        objects.delete(LEGACY_TOMBSTONES)


def group_copies(copies: pd.DataFrame, fingerprints: pd.DataFrame, tombstones: list[Tombstone]) -> pd.DataFrame:
    """asset_id -> ``copies``: every copy still up of the asset's footage — its exact copies and
    those of the near-duplicates decided onto it (``video_fingerprints.near_duplicate_of``) — as a
    JSON list of {asset_id, uri, source_tier, license}: the licenses a sample's footage came with."""
    hit = _tombstoned(copies, tombstones)
    down = {s.value for s in tombstones if s.kind == "asset_id"}
    alive = copies[(hit == "") & ~copies.asset_id.isin(down)]
    owner = {a: a for a in alive.asset_id}
    if len(fingerprints) and "near_duplicate_of" in fingerprints:
        decided = fingerprints[(fingerprints.status == "ok") & fingerprints.near_duplicate_of.notna()]
        owner.update(dict(zip(decided.asset_id, decided.near_duplicate_of, strict=True)))
    listed: dict[str, list[dict]] = {}
    for r in alive.sort_values("uri").itertuples():
        listed.setdefault(owner.get(r.asset_id, r.asset_id), []).append(
            {"asset_id": r.asset_id, "uri": r.uri, "source_tier": r.source_tier,
             "license": r.license if isinstance(r.license, str) else None})
    return pd.DataFrame({"asset_id": list(listed), "copies": [json.dumps(v, sort_keys=True) for v in listed.values()]},
                        columns=["asset_id", "copies"])


def _tombstoned(copies: pd.DataFrame, tombstones: list[Tombstone]) -> pd.Series:
    """Per inventory copy: why a shard, tier or license tombstone takes it down ('' when none does)."""
    hit = pd.Series("", index=copies.index, dtype=object)
    for stone in tombstones:
        if stone.kind != "asset_id":
            match = (copies[stone.kind].astype(str) == stone.value) & (hit == "")
            hit[match] = f"{stone.kind}={stone.value}: {stone.reason}"
    return hit


def takedown_sources(copies: pd.DataFrame, tombstones: list[Tombstone]) -> tuple[pd.DataFrame, dict[str, str]]:
    """(the source copy of every asset still up, asset_id -> why it is down). ``copies``: every ok
    inventory row (asset_id, uri, source_shard, source_tier, drop_id, license). A shard, tier or
    license tombstone takes down the copies it matches; an asset is down when all its copies are,
    or when its asset_id is tombstoned. An asset still up keeps its canonical copy as its source
    when that copy is up, else its lowest-URI remaining copy."""
    down_assets = {s.value: f"asset_id={s.value}: {s.reason}" for s in tombstones if s.kind == "asset_id"}
    hit = _tombstoned(copies, tombstones)
    alive = copies[hit == ""]
    for asset, reasons in hit[hit != ""].groupby(copies.loc[hit != "", "asset_id"]):
        if asset not in set(alive.asset_id) and asset not in down_assets:
            down_assets[asset] = "; ".join(sorted(set(reasons)))
    up = alive[~alive.asset_id.isin(set(down_assets))]
    order = up.assign(_copy=up.duplicate_of.notna()).sort_values(["_copy", "uri"])
    sources = order.drop_duplicates("asset_id").drop(columns=["_copy", "duplicate_of"])
    return sources, down_assets


def taken_down_assets(objects: ObjectStore, tables: Any) -> set[str]:
    """Every asset a takedown took down (its asset_id tombstoned, or each of its copies matched by
    a shard, tier or license tombstone); reads the inventory only when a tombstone exists."""
    stones = read_tombstones(objects)
    if not stones:
        return set()
    inventory = tables.read_all("raw_inventory")
    copies = inventory[inventory.status == "ok"].dropna(subset=["asset_id"]) if len(inventory) else inventory
    if not len(copies):
        return {s.value for s in stones if s.kind == "asset_id"}
    return set(takedown_sources(copies, stones)[1])


def taken_down_clips(objects: ObjectStore, tables: Any, version: int) -> set[str]:
    """The samples of snapshot ``version`` whose asset a takedown has taken down since (what a run's
    loader skips)."""
    down = taken_down_assets(objects, tables)
    if not down:
        return set()
    samples = read_snapshot(objects, version)
    return set(samples.loc[samples.asset_id.isin(down), "clip_id"])


def snapshot_versions(objects: ObjectStore, failed: bool = False) -> list[int]:
    """Published snapshot versions, oldest first (``failed=True``: those that failed the leak check)."""
    marker = "failed" if failed else "meta"
    found = set()
    for info in objects.list(SNAPSHOTS):
        m = re.match(rf"{SNAPSHOTS}/v(\d+)/{marker}\.json$", info.key)
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


def leak_findings(samples: pd.DataFrame, decontamination: pd.DataFrame, train_asset_ids: set[str]) -> dict[str, list[str]]:
    """Samples that must never reach training: clips decontamination found matching eval material,
    and clips of assets the carve-out did not route to train (an allowlist: the training side never
    reads the eval vault). Empty lists = the snapshot may be published."""
    contaminated = (set(decontamination.loc[decontamination.contaminated.astype(bool), "clip_id"])
                    if len(decontamination) else set())
    return {"matching_eval_material": sorted(set(samples.clip_id) & contaminated),
            "not_routed_to_train": sorted(set(samples.asset_id) - train_asset_ids)}


def read_snapshot(objects: ObjectStore, version: int, part: str = "samples") -> pd.DataFrame:
    key = f"{SNAPSHOTS}/v{version}/{part}.parquet"
    if not objects.exists(key):
        raise FileNotFoundError(f"snapshot v{version} has no {part} (known: {snapshot_versions(objects)})")
    return from_parquet_bytes(objects.get_bytes(key))


def _latents_by_resolution(latents: pd.DataFrame) -> dict[str, str]:
    """clip_id -> JSON {resolution: {bucket, latent_key, latent_shape, latent_version}} of its
    current ok latents rows."""
    out: dict[str, dict] = {}
    for r in latents.itertuples() if len(latents) else []:
        out.setdefault(r.clip_id, {})[str(int(r.resolution))] = {
            "bucket": r.bucket, "latent_key": r.latent_key, "latent_shape": r.latent_shape,
            "latent_version": r.producer_version}
    return {c: json.dumps(v, sort_keys=True) for c, v in out.items()}


def samples_at_resolutions(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per sample and resolution it has latents at (its ``latents``), the row's ``bucket``,
    ``latent_key``, ``latent_shape``, ``latent_version`` those of that resolution, and ``primary``
    true for the resolution a sample needs (the first configured). A snapshot from before
    ``latents.resolutions`` gives its rows as they are (resolution unknown, every row primary)."""
    if "latents" not in samples or not len(samples):
        return samples.assign(resolution=pd.Series(pd.NA, index=samples.index, dtype="Int64"), primary=True)
    rows = []
    for sample in samples.to_dict("records"):
        by_resolution = json.loads(sample["latents"]) if isinstance(sample["latents"], str) else {}
        if not by_resolution:
            rows.append({**sample, "resolution": pd.NA, "primary": True})
        for resolution, where in by_resolution.items():
            rows.append({**sample, **where, "resolution": int(resolution),
                         "primary": where["latent_key"] == sample["latent_key"]})
    return pd.DataFrame(rows).astype({"resolution": "Int64"})


def snapshot_meta(objects: ObjectStore, version: int) -> dict[str, Any]:
    return json.loads(objects.get_bytes(f"{SNAPSHOTS}/v{version}/meta.json"))


AUDIO_COLUMNS = ["speech_share", "audio_tag", "language", "loudness_lufs", "audio_caption", "av_caption"]


def audio_fields(annotations: pd.DataFrame, versions: Mapping[str, str]) -> pd.DataFrame:
    """One row per clip with the audio annotations of the current kind versions (ok rows only);
    ``audio_versions`` names the version of each field a sample carries."""
    columns = ["clip_id", *AUDIO_COLUMNS, "audio_versions"]
    if not len(annotations) or not versions:
        return pd.DataFrame(columns=columns)
    current = annotations[(annotations.status == "ok")
                          & (annotations.producer_version == annotations.kind.map(dict(versions)))]
    out: dict[str, dict[str, Any]] = {}
    for r in current.itertuples():
        value = json.loads(r.value) if r.value else {}
        row = out.setdefault(r.clip_id, {"clip_id": r.clip_id, "audio_versions": {}})
        row["audio_versions"][r.kind] = r.producer_version
        if r.kind == "speech":
            row["speech_share"] = value.get("speech_share")
        elif r.kind == "tags":
            row["audio_tag"] = value.get("label")
        elif r.kind == "language":
            row["language"] = value.get("language")
        elif r.kind == "loudness":
            row["loudness_lufs"] = value.get("integrated_lufs")
        elif r.kind in ("audio_caption", "av_caption"):
            row[r.kind] = value.get("caption")
    rows = [{**{c: None for c in columns}, **r, "audio_versions": json.dumps(r["audio_versions"], sort_keys=True)}
            for r in out.values()]
    return pd.DataFrame(rows, columns=columns)


def build_samples(tables: TableStore, tombstones: list[Tombstone], caption_version: str, caption_level: str,
                  latent_versions: Callable[[dict], Mapping[int, RowVersion]], text_version: str,
                  missing_caption: str = "exclude",
                  audio_versions: Mapping[str, str] | None = None, audio: Any = None,
                  curriculum: Curriculum | None = None, cluster_version: str | None = None,
                  ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(samples, excluded, decisions) from the catalog tables as they are now: only latents of the
    current producer version computed from the current inputs count (``latent_versions(clip row)``:
    resolution -> that version, the first resolution the one a sample needs; ``latents`` holds every
    resolution's, JSON resolution -> bucket, key, shape, version).
    A sample without a usable caption of ``caption_level`` is excluded (``no_caption``) or, with
    ``missing_caption="include"``, kept with ``has_caption`` false. Each sample's ``stream`` is the
    first of the curriculum's streams (then the audio choice's) it matches, else its source tier;
    ``cluster`` its semantic cluster of ``cluster_version`` (``clip_clusters``), when there is one."""
    sel = tables.read_or_empty("selection")
    decisions = sel[["clip_id", "asset_id", "decision", "first_failed_rule", "tier", "recipe_hash"]].copy() if len(sel) else pd.DataFrame(
        columns=["clip_id", "asset_id", "decision", "first_failed_rule", "tier", "recipe_hash"])
    chosen = sel[sel.decision == "pass"] if len(sel) else sel
    inventory = tables.read_all("raw_inventory")
    copies = inventory[inventory.status == "ok"].dropna(subset=["asset_id"])[
        ["asset_id", "uri", "source_shard", "source_tier", "drop_id", "license", "duplicate_of"]]
    source, taken_down = takedown_sources(copies, tombstones)
    clips = tables.read_all("clips")
    clips = clips.assign(modality=clips.media_type.fillna("video") if "media_type" in clips else "video")[
        ["clip_id", "modality", "first_frame", "last_frame", "start_s", "end_s", "duration_s"]]
    all_latents = lat = tables.read_all("latents")
    clip_rows = {r["clip_id"]: r for r in records(tables.read_all("clips"))}
    resolution_of, primary = [], None
    for r in records(lat):  # the resolution whose current version wrote the row (None: not current)
        wanted = latent_versions(clip_rows[r["clip_id"]]) if r["clip_id"] in clip_rows else {}
        primary = next(iter(wanted), primary)
        resolution_of.append(next((res for res, v in wanted.items() if matches(r, v)), None))
    if len(lat):
        lat = lat.assign(resolution=pd.Series(resolution_of, index=lat.index, dtype="Int64"))
        lat = lat[lat.resolution.notna() & (lat.status == "ok")]
    every_resolution = _latents_by_resolution(lat)
    lat = lat[lat.resolution == primary] if len(lat) else lat
    ann = tables.read_all("annotations")
    caps = current_captions(ann, caption_version)
    usable_text, no_text = caption_texts(ann, caption_version, caption_level)
    text = tables.read_all("text_embeddings")
    text = (text[(text.producer_version == text_version) & (text.caption_version == caption_version)
                 & (text.caption_level == caption_level) & text_ok(text)] if len(text) else text)
    scores = tables.read_all("clip_scores")
    score_versions = (scores.groupby("clip_id").apply(
        lambda g: json.dumps(dict(zip(g.score, g.producer_version, strict=True)), sort_keys=True), include_groups=False)
        .rename("score_versions") if len(scores) else pd.Series(name="score_versions", dtype=str))
    frame = (chosen[["clip_id", "asset_id", "tier", "rank_score"]]
             .merge(source.rename(columns={"uri": "source_uri"}), on="asset_id", how="left")
             .merge(group_copies(copies, tables.read_all("video_fingerprints"), tombstones), on="asset_id", how="left")
             .merge(clips, on="clip_id", how="left")
             .merge(score_versions, left_on="clip_id", right_index=True, how="left"))
    excluded = []
    # clips that flipped to reject keep their derived rows (not current): say why they are out
    derived = set(all_latents.clip_id) if len(all_latents) else set()
    flipped = sel[(sel.decision == "reject") & sel.clip_id.isin(derived)] if len(sel) else sel
    excluded += [{"clip_id": r.clip_id, "reason": "deselected",
                  "detail": f"first failed rule: {r.first_failed_rule} (its derived rows are kept, not current)"}
                 for r in flipped.itertuples()]
    down = frame.asset_id.isin(set(taken_down))
    excluded += [{"clip_id": r.clip_id, "reason": "takedown", "detail": taken_down[r.asset_id]}
                 for r in frame[down].itertuples()]
    frame = frame[~down]
    frame = frame.merge(lat[["clip_id", "bucket", "latent_key", "latent_shape", "dtype", "producer_version"]]
                        .rename(columns={"producer_version": "latent_version"}), on="clip_id", how="left")
    missing = frame[frame.latent_key.isna()]
    excluded += [{"clip_id": c, "reason": "no_latents", "detail": f"no current ok latents at resolution {primary}"} for c in missing.clip_id]
    frame = frame[frame.latent_key.notna()]
    frame["latents"] = [every_resolution.get(c) for c in frame.clip_id]
    frame["has_caption"] = frame.clip_id.isin(set(usable_text))
    if missing_caption == "exclude":
        excluded += [{"clip_id": c, "reason": "no_caption",
                      "detail": f"no usable {caption_level} of {caption_version}: {no_text.get(c, 'no caption row')}"}
                     for c in frame.loc[~frame.has_caption, "clip_id"]]
        frame = frame[frame.has_caption]
    caps = caps.assign(captions=[usable_captions(r.value, getattr(r, "levels", None)) for r in caps.itertuples()]) if len(caps) else \
        caps.assign(captions=pd.Series(dtype=object))
    frame = frame.merge(caps[["clip_id", "captions"]], on="clip_id", how="left")
    frame["caption_version"] = caption_version
    # the text embedding of exactly the caption text the sample shows (none without a usable caption)
    wanted = pd.DataFrame({"clip_id": list(usable_text),
                           "text_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in usable_text.values()]})
    embedded = text[["clip_id", "text_sha256"]].merge(wanted, on=["clip_id", "text_sha256"]) if len(text) else wanted[:0]
    frame = frame.merge(embedded, on="clip_id", how="left")
    frame["caption_level"] = caption_level
    frame["text_embedding_version"] = text_version
    frame = frame.merge(audio_fields(tables.read_all("audio_annotations"), audio_versions or {}), on="clip_id",
                        how="left")
    if audio is not None and audio.languages is not None:
        listed = frame.language.isin(list(audio.languages))
        unknown = frame.language.isna()
        out = ~listed & (~unknown | audio.require_language)
        excluded += [{"clip_id": r.clip_id, "reason": "language",
                      "detail": f"spoken language {r.language or 'not detected'} not in {list(audio.languages)}"}
                     for r in frame[out].itertuples()]
        frame = frame[~out]
    frame = frame.merge(clusters_of(tables.read_all("clip_clusters"),
                                    cluster_version), on="clip_id", how="left")
    groups = curriculum.cluster_groups if curriculum is not None else {}
    frame["cluster_group"] = [cluster_group(c, groups) for c in frame.cluster] if len(frame) else []
    streams = [*(curriculum.streams if curriculum is not None else []), *(audio.streams if audio is not None else [])]
    frame["stream"] = [stream_of(r, streams) for r in frame.to_dict("records")] if len(frame) else []
    columns = ["clip_id", "asset_id", "source_uri", "source_shard", "source_tier", "drop_id", "license", "copies",
               "tier", "stream",
               "modality", "cluster", "cluster_group",
               "bucket", "first_frame", "last_frame", "start_s", "end_s", "duration_s", "latent_key", "latent_shape",
               "dtype", "latent_version", "latents", "captions", "has_caption", "caption_version", "caption_level", "text_sha256",
               "text_embedding_version", "score_versions", "rank_score", *AUDIO_COLUMNS, "audio_versions"]
    samples = frame[columns].sort_values("clip_id").reset_index(drop=True)
    return samples, pd.DataFrame(excluded, columns=["clip_id", "reason", "detail"]), decisions


def clusters_of(table: pd.DataFrame | None, version: str | None) -> pd.DataFrame:
    """clip_id -> cluster of the given clustering version (none known: an empty frame)."""
    if table is None or not len(table) or version is None:
        return pd.DataFrame({"clip_id": pd.Series(dtype=str), "cluster": pd.Series(dtype="Int64")})
    current = table[(table.producer_version == version) & table.cluster.notna()]
    return current[["clip_id", "cluster"]].astype({"cluster": "Int64"})


def write_snapshot(objects: ObjectStore, samples: pd.DataFrame, excluded: pd.DataFrame, decisions: pd.DataFrame,
                   meta: dict[str, Any], recipe_text: str, leaks: dict[str, list[str]] | None = None) -> int:
    """Write the next snapshot version; never overwrites one. With any ``leaks`` it is written as
    failed (``failed.json``, never ``meta.json``): kept for inspection, invisible to every reader."""
    version = max(snapshot_versions(objects) + snapshot_versions(objects, failed=True) + [0]) + 1
    while not objects.put_if_absent(f"{SNAPSHOTS}/v{version}/claim", b""):  # a concurrent writer took it
        version += 1
    prefix = f"{SNAPSHOTS}/v{version}"
    objects.put_if_absent(f"{prefix}/samples.parquet", to_parquet_bytes(samples))
    objects.put_if_absent(f"{prefix}/excluded.parquet", to_parquet_bytes(excluded))
    objects.put_if_absent(f"{prefix}/decisions.parquet", to_parquet_bytes(decisions))
    objects.put_if_absent(f"{prefix}/recipe.yaml", recipe_text.encode())
    full = {**meta, "version": version, "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "samples": len(samples), "excluded": len(excluded)}
    failed = leaks is not None and any(leaks.values())
    if leaks is not None:
        full["leak_check"] = leaks
    marker = "failed.json" if failed else "meta.json"
    if not objects.put_if_absent(f"{prefix}/{marker}", json.dumps(full, indent=1, sort_keys=True).encode()):
        raise RuntimeError(f"snapshot v{version} was written concurrently; run again")
    return version


def diff_snapshots(objects: ObjectStore, a: int, b: int) -> pd.DataFrame:
    """Samples added and removed from va to vb, each with a reason: new data, takedown, recipe change,
    model change (a score version changed), no latents."""
    sa, sb = read_snapshot(objects, a), read_snapshot(objects, b)
    excluded_b = read_snapshot(objects, b, "excluded").set_index("clip_id")
    decisions_a = read_snapshot(objects, a, "decisions").set_index("clip_id")
    decisions_b = read_snapshot(objects, b, "decisions").set_index("clip_id")
    meta_a, meta_b = snapshot_meta(objects, a), snapshot_meta(objects, b)
    drops_a = set(sa.source_shard) | set(read_snapshot(objects, a, "decisions").asset_id.dropna())
    rows = []
    for clip in sorted(set(sb.clip_id) - set(sa.clip_id)):
        row = sb[sb.clip_id == clip].iloc[0]
        if clip not in decisions_a.index and row.asset_id not in drops_a:
            reason = "new data"
        elif meta_a["versions"] != meta_b["versions"] and _score_versions_changed(sa, sb, clip):
            reason = "model change"
        elif meta_a["recipe_hash"] != meta_b["recipe_hash"]:
            reason = "recipe change"
        else:
            reason = "latents added"
        rows.append({"clip_id": clip, "change": "added", "reason": reason, "asset_id": row.asset_id})
    for clip in sorted(set(sa.clip_id) - set(sb.clip_id)):
        row = sa[sa.clip_id == clip].iloc[0]
        if clip in excluded_b.index:
            ex = excluded_b.loc[[clip]].iloc[0]
            reason = "takedown" if ex.reason == "takedown" else ex.reason
            detail = ex.detail
        elif clip in decisions_b.index and decisions_b.loc[clip, "decision"] == "reject":
            reason = "model change" if meta_a["versions"] != meta_b["versions"] else "recipe change"
            detail = f"first failed rule: {decisions_b.loc[clip, 'first_failed_rule']}"
        else:
            reason, detail = "clip no longer exists", None
        rows.append({"clip_id": clip, "change": "removed", "reason": reason, "asset_id": row.asset_id, "detail": detail})
    return pd.DataFrame(rows, columns=["clip_id", "change", "reason", "asset_id", "detail"])


def _score_versions_changed(sa: pd.DataFrame, sb: pd.DataFrame, clip: str) -> bool:
    va = set(sa.score_versions.dropna())
    vb = sb.loc[sb.clip_id == clip, "score_versions"].iloc[0]
    return vb not in va


def resolve_snapshot(objects: ObjectStore, wanted: int | None) -> int:
    found = snapshot_versions(objects)
    if not found:
        raise FileNotFoundError("no snapshot yet: run `vidassets snapshot create` first")
    if wanted is None:
        return found[-1]
    if wanted not in found:
        raise FileNotFoundError(f"snapshot v{wanted} does not exist (known: {found})")
    return wanted
