"""Curation through Dagster on real footage: scores, embeddings, dedup groups (incl. a downscaled
watermarked re-encode), incremental dedup, and selection re-runs that make no model call or decode."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from vidassets.config import ConfigError
from vidassets.curate.selection import Recipe, load_recipe
from vidassets.demo.bucket import decode_rgb, encode
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.rows import RowVersion
from vidassets.union_find import UnionFind
from vidassets_tests.conftest import CURATE_STAGES, graph_settings, postgres_server, run_graph, small_bucket


def _watermarked_downscale(src: Path, dst: Path) -> None:
    def frames():
        for rgb in decode_rgb(src):
            small = cv2.resize(rgb, (rgb.shape[1] // 2 // 2 * 2, rgb.shape[0] // 2 // 2 * 2), interpolation=cv2.INTER_AREA)
            # a corner watermark, as stock and broadcast footage carry
            cv2.putText(small, "(c) vidassets", (small.shape[1] - 90, small.shape[0] - 8), cv2.FONT_HERSHEY_SIMPLEX,
                        0.3, (255, 255, 255), 1)
            yield small
    encode(frames(), dst, "libx264", 25, options={"preset": "veryfast", "crf": "23"})


@pytest.fixture(scope="module")
def curated(demo_bucket: Path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("curate")
    bucket = small_bucket(demo_bucket, tmp)
    run_graph(graph_settings(bucket, tmp), tmp, select=CURATE_STAGES)
    # a second drop arrives later: a downscaled, watermarked re-encode of bikes
    (bucket / "raw/web/drop-0009").mkdir(parents=True)
    _watermarked_downscale(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", bucket / "raw/web/drop-0009/bikes_wm.mp4")
    (bucket / "raw/web/drop-0009/_SUCCESS").write_bytes(b"")
    summary = run_graph(graph_settings(bucket, tmp), tmp, select=CURATE_STAGES)
    (tmp / "second.json").write_text(json.dumps({k: v.extra for k, v in summary.stages.items()}))
    return tmp


def _tables(tmp: Path) -> TableStore:
    return TableStore(open_object_store(str(tmp / "store")))


def test_watermarked_downscale_joins_its_source_pdq_group(curated: Path) -> None:
    tables = _tables(curated)
    groups = tables.read("dedup_groups").merge(tables.read_all("clips")[["clip_id", "uri", "first_frame"]], on="clip_id")
    wm = groups[groups.uri.str.endswith("bikes_wm.mp4")]
    src = groups[groups.uri.str.endswith("/bikes.mp4")]
    assert len(wm) == len(src) >= 2
    for clip in wm.itertuples():
        twin = src[src.first_frame == clip.first_frame].iloc[0]
        assert clip.pdq_group == twin.pdq_group and clip.pdq_group_size >= 2
        assert json.loads(clip.pdq_evidence)[1] >= 0.8
    carphone = groups[groups.uri.str.endswith("carphone.mp4")].iloc[0]
    assert carphone.pdq_group_size == 1  # unrelated footage stays alone


def test_dedup_is_incremental(curated: Path) -> None:
    second = json.loads((curated / "second.json").read_text())
    assert second["dedup_groups"]["new_clips"] == 3  # only the new drop's clips were added and queried
    assert "rebuilt" not in second["dedup_groups"] or second["dedup_groups"].get("rebuilt", 0) == 0
    assert second["clip_embeddings"]["model_calls"] > 0 and second["clip_embeddings"]["rows_reused"] == 4


def test_scores_and_embeddings_exist_for_every_clip(curated: Path) -> None:
    tables = _tables(curated)
    clips = tables.read_all("clips")
    scores = tables.read_all("clip_scores")
    embeddings = tables.read_all("clip_embeddings")
    assert set(scores.clip_id) == set(clips.clip_id) == set(embeddings.clip_id)
    assert (scores.groupby("clip_id").size() == 8).all()
    ok = scores[scores.status == "ok"]
    assert ok.value.between(0, 1).all() and all(json.loads(e) for e in ok.evidence)
    # cheap first: formula scores everywhere; a model score is skipped only where a formula rule failed
    assert (scores[scores.score.isin(["optical", "motion", "static", "bitrate"])].status == "ok").all()
    skipped = scores[scores.status == "skipped"]
    assert set(scores.status) <= {"ok", "skipped"} and skipped.reason.str.startswith("cascade: ").all()
    rejected = tables.read("selection").set_index("clip_id").first_failed_rule
    assert all(rejected[c] in ("optical>=0.9", "motion>=0.1") for c in set(skipped.clip_id))
    vec = np.frombuffer(embeddings.vector.iloc[0], "<f4")
    assert vec.shape == (1280,) and abs(np.linalg.norm(vec) - 1) < 1e-4


def test_selection_rerun_with_new_recipe_makes_no_model_call_or_decode(curated: Path, tmp_path: Path) -> None:
    tables = _tables(curated)
    before = tables.read("selection").set_index("clip_id")
    assert (before.decision == "pass").sum() >= 1
    # the re-encode and its source share PDQ groups: only one of each pair passes
    passing = before[before.decision == "pass"]
    groups = tables.read("dedup_groups").set_index("clip_id")
    assert groups.loc[passing.index, "pdq_group"].is_unique
    recipe = load_recipe().model_dump()
    recipe["score_rules"] = [{"score": "optical", "min": 0.9}, {"score": "motion", "min": 0.95}]
    path = tmp_path / "strict.yaml"
    path.write_text(json.dumps(recipe))
    summary = run_graph(graph_settings(curated / "bucket", curated, **{"selection.recipe": str(path)}), curated,
                        select=CURATE_STAGES)
    stage = summary.stages["selection"]
    assert stage.extra["model_calls"] == 0 and stage.extra["frames_decoded"] == 0
    for name in ("clip_scores", "clip_embeddings", "video_analysis"):
        assert summary.stages[name].extra.get("model_calls", 0) == 0
        assert summary.stages[name].extra.get("frames_decoded", 0) == 0
    after = tables.read("selection").set_index("clip_id")
    assert (after.decision == "pass").sum() == 0
    assert set(after.first_failed_rule.dropna()) <= {"motion>=0.95", "optical>=0.9"}
    assert after.recipe_hash.iloc[0] != before.recipe_hash.iloc[0]


def test_bad_recipe_is_rejected_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("score_rules:\n  - {score: opticall, min: 0.9}\n")
    with pytest.raises(ConfigError, match=r"score_rules\.0\.score"):
        load_recipe(path)
    path.write_text("semantic_dedup: {min_cosine: 2}\n")
    with pytest.raises(ConfigError, match=r"semantic_dedup\.min_cosine"):
        load_recipe(path)
    assert isinstance(load_recipe(), Recipe)


def test_union_find_groups() -> None:
    uf = UnionFind()
    uf.add(6)
    uf.union(0, 3)
    uf.union(3, 5)
    uf.union(1, 2)
    assert len({uf.find(i) for i in range(6)}) == 3 and uf.find(5) == 0


def test_selection_quotas_and_views() -> None:
    import pandas as pd

    from vidassets.curate.selection import select

    clips = [(f"c{i}", "a" * 63 + str(i % 2), "t/d") for i in range(6)]
    scores = pd.DataFrame([
        {"clip_id": c, "asset_id": a, "source_shard": s, "score": name, "value": 0.99 - 0.01 * i, "kill": False}
        for i, (c, a, s) in enumerate(clips) for name in ("optical", "motion", "quality", "text")
    ])
    recipe = load_recipe().model_copy(update={"quotas": load_recipe().quotas.model_copy(update={"max_clips_per_asset": 2})})
    rows = {r["clip_id"]: r for r in select(recipe, scores, pd.DataFrame(), {}, RowVersion("v"))}
    passed = sorted(c for c, r in rows.items() if r["decision"] == "pass")
    assert passed == ["c0", "c1", "c2", "c3"]  # the two best of each asset
    assert rows["c4"]["first_failed_rule"] == "quota:max_clips_per_asset"
    assert json.loads(rows["c5"]["rule_outcomes"])["quota:max_clips_per_asset"] == "over quota"


def _planted_frames(rng, pairs_per_distance: int, distances: tuple[int, ...], frames: int = 4, noise: int = 2000):
    """PDQ-like hashes: clip pairs whose frames differ by exactly d bits, plus random clips."""
    hashes, owner, planted = [], [], {}
    clip = 0
    for d in distances:
        for _ in range(pairs_per_distance):
            base = rng.integers(0, 256, size=(frames, 32), dtype=np.uint8)
            bits = np.unpackbits(base, axis=1)
            for f in range(frames):
                bits[f, rng.choice(256, size=d, replace=False)] ^= 1
            hashes += [base, np.packbits(bits, axis=1)]
            owner += [np.full(frames, clip), np.full(frames, clip + 1)]
            planted.setdefault(d, []).append((clip, clip + 1))
            clip += 2
    hashes.append(rng.integers(0, 256, size=(noise * frames, 32), dtype=np.uint8))
    owner.append(np.repeat(np.arange(clip, clip + noise), frames))
    return np.concatenate(hashes), np.concatenate(owner).astype(np.int64), planted


def test_lsh_candidates_find_pairs_up_to_the_threshold() -> None:
    """Above the exact-search size, candidates come from bit-sampling LSH planned for the threshold:
    clip pairs of 4 frames whose frames differ by exactly 8, 16, 24 or 31 bits are all found. The
    previous generator (16 overlapping 32-bit windows) misses most pairs at 31."""
    from vidassets.curate import dedup

    rng = np.random.default_rng(3)
    hashes, owner, planted = _planted_frames(rng, 60, (8, 16, 24, 31))
    found = {tuple(p) for p in dedup._lsh_candidates(hashes, owner, 0, dedup.lsh_tables(31)).tolist()}
    baseline = {tuple(p) for p in dedup._window_candidates(hashes, owner, 0).tolist()}
    for d, pairs in planted.items():
        assert all(p in found for p in pairs), d
    assert sum(p in baseline for p in planted[31]) < 0.8 * len(planted[31])
    assert len(found) < 3 * sum(len(p) for p in planted.values())  # few random candidates


def test_the_lsh_plan_counts_bits_drawn_without_replacement() -> None:
    """The tables' bit positions are drawn without replacement: two hashes d bits apart share a key
    with C(256-d, bits)/C(256, bits), measured here over the planned tables (the with-replacement
    (1 - d/256)^bits, which planned too few tables, is 17% off at d = 31)."""
    from vidassets.curate import dedup

    rng = np.random.default_rng(5)
    d, pairs = 31, 600
    base = rng.integers(0, 2, size=(pairs, 256), dtype=np.uint8)
    other = base.copy()
    for row in other:
        row[rng.choice(256, size=d, replace=False)] ^= 1
    tables = np.random.default_rng(1).random((400, 256)).argsort(axis=1)[:, :dedup.LSH_BITS]  # positions, no repeats
    shared = np.array([(base[:, t] == other[:, t]).all(axis=1) for t in tables])  # (tables, pairs)
    measured = float(shared.mean())
    assert measured == pytest.approx(dedup.key_collision(d), rel=0.05)
    assert abs(measured - (1 - d / 256) ** dedup.LSH_BITS) > 0.1 * measured


def test_one_frame_items_at_the_threshold_are_found_as_exhaustive_search_finds_them() -> None:
    """Images (one frame) in near-duplicate pairs at exactly the threshold: the planned tables find
    >= 99% (expected) of the pairs exhaustive search finds; 3- and 8-frame items all of them."""
    from vidassets.curate import dedup

    rng = np.random.default_rng(11)
    found_share = {}
    for frames, pairs in ((1, 400), (3, 60), (8, 30)):
        hashes, owner, planted = _planted_frames(rng, pairs, (31,), frames=frames, noise=3000)
        exact = {tuple(p) for p in dedup._exact_candidates(hashes, owner, 0, 31).tolist()}
        assert all(p in exact for p in planted[31])
        lsh = {tuple(p) for p in dedup._lsh_candidates(hashes, owner, 0, dedup.lsh_tables(31)).tolist()}
        found_share[frames] = sum(p in lsh for p in planted[31]) / len(planted[31])
    assert found_share[1] >= 0.975 and found_share[3] == found_share[8] == 1.0, found_share


def test_lsh_candidates_of_a_small_drop_are_the_whole_key_pairs() -> None:
    """Stored frames are narrowed by partial keys while the keys are built: the pairs must be exactly
    those of whole keys. Reference computed here from the definition (each table's bit positions,
    drawn as the code draws them, unpacked and compared whole), on stored clips (frames not all first)
    with near copies in a small new drop, a large one, and none."""
    from vidassets.curate import dedup

    rng = np.random.default_rng(11)
    in_order, owner_in_order, _ = _planted_frames(rng, 400, (8, 16, 24, 31))  # stored frames first, as kept
    shuffle = rng.permutation(len(in_order))  # and stored frames interleaved with new ones
    clips = int(owner_in_order.max()) + 1
    tables = 6  # few tables of few bits: many shared keys, so narrowing is exercised against real collisions

    def reference(hashes: np.ndarray, owner: np.ndarray, first_new_clip: int, bits: int) -> set[tuple[int, int]]:
        draw = np.random.default_rng(20250601)
        unpacked = np.unpackbits(hashes, axis=1)
        found: set[tuple[int, int]] = set()
        for _ in range(tables):
            positions = draw.choice(256, size=bits, replace=False)
            by_key: dict[bytes, set[int]] = {}
            for key, clip in zip(map(bytes, unpacked[:, positions]), owner.tolist(), strict=True):
                by_key.setdefault(key, set()).add(clip)
            for members in by_key.values():
                found |= {(a, b) for a in members for b in members if a < b and b >= first_new_clip}
        return found

    for hashes, owner in ((in_order, owner_in_order), (in_order[shuffle], owner_in_order[shuffle])):
        for first_new_clip in (clips - 3, clips // 2, 0, clips):
            for bits in (12, dedup.LSH_BITS):
                got = {tuple(p) for p in dedup._lsh_candidates(hashes, owner, first_new_clip, tables, bits).tolist()}
                assert got == reference(hashes, owner, first_new_clip, bits), (first_new_clip, bits)
        small = {tuple(p) for p in dedup._lsh_candidates(hashes, owner, clips - 3, tables, 12).tolist()}
        assert small and all(b >= clips - 3 for _, b in small)


def test_dedup_vectors_in_lists_find_the_groups_every_vector_finds(tmp_path: Path, monkeypatch) -> None:
    """Past ``FLAT_LIMIT`` stored vectors, a new clip's vector is compared only with those in its
    nearest k-means lists (retrained as they double): the semantic groups equal those of comparing
    with every stored vector, and a drop reads a part of the stored vectors, not all."""
    from vidassets.config import DedupSettings
    from vidassets.curate import dedup, dedup_state
    from vidassets.curate.dedup_state import DedupState

    rng = np.random.default_rng(8)
    anchors = rng.integers(0, 256, (40, 4, 32), dtype=np.uint8)
    anchor_vectors = rng.normal(size=(40, 16))
    parts = {f"web/d{i:02d}": _dedup_partition(rng, f"web/d{i:02d}", 24 if i < 20 else 2, anchors, anchor_vectors)
             for i in range(21)}
    version = RowVersion("dedup-test", "in")

    def run(name: str) -> tuple[dict, list[int]]:
        state, read = DedupState(f"sqlite:///{tmp_path}/{name}.sqlite"), []
        for n in range(1, len(parts) + 1):
            dedup.update(state, "v", {p: "1" for p in list(parts)[:n]}, parts.__getitem__, DedupSettings())
            read.append(state.counters["vectors_read"])
        return {r["clip_id"]: (r["semantic_group"], r["semantic_group_size"]) for r in dedup.group_rows(state, version)}, read

    every, _ = run("flat")
    monkeypatch.setattr(dedup, "FLAT_LIMIT", 96)
    monkeypatch.setattr(dedup_state, "MIN_LIST_SIZE", 8)
    listed, read = run("lists")
    assert listed == every and any(size > 2 for _, size in every.values())
    assert read[-1] < 24 * 20 / 4  # the last drop (two clips) read less than a quarter of the stored vectors


def _dedup_partition(rng: np.random.Generator, part: str, n: int, anchors: np.ndarray, anchor_vectors: np.ndarray):
    """``n`` clips of 4 sampled frames; every other clip a near copy (a few bits, a little noise) of
    a shared anchor, so groups span partitions."""
    import pandas as pd

    from vidassets.curate import dedup

    clips, frames, embeddings = [], [], []
    for i in range(n):
        clip, asset = f"{part}-c{i}", f"{part}-a{i}".ljust(64, "0")
        if i % 2 == 0:
            a = int(rng.integers(len(anchors)))
            hashes = anchors[a] ^ (rng.random(anchors[a].shape) < 0.01).astype(np.uint8)
            vector = anchor_vectors[a] + rng.normal(scale=0.01, size=anchor_vectors.shape[1])
        else:
            hashes = rng.integers(0, 256, (4, 32), dtype=np.uint8)
            vector = rng.normal(size=anchor_vectors.shape[1])
        vector = (vector / np.linalg.norm(vector)).astype(np.float32)
        clips.append({"clip_id": clip, "asset_id": asset, "source_shard": part, "first_frame": 0, "last_frame": 3})
        frames += [{"asset_id": asset, "frame_index": f, "pdq_hash": hashes[f].tobytes().hex()} for f in range(4)]
        embeddings.append({"clip_id": clip, "status": "ok", "dim": len(vector), "vector": vector.tobytes()})
    return dedup.PartitionFeatures(pd.DataFrame(clips), pd.DataFrame(frames), pd.DataFrame(embeddings))


def test_stored_dedup_state_is_read_in_pieces_and_reports_the_drops_it_changed(tmp_path: Path, monkeypatch) -> None:
    """Drops added one run at a time, the SQL state opened anew for each run (a new process), give
    the same groups as one run over every drop; each run's ``changed_shards`` covers every drop whose
    group rows changed, so writing only those drops keeps the table exact; a run that stopped after
    updating the state and before writing its rows has them written by the next run; a run reads
    only the stored clips its new clips probe."""
    from vidassets.config import DedupSettings
    from vidassets.curate import dedup, dedup_state
    from vidassets.curate.dedup_state import DedupState

    monkeypatch.setattr(dedup_state, "POSTING_LEVELS", (("dd_postings_0", 1200), ("dd_postings_1", 5000),
                                                        ("dd_postings", None)))  # merges at test size
    rng = np.random.default_rng(5)
    anchors = rng.integers(0, 256, (3, 4, 32), dtype=np.uint8)
    anchor_vectors = rng.normal(size=(3, 16))
    parts = {f"web/d{i}": _dedup_partition(rng, f"web/d{i}", 4, anchors, anchor_vectors) for i in range(7)}
    params, version = DedupSettings(), RowVersion("dedup-test", "in")

    def groups(rows):
        return {r["clip_id"]: (r["pdq_group"], r["pdq_group_size"], r["semantic_group"], r["semantic_group_size"],
                               r["pdq_evidence"], r["semantic_evidence"]) for r in rows}

    whole = DedupState(f"sqlite:///{tmp_path}/whole.sqlite")
    dedup.update(whole, "v", {p: "1" for p in parts}, parts.__getitem__, params)
    url = f"sqlite:///{tmp_path}/dedup.sqlite"
    table: dict[str, tuple] = {}
    merged = 0
    for n in range(1, len(parts) + 1):
        state = DedupState(url)
        done = dedup.update(state, "v", {p: "1" for p in list(parts)[:n]}, parts.__getitem__, params)
        assert done.done["new_clips"] == 4 and not done.done["rebuilt"] or n == 1
        assert state.counters["clips_read"] <= 4 * (n - 1)
        merged += state.counters["postings_merged"]
        full = groups(dedup.group_rows(state, version))
        changed = {c for c, g in full.items() if table.get(c) != g}
        shards = done.changed_shards if done.changed_shards is not None else set(parts)
        assert {c.rsplit("-", 1)[0] for c in changed} <= shards
        if n == 4:  # stopped before writing: the next run writes these drops too
            missed = shards
            continue
        if n == 5:
            assert missed <= shards
        table = {c: g for c, g in table.items() if c.rsplit("-", 1)[0] not in shards}
        table.update(groups(dedup.group_rows(state, version, shards)))
        state.written()
        assert table == full
    assert table == groups(dedup.group_rows(whole, version))
    assert merged  # the postings went through their levels
    assert any(g[1] > 1 for g in table.values()) and any(g[3] > 1 for g in table.values())


def test_dedup_told_what_changed_reads_only_those_drops_and_catches_what_it_was_not_told(tmp_path: Path, monkeypatch) -> None:
    """``changed`` (the partitions the step's journal says were written since its last run): the
    covered drops' rows are read for those alone and the groups equal a run told nothing; a drop
    rebuilt outside ``changed`` is still found (the covered count no longer adds up) and rebuilds."""
    from vidassets.config import DedupSettings
    from vidassets.curate import dedup
    from vidassets.curate.dedup_state import DedupState

    rng = np.random.default_rng(11)
    anchors = rng.integers(0, 256, (3, 4, 32), dtype=np.uint8)
    anchor_vectors = rng.normal(size=(3, 16))
    parts = {f"web/d{i}": _dedup_partition(rng, f"web/d{i}", 4, anchors, anchor_vectors) for i in range(6)}
    params, version = DedupSettings(), RowVersion("dedup-test", "in")
    told, blind = DedupState(f"sqlite:///{tmp_path}/told.sqlite"), DedupState(f"sqlite:///{tmp_path}/blind.sqlite")
    asked: list[set[str] | None] = []
    real_covered = DedupState.covered

    def covered(self, drops=None):
        asked.append(None if drops is None else set(drops))
        return real_covered(self, drops)

    monkeypatch.setattr(DedupState, "covered", covered)
    for n in range(1, len(parts) + 1):
        fingerprints = {p: "1" for p in list(parts)[:n]}
        asked.clear()
        done = dedup.update(told, "v", fingerprints, parts.__getitem__, params, changed=[f"web/d{n - 1}"])
        assert not done.done["rebuilt"] or n == 1
        assert asked == ([None] if n == 1 else [{f"web/d{n - 1}"}])  # a first run has no count to check
        dedup.update(blind, "v", fingerprints, parts.__getitem__, params)
    assert dedup.group_rows(told, version) == dedup.group_rows(blind, version)

    fingerprints = {p: "1" for p in parts}
    parts["web/d6"] = _dedup_partition(rng, "web/d6", 4, anchors, anchor_vectors)
    fingerprints["web/d6"] = "1"  # added, and not named: the count is one short, so every row is compared
    asked.clear()
    done = dedup.update(told, "v", fingerprints, parts.__getitem__, params, changed=[])
    assert asked == [set(), None] and done.done["new_partitions"] == 1 and not done.done["rebuilt"]
    del fingerprints["web/d1"]  # removed, and not named: found by the count, and taken out
    asked.clear()
    done = dedup.update(told, "v", fingerprints, parts.__getitem__, params, changed=["web/d4"])
    assert asked == [{"web/d4"}, None] and done.done["taken_out_partitions"] == 1 and not done.done["rebuilt"]
    fresh = DedupState(f"sqlite:///{tmp_path}/fresh.sqlite")
    dedup.update(fresh, "v", fingerprints, parts.__getitem__, params)
    assert dedup.group_rows(told, version) == dedup.group_rows(fresh, version)


def _dedup_counts(state) -> dict[str, int]:
    """Live rows of the state's tables that hold clips: clips, drops, and the postings and vectors
    of clips not taken out (links aside: a semantic link depends on what else was stored when it
    was found)."""
    from vidassets.curate.dedup_state import ALIVE, POSTING_LEVELS

    with state.database.engine.connect() as db:
        def count(table: str, alive: str = "") -> int:
            return db.exec_driver_sql(f"SELECT COUNT(*) FROM {table} WHERE TRUE{alive}").scalar()

        return {"clips": count("dd_clips"), "drops": count("dd_drops"), "vectors": count("dd_vectors", ALIVE),
                "postings": sum(count(t, ALIVE) for t, _ in POSTING_LEVELS)}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_drop_removed_or_rebuilt_costs_dedup_its_clips_and_gives_the_groups_of_a_run_without_it(
        tmp_path: Path, backend: str) -> None:
    """A covered drop taken down (or re-cut) is taken out of dedup's state at the cost of its own
    clips and the groups they were in: no rebuild; the groups split again from the stored links of
    their remaining members and equal those of a state built from scratch over the drops that stay
    (every column, evidence included, for a removal; group ids and sizes for a rebuilt drop, whose
    clips come back with new rows; a semantic evidence tied at four decimals may name another clip
    of the group); its clips go, their postings and vectors no longer read; ``changed_shards`` names
    every drop whose rows changed; and it reads the clips of that drop and of its groups, not every
    stored clip. A state from before links were kept rebuilds instead. On SQLite and on a real
    PostgreSQL server (production's)."""
    with contextlib.ExitStack() as stack:
        if backend == "postgresql":
            port = stack.enter_context(postgres_server())
            url = f"postgresql://vidassets@127.0.0.1:{port}/dagster"
        else:
            url = f"sqlite:///{tmp_path}/state.sqlite"
        _taken_out_of_dedup(tmp_path, url)


def _taken_out_of_dedup(tmp_path: Path, url: str) -> None:
    from vidassets.config import DedupSettings
    from vidassets.curate import dedup
    from vidassets.curate.dedup_state import DedupState

    rng = np.random.default_rng(21)
    anchors = rng.integers(0, 256, (12, 4, 32), dtype=np.uint8)
    anchor_vectors = rng.normal(size=(12, 16))
    parts = {f"web/d{i}": _dedup_partition(rng, f"web/d{i}", 6, anchors, anchor_vectors) for i in range(8)}
    params, version = DedupSettings(), RowVersion("dedup-test", "in")
    state = DedupState(url)
    fingerprints: dict[str, str] = {}
    for part in parts:
        fingerprints[part] = "1"
        dedup.update(state, "v", fingerprints, parts.__getitem__, params, changed=[part])
        state.written()

    def fresh(name: str) -> DedupState:
        built = DedupState(f"sqlite:///{tmp_path}/{name}.sqlite")
        dedup.update(built, "v", fingerprints, parts.__getitem__, params)
        return built

    def by_clip(rows) -> dict[str, dict]:
        return {r["clip_id"]: r for r in rows}

    before = by_clip(dedup.group_rows(state, version))
    taken = "web/d3"
    assert any(r["pdq_group_size"] > 1 for r in before.values() if r["source_shard"] == taken)
    del fingerprints[taken]
    done = dedup.update(state, "v", fingerprints, parts.__getitem__, params, changed=[taken])
    assert done.done["taken_out_partitions"] == 1 and not done.done["rebuilt"] and done.done["new_clips"] == 0
    mine = [r for r in before.values() if r["source_shard"] == taken]
    groups_of = {kind: {r[f"{kind}_group"] for r in mine if r[f"{kind}_group"] is not None} for kind in ("pdq", "semantic")}
    members = sum(r[f"{kind}_group"] in groups_of[kind] for r in before.values() for kind in groups_of)
    without_vector = sum(r["semantic_group"] is None for r in mine)  # a group of its own, read again
    assert state.counters["clips_read"] == len(mine) + members + without_vector < len(before)
    after = by_clip(dedup.group_rows(state, version))
    expected = fresh("without")
    want = by_clip(dedup.group_rows(expected, version))
    assert {c: {**r, "semantic_evidence": None} for c, r in after.items()} == {
        c: {**r, "semantic_evidence": None} for c, r in want.items()}
    for clip, row in after.items():  # a cosine tied at 4 decimals may name another clip of the group
        got, wanted = json.loads(row["semantic_evidence"]), json.loads(want[clip]["semantic_evidence"])
        assert (got is None) == (wanted is None)
        assert got is None or (got[1] == wanted[1] and after[got[0]]["semantic_group"] == row["semantic_group"])
    assert _dedup_counts(state) == _dedup_counts(expected)
    changed = {r["source_shard"] for c, r in before.items() if after.get(c) != r}
    assert taken in changed and changed <= done.changed_shards and len(changed) > 1
    assert dedup.group_counts(state) == dedup.group_counts(expected)
    state.written()

    rebuilt = "web/d5"  # re-cut: out, then in again as new clips
    parts[rebuilt] = _dedup_partition(rng, rebuilt, 5, anchors, anchor_vectors)
    fingerprints[rebuilt] = "2"
    done = dedup.update(state, "v", fingerprints, parts.__getitem__, params, changed=[rebuilt])
    assert done.done["taken_out_partitions"] == 1 and done.done["new_clips"] == 5 and not done.done["rebuilt"]
    expected = fresh("rebuilt")
    assert _dedup_counts(state) == _dedup_counts(expected)
    assert dedup.group_counts(state) == dedup.group_counts(expected)
    columns = ("source_shard", "pdq_group", "pdq_group_size", "semantic_group", "semantic_group_size")
    now, want = by_clip(dedup.group_rows(state, version)), by_clip(dedup.group_rows(expected, version))
    assert {c: tuple(r[k] for k in columns) for c, r in now.items()} == {
        c: tuple(r[k] for k in columns) for c, r in want.items()}
    for row in now.values():  # evidence names a clip of the same group (ties may pick another)
        evidence = json.loads(row["pdq_evidence"])
        assert (evidence is None) == (row["pdq_group_size"] == 1)
        assert evidence is None or now[evidence[0]]["pdq_group"] == row["pdq_group"]

    with state.database.engine.begin() as db:  # a state from before links were kept
        db.exec_driver_sql("DELETE FROM dd_meta WHERE name = 'links'")
    del fingerprints["web/d0"]
    done = dedup.update(state, "v", fingerprints, parts.__getitem__, params, changed=["web/d0"])
    assert done.done["rebuilt"] and done.changed_shards is None
    assert by_clip(dedup.group_rows(state, version)) == by_clip(dedup.group_rows(fresh("old"), version))


def test_clusters_count_clips_per_cluster_from_their_state_not_the_table(tmp_path: Path) -> None:
    """``clips_per_cluster`` after each run equals the counts of every drop's assigned rows (the rows
    a run wrote for its changed drops and the rows that stood), read from the state, not the table."""
    import pandas as pd

    from vidassets.config import ClusterSettings
    from vidassets.curate import clusters
    from vidassets.storage import LocalObjectStore

    rng = np.random.default_rng(3)
    objects = LocalObjectStore(tmp_path / "store")

    def drop(name: str, n: int) -> pd.DataFrame:
        vectors = rng.normal(size=(n, 8)).astype(np.float32)
        return pd.DataFrame({"clip_id": [f"{name}-c{i}" for i in range(n)], "asset_id": "a", "source_shard": name,
                             "status": "ok", "dim": 8, "vector": [v.tobytes() for v in vectors],
                             "producer_version": "e"})

    drops = {f"web/d{i}": drop(f"web/d{i}", 6 + i) for i in range(4)}
    table: dict[str, dict] = {}
    settings, version = ClusterSettings(k=3), RowVersion("clusters-test", "in")
    for n, fingerprint in ((2, "1"), (3, "1"), (4, "1"), (4, "2")):  # the last run: every drop changed
        done = clusters.update(objects, {p: fingerprint for p in list(drops)[:n]}, drops.__getitem__, "c1",
                               f"full-{fingerprint}", version, settings)
        table = {c: r for c, r in table.items() if r["source_shard"] not in done.changed}
        table.update({r["clip_id"]: r for r in done.rows})
        done.remember()
        counts = pd.Series([r["cluster"] for r in table.values()]).value_counts()
        assert done.clips_per_cluster == {int(c): int(k) for c, k in counts.sort_index().items()}
    assert len(table) == sum(len(d) for d in drops.values())


def test_clusters_told_what_changed_read_only_those_drops_and_fall_back_when_the_count_is_off(tmp_path: Path) -> None:
    """Told which drops changed, ``clusters.update`` reads only their state (``drops_read``) and its
    totals stay equal to the table's; a drop added without being named (the stored count does not
    add up) or removed makes it compare every drop, with the same result."""
    import pandas as pd

    from vidassets.config import ClusterSettings
    from vidassets.curate import clusters
    from vidassets.storage import LocalObjectStore

    rng = np.random.default_rng(4)
    objects = LocalObjectStore(tmp_path / "store")
    drops = {f"web/d{i}": pd.DataFrame({
        "clip_id": [f"web/d{i}-c{j}" for j in range(5 + i)], "asset_id": "a", "source_shard": f"web/d{i}",
        "status": "ok", "dim": 8, "vector": [v.tobytes() for v in rng.normal(size=(5 + i, 8)).astype(np.float32)],
        "producer_version": "e"}) for i in range(6)}
    table: dict[str, dict] = {}
    settings, version = ClusterSettings(k=3), RowVersion("clusters-test", "in")

    def run(present: list[int], changed: list[int] | None) -> clusters.Update:
        nonlocal table
        done = clusters.update(objects, {f"web/d{i}": "1" for i in present}, drops.__getitem__, "c1", "full",
                               version, settings, changed=None if changed is None else [f"web/d{i}" for i in changed])
        table = {c: r for c, r in table.items() if r["source_shard"] not in done.changed}
        table.update({r["clip_id"]: r for r in done.rows})
        done.remember()
        counts = pd.Series([r["cluster"] for r in table.values()]).value_counts()
        assert done.clips_per_cluster == {int(c): int(k) for c, k in counts.sort_index().items()}
        return done

    assert run([0, 1, 2], None).drops_read == 0  # the first run: nothing stored
    told = run([0, 1, 2, 3], [3])
    assert (told.changed, told.drops_read) == ({"web/d3"}, 0)  # the new drop alone, no stored drop read
    unnamed = run([0, 1, 2, 3, 4, 5], [5])  # d4 added without being named: every drop compared
    assert unnamed.changed == {"web/d4", "web/d5"} and unnamed.drops_read == 4
    removed = run([0, 1, 3, 4, 5], [2])  # d2 removed and named: its rows and counts go, one drop read
    assert (removed.changed, removed.drops_read) == ({"web/d2"}, 1)
    assert not any(r["source_shard"] == "web/d2" for r in table.values())
    assert len(table) == sum(len(drops[f"web/d{i}"]) for i in (0, 1, 3, 4, 5))


def test_work_a_global_stage_needs_whole_runs_here_or_on_an_engine_and_fails_on_a_lost_task() -> None:
    """``all_or_fail``: the same results here and on an engine, in item order; an item the engine
    could not finish fails the call, naming the work and the item (a global stage saves nothing)."""
    from vidassets.runtime.engine import LocalEngine, all_or_fail

    def double(i: int) -> dict:
        if i == 3:
            raise ValueError("worker lost")
        return {"v": 2 * i}

    assert all_or_fail(double, [1, 2], None, "x") == all_or_fail(double, [1, 2], LocalEngine(), "x") == [{"v": 2}, {"v": 4}]
    with pytest.raises(RuntimeError, match=r"the band join \(item 3\): ValueError: worker lost"):
        all_or_fail(double, [1, 3], LocalEngine(), "the band join", label=lambda i: f"item {i}")
