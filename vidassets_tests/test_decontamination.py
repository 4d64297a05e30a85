"""Eval material is matched against train clips: a re-encode of an eval video in the train side is
recorded, excluded by selection, and the blocking check fails if such a clip is ever selected."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from vidassets.config import load_settings
from vidassets.graph import build_definitions
from vidassets.ingest.eval_split import is_eval
from vidassets.models.registry import ModelRegistry
from vidassets.runner import local_instance, materialize_bucket
from vidassets.storage import TableStore, open_object_store
from vidassets_tests.conftest import SMALL_LATENTS


def _salt_routing_only(eval_file: Path, train_files: list[Path], fraction: float) -> str:
    """A salt that sends exactly ``eval_file`` to eval (routing is a pure function of the bytes)."""
    eval_id = hashlib.sha256(eval_file.read_bytes()).hexdigest()
    train_ids = [hashlib.sha256(p.read_bytes()).hexdigest() for p in train_files]
    for i in range(10_000):
        salt = f"test-salt-{i}"
        if is_eval(eval_id, salt, fraction) and not any(is_eval(t, salt, fraction) for t in train_ids):
            return salt
    raise AssertionError("no salt found")


def test_reencode_of_eval_video_is_excluded_and_checked(demo_bucket: Path, tmp_path: Path) -> None:
    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    shutil.copy(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", drop / "carphone.mp4")
    shutil.copy(demo_bucket / "raw/licensed/drop-0002/carphone_vp9.webm", drop / "carphone_vp9.webm")
    shutil.copy(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", drop / "bikes.mp4")
    salt = _salt_routing_only(drop / "carphone.mp4", [drop / "carphone_vp9.webm", drop / "bikes.mp4"], 0.5)
    settings = load_settings(env={}, overrides={
        "bucket.uri": str(tmp_path / "bucket"), "store.uri": str(tmp_path / "store"),
        "store.eval_vault_uri": str(tmp_path / "vault"), "eval.fraction": 0.5, "eval.salt": salt, **SMALL_LATENTS})
    summary = materialize_bucket(settings, local_instance(str(tmp_path / "home")), log=lambda _: None)
    assert summary.ok, summary.render()
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    vault = TableStore(open_object_store(str(tmp_path / "vault")))
    assert vault.read_all("eval_assets").uri.str.endswith("carphone.mp4").all()
    assert len(vault.read_all("eval_context_frames")) > 0 and not (tmp_path / "store/tables/eval_context_frames").exists()
    clips = tables.read_all("clips")
    matches = tables.read("decontamination").merge(clips[["clip_id", "uri"]], on="clip_id")
    vp9 = matches[matches.uri.str.endswith("carphone_vp9.webm")]
    bikes = matches[matches.uri.str.endswith("bikes.mp4")]
    assert len(vp9) == 1 and bool(vp9.contaminated.iloc[0]) and "perceptual" in vp9.method.iloc[0]
    assert not bikes.contaminated.any()
    selection = tables.read("selection").set_index("clip_id")
    assert selection.loc[vp9.clip_id.iloc[0], "first_failed_rule"] == "decontamination"
    # tamper with the selection table: the blocking check must now fail
    tampered = tables.read("selection")
    tampered.loc[tampered.clip_id == vp9.clip_id.iloc[0], ["decision", "first_failed_rule"]] = ["pass", None]
    tables.write("selection", None, tampered)
    defs = build_definitions(settings)
    check = next(c for c in defs.asset_checks if "selection_is_decontaminated" in str(c.check_keys))
    result = check(store=defs.resources["store"])
    assert result.passed is False and result.metadata["selected_matching_eval"].value == 1


def _random_drops(seed: int, drops: int):
    """Synthetic train and eval drops: random PDQ hashes and embeddings, some eval frames and vectors
    near copies (a few bits / a little noise) of train clips' material."""
    import numpy as np
    import pandas as pd

    from vidassets.curate.decontamination import EvalPart, TrainPart

    rng = np.random.default_rng(seed)
    train, evals, pool = {}, {}, []
    for d in range(drops):
        part = f"web/drop-{d:03d}"
        clips, frames, embeddings = [], [], []
        for c in range(int(rng.integers(1, 5))):
            asset, clip = f"a{d}-{c}", f"{part}:c{c}"
            clips.append({"clip_id": clip, "asset_id": asset, "source_shard": part, "first_frame": 0, "last_frame": 9})
            hashes = [rng.integers(0, 256, 32, dtype=np.uint8) for _ in range(4)]
            frames += [{"asset_id": asset, "frame_index": 3 * i, "pdq_hash": h.tobytes().hex()} for i, h in enumerate(hashes)]
            vector = rng.normal(size=16).astype(np.float32)
            vector /= np.linalg.norm(vector)
            embeddings.append({"clip_id": clip, "status": "ok", "vector": vector.tobytes()})
            pool.append((hashes, vector))
        train[part] = TrainPart(pd.DataFrame(clips), pd.DataFrame(frames), pd.DataFrame(embeddings))
        eval_frames, eval_embeddings = [], []
        for e in range(int(rng.integers(0, 3))):
            asset = f"eval{d}-{e}"
            hashes, vector = pool[int(rng.integers(len(pool)))]
            for h in hashes[: int(rng.integers(1, 5))]:
                noisy = h.copy()
                noisy[int(rng.integers(32))] ^= 1 << int(rng.integers(8))
                eval_frames.append({"asset_id": asset, "pdq_hash": noisy.tobytes().hex()})
            near = vector + rng.normal(scale=float(rng.choice([0.01, 1.0])), size=16).astype(np.float32)
            eval_embeddings.append({"asset_id": asset, "status": "ok", "vector": (near / np.linalg.norm(near)).astype(np.float32).tobytes()})
        evals[f"eval/{part}"] = EvalPart(pd.DataFrame(eval_frames, columns=["asset_id", "pdq_hash"]),
                                         pd.DataFrame(eval_embeddings, columns=["asset_id", "status", "vector"]))
    return train, evals


def test_incremental_decontamination_equals_matching_from_scratch(tmp_path: Path, monkeypatch) -> None:
    """Drops arrive one at a time (train and eval side), one is rebuilt, one removed: after each, the
    stored state's rows equal a run from scratch over the same drops, and a new drop matches only
    its own clips plus the covered clips against the new eval material (told which drops changed;
    one change not named caught by the count). The state is saved and loaded between runs: a save
    without new eval material or removed drops writes one chunk of the new clips (plus the merges of
    MERGE_FANOUT chunks of a level) and the new drop's bucket of the drop map, and the chunks kept
    stay few (logarithmic in the runs); a lazy load reads the summary, the eval object and the
    buckets of the drops it looks up, never a chunk."""
    import math

    from vidassets.config import DecontaminationSettings
    from vidassets.curate import decontamination
    from vidassets.curate.decontamination import DecontaminationState, update
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.npz import ChunkSeries
    from vidassets.storage.rows import RowVersion

    monkeypatch.setattr(decontamination, "MERGE_FANOUT", 2)
    objects = LocalObjectStore(tmp_path / "store")
    written: list[str] = []
    read: list[str] = []
    real_put, real_get = objects.put_bytes, objects.get_bytes
    monkeypatch.setattr(objects, "put_bytes", lambda key, data: (written.append(key), real_put(key, data))[1])
    monkeypatch.setattr(objects, "get_bytes", lambda key: (read.append(key), real_get(key))[1])

    params, version = DecontaminationSettings(), RowVersion("d", "i")
    train, evals = _random_drops(3, 12)
    state, contaminated, table, rewritten, loaded_lazily, small_saves = DecontaminationState(), 0, [], [], [], []
    order = list(train)
    for n in range(1, len(order) + 1):
        now_train = {p: f"fp-{p}" for p in order[:n]}
        now_eval = {f"eval/{p}": f"fp-{p}" for p in order[:n]}
        if n >= 8:  # from then on: drop 2 rebuilt (new fingerprint, same content), drop 4 removed
            now_train[order[2]] = "rebuilt"
            del now_train[order[4]]
        if n >= 10:  # and eval drop 1 rebuilt (every clip is matched again)
            now_eval[f"eval/{order[1]}"] = "rebuilt"
        lazy = n % 2 == 0  # every other run loads lazily (the stage's way): the same rows, counts and state
        # told which train drops changed, as the stage is; at 8 the removed drop is not named (the
        # covered count catches it: every drop is compared then)
        told = {order[n - 1]} | ({order[2]} if n == 8 else set())
        # the eval drops likewise; at 5 the new eval drop is not named (caught by the eval count)
        eval_told = (set() if n == 5 else {f"eval/{order[n - 1]}"}) | ({f"eval/{order[1]}"} if n == 10 else set())
        read.clear()
        state, done = update(DecontaminationState.load(objects, "v", lazy=lazy), "v", now_train, now_eval,
                             train.__getitem__, evals.__getitem__, params, changed=told if n > 1 else None,
                             eval_changed=eval_told if n > 1 else None)
        scratch, _ = update(DecontaminationState(), "v", now_train, now_eval, train.__getitem__, evals.__getitem__,
                            params)
        assert state.contaminated(params) == scratch.contaminated(params), n
        if lazy and state.base:
            loaded_lazily.append(n)  # nothing stored was read: the new drop matched the eval side alone
            assert not [k for k in read if "/chunks/" in k], (n, read)
        assert state.rows(params, version, set(state.changed_shards or ())) == \
            scratch.rows(params, version, set(state.changed_shards or ())), n
        new_eval = evals[f"eval/{order[n - 1]}"]
        quiet = n not in (1, 8, 10) and not len(new_eval.frames) and not len(new_eval.embeddings)
        written.clear()
        state.save(objects, params)
        if quiet:  # one chunk, its merges (a level-k merge writes one chunk each), the drop's bucket, the index
            chunks = [k for k in written if "/chunks/" in k]
            assert not [k for k in written if "/eval/" in k], written
            assert len([k for k in written if "/drops/b" in k]) == 1, written
            assert len(chunks) <= 1 + math.ceil(math.log2(n)), written
            small_saves.append(n)
        # the table kept by writing only the drops the update reports as changed is the whole table
        changed = state.changed_shards if state.changed_shards is not None else {r["source_shard"] for r in table} | set(now_train)
        table = sorted([r for r in table if r["source_shard"] not in changed] + state.rows(params, version, changed),
                       key=lambda r: r["clip_id"])
        assert table == state.rows(params, version) == scratch.rows(params, version), n
        if quiet:
            assert changed == {order[n - 1]}, (n, changed)  # only the new drop's rows are written
            rewritten.append(n)
        reloaded = DecontaminationState.load(objects, "v")
        assert reloaded.rows(params, version) == state.rows(params, version)
        assert dict(reloaded.train.items()) == dict(scratch.train.items()) == now_train
        assert DecontaminationState.load(objects, "v", lazy=True).contaminated(params) == scratch.contaminated(params)
        assert len(ChunkSeries(objects, decontamination.STATE_PREFIX).listed()) <= 1 + math.ceil(math.log2(n)), n
        if n not in (1, 8, 10):
            assert done["new_clips"] == len(train[order[n - 1]].clips)
        assert done["new_eval_drops"] == (n if n in (1, 10) else 1), n
        contaminated = sum(r["contaminated"] for r in state.rows(params, version))
    assert contaminated > 0  # the synthetic near copies are found
    assert rewritten and small_saves  # the scenario has steps without new eval material
    assert loaded_lazily  # and some of them read no stored clip


def test_a_removed_or_rebuilt_train_drop_rewrites_only_the_chunks_holding_its_clips(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A covered train drop taken out (removed, or rebuilt: taken out and added again) flags its clips
    in place: the save rewrites the chunks holding them and the drop's bucket of the drop map, reads
    no other chunk, renumbers nothing; rows, counts and the release gate's scan then equal a state
    built without the drop. A state whose drops were covered before clip ranges were kept is written
    whole once, and records them."""
    from vidassets.config import DecontaminationSettings
    from vidassets.curate import decontamination
    from vidassets.curate.decontamination import DecontaminationState, update
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.partition_map import PartitionMap
    from vidassets.storage.rows import RowVersion

    monkeypatch.setattr(decontamination, "MERGE_FANOUT", 100)  # no merges: a chunk per drop, reads are the takedown's
    objects = LocalObjectStore(tmp_path / "store")
    params, version = DecontaminationSettings(), RowVersion("d", "i")
    train, evals = _random_drops(11, 16)
    order = list(train)
    now_eval = {f"eval/{p}": f"fp-{p}" for p in order}
    now = {}
    for n, part in enumerate(order):  # one drop a run: many chunks
        now[part] = f"fp-{part}"
        state, _ = update(DecontaminationState.load(objects, "v", lazy=True), "v", now, now_eval,
                          train.__getitem__, evals.__getitem__, params, changed={part} if n else None,
                          eval_changed=set() if n else None)
        state.save(objects, params)
    written, read = [], []
    real_put, real_get = objects.put_bytes, objects.get_bytes
    monkeypatch.setattr(objects, "put_bytes", lambda key, data: (written.append(key), real_put(key, data))[1])
    monkeypatch.setattr(objects, "get_bytes", lambda key: (read.append(key), real_get(key))[1])

    def chunks_holding(part: str) -> set[str]:
        lo, hi = DecontaminationState.load(objects, "v", lazy=True).train.clip_range(part)
        meta = PartitionMap(objects, decontamination.DROPS_PREFIX).meta
        return {c["key"] for c in meta["chunks"] if c["first"] < hi and lo < c["first"] + c["clips"]}

    for change, part in (("removed", order[3]), ("rebuilt", order[9])):
        holding = chunks_holding(part)
        if change == "removed":
            del now[part]
        else:
            now[part] = "rebuilt"
        written.clear()
        read.clear()
        state, done = update(DecontaminationState.load(objects, "v", lazy=True), "v", now, now_eval, train.__getitem__,
                             evals.__getitem__, params, changed={part}, eval_changed=set())
        state.save(objects, params)
        assert done["rebuilt_train_drops"] == (change == "rebuilt")
        chunks_read = {k for k in read if "/chunks/" in k}
        assert chunks_read == holding, (change, chunks_read, holding)  # no other clip read
        rewritten = [k for k in written if "/chunks/" in k]
        assert len(rewritten) == len(holding) + (change == "rebuilt"), (change, written)  # (+ the new clips' chunk)
        assert len([k for k in written if "/drops/b" in k]) == 1 and not [k for k in written if "/eval" in k]
        assert state.changed_shards == {part}
        scratch, _ = update(DecontaminationState(), "v", now, now_eval, train.__getitem__, evals.__getitem__, params)
        loaded = DecontaminationState.load(objects, "v")
        assert loaded.rows(params, version) == scratch.rows(params, version), change
        assert state.rows(params, version, {part}) == scratch.rows(params, version, {part})
        assert DecontaminationState.load(objects, "v", lazy=True).contaminated(params) == scratch.contaminated(params)
        assert dict(loaded.train.items()) == now
        ids = {r["clip_id"] for r in scratch.rows(params, version)}
        gone = set(train[order[3]].clips.clip_id)
        assert decontamination.scan_coverage(objects, ids | gone, now_eval)["checked"] == len(ids)
    assert loaded.gone and len(loaded.clips) > len(scratch.clips)  # flagged in place, not renumbered

    # drops covered before ranges were kept (the fingerprint alone in the map): the first removal
    # renumbers and writes the state whole, with every drop's range
    drops = PartitionMap(objects, decontamination.DROPS_PREFIX)
    drops.write({p: v["fp"] for p, v in drops.every().items()})
    del now[order[5]]
    state, _ = update(DecontaminationState.load(objects, "v", lazy=True), "v", now, now_eval, train.__getitem__,
                      evals.__getitem__, params, changed={order[5]}, eval_changed=set())
    state.save(objects, params)
    loaded = DecontaminationState.load(objects, "v")
    scratch, _ = update(DecontaminationState(), "v", now, now_eval, train.__getitem__, evals.__getitem__, params)
    assert loaded.rows(params, version) == scratch.rows(params, version) and not loaded.gone
    assert len(PartitionMap(objects, decontamination.DROPS_PREFIX).meta["chunks"]) == 1
    assert all(loaded.train.clip_range(p) for p in now)


def test_a_decontamination_state_in_the_layout_before_is_rebuilt_and_a_stopped_save_leaves_the_last(
        tmp_path: Path, monkeypatch) -> None:
    """A store holding the state of the layout before (one meta object) loads as no state, so the
    next run rebuilds from the tables and its save deletes the old objects; a save stopped before
    its summary is written leaves the state before it, and the next save deletes what it wrote; one
    stopped between its two maps leaves no state, and no coverage for the release gate's scan."""
    import pytest

    from vidassets.config import DecontaminationSettings
    from vidassets.curate import decontamination
    from vidassets.curate.decontamination import DecontaminationState, update
    from vidassets.storage import LocalObjectStore
    from vidassets.storage.partition_map import PartitionMap
    from vidassets.storage.rows import RowVersion

    objects = LocalObjectStore(tmp_path / "store")
    for key in decontamination.OLD_KEYS:
        objects.put_bytes(key, b"layout 2")
    params, version = DecontaminationSettings(), RowVersion("d", "i")
    train, evals = _random_drops(5, 4)
    order = list(train)
    assert DecontaminationState.load(objects, "v").size == 0
    now = {p: f"fp-{p}" for p in order[:3]}
    state, _ = update(DecontaminationState.load(objects, "v", lazy=True), "v", now, {}, train.__getitem__,
                      evals.__getitem__, params)
    state.save(objects, params)
    assert not any(objects.exists(k) for k in decontamination.OLD_KEYS)
    before = DecontaminationState.load(objects, "v").rows(params, version)
    more = {**now, order[3]: f"fp-{order[3]}"}
    state, _ = update(DecontaminationState.load(objects, "v", lazy=True), "v", more, {}, train.__getitem__,
                      evals.__getitem__, params, changed={order[3]})
    monkeypatch.setattr(PartitionMap, "write", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stopped")))
    with pytest.raises(RuntimeError):
        state.save(objects, params)
    monkeypatch.undo()
    assert DecontaminationState.load(objects, "v").rows(params, version) == before
    state, _ = update(DecontaminationState.load(objects, "v", lazy=True), "v", more, {}, train.__getitem__,
                      evals.__getitem__, params, changed={order[3]})
    state.save(objects, params)
    scratch, _ = update(DecontaminationState(), "v", more, {}, train.__getitem__, evals.__getitem__, params)
    assert DecontaminationState.load(objects, "v").rows(params, version) == scratch.rows(params, version)
    listed = {i.key for i in objects.list(decontamination.STATE_PREFIX + "/chunks")}
    meta = PartitionMap(objects, decontamination.DROPS_PREFIX).meta
    assert listed == {c["key"] for c in meta["chunks"]}  # the stopped save's chunk is gone

    # a save stopped between its two maps (the eval drops written, not the train drops and summary):
    # the state loads as none (rebuilt by the next run) and the release gate's scan counts no clip
    # as checked against material the summary never recorded
    clip_ids = {r["clip_id"] for r in scratch.rows(params, version)}
    first_eval = {p: f"fp-{p}" for p in list(evals)[:1]}
    assert decontamination.scan_coverage(objects, clip_ids, {})["checked"] == len(clip_ids)
    state, _ = update(DecontaminationState.load(objects, "v", lazy=True), "v", more, first_eval, train.__getitem__,
                      evals.__getitem__, params, changed=set(), eval_changed=set(first_eval))
    real_write = PartitionMap.write

    def train_map_fails(self, *args, **kwargs):
        if self.prefix == decontamination.DROPS_PREFIX:
            raise RuntimeError("stopped")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(PartitionMap, "write", train_map_fails)
    with pytest.raises(RuntimeError):
        state.save(objects, params)
    monkeypatch.undo()
    assert DecontaminationState.load(objects, "v").size == 0
    assert decontamination.scan_coverage(objects, clip_ids, first_eval)["checked"] == 0


def test_an_excerpt_of_a_long_eval_video_is_caught_per_segment(demo_bucket: Path, tmp_path: Path) -> None:
    """The eval side is a long compilation (real footage, hard cuts); the train side holds a
    mirrored copy of one of its parts (PDQ does not see through a mirror: only the embedding can).
    Compared with the whole compilation's mean embedding the excerpt stays below min_cosine; per eval
    segment (its shots) it matches, and selection excludes it. A clip of footage that is not in the
    eval video matches nothing."""
    import cv2
    import numpy as np

    from vidassets.curate.embeddings import embedder
    from vidassets.demo.bucket import decode_rgb, encode
    from vidassets.storage.blobs import load_images, vector_of

    raw = demo_bucket / "raw/licensed/drop-0001"
    size = (320, 240)

    def frames(name: str) -> list:
        return [cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in decode_rgb(raw / name)]

    drop = tmp_path / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    carphone = frames("carphone.mp4")
    bikes = frames("bikes.mp4")
    encode(bikes[:125] + carphone + bikes[125:], drop / "compilation.mp4", "libx264", 25, options={"crf": "18"})
    encode([np.ascontiguousarray(f[:, ::-1]) for f in carphone], drop / "carphone_mirrored.mp4", "libx264", 25,
           options={"crf": "23"})
    encode(frames("bigbuckbunny.mp4"), drop / "other.mp4", "libx264", 25, options={"crf": "23"})
    salt = _salt_routing_only(drop / "compilation.mp4", [drop / "carphone_mirrored.mp4", drop / "other.mp4"], 0.5)
    settings = load_settings(env={}, overrides={
        "bucket.uri": str(tmp_path / "bucket"), "store.uri": str(tmp_path / "store"),
        "store.eval_vault_uri": str(tmp_path / "vault"), "eval.fraction": 0.5, "eval.salt": salt, **SMALL_LATENTS})
    summary = materialize_bucket(settings, local_instance(str(tmp_path / "home")), log=lambda _: None,
                                 select=["raw_inventory", "eval_split", "eval_features", "video_probe", "video_analysis", "clips",
                                         "clip_embeddings", "decontamination"])
    assert summary.ok, summary.render()
    tables = TableStore(open_object_store(str(tmp_path / "store")))
    vault = TableStore(open_object_store(str(tmp_path / "vault")))
    segments = vault.read_all("eval_embeddings")
    assert len(segments) >= 3 and segments.asset_id.nunique() == 1  # one row per segment of the compilation
    clips = tables.read_all("clips")
    matches = tables.read("decontamination").merge(clips[["clip_id", "uri"]], on="clip_id")
    mirrored = matches[matches.uri.str.endswith("carphone_mirrored.mp4")]
    assert len(mirrored) == 1 and bool(mirrored.contaminated.iloc[0]) and mirrored.method.iloc[0] == "semantic"
    assert mirrored.semantic_eval_asset.iloc[0] == segments.asset_id.iloc[0]
    assert not matches[matches.uri.str.endswith("other.mp4")].contaminated.any()
    # the whole-video mean (the old comparison) misses it
    model = embedder(ModelRegistry("cpu"))
    whole = model(load_images(vault.objects, vault.read_all("eval_context_frames").blob_key))
    vector = vector_of(tables.read_all("clip_embeddings").set_index("clip_id").loc[mirrored.clip_id.iloc[0], "vector"])
    assert float(vector @ whole) < settings.decontamination.min_cosine <= mirrored.cosine.iloc[0]


def test_the_eval_leak_check_applies_only_the_changed_drops_and_equals_a_whole_read(tmp_path: Path) -> None:
    """``selection_is_decontaminated``'s state (``EvalLeaks``), updated after random writes of the two
    tables (drops rewritten in their buckets, whole rewrites, a clip
    newly contaminated in a drop selection did not rewrite), equals a count over both tables read
    whole every time; it reads a table whole only when the writes cannot tell or when that newly
    contaminated clip's decision is needed."""
    import random

    from vidassets.curate.eval_leaks import EvalLeaks

    rng = random.Random(7)
    objects = open_object_store(str(tmp_path / "store"))
    tables = TableStore(objects)
    drops = [f"web/d{i}" for i in range(6)]
    selected: dict[str, dict[str, bool]] = {d: {} for d in drops}  # drop -> clip -> passed
    marked: dict[str, dict[str, bool]] = {d: {} for d in drops}  # drop -> clip -> contaminated

    def selection_rows(group: list[str]) -> list[dict]:
        return [{"clip_id": c, "asset_id": "a" * 64, "source_shard": d, "decision": "pass" if ok else "reject",
                 "first_failed_rule": None if ok else "decontamination", "rule_outcomes": "{}", "tier": None,
                 "rank_score": 1.0, "recipe": "r", "recipe_hash": "h", "producer_version": "selection-test"}
                for d in group for c, ok in sorted(selected[d].items())]

    def decontamination_rows(group: list[str]) -> list[dict]:
        return [{"clip_id": c, "asset_id": "a" * 64, "source_shard": d, "contaminated": bad, "method": None,
                 "perceptual_share": 0.0, "perceptual_eval_asset": None, "cosine": 0.0, "semantic_eval_asset": None,
                 "producer_version": "decontamination-test"} for d in group for c, bad in sorted(marked[d].items())]

    def expected() -> tuple[int, list[str]]:
        return (sum(ok for d in drops for ok in selected[d].values()),
                sorted(c for d in drops for c, ok in selected[d].items() if ok and marked[d].get(c)))

    whole_reads = 0
    for step in range(60):
        group = rng.sample(drops, rng.randint(1, 2))
        before = {d: {c for c, bad in marked[d].items() if bad} for d in group}
        for d in group:  # a drop's clips change; decontamination marks some, selection rejects those (mostly)
            clips = [f"{d}:c{i}" for i in range(rng.randint(0, 4))]
            marked[d] = {c: rng.random() < 0.3 for c in clips}
            selected[d] = {c: not marked[d][c] or rng.random() < 0.1 for c in clips}  # 10%: a leak
        both = step == 0 or rng.random() < 0.8  # else: decontamination alone rewrote the drops (selection was not run)
        whole = step in (0, 25)
        tables.write_groups("decontamination", decontamination_rows(drops if whole else group), None if whole else group)
        if both:
            tables.write_groups("selection", selection_rows(drops if whole else group), None if whole else group)
        else:  # what the selection table still says for those drops
            stored = tables.read_or_empty("selection")
            for d in group:
                rows = stored[stored.source_shard == d]
                selected[d] = dict(zip(rows.clip_id, rows.decision == "pass", strict=True))
        leaks = EvalLeaks.load(objects).update(tables)
        leaks.save()
        assert (leaks.selected, leaks.leaks()) == expected(), step
        gained_unread = not both and any({c for c, bad in marked[d].items() if bad} - before[d] for d in group)
        if not whole:  # the first run and a whole rewrite read whole; else only what the case needs
            assert leaks.read_whole == (["selection"] if gained_unread else []), (step, leaks.read_whole)
        whole_reads += bool(leaks.read_whole)
    assert whole_reads < 30, whole_reads  # most updates read only the changed drops
