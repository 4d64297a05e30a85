"""The curriculum's plan mechanics on synthetic snapshot rows (the plan is a pure function of a
sample table; the end-to-end path over real footage is in test_train): extreme weights, phases that
switch at their steps and gate tiers, streams living in different shape buckets, caption variants
per (sample, epoch), and the realized-stream monitor flagging a deliberately bad plan."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from vidassets.config import ConfigError
from vidassets.curate.curriculum import Curriculum, Monitor, Stream, caption_level, cluster_group, stream_of
from vidassets.curate.selection import recipe_from_text
from vidassets.train.monitor import categorical_autocorrelation, inspect_plan
from vidassets.train.plan import PhaseSpec, StepSlice, TrainPlan, plan_bytes, single_phase


def _samples(spec: dict[tuple[str, str, str], int]) -> pd.DataFrame:
    """(stream, bucket, tier) -> how many samples; each sample its own asset, clusters 0..4."""
    rows = []
    for (stream, bucket, tier), n in spec.items():
        for i in range(n):
            clip = f"{stream}-{bucket}-{tier}-{i:04d}"
            rows.append({"clip_id": clip, "asset_id": f"asset-{clip}", "stream": stream, "bucket": bucket,
                         "tier": tier, "cluster": i % 5, "shard": f"{bucket}/shard-{i % 3}.tar"})
    return pd.DataFrame(rows)


def _realized(plan: TrainPlan, start: int, stop: int) -> Counter:
    return Counter(s for step in range(start, stop) for s in plan.step(step).streams)


def test_extreme_weights_are_realized_within_a_few_samples_over_any_window() -> None:
    samples = _samples({("big", "b17", "T1"): 500, ("small", "b17", "T1"): 40})
    plan = TrainPlan(samples, single_phase({"big": 0.99, "small": 0.01}), seed=3, global_batch=48, snapshot_version=1)
    # the small stream is served (about every other step), never starved by rounding
    assert sum(plan.step(s).streams.count("small") for s in range(10)) >= 4
    for start in (0, 7, 1000, 123_457):
        for window in (1, 10, 100):
            got = _realized(plan, start, start + window)
            assert sum(got.values()) == 48 * window  # every step holds exactly the global batch
            # stated tolerance: within 2 samples of the exact share over any window (one bucket here)
            assert abs(got["small"] - 0.01 * 48 * window) <= 2, (start, window, got)
    for weights in ({"big": 0.999, "small": 0.001}, {"big": 1e-6, "small": 1.0}, {"big": 0.5, "small": 0.5}):
        plan = TrainPlan(samples, single_phase(weights), seed=0, global_batch=48, snapshot_version=1)
        share = weights["small"] / sum(weights.values())
        got = _realized(plan, 500, 1500)
        assert abs(got["small"] - share * 48 * 1000) <= 2, (weights, got)


def test_streams_in_different_buckets_still_get_their_weights() -> None:
    """Images live in 1-frame buckets, clips in others: the bucket frequencies follow the weight each
    bucket holds, so the global shares are the mixture's, not the sample counts'."""
    samples = _samples({("images", "f1", "T1"): 900, ("clips", "f17", "T1"): 60, ("clips", "f33", "T1"): 40})
    plan = TrainPlan(samples, single_phase({"images": 0.2, "clips": 0.8}), seed=0, global_batch=16,
                     snapshot_version=1)
    got = _realized(plan, 0, 2000)
    assert abs(got["images"] / (16 * 2000) - 0.2) < 0.005, got
    for step in range(50):  # one shape per step
        sl = plan.step(step)
        assert len({samples.set_index("clip_id").loc[c, "bucket"] for c in sl.clip_ids}) == 1


def test_phases_switch_at_their_steps_and_gate_tiers() -> None:
    samples = _samples({("short", "b9", "T0"): 30, ("short", "b9", "T2"): 90, ("long", "b33", "T0"): 20,
                        ("long", "b33", "T1"): 50})
    phases = [PhaseSpec("warmup", 0, 100, {"short": 1.0}, None),
              PhaseSpec("main", 100, 250, {"short": 0.3, "long": 0.7}, ("T0", "T1", "T2")),
              PhaseSpec("polish", 250, None, {}, ("T0",))]
    plan = TrainPlan(samples, phases, seed=1, global_batch=8, snapshot_version=2)
    tier = samples.set_index("clip_id").tier
    assert {plan.step(s).phase for s in range(100)} == {"warmup"}
    assert plan.step(99).phase == "warmup" and plan.step(100).phase == "main" and plan.step(250).phase == "polish"
    assert all(st == "short" for s in range(100) for st in plan.step(s).streams)
    main = _realized(plan, 100, 250)
    assert abs(main["long"] / (8 * 150) - 0.7) < 0.01
    polish = [c for s in range(250, 400) for c in plan.step(s).clip_ids]
    assert set(tier[polish]) == {"T0"}  # the last phase serves T0 only
    # the phase that gates tiers serves its admitted samples by count when it has no mixture
    assert abs(Counter(plan.step(s).streams[0] for s in range(250, 1250))["long"] / 1000 - 20 / 50) < 0.05
    # random access and elasticity hold across phases
    assert plan_bytes(plan, [99, 100, 251, 10_000], 2) == plan_bytes(
        TrainPlan(samples, phases, seed=1, global_batch=8, snapshot_version=2), [99, 100, 251, 10_000], 2)
    for step in (5, 120, 300):
        sl = plan.step(step)
        assert sorted(sum((plan.rank_batch(step, r, 4) for r in range(4)), [])) == sorted(sl.clip_ids)
    # epochs are counted per phase, and the phase's max_epochs is what the check holds them to
    strict = [PhaseSpec("warmup", 0, 100, {"short": 1.0}, None, {"short": 2.0})]
    assert TrainPlan(samples, strict, seed=1, global_batch=8, snapshot_version=2).over_repeated(100) == \
        {"warmup": {"short": pytest.approx(800 / 120)}}


def test_a_stream_without_samples_is_reported_and_the_others_share_the_batch() -> None:
    samples = _samples({("a", "b1", "T1"): 20})
    plan = TrainPlan(samples, single_phase({"a": 0.5, "ghost": 0.5}), seed=0, global_batch=4, snapshot_version=1)
    assert plan.describe()[0]["streams_without_samples"] == ["ghost"]
    assert plan.step(0).streams == ["a"] * 4
    with pytest.raises(ValueError, match="no samples in any stream"):
        TrainPlan(samples, single_phase({"ghost": 1.0}), seed=0, global_batch=4, snapshot_version=1)


def test_caption_variants_are_drawn_per_sample_and_epoch() -> None:
    variants = {"level_0": 0.2, "level_1": 0.5, "level_3": 0.3}
    draws = Counter(caption_level(7, f"clip-{i}", 0, variants, "level_1") for i in range(6000))
    for level, weight in variants.items():
        assert abs(draws[level] / 6000 - weight) < 0.03
    assert "level_2" not in draws
    # the same (sample, epoch) always shows the same level; another epoch may show another
    assert caption_level(7, "clip-1", 3, variants, "level_1") == caption_level(7, "clip-1", 3, variants, "level_1")
    assert len({caption_level(7, "clip-1", e, variants, "level_1") for e in range(30)}) > 1
    assert caption_level(7, "clip-1", 0, {}, "level_2") == "level_2"
    samples = _samples({("a", "b1", "T1"): 10})
    plan = TrainPlan(samples, single_phase(), seed=0, global_batch=5, snapshot_version=1, caption_variants=variants)
    levels = {(c, e): lv for s in range(40) for c, e, lv in zip(plan.step(s).clip_ids, plan.step(s).epochs,
                                                                 plan.step(s).caption_levels, strict=True)}
    assert len(levels) == 10 * 20 and set(levels.values()) <= set(variants)


class _SortedPlan(TrainPlan):
    """A deliberately bad plan: each step's batch grouped by stream and cluster (no interleave), and
    one clip of each step served five times in it."""

    def step(self, step: int) -> StepSlice:
        sl = super().step(step)
        cluster = self.samples.set_index("clip_id").cluster
        order = sorted(range(len(sl.clip_ids)), key=lambda i: (sl.streams[i], cluster[sl.clip_ids[i]]))
        clips = [sl.clip_ids[i] for i in order]
        clips[-4:] = [clips[0]] * 4
        return StepSlice(step, sl.phase, sl.bucket, clips, [sl.streams[i] for i in order],
                         [sl.epochs[i] for i in order], [sl.caption_levels[i] for i in order])


def test_the_monitor_passes_a_good_plan_and_flags_a_deliberately_bad_one() -> None:
    samples = _samples({("a", "b1", "T1"): 400, ("b", "b1", "T1"): 400})
    limits = Monitor(window_steps=50, max_autocorrelation=0.3, max_repeats_in_window=1)
    good = inspect_plan(TrainPlan(samples, single_phase({"a": 0.5, "b": 0.5}), 0, 16, 1), 0, 50, limits)
    assert good["passed"], good["findings"]
    # a small stream repeats by necessity (8 clips drawn ~400 times): not a finding
    small = _samples({("a", "b1", "T1"): 400, ("b", "b1", "T1"): 8})
    forced = inspect_plan(TrainPlan(small, single_phase({"a": 0.5, "b": 0.5}), 0, 16, 1), 0, 50, limits)
    assert forced["max_repeats"] >= 50 and forced["passed"], forced["findings"]
    assert abs(good["autocorrelation"]["stream"]["within_batch"][1]) < 0.2
    bad = inspect_plan(_SortedPlan(samples, single_phase({"a": 0.5, "b": 0.5}), 0, 16, 1), 0, 50, limits)
    assert not bad["passed"]
    text = " ".join(bad["findings"])
    assert "stream lag-1 autocorrelation within batch" in text and "cluster lag-1" in text
    assert "served more often than their stream's passes allow" in text
    # realized share far from the configured weight
    skewed = inspect_plan(TrainPlan(samples, single_phase({"a": 0.9, "b": 0.1}), 0, 16, 1), 0, 50,
                          Monitor(share_tolerance=0.0001))
    assert skewed["passed"], skewed["findings"]  # the plan realizes its weights exactly over 50 steps


def test_categorical_autocorrelation() -> None:
    values = ["a", "b"] * 50
    assert categorical_autocorrelation(list(zip(values, values[1:], strict=False)), values) == -1.0
    assert categorical_autocorrelation(list(zip(values, values[2:], strict=False)), values) == 1.0
    rng = np.random.default_rng(0)
    noise = list(rng.choice(["a", "b", "c"], 5000))
    assert abs(categorical_autocorrelation(list(zip(noise, noise[1:], strict=False)), noise)) < 0.05
    assert categorical_autocorrelation([("a", "a")], ["a", "a"]) is None  # no variation


def test_streams_are_recipe_expressions_and_the_recipe_rejects_bad_phases() -> None:
    streams = [Stream(name="t0_short", tiers=["T0"], max_duration_s=4), Stream(name="images", modality="image"),
               Stream(name="people", cluster_groups=["people"]), Stream(name="speech", min_speech_share=0.5)]
    assert stream_of({"tier": "T0", "duration_s": 3.0, "source_tier": "web"}, streams) == "t0_short"
    assert stream_of({"tier": "T0", "duration_s": 9.0, "source_tier": "web", "modality": "image"}, streams) == "images"
    assert stream_of({"tier": "T1", "cluster_group": "people", "source_tier": "web"}, streams) == "people"
    assert stream_of({"tier": "T1", "speech_share": 0.7, "source_tier": "web"}, streams) == "speech"
    assert stream_of({"tier": "T1", "speech_share": float("nan"), "source_tier": "web"}, streams) == "web"
    with pytest.raises(ConfigError, match="curriculum"):
        recipe_from_text("curriculum: {phases: [{name: a, until_step: 10}, {name: b, until_step: 5}, {name: c}]}", "t")
    with pytest.raises(ConfigError, match="until_step"):
        recipe_from_text("curriculum: {phases: [{name: a}, {name: b}]}", "t")
    with pytest.raises(ConfigError, match="cluster group"):
        recipe_from_text("curriculum: {streams: [{name: s, cluster_groups: [nope]}]}", "t")
    with pytest.raises(ConfigError, match="weights"):
        recipe_from_text("curriculum: {phases: [{name: a, mixture: {x: -1}}]}", "t")
    ok = recipe_from_text("curriculum: {caption_variants: {level_2: 1, level_0: 1}}", "t")
    assert ok.curriculum.caption_levels("level_1") == ["level_1", "level_0", "level_2"]
    assert Curriculum().caption_levels("level_1") == ["level_1"]
    groups = {"people": [0, 3]}
    assert [cluster_group(c, groups) for c in (3, 1, pd.NA, float("nan"), None)] == ["people", "other", None, None, None]


def test_clusters_are_trained_once_per_version_and_new_drops_are_assigned_to_them(tmp_path) -> None:
    from vidassets.config import ClusterSettings
    from vidassets.curate.clusters import update
    from vidassets.curate.embeddings import vector_bytes
    from vidassets.storage.objects import open_object_store
    from vidassets.storage.rows import RowVersion

    rng = np.random.default_rng(0)
    centres = np.eye(8, dtype=np.float32)[:3]

    def drop(name: str, n: int) -> pd.DataFrame:
        vectors = centres[rng.integers(0, 3, n)] + 0.05 * rng.standard_normal((n, 8)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return pd.DataFrame({"clip_id": [f"{name}-{i}" for i in range(n)], "asset_id": "a" * 64, "source_shard": name,
                             "status": "ok", "vector": [vector_bytes(v) for v in vectors], "producer_version": "emb"})

    objects = open_object_store(str(tmp_path / "store"))
    drops = {"t/d1": drop("t/d1", 2)}
    c = ClusterSettings(k=3)
    waiting = update(objects, {"t/d1": "v1"}, drops.get, "clusters-a", "full-a", RowVersion("clusters-a", "in"), c)
    assert waiting.rows is None and "needs at least k=3" in waiting.meta["waiting"]
    drops["t/d1"] = drop("t/d1", 30)
    first = update(objects, {"t/d1": "v2"}, drops.get, "clusters-a", "full-a", RowVersion("clusters-a", "in"), c)
    first.remember()
    assert first.changed == {"t/d1"} and len(first.rows) == 30 and first.meta["trained_on"] == 30
    by_clip = {r["clip_id"]: r["cluster"] for r in first.rows}
    assert len(set(by_clip.values())) == 3  # three well separated groups, three clusters
    drops["t/d2"] = drop("t/d2", 10)
    second = update(objects, {"t/d1": "v2", "t/d2": "v1"}, drops.get, "clusters-a", "full-a",
                    RowVersion("clusters-a", "in"), c)
    # the new drop only, assigned to the centroids trained before (not trained again)
    assert second.changed == {"t/d2"} and len(second.rows) == 10 and second.meta == first.meta
    second.remember()
    bumped = update(objects, {"t/d1": "v2", "t/d2": "v1"}, drops.get, "clusters-b", "full-b",
                    RowVersion("clusters-b", "in"), ClusterSettings(k=3, version=2))
    assert bumped.changed == {"t/d1", "t/d2"} and len(bumped.rows) == 40 and bumped.meta["trained_on"] == 40
