"""Model runs batched across clips (``models.batch_frames``): the same rows whatever the batch, fewer
model runs, and one clip's failure kept to that clip. Real models on real footage throughout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vidassets.config import load_settings
from vidassets.curate.embeddings import embed_partition, embedder
from vidassets.curate.scores import MODEL_SCORES, _per_clip, score_partition
from vidassets.demo.bucket import decode_rgb
from vidassets.models.registry import ModelRegistry
from vidassets.runtime.engine import groups
from vidassets.runtime.step import Step
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.rows import RowVersion
from vidassets.versions import Versions
from vidassets_tests.conftest import MEDIA_STAGES, graph_settings, run_graph, small_bucket


def test_groups_reach_the_limit_in_order() -> None:
    assert groups([5, 5, 5, 5, 5], lambda n: n, 10) == [[5, 5], [5, 5], [5]]
    assert groups([3, 12, 1, 0, 9], lambda n: n, 10) == [[3, 12], [1, 0, 9]]  # an empty item weighs 1
    assert groups(list(range(4)), lambda n: 7, 1) == [[0], [1], [2], [3]]  # limit 1: one item per group
    assert groups([], lambda n: n, 16) == []


def test_frame_batching_models_give_each_frame_the_same_output_in_any_batch(demo_bucket: Path) -> None:
    drop = demo_bucket / "raw/licensed/drop-0001"
    frames = list(decode_rgb(drop / "carphone.mp4", limit=60))[::6] + list(decode_rgb(drop / "bikes.mp4", limit=40))[::8]
    registry = ModelRegistry("cpu")
    for kind, args in (("open_nsfw", ()), ("nudenet-faces", (0.5,)), ("mobilenet_v2-imagenet", (None,)),
                       ("ppocrv4-det", (256, 0.5))):
        model = registry.get(kind, *args)
        run = model.embed_frames if hasattr(model, "embed_frames") else model
        outputs = {}
        for size in (1, 4, len(frames)):
            model.batch_frames = size
            before = model.batches
            outputs[size] = np.asarray(run(frames))
            # text detection batches frames of one size (10 of carphone, 5 of bikes); torch models run
            # one frame at a time on the CPU (fixed shapes); the others any frames
            runs = {"ppocrv4-det": -(-10 // size) - (-5 // size), "mobilenet_v2-imagenet": len(frames)}.get(
                kind, -(-len(frames) // size))
            assert model.batches - before == runs, kind
        assert np.array_equal(outputs[1], outputs[4]) and np.array_equal(outputs[1], outputs[len(frames)]), kind
    usage = registry.usage()
    assert any(u["batches"] for u in usage.values()) and all("frames" in u for u in usage.values())


def test_a_torch_models_frame_output_does_not_depend_on_its_run_at_any_thread_count(demo_bucket: Path) -> None:
    import torch

    frames = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", limit=60))[::3]
    model = ModelRegistry("cpu").get("mobilenet_v2-imagenet", None)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):  # at one thread oneDNN's kernels (and last bits) change with the batch shape
            torch.set_num_threads(count)
            outputs = []
            for size in (1, 16, 24):
                model.batch_frames = size
                outputs.append(model.embed_frames(frames))
            outputs.append(np.concatenate([model.embed_frames(frames[:7]), model.embed_frames(frames[7:])]))
            assert all(np.array_equal(outputs[0], o) for o in outputs[1:]), count
    finally:
        torch.set_num_threads(threads)
        model.batch_frames = 16


def test_batched_text_detection_finds_what_the_detector_finds_frame_by_frame(demo_bucket: Path) -> None:
    import cv2

    drop = demo_bucket / "raw/licensed/drop-0001"
    frames = list(decode_rgb(drop / "carphone.mp4", limit=40))[::5] + list(decode_rgb(drop / "bikes.mp4", limit=20))[::5]
    for i, rgb in enumerate(frames[::2]):  # burnt-in subtitles on every other frame
        cv2.putText(rgb, f"SUBTITLE LINE {i}", (8, rgb.shape[0] - 12), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2)
    detector = ModelRegistry("cpu").get("ppocrv4-det", 256, 0.5)
    reference = []  # RapidOCR's own per-frame call (pre-processing, network, boxes) on the same shrink
    for rgb in frames:
        small = detector._shrink(rgb)
        boxes, _ = detector._det(np.ascontiguousarray(small[..., ::-1]))
        mask = np.zeros(small.shape[:2], np.uint8)
        for box in boxes if boxes is not None else []:
            cv2.fillPoly(mask, [np.asarray(box, dtype=np.int32).reshape(-1, 2)], 1)
        reference.append(float(mask.mean()))
    detector.batch_frames = 16
    before = detector.batches
    assert detector(frames) == reference
    assert detector.batches - before == 2  # two frame sizes (the two videos), one run each
    assert sum(share > 0.01 for share in reference[::2]) >= len(frames[::2]) - 1


def test_a_clip_whose_frames_break_a_model_fails_alone(demo_bucket: Path) -> None:
    frames = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", limit=12))
    faces = ModelRegistry("cpu").get("nudenet-faces", 0.5)
    broken = np.zeros((0, 0, 3), np.uint8)  # an empty frame: the detector's own preprocessing rejects it
    out = _per_clip(faces, [frames[:4], [frames[4], broken], frames[6:12]])
    assert out[0] == faces(frames[:4]) and out[2] == faces(frames[6:12])
    assert isinstance(out[1], Exception)


def test_grouped_runner_keeps_a_failure_to_its_item() -> None:
    def compute(group: list[int]) -> dict:
        from vidassets.runtime.engine import each

        def one(n: int) -> dict:
            if n == 3:
                raise ValueError("three is bad input")
            return {"n": n, "status": "ok"}

        return {"outcomes": each(one, group), "_stats": {"model_batches": 1}}

    step = Step([], lambda row: row["n"], max_runs=2)
    rows = step.run_grouped(range(6), lambda n: n, RowVersion("v1"), compute,
                            lambda n, exc: {"n": n, "status": "error", "reason": exc.reason},
                            weight=lambda n: 2, limit=4)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "error", "ok", "ok"]
    assert "three is bad input" in rows[3]["reason"] and rows[3]["failure"] == "transient"
    assert step.stats.extra["model_batches"] == 3  # 6 items of weight 2 in groups of 4


def test_clip_scores_and_embeddings_are_the_same_batched_across_clips(demo_bucket: Path, tmp_path: Path) -> None:
    bucket = small_bucket(demo_bucket, tmp_path)
    run_graph(graph_settings(bucket, tmp_path), tmp_path, select=MEDIA_STAGES)
    settings = load_settings(env={}, overrides={"scores.cascade": False})
    versions = Versions(settings)
    objects = open_object_store(str(tmp_path / "store"))
    tables = TableStore(objects)
    key = "licensed/drop-0001"
    clips, frames = tables.read("clips", key), tables.read("context_frames", key)
    assert len(clips) >= 4
    scored, embedded = {}, {}
    for size in (1, 64):
        registry = ModelRegistry("cpu", batch_frames=size)
        rows, stats = score_partition(
            objects, clips, tables.read("video_analysis", key), tables.read("frame_index", key),
            tables.read("video_probe", key), frames, pd.DataFrame(), versions.score_rows(), settings.scores,
            2, registry)
        scored[size] = (pd.DataFrame(rows).drop(columns=["runs"], errors="ignore"), stats)
        vectors, estats = embed_partition(objects, clips, frames, pd.DataFrame(), RowVersion("embed-test"),
                                          lambda registry=registry: embedder(registry), 2, batch_frames=size)
        embedded[size] = (pd.DataFrame(vectors), estats)
    (one, one_stats), (many, many_stats) = scored[1], scored[64]
    pd.testing.assert_frame_equal(one, many)
    assert set(one[one.score.isin(MODEL_SCORES)].status) == {"ok"}
    assert one_stats.model_calls == many_stats.model_calls > 0
    # on the CPU every model runs a frame at a time whatever the batch (cheapest there: CPU_RUN_FRAMES)
    assert many_stats.extra["model_batches"] == one_stats.extra["model_batches"] > 0
    (one, one_stats), (many, many_stats) = embedded[1], embedded[64]
    pd.testing.assert_frame_equal(one, many)
    assert set(one.status) == {"ok"} and one_stats.model_calls == many_stats.model_calls == one.frames.sum()
    # the embedder (torch) runs one frame at a time on the CPU whatever the batch: fixed shapes
    assert many_stats.extra["model_batches"] == one_stats.extra["model_batches"] == one.frames.sum()

    # a context frame that cannot be read fails its own clip's model scores (retried), not its group's
    lost_clip = clips.iloc[1]
    inside = frames[(frames.asset_id == lost_clip.asset_id) & (frames.frame_index >= lost_clip.first_frame)
                    & (frames.frame_index <= lost_clip.last_frame)]
    objects.delete(inside.blob_key.iloc[0])
    rows, _ = score_partition(objects, clips, tables.read("video_analysis", key), tables.read("frame_index", key),
                              tables.read("video_probe", key), frames, pd.DataFrame(), versions.score_rows(),
                              settings.scores, 2, ModelRegistry("cpu", batch_frames=64))
    after = pd.DataFrame(rows).drop(columns=["runs"], errors="ignore")
    hit = after.clip_id.eq(lost_clip.clip_id) & after.score.isin(MODEL_SCORES)
    assert set(after[hit].status) == {"error"} and set(after[hit].failure) == {"transient"}
    assert after[hit].reason.str.startswith("cannot read context frames").all()
    pd.testing.assert_frame_equal(after[~hit].reset_index(drop=True), scored[64][0][~hit].reset_index(drop=True))
