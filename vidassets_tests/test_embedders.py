"""Embedders: the offline MobileNetV2 default on real frames, and the CLIP/SigLIP-style path that
loads a local model directory. No CLIP weights are reachable here, so the second test builds a
tiny random-init CLIP and saves it: it proves the loading and pooling code, not embedding quality."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vidassets.config import ConfigError, load_settings
from vidassets.demo.bucket import decode_rgb
from vidassets.models.registry import ModelRegistry
from vidassets.versions import Versions


def test_mobilenet_v2_separates_unrelated_footage(demo_bucket: Path) -> None:
    model = ModelRegistry("cpu").get("mobilenet_v2-imagenet")
    bikes = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", limit=40, start=80))[::10]
    carphone = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", limit=40))[::10]
    small_bikes = [f[::2, ::2].copy() for f in bikes]
    before = model.calls  # built models are shared by every test of this process
    a, b, c = model(bikes), model(small_bikes), model(carphone)
    assert a.shape == (1280,) and abs(float(np.linalg.norm(a)) - 1) < 1e-5
    assert float(a @ b) > 0.95 > float(a @ c)
    assert model.calls - before == 12 and "mobilenet_v2" in model.version


def _tiny_random_clip(path: Path) -> Path:
    """A random-init CLIP with a 16-d projection, saved like a downloaded model (plumbing tests only)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.CLIPConfig(
        text_config={"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 2},
        vision_config={"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )
    transformers.CLIPModel(config).save_pretrained(path)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return path


def test_clip_path_loads_a_local_model_directory(tmp_path: Path) -> None:
    _tiny_random_clip(tmp_path / "tiny-clip")
    model = ModelRegistry("cpu").get("clip-image", str(tmp_path / "tiny-clip"))
    frames = [np.full((64, 80, 3), v, np.uint8) for v in (10, 120, 240)]
    vec = model(frames)
    assert vec.shape == (16,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
    assert model.version.startswith("clip-image@transformers==") and model.version.endswith("+mean-l2+fp32")
    settings = load_settings(env={}, overrides={"embeddings.model": "clip", "embeddings.weights": str(tmp_path / "tiny-clip")})
    assert "clip" in Versions(settings).own("clip_embeddings")
    with pytest.raises(ConfigError, match="embeddings"):
        load_settings(env={}, overrides={"embeddings.model": "clip"})


def test_torch_threads_name_themselves_in_the_torch_models_versions(demo_bucket) -> None:
    """Torch's CPU kernels sum in an order that follows the intra-op thread count: the embedder's
    vectors at one and two threads differ in their last bits, so the count is part of the version
    (one thread, the default, adds nothing: rows written before stay current); ONNX models and their
    versions do not depend on it."""
    import torch

    from vidassets.config import parse_settings
    from vidassets.demo.bucket import decode_rgb
    from vidassets.models.registry import ModelRegistry
    from vidassets.versions import Versions

    frames = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", limit=40))[::10]
    before = torch.get_num_threads()
    try:
        vectors, versions = [], []
        for threads in (1, 2):
            registry = ModelRegistry("cpu", torch_threads=threads)
            vectors.append(registry.get("mobilenet_v2-imagenet", None).embed_frames(frames))
            versions.append(registry.version("mobilenet_v2-imagenet", None))
            assert registry.version("open_nsfw") == ModelRegistry("cpu").version("open_nsfw")
    finally:
        torch.set_num_threads(before)
    assert np.allclose(vectors[0], vectors[1], atol=1e-5)
    assert vectors[0].tobytes() == vectors[1].tobytes() or versions[0] != versions[1]
    assert versions[1].endswith("+threads2") and "threads" not in versions[0]
    one, two = (Versions(parse_settings({"models": {"torch_threads": n}})) for n in (1, 2))
    assert one.own("clip_embeddings") != two.own("clip_embeddings")
    assert one.own("clip_scores") == two.own("clip_scores")  # no torch model among the default scores
