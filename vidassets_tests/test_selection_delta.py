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
