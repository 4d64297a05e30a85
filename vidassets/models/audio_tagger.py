"""AudioSet sound-event tags from an Audio Spectrogram Transformer (AST) through ``transformers``.

The model is loaded from a local ``save_pretrained`` directory in the layout its checkpoints are
published in (e.g. ``MIT/ast-finetuned-audioset-10-10-0.4593``: config.json with the 527 AudioSet
``id2label`` names, preprocessor_config.json of the ``ASTFeatureExtractor``, model.safetensors);
nothing downloads. AudioSet is multi-label, so each label's score is the sigmoid of its logit.

Long audio: the extractor turns audio into at most ``max_length`` 10 ms fbank frames (1024 frames,
10.24 s, in the published checkpoint) and cuts the rest. To hear a whole clip, it is cut into
windows of exactly ``max_length`` frames laid end to end on the 10 ms frame grid, the last window
ending where the audio ends (overlapping the one before it, so that no window is mostly padding);
a label's clip score is its highest score over the windows (max pooling: a sound heard in any
window is in the clip). Audio up to one window long is a single window, padded by the extractor
exactly as upstream pads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vidassets.models import record_calls
from vidassets.models.embedder import padded
from vidassets.models.placement import Placement

AST_MODEL_TYPE = "audio-spectrogram-transformer"


def mono_samples(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """Mono float32 samples at ``target_rate``: checked (one dimension, not empty, finite, a positive
    rate) and, when ``rate`` differs, resampled with scipy's polyphase filter (``resample_poly``, a
    deterministic Kaiser-windowed FIR; scipy comes with pyloudnorm)."""
    x = np.asarray(samples)
    if x.ndim != 1:
        raise ValueError(f"audio samples must be mono (one dimension), got shape {x.shape}")
    if not len(x):
        raise ValueError("audio samples are empty")
    if int(rate) != rate or rate <= 0:
        raise ValueError(f"audio sample rate must be a positive integer, got {rate!r}")
    x = x.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise ValueError("audio samples hold NaN or infinite values")
    if int(rate) == target_rate:
        return x
    from scipy.signal import resample_poly

    common = math.gcd(int(rate), int(target_rate))
    return resample_poly(x, target_rate // common, int(rate) // common).astype(np.float32)


def local_model_dir(model_dir: str | Path, what: str, *files: str) -> Path:
    """``model_dir`` as a Path, with each of ``files`` in it: otherwise FileNotFoundError naming it."""
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{what}: model directory {path} does not exist")
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{what}: {path} is not a saved model directory (no {', '.join(missing)})")
    return path


@dataclass
class AudioTags:
    """One clip's tags: ``labels`` (name, score) at or above the threshold, highest first, at most
    ``top_k``; ``scores`` every label's score (the model's ``id2label`` order), max over windows."""

    labels: list[tuple[str, float]]
    scores: np.ndarray
    windows: int

    def value(self) -> dict:
        """The tags as a JSON-ready dict (scores rounded to 4 decimals)."""
        return {"labels": [[name, round(score, 4)] for name, score in self.labels], "windows": self.windows}


class AudioTagger:
    """AudioSet tags of a clip's audio from a local AST checkpoint (``model_dir``). ``threshold``:
    the lowest sigmoid score a label needs to be named; ``top_k``: at most this many labels (None:
    all above the threshold). ``batch_frames``: windows per model run on a GPU (the registry's frame
    batch; on the CPU one window per run), every run the same shape so that scores never depend
    on which windows share it."""

    def __init__(self, placement: Placement, model_dir: str | Path, threshold: float = 0.3, top_k: int | None = 10,
                 *, batch_frames: int = 8):
        import torch
        from transformers import ASTForAudioClassification, AutoConfig, AutoFeatureExtractor

        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"audio tagger threshold must lie in [0, 1], got {threshold!r}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"audio tagger top_k must be at least 1 (or None for all), got {top_k!r}")
        path = local_model_dir(model_dir, "audio tagger", "config.json", "preprocessor_config.json")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        if config.model_type != AST_MODEL_TYPE:
            raise ValueError(f"audio tagger: {path / 'config.json'} holds a {config.model_type!r} model, "
                             f"not an AST ({AST_MODEL_TYPE!r})")
        self._extractor = AutoFeatureExtractor.from_pretrained(path, local_files_only=True)
        _check_extractor(self._extractor, config, path)
        self._model = ASTForAudioClassification.from_pretrained(path, config=config, local_files_only=True)
        self._model.eval().to(placement.device)
        self.label_names = [config.id2label[i] for i in range(config.num_labels)]
        self.rate = int(self._extractor.sampling_rate)
        self.threshold, self.top_k = float(threshold), top_k
        self._placement, self._torch = placement, torch
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def windows(self, samples: np.ndarray) -> list[np.ndarray]:
        """The windows of 16 kHz samples (see the module doc): ``max_length`` frames each."""
        hop, frame = round(self.rate * 0.010), round(self.rate * 0.025)  # the extractor's fbank frame shift, length
        size = (self._extractor.max_length - 1) * hop + frame
        if len(samples) <= size:
            return [samples]
        starts = list(range(0, len(samples) - size + 1, self._extractor.max_length * hop))
        if starts[-1] + size < len(samples):
            starts.append(len(samples) - size)
        return [samples[s: s + size] for s in starts]

    def window_scores(self, windows: Sequence[np.ndarray]) -> np.ndarray:
        """(windows, labels) sigmoid scores, in runs of the placement's shape."""
        torch = self._torch
        out = []
        for start, stop, shape in self._placement.torch_runs(len(windows), self.batch_frames):
            inputs = self._extractor(padded(windows[start:stop], shape), sampling_rate=self.rate, return_tensors="pt")
            with torch.inference_mode(), self._placement.autocast():
                logits = self._model(input_values=inputs["input_values"].to(self._placement.device)).logits
            out.append(torch.sigmoid(logits.float()).cpu().numpy()[: stop - start])
            self.calls += stop - start
            self.batches += 1
            record_calls(stop - start)
        return np.concatenate(out) if out else np.zeros((0, len(self.label_names)), np.float32)

    def tag_many(self, clips: Sequence[np.ndarray], rate: int) -> list[AudioTags]:
        """Tags of several clips (mono float32 at ``rate``), their windows run together."""
        windows = [self.windows(mono_samples(clip, rate, self.rate)) for clip in clips]
        scores = self.window_scores([w for clip in windows for w in clip])
        out, at = [], 0
        for clip in windows:
            out.append(self._tags(scores[at: at + len(clip)].max(axis=0), len(clip)))
            at += len(clip)
        return out

    def __call__(self, samples: np.ndarray, rate: int) -> AudioTags:
        return self.tag_many([samples], rate)[0]

    def _tags(self, scores: np.ndarray, windows: int) -> AudioTags:
        order = sorted(np.flatnonzero(scores >= self.threshold), key=lambda i: (-scores[i], i))[: self.top_k]
        return AudioTags([(self.label_names[i], float(scores[i])) for i in order], scores, windows)


def _check_extractor(extractor, config, path: Path) -> None:
    """The feature extractor is AST's and makes the input shape the model was built for."""
    from transformers import ASTFeatureExtractor

    if not isinstance(extractor, ASTFeatureExtractor):
        raise ValueError(f"audio tagger: {path / 'preprocessor_config.json'} holds a "
                         f"{type(extractor).__name__}, not an ASTFeatureExtractor")
    for name in ("num_mel_bins", "max_length"):
        if getattr(extractor, name) != getattr(config, name):
            raise ValueError(f"audio tagger: {name} is {getattr(extractor, name)} in {path / 'preprocessor_config.json'} "
                             f"but {getattr(config, name)} in {path / 'config.json'}")
