"""The VAE's GPU settings (channels_last_3d weights and inputs, cudnn.benchmark, torch.compile of
encode) are applied by the model code under a CUDA placement and never on the CPU: a CPU
``VideoVAE`` computes exactly what the code before them computed (bit for bit). The CUDA-only
branch is exercised on the CPU through its parts: the weight-layout helper, the placement's scoped
cudnn.benchmark, and the settings applied to a CPU instance (same latents within float rounding).
bf16 stays within the tolerance ``vae.py`` states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidassets.models.placement import Placement
from vidassets.models.vae import BF16_MAX_REL_ERROR, VideoVAE, to_channels_last_3d


def _clip(frames: int = 9, size: int = 32, seed: int = 0) -> np.ndarray:
    """(T, H, W, 3) uint8: moving gradients with mild noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames)[:, None, None, None]
    y = np.linspace(0, 1, size)[None, :, None, None]
    x = np.linspace(0, 1, size)[None, None, :, None]
    c = np.arange(3)[None, None, None, :]
    clip = 0.5 + 0.35 * np.sin(2 * np.pi * (1.5 * x + 0.7 * y + 0.05 * t) + c) + rng.normal(0, 0.03, (frames, size, size, 3))
    return (np.clip(clip, 0, 1) * 255).round().astype(np.uint8)


def _previous_encode(model, clips: list[np.ndarray], placement: Placement) -> torch.Tensor:
    """``VideoVAE.encode_batch`` as it was before the GPU settings (the CPU path must not move)."""
    x = torch.from_numpy(np.ascontiguousarray(np.stack(clips))).to("cpu", torch.float32)
    x = (x / 127.5 - 1.0).permute(0, 4, 1, 2, 3)
    with torch.no_grad(), placement.autocast():
        return model.encode(x).latent_dist.mode()


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cpu_placement_applies_no_gpu_setting_and_computes_what_it_did(tmp_path: Path, dtype: str) -> None:
    benchmark = torch.backends.cudnn.benchmark
    placement = Placement("cpu", dtype)
    vae = VideoVAE(placement, cache_root=tmp_path)
    assert vae.gpu_settings == {}
    assert vae._encode == vae.model.encode  # not compiled
    assert all(p.is_contiguous() for p in vae.model.parameters())  # no channels_last_3d weights
    clips = [_clip(seed=0), _clip(seed=1)]
    got = vae.encode_batch(clips)
    assert torch.backends.cudnn.benchmark == benchmark
    expected = _previous_encode(vae.model, clips, placement)
    for latents, reference in zip(got, expected, strict=True):
        assert torch.equal(latents, reference.float())
    assert torch.equal(vae.encode(clips[0]), _previous_encode(vae.model, clips[:1], placement)[0].float())
    # decode as before too
    with torch.no_grad(), placement.autocast():
        video = vae.model.decode(got[0].unsqueeze(0)).sample[0]
    previous = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()
    assert np.array_equal(vae.decode(got[0]), previous)


def test_channels_last_3d_helper_converts_5d_weights_only() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv3d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3), torch.nn.Linear(8, 4))
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    assert to_channels_last_3d(module) is module
    for name, param in module.named_parameters():
        assert torch.equal(param, before[name])  # a layout change, not a value change
        if param.dim() == 5:
            assert param.is_contiguous(memory_format=torch.channels_last_3d)
            assert not param.is_contiguous()
        else:
            assert param.is_contiguous()
    x = torch.randn(1, 3, 4, 6, 6)
    assert module[0](x.contiguous(memory_format=torch.channels_last_3d)).shape == (1, 8, 4, 6, 6)


def test_cudnn_benchmark_is_scoped_to_cuda_placements() -> None:
    before = torch.backends.cudnn.benchmark
    with Placement("cpu").cudnn_benchmark():
        assert torch.backends.cudnn.benchmark == before
    for state in (False, True):  # the flag flips without a GPU: the CUDA branch runs here
        torch.backends.cudnn.benchmark = state
        with Placement("cuda:0").cudnn_benchmark():
            assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.benchmark is state
        with pytest.raises(RuntimeError), Placement("cuda:0", "bf16").cudnn_benchmark():
            raise RuntimeError("restored on errors too")
        assert torch.backends.cudnn.benchmark is state
    torch.backends.cudnn.benchmark = before


def test_gpu_settings_keep_latents(tmp_path: Path) -> None:
    """What a CUDA placement applies, applied to a CPU instance: every 3-D conv weight and the input
    in channels_last_3d, the same latents within float rounding (the layout changes only the
    kernels' summation order)."""
    clips = [_clip(seed=2)]
    reference = VideoVAE(Placement(), cache_root=tmp_path).encode_batch(clips)[0]
    vae = VideoVAE(Placement(), cache_root=tmp_path)
    vae._use_gpu_settings(compile_encode=False)
    assert vae.gpu_settings == {"channels_last_3d": True, "cudnn_benchmark": True, "compile_encode": False,
                                "bf16_autocast": False}
    fives = [p for p in vae.model.parameters() if p.dim() == 5]
    assert fives and all(p.is_contiguous(memory_format=torch.channels_last_3d) for p in fives)
    assert vae._layout(torch.zeros(1, 3, 5, 8, 8)).is_contiguous(memory_format=torch.channels_last_3d)
    assert _rel(vae.encode_batch(clips)[0], reference) < 1e-4


def test_bf16_within_the_stated_tolerance(tmp_path: Path) -> None:
    clips = [_clip(seed=3), _clip(seed=4)]
    fp32 = VideoVAE(Placement("cpu", "fp32"), cache_root=tmp_path).encode_batch(clips)
    bf16 = VideoVAE(Placement("cpu", "bf16"), cache_root=tmp_path).encode_batch(clips)
    errors = [_rel(b, f) for b, f in zip(bf16, fp32, strict=True)]
    assert 0 < max(errors) < BF16_MAX_REL_ERROR  # bf16 does move latents, and no further than stated
