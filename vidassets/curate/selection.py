"""Selection: a validated recipe (YAML) applied to saved scores and duplicate groups. It reads
tables only: no model call and no decode, so any recipe change is cheap to re-run."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vidassets.config import ConfigError
from vidassets.curate.curriculum import Curriculum, Stream
from vidassets.curate.selection_state import CONTEXT_COLUMNS, SelectionState, source_tier
from vidassets.storage.blobs import vector_of
from vidassets.storage.input_versions import told_every_change
from vidassets.storage.rows import RowVersion, records

VERSION = "selection-v2"  # v2: real clips in a duplicate group with a model-generated clip are rejected (generated_copy)

DEFAULT_RECIPE = Path(__file__).parent / "recipes" / "default.yaml"
SCORES = Literal["optical", "motion", "static", "bitrate", "text", "quality", "nsfw", "faces"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScoreRule(_Strict):
    score: SCORES
    min: float | None = Field(default=None, ge=0, le=1)
    max: float | None = Field(default=None, ge=0, le=1)

    @property
    def name(self) -> str:
        bounds = [f">={self.min:g}" if self.min is not None else "", f"<={self.max:g}" if self.max is not None else ""]
        return f"{self.score}{''.join(bounds)}"

    def check(self, value: float | None) -> bool:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return False
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class PerceptualDedup(_Strict):
    enabled: bool = True


class SemanticDedup(_Strict):
    enabled: bool = True
    reference_share: float = Field(default=0.2, gt=0, le=1)
    min_references: int = Field(default=1, ge=1)
    max_references: int = Field(default=20, ge=1)
    min_cosine: float = Field(default=0.95, gt=0, le=1)


class Quotas(_Strict):
    """Caps applied after duplicate retention, keeping the best-ranked clips (ties: smallest clip_id)."""

    max_clips_per_asset: int | None = Field(default=None, ge=1)
    max_clips_per_source_shard: int | None = Field(default=None, ge=1)
    max_clips_per_source_tier: int | None = Field(default=None, ge=1)


class Tier(_Strict):
    name: str
    rules: list[ScoreRule] = []


class CaptionChoice(_Strict):
    """Which captions training uses: a captioner version (null = the one configured now) and the
    level that ``text_embeddings`` encodes. Not part of selection's version: changing it re-runs
    no selection decision."""

    version: str | None = None
    level: Literal["level_0", "level_1", "level_2", "level_3"] = "level_1"
    missing: Literal["exclude", "include"] = "exclude"
    """A selected clip without a usable caption of that version and level: ``exclude`` it from
    snapshots (reason ``no_caption``), or ``include`` it flagged (``has_caption`` false, no text)."""


class AudioChoice(_Strict):
    """What snapshots do with the audio annotations. Not part of selection's version (like the caption
    choice): changing it re-runs no selection decision, only the next snapshot."""

    streams: list[Stream] = []
    """Streams named by audio fields (e.g. a speech-only stream): tried after ``curriculum.streams``
    (the general form, which takes the same conditions); first match names a sample's stream."""
    languages: list[str] | None = None
    """Keep only samples whose detected language is listed; samples with no detected language are
    kept unless ``require_language`` (excluded with reason ``language``)."""
    require_language: bool = False


class Recipe(_Strict):
    name: str = "unnamed"
    safety_kills: bool = True
    score_rules: list[ScoreRule] = []
    rank_by: list[SCORES] = ["optical", "motion", "quality", "text"]
    perceptual_dedup: PerceptualDedup = PerceptualDedup()
    semantic_dedup: SemanticDedup = SemanticDedup()
    quotas: Quotas = Quotas()
    tiers: list[Tier] = []
    default_tier: str = "T3"
    captions: CaptionChoice = CaptionChoice()
    audio: AudioChoice = AudioChoice()
    curriculum: Curriculum = Curriculum()

    @property
    def digest(self) -> str:
        """Digest of the selection policy (everything but the caption, audio and curriculum choices)."""
        policy = self.model_dump(exclude={"captions", "audio", "curriculum"})
        return hashlib.sha256(json.dumps(policy, sort_keys=True).encode()).hexdigest()[:12]


def load_recipe(path: str | Path | None = None) -> Recipe:
    path = Path(path) if path else DEFAULT_RECIPE
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"recipe file not found: {path}") from exc
    return recipe_from_text(text, str(path))


def recipe_from_text(text: str, where: str) -> Recipe:
    """A validated recipe from its YAML text; errors name ``where`` and each bad field."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {where} is not valid YAML: {exc}") from exc
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"invalid selection recipe {where}:\n" + "\n".join(lines)) from None


def select(recipe: Recipe, scores: pd.DataFrame, groups: pd.DataFrame, vectors: Mapping[str, np.ndarray],
           version: RowVersion, contaminated: set[str] | frozenset[str] = frozenset(),
           generated: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Decide every clip: pass/reject, the first rule that rejected it, every rule's outcome, tier.
    ``generated``: real clips that duplicate model-generated ones (``generated_copies``): rejected
    as ``generated_copy`` (the outcome is recorded only where it fires).
    A score that could not be computed (status ``error``: retried by a later run) is not a quality
    verdict: the rule reads ``error:<score>``, never the rule's threshold."""
    table = scores.pivot_table(index="clip_id", columns="score", values="value", aggfunc="first") if len(scores) else pd.DataFrame()
    failed = scores[scores.status == "error"] if len(scores) and "status" in scores else scores.iloc[0:0]
    errored = set(zip(failed.clip_id, failed.score, strict=True)) if len(failed) else set()
    cheap_first = scores[scores.status == "skipped"] if len(scores) and "status" in scores else scores.iloc[0:0]
    skipped = dict(zip(zip(cheap_first.clip_id, cheap_first.score, strict=True), cheap_first.reason, strict=True)) \
        if len(cheap_first) else {}
    inapplicable = scores[scores.status == "not_applicable"] if len(scores) and "status" in scores else scores.iloc[0:0]
    not_applicable = set(zip(inapplicable.clip_id, inapplicable.score, strict=True)) if len(inapplicable) else set()
    if len(scores):  # clips whose every value is null still get a decision
        table = table.reindex(sorted(set(scores.clip_id)))
    killed = set(scores.loc[scores["kill"].astype(bool), "clip_id"]) if len(scores) else set()
    meta = scores.drop_duplicates("clip_id").set_index("clip_id")[["asset_id", "source_shard"]] if len(scores) else None
    group_of = groups.set_index("clip_id") if len(groups) else None
    decisions: dict[str, dict[str, Any]] = {}
    for clip_id in sorted(table.index):
        values = {k: _value(table.loc[clip_id].get(k)) for k in table.columns}
        outcomes: dict[str, str] = {}
        first_failed = None
        # Eval contamination is not a recipe choice: a clip matching eval material never trains.
        outcomes["decontamination"] = "fail" if clip_id in contaminated else "pass"
        first_failed = "decontamination" if clip_id in contaminated else None
        if clip_id in generated:  # nor does a copy of our own models' output (the self-training firewall)
            outcomes["generated_copy"] = "fail"
            first_failed = first_failed or "generated_copy"
        if recipe.safety_kills:
            ok = clip_id not in killed
            outcomes["safety"] = "pass" if ok else "fail"
            first_failed = first_failed or (None if ok else "safety")
        waiting = None
        for rule in recipe.score_rules:
            if (clip_id, rule.score) in errored:
                outcomes[rule.name] = "error"
                first_failed = first_failed or f"error:{rule.score}"
                continue
            if (clip_id, rule.score) in skipped:  # the cascade did not run this model: say which gate
                outcomes[rule.name] = f"skipped ({skipped[clip_id, rule.score].removeprefix('cascade: ')})"
                waiting = waiting or f"skipped:{rule.score}"
                continue
            if (clip_id, rule.score) in not_applicable:  # a motion rule says nothing about a still image
                outcomes[rule.name] = "not applicable"
                continue
            ok = rule.check(values.get(rule.score))
            outcomes[rule.name] = "pass" if ok else ("missing" if values.get(rule.score) is None else "fail")
            if not ok and first_failed is None:
                first_failed = rule.name
        # a clip whose model scores were skipped under other gates passes no rule on them: it waits
        # (like a score error) until clip_scores has run under this recipe's gates
        first_failed = first_failed or waiting
        rank = sum(values.get(k) or 0.0 for k in recipe.rank_by)
        decisions[clip_id] = {"clip_id": clip_id, "values": values, "outcomes": outcomes,
                              "first_failed_rule": first_failed, "rank_score": rank}
    alive = [c for c, d in decisions.items() if d["first_failed_rule"] is None]
    if recipe.perceptual_dedup.enabled and group_of is not None:
        _keep_best_per_group(decisions, alive, group_of, "pdq_group", "perceptual_duplicate")
        alive = [c for c in alive if decisions[c]["first_failed_rule"] is None]
    if recipe.semantic_dedup.enabled and group_of is not None:
        _semantic_references(decisions, alive, group_of, vectors, recipe.semantic_dedup)
        alive = [c for c in alive if decisions[c]["first_failed_rule"] is None]
    if meta is not None:
        _apply_quotas(decisions, alive, meta, recipe.quotas)
    rows = []
    for clip_id, d in decisions.items():
        passed = d["first_failed_rule"] is None
        rows.append({
            "clip_id": clip_id,
            "asset_id": meta.loc[clip_id, "asset_id"] if meta is not None else None,
            "source_shard": meta.loc[clip_id, "source_shard"] if meta is not None else None,
            "decision": "pass" if passed else "reject",
            "first_failed_rule": d["first_failed_rule"],
            "rule_outcomes": json.dumps(d["outcomes"], sort_keys=True),
            "tier": _tier(recipe, d["values"]) if passed else None,
            "rank_score": round(d["rank_score"], 6),
            "recipe": recipe.name,
            "recipe_hash": recipe.digest,
            "producer_version": version.producer, "input_version": version.inputs, "runs": 1,
        })
    return rows


def _value(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _ordered(decisions: Mapping[str, dict], members: list[str]) -> list[str]:
    return sorted(members, key=lambda c: (-decisions[c]["rank_score"], c))


def _keep_best_per_group(decisions: dict, alive: list[str], group_of: pd.DataFrame, column: str, rule: str) -> None:
    by_group: dict[str, list[str]] = {}
    for clip_id in alive:
        group = group_of.loc[clip_id, column] if clip_id in group_of.index else None
        by_group.setdefault(group if isinstance(group, str) else clip_id, []).append(clip_id)
    for members in by_group.values():
        ranked = _ordered(decisions, members)
        for clip_id in ranked:
            decisions[clip_id]["outcomes"][rule] = "keep" if clip_id == ranked[0] else "drop"
            if clip_id != ranked[0]:
                decisions[clip_id]["first_failed_rule"] = rule
                decisions[clip_id]["outcomes"][rule] = f"drop (kept {ranked[0]})"


def _semantic_references(decisions: dict, alive: list[str], group_of: pd.DataFrame, vectors: Mapping[str, np.ndarray],
                         params: SemanticDedup) -> None:
    by_group: dict[str, list[str]] = {}
    for clip_id in alive:
        group = group_of.loc[clip_id, "semantic_group"] if clip_id in group_of.index else None
        if isinstance(group, str) and clip_id in vectors:
            by_group.setdefault(group, []).append(clip_id)
        else:
            decisions[clip_id]["outcomes"]["semantic_duplicate"] = "no embedding"
    for members in by_group.values():
        ranked = _ordered(decisions, members)
        count = min(max(math.ceil(params.reference_share * len(ranked)), params.min_references), params.max_references)
        refs = ranked[:count]
        ref_matrix = np.stack([vectors[c] for c in refs])
        for clip_id in ranked:
            if clip_id in refs:
                decisions[clip_id]["outcomes"]["semantic_duplicate"] = "reference"
                continue
            cosine = float((ref_matrix @ vectors[clip_id]).max())
            if cosine >= params.min_cosine:
                decisions[clip_id]["outcomes"]["semantic_duplicate"] = f"drop (cosine {cosine:.3f} to a reference)"
                decisions[clip_id]["first_failed_rule"] = "semantic_duplicate"
            else:
                decisions[clip_id]["outcomes"]["semantic_duplicate"] = "keep"


def _apply_quotas(decisions: dict, alive: list[str], meta: pd.DataFrame, quotas: Quotas) -> None:
    caps = {
        "asset": (quotas.max_clips_per_asset, lambda c: meta.loc[c, "asset_id"]),
        "source_shard": (quotas.max_clips_per_source_shard, lambda c: meta.loc[c, "source_shard"]),
        "source_tier": (quotas.max_clips_per_source_tier, lambda c: str(meta.loc[c, "source_shard"]).split("/")[0]),
    }
    for name, (cap, key_of) in caps.items():
        if cap is None:
            continue
        rule = f"quota:max_clips_per_{name}"
        buckets: dict[str, list[str]] = {}
        for clip_id in alive:
            if decisions[clip_id]["first_failed_rule"] is None:
                buckets.setdefault(key_of(clip_id), []).append(clip_id)
        for members in buckets.values():
            for rank, clip_id in enumerate(_ordered(decisions, members)):
                over = rank >= cap
                decisions[clip_id]["outcomes"][rule] = "over quota" if over else "within quota"
                if over:
                    decisions[clip_id]["first_failed_rule"] = rule


def _tier(recipe: Recipe, values: Mapping[str, float | None]) -> str:
    for tier in recipe.tiers:
        if all(rule.check(values.get(rule.score)) for rule in tier.rules):
            return tier.name
    return recipe.default_tier


def changed_drops(before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]]) -> list[str]:
    """The source shards (drops) whose selected clips changed: a clip admitted or dropped, or moved to
    another tier (tiers order the work and decide the ladder's rungs). New drops count; a drop whose
    clips all vanished counts too (its derived rows are no longer current)."""
    def signature(rows: Iterable[Mapping[str, Any]]) -> dict[str, set[tuple]]:
        out: dict[str, set[tuple]] = {}
        for r in rows:
            chosen = {(r["clip_id"], r["tier"])} if r["decision"] == "pass" else set()
            out.setdefault(r["source_shard"], set()).update(chosen)
        return out

    old, new = signature(before), signature(after)
    return sorted(d for d in set(old) | set(new) if old.get(d, set()) != new.get(d, set()))


# --- incremental selection -----------------------------------------------------------------------
# A clip's decision reads its own scores, embedding and contamination flag, and, through duplicate
# retention and quotas, the other members of its duplicate groups and quota buckets. So when some
# drops change, only the clips of those drops, the clips whose group or flag changed, and everything
# coupled to them through a group or a bucket (to closure) are decided again; every other decision
# stands. The result is identical to deciding every clip again (tested against ``select``).



def generated_copies(clips: pd.DataFrame, groups: pd.DataFrame, synthetic_assets: set[str]) -> set[str]:
    """Real clips (``clips``: clip_id, asset_id) sharing a perceptual or semantic duplicate group with
    a clip of a model-generated (synthetic) asset: what ingest's fingerprint missed (a mirrored or
    re-framed copy) but the embeddings or frame hashes of the clips catch."""
    if not synthetic_assets or not len(groups) or not len(clips):
        return set()
    frame = clips[["clip_id", "asset_id"]].drop_duplicates("clip_id").merge(
        groups[["clip_id", "pdq_group", "semantic_group"]], on="clip_id")
    made = frame.asset_id.isin(synthetic_assets)
    found: set[str] = set()
    for column in ("pdq_group", "semantic_group"):
        tainted = set(frame.loc[made, column].dropna())
        found |= set(frame.loc[~made & frame[column].isin(tainted), "clip_id"])
    return found


def decision_context(clips: pd.DataFrame, groups: pd.DataFrame, contaminated: set[str] | frozenset[str],
                     generated: set[str] | frozenset[str] = frozenset(),
                     synthetic: set[str] | frozenset[str] = frozenset()) -> pd.DataFrame:
    """Per clip (``clips``: clip_id, source_shard, asset_id), what couples its decision to others:
    its duplicate groups, whether it matches eval material, whether it copies generated footage,
    whether its asset is model-generated (``synthetic``: kept here so that the next run reads the
    inventory of the drops that changed only)."""
    frame = clips[["clip_id", "source_shard", "asset_id"]].drop_duplicates("clip_id")
    if len(groups):
        frame = frame.merge(groups[["clip_id", "pdq_group", "semantic_group"]], on="clip_id", how="left")
    else:
        frame = frame.assign(pdq_group=None, semantic_group=None)
    frame["contaminated"] = frame.clip_id.isin(contaminated)
    frame["generated"] = frame.clip_id.isin(generated)
    frame["synthetic"] = frame.asset_id.isin(synthetic)
    frame = frame.astype({"pdq_group": object, "semantic_group": object})
    return frame[CONTEXT_COLUMNS].sort_values("clip_id").reset_index(drop=True)


def coupled(recipe: Recipe, previous: pd.DataFrame, current: pd.DataFrame, changed_shards: set[str]) -> set[str]:
    """The clips to decide again: those of ``changed_shards``, those whose context changed, and every
    clip sharing a duplicate group (before or after) or a configured quota bucket with one of them.
    Vectorised: each round of the closure is a few ``isin`` over the contexts."""
    missing = "\x00missing"
    for column in ("generated", "synthetic"):  # a context saved before the column existed
        if column not in previous:
            previous = previous.assign(**{column: False})
    before = previous[CONTEXT_COLUMNS].astype(object).where(previous[CONTEXT_COLUMNS].notna(), missing)
    after = current[CONTEXT_COLUMNS].astype(object).where(current[CONTEXT_COLUMNS].notna(), missing)
    joined = after.merge(before, on="clip_id", how="outer", suffixes=("", "_before"), indicator=True)
    differs = joined["_merge"] != "both"
    for column in CONTEXT_COLUMNS[1:]:
        differs |= joined[column] != joined[f"{column}_before"]
    differs |= joined.source_shard.isin(changed_shards) | joined.source_shard_before.isin(changed_shards)
    found = set(joined.clip_id[differs])
    both = pd.concat([before, after], ignore_index=True)
    keys: list[pd.Series] = []  # one coupling key per clip context (missing: no coupling)
    if recipe.perceptual_dedup.enabled:
        keys.append(both.pdq_group)
    if recipe.semantic_dedup.enabled:
        keys.append(both.semantic_group)
    q = recipe.quotas
    if q.max_clips_per_asset is not None:
        keys.append(both.asset_id)
    if q.max_clips_per_source_shard is not None:
        keys.append(both.source_shard)
    if q.max_clips_per_source_tier is not None:
        keys.append(both.source_shard.map(lambda shard: shard if shard == missing else str(shard).split("/")[0]))
    todo = set(found)
    while todo and keys:
        rows = both.clip_id.isin(todo)
        reached = np.zeros(len(both), bool)
        for key in keys:
            values = set(key[rows]) - {missing}
            reached |= key.isin(values).to_numpy()
        todo = set(both.clip_id[reached]) - found
        found |= todo
    return found


def reselect_drops(recipe: Recipe, version: RowVersion, previous_rows: pd.DataFrame, previous: pd.DataFrame,
                   current: pd.DataFrame, changed_shards: set[str], load: Any) -> tuple[list[dict[str, Any]], set[str], int]:
    """Decide again only the clips ``coupled`` to a change (``current`` and ``previous`` are
    ``decision_context`` frames; ``load(shards)`` returns (scores, vectors) of those drops). Returns
    every row of the drops whose rows may differ from ``previous_rows`` (a clip decided again, gone
    or moved, or a changed drop) by clip_id, those drops, and how many clips were decided again;
    every other drop's rows stand as they are."""
    again = coupled(recipe, previous, current, changed_shards) & set(current.clip_id)
    subset = current[current.clip_id.isin(again)]
    scores, vectors = load(sorted(set(subset.source_shard)))
    scores = scores[scores.clip_id.isin(again)] if len(scores) else scores
    fresh = select(recipe, scores, subset[["clip_id", "pdq_group", "semantic_group"]],
                   {c: v for c, v in vectors.items() if c in again}, version, set(subset.clip_id[subset.contaminated]),
                   set(subset.clip_id[subset.generated]))
    drops = set(changed_shards) | set(subset.source_shard)
    if len(previous_rows):
        left = previous_rows.clip_id.isin(again) | ~previous_rows.clip_id.isin(current.clip_id)
        drops |= set(previous_rows.source_shard[left].dropna())
        kept = previous_rows[previous_rows.source_shard.isin(drops) & ~left]
    else:
        kept = previous_rows
    return sorted([*records(kept), *fresh], key=lambda r: r["clip_id"]), drops, len(again)


def reselect(recipe: Recipe, version: RowVersion, previous_rows: pd.DataFrame, previous: pd.DataFrame,
             current: pd.DataFrame, changed_shards: set[str], load: Any) -> tuple[list[dict[str, Any]], int]:
    """Decisions for every clip of ``current``: ``reselect_drops`` and the rows of the other drops as
    they stand. Returns the rows (by clip_id) and how many clips were decided again."""
    rows, drops, decided = reselect_drops(recipe, version, previous_rows, previous, current, changed_shards, load)
    standing = previous_rows[~previous_rows.source_shard.isin(drops)] if len(previous_rows) else previous_rows
    return sorted([*records(standing), *rows], key=lambda r: r["clip_id"]), decided


def selected_in_order(selection: pd.DataFrame, partition: str) -> list[dict]:
    """The partition's passing clips, best tier first (T0 before T1 …), then by rank."""
    if not len(selection):
        return []
    chosen = selection[(selection.decision == "pass") & (selection.source_shard == partition)]
    return sorted(records(chosen), key=lambda r: (r["tier"] or "~", -(r["rank_score"] or 0.0), r["clip_id"]))


@dataclass
class Reselection:
    """One incremental selection run: the rows decided again (of ``drops``; None: the whole table),
    the drops whose selected clips changed, the decisions counted over every drop after it
    (``totals``: decision, first_failed_rule, tier, n); ``remember()`` after the rows are written."""

    rows: list[dict[str, Any]]
    drops: set[str] | None
    decided: int
    changed: list[str]
    new_inputs: set[str]
    totals: pd.DataFrame
    remember: Callable[[], None]
    flipped: list[dict[str, Any]] = field(default_factory=list)
    """Clips of drops whose own inputs did not change but whose decision or tier did (a clip beaten
    by a new duplicate, one freed when its group's best left): clip_id, drop, before, after."""
    contexts_read: int = 0
    """Stored decision contexts this run read (the clips its change reached, and their drops')."""
    upstream_read_whole: bool = False
    """The upstream tables were read whole (a first run, a compaction since the last run)."""


UPSTREAM = ("dedup_groups", "decontamination")
"""The global tables selection reads per clip (groups, eval matches): read through their writes
since the last run (``TableStore.changes_since``), whole only when that cannot tell."""


def reselect_incrementally(tables: Any, state: SelectionState, recipe: Recipe, version: RowVersion,
                           full_version: str, covered: Mapping[str, str], held: Any, synthetic: Any,
                           firewall: bool, changed: Iterable[str] | None = None) -> Reselection:
    """Decide again the clips of drops whose inputs changed (``covered``: each drop's fingerprint of
    its score and embedding tables), of drops whose ``dedup_groups`` or ``decontamination`` rows
    were rewritten since the last run, and the clips coupled to them (duplicate groups, quota
    buckets, contamination, generated copies). ``held(table, drop)`` reads a drop's rows of the
    clips it holds now; ``synthetic(drops)`` the assets tagged model-generated in those drops.
    Reads only what the change reaches: the upstream tables' writes since the last run, the contexts
    sharing a coupling key with the changed clips (to closure) and the stored decisions of their
    drops. ``changed``: the drops whose fingerprint may differ from the last run's (None: unknown),
    so only those are compared; when the covered count does not add up (a change not named) every
    covered drop is. Writes nothing but ``state`` (on ``remember()``); the caller writes the rows."""
    fresh = state.version() != full_version
    if fresh:
        state.reset(full_version)
    asked = None if fresh or changed is None else set(changed)
    if asked is not None:
        before_covered = state.covered(asked)
        if not told_every_change(state.covered_count(), asked, before_covered, covered):
            asked = None
    if asked is None:
        before_covered = {} if fresh else state.covered()
        asked = set(before_covered) | set(covered)
    new_inputs = {p for p in asked if before_covered.get(p) != covered.get(p)}
    gone = {p for p in before_covered if p not in covered}
    current = {p for p in new_inputs if p in covered}
    fresh_scores = {p: held("clip_scores", p) for p in sorted(current)}
    cursors = {} if fresh else state.cursors()
    changes = {t: tables.changes_since(t, cursors.get(t)) for t in UPSTREAM}
    upstream = _upstream(tables, changes, covered, fresh_scores, state)
    touched = {p for p in new_inputs | upstream.drops if p in covered} | gone
    old = state.contexts("source_shard", touched)
    after = _touched_contexts(old, fresh_scores, touched - gone, new_inputs, upstream,
                              synthetic(sorted(current)) if firewall else set(), firewall)
    if firewall:
        after = _with_generated(state, old, after)
    before, after = _closure(state, old, after, _coupling_keys(recipe))
    drops = set(before.source_shard) | set(after.source_shard) | new_inputs
    others = state.contexts("source_shard", drops - touched)
    others = others[~others.clip_id.isin(set(before.clip_id) | set(after.clip_id))]
    before, after = pd.concat([before, others], ignore_index=True), pd.concat([after, others], ignore_index=True)
    stored = tables.read_or_empty("selection") if fresh else state.rows_of(drops)
    previous_rows = stored.iloc[0:0] if fresh else stored

    def load(shards: list[str]) -> tuple[pd.DataFrame, dict]:
        scores = [fresh_scores[p] if p in fresh_scores else held("clip_scores", p) for p in shards]
        embeddings = [tables.read_or_empty("clip_embeddings", p) for p in shards]
        vectors = {r.clip_id: vector_of(r.vector) for e in embeddings if len(e) for r in e.itertuples()
                   if r.status == "ok"}
        return (pd.concat(scores) if scores else pd.DataFrame()), vectors

    rows, rewritten, decided = reselect_drops(recipe, version, previous_rows, before, after, new_inputs, load)
    written: set[str] | None = None if fresh else rewritten
    was = stored[stored.source_shard.isin(rewritten)] if written is not None and len(stored) else stored

    totals = _totals_after(state, rows, written)

    def remember() -> None:
        changed = after[after.source_shard.isin(touched) | ~after.clip_id.isin(before.clip_id)
                        | _differs(before, after)]
        state.save(changed, sorted(touched - gone), sorted(gone), rows, None if written is None else sorted(written),
                   covered, {t: now for t, (_, now) in changes.items()}, totals)

    return Reselection(rows, written, decided, changed_drops(records(was), rows), new_inputs, totals, remember,
                       flips(was, rows, new_inputs), state.contexts_read, upstream.whole)


@dataclass
class Upstream:
    """The upstream rows a run reads: the drops rewritten since the last run, and their rows of each
    upstream table (``whole``: the tables were read whole, every drop counts as rewritten)."""

    drops: set[str]
    rows: dict[str, pd.DataFrame]
    whole: bool


def _upstream(tables: Any, changes: Mapping[str, Any], covered: Mapping[str, str],
              fresh_scores: Mapping[str, pd.DataFrame], state: SelectionState) -> Upstream:
    """The upstream tables' rows rewritten since the last run, or the tables whole where their
    writes cannot tell (a compaction, a first run), or where a new clip has neither a row among
    the rewritten ones nor a stored context (its rows were written before the last run)."""
    if all(change is not None for change, _ in changes.values()):
        drops = set().union(*(groups for (groups, _), _ in changes.values()))
        rows = {t: rows for t, ((_, rows), _) in changes.items()}
        new_clips = {c for f in fresh_scores.values() if len(f) for c in f.clip_id}
        seen = set(rows["dedup_groups"].clip_id) if len(rows["dedup_groups"]) else set()
        unseen = new_clips - seen
        if not unseen or not unseen - set(state.contexts("clip_id", unseen).clip_id):
            return Upstream(drops, rows, False)
    return Upstream(set(covered), {t: tables.read_or_empty(t) for t in changes}, True)


def _touched_contexts(old: pd.DataFrame, fresh_scores: Mapping[str, pd.DataFrame], touched: set[str],
                      new_inputs: set[str], upstream: Upstream, made_new: set[str], firewall: bool) -> pd.DataFrame:
    """The contexts of the clips of the ``touched`` drops now: clips from the new score rows (or the
    stored contexts), groups and contamination from the upstream rows rewritten since the last run
    (else the stored contexts), synthetic from the new drops' inventory (or the stored contexts);
    ``generated`` left as stored (``_with_generated``)."""
    kept = old[old.source_shard.isin(touched - new_inputs)]
    clips = pd.concat([kept[["clip_id", "source_shard", "asset_id"]],
                       *[f[["clip_id", "source_shard", "asset_id"]] for f in fresh_scores.values() if len(f)]],
                      ignore_index=True)
    fresh_groups = upstream.rows["dedup_groups"]
    fresh_groups = fresh_groups[["clip_id", "pdq_group", "semantic_group"]] if len(fresh_groups) else \
        pd.DataFrame(columns=["clip_id", "pdq_group", "semantic_group"])
    stood = old[~old.clip_id.isin(fresh_groups.clip_id)][["clip_id", "pdq_group", "semantic_group"]]
    groups = pd.concat([f for f in (fresh_groups, stood) if len(f)] or [fresh_groups], ignore_index=True)
    matches = upstream.rows["decontamination"]
    excluded = set(matches.loc[matches.contaminated.astype(bool), "clip_id"]) if len(matches) else set()
    rematched = set(matches.clip_id) if len(matches) else set()
    excluded |= set(old.loc[old.contaminated.astype(bool) & ~old.clip_id.isin(rematched), "clip_id"])
    made = (set(kept.loc[kept.synthetic.astype(bool), "asset_id"]) | set(made_new)) if firewall else set()
    context = decision_context(clips, groups, excluded, set(), made)
    stored_generated = dict(zip(old.clip_id, old.generated, strict=True))
    context["generated"] = context.clip_id.map(stored_generated).eq(True)
    return context


def _with_generated(state: SelectionState, old: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """``after`` with ``generated`` computed again for every clip sharing a duplicate group (before
    or after) with a touched clip, those clips' rows added where the flag flipped: a real clip is a
    generated copy when a member of one of its groups is model-generated (``generated_copies``)."""
    touched = set(old.clip_id) | set(after.clip_id)
    groups = {c: set(pd.concat([old[c], after[c]]).dropna()) for c in ("pdq_group", "semantic_group")}
    reached = pd.concat([state.contexts(c, groups[c]) for c in groups], ignore_index=True).drop_duplicates("clip_id")
    reached = reached[~reached.clip_id.isin(touched)]
    # their other groups' members too, so every reached clip's groups are whole
    more = {c: set(reached[c].dropna()) - groups[c] for c in groups}
    whole = pd.concat([reached, *[state.contexts(c, more[c]) for c in more]], ignore_index=True)
    whole = whole[~whole.clip_id.isin(touched)].drop_duplicates("clip_id")
    pool = pd.concat([after, whole], ignore_index=True)
    synthetic_assets = set(pool.loc[pool.synthetic.astype(bool), "asset_id"])
    found = generated_copies(pool, pool, synthetic_assets)
    after = after.assign(generated=after.clip_id.isin(found))
    flipped = reached[reached.clip_id.isin(found) != reached.generated.astype(bool)]
    return pd.concat([after, flipped.assign(generated=~flipped.generated.astype(bool))], ignore_index=True)


def _coupling_keys(recipe: Recipe) -> list[str]:
    """The context columns that couple decisions under ``recipe`` (as ``coupled`` reads them)."""
    keys = []
    if recipe.perceptual_dedup.enabled:
        keys.append("pdq_group")
    if recipe.semantic_dedup.enabled:
        keys.append("semantic_group")
    q = recipe.quotas
    if q.max_clips_per_asset is not None:
        keys.append("asset_id")
    if q.max_clips_per_source_shard is not None:
        keys.append("source_shard")
    if q.max_clips_per_source_tier is not None:
        keys.append("source_tier")
    return keys


def _closure(state: SelectionState, old: pd.DataFrame, after: pd.DataFrame,
             keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(before, after) contexts of every clip reachable from the changed ones through a coupling
    key, before or after (the stored contexts of clips not changed serve as both): a superset of
    what ``coupled`` decides again, closed, so ``coupled`` over it finds what it would over all."""
    before = old
    changed_ids = set(after.clip_id)
    before = pd.concat([before, state.contexts("clip_id", changed_ids - set(old.clip_id))], ignore_index=True)
    known = set(before.clip_id) | changed_ids
    frontier = pd.concat([before, after], ignore_index=True)
    while keys and len(frontier):
        values = {k: set((frontier.source_shard.map(source_tier) if k == "source_tier" else frontier[k]).dropna())
                  for k in keys}
        found = pd.concat([state.contexts(k, v) for k, v in values.items()], ignore_index=True)
        found = found[~found.clip_id.isin(known)].drop_duplicates("clip_id")
        known |= set(found.clip_id)
        before = pd.concat([before, found], ignore_index=True)
        after = pd.concat([after, found], ignore_index=True)
        frontier = found
    return before.drop_duplicates("clip_id"), after.drop_duplicates("clip_id")


def _differs(before: pd.DataFrame, after: pd.DataFrame) -> pd.Series:
    """Per row of ``after``: its context differs from its ``before`` row (or has none)."""
    was = before.drop_duplicates("clip_id").set_index("clip_id").reindex(after.clip_id)
    now = after.set_index("clip_id")
    out = np.zeros(len(after), bool)
    for column in CONTEXT_COLUMNS[1:]:
        a, b = now[column].astype(object), was[column].astype(object)
        out |= ~((a == b) | (a.isna() & b.isna())).to_numpy()
    return pd.Series(out, index=after.index)


def _totals_after(state: SelectionState, rows: list[dict[str, Any]], written: set[str] | None) -> pd.DataFrame:
    """The decisions counted over every drop once ``rows`` replace the ``written`` drops' (None: all)."""
    columns = ["decision", "first_failed_rule", "tier"]
    fresh = pd.DataFrame(rows, columns=columns).assign(n=1)
    parts = [fresh]
    if written is not None:
        parts += [state.totals(), state.counts(written).assign(n=lambda f: -f.n)]
    both = pd.concat([p for p in parts if len(p)] or [fresh], ignore_index=True).astype({c: object for c in columns})
    none = "\u2400none"  # stands for a missing value while grouping ("\x00" came back as "": pandas' C strings)
    both[columns] = both[columns].where(both[columns].notna(), none)
    totals = both.groupby(columns, as_index=False).n.sum()
    totals = totals[totals.n > 0]
    totals[columns] = totals[columns].where(totals[columns] != none, None)
    return totals.reset_index(drop=True)


def flips(before: pd.DataFrame, after: list[dict[str, Any]], new_inputs: set[str]) -> list[dict[str, Any]]:
    """The clips of drops outside ``new_inputs`` whose (decision, tier) differs between ``before``
    (stored rows) and ``after`` (rows decided again), by clip_id."""
    if not len(before):
        return []
    was = {r.clip_id: (r.source_shard, r.decision, r.tier if r.decision == "pass" else None)
           for r in before.itertuples() if r.source_shard not in new_inputs}
    out = []
    for row in after:
        old = was.get(row["clip_id"])
        now = (row["decision"], row["tier"] if row["decision"] == "pass" else None)
        if old is not None and old[1:] != now:
            out.append({"clip_id": row["clip_id"], "drop": old[0], "before": "/".join(filter(None, old[1:])),
                        "after": "/".join(filter(None, now))})
    return sorted(out, key=lambda f: f["clip_id"])
