"""Video VAE encoder/decoder: any diffusers video autoencoder class (``AutoencoderKLWan`` by default)
loaded with ``from_pretrained`` from a local directory.

Under a CUDA placement the model code applies the GPU settings itself (none of them on the CPU,
whose path stays as it was, bit for bit):

- the compute dtype is the weights' dtype: bf16 loads the weights in bf16 (``load_vae``:
  diffusers' ``from_pretrained(..., torch_dtype=torch.bfloat16)``, which keeps a class's
  ``_keep_in_fp32_modules`` in fp32; ``AutoencoderKLWan`` has none, its RMS norm and upsampling
  compute in fp32 themselves) and feeds bf16 inputs, no autocast (measured on an H200,
  ``bench/results/gpu_check.json``: 0.99 s an 81x480x832 encode against 1.17 s with fp32 weights
  under bf16 autocast); fp32 computes in IEEE fp32, TF32 off for this model's calls (``full_fp32``:
  cuDNN's TF32 default moved the latents 1.2e-3 relative from the CPU's, 4.2e-6 without it);
- the 3-D convolution weights and every input in ``channels_last_3d`` layout;
- cuDNN's algorithm search (``cudnn.benchmark``), scoped to this model's calls;
- the clip goes to the device as uint8 and is converted and normalised there (``_device_input``);
- when asked (``compile_encode``), ``torch.compile`` of ``encode``.

``gpu_settings`` records what an instance applies; ``bench/gpu_check.py`` measures each setting
through this class. On the CPU a bf16 placement keeps fp32 weights under bf16 autocast, as before.

Without configured weights a tiny **random-init** Wan VAE is built from a fixed seed, saved with
``save_pretrained`` and loaded back through the same ``from_pretrained`` path real weights take.
Its latents carry no meaning (they prove the plumbing) and its version string says
``random-init``. Latents are the posterior mode (deterministic), not a sample."""

from __future__ import annotations

import contextlib
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
max |fp32|. Measured on the CPU, fp32 weights under bf16 autocast (the CPU's bf16): 0.007-0.008 for
the tiny random-init VAE on 9x32x32, 0.013 for a Wan2.1-sized one on 5x64x64. bf16 weights and
inputs (``load_vae``, a CUDA placement's bf16) give bitwise the same latents as that autocast on the
CPU for both random-init VAEs (autocast rounds every convolution's weights and input to bf16 too):
0.006-0.008 for the tiny one on six 9x32x32 clips, 0.018-0.020 for the Wan2.1-sized one on two
5x64x64 clips of ``vidassets_tests/test_vae_cuda_settings.py``'s generator. On an H200 the
Wan2.1-sized one under autocast measured 0.018 on 9x128x128 against the CPU's fp32
(``bench/results/gpu_check.json``). ``vidassets_tests/test_vae_cuda_settings.py`` tests the tiny
one both ways; ``bench/gpu_check.py`` measures a Wan2.1-sized one on a GPU."""


def to_channels_last_3d(module):
    """``module``'s 5-D parameters (the 3-D convolution weights) in ``channels_last_3d`` layout, in
    place; other parameters untouched. Only the memory layout changes, not a value."""
    import torch

    for param in module.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
    return module


def load_vae(cls, path: str | Path, weights_dtype=None):
    """``cls.from_pretrained(path)`` with the weights in ``weights_dtype`` (a ``torch.dtype``; None:
    as stored, fp32 for our VAEs). A dtype goes through diffusers' ``torch_dtype``, which casts on
    load and keeps the class's ``_keep_in_fp32_modules`` in fp32 (diffusers then needs
    ``low_cpu_mem_usage``; otherwise it stays off, as the fp32 load has it)."""
    if weights_dtype is None:
        return cls.from_pretrained(str(path), low_cpu_mem_usage=False)
    kwargs = {} if getattr(cls, "_keep_in_fp32_modules", None) else {"low_cpu_mem_usage": False}
    return cls.from_pretrained(str(path), torch_dtype=weights_dtype, **kwargs)


@contextlib.contextmanager
def full_fp32():
    """Context in which CUDA float32 convolutions (cuDNN) and matmuls compute in IEEE fp32, not
    TF32 (cuDNN's convolutions default to TF32), every flag restored on exit as it was, so that
    other models of the process keep their setting (as ``Placement.cudnn_benchmark`` does for
    cudnn.benchmark). Sets the per-operation precisions (``torch.backends.cudnn.conv`` / ``.rnn`` /
    ``torch.backends.cuda.matmul`` ``.fp32_precision``, torch >= 2.9) and the legacy
    ``allow_tf32`` flags too, so that both read consistently inside; the legacy flags are left alone
    where the process has already mixed the two APIs (torch then refuses to read them)."""
    import torch

    backends = torch.backends
    try:
        knobs = (backends.cudnn.conv, backends.cudnn.rnn, backends.cuda.matmul)
        precisions = tuple(knob.fp32_precision for knob in knobs)
    except AttributeError:  # torch before 2.9: the legacy flags only
        knobs, precisions = (), ()
    try:
        legacy = (backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # "a mix of the legacy and new APIs": unreadable, so not restorable either
        legacy = None
    try:
        if legacy is not None:
            backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = False
        for knob in knobs:
            knob.fp32_precision = "ieee"
        yield
    finally:
        if legacy is not None:
            backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32 = legacy
        for knob, precision in zip(knobs, precisions, strict=True):
            knob.fp32_precision = precision


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
        # a CUDA placement computes bf16 in bf16 weights; the CPU keeps fp32 weights (bf16: autocast)
        self._bf16_weights = placement.cuda and placement.dtype == "bf16"
        self._input_dtype = torch.bfloat16 if self._bf16_weights else torch.float32
        self.model = load_vae(cls, load_from, self._input_dtype if self._bf16_weights else None)
        self.model = self.model.to(self.device).eval()
        config = self.model.config
        self.temporal_factor = int(getattr(config, "scale_factor_temporal", None) or 4)
        self.spatial_factor = int(getattr(config, "scale_factor_spatial", None) or 8)
        self.calls = self.batches = 0
        self._encode = self.model.encode
        self._channels_last = False
        self._full_fp32 = False
        self.gpu_settings: dict[str, bool] = {}
        """The GPU settings this instance applies (empty on the CPU)."""
        if placement.cuda:
            self._use_gpu_settings(compile_encode)

    def _use_gpu_settings(self, compile_encode: bool) -> None:
        """channels_last_3d weights and inputs, the clip converted on the device, cudnn.benchmark
        around each call (the placement's ``cudnn_benchmark``), TF32 off around each fp32 call
        (``full_fp32``), ``torch.compile`` of ``encode`` if asked. Called under CUDA placement only
        (the bf16 weights are the loader's: ``load_vae``)."""
        import torch

        to_channels_last_3d(self.model)
        self._channels_last = True
        self._full_fp32 = self._placement.dtype == "fp32"
        if compile_encode:
            self._encode = torch.compile(self.model.encode)
        self.gpu_settings = {"channels_last_3d": True, "cudnn_benchmark": True, "compile_encode": bool(compile_encode),
                             "bf16_weights": self._bf16_weights, "tf32_off": self._full_fp32,
                             "input_on_device": True}

    def _layout(self, x):
        import torch

        return x.contiguous(memory_format=torch.channels_last_3d) if self._channels_last else x

    def _context(self):
        """no_grad plus the precision settings of this instance's calls: bf16 autocast on the CPU
        (``Placement.autocast``; a CUDA placement's bf16 is in its weights), cudnn.benchmark and
        TF32 off (fp32) under CUDA."""
        import torch

        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        if not self._bf16_weights:
            stack.enter_context(self._placement.autocast())
        stack.enter_context(self._placement.cudnn_benchmark())
        if self._full_fp32:
            stack.enter_context(full_fp32())
        return stack

    def _input(self, clips: Sequence[np.ndarray]):
        """The model's input for clips of one shape (T, H, W, 3) uint8: (N, 3, T, H, W) in [-1, 1]."""
        import torch

        if self._channels_last:
            return self._device_input(clips)
        x = torch.from_numpy(np.ascontiguousarray(np.stack(clips))).to(self.device, torch.float32)
        return (x / 127.5 - 1.0).permute(0, 4, 1, 2, 3)

    def _device_input(self, clips: Sequence[np.ndarray]):
        """The GPU path's input: each clip copied to the device as it is (uint8: a quarter of
        float32's bytes, no host-side stacking), converted to float32 and normalised there (the
        values the CPU path computes; a blocking ``.to(device, torch.float32)`` would convert on
        the CPU and move four times the bytes), then one rounding to the weights' dtype written
        straight into ``channels_last_3d`` (the permuted clip already has that layout: no copy in
        fp32)."""
        import torch

        if not clips:
            raise ValueError("no clips to encode")
        first = np.asarray(clips[0])
        dtype = torch.from_numpy(np.empty(0, first.dtype)).dtype  # uint8 for video frames
        x = torch.empty((len(clips), *first.shape), dtype=dtype, device=self.device)
        for i, clip in enumerate(clips):
            clip = np.asarray(clip)
            if clip.shape != first.shape:
                raise ValueError(f"clips of one shape per run: {clip.shape} after {first.shape}")
            if not clip.flags.writeable:  # torch.from_numpy warns on read-only arrays
                clip = clip.copy()
            x[i].copy_(torch.from_numpy(np.ascontiguousarray(clip)))
        x = x.to(torch.float32).div_(127.5).sub_(1.0)
        return x.permute(0, 4, 1, 2, 3).to(self._input_dtype, memory_format=torch.channels_last_3d)

    def encode(self, frames: np.ndarray):
        """(T, H, W, 3) uint8 RGB -> latents (C, T', H', W') float32 tensor on the CPU."""
        return self.encode_batch([frames])[0]

    def encode_batch(self, clips: Sequence[np.ndarray]) -> list:
        """Clips of one shape (T, H, W, 3) uint8 RGB, encoded in one run -> latents per clip (as
        ``encode`` gives them, within float rounding: the batch changes the kernels' summation
        order). On a GPU a run of several short clips uses the chip better than one clip a run."""
        x = self._layout(self._input(clips))
        with self._context():
            latents = self._encode(x).latent_dist.mode()
        self.calls += len(clips)
        self.batches += 1
        record_calls(len(clips))
        if self._channels_last:  # one float32, contiguous transfer for the run
            return list(latents.float().contiguous().cpu())
        return [clip.float().cpu() for clip in latents]

    def decode(self, latents) -> np.ndarray:
        """Latents (C, T', H', W') -> (T, H, W, 3) uint8 RGB."""
        import torch

        with self._context():
            video = self.model.decode(self._layout(latents.to(self.device, self._input_dtype).unsqueeze(0))).sample[0]
        if self._bf16_weights:  # bf16 resolves 1 in [128, 256): scale to pixels in float32
            video = video.float()
        video = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return video.permute(1, 2, 3, 0).cpu().numpy()
