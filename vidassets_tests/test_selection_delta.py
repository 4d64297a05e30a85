"""Incremental selection decides again only the clips coupled to a change, and its decisions are
identical to deciding every clip again, over random sequences of new drops, rebuilt drops, group
changes, eval matches and removed drops, under recipes with and without quotas."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from vidassets.curate.selection import Quotas, decision_context, load_recipe, reselect, select
from vidassets.storage.rows import RowVersion

SCORES = ("optical", "motion", "static", "quality", "text", "nsfw")
VERSION = RowVersion("selection-test", "inputs")


class World:
    """Drops of clips with scores, embeddings, duplicate groups and eval matches."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.scores: dict[str, pd.DataFrame] = {}
        self.vectors: dict[str, dict[str, np.ndarray]] = {}
        self.groups: dict[str, tuple[str | None, str | None]] = {}
        self.contaminated: set[str] = set()
        self.n = 0

    def add_drop(self, drop: str, clips: int) -> None:
        rows, vectors = [], {}
        for _ in range(clips):
            self.n += 1
            clip = f"{drop}:c{self.n:04d}"
            asset = f"asset{self.rng.randrange(max(2, self.n // 3))}"
            for score in SCORES:  # most clips pass the default rules, so duplicates and quotas decide
                error = self.rng.random() < 0.03
                low = 0.88 if score == "optical" else 0.2
                rows.append({"clip_id": clip, "asset_id": asset, "source_shard": drop, "score": score,
                             "value": None if error else round(low + (1 - low) * self.rng.random(), 3),
                             "kill": self.rng.random() < 0.05, "status": "error" if error else "ok"})
            semantic = self._group() if self.rng.random() < 0.9 else None
            if semantic is not None:  # near its group's direction: some are near-copies, some not
                base = np.random.default_rng(int(semantic[1:])).normal(size=8)
                v = base + np.array([self.rng.gauss(0, self.rng.choice([0.05, 0.5])) for _ in range(8)])
                vectors[clip] = (v / np.linalg.norm(v)).astype(np.float32)
            self.groups[clip] = self._group(), semantic
        self.scores[drop] = pd.DataFrame(rows, columns=["clip_id", "asset_id", "source_shard", "score", "value", "kill",
                                                        "status"])
        self.vectors[drop] = vectors

    def _group(self) -> str | None:
        return f"g{self.rng.randrange(12)}" if self.rng.random() < 0.6 else None

    def rebuild(self, drop: str) -> None:
        frame = self.scores[drop].copy()
        frame["value"] = [None if v is None or pd.isna(v) else round(self.rng.random(), 3) for v in frame.value]
        self.scores[drop] = frame

    def remove(self, drop: str) -> None:
        for clip in set(self.scores.pop(drop).clip_id):
            self.groups.pop(clip)
        self.vectors.pop(drop)

    def all_clips(self) -> list[str]:
        return sorted(self.groups)

    def context(self) -> pd.DataFrame:
        clips = pd.concat(self.scores.values())[["clip_id", "source_shard", "asset_id"]] if self.scores else \
            pd.DataFrame(columns=["clip_id", "source_shard", "asset_id"])
        groups = pd.DataFrame([{"clip_id": c, "pdq_group": p, "semantic_group": s} for c, (p, s) in self.groups.items()])
        return decision_context(clips, groups, self.contaminated)

    def full(self, recipe) -> list[dict]:
        groups = pd.DataFrame([{"clip_id": c, "pdq_group": p, "semantic_group": s} for c, (p, s) in self.groups.items()])
        vectors = {c: v for d in self.vectors.values() for c, v in d.items()}
        return select(recipe, pd.concat(self.scores.values()), groups, vectors, VERSION, self.contaminated)

    def load(self, shards: list[str]) -> tuple[pd.DataFrame, dict]:
        return (pd.concat([self.scores[s] for s in shards]) if shards else pd.DataFrame(),
                {c: v for s in shards for c, v in self.vectors[s].items()})


def _recipes():
    base = load_recipe()
    return {
        "default": base,
        "per-asset quota": base.model_copy(update={"quotas": Quotas(max_clips_per_asset=1)}),
        "per-drop and per-tier quotas": base.model_copy(update={"quotas": Quotas(max_clips_per_source_shard=3,
                                                                                 max_clips_per_source_tier=9)}),
    }


@pytest.mark.parametrize("name", list(_recipes()))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_selection_equals_deciding_everything_again(name: str, seed: int) -> None:
    recipe = _recipes()[name]
    world = World(seed)
    rows: list[dict] = []
    previous = world.context()
    decided_counts = []
    for step in range(14):
        changed: set[str] = set()
        action = "add" if step < 6 else world.rng.choice(["add", "add", "rebuild", "regroup", "eval", "remove"])
        drops = sorted(world.scores)
        if action == "add" or not drops:
            drop = f"{world.rng.choice(['web', 'licensed'])}/drop-{step:04d}"
            world.add_drop(drop, world.rng.randrange(0, 7))
            changed.add(drop)
        elif action == "rebuild":
            drop = world.rng.choice(drops)
            world.rebuild(drop)
            changed.add(drop)
        elif action == "regroup":  # a new link merges groups; nothing of the drops' own tables changed
            clip = world.rng.choice(world.all_clips())
            world.groups[clip] = (world._group(), world.groups[clip][1])
        elif action == "eval":
            world.contaminated.add(world.rng.choice(world.all_clips()))
        else:
            drop = world.rng.choice(drops)
            world.remove(drop)
            changed.add(drop)
        current = world.context()
        rows, decided = reselect(recipe, VERSION, pd.DataFrame(rows), previous, current, changed, world.load)
        expected = world.full(recipe) if world.scores else []
        assert rows == expected, (name, seed, step, action)
        decided_counts.append((action, decided, len(current)))
        previous = current
    if name == "default":  # without quotas, a change touches its clips and their groups, not everything
        assert any(decided < total for _, decided, total in decided_counts[3:]), decided_counts


def test_nothing_changed_decides_nothing() -> None:
    recipe = load_recipe()
    world = World(7)
    for i in range(4):
        world.add_drop(f"web/drop-{i}", 4)
    context = world.context()
    rows, decided = reselect(recipe, VERSION, pd.DataFrame(), context.iloc[0:0], context, set(world.scores), world.load)
    assert decided == len(context)
    again, decided = reselect(recipe, VERSION, pd.DataFrame(rows), context, context, set(), world.load)
    assert decided == 0 and again == rows


class DropTables:
    """The tables incremental selection reads, one partition per drop, from a ``World`` (an
    in-memory stand-in for the table store: the World's rows lack the columns the real schemas
    require; the stage itself runs on the real store in test_curate and test_automation)."""

    def __init__(self, world: World):
        self.world, self.selection, self.rewritten, self.seq = world, {}, set(), 0

    def changes_since(self, table: str, cursor: dict | None) -> tuple:
        """The drops whose rows of ``table`` were rewritten since ``cursor`` (``rewritten``), as the
        table store tells them from its deltas; None for a first run."""
        now = {"seq": self.seq}
        if cursor is None:
            return None, now
        drops = sorted(self.rewritten & set(self.world.scores))
        rows = pd.concat([self.read_or_empty(table, d) for d in drops] or [self.read_or_empty(table, "-")])
        return (set(self.rewritten), rows), now

    def read_or_empty(self, table: str, part: str | None = None) -> pd.DataFrame:
        w = self.world
        if table == "selection":
            rows = [r for d, rs in self.selection.items() if part in (None, d) for r in rs]
            return pd.DataFrame(rows)
        if part is None:
            return pd.concat([self.read_or_empty(table, d) for d in sorted(w.scores)] or [self.read_or_empty(table, "-")])
        clips = sorted(set(w.scores[part].clip_id)) if part in w.scores else []
        if table == "dedup_groups":
            return pd.DataFrame([{"clip_id": c, "pdq_group": w.groups[c][0], "semantic_group": w.groups[c][1]}
                                 for c in clips], columns=["clip_id", "pdq_group", "semantic_group"])
        if table == "decontamination":
            return pd.DataFrame([{"clip_id": c, "contaminated": c in w.contaminated} for c in clips],
                                columns=["clip_id", "contaminated"])
        if table == "clip_embeddings":
            return pd.DataFrame([{"clip_id": c, "status": "ok", "vector": v.tobytes()} for c, v in w.vectors[part].items()],
                                columns=["clip_id", "status", "vector"])
        raise KeyError(table)

    def write(self, rows: list[dict], drops: set[str] | None) -> None:
        if drops is None:
            self.selection = {}
        for d in drops or []:
            self.selection.pop(d, None)
        for r in rows:
            self.selection.setdefault(r["source_shard"], []).append(r)


@pytest.mark.parametrize("name", list(_recipes()))
@pytest.mark.parametrize("seed", [4, 5])
def test_selection_state_in_sql_reads_what_a_change_reaches_and_decides_as_everything_again(
        name: str, seed: int, tmp_path) -> None:
    """``reselect_incrementally`` over the SQL state, given the drops whose inputs or whose group and
    contamination rows changed, gives the rows of deciding every clip again (generated copies
    included), over random new drops, rebuilt drops, regrouped clips, eval matches and removed
    drops, told which drops changed (a removal not named caught by the covered count); without quotas a change reads a part of the stored contexts, not all."""
    from vidassets.curate.selection import generated_copies, reselect_incrementally
    from vidassets.curate.selection_state import SelectionState

    recipe = _recipes()[name]
    world = World(seed)
    state = SelectionState(f"sqlite:///{tmp_path}/selection.sqlite")
    tables = DropTables(world)
    made = {f"asset{i}" for i in range(0, 40, 7)}  # model-generated assets
    fingerprints: dict[str, int] = {}
    reads, copies, covered_before = [], set(), {}
    for step in range(16):
        upstream: set[str] = set()
        action = "add" if step < 6 else world.rng.choice(["add", "add", "rebuild", "regroup", "eval", "remove"])
        drops = sorted(world.scores)
        if action == "add" or not drops:
            drop = f"{world.rng.choice(['web', 'licensed'])}/drop-{step:04d}"
            world.add_drop(drop, world.rng.randrange(0, 7))
            fingerprints[drop] = step
        elif action == "rebuild":
            drop = world.rng.choice(drops)
            world.rebuild(drop)
            fingerprints[drop] = step
        elif action in ("regroup", "eval"):
            clip = world.rng.choice(world.all_clips())
            if action == "regroup":
                world.groups[clip] = (world._group(), world.groups[clip][1])
            else:
                world.contaminated.add(clip)
            upstream.add(clip.split(":")[0])
        else:
            drop = world.rng.choice(drops)
            world.remove(drop)
            fingerprints.pop(drop)
        covered = {d: str(fp) for d, fp in fingerprints.items()}
        tables.rewritten = upstream | (set(fingerprints) ^ set(covered_before)) | {
            d for d in fingerprints if fingerprints[d] != covered_before.get(d)}  # dedup rewrites new and rebuilt drops
        tables.seq += 1
        # told which drops changed, as the stage is (a removal every other time not named: the
        # covered count catches it and every drop is compared)
        told = {d for d in set(fingerprints) | set(covered_before) if fingerprints.get(d) != covered_before.get(d)}
        if action == "remove" and step % 2:
            told.discard(drop)
        covered_before = dict(fingerprints)
        done = reselect_incrementally(
            tables, state, recipe, VERSION, "v", covered,
            lambda table, part: world.scores[part],
            lambda parts: {a for p in parts for a in world.scores[p].asset_id} & made, True, changed=told)
        tables.write(done.rows, done.drops)
        done.remember()
        everything = [r for rs in tables.selection.values() for r in rs]
        if world.scores:
            scores = pd.concat(world.scores.values())
            groups = pd.DataFrame([{"clip_id": c, "pdq_group": p, "semantic_group": s} for c, (p, s) in world.groups.items()])
            generated = generated_copies(scores[["clip_id", "asset_id"]], groups, made)
            vectors = {c: v for d in world.vectors.values() for c, v in d.items()}
            expected = select(recipe, scores, groups, vectors, VERSION, world.contaminated, generated)
        else:
            expected = []
        assert sorted(everything, key=lambda r: r["clip_id"]) == expected, (name, seed, step, action)
        totals = done.totals
        assert int(totals.n.sum()) == len(expected)
        assert int(totals.loc[totals.decision == "pass", "n"].sum()) == sum(r["decision"] == "pass" for r in expected)

        def key(frame: pd.DataFrame) -> list[tuple]:
            return sorted((str(r.decision), str(r.first_failed_rule), str(r.tier), int(r.n))
                          for r in frame.itertuples() if r.n)

        assert totals.first_failed_rule[totals.decision == "pass"].isna().all()  # a missing value stays missing
        assert key(state.totals()) == key(state.counts()) == key(totals)  # the kept totals: the per-drop counts' sum
        reads.append((done.contexts_read, len(world.groups)))
        assert done.upstream_read_whole == (step == 0)  # later runs read the upstream writes since the last
        copies.update(r["clip_id"] for r in expected if '"generated_copy": "fail"' in r["rule_outcomes"])
        state.contexts_read = 0
    assert copies, "no real clip duplicated a generated one: the firewall was not exercised"
    if name == "default":
        assert any(read < total / 2 for read, total in reads[8:]), reads
