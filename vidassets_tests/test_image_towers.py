"""The CLIP / SigLIP / SigLIP 2 image embedder and the V-JEPA 2 video embedder equal upstream.

No published weights are reachable offline, so each test builds the upstream transformers class
from its published configuration (openai/clip-vit-large-patch14, google/siglip-so400m-patch14-384,
google/siglip2-base-patch16-naflex, facebook/vjepa2-vitl-fpc64-256) shrunk to tiny dimensions, with
random weights from a fixed seed, saves it with its processor in the published layout, loads it
through vidassets and compares with upstream's own processor + forward on real video frames."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from vidassets.demo.bucket import decode_rgb, fetch_samples
from vidassets.models.embedder import ClipImageEmbedder
from vidassets.models.placement import Placement
from vidassets.models.video_embedder import VideoEmbedder, sample_indices
from vidassets_tests.conftest import SAMPLE_CACHE

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def real_frames() -> list[np.ndarray]:
    """Ten consecutive 1280x720 frames of Big Buck Bunny and two of bikes (a scene change)."""
    samples = fetch_samples(SAMPLE_CACHE)
    return list(decode_rgb(samples["bigbuckbunny.mp4"], limit=10, start=40)) + \
        list(decode_rgb(samples["bikes.mp4"], limit=2, start=80))


def _clip(path: Path) -> Path:
    """openai/clip-vit-large-patch14, tiny: quick_gelu, patch 14, its processor (bicubic resize of
    the short side, center crop, CLIP mean/std), 28 px instead of 224."""
    text = {**TINY, "max_position_embeddings": 77, "vocab_size": 49408, "hidden_act": "quick_gelu"}
    vision = {**TINY, "image_size": 28, "patch_size": 14, "hidden_act": "quick_gelu"}
    transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)) \
        .save_pretrained(path)
    transformers.CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, resample=3,
                                       image_mean=[0.48145466, 0.4578275, 0.40821073],
                                       image_std=[0.26862954, 0.26130258, 0.27577711]).save_pretrained(path)
    return path


def _siglip(path: Path) -> Path:
    """google/siglip-so400m-patch14-384, tiny: gelu_pytorch_tanh, patch 14, attention-pool head,
    its processor (bicubic resize to a square, mean/std 0.5), 28 px instead of 384."""
    text = {**TINY, "max_position_embeddings": 64, "vocab_size": 32000, "bos_token_id": None, "eos_token_id": 1,
            "pad_token_id": 1}
    vision = {**TINY, "image_size": 28, "patch_size": 14}
    transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision)).save_pretrained(path)
    transformers.SiglipImageProcessorPil(size={"height": 28, "width": 28}, resample=3).save_pretrained(path)
    return path


def _siglip2(path: Path) -> Path:
    """google/siglip2-base-patch16-naflex, tiny: NaFlex patches (aspect ratio kept, at most
    ``max_num_patches`` of them), patch 8 and 16 patches instead of 16 and 256."""
    text = {**TINY, "max_position_embeddings": 64, "vocab_size": 1024}
    vision = {**TINY, "patch_size": 8, "num_patches": 16}
    transformers.Siglip2Model(transformers.Siglip2Config(text_config=text, vision_config=vision)).save_pretrained(path)
    transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16).save_pretrained(path)
    return path


def _upstream_image_vectors(path: Path, model, frames: list[np.ndarray]) -> np.ndarray:
    """Upstream's documented usage on PIL images, one frame at a time, then the clip's pooling."""
    processor = transformers.AutoImageProcessor.from_pretrained(path, backend="pil")
    rows = []
    for frame in frames:
        with torch.inference_mode():
            out = model.get_image_features(**processor(images=Image.fromarray(frame), return_tensors="pt"))
        rows.append(torch.nn.functional.normalize(out.pooler_output, dim=-1)[0].numpy())
    mean = np.mean(rows, axis=0)
    return mean / np.linalg.norm(mean)


@pytest.mark.parametrize("build", [_clip, _siglip, _siglip2], ids=["clip", "siglip", "siglip2"])
def test_image_tower_equals_upstream(build, real_frames: list[np.ndarray], tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = build(tmp_path / "model")
    upstream = transformers.AutoModel.from_pretrained(path).eval()
    frames = real_frames[::4]
    embedder = ClipImageEmbedder(Placement("cpu"), path, batch_frames=4)
    vector = embedder(frames)
    expected = _upstream_image_vectors(path, upstream, frames)
    assert vector.shape == (embedder.dim,) == expected.shape
    np.testing.assert_allclose(vector, expected, atol=1e-5, rtol=0)
    assert embedder.calls == len(frames) and embedder.batches == len(frames)  # one frame a run on the CPU
    assert float(vector @ embedder(frames[:1])) < 1 - 1e-4  # the vector depends on its frames


def _vjepa2(path: Path) -> Path:
    """facebook/vjepa2-vitl-fpc64-256, tiny: tubelet 2, patch 8 and 32 px crops instead of 16 and
    256, 4 frames per clip instead of 64, a 1-layer predictor; its processor (ImageNet mean/std,
    short side to crop * 256 / 224, center crop)."""
    config = transformers.VJEPA2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                                       crop_size=32, frames_per_clip=4, tubelet_size=2, mlp_ratio=4.0,
                                       pred_hidden_size=16, pred_num_hidden_layers=1, pred_num_attention_heads=2,
                                       pred_num_mask_tokens=10, num_pooler_layers=1)
    transformers.VJEPA2Model(config).save_pretrained(path)
    if HAS_TORCHVISION:
        transformers.VJEPA2VideoProcessor(crop_size=32).save_pretrained(path)
        return path
    processor = {"video_processor_type": "VJEPA2VideoProcessor", "crop_size": {"height": 32, "width": 32},
                 "size": {"shortest_edge": 36}, "resample": 2, "do_resize": True, "do_center_crop": True,
                 "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                 "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    (path / "video_preprocessor_config.json").write_text(json.dumps(processor))  # what its save_pretrained writes
    return path


def _upstream_video_pixels(path: Path, frames: list[np.ndarray]) -> torch.Tensor:
    """Upstream's ``VJEPA2VideoProcessor`` where torchvision imports; without it (this project's CPU
    torch has no torchvision wheel) its steps written out: torchvision's uint8 bilinear antialias
    resize on CPU is this ``interpolate`` call, then center crop and ImageNet normalisation."""
    video = np.stack(frames)
    if HAS_TORCHVISION:
        processor = transformers.AutoVideoProcessor.from_pretrained(path)
        return processor(list(video), input_data_format="channels_last", return_tensors="pt")["pixel_values_videos"]
    tensor = torch.from_numpy(video).permute(0, 3, 1, 2).contiguous()
    height, width = tensor.shape[-2:]
    size = (36, int(36 * width / height)) if height <= width else (int(36 * height / width), 36)
    tensor = torch.nn.functional.interpolate(tensor, size=size, mode="bilinear", align_corners=False, antialias=True)
    top, left = (tensor.shape[-2] - 32) // 2, (tensor.shape[-1] - 32) // 2
    crop = tensor[..., top : top + 32, left : left + 32].float()
    mean, std = torch.tensor([0.485, 0.456, 0.406]) * 255, torch.tensor([0.229, 0.224, 0.225]) * 255
    return ((crop - mean.view(3, 1, 1)) / std.view(3, 1, 1)).unsqueeze(0)


def test_vjepa2_video_embedder_equals_upstream(real_frames: list[np.ndarray], tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = _vjepa2(tmp_path / "vjepa2")
    upstream = transformers.VJEPA2Model.from_pretrained(path).eval()
    embedder = VideoEmbedder(Placement("cpu"), path)
    assert embedder.frames == 4 and embedder.dim == 32  # frames_per_clip of the config
    clip = real_frames[:10]
    chosen = [clip[i] for i in (0, 2, 5, 7)]  # 4 frames evenly over 10
    assert sample_indices(10, 4).tolist() == [0, 2, 5, 7]
    with torch.inference_mode():
        tokens = upstream.get_vision_features(_upstream_video_pixels(path, chosen))
    expected = torch.nn.functional.normalize(tokens.mean(dim=1), dim=-1)[0].numpy()
    vector = embedder(clip)
    np.testing.assert_allclose(vector, expected, atol=1e-5, rtol=0)
    assert embedder.calls == 4 and embedder.batches == 1
    assert float(vector @ embedder(real_frames[10:])) < 1 - 1e-4  # other footage, another vector
    short = VideoEmbedder(Placement("cpu"), path, frames=6)
    assert short(clip[:3]).shape == (32,) and sample_indices(3, 6).tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="embeddings.video_frames"):
        VideoEmbedder(Placement("cpu"), path, frames=5)
    with pytest.raises(ValueError, match="one size"):
        embedder([clip[0], real_frames[-1]])
    (path / "video_preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="embeddings.weights: cannot load the V-JEPA 2 model"):
        VideoEmbedder(Placement("cpu"), path)


def test_wrong_directories_are_named_errors(tmp_path: Path) -> None:
    text_only = tmp_path / "bert"
    transformers.BertModel(transformers.BertConfig(vocab_size=64, **TINY)).save_pretrained(text_only)
    with pytest.raises(ValueError, match=r"embeddings.weights: .*'bert' model"):
        ClipImageEmbedder(Placement("cpu"), text_only, batch_frames=1)
    with pytest.raises(ValueError, match=r"embeddings.weights: .*'bert' model"):
        VideoEmbedder(Placement("cpu"), text_only)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    with pytest.raises(ValueError, match=r"embeddings.weights: .*'not-a-model' model"):
        ClipImageEmbedder(Placement("cpu"), unknown, batch_frames=1)
    with pytest.raises(FileNotFoundError, match=r"embeddings.weights: .*\(no config.json\)"):
        ClipImageEmbedder(Placement("cpu"), tmp_path / "missing", batch_frames=1)
    torch.manual_seed(0)
    no_processor = _siglip(tmp_path / "siglip")
    (no_processor / "preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="embeddings.weights: cannot load the siglip model"):
        ClipImageEmbedder(Placement("cpu"), no_processor, batch_frames=1)


@pytest.mark.parametrize("model, build", [("vjepa2", _vjepa2), ("siglip", _siglip)])
def test_clip_embeddings_through_the_graph(model: str, build, demo_bucket: Path, tmp_path: Path) -> None:
    """clip_embeddings on real footage with a configured tower: every clip gets a vector from the
    model the settings name, and its version says which (video: the clip's context frames in order)."""
    from vidassets.config import ConfigError, load_settings
    from vidassets.storage import TableStore, open_object_store
    from vidassets_tests.conftest import MEDIA_STAGES, graph_settings, run_graph, small_bucket

    weights = build(tmp_path / model)
    small_bucket(demo_bucket, tmp_path)
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"embeddings.model": model, "embeddings.weights": str(weights)})
    run_graph(settings, tmp_path, select=[*MEDIA_STAGES, "clip_embeddings"])
    rows = TableStore(open_object_store(str(tmp_path / "store"))).read("clip_embeddings", "licensed/drop-0001")
    assert len(rows) and (rows.status == "ok").all()
    assert rows.producer_version.str.contains(f"{model}-{'video' if model == 'vjepa2' else 'image'}@transformers").all()
    vectors = np.stack([np.frombuffer(v, "<f4") for v in rows.vector])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5) and len({v.tobytes() for v in vectors}) == len(rows)
    with pytest.raises(ConfigError, match="embeddings.weights"):
        load_settings(env={}, overrides={"embeddings.model": model})
