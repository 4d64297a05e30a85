"""Video clip embeddings from a video encoder: a clip's frames -> one L2-normalised vector.

The slot loads a V-JEPA 2 encoder (``VJEPA2Model``, transformers) from a local ``save_pretrained``
directory: config.json + safetensors + video_preprocessor_config.json, the layout of the published
``facebook/vjepa2-*`` snapshots. ``frames`` frames are sampled evenly from the clip, preprocessed as
``VJEPA2VideoProcessor`` does, and encoded with ``get_vision_features`` (the encoder alone, the
predictor skipped), as the published feature-extraction usage does.

Pooling: ``VJEPA2Model`` has no pooler. Its published classifiers (``VJEPA2ForVideoClassification``)
put an attentive pooler trained with each task's head on top of the frozen encoder, so a task-free
clip vector is the mean of the encoder's output tokens (``last_hidden_state``), L2-normalised.

Preprocessing: upstream's ``VJEPA2VideoProcessor`` runs only with torchvision installed, and
PyPI's torchvision wheel is the CUDA build, which fails to import next to the CPU torch this
project pins (the +cpu build is on the PyTorch index only). So this module applies the same steps
with torch alone (``_VideoTransform``), from the directory's processor config as upstream's own
loader reads it: the shorter side resized to ``int(crop * 256 / 224)`` (uint8 bilinear with
antialias: the call torchvision makes on the CPU), center crop, rescale and normalise fused like
upstream. Its pixels are bit-identical to upstream's processor (checked with torchvision 0.28's
code); the tests compare them wherever torchvision imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vidassets.models import record_calls
from vidassets.models.embedder import model_type
from vidassets.models.placement import Placement

_SETTING = "embeddings.weights"
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]
_BILINEAR = 2  # PILImageResampling.BILINEAR, the only resample VJEPA2VideoProcessor publishes


def clip_frames(model_dir: str | Path, frames: int | None = None) -> int:
    """Frames per clip the encoder gets: ``frames``, or the model's ``frames_per_clip`` (config.json;
    16 or 64 in the published snapshots; read without loading anything, so a version can name it)."""
    import json

    if frames:
        return int(frames)
    model_type(Path(model_dir), _SETTING)  # a named error when there is no config.json
    return int(json.loads((Path(model_dir) / "config.json").read_text()).get("frames_per_clip", 64))


def sample_indices(available: int, frames: int) -> np.ndarray:
    """``frames`` indices spread evenly over ``available`` frames (upstream's uniform sampler,
    ``arange(0, n, n / frames)``); a clip shorter than ``frames`` repeats its frames in order."""
    return np.floor(np.arange(frames) * (available / frames)).astype(np.int64)


class _VideoTransform:
    """``VJEPA2VideoProcessor``'s preprocessing (CPU), from its saved config: (T, H, W, 3) uint8 ->
    (T, 3, crop, crop) float32."""

    def __init__(self, config: dict, path: Path):
        import torch

        processor = config.get("video_processor_type", "VJEPA2VideoProcessor")
        if processor != "VJEPA2VideoProcessor":
            raise ValueError(f"{_SETTING}: {path} has a {processor} video processor; this slot runs VJEPA2VideoProcessor")
        if config.get("resample", _BILINEAR) != _BILINEAR:
            raise ValueError(f"{_SETTING}: {path} video processor resample {config['resample']} is not bilinear (2)")
        crop = config.get("crop_size", 256)
        self.crop = (crop, crop) if isinstance(crop, int) else (int(crop["height"]), int(crop["width"]))
        self.shortest_edge = int(self.crop[0] * 256 / 224)  # VJEPA2VideoProcessor.__init__ ignores a saved size
        self.do_resize, self.do_crop = config.get("do_resize", True), config.get("do_center_crop", True)
        do_rescale, do_normalize = config.get("do_rescale", True), config.get("do_normalize", True)
        rescale = float(config.get("rescale_factor", 1 / 255))
        mean = torch.tensor(config.get("image_mean", _IMAGENET_MEAN))
        std = torch.tensor(config.get("image_std", _IMAGENET_STD))
        if do_rescale and do_normalize:  # upstream fuses the two: (x - mean / s) / (std / s)
            mean, std, rescale = mean * (1.0 / rescale), std * (1.0 / rescale), None
        self.mean = mean.view(-1, 1, 1) if do_normalize else None
        self.std = std.view(-1, 1, 1) if do_normalize else None
        self.rescale = rescale if do_rescale else None
        self._torch = torch

    def __call__(self, frames: np.ndarray):
        from transformers.image_transforms import get_resize_output_image_size
        from transformers.image_utils import ChannelDimension

        torch = self._torch
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
        if self.do_resize:
            size = get_resize_output_image_size(video, size=self.shortest_edge, default_to_square=False,
                                                input_data_format=ChannelDimension.FIRST)
            if tuple(size) != tuple(video.shape[-2:]):
                video = torch.nn.functional.interpolate(video, size=list(size), mode="bilinear", align_corners=False,
                                                        antialias=True)
        if self.do_crop:
            video = _center_crop(video, self.crop)
        if self.mean is not None:
            return video.to(torch.float32).sub(self.mean).div_(self.std)
        return video * self.rescale if self.rescale is not None else video


def _center_crop(video, crop: tuple[int, int]):
    """Upstream's center crop: zero padding first where the frame is smaller than the crop."""
    import torch

    height, width = video.shape[-2:]
    if crop[0] > height or crop[1] > width:
        pad_h, pad_w = max(crop[0] - height, 0), max(crop[1] - width, 0)
        video = torch.nn.functional.pad(video, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2))
        height, width = video.shape[-2:]
    top, left = int((height - crop[0]) / 2.0), int((width - crop[1]) / 2.0)
    return video[..., top : top + crop[0], left : left + crop[1]]


class VideoEmbedder:
    """A V-JEPA 2 encoder from a local directory: ``frames`` frames sampled evenly from a clip ->
    the mean of its output tokens, L2-normalised (``dim`` = the encoder's hidden size).

    ``frames``: frames per clip fed to the encoder (changes outputs), by default the model's
    ``frames_per_clip`` (``clip_frames``); a multiple of its ``tubelet_size``. (Upstream's processor
    samples no frames unless its config sets ``do_sample_frames``, which the published ones do not.)"""

    def __init__(self, placement: Placement, model_dir: str | Path, frames: int | None = None):
        import torch
        from transformers import VJEPA2Model
        from transformers.video_processing_utils import VideoProcessorMixin

        path = Path(model_dir)
        kind = model_type(path, _SETTING)
        if kind != "vjepa2":
            raise ValueError(f"{_SETTING}: {path} holds a {kind!r} model (config.json model_type); the video "
                             "embedder needs a 'vjepa2' one")
        try:
            processor_config, _ = VideoProcessorMixin.get_video_processor_dict(str(path), local_files_only=True)
            model = VJEPA2Model.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        except OSError as e:
            raise FileNotFoundError(f"{_SETTING}: cannot load the V-JEPA 2 model in {path}: {e}") from e
        model.predictor = None  # get_vision_features runs the encoder alone: free the predictor
        self._transform = _VideoTransform(processor_config, path)
        tubelet = int(model.config.tubelet_size)
        self.frames = clip_frames(path, frames)
        if self.frames < tubelet or self.frames % tubelet:
            raise ValueError(f"embeddings.video_frames: {self.frames} frames is not a multiple of the model's "
                             f"tubelet_size {tubelet}")
        self._model = model.eval().to(placement.device)
        self.dim = int(model.config.hidden_size)
        self._placement = placement
        self._torch = torch
        self.calls = self.batches = 0

    def pixels(self, frames: Sequence[np.ndarray]):
        """The encoder's input for one clip: (1, frames, 3, crop, crop) float32."""
        if not len(frames):
            raise ValueError("a clip needs at least one frame")
        chosen = [frames[i] for i in sample_indices(len(frames), self.frames)]
        if len({f.shape for f in chosen}) > 1 or chosen[0].ndim != 3 or chosen[0].shape[2] != 3:
            raise ValueError(f"a clip's frames must be RGB (H, W, 3) arrays of one size, got {sorted({f.shape for f in chosen})}")
        chosen = np.stack(chosen)
        return self._transform(chosen).unsqueeze(0)

    def __call__(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """One clip's vector: (dim,) float32, unit length."""
        torch = self._torch
        pixels = self.pixels(frames).to(self._placement.device)
        with torch.inference_mode(), self._placement.autocast():
            tokens = self._model.get_vision_features(pixels)
        vector = tokens.float().mean(dim=1)[0].cpu().numpy()
        self.calls += self.frames
        self.batches += 1
        record_calls(self.frames)
        return (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32)
