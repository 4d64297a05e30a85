"""Video VAE encoder/decoder: the published diffusers video autoencoder layouts
(``AutoencoderKLWan``, ``AutoencoderKLHunyuanVideo``, ``AutoencoderKLCogVideoX``,
``AutoencoderKLLTXVideo``), loaded with ``from_pretrained`` from a local ``save_pretrained``
directory (or a pipeline snapshot's ``vae/`` folder). The class is the one the snapshot's
``config.json`` names (``_class_name``); a configured class that disagrees is an error.

Latents come out the way each class's diffusers pipeline feeds them to its transformer
(``LatentNormalisation``: Wan ``(z - mean) / std``, HunyuanVideo and CogVideoX ``z * scaling_factor``,
LTX-Video ``(z - mean) * scaling_factor / std``) and ``decode`` takes them back the same way. The
clip shapes a class encodes follow from its config (``VaeLayout``: ``r*k+1`` frames for temporal
compression ``r``, sides a multiple of the spatial compression); other shapes are a ValueError,
not a crash inside diffusers.

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
from dataclasses import dataclass
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
        return cls.from_pretrained(str(path), low_cpu_mem_usage=False, local_files_only=True)
    kwargs = {} if getattr(cls, "_keep_in_fp32_modules", None) else {"low_cpu_mem_usage": False}
    return cls.from_pretrained(str(path), torch_dtype=weights_dtype, local_files_only=True, **kwargs)


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


# ---------------------------------------------------------------- published layouts

PLACEHOLDER_CLASS = "AutoencoderKLWan"
"""The class of the random-init placeholder (no ``latents.vae_path``)."""

NORMALISATIONS = {
    "AutoencoderKLWan": "meanstd",
    "AutoencoderKLHunyuanVideo": "scale",
    "AutoencoderKLCogVideoX": "scale",
    "AutoencoderKLLTXVideo": "meanstd-scale",
}
"""The supported classes and the latent normalisation each one's diffusers pipelines apply before
the transformer (``LatentNormalisation``); the name goes into the model's version. One exception
(``normalisation_name``): a Wan VAE whose config declares no statistics and whose ``z_dim`` does not
fit diffusers' default ones (Wan2.1's 16 channels) has none to apply: ``none``, raw latents."""

CLASS_DEFAULTS: dict[str, dict] = {
    "AutoencoderKLWan": {"temperal_downsample": [False, True, True], "patch_size": None,
                         "scale_factor_temporal": 4, "scale_factor_spatial": 8, "z_dim": 16},
    "AutoencoderKLHunyuanVideo": {"temporal_compression_ratio": 4, "spatial_compression_ratio": 8},
    "AutoencoderKLCogVideoX": {"temporal_compression_ratio": 4, "block_out_channels": [128, 256, 256, 512]},
    "AutoencoderKLLTXVideo": {"patch_size": 4, "patch_size_t": 1, "spatio_temporal_scaling": [True, True, True, False],
                              "spatial_compression_ratio": None, "temporal_compression_ratio": None},
}
"""diffusers' ``__init__`` defaults of the config keys the layout reads (a ``config.json`` may omit
a key at its default), so that a layout is read from the JSON alone, without importing diffusers
(the settings validate against it). ``vidassets_tests/test_vae_layouts.py`` checks them against
the installed classes."""


def vae_dir(path: str | Path) -> Path:
    """The VAE's ``save_pretrained`` directory: ``path`` itself when it holds ``config.json``, its
    ``vae/`` folder when ``path`` is a diffusers pipeline snapshot (``model_index.json``, the
    layout the models are published in). Otherwise FileNotFoundError naming ``latents.vae_path``."""
    root = Path(path)
    if (root / "config.json").is_file():
        return root
    if (root / "model_index.json").is_file() and (root / "vae" / "config.json").is_file():
        return root / "vae"
    raise FileNotFoundError(f"latents.vae_path: {root} holds neither config.json (a VAE saved with save_pretrained) "
                            "nor model_index.json with vae/config.json (a diffusers pipeline snapshot)")


def snapshot_config(path: str | Path) -> dict:
    """The VAE's ``config.json`` as written by diffusers (a ValueError naming the file if it is not JSON)."""
    config_file = vae_dir(path) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"latents.vae_path: {config_file} is not a diffusers config (JSON): {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"latents.vae_path: {config_file} is not a diffusers config (a JSON object)")
    return config


def declared_config(path: str | Path | None) -> dict:
    """The config a VAE is built from as ``config.json`` states it: the placeholder's without a path."""
    return RANDOM_INIT_CONFIG if path is None else snapshot_config(path)


def resolve_class(class_name: str | None = None, path: str | Path | None = None) -> str:
    """The VAE class to load: the snapshot's ``_class_name`` (the configured ``latents.vae_class``
    must agree with it when set), the placeholder's without a path. Unsupported classes and a
    disagreement are a ValueError naming both."""
    if path is None:
        if class_name not in (None, PLACEHOLDER_CLASS):
            raise ValueError(f"latents.vae_class {class_name!r} needs latents.vae_path: the random-init placeholder "
                             f"(no path) is an {PLACEHOLDER_CLASS}")
        return PLACEHOLDER_CLASS
    declared = snapshot_config(path).get("_class_name")
    if declared and class_name and declared != class_name:
        raise ValueError(f"latents.vae_class is {class_name!r} but the snapshot latents.vae_path {path} is an "
                         f"{declared!r} (its config.json _class_name): unset latents.vae_class to use the snapshot's")
    chosen = declared or class_name
    if not chosen:
        raise ValueError(f"latents.vae_path {path}: config.json names no _class_name; set latents.vae_class")
    if chosen not in NORMALISATIONS:
        raise ValueError(f"latents.vae_path {path} is an {chosen!r}; the supported video VAE classes are "
                         f"{', '.join(NORMALISATIONS)}")
    return chosen


def describe_vae(class_name: str | None = None, path: str | Path | None = None, tiling: bool = False) -> str:
    """What of a VAE changes its latents, for its version (the weights digest aside), read from the
    config alone: the class (``-random-init-<id>`` for the placeholder), the latent normalisation
    (``+norm-<name>``) and tiled encoding (``+tiled``: tiles move latents slightly)."""
    resolved = resolve_class(class_name, path)
    base = resolved if path is not None else f"{resolved}-random-init-{random_init_id(resolved)}"
    return f"{base}+norm-{normalisation_name(resolved, declared_config(path))}" + ("+tiled" if tiling else "")


def normalisation_name(class_name: str, config: dict) -> str:
    """The normalisation a class's config gets (``NORMALISATIONS``). Wan's statistics are the
    config's ``latents_mean`` / ``latents_std`` (diffusers fills in Wan2.1's 16 channel ones where
    ``config.json`` omits them): listed ones must have ``z_dim`` values each (a ValueError
    otherwise); omitted ones that do not fit ``z_dim`` leave nothing to normalise with (``none``)."""
    name = NORMALISATIONS[class_name]
    if class_name != "AutoencoderKLWan":
        return name
    z_dim = config.get("z_dim", CLASS_DEFAULTS[class_name]["z_dim"])
    if "latents_mean" in config or "latents_std" in config:
        mean, std = config.get("latents_mean"), config.get("latents_std")
        if not (isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) == z_dim):
            raise ValueError(f"{class_name} config: latents_mean and latents_std must list z_dim={z_dim} values "
                             "each (WanPipeline normalises latents with them)")
        return name
    return name if z_dim == CLASS_DEFAULTS[class_name]["z_dim"] else "none"


@dataclass(frozen=True)
class VaeLayout:
    """The clip shapes a VAE encodes: ``temporal_compression * k + 1`` frames (the causal first
    frame alone, then ``r`` frames a latent frame) and sides a multiple of ``spatial_compression``."""

    class_name: str
    temporal_compression: int
    spatial_compression: int

    @property
    def frame_rule(self) -> str:
        return f"{self.temporal_compression}k+1"

    @property
    def spatial_multiple(self) -> int:
        """What every bucket side must be a multiple of (the spatial compression)."""
        return self.spatial_compression

    def valid_frames(self, frames: int) -> bool:
        return frames >= 1 and (frames - 1) % self.temporal_compression == 0

    def check_frame_buckets(self, buckets: Sequence[int], setting: str = "latents.frame_buckets") -> tuple[int, ...]:
        """``buckets`` if every one fits the frame rule, else a ValueError naming ``setting``."""
        bad = [int(f) for f in buckets if not self.valid_frames(int(f))]
        if bad or not buckets:
            raise ValueError(f"{setting} {list(buckets)}: {self.class_name} encodes {self.frame_rule} frames "
                             f"(temporal compression {self.temporal_compression}); not of that form: {bad or 'none given'}")
        return tuple(buckets)

    def check_clip_shape(self, frames: int, height: int, width: int) -> None:
        """A ValueError unless a (frames, height, width) clip has a shape this VAE encodes."""
        if not self.valid_frames(frames):
            raise ValueError(f"a clip of {frames} frames: {self.class_name} encodes {self.frame_rule} frames "
                             f"(temporal compression {self.temporal_compression}); see latents.frame_buckets")
        if height % self.spatial_compression or width % self.spatial_compression:
            raise ValueError(f"a {width}x{height} clip: {self.class_name} needs sides that are multiples of "
                             f"{self.spatial_compression} (its spatial compression)")


def read_layout(class_name: str | None = None, path: str | Path | None = None) -> VaeLayout:
    """The layout of the VAE ``latents.vae_class`` / ``latents.vae_path`` name, from its config
    alone (no weights, no diffusers import). Each compression is the one the class and its pipeline
    compute: Wan ``2**sum(temperal_downsample)`` and ``2**len(temperal_downsample) * patch_size``
    (``WanPipeline`` reads ``scale_factor_temporal`` / ``_spatial``, which must agree), HunyuanVideo
    its ``*_compression_ratio``, CogVideoX ``temporal_compression_ratio`` and
    ``2**(len(block_out_channels) - 1)`` (``CogVideoXPipeline.__init__``), LTX-Video its
    ``*_compression_ratio`` or ``patch_size[_t] * 2**sum(spatio_temporal_scaling)``
    (``AutoencoderKLLTXVideo.__init__``)."""
    resolved = resolve_class(class_name, path)
    declared = declared_config(path)
    config = {**CLASS_DEFAULTS[resolved], **{k: v for k, v in declared.items() if k in CLASS_DEFAULTS[resolved]}}
    if resolved == "AutoencoderKLWan":
        downsample = list(config["temperal_downsample"])
        temporal, spatial = 2 ** sum(map(bool, downsample)), 2 ** len(downsample) * int(config["patch_size"] or 1)
        stated = (config["scale_factor_temporal"], config["scale_factor_spatial"])
        if stated != (temporal, spatial):
            raise ValueError(f"latents.vae_path {path}: scale_factor_temporal/_spatial {stated} disagree with the "
                             f"architecture's compression {(temporal, spatial)} (temperal_downsample, patch_size)")
    elif resolved == "AutoencoderKLCogVideoX":
        temporal, spatial = config["temporal_compression_ratio"], 2 ** (len(config["block_out_channels"]) - 1)
    elif resolved == "AutoencoderKLLTXVideo":
        levels = sum(map(bool, config["spatio_temporal_scaling"]))
        temporal = config["temporal_compression_ratio"] or config["patch_size_t"] * 2 ** levels
        spatial = config["spatial_compression_ratio"] or config["patch_size"] * 2 ** levels
    else:
        temporal, spatial = config["temporal_compression_ratio"], config["spatial_compression_ratio"]
    return VaeLayout(resolved, int(temporal), int(spatial))


class LatentNormalisation:
    """The latent normalisation a class's diffusers pipelines apply between the VAE and the
    transformer (``apply``), and its inverse before decoding (``invert``), with the pipelines'
    own operations (diffusers 0.42.1):

    - ``meanstd`` (Wan): ``(z - latents_mean) * (1 / latents_std)`` per channel, the config's
      lists (``WanImageToVideoPipeline.prepare_latents``); inverse ``z / (1 / latents_std) +
      latents_mean`` (``WanPipeline.__call__`` before ``vae.decode``);
    - ``scale`` (HunyuanVideo, CogVideoX): ``z * scaling_factor``
      (``HunyuanVideoImageToVideoPipeline.prepare_latents``,
      ``CogVideoXVideoToVideoPipeline.prepare_latents``); inverse ``z / scaling_factor``
      (``HunyuanVideoPipeline.__call__``; ``CogVideoXPipeline.decode_latents`` writes ``1 /
      scaling_factor * z``, the same within one rounding). CogVideoX1.5-I2V's
      ``invert_scale_latents`` divides the *image condition* only; video latents are still scaled;
    - ``meanstd-scale`` (LTX-Video): ``(z - latents_mean) * scaling_factor / latents_std`` with the
      model's ``latents_mean`` / ``latents_std`` buffers (``LTXPipeline._normalize_latents``);
      inverse ``z * latents_std / scaling_factor + latents_mean`` (``_denormalize_latents``).

    ``none`` (``normalisation_name``) leaves latents as they are. Computed in float32 on the
    latents' device, on (N, C, T, H, W) latents."""

    def __init__(self, name: str, mean=None, std=None, scaling_factor: float = 1.0):
        self.name, self.mean, self.std, self.scaling_factor = name, mean, std, float(scaling_factor)

    @classmethod
    def of(cls, name: str, model, directory: Path | None = None) -> LatentNormalisation:
        """Normalisation ``name`` (``normalisation_name``) with a loaded model's values: its config,
        and for LTX-Video its statistics buffers as stored in ``directory``'s safetensors (bf16
        weights would have rounded the loaded ones), else as loaded."""
        import torch

        config = model.config
        if name == "meanstd":
            return cls(name, torch.tensor(config.latents_mean, dtype=torch.float32),
                       torch.tensor(config.latents_std, dtype=torch.float32))
        if name == "meanstd-scale":
            mean, std = (_stored_tensor(directory, key) if directory is not None else None
                         for key in ("latents_mean", "latents_std"))
            mean = model.latents_mean if mean is None else mean
            std = model.latents_std if std is None else std
            return cls(name, mean.detach().float().cpu(), std.detach().float().cpu(), config.scaling_factor)
        return cls(name, scaling_factor=config.scaling_factor if name == "scale" else 1.0)

    def _channels(self, values, z):
        return values.view(1, -1, 1, 1, 1).to(z.device, z.dtype)

    def apply(self, z):
        """Raw VAE latents -> what the transformer sees (and what ``VideoVAE.encode`` returns)."""
        if self.name == "meanstd":  # the pipeline multiplies by 1 / latents_std
            return (z - self._channels(self.mean, z)) * (1.0 / self._channels(self.std, z))
        if self.name == "meanstd-scale":
            return (z - self._channels(self.mean, z)) * self.scaling_factor / self._channels(self.std, z)
        return z * self.scaling_factor if self.name == "scale" else z

    def invert(self, z):
        """Normalised latents -> what ``vae.decode`` takes."""
        if self.name == "meanstd":
            return z / (1.0 / self._channels(self.std, z)) + self._channels(self.mean, z)
        if self.name == "meanstd-scale":
            return z * self._channels(self.std, z) / self.scaling_factor + self._channels(self.mean, z)
        return z / self.scaling_factor if self.name == "scale" else z

    def params(self) -> dict:
        """The name and its values (the config's / buffers' mean and std), for a trainer."""
        out: dict = {"name": self.name, "scaling_factor": self.scaling_factor if "scale" in self.name else None}
        if self.mean is not None:
            out.update(mean=self.mean.tolist(), std=self.std.tolist())
        return out


def _stored_tensor(directory: Path, key: str):
    """Tensor ``key`` as stored in a ``save_pretrained`` directory's safetensors (None: not there)."""
    from safetensors import safe_open

    for weights in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as stored:
            if key in stored.keys():
                return stored.get_tensor(key)
    return None


class VideoVAE:
    """One video VAE of a supported published layout, placed: ``encode`` gives normalised latents
    (``latent_normalisation``), ``decode`` takes them back to frames; ``layout`` says which clip
    shapes it encodes."""

    def __init__(self, placement: Placement, class_name: str | None = None, path: str | None = None,
                 tiling: bool = False, cache_root: str | Path = ".vidassets/models", compile_encode: bool = False):
        """``class_name``: ``latents.vae_class``; None takes the snapshot's (with a ``path``) or the
        placeholder's; one that disagrees with the snapshot's ``_class_name`` is a ValueError.
        ``path``: a ``save_pretrained`` directory or a pipeline snapshot holding ``vae/``; None
        builds the random-init placeholder under ``cache_root``. ``tiling``: the model's
        ``enable_tiling()`` (large frames encode and decode in overlapping tiles: less memory,
        slightly other latents). ``compile_encode``: under a CUDA placement, run ``encode``
        through ``torch.compile`` (the first run of each clip shape then compiles; ignored on the CPU)."""
        import diffusers
        import torch

        self.layout = read_layout(class_name, path)
        self.class_name = self.layout.class_name
        self.random_init = path is None
        self.tiling = bool(tiling)
        self.describe = describe_vae(class_name, path, tiling)
        """What of this VAE goes into its version (``describe_vae``)."""
        self._placement = placement
        load_from = ensure_random_init(self.class_name, Path(cache_root)) if path is None else vae_dir(path)
        self.device = torch.device(placement.device)
        # a CUDA placement computes bf16 in bf16 weights; the CPU keeps fp32 weights (bf16: autocast)
        self._bf16_weights = placement.cuda and placement.dtype == "bf16"
        self._input_dtype = torch.bfloat16 if self._bf16_weights else torch.float32
        cls = getattr(diffusers, self.class_name)
        self.model = load_vae(cls, load_from, self._input_dtype if self._bf16_weights else None)
        self.model = self.model.to(self.device).eval()
        self._check_model_layout()
        if self.tiling:
            self.model.enable_tiling()
        self.normalisation = LatentNormalisation.of(normalisation_name(self.class_name, declared_config(path)),
                                                    self.model, load_from)
        self.latent_normalisation = self.normalisation.name
        """The normalisation ``encode`` applies (``NORMALISATIONS``; values: ``normalisation.params()``)."""
        self._decode_timestep = bool(getattr(self.model.config, "timestep_conditioning", False))
        self.temporal_factor, self.spatial_factor = self.temporal_compression, self.spatial_compression  # older names
        self.calls = self.batches = 0
        self._encode = self.model.encode
        self._channels_last = False
        self._full_fp32 = False
        self.gpu_settings: dict[str, bool] = {}
        """The GPU settings this instance applies (empty on the CPU)."""
        if placement.cuda:
            self._use_gpu_settings(compile_encode)

    @property
    def temporal_compression(self) -> int:
        return self.layout.temporal_compression

    @property
    def spatial_compression(self) -> int:
        return self.layout.spatial_compression

    @property
    def spatial_multiple(self) -> int:
        return self.layout.spatial_multiple

    @property
    def frame_rule(self) -> str:
        return self.layout.frame_rule

    def valid_frames(self, frames: int) -> bool:
        return self.layout.valid_frames(frames)

    def check_frame_buckets(self, buckets: Sequence[int], setting: str = "latents.frame_buckets") -> tuple[int, ...]:
        return self.layout.check_frame_buckets(buckets, setting)

    def _check_model_layout(self) -> None:
        """The loaded model's own compression attributes (where the class keeps them) agree with
        the layout read from its config."""
        for attribute, expected in (("temporal_compression_ratio", self.temporal_compression),
                                    ("spatial_compression_ratio", self.spatial_compression)):
            found = vars(self.model).get(attribute)  # not getattr: diffusers would fall back to the config
            if isinstance(found, int | float) and int(found) != expected:
                raise ValueError(f"{self.class_name}: the model's {attribute} {found} is not the {expected} its "
                                 "config gives")

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

    def _check_clips(self, clips: Sequence[np.ndarray]) -> None:
        """Clips of one (T, H, W, 3) shape that this VAE encodes (``layout``), else a ValueError."""
        if not len(clips):
            raise ValueError("no clips to encode")
        shape = np.shape(clips[0])
        for clip in clips:
            if np.shape(clip) != shape:
                raise ValueError(f"clips of one shape per run: {np.shape(clip)} after {shape}")
        if len(shape) != 4 or shape[-1] != 3:
            raise ValueError(f"a clip is (frames, height, width, 3) RGB, got shape {shape}")
        self.layout.check_clip_shape(*shape[:3])

    def encode_batch(self, clips: Sequence[np.ndarray]) -> list:
        """Clips of one shape (T, H, W, 3) uint8 RGB, encoded in one run -> normalised latents
        (C, T', H', W') float32 on the CPU per clip (as ``encode`` gives them, within float
        rounding: the batch changes the kernels' summation order). On a GPU a run of several short
        clips uses the chip better than one clip a run."""
        self._check_clips(clips)
        x = self._layout(self._input(clips))
        with self._context():
            latents = self._encode(x).latent_dist.mode()
        latents = self.normalisation.apply(latents.float())
        self.calls += len(clips)
        self.batches += 1
        record_calls(len(clips))
        if self._channels_last:  # one float32, contiguous transfer for the run
            return list(latents.contiguous().cpu())
        return [clip.cpu() for clip in latents]

    def decode(self, latents) -> np.ndarray:
        """Normalised latents (C, T', H', W'), as ``encode`` gives them -> (T, H, W, 3) uint8 RGB.
        An LTX-Video decoder with ``timestep_conditioning`` decodes at timestep 0 without noise
        (``LTXPipeline``'s default ``decode_timestep``)."""
        import torch

        z = self.normalisation.invert(latents.to(self.device, torch.float32).unsqueeze(0))
        z = self._layout(z.to(self._input_dtype))
        with self._context():
            if self._decode_timestep:
                video = self.model.decode(z, torch.zeros(1, device=self.device, dtype=z.dtype)).sample[0]
            else:
                video = self.model.decode(z).sample[0]
        if self._bf16_weights:  # bf16 resolves 1 in [128, 256): scale to pixels in float32
            video = video.float()
        video = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return video.permute(1, 2, 3, 0).cpu().numpy()
