"""Snapshots on real footage: a frozen manifest of the selected clips with latents, takedowns that
exclude every derived sample of an asset with no recomputation, snapshot diffs with reasons, and
the lineage of one sample from source object to the snapshots that hold (or dropped) it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vidassets.curate.selection import load_recipe
from vidassets.storage import TableStore, open_object_store
from vidassets.train.lineage import sample_lineage
from vidassets.train.snapshot import clear_tombstones, diff_snapshots, read_snapshot, snapshot_meta, snapshot_versions
from vidassets.versions import Versions
from vidassets_tests.conftest import graph_settings, run_graph, small_bucket

CLI = str(Path(sys.executable).parent / "vidassets")


@pytest.fixture(scope="module")
def trained(demo_bucket: Path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("train")
    small_bucket(demo_bucket, tmp)
    recipe = load_recipe().model_dump()  # every clip passes: a snapshot with more than one source asset
    recipe.update(score_rules=[], perceptual_dedup={"enabled": False}, semantic_dedup={"enabled": False})
    (tmp / "all.yaml").write_text(json.dumps(recipe))
    run_graph(_settings(tmp), tmp)
    return tmp


def _settings(trained: Path, **extra):
    return graph_settings(trained / "bucket", trained, **{"selection.recipe": str(trained / "all.yaml"), **extra})


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def test_snapshot_takedown_diff_and_lineage(trained: Path) -> None:
    tables = TableStore(open_object_store(str(trained / "store")))
    objects = tables.objects
    settings = _settings(trained)
    first = run_graph(settings, trained, select=["dataset_snapshot"])
    assert first.stages["dataset_snapshot"].runs == 1 and snapshot_versions(objects) == [1]
    v1 = read_snapshot(objects, 1)
    chosen = set(tables.read("selection").query("decision == 'pass'").clip_id)
    with_latents = set(tables.read_all("latents").query("status == 'ok'").clip_id)
    assert set(v1.clip_id) == chosen & with_latents and len(v1) >= 2
    assert v1.source_uri.str.startswith("file://").all() and v1.license.notna().all()
    assert (v1.stream == "licensed").all() and v1.bucket.notna().all() and v1.latent_version.notna().all()
    assert all(json.loads(s) for s in v1.score_versions) and v1.captions.notna().all()
    meta = snapshot_meta(objects, 1)
    assert meta["samples"] == len(v1) and meta["versions"]["latents"] == Versions(settings).full("latents")
    assert objects.exists("snapshots/v1/recipe.yaml")

    # take down one source asset: the next snapshot drops all of its clips, recomputing nothing
    assert v1.asset_id.nunique() >= 2
    victim = v1.asset_id.value_counts().sort_index().idxmin()
    victim_clips = set(v1.loc[v1.asset_id == victim, "clip_id"])
    proc = _cli("takedown", "--store", str(trained / "store"), "--asset-id", victim, "--reason", "rights holder request")
    assert proc.returncode == 0, proc.stderr
    second = run_graph(settings, trained, select=["dataset_snapshot"])
    assert second.stages["dataset_snapshot"].extra.get("model_calls", 0) == 0
    assert second.stages["dataset_snapshot"].extra.get("frames_decoded", 0) == 0
    v2 = read_snapshot(objects, 2)
    assert not set(v2.clip_id) & victim_clips and set(v2.clip_id) == set(v1.clip_id) - victim_clips
    # v1 is untouched, and the snapshots share their latents (no copies)
    assert read_snapshot(objects, 1).equals(v1)
    shared = v1[v1.clip_id.isin(v2.clip_id)].set_index("clip_id").latent_key
    assert (shared == v2.set_index("clip_id").latent_key.loc[shared.index]).all()

    diff = diff_snapshots(objects, 1, 2)
    removed = diff[diff.change == "removed"]
    assert set(removed.clip_id) == victim_clips and (removed.reason == "takedown").all()
    assert "rights holder request" in removed.detail.iloc[0]
    proc = _cli("snapshot", "diff", "1", "2", "--store", str(trained / "store"))
    assert proc.returncode == 0 and "takedown" in proc.stdout, proc.stderr

    clip = sorted(victim_clips)[0]
    lineage = sample_lineage(tables, clip)
    assert lineage["sources"][0]["uri"].endswith(".mp4") and lineage["sources"][0]["license"]
    assert {s["score"] for s in lineage["scores"]} >= {"optical", "motion", "quality"}
    assert all(s["producer_version"] for s in lineage["scores"])
    assert {a["kind"] for a in lineage["annotations"]} == {"camera", "captions", "tags"}
    assert lineage["latents"][0]["latent_key"].startswith("blobs/latents/")
    assert lineage["latents"][0]["frames_from"].startswith("ladder:")
    assert lineage["snapshots"] == [{"snapshot": 1, "included": True},
                                    {"snapshot": 2, "included": False, "reason": "takedown",
                                     "detail": lineage["snapshots"][1]["detail"]}]
    # shards and the plan of the new snapshot never serve a taken-down clip
    plan_settings = _settings(trained, **{"train.global_batch": 2, "train.world_size": 1})
    run_graph(plan_settings, trained, select=["training_shards", "train_plan"])
    from vidassets.train.build import build_plan, read_index

    assert not set(read_index(objects, 2).clip_id) & victim_clips
    plan = build_plan(objects, 2, plan_settings.train)
    assert not {c for step in range(40) for c in plan.step(step).clip_ids} & victim_clips
    proc = _cli("lineage", "sample", clip, "--store", str(trained / "store"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["clip"]["clip_id"] == clip
    kept = sorted(set(v1.clip_id) - victim_clips)[0]
    shard_info = [s for s in sample_lineage(tables, kept)["snapshots"] if s["snapshot"] == 2][0]["shard"]
    assert shard_info["shard"].endswith(".tar") and shard_info["latents_offset"] > 0
    assert _cli("lineage", "sample", "nope", "--store", str(trained / "store")).returncode == 2


def test_shards_plan_loader_and_step_lineage(trained: Path) -> None:
    import tarfile

    import pandas as pd
    import torch
    import webdataset as wds
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    from vidassets.train.build import build_plan, read_index
    from vidassets.train.energon_reader import VidassetsTaskEncoder
    from vidassets.train.loader import PlanDataset, collate_first
    from vidassets.train.plan import plan_bytes
    from vidassets.train.shards import read_member, restore_latents

    store = trained / "store"
    objects = open_object_store(str(store))
    clear_tombstones(objects)  # start from no takedowns (the test above may have added one)
    train = {"train.shard_mb": 0.02, "train.global_batch": 4, "train.world_size": 2, "train.total_steps": 50}
    settings = _settings(trained, **train)
    summary = run_graph(settings, trained, select=["dataset_snapshot", "training_shards", "train_plan"])
    assert summary.stages["training_shards"].extra.get("model_calls", 0) == 0
    version = snapshot_versions(objects)[-1]
    tables = TableStore(objects)
    samples = read_snapshot(objects, version)
    index = read_index(objects, version)
    root = store / f"shards/v{version}"
    assert set(index.clip_id) == set(samples.clip_id)
    for bucket, group in index.groupby("bucket"):  # one directory per shape bucket, energon-indexed
        assert set(samples.loc[samples.clip_id.isin(group.clip_id), "bucket"]) == {bucket}
        assert (root / bucket / ".nv-meta" / "dataset.yaml").exists()
    # plain webdataset reads every sample back unchanged
    tars = sorted(str(p) for p in root.glob("*/shard-*.tar"))
    seen = {}
    for sample in wds.WebDataset(tars, shardshuffle=False).decode():
        seen[sample["__key__"]] = sample
    assert set(seen) == set(samples.clip_id)
    one = samples.iloc[0]
    from vidassets.derive.latents import load_latents

    stored, _ = load_latents(objects, one.latent_key)
    got = seen[one.clip_id]
    assert torch.equal(restore_latents(got["latents.npy"], got["json"]["latents_dtype"]), stored)
    assert got["json"]["lineage"]["source_uri"] == one.source_uri and got["json"]["captions"]["level_1"]
    assert got["text.npy"].shape == (384,)
    row = index.set_index("clip_id").loc[one.clip_id]
    assert (read_member(root, row.shard, int(row.latents_offset), int(row.latents_size)) == got["latents.npy"]).all()
    with tarfile.open(root / row.shard) as tar:
        assert any(m.name == f"{one.clip_id}.latents.npy" for m in tar)
    # energon's own loader, including saving and restoring its state
    bucket_dir = str(root / index.bucket.iloc[0])
    worker = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def energon_loader():
        return get_savable_loader(get_train_dataset(bucket_dir, batch_size=1, shuffle_buffer_size=None,
                                                    max_samples_per_sequence=None, worker_config=worker,
                                                    task_encoder=VidassetsTaskEncoder()))

    loader = energon_loader()
    it = iter(loader)
    first = next(it)[0]
    assert first["clip_id"] in seen and first["latents"].dtype == torch.bfloat16
    state = loader.save_state_rank()
    after = next(it)[0]["clip_id"]
    resumed = energon_loader()
    resumed.restore_state_rank(state)
    assert next(iter(resumed))[0]["clip_id"] == after
    # the V-JEPA 2 list, parsed with that trainer's own read call (VideoDataset: space-delimited,
    # no header; column 0 a local file it opens whole, column 1 an integer label)
    _check_vjepa_list(root, samples, tables)
    export = trained / "vjepa_export"
    proc = _cli("export", "vjepa", "--snapshot", str(version), "--to", str(export), "--store", str(trained / "store"))
    assert proc.returncode == 0, proc.stderr
    _check_vjepa_list(export, samples, tables)
    assert all(p.startswith(str(export / "clips")) for p in pd.read_csv(export / "vjepa_videos.csv", header=None,
                                                                           delimiter=" ").values[:, 0])

    # the plan: a pure function of its inputs; elastic; exact resume
    plan = build_plan(objects, version, settings.train)
    again = build_plan(objects, version, settings.train)
    assert plan_bytes(plan, range(30), 2) == plan_bytes(again, range(30), 2)
    other = build_plan(objects, version, _settings(trained, **{**train, "train.seed": 1}).train)
    assert plan_bytes(plan, range(30), 2) != plan_bytes(other, range(30), 2)
    for step in range(30):
        sl = plan.step(step)
        assert len(sl.clip_ids) == 4 and sl.phase == "all"  # no phases in the recipe: one, by sample count
        assert sl.streams == list(samples.set_index("clip_id").loc[sl.clip_ids, "stream"])
        assert len(set(samples.set_index("clip_id").loc[sl.clip_ids, "bucket"])) == 1  # one shape per step
        assert sorted(sum((plan.rank_batch(step, r, 2) for r in range(2)), [])) == sorted(sl.clip_ids)
        assert sorted(plan.rank_batch(step, 0, 4) + plan.rank_batch(step, 1, 4) + plan.rank_batch(step, 2, 4)
                      + plan.rank_batch(step, 3, 4)) == sorted(sl.clip_ids)
    uninterrupted = [b["clip_ids"] for b in PlanDataset(plan, root, index, rank=1, world_size=2, steps=8)]
    resumed = [b["clip_ids"] for b in PlanDataset(plan, root, index, rank=1, world_size=2, start_step=5, steps=3)]
    assert resumed == uninterrupted[5:]
    loader = torch.utils.data.DataLoader(PlanDataset(plan, root, index, 0, 2, steps=2), batch_size=1,
                                         collate_fn=collate_first)
    batch = next(iter(loader))
    assert batch["latents"].dtype == torch.bfloat16 and batch["latents"].shape[0] == 2
    assert batch["text_embeddings"].shape == (2, 384)

    # "what data was in steps 3..4": exactly the plan's clips, with their sources
    proc = _cli("lineage", "steps", "--snapshot", str(version), "--steps", "3:5", "--world-size", "2",
                "--global-batch", "4", "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    served = json.loads(proc.stdout)
    assert [r["clip_id"] for r in served if r["step"] == 3] == plan.step(3).clip_ids[0::2] + plan.step(3).clip_ids[1::2]
    assert all(r["source_uri"].startswith("file://") for r in served)


def test_a_clip_that_flips_to_reject_keeps_its_rows_and_leaves_the_next_snapshot_with_the_reason(trained: Path) -> None:
    """A recipe change (one clip per asset) rejects clips that have latents: selection re-decides,
    their derived rows stay (not current), the next snapshot excludes them as ``deselected`` with
    the rule, and the diff says so."""
    tables = TableStore(open_object_store(str(trained / "store")))
    objects = tables.objects
    before = snapshot_versions(objects)[-1] if snapshot_versions(objects) else None
    if before is None:
        run_graph(_settings(trained), trained, select=["dataset_snapshot"])
        before = snapshot_versions(objects)[-1]
    latents_before = tables.read_all("latents")
    recipe = json.loads((trained / "all.yaml").read_text())
    recipe["quotas"] = {"max_clips_per_asset": 1}
    (trained / "one_per_asset.yaml").write_text(json.dumps(recipe))
    settings = _settings(trained, **{"selection.recipe": str(trained / "one_per_asset.yaml")})
    run_graph(settings, trained, select=["selection", "dataset_snapshot"])
    flipped = tables.read("selection").query("first_failed_rule == 'quota:max_clips_per_asset'")
    in_before = set(read_snapshot(objects, before).clip_id)
    assert set(flipped.clip_id) & in_before
    assert tables.read_all("latents").equals(latents_before)  # derived rows kept
    after = snapshot_versions(objects)[-1]
    excluded = read_snapshot(objects, after, "excluded").set_index("clip_id")
    assert set(flipped.clip_id) & in_before <= set(excluded.index)
    assert (excluded.loc[sorted(set(flipped.clip_id) & in_before), "reason"] == "deselected").all()
    diff = diff_snapshots(objects, before, after)
    removed = diff[diff.change == "removed"].set_index("clip_id")
    assert (removed.reason == "deselected").all() and set(removed.index) == set(flipped.clip_id) & in_before
    assert removed.detail.str.contains("quota:max_clips_per_asset").all()


def test_every_table_prints_as_json_and_csv(trained: Path, capsys) -> None:
    """`vidassets table NAME` prints every table of a full run (embedding vectors and other binary
    columns as base64, or left out with --binary omit), as JSON and as CSV."""
    import base64
    import csv
    import io

    from vidassets.cli import main
    from vidassets.storage.schemas import SCHEMAS

    tables = TableStore(open_object_store(str(trained / "store")))
    present = [name for name in sorted(SCHEMAS) if tables.partitions(name)]
    assert {"clip_embeddings", "text_embeddings", "latents", "selection"} <= set(present)
    for name in present:
        rows = len(tables.read_all(name))
        assert main(["table", name, "--store", str(trained / "store"), "--format", "json"]) == 0, name
        printed = json.loads(capsys.readouterr().out)
        assert len(printed) == rows, name
        assert main(["table", name, "--store", str(trained / "store"), "--format", "csv"]) == 0, name
        assert len(list(csv.DictReader(io.StringIO(capsys.readouterr().out)))) == rows, name
    assert main(["table", "clip_embeddings", "--store", str(trained / "store")]) == 0
    first = json.loads(capsys.readouterr().out)[0]
    assert len(base64.b64decode(first["vector"])) % 4 == 0  # the float32 vector, intact
    assert main(["table", "clip_embeddings", "--store", str(trained / "store"), "--binary", "omit"]) == 0
    assert "vector" not in json.loads(capsys.readouterr().out)[0]


def test_a_snapshot_that_fails_the_leak_check_is_never_published(trained: Path) -> None:
    """Decontamination moves on after selection (new eval material matched a selected clip): the
    next snapshot is checked before it is published, fails, is kept as ``failed.json`` for
    inspection, and every reader (shards, plan, lineage) keeps using the last published one."""
    from vidassets.runner import local_instance, materialize_bucket
    from vidassets.train.build import read_index

    tables = TableStore(open_object_store(str(trained / "store")))
    objects = tables.objects
    settings = _settings(trained)
    if not snapshot_versions(objects):
        run_graph(settings, trained, select=["dataset_snapshot"])
    published = snapshot_versions(objects)
    sample = read_snapshot(objects, published[-1]).iloc[0]
    saved = tables.read("decontamination")
    try:
        deco = tables.read("decontamination")
        deco.loc[deco.clip_id == sample.clip_id, ["contaminated", "method"]] = [True, "perceptual"]
        tables.write("decontamination", None, deco)
        summary = materialize_bucket(settings, local_instance(str(trained / "home")), log=lambda _: None,
                                     select=["dataset_snapshot"])
        assert not summary.ok
        assert snapshot_versions(objects) == published
        failed = snapshot_versions(objects, failed=True)
        assert failed and failed[-1] > published[-1]
        report = json.loads(objects.get_bytes(f"snapshots/v{failed[-1]}/failed.json"))
        assert report["leak_check"]["matching_eval_material"] == [sample.clip_id]
        # readers never see it; the next version number is not reused
        run_graph(_settings(trained, **{"train.global_batch": 2, "train.world_size": 1}), trained,
                  select=["training_shards"])
        assert sample.clip_id in set(read_index(objects, published[-1]).clip_id)
        assert [s["snapshot"] for s in sample_lineage(tables, sample.clip_id)["snapshots"]] == published
    finally:
        tables.write("decontamination", None, saved)
    run_graph(settings, trained, select=["dataset_snapshot"])
    assert snapshot_versions(objects)[-1] > failed[-1]


def test_a_sample_without_its_caption_level_is_excluded_or_included_flagged_and_never_drops_batch_text(
        trained: Path) -> None:
    """One selected clip's caption row has an unusable level_1 (the level the recipe trains on):
    by default the snapshot excludes it with reason no_caption; with ``captions.missing: include`` it
    ships flagged (has_caption false, no text), and the loader still returns every other sample's
    text embedding in that batch, with a mask."""
    from vidassets.train.build import build_plan
    from vidassets.train.loader import PlanDataset

    tables = TableStore(open_object_store(str(trained / "store")))
    objects = tables.objects
    settings = _settings(trained)
    if not snapshot_versions(objects):
        run_graph(settings, trained, select=["dataset_snapshot"])
    victim = read_snapshot(objects, snapshot_versions(objects)[-1]).iloc[0]
    part = victim.source_shard
    key = tables.key("annotations", part)
    saved = objects.get_bytes(key)
    try:
        ann = tables.read("annotations", part)
        row = (ann.clip_id == victim.clip_id) & (ann.kind == "captions")
        value = json.loads(ann.loc[row, "value"].iloc[0])
        value["level_1"] = " ".join(["word"] * 400)
        levels = {level: "ok" for level in value}
        levels["level_1"] = "invalid: 400 words, target 20-50 (±50% accepted)"
        ann.loc[row, ["status", "reason", "value", "levels"]] = [
            "partial", "level_1: 400 words", json.dumps(value), json.dumps(levels)]
        tables.write("annotations", part, ann)
        run_graph(settings, trained, select=["dataset_snapshot"])
        v = snapshot_versions(objects)[-1]
        excluded = read_snapshot(objects, v, "excluded").set_index("clip_id")
        assert excluded.loc[victim.clip_id, "reason"] == "no_caption" and "400 words" in excluded.loc[victim.clip_id, "detail"]
        assert victim.clip_id not in set(read_snapshot(objects, v).clip_id)

        recipe = json.loads((trained / "all.yaml").read_text())
        recipe["captions"] = {"missing": "include"}
        (trained / "include.yaml").write_text(json.dumps(recipe))
        included = _settings(trained, **{"selection.recipe": str(trained / "include.yaml"), "train.global_batch": 4,
                                         "train.world_size": 1})
        run_graph(included, trained, select=["dataset_snapshot", "training_shards"])
        v = snapshot_versions(objects)[-1]
        samples = read_snapshot(objects, v).set_index("clip_id")
        assert not samples.loc[victim.clip_id, "has_caption"] and pd_isna(samples.loc[victim.clip_id, "text_sha256"])
        assert json.loads(samples.loc[victim.clip_id, "captions"])["level_1"] is None  # the unusable level is not shipped
        assert samples.drop(victim.clip_id).has_caption.all() and samples.drop(victim.clip_id).text_sha256.notna().all()
        from vidassets.train.build import read_index

        plan = build_plan(objects, v, included.train)
        step = next(s for s in range(200) if victim.clip_id in plan.step(s).clip_ids)
        dataset = PlanDataset(plan, trained / "store" / "shards" / f"v{v}", read_index(objects, v), 0, 1)
        batch = dataset.batch(step)
        assert batch["text_mask"].tolist() == [c != victim.clip_id for c in batch["clip_ids"]]
        if batch["text_mask"].any():  # batches are bucket-homogeneous: the victim may be alone in its bucket
            where = batch["clip_ids"].index(victim.clip_id)
            assert float(batch["text_embeddings"][where].abs().sum()) == 0.0
    finally:
        objects.put_bytes(key, saved)
    # a batch mixing samples with and without text keeps every text it has
    import torch

    from vidassets.train.loader import _stack_with_mask

    texts, mask = _stack_with_mask([torch.ones(2, 3), None, torch.full((2, 3), 2.0)])
    assert mask.tolist() == [True, False, True] and texts.shape == (3, 2, 3)
    assert texts[1].abs().sum() == 0 and texts[2].sum() == 12
    assert _stack_with_mask([None, None])[0] is None


def pd_isna(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def _check_vjepa_list(directory: Path, samples, tables: TableStore) -> None:
    """V-JEPA 2's VideoDataset (facebookresearch/vjepa2, src/datasets/video_dataset.py; not on the
    package index) reads the list with this pandas call and opens each file with decord."""
    import os

    import pandas as pd
    from decord import VideoReader, cpu

    data = pd.read_csv(directory / "vjepa_videos.csv", header=None, delimiter=" ")  # V-JEPA 2's read call
    paths, labels = list(data.values[:, 0]), list(data.values[:, 1])
    legend = json.loads((directory / "vjepa_videos.json").read_text())
    assert data.shape[1] == 2 and set(legend["clip_ids"]) == set(samples.clip_id) and not legend["skipped"]
    streams = {int(k): v for k, v in legend["labels"].items()}
    ladder = tables.read_all("clip_ladder").query("status == 'ok'")
    for path, label, clip in zip(paths, labels, legend["clip_ids"], strict=True):
        assert os.path.exists(path) and isinstance(label, int | np_integer())
        assert streams[int(label)] == samples.set_index("clip_id").loc[clip, "stream"]
        reader = VideoReader(path, num_threads=-1, ctx=cpu(0))  # as VideoDataset.loadvideo_decord opens it
        # the whole file is the clip: its frame count is the rung's
        assert len(reader) == int(ladder[ladder.clip_id == clip].sort_values("short_side").frames.iloc[0])


def np_integer():
    import numpy as np

    return np.integer


def test_exports_read_back_with_the_trainers_own_dataset_classes(trained: Path, monkeypatch) -> None:
    """``vidassets export diffsynth``: DiffSynth-Studio's own UnifiedDataset (its Wan / DiT training
    scripts' reader) loads every sample: the clip's frames from the exported file and its caption as
    the prompt. ``export nemo`` with a pooled text encoder writes no sample and says why (the latent
    cache with token states is read back by NeMo's own class in test_text_tokens)."""
    import pandas as pd

    store = trained / "store"
    objects = open_object_store(str(store))
    clear_tombstones(objects)
    run_graph(_settings(trained), trained, select=["dataset_snapshot"])
    version = snapshot_versions(objects)[-1]
    samples = read_snapshot(objects, version).set_index("clip_id")
    tables = TableStore(objects)
    ladder = tables.read_all("clip_ladder").query("status == 'ok'")

    out = trained / "diffsynth export"  # a space in the path: fine for this reader
    proc = _cli("export", "diffsynth", "--snapshot", str(version), "--to", str(out), "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["samples"] == len(samples) and done["skipped"] == 0
    unified = diffsynth_unified_dataset(monkeypatch)
    dataset = unified(base_path=str(out), metadata_path=str(out / "metadata.csv"), data_file_keys=("video",),
                      main_data_operator=unified.default_video_operator(
                          base_path=str(out), max_pixels=10**8, num_frames=10**6, time_division_factor=1,
                          time_division_remainder=0))
    assert len(dataset) == len(samples)
    for i in range(len(dataset)):
        item = dataset[i]
        sample = samples.loc[item["clip_id"]]
        assert item["prompt"] == json.loads(sample.captions)[sample.caption_level] and item["stream"] == sample.stream
        largest = ladder[ladder.clip_id == item["clip_id"]].sort_values("short_side").iloc[-1]
        assert len(item["video"]) == int(largest.frames)  # every frame of the clip's largest rung
        assert min(item["video"][0].size) == int(largest.short_side)
    smallest = _cli("export", "diffsynth", "--snapshot", str(version), "--to", str(trained / "ds_small"),
                    "--short-side", "1", "--store", str(store))
    assert smallest.returncode == 0, smallest.stderr
    rows = pd.read_csv(trained / "ds_small" / "metadata.csv")
    first = ladder[ladder.clip_id == rows.clip_id.iloc[0]].sort_values("short_side").iloc[0]
    assert Path(rows.video.iloc[0]).name == Path(first.blob_key).name

    proc = _cli("export", "nemo", "--snapshot", str(version), "--to", str(trained / "nemo"), "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["samples"] == 0
    legend = json.loads((trained / "nemo" / "metadata.json").read_text())["vidassets"]
    assert set(legend["skipped_samples"]) == set(samples.index)
    assert all("per-token text states" in why for why in legend["skipped_samples"].values())


def diffsynth_unified_dataset(monkeypatch):
    """DiffSynth-Studio's ``UnifiedDataset``, imported from its installed package without running the
    package's ``__init__`` (which loads every model family: its parent packages stand as bare
    namespaces). Its operators module imports torchvision for two PIL resize calls; torchvision's CPU
    build is not on this machine's package index (the CUDA wheel cannot load its ops against CPU
    torch), so where torchvision does not import those two calls are stood in by PIL's own: the one
    mock here, and it only resizes."""
    import importlib
    import importlib.util
    import types

    from PIL import Image

    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        functional = types.ModuleType("torchvision.transforms.functional")

        def resize(image, size, interpolation=None):
            return image.resize((size[1], size[0]), Image.BILINEAR)

        def center_crop(image, size):
            left, top = (image.width - size[1]) // 2, (image.height - size[0]) // 2
            return image.crop((left, top, left + size[1], top + size[0]))

        functional.resize, functional.center_crop = resize, center_crop
        transforms = types.ModuleType("torchvision.transforms")
        transforms.functional, transforms.InterpolationMode = functional, types.SimpleNamespace(BILINEAR="bilinear")
        vision = types.ModuleType("torchvision")
        vision.transforms = transforms
        for name, module in (("torchvision", vision), ("torchvision.transforms", transforms),
                             ("torchvision.transforms.functional", functional)):
            monkeypatch.setitem(sys.modules, name, module)
    root = Path(importlib.util.find_spec("diffsynth").submodule_search_locations[0])
    for name, path in (("diffsynth", root), ("diffsynth.core", root / "core"), ("diffsynth.core.data", root / "core" / "data")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        monkeypatch.setitem(sys.modules, name, package)
    monkeypatch.delitem(sys.modules, "diffsynth.core.data.operators", raising=False)
    monkeypatch.delitem(sys.modules, "diffsynth.core.data.unified_dataset", raising=False)
    return importlib.import_module("diffsynth.core.data.unified_dataset").UnifiedDataset


def test_a_takedown_hits_an_asset_only_when_all_its_copies_fall_under_it(trained: Path) -> None:
    """carphone.mp4 also arrives, byte for byte, in a crawl drop under another license. Taking down
    that license leaves the asset in (its licensed copy remains, and becomes the sample's source);
    taking down the licensed shard as well removes it, with both reasons."""
    import shutil

    from vidassets.train.snapshot import clear_tombstones

    tables = TableStore(open_object_store(str(trained / "store")))
    objects = tables.objects
    clear_tombstones(objects)
    crawl = trained / "bucket/raw/web/drop-0009"
    crawl.mkdir(parents=True)
    shutil.copy(trained / "bucket/raw/licensed/drop-0001/carphone.mp4", crawl / "carphone_mirror.mp4")
    (crawl / "_provenance.json").write_text(json.dumps({"license": "crawl-unknown", "crawl_url": "https://example.org"}))
    (crawl / "_SUCCESS").write_text("")
    settings = _settings(trained)
    try:
        run_graph(settings, trained, select=["raw_inventory"])
        copies = tables.read_all("raw_inventory").query("status == 'ok'")
        carphone = copies[copies.uri.str.endswith("carphone.mp4")].asset_id.iloc[0]
        assert set(copies[copies.asset_id == carphone].source_shard) == {"licensed/drop-0001", "web/drop-0009"}
        assert _cli("takedown", "--store", str(trained / "store"), "--license", "crawl-unknown",
                    "--reason", "crawl license revoked").returncode == 0
        run_graph(settings, trained, select=["dataset_snapshot"])
        samples = read_snapshot(objects, snapshot_versions(objects)[-1])
        kept = samples[samples.asset_id == carphone]
        assert len(kept) and (kept.license == "CC-BY-3.0").all() and kept.source_uri.str.endswith("carphone.mp4").all()
        assert _cli("takedown", "--store", str(trained / "store"), "--source-shard", "licensed/drop-0001",
                    "--reason", "licensor withdrew the drop").returncode == 0
        run_graph(settings, trained, select=["dataset_snapshot"])
        v = snapshot_versions(objects)[-1]
        assert not len(read_snapshot(objects, v).query("asset_id == @carphone"))
        excluded = read_snapshot(objects, v, "excluded").set_index("clip_id")
        detail = excluded.loc[sorted(set(kept.clip_id)), "detail"].iloc[0]
        assert "crawl license revoked" in detail and "licensor withdrew the drop" in detail
    finally:
        clear_tombstones(objects)
        shutil.rmtree(crawl)
        objects.delete(tables.key("raw_inventory", "web/drop-0009"))


def _write_tombstones(args: tuple[str, str, int]) -> None:
    from vidassets.train.snapshot import add_tombstone

    uri, writer, n = args
    objects = _store(uri, writer.split("|")[1] if "|" in writer else None)
    for i in range(n):
        add_tombstone(objects, "asset_id", f"{writer.split('|')[0]}-{i:03d}", "concurrent test")


def _store(uri: str, endpoint: str | None):
    import functools

    from vidassets.storage.objects import s3_client

    return open_object_store(uri, functools.partial(s3_client, endpoint) if endpoint else None)


def test_two_concurrent_takedown_writers_lose_nothing(tmp_path: Path, s3_endpoint: str, s3_bucket_name: str) -> None:
    """Two processes write 40 tombstones each at the same moment, on a local store and on a real
    S3-compatible server: all 80 are there (one object per tombstone, created if absent)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from vidassets.train.snapshot import read_tombstones

    for uri, endpoint in ((str(tmp_path / "store"), None), (f"s3://{s3_bucket_name}/store", s3_endpoint)):
        suffix = f"|{endpoint}" if endpoint else ""
        # an executor that shuts down by joining its workers (a Pool's exit terminates them, and a
        # worker killed while it holds the task queue's lock can leave its sibling waiting forever)
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(_write_tombstones, [(uri, "a" + suffix, 40), (uri, "b" + suffix, 40)]))
        stones = read_tombstones(_store(uri, endpoint))
        assert len(stones) == 80 and {s.value[0] for s in stones} == {"a", "b"}, uri


def test_the_training_side_runs_without_the_eval_vault_and_cannot_reach_it(trained: Path) -> None:
    """Only the eval-side assets (catalog ``vault``) are given the eval vault resource (and, on
    Kubernetes, its credentials Secret); snapshot, shards and plan run with the vault gone, and the
    training side's resources have no way to open it."""
    import shutil

    from vidassets import catalog
    from vidassets.config import load_settings
    from vidassets.graph import build_definitions
    from vidassets.resources import StoreResource

    defs = build_definitions(_settings(trained))
    given = {key.path[-1] for a in defs.assets for key in a.keys if "eval_vault" in a.required_resource_keys}
    # caption QC is no training step: it grades captioners against the vault's golden set
    assert given == {a.name for a in catalog.ASSETS if a.vault} == {"eval_split", "eval_features", "decontamination",
                                                                     "caption_qc"}
    assert not hasattr(StoreResource, "eval_vault")
    k8s = load_settings(env={"VIDASSETS_DEPLOYMENT": "k8s"})
    for entry in catalog.ASSETS:
        container = k8s.compute.op_tags(entry.name, entry.profile, entry.vault).get("dagster-k8s/config", {}).get(
            "container_config", {})
        assert bool(container.get("env_from")) is entry.vault, entry.name
    vault, away = trained / "vault", trained / "vault-away"
    shutil.move(vault, away)
    try:
        settings = _settings(trained, **{"train.global_batch": 2, "train.world_size": 1})
        run_graph(settings, trained, select=["dataset_snapshot", "training_shards", "train_plan"])
        assert not vault.exists()  # nothing on the training side recreated (or read) it
    finally:
        if vault.exists():
            shutil.rmtree(vault)
        shutil.move(away, vault)


def test_a_curriculum_recipe_reaches_snapshot_plan_and_loader(trained: Path, tmp_path: Path) -> None:
    """Real footage, a recipe with a curriculum: semantic clusters on the clip embeddings (their
    groups name a stream), streams as expressions, two phases that switch at their step with tier
    gates, caption variants whose every level has its text embedding in the shards, the loader
    returning the level and the embedding the plan chose, the monitor over a window (CLI and check)."""
    import numpy as np
    import torch

    from vidassets.curate.clusters import centroids_prefix
    from vidassets.train.build import build_plan, read_index
    from vidassets.train.loader import PlanDataset

    objects = open_object_store(str(trained / "store"))
    clear_tombstones(objects)
    train = {"train.shard_mb": 0.02, "train.global_batch": 4, "train.world_size": 2, "train.total_steps": 30}
    run_graph(_settings(trained, **train), trained, select=["selection"])  # decided by the plain recipe (tests above change it)
    recipe = json.loads((trained / "all.yaml").read_text())
    selected = TableStore(objects).read_all("selection")
    main_tier = sorted(selected.loc[selected.decision == "pass", "tier"])[0]  # the main phase admits one tier
    recipe["curriculum"] = {
        "cluster_groups": {"first": [0]},
        "streams": [{"name": "cluster0", "cluster_groups": ["first"]}, {"name": "short", "max_duration_s": 3.0}],
        "phases": [{"name": "warmup", "until_step": 6, "mixture": {"short": 1, "cluster0": 1, "licensed": 1}},
                   {"name": "main", "tiers": [main_tier], "mixture": {"licensed": 1, "short": 1, "cluster0": 1}}],
        "caption_variants": {"level_0": 1, "level_2": 1},
        "monitor": {"window_steps": 12, "max_repeats_in_window": 100, "max_autocorrelation": 1.0,
                    "share_tolerance": 1.0}}
    path = tmp_path / "curriculum.yaml"
    path.write_text(json.dumps(recipe))
    settings = _settings(trained, **{"selection.recipe": str(path), "clusters.k": 2, **train})
    summary = run_graph(settings, trained, select=["clip_clusters", "selection", "text_embeddings", "dataset_snapshot",
                                                   "training_shards", "train_plan"])
    assert summary.stages["selection"].extra["rows_computed"] == 0  # the curriculum is not selection policy
    tables = TableStore(objects)
    clusters = tables.read("clip_clusters")
    version = Versions(settings).own("clip_clusters")
    assert set(clusters.cluster) == {0, 1} and (clusters.producer_version == version).all()
    assert objects.exists(f"{centroids_prefix(version)}/centroids.npy")
    # the caption variants' levels are embedded beside the recipe's level
    text = tables.read_all("text_embeddings")
    assert {"level_0", "level_1", "level_2"} <= set(text.caption_level)
    snap = snapshot_versions(objects)[-1]
    samples = read_snapshot(objects, snap)
    cluster_of = dict(zip(clusters.clip_id, clusters.cluster, strict=True))
    for r in samples.itertuples():
        assert r.cluster == cluster_of[r.clip_id]
        want = "cluster0" if r.cluster == 0 else "short" if r.duration_s <= 3.0 else "licensed"
        assert r.stream == want, r
    meta = snapshot_meta(objects, snap)
    assert sum(c["size"] for c in meta["clusters"]["per_cluster"]) == len(samples)
    assert set(meta["clusters"]["coverage"]["groups"]) == {"first", "other"}
    plan = build_plan(objects, snap, settings.train)
    admitted = set(samples.loc[samples.tier == main_tier, "clip_id"])
    assert [plan.step(s).phase for s in (5, 6)] == ["warmup", "main"]
    assert all(set(plan.step(s).clip_ids) <= admitted for s in range(6, 30))  # the main phase serves its tier only
    assert set(samples.clip_id) - admitted or len(set(samples.tier)) == 1
    index = read_index(objects, snap)
    assert index.text_levels.map(lambda v: set(json.loads(v)) <= {"level_0", "level_2"}).all()
    assert index.text_levels.map(lambda v: len(json.loads(v))).sum() > 0
    by_level = {(r.clip_id, r.caption_level): np.frombuffer(r.vector, dtype="<f4")
                for r in text.itertuples() if r.vector is not None}
    seen = set()
    for batch in PlanDataset(plan, trained / "store" / f"shards/v{snap}", index, rank=0, world_size=2, steps=20):
        for i, (clip, level) in enumerate(zip(batch["clip_ids"], batch["caption_levels"], strict=True)):
            seen.add(level)
            assert level in ("level_0", "level_2")
            assert batch["captions"][i] == json.loads(samples.set_index("clip_id").loc[clip, "captions"])[level]
            if batch["text_mask"][i]:
                assert torch.equal(batch["text_embeddings"][i], torch.from_numpy(by_level[(clip, level)].copy()))
    assert seen == {"level_0", "level_2"}
    # the monitor: a report over the window, with a plot; the plan's blocking check ran and passed
    plot = tmp_path / "monitor.png"
    proc = _cli("plan", "inspect", "--snapshot", str(snap), "--steps", "0:12", "--global-batch", "4", "--plot", str(plot),
                "--store", str(trained / "store"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["samples"] == 48 and report["passed"] and plot.stat().st_size > 1000
    assert set(report["autocorrelation"]) == {"stream", "cluster", "source"}
    # the report shows the curriculum: streams, clusters and coverage, caption monitors, monitor plots
    from vidassets.report import curriculum_section

    page = curriculum_section(tables, settings.train)
    for part in ("Samples per stream", "Semantic clusters", "Caption monitors per captioner version",
                 "Realized streams, phase warmup, steps 0:6 (PASS)", "Realized streams, phase main, steps 6:18"):
        assert part in page, part
    assert page.count("data:image/png;base64,") == 2


def test_the_run_registry_answers_which_runs_saw_a_clip_and_a_takedown_reaches_a_running_loader(
        trained: Path, capsys) -> None:
    """Two registered runs over one plan (run-48 from step 10 on): lineage says which runs saw a
    clip and at which steps; a takedown while a loader is running names the runs that hold the
    sample, and the loader leaves it out from its next re-read on, counting it: no restart."""
    from vidassets.cli import EXIT_USAGE, main
    from vidassets.config import TrainSettings
    from vidassets.train.build import build_plan, read_index
    from vidassets.train.loader import PlanDataset
    from vidassets.train.runs import plan_files, training_runs
    from vidassets.train.snapshot import taken_down_clips

    store = trained / "store"
    objects = open_object_store(str(store))
    tables = TableStore(objects)
    clear_tombstones(objects)
    train = {"train.shard_mb": 0.02, "train.global_batch": 4, "train.world_size": 2, "train.total_steps": 20}
    run_graph(_settings(trained, **train), trained, select=["dataset_snapshot", "training_shards", "train_plan"])
    version = snapshot_versions(objects)[-1]
    plan_key = next(k for k in plan_files(objects, version)
                    if json.loads(objects.get_bytes(k))["total_steps"] == 20
                    and json.loads(objects.get_bytes(k))["global_batch"] == 4)
    base = ["--snapshot", str(version), "--plan", plan_key, "--store", str(store)]
    assert main(["run", "register", "run-47", *base]) == 0
    assert main(["run", "register", "run-47", *base]) == EXIT_USAGE  # a run id is never reused
    assert main(["run", "register", "run-48", *base, "--steps", "10:19"]) == 0
    assert main(["run", "register", "run-49", *base, "--steps", "10:99"]) == EXIT_USAGE  # outside the plan
    capsys.readouterr()
    runs = training_runs(objects).set_index("run_id")
    assert list(runs.index) == ["run-47", "run-48"] and runs.loc["run-48", "first_step"] == 10
    plan = build_plan(objects, version, TrainSettings(global_batch=4, world_size=2))
    clip = plan.step(3).clip_ids[0]
    steps = [s for s in range(20) if clip in plan.step(s).clip_ids]
    seen = {r["run_id"]: r["steps"] for r in sample_lineage(tables, clip)["training_runs"]}
    assert seen["run-47"] == steps and seen.get("run-48", []) == [s for s in steps if s >= 10]

    loader = PlanDataset(plan, store / f"shards/v{version}", read_index(objects, version), rank=0, world_size=1,
                         steps=20, takedowns=lambda: taken_down_clips(objects, tables, version), recheck_steps=2)
    batches = iter(loader)
    first = next(batches)  # the run is under way
    assert first["skipped_takedowns"] == 0
    asset = read_snapshot(objects, version).set_index("clip_id").loc[clip, "asset_id"]
    down = set(read_snapshot(objects, version).query("asset_id == @asset").clip_id)
    try:
        assert main(["takedown", "--asset-id", asset, "--reason", "rights withdrawn", "--store", str(store)]) == 0
        said = capsys.readouterr().out
        assert "run run-47" in said and "its loader skips them" in said
        rest = list(batches)
        assert [b["step"] for b in rest] == list(range(1, 20))
        assert not any(set(b["clip_ids"]) & down for b in rest if b["step"] >= 2)  # re-read at step 2
        expected = sum(1 for s in range(2, 20) for c in plan.step(s).clip_ids if c in down)
        assert loader.skipped_total == sum(b["skipped_takedowns"] for b in rest) == expected > 0
    finally:
        clear_tombstones(objects)


def test_latents_at_two_resolutions_and_a_plan_that_switches_resolution_mid_training(trained: Path,
                                                                                     tmp_path: Path) -> None:
    """``latents.resolutions: [64, 80]``: the second resolution is encoded from the ladder beside the
    first (whose rows are reused, no clip encoded twice), the snapshot holds both, the shards a
    bucket per resolution, and a plan whose first phase trains at 64 and second at 80 serves each
    phase its own resolution's latents only; a phase at a resolution nobody has is refused by name."""
    import torch

    from vidassets.derive.latents import bucket_shape, load_latents
    from vidassets.train.build import build_plan, read_index
    from vidassets.train.loader import PlanDataset
    from vidassets.train.snapshot import samples_at_resolutions

    objects = open_object_store(str(trained / "store"))
    clear_tombstones(objects)
    tables = TableStore(objects)
    train = {"train.shard_mb": 0.02, "train.global_batch": 2, "train.world_size": 1, "train.total_steps": 10}
    run_graph(_settings(trained, **train), trained, select=["selection", "latents"])  # the plain recipe, 64 only
    low_rows = tables.read_all("latents")
    recipe = json.loads((trained / "all.yaml").read_text())
    recipe["curriculum"] = {"phases": [{"name": "low", "until_step": 4, "resolution": 64},
                                       {"name": "high", "resolution": 80}]}
    path = tmp_path / "phases.yaml"
    path.write_text(json.dumps(recipe))
    settings = _settings(trained, **{"selection.recipe": str(path), "latents.resolutions": [64, 80], **train})
    summary = run_graph(settings, trained, select=["selection", "latents", "dataset_snapshot", "training_shards",
                                                   "train_plan"])
    passing = set(tables.read("selection").query("decision == 'pass'").clip_id)
    extra = summary.stages["latents"].extra
    assert extra["model_calls"] == len(passing)  # the 80s only
    assert extra["read_from_ladder"] == len(passing) and extra.get("raw_frames_decoded", 0) == 0  # no raw decode
    versions = Versions(settings)
    rows = current_latents(tables.read_all("latents"), versions)
    assert {(c, r) for c, r in zip(rows.clip_id, rows.resolution, strict=True)} == {(c, r) for c in passing
                                                                                 for r in (64, 80)}
    kept = rows[rows.resolution == 64]
    assert set(kept.latent_key) <= set(low_rows.latent_key)  # the 64s are the rows written before
    assert {min(bucket_shape(b)[1:]) for b in rows[rows.resolution == 80].bucket} == {80}  # short side 80

    version = snapshot_versions(objects)[-1]
    samples = read_snapshot(objects, version)
    assert set(samples.clip_id) == passing
    assert all(set(json.loads(s)) == {"64", "80"} for s in samples.latents)
    expanded = samples_at_resolutions(samples)
    assert len(expanded) == 2 * len(samples) and expanded.primary.sum() == len(samples)
    assert set(expanded[expanded.primary].resolution) == {64}
    index = read_index(objects, version)
    assert set(index.resolution) == {64, 80} and len(index) == 2 * len(samples)

    plan = build_plan(objects, version, settings.train)
    assert [p["resolution"] for p in plan.describe()] == [64, 80]
    by_key = rows.set_index(["clip_id", "resolution"]).latent_key
    dataset = PlanDataset(plan, trained / "store" / f"shards/v{version}", index, rank=0, world_size=1)
    for step in range(8):
        sl = plan.step(step)
        want = 64 if step < 4 else 80
        assert sl.phase == ("low" if step < 4 else "high")
        assert index.set_index(["clip_id", "bucket"]).loc[(sl.clip_ids[0], sl.bucket), "resolution"] == want
        batch = dataset.batch(step)
        for clip, latents in zip(batch["clip_ids"], batch["latents"], strict=True):
            stored, _ = load_latents(objects, by_key[(clip, want)])
            assert torch.equal(latents, stored)

    bad = dict(recipe, curriculum={"phases": [{"name": "huge", "resolution": 96}]})
    path.write_text(json.dumps(bad))
    from vidassets.curate.selection import recipe_from_text
    from vidassets.train.build import phase_specs
    from vidassets.train.plan import TrainPlan

    plan_samples = plan.samples
    with pytest.raises(ValueError, match=r"phase 'huge': no sample has latents at resolution 96"):
        TrainPlan(plan_samples, phase_specs(recipe_from_text(json.dumps(bad), "bad").curriculum), 0, 2, version)


def current_latents(latents, versions: Versions):
    """The latents rows of the configured resolutions' current versions."""
    producers = versions.latent_producers()
    rows = latents[latents.producer_version.isin(list(producers)) & (latents.status == "ok")]
    return rows.assign(resolution=rows.producer_version.map(producers))


@pytest.mark.s3
def test_the_loader_streams_shards_from_s3_by_range_with_prefetch_and_says_what_it_waited(
        trained: Path, s3_endpoint: str, s3_client, s3_bucket_name: str) -> None:
    """The snapshot's shards copied to a real S3 server on loopback: the loader reads them by HTTP
    range requests (one per sample), running ``prefetch_steps`` ahead on its fetch threads, and its
    batches equal the local loader's, tensor for tensor; every batch says how long it waited."""
    import torch

    from vidassets.storage.objects import S3ObjectStore
    from vidassets.train.build import build_plan, read_index
    from vidassets.train.loader import PlanDataset, StoreShards
    from vidassets_tests.conftest import upload_tree

    objects = open_object_store(str(trained / "store"))
    clear_tombstones(objects)
    train = {"train.shard_mb": 0.02, "train.global_batch": 4, "train.world_size": 2, "train.total_steps": 20}
    settings = _settings(trained, **train)
    run_graph(settings, trained, select=["selection", "latents", "dataset_snapshot", "training_shards"])
    version = snapshot_versions(objects)[-1]
    root = trained / "store" / f"shards/v{version}"
    upload_tree(s3_client, root, s3_bucket_name, f"shards/v{version}")
    remote = StoreShards(S3ObjectStore(s3_client, s3_bucket_name), f"shards/v{version}")
    plan, index = build_plan(objects, version, settings.train), read_index(objects, version)
    local = list(PlanDataset(plan, root, index, rank=1, world_size=2, steps=6))
    streamed = PlanDataset(plan, remote, index, rank=1, world_size=2, steps=6, prefetch_steps=2, fetch_threads=3)
    got = list(streamed)
    assert [b["clip_ids"] for b in got] == [b["clip_ids"] for b in local]
    for a, b in zip(got, local, strict=True):
        assert torch.equal(a["latents"], b["latents"]) and torch.equal(a["text_embeddings"], b["text_embeddings"])
        assert a["fetch_wait_s"] >= 0
    assert streamed.fetch_wait_total == pytest.approx(sum(b["fetch_wait_s"] for b in got))
    assert streamed._pool is None  # the fetch threads stop with the iteration
    resumed = next(iter(PlanDataset(plan, remote, index, rank=1, world_size=2, start_step=4, steps=1)))
    assert resumed["clip_ids"] == local[4]["clip_ids"]


def test_snapshots_share_shards_a_takedown_rewrites_only_its_drop_and_collection_waits_for_a_lease(
        trained: Path) -> None:
    """Shards are content-addressed by their members, one drop's samples per shard: a snapshot after
    a takedown references the unchanged drops' shards and writes only the changed drop's again; the
    shards only a retired snapshot references are deleted a lease after nothing references them, and
    the live snapshot's loader still reads every batch."""
    from vidassets.train.build import build_plan, read_index
    from vidassets.train.collect import collect_shards, retire_snapshot
    from vidassets.train.loader import PlanDataset

    store = trained / "store"
    objects = open_object_store(str(store))
    clear_tombstones(objects)
    train = {"train.shard_mb": 0.02, "train.global_batch": 2, "train.world_size": 1, "train.total_steps": 6}
    settings = _settings(trained, **train)
    run_graph(settings, trained, select=["selection", "latents", "dataset_snapshot", "training_shards"])
    a = snapshot_versions(objects)[-1]
    meta_a = json.loads((store / f"shards/v{a}/shards.json").read_text())
    samples = read_snapshot(objects, a)
    parts = samples.groupby("asset_id").apply(lambda g: set(zip(g.bucket, g.source_shard, strict=True)),
                                              include_groups=False)
    every = set(zip(samples.bucket, samples.source_shard, strict=True))  # (bucket, drop): what a shard holds
    asset = next(a_ for a_, p in parts.items() if p != every)  # an asset outside some bucket's shards
    touched = parts[asset]

    def parts_of(cas_key: str) -> set[tuple[str, str]]:
        members = json.loads(objects.get_bytes(cas_key.removesuffix(".tar") + ".members.json"))["members"]
        rows = samples.set_index("clip_id").loc[[m["clip_id"] for m in members]]
        return set(zip(rows.bucket, rows.source_shard, strict=True))

    proc = _cli("takedown", "--asset-id", asset, "--reason", "shared shards test", "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    run_graph(settings, trained, select=["dataset_snapshot", "training_shards"])
    b = snapshot_versions(objects)[-1]
    meta_b = json.loads((store / f"shards/v{b}/shards.json").read_text())
    new, kept = set(meta_b["cas"]) - set(meta_a["cas"]), set(meta_b["cas"]) & set(meta_a["cas"])
    assert kept and meta_b["reused_shards"] == len(kept) and meta_b["new_shards"] == len(new)
    assert all(parts_of(k) <= touched for k in new)  # only the taken-down asset's (bucket, drop) shards again
    assert all(not parts_of(k) & touched for k in kept)
    touched_bytes = sum(json.loads(objects.get_bytes(k.removesuffix(".tar") + ".members.json"))["size"]
                        for k in meta_a["cas"] if parts_of(k) & touched)
    assert meta_b["bytes_written"] <= touched_bytes

    only_a = set(meta_a["cas"]) - set(meta_b["cas"])
    assert only_a
    for info in list(objects.list("runs/")):  # no registered run keeps an earlier test's snapshot live
        objects.delete(info.key)
    for version in snapshot_versions(objects):  # every snapshot but b retired (earlier tests' too)
        if version != b:
            retire_snapshot(objects, version)
    now = 1_000_000_000.0
    first = collect_shards(objects, lease_s=3600, now=now)
    assert first["deleted"] == 0 and first["leased"] >= len(only_a)  # the lease starts: nothing deleted yet
    later = collect_shards(objects, lease_s=3600, now=now + 3601)
    assert later["deleted"] >= len(only_a) and all(not objects.exists(k) for k in only_a)
    assert all(objects.exists(k) for k in meta_b["cas"])
    plan, index = build_plan(objects, b, settings.train), read_index(objects, b)
    got = [batch["clip_ids"] for batch in PlanDataset(plan, store / f"shards/v{b}", index, 0, 1, steps=6)]
    assert all(len(ids) == 2 for ids in got) and asset not in set(samples.set_index("clip_id").loc[
        [c for ids in got for c in ids], "asset_id"])


@pytest.mark.s3
def test_shards_on_s3_live_once_and_the_loader_reads_them_through_the_snapshot_prefix(
        s3_client, s3_bucket_name: str, tmp_path: Path) -> None:
    """A store on a real S3 server (loopback): the shards go to the CAS once (a second snapshot of
    the same samples writes none), the snapshot's index names them relative to its prefix, and the
    loader reads every latent back by range."""
    import numpy as np
    import pandas as pd
    import torch

    from vidassets.derive.latents import latent_key, latents_bytes, load_latents
    from vidassets.storage.objects import S3ObjectStore
    from vidassets.train.loader import PlanDataset, StoreShards
    from vidassets.train.plan import TrainPlan, single_phase
    from vidassets.train.shards import write_shards

    objects = S3ObjectStore(s3_client, s3_bucket_name)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        clip = f"{i:032x}"
        key = latent_key(clip, "t", "f9_64x64")
        objects.put_bytes(key, latents_bytes(torch.from_numpy(rng.standard_normal((4, 3, 8, 8), dtype=np.float32)),
                                             "bf16", {}))
        rows.append({"clip_id": clip, "asset_id": f"a{i}", "source_uri": f"s3://raw/{i}.mp4", "license": "cc-by",
                     "source_shard": f"web/drop-{i % 2}", "tier": "T1", "stream": "web", "bucket": "f9_64x64",
                     "first_frame": 0, "last_frame": 9, "latent_key": key, "latent_version": "t",
                     "latent_shape": "[4, 3, 8, 8]", "dtype": "bf16", "captions": '{"level_1": "x"}',
                     "caption_version": "c"})
    samples = pd.DataFrame(rows)
    first = write_shards(objects, tmp_path / "v1", samples, {}, 1 << 20)
    assert first.new_shards == 2 and all(s.startswith("../cas/") for s in first.index.shard)  # one per drop
    again = write_shards(objects, tmp_path / "v2", samples, {}, 1 << 20)
    assert again.new_shards == 0 and again.reused_shards == 2 and again.bytes_written == 0
    objects.put_bytes("shards/v1/shards.json", b'{"latents_dtype": "bfloat16"}')
    plan = TrainPlan(samples[["clip_id", "stream", "tier", "captions"]].merge(
        first.index[["clip_id", "bucket", "shard"]], on="clip_id"), single_phase(), 0, 3, 1)
    seen = {}
    for batch in PlanDataset(plan, StoreShards(objects, "shards/v1"), first.index, 0, 1, steps=2, prefetch_steps=1):
        seen |= dict(zip(batch["clip_ids"], batch["latents"], strict=True))
    assert set(seen) == set(samples.clip_id)
    for clip, latents in seen.items():
        assert torch.equal(latents, load_latents(objects, latent_key(clip, "t", "f9_64x64"))[0])


def test_a_snapshot_after_a_new_drop_writes_only_that_drops_shards(trained: Path, tmp_path: Path) -> None:
    """A new drop (a real file, generated) lands in a copy of the curated bucket: the next snapshot
    references every shard of the one before and writes shards holding the new drop's samples only."""
    import shutil

    import numpy as np

    from vidassets.demo.bucket import encode

    world = tmp_path / "w"
    shutil.copytree(trained, world, symlinks=True)
    objects = open_object_store(str(world / "store"))
    clear_tombstones(objects)
    settings = _settings(world, **{"train.shard_mb": 0.02})
    run_graph(settings, world, select=["selection", "latents", "dataset_snapshot", "training_shards"])
    a = snapshot_versions(objects)[-1]
    meta_a = json.loads(objects.get_bytes(f"shards/v{a}/shards.json"))

    drop = world / "bucket/raw/licensed/drop-0002"
    drop.mkdir(parents=True)
    rng = np.random.default_rng(4)
    texture = rng.integers(0, 256, (160, 400, 3), dtype=np.uint8)  # a textured scene panning right
    encode((texture[:, 2 * i:2 * i + 200] for i in range(90)), drop / "pan.mp4", "libx264", fps=25)
    for name in ("_provenance.json", "_SUCCESS"):
        shutil.copy(world / "bucket/raw/licensed/drop-0001" / name, drop / name)
    run_graph(settings, world)
    run_graph(settings, world, select=["dataset_snapshot", "training_shards"])
    b = snapshot_versions(objects)[-1]
    samples = read_snapshot(objects, b).set_index("clip_id")
    meta_b = json.loads(objects.get_bytes(f"shards/v{b}/shards.json"))
    assert set(meta_a["cas"]) <= set(meta_b["cas"]) and meta_b["reused_shards"] == len(meta_a["cas"])
    new = set(meta_b["cas"]) - set(meta_a["cas"])
    assert new and meta_b["new_shards"] == len(new)
    for key in new:
        members = json.loads(objects.get_bytes(key.removesuffix(".tar") + ".members.json"))
        assert {samples.loc[m["clip_id"], "source_shard"] for m in members["members"]} == {"licensed/drop-0002"}
    assert meta_b["bytes_written"] == sum(json.loads(objects.get_bytes(k.removesuffix(".tar") + ".members.json"))["size"]
                                          for k in new)
