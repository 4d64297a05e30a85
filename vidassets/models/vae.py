"""Video VAE encoder/decoder: any diffusers video autoencoder class (``AutoencoderKLWan`` by default)
loaded with ``from_pretrained`` from a local directory.

Under a CUDA placement the model code applies the GPU settings itself (none of them on the CPU,
whose path stays as it was): the 3-D convolution weights and every input in ``channels_last_3d``
layout, cuDNN's algorithm search (``cudnn.benchmark``, scoped to this model's calls), bf16 autocast
when the compute dtype is bf16 (``Placement.autocast``), and, when asked (``compile_encode``),
``torch.compile`` of ``encode``. ``bench/gpu_check.py`` measures each of them through this class.

Without configured weights a tiny **random-init** Wan VAE is built from a fixed seed, saved with
``save_pretrained`` and loaded back through the same ``from_pretrained`` path real weights take.
Its latents carry no meaning (they prove the plumbing) and its version string says
``random-init``. Latents are the posterior mode (deterministic), not a sample."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement

RANDOM_INIT_CONFIG = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
                      "temperal_downsample": [False, True, True], "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4}
RANDOM_INIT_SEED = 0

BF16_MAX_REL_ERROR = 0.05
"""Stated tolerance of bf16 against fp32 latents (the same weights and clip): max |bf16 - fp32| over
max |fp32|. Measured on the CPU: 0.007-0.008 for the tiny random-init VAE on 9x32x32, 0.013 for a
Wan2.1-sized one on 5x64x64 (``vidassets_tests/test_vae_cuda_settings.py`` tests the first;
``bench/gpu_check.py`` measures a Wan2.1-sized one on a GPU)."""


def to_channels_last_3d(module):
    """``module``'s 5-D parameters (the 3-D convolution weights) in ``channels_last_3d`` layout, in
    place; other parameters untouched. Only the memory layout changes, not a value."""
    import torch

    for param in module.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
    return module


def random_init_id(class_name: str) -> str:
    config = json.dumps({"class": class_name, "config": RANDOM_INIT_CONFIG, "seed": RANDOM_INIT_SEED}, sort_keys=True)
    return hashlib.sha256(config.encode()).hexdigest()[:12]


def ensure_random_init(class_name: str, cache_root: Path) -> Path:
    """Build (once) the tiny random-init VAE under ``cache_root`` and return its directory."""
    import diffusers
    import torch

    target = cache_root / f"{class_name}-random-init-{random_init_id(class_name)}"
    if (target / "config.json").exists():
        return target
    import shutil
    import tempfile

    torch.manual_seed(RANDOM_INIT_SEED)
    model = getattr(diffusers, class_name)(**RANDOM_INIT_CONFIG)
    cache_root.mkdir(parents=True, exist_ok=True)
    # a private temp dir per process: concurrent runs (one per drop under the daemon) may build it at once
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_root))
    try:
        model.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first; its copy is identical (same seed and config)
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class VideoVAE:
    def __init__(self, placement: Placement, class_name: str = "AutoencoderKLWan", path: str | None = None,
                 cache_root: str | Path = ".vidassets/models", compile_encode: bool = False):
        """``compile_encode``: under a CUDA placement, run ``encode`` through ``torch.compile`` (the
        first run of each clip shape then compiles; ignored on the CPU)."""
        import diffusers
        import torch

        self.random_init = path is None
        self._placement = placement
        load_from = ensure_random_init(class_name, Path(cache_root)) if path is None else Path(path)
        cls = getattr(diffusers, class_name, None)
        if cls is None:
            raise ValueError(f"latents.vae_class: diffusers has no class {class_name!r}")
        self.device = torch.device(placement.device)
        self.model = cls.from_pretrained(str(load_from), low_cpu_mem_usage=False).to(self.device).eval()
        config = self.model.config
        self.temporal_factor = int(getattr(config, "scale_factor_temporal", None) or 4)
        self.spatial_factor = int(getattr(config, "scale_factor_spatial", None) or 8)
        self.calls = self.batches = 0
        self._encode = self.model.encode
        self._channels_last = False
        self.gpu_settings: dict[str, bool] = {}
        """The GPU settings this instance applies (empty on the CPU)."""
        if placement.cuda:
            self._use_gpu_settings(compile_encode)

    def _use_gpu_settings(self, compile_encode: bool) -> None:
        """channels_last_3d weights and inputs, cudnn.benchmark around each call (the placement's
        ``cudnn_benchmark``), ``torch.compile`` of ``encode`` if asked. Called under CUDA placement
        only."""
        import torch

        to_channels_last_3d(self.model)
        self._channels_last = True
        if compile_encode:
            self._encode = torch.compile(self.model.encode)
        self.gpu_settings = {"channels_last_3d": True, "cudnn_benchmark": True, "compile_encode": bool(compile_encode),
                             "bf16_autocast": self._placement.dtype == "bf16"}

    def _layout(self, x):
        import torch

        return x.contiguous(memory_format=torch.channels_last_3d) if self._channels_last else x

    def encode(self, frames: np.ndarray):
        """(T, H, W, 3) uint8 RGB -> latents (C, T', H', W') float32 tensor on the CPU."""
        return self.encode_batch([frames])[0]

    def encode_batch(self, clips: Sequence[np.ndarray]) -> list:
        """Clips of one shape (T, H, W, 3) uint8 RGB, encoded in one run -> latents per clip (as
        ``encode`` gives them, within float rounding: the batch changes the kernels' summation
        order). On a GPU a run of several short clips uses the chip better than one clip a run."""
        import torch

        x = torch.from_numpy(np.ascontiguousarray(np.stack(clips))).to(self.device, torch.float32)
        x = self._layout((x / 127.5 - 1.0).permute(0, 4, 1, 2, 3))
        with torch.no_grad(), self._placement.autocast(), self._placement.cudnn_benchmark():
            latents = self._encode(x).latent_dist.mode()
        self.calls += len(clips)
        self.batches += 1
        record_calls(len(clips))
        return [clip.float().cpu() for clip in latents]

    def decode(self, latents) -> np.ndarray:
        """Latents (C, T', H', W') -> (T, H, W, 3) uint8 RGB."""
        import torch

        with torch.no_grad(), self._placement.autocast(), self._placement.cudnn_benchmark():
            video = self.model.decode(self._layout(latents.to(self.device, torch.float32).unsqueeze(0))).sample[0]
        video = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return video.permute(1, 2, 3, 0).cpu().numpy()
