"""The VAE's GPU settings (bf16 weights and inputs for bf16, TF32 off for fp32, channels_last_3d
weights and inputs, the clip converted on the device, cudnn.benchmark, torch.compile of encode) are
applied by the model code under a CUDA placement and never on the CPU: a CPU ``VideoVAE`` computes
exactly what the code before them computed (bit for bit). The CUDA-only branch is exercised on the
CPU through its parts: the weight-layout helper, the bf16-weights loader, the placement's scoped
cudnn.benchmark, the scoped TF32-off, and the settings applied to a CPU instance (same latents within
float rounding; bf16 weights within the tolerance ``vae.py`` states)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vidassets.models.placement import Placement
from vidassets.models.vae import (
    BF16_MAX_REL_ERROR,
    RANDOM_INIT_CONFIG,
    VideoVAE,
    ensure_random_init,
    full_fp32,
    load_vae,
    to_channels_last_3d,
)


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
    assert {p.dtype for p in vae.model.parameters()} == {torch.float32}  # the CPU's bf16 is autocast
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
    """What a CUDA fp32 placement applies, applied to a CPU instance: every 3-D conv weight and the
    input in channels_last_3d, the clip converted where the model is (the same input values, bit
    for bit), TF32 off around the call, the same latents within float rounding (the layout changes
    only the kernels' summation order)."""
    clips = [_clip(seed=2), _clip(seed=5)]
    reference = VideoVAE(Placement(), cache_root=tmp_path).encode_batch(clips)
    vae = VideoVAE(Placement(), cache_root=tmp_path)
    vae._use_gpu_settings(compile_encode=False)
    assert vae.gpu_settings == {"channels_last_3d": True, "cudnn_benchmark": True, "compile_encode": False,
                                "bf16_weights": False, "tf32_off": True, "input_on_device": True}
    fives = [p for p in vae.model.parameters() if p.dim() == 5]
    assert fives and all(p.is_contiguous(memory_format=torch.channels_last_3d) for p in fives)
    assert vae._layout(torch.zeros(1, 3, 5, 8, 8)).is_contiguous(memory_format=torch.channels_last_3d)
    x = vae._input(clips)
    previous = (torch.from_numpy(np.stack(clips)).to(torch.float32) / 127.5 - 1.0).permute(0, 4, 1, 2, 3)
    assert x.dtype == torch.float32 and torch.equal(x, previous)
    assert x.is_contiguous(memory_format=torch.channels_last_3d)
    seen = []
    encode = vae._encode

    def spy(x):
        seen.append((torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision))
        return encode(x)

    before = _tf32_state()
    vae._encode = spy
    got = vae.encode_batch(clips)
    assert seen == [("ieee", "ieee")] and _tf32_state() == before  # off around the call, restored after
    for latents, expected in zip(got, reference, strict=True):
        assert latents.dtype == torch.float32 and latents.is_contiguous()
        assert _rel(latents, expected) < 1e-4
    with pytest.raises(ValueError, match="one shape"):
        vae._input([_clip(seed=0), _clip(frames=5, seed=0)])


def _bf16_gpu_path_on_cpu(tmp_path: Path) -> VideoVAE:
    """A CPU instance set up as a CUDA bf16 placement sets itself up: bf16 weights (the loader),
    bf16 inputs, no autocast, then the GPU settings."""
    import diffusers

    vae = VideoVAE(Placement("cpu", "bf16"), cache_root=tmp_path)
    vae.model = load_vae(diffusers.AutoencoderKLWan, ensure_random_init("AutoencoderKLWan", tmp_path),
                         torch.bfloat16).eval()
    vae._encode = vae.model.encode
    vae._bf16_weights, vae._input_dtype = True, torch.bfloat16
    vae._use_gpu_settings(compile_encode=False)
    return vae


def test_bf16_weights_loader_within_the_stated_tolerance(tmp_path: Path) -> None:
    """``load_vae`` with bf16 (diffusers' ``torch_dtype``) on the tiny random-init VAE built from
    RANDOM_INIT_CONFIG: every weight in bf16, the same values as fp32 weights rounded, and bf16
    inputs through it stay within BF16_MAX_REL_ERROR of the fp32 weights' latents."""
    import diffusers

    path = ensure_random_init("AutoencoderKLWan", tmp_path)
    fp32 = load_vae(diffusers.AutoencoderKLWan, path).eval()
    bf16 = load_vae(diffusers.AutoencoderKLWan, path, torch.bfloat16).eval()
    assert fp32.config.base_dim == RANDOM_INIT_CONFIG["base_dim"]
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    rounded = {name: p.to(torch.bfloat16) for name, p in fp32.named_parameters()}
    assert all(torch.equal(p, rounded[name]) for name, p in bf16.named_parameters())
    errors = []
    for seed in (3, 4):
        x = (torch.from_numpy(_clip(seed=seed)[None]).to(torch.float32) / 127.5 - 1.0).permute(0, 4, 1, 2, 3)
        with torch.no_grad():
            reference = fp32.encode(x).latent_dist.mode()
            got = bf16.encode(x.to(torch.bfloat16)).latent_dist.mode()
        assert got.dtype == torch.bfloat16
        errors.append(_rel(got, reference))
    assert 0 < max(errors) < BF16_MAX_REL_ERROR


def test_bf16_gpu_path_on_cpu_within_the_stated_tolerance(tmp_path: Path) -> None:
    """The CUDA bf16 branch's code on the CPU: bf16 inputs made from uint8 (one rounding of the
    fp32 values), no autocast, no TF32 scope, float32 latents within BF16_MAX_REL_ERROR, and
    decode scales to pixels in float32."""
    clips = [_clip(seed=3), _clip(seed=4)]
    fp32 = VideoVAE(Placement("cpu", "fp32"), cache_root=tmp_path).encode_batch(clips)
    vae = _bf16_gpu_path_on_cpu(tmp_path)
    assert vae.gpu_settings == {"channels_last_3d": True, "cudnn_benchmark": True, "compile_encode": False,
                                "bf16_weights": True, "tf32_off": False, "input_on_device": True}
    x = vae._input(clips)
    fp32_input = (torch.from_numpy(np.stack(clips)).to(torch.float32) / 127.5 - 1.0).permute(0, 4, 1, 2, 3)
    assert x.dtype == torch.bfloat16 and torch.equal(x, fp32_input.to(torch.bfloat16))
    assert x.is_contiguous(memory_format=torch.channels_last_3d)
    got = vae.encode_batch(clips)
    errors = [_rel(b, f) for b, f in zip(got, fp32, strict=True)]
    assert all(latents.dtype == torch.float32 for latents in got)
    assert 0 < max(errors) < BF16_MAX_REL_ERROR
    video = vae.decode(got[0])
    assert video.dtype == np.uint8 and video.shape[-1] == 3


def _tf32_state() -> tuple:
    backends = torch.backends
    precisions = (backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision,
                  backends.cuda.matmul.fp32_precision, backends.fp32_precision)
    try:
        legacy = (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        legacy = "mixed"
    return precisions, legacy


@pytest.fixture
def tf32_flags():
    """The process's TF32 flags, put back after the test (it sets them)."""
    backends = torch.backends
    saved = _tf32_state()
    yield
    (conv, rnn, matmul, everything), legacy = saved
    if legacy != "mixed":
        backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = legacy
    backends.fp32_precision = everything
    backends.cudnn.conv.fp32_precision, backends.cudnn.rnn.fp32_precision = conv, rnn
    backends.cuda.matmul.fp32_precision = matmul
    assert _tf32_state() == saved


def test_full_fp32_scope_turns_tf32_off_and_restores_the_flags(tf32_flags) -> None:
    backends = torch.backends
    setups = {"as the process has them": lambda: None,
              "legacy: cuDNN off, matmul on": lambda: (setattr(backends.cudnn, "allow_tf32", False),
                                                       setattr(backends.cuda.matmul, "allow_tf32", True)),
              "legacy: both on": lambda: (setattr(backends.cudnn, "allow_tf32", True),
                                          setattr(backends.cuda.matmul, "allow_tf32", True)),
              "new API, mixed with legacy": lambda: setattr(backends.cudnn.conv, "fp32_precision", "ieee")}
    for name, setup in setups.items():
        setup()
        before = _tf32_state()
        with full_fp32():
            inside = _tf32_state()
            assert backends.cudnn.conv.fp32_precision == "ieee", name
            assert backends.cuda.matmul.fp32_precision == "ieee", name
            if before[1] != "mixed":  # both APIs read the same inside: TF32 off
                assert inside[1] == (False, False), name
        assert _tf32_state() == before, name
        with pytest.raises(RuntimeError, match="restored"), full_fp32():
            raise RuntimeError("restored on errors too")
        assert _tf32_state() == before, name


def test_cpu_and_bf16_placements_leave_tf32_alone(tmp_path: Path, tf32_flags) -> None:
    """TF32 off is an fp32 CUDA setting: no CPU instance and no bf16 one enters the scope."""
    seen = []
    for vae in (VideoVAE(Placement("cpu", "fp32"), cache_root=tmp_path), _bf16_gpu_path_on_cpu(tmp_path)):
        encode = vae._encode

        def spy(x, encode=encode):
            seen.append(_tf32_state())
            return encode(x)

        vae._encode = spy
        vae.encode(_clip(seed=6))
    assert seen == [_tf32_state()] * 2


def test_bf16_within_the_stated_tolerance(tmp_path: Path) -> None:
    clips = [_clip(seed=3), _clip(seed=4)]
    fp32 = VideoVAE(Placement("cpu", "fp32"), cache_root=tmp_path).encode_batch(clips)
    bf16 = VideoVAE(Placement("cpu", "bf16"), cache_root=tmp_path).encode_batch(clips)
    errors = [_rel(b, f) for b, f in zip(bf16, fp32, strict=True)]
    assert 0 < max(errors) < BF16_MAX_REL_ERROR  # bf16 does move latents, and no further than stated
