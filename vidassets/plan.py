"""``vidassets plan-change``: what an edited configuration would recompute, before running anything.

Compares the producer versions stored on the rows in the store with the versions the new settings
derive, asset by asset, and counts the rows that would be computed again (row-exact: a row whose
(input, producer version) already exists is reused). Where a cheap stage can be replayed exactly
from saved tables (new clip windows from saved shots, new selection decisions from saved scores),
the plan replays it to count newly created clips and newly admitted clips. Costs come from measured
per-row timings: the duration of each asset's recent steps in the Dagster instance divided by the
rows those steps computed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from vidassets.config import Settings
from vidassets.storage.tables import TableStore

ORDER = ("raw_inventory", "eval_split", "video_probe", "frame_index", "video_analysis", "clips", "eval_features",
         "clip_scores", "clip_embeddings", "dedup_groups", "decontamination", "selection", "annotations", "latents",
         "text_embeddings")
UPSTREAM = {
    "eval_split": ("raw_inventory",), "video_probe": ("eval_split",), "frame_index": ("video_probe",),
    "video_analysis": ("video_probe",), "clips": ("video_analysis",), "eval_features": ("eval_split",),
    "clip_scores": ("clips", "frame_index"), "clip_embeddings": ("clips",),
    "dedup_groups": ("clip_embeddings", "clips"), "decontamination": ("eval_features", "clip_embeddings"),
    "selection": ("dedup_groups", "clip_scores", "decontamination"), "annotations": ("selection", "clips"),
    "latents": ("selection", "clips"), "text_embeddings": ("annotations", "selection"),
}
# metadata key(s) holding how many rows a step computed, per asset (default: rows_computed)
_COMPUTED_KEYS = {"latents": "encoded", "annotations": "computed_by_kind", "dedup_groups": "rows_out",
                  "decontamination": "rows_in", "selection": "rows_in", "text_embeddings": "rows_computed"}


@dataclass
class AssetPlan:
    asset: str
    stale: bool  # its code version changes
    reason: str
    rows_now: int
    rows_to_compute: int
    exact: bool  # False when the count depends on an upstream result the plan cannot replay
    seconds_per_row: float | None = None
    estimated_seconds: float | None = None
    old_versions: list[str] | None = None
    new_version: str = ""


def _versions(frame: pd.DataFrame) -> set[str]:
    return set(frame["producer_version"]) if len(frame) and "producer_version" in frame else set()


def plan_change(tables: TableStore, new: Settings, instance: Any = None) -> list[AssetPlan]:
    v = new.versions
    read = {name: tables.read_all(name) for name in ORDER if name != "eval_features"}
    plans: dict[str, AssetPlan] = {}
    changed: set[str] = set()

    def simple(asset: str, version: str, sticky: pd.Series | None = None) -> None:
        frame = read[asset]
        differs = frame["producer_version"] != version if len(frame) else pd.Series(dtype=bool)
        if sticky is not None and len(frame):
            differs &= ~sticky
        n = int(differs.sum()) if len(frame) else 0
        _add(plans, changed, asset, n > 0, "version changed" if n else "unchanged", len(frame), n, True,
             _versions(frame), version)

    simple("raw_inventory", v.raw_inventory)
    simple("eval_split", v.eval_split)
    probe = read["video_probe"]
    simple("video_probe", v.video_probe, probe["status"] == "quarantined" if len(probe) else None)
    simple("frame_index", v.frame_index)
    simple("video_analysis", v.video_analysis)

    # clips: replay segmentation from saved shots (no decode) to count windows that are new
    clips = read["clips"]
    new_clip_ids = set(clips["clip_id"]) if len(clips) else set()
    if len(clips) and set(clips["producer_version"]) != {v.clips} and not changed & {"video_analysis"}:
        new_clip_ids = _replay_clips(tables, new)
    added_clips = new_clip_ids - (set(clips["clip_id"]) if len(clips) else set())
    exact_clips = "video_analysis" not in changed
    _add(plans, changed, "clips", bool(added_clips) or _versions(clips) - {v.clips} != set(),
         "segmentation changed" if _versions(clips) - {v.clips} else "unchanged", len(clips), len(added_clips),
         exact_clips, _versions(clips), v.clips)

    scores = read["clip_scores"]
    stale_scores = (scores["producer_version"] != scores["score"].map(v.scores)) if len(scores) else pd.Series(dtype=bool)
    n_scores = int(stale_scores.sum()) + len(added_clips) * len(v.scores)
    which = sorted(set(scores.loc[stale_scores, "score"])) if len(scores) else []
    _add(plans, changed, "clip_scores", n_scores > 0,
         f"score version changed: {', '.join(which)}" if which else ("new clips" if added_clips else "unchanged"),
         len(scores), n_scores, exact_clips, _versions(scores), v.clip_scores)

    emb = read["clip_embeddings"]
    n_emb = (int((emb["producer_version"] != v.clip_embeddings).sum()) if len(emb) else 0) + len(added_clips)
    _add(plans, changed, "clip_embeddings", n_emb > 0, "embedder changed" if _versions(emb) - {v.clip_embeddings}
         else ("new clips" if added_clips else "unchanged"), len(emb), n_emb, exact_clips, _versions(emb),
         v.clip_embeddings)
    eval_inputs = sorted(changed & {"video_probe", "video_analysis"}) + (
        ["clip_embeddings"] if _versions(emb) - {v.clip_embeddings} else [])
    _add(plans, changed, "eval_features", bool(eval_inputs),
         f"eval vault (not counted here): {', '.join(eval_inputs)} changed" if eval_inputs else "unchanged",
         0, 0, True, None, "")

    for asset, version in (("dedup_groups", v.dedup_groups),):
        frame = read[asset]
        stale = bool(_versions(frame) - {version}) or bool(changed & set(UPSTREAM[asset]))
        _add(plans, changed, asset, stale, _why(frame, version, changed, asset), len(frame),
             len(frame) + len(added_clips) if stale else 0, exact_clips, _versions(frame), version)
    deco = read["decontamination"]
    deco_version = f"decontamination-v1+{v.dedup_groups}"
    deco_stale = bool(_versions(deco) - {deco_version}) or bool(changed & set(UPSTREAM["decontamination"]))
    _add(plans, changed, "decontamination", deco_stale, _why(deco, deco_version, changed, "decontamination"),
         len(deco), len(deco) + len(added_clips) if deco_stale else 0, exact_clips, _versions(deco), deco_version)

    # selection: replay the recipe over saved tables when nothing it reads changes (exact), else estimate
    sel = read["selection"]
    passing = set(sel.loc[sel.decision == "pass", "clip_id"]) if len(sel) else set()
    sel_stale = bool(_versions(sel) - {v.selection}) or bool(changed & set(UPSTREAM["selection"]))
    exact_selection = not (changed & set(UPSTREAM["selection"]))
    if sel_stale and exact_selection:
        passing = _replay_selection(tables, new, read)
    _add(plans, changed, "selection", sel_stale, _why(sel, v.selection, changed, "selection"), len(sel),
         len(sel) if sel_stale else 0, exact_selection, _versions(sel), v.selection)

    kinds = v.annotation_kinds
    ann = read["annotations"]
    have = set(zip(ann["clip_id"], ann["kind"], ann["producer_version"], strict=True)) if len(ann) else set()
    by_kind = {k: sum((c, k, ver) not in have for c in passing) for k, ver in kinds.items()}
    n_ann = sum(by_kind.values())
    _add(plans, changed, "annotations", n_ann > 0 or bool(_versions(ann) and not set(kinds.values()) <= _versions(ann)),
         "to annotate: " + ", ".join(f"{k} {n}" for k, n in by_kind.items() if n) if n_ann else "unchanged",
         len(ann), n_ann, exact_selection, _versions(ann), v.annotations)

    lat = read["latents"]
    have_lat = set(lat.loc[lat["producer_version"] == v.latents, "clip_id"]) if len(lat) else set()
    n_lat = len(passing - have_lat)
    _add(plans, changed, "latents", n_lat > 0, "VAE/latent (or, read from rungs, ladder) settings changed" if _versions(lat) - {v.latents} and n_lat
         else ("newly selected clips" if n_lat else "unchanged"), len(lat), n_lat, exact_selection, _versions(lat),
         v.latents)

    from vidassets.curate.selection import load_recipe

    choice = load_recipe(new.selection.recipe).captions
    caption_version = choice.version or kinds["captions"]
    te = read["text_embeddings"]
    have_te = (set(te.loc[(te.producer_version == v.text_embeddings) & (te.caption_version == caption_version)
                          & (te.caption_level == choice.level), "clip_id"]) if len(te) else set())
    caption_changes = by_kind.get("captions", 0)
    n_te = len(passing - have_te)
    _add(plans, changed, "text_embeddings", n_te > 0 or caption_changes > 0,
         "captions or encoder changed" if n_te else "unchanged", len(te), n_te, exact_selection, _versions(te),
         v.text_embeddings)

    if instance is not None:
        for p in plans.values():
            p.seconds_per_row = seconds_per_row(instance, p.asset)
            if p.seconds_per_row is not None:
                p.estimated_seconds = round(p.seconds_per_row * p.rows_to_compute, 2)
    return [plans[a] for a in ORDER if a in plans]


def _add(plans: dict, changed: set, asset: str, stale: bool, reason: str, rows_now: int, rows: int, exact: bool,
         old: set[str] | None, new_version: str) -> None:
    if stale or rows:
        changed.add(asset)
    plans[asset] = AssetPlan(asset, stale or rows > 0, reason, rows_now, rows, exact,
                             old_versions=sorted(old) if old else None, new_version=new_version)


def _why(frame: pd.DataFrame, version: str, changed: set[str], asset: str) -> str:
    if _versions(frame) - {version}:
        return "version changed"
    ups = sorted(changed & set(UPSTREAM[asset]))
    return f"upstream changed: {', '.join(ups)}" if ups else "unchanged"


def _replay_clips(tables: TableStore, settings: Settings) -> set[str]:
    from vidassets.media.partition import clip_partition, records

    ids: set[str] = set()
    for part in tables.partitions("video_analysis"):
        rows, _ = clip_partition(tables.objects, records(tables.read("video_analysis", part)), pd.DataFrame(), settings)
        ids |= {r["clip_id"] for r in rows}
    return ids


def _replay_selection(tables: TableStore, settings: Settings, read: dict[str, pd.DataFrame]) -> set[str]:
    from vidassets.curate.embeddings import vector_of
    from vidassets.curate.selection import load_recipe, select

    emb = read["clip_embeddings"]
    vectors = {r.clip_id: vector_of(r.vector) for r in emb.itertuples() if r.status == "ok"} if len(emb) else {}
    deco = read["decontamination"]
    excluded = set(deco.loc[deco.contaminated.astype(bool), "clip_id"]) if len(deco) else set()
    rows = select(load_recipe(settings.selection.recipe), read["clip_scores"], read["dedup_groups"], vectors,
                  settings.versions.selection, excluded)
    return {r["clip_id"] for r in rows if r["decision"] == "pass"}


def seconds_per_row(instance: Any, asset: str, limit: int = 20) -> float | None:
    """Measured step seconds per computed row over the asset's recent materializations."""
    from dagster import AssetKey

    records = instance.fetch_materializations(AssetKey(asset), limit=limit).records
    seconds, rows = 0.0, 0
    stats_by_run: dict[str, dict[str, float]] = {}
    for record in records:
        meta = record.asset_materialization.metadata if record.asset_materialization else {}
        computed = _computed(meta, _COMPUTED_KEYS.get(asset, "rows_computed"))
        if not computed:
            continue
        if record.run_id not in stats_by_run:
            stats_by_run[record.run_id] = {
                s.step_key: (s.end_time or 0) - (s.start_time or 0) for s in instance.get_run_step_stats(record.run_id)}
        duration = stats_by_run[record.run_id].get(asset)
        if duration:
            seconds += duration
            rows += computed
    return round(seconds / rows, 4) if rows else None


def _computed(meta: dict, key: str) -> int:
    value = meta.get(key)
    if value is None:
        return 0
    value = getattr(value, "value", value)
    if isinstance(value, dict):
        return int(sum(value.values()))
    return int(value)


def render(plans: Iterable[AssetPlan]) -> str:
    lines = [f"{'asset':<18}{'recompute':>10}{'rows now':>10}{'rows to compute':>17}{'est. seconds':>14}  why"]
    total = 0.0
    for p in plans:
        est = "" if p.estimated_seconds is None else f"{p.estimated_seconds:.1f}"
        total += p.estimated_seconds or 0.0
        mark = "yes" if p.stale else "no"
        approx = "" if p.exact else " (approx.: depends on upstream results)"
        lines.append(f"{p.asset:<18}{mark:>10}{p.rows_now:>10}{p.rows_to_compute:>17}{est:>14}  {p.reason}{approx}")
    lines.append(f"estimated total: {total:.1f} s (measured per-row step times; blank = never measured)")
    return "\n".join(lines)


def to_json(plans: Iterable[AssetPlan]) -> str:
    return json.dumps([asdict(p) for p in plans], indent=1)
