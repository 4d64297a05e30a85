"""Spoken language and a transcript from Whisper run locally through ``transformers``
(``WhisperForConditionalGeneration`` + ``WhisperProcessor``), a drop-in for ``OpenAITranscriber``:
``__call__(samples, rate) -> Transcript``.

The model is loaded from a local ``save_pretrained`` directory in the layout its checkpoints are
published in (``openai/whisper-*``: config.json, generation_config.json with ``lang_to_id`` /
``task_to_id``, preprocessor_config.json, the tokenizer files, model.safetensors); nothing downloads.

- **Language**: the decoder's next-token distribution after ``<|startoftranscript|>`` on the first
  30 s, restricted to the language tokens (what ``generate`` detects with, and what OpenAI's
  ``detect_language`` does); the most likely token's code (``<|en|>`` -> ``en``) and its
  probability among the languages. An English-only checkpoint (``is_multilingual: false``) says
  ``en``; a ``language`` given to the constructor is used as is, nothing detected.
- **Transcript**: greedy decoding (one beam, no sampling, no temperature fallback, no timestamps)
  with the language token and task forced. Audio over 30 s is cut into consecutive 30 s chunks
  (Whisper's input window), each decoded alone with the clip's language; the chunk texts are joined
  with a space. A word cut by a chunk boundary may come out garbled (Whisper's sequential long-form
  decoding would avoid that, but it is neither batchable nor a fixed function of each chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vidassets.models import record_calls
from vidassets.models.audio_tagger import local_model_dir, mono_samples
from vidassets.models.embedder import padded
from vidassets.models.placement import Placement
from vidassets.models.transcriber import Transcript

TASKS = ("transcribe", "translate")


@dataclass
class WhisperTranscript(Transcript):
    """A ``Transcript`` that also says how sure the language is (None: not detected but given) and
    which tokens each 30 s chunk decoded to (up to its end-of-text token)."""

    language_probability: float | None = None
    token_ids: list[list[int]] | None = None


class WhisperTranscriber:
    """Whisper from a local checkpoint (``model_dir``). ``task``: ``transcribe`` (text in the spoken
    language) or ``translate`` (English text); ``language``: a code (``de``) to force instead of
    detecting; ``max_new_tokens``: a cap on tokens per 30 s chunk (None: the generation config's
    ``max_length``). ``batch_frames``: 30 s chunks per model run on a GPU (on the CPU one), every
    run the same shape so a chunk's text never depends on which chunks share its run."""

    def __init__(self, placement: Placement, model_dir: str | Path, task: str = "transcribe",
                 language: str | None = None, max_new_tokens: int | None = None, *, batch_frames: int = 8):
        import torch
        from transformers import AutoConfig, WhisperForConditionalGeneration, WhisperProcessor

        if task not in TASKS:
            raise ValueError(f"whisper task must be one of {TASKS}, got {task!r}")
        path = local_model_dir(model_dir, "whisper", "config.json", "generation_config.json")
        for needed, names in (("tokenizer", ("tokenizer.json", "vocab.json")),
                              ("feature extractor", ("preprocessor_config.json", "processor_config.json"))):
            if not any((path / name).is_file() for name in names):
                raise FileNotFoundError(f"whisper: {path} holds no {needed} ({' or '.join(names)})")
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        if config.model_type != "whisper":
            raise ValueError(f"whisper: {path / 'config.json'} holds a {config.model_type!r} model, not Whisper")
        self._processor = WhisperProcessor.from_pretrained(path, local_files_only=True)
        self._processor.feature_extractor.dither = 0.0  # a dithering extractor would add random noise
        self._model = WhisperForConditionalGeneration.from_pretrained(path, config=config, local_files_only=True)
        self._model.eval().to(placement.device)
        generation = self._model.generation_config
        self.multilingual = bool(getattr(generation, "is_multilingual", False))
        self._languages = _language_tokens(generation, path) if self.multilingual else {}
        if not self.multilingual and (task != "transcribe" or language not in (None, "en")):
            raise ValueError(f"whisper: {path} is an English-only checkpoint: it cannot {task} in {language!r}")
        if language is not None and self.multilingual and f"<|{language}|>" not in self._languages.values():
            raise ValueError(f"whisper language {language!r} is not one of the model's: {sorted(self._languages.values())}")
        self.task, self.language, self.max_new_tokens = task, language, max_new_tokens
        self.rate = int(self._processor.feature_extractor.sampling_rate)
        self.chunk_samples = int(self._processor.feature_extractor.n_samples)
        self._placement, self._torch = placement, torch
        self.batch_frames = batch_frames
        self.calls = self.batches = 0

    def __call__(self, samples: np.ndarray, rate: int) -> WhisperTranscript:
        x = mono_samples(samples, rate, self.rate)
        chunks = [x[start: start + self.chunk_samples] for start in range(0, len(x), self.chunk_samples)]
        features = [self._features(chunk) for chunk in chunks]
        language, probability = self.detect_language(features[0])
        tokens = self._generate(features, language)
        texts = [text.strip() for text in self._processor.batch_decode(tokens, skip_special_tokens=True)]
        return WhisperTranscript(True, language=language, text=" ".join(t for t in texts if t), attempts=1,
                                 language_probability=probability, token_ids=tokens)

    def _features(self, chunk: np.ndarray):
        """(1, mel bins, 3000) log-mel features of one chunk of at most 30 s, padded to 30 s."""
        return self._processor.feature_extractor(chunk, sampling_rate=self.rate, return_tensors="pt").input_features

    def detect_language(self, features) -> tuple[str, float | None]:
        """(code, probability among the languages) of one chunk's features (see the module doc)."""
        if self.language is not None or not self.multilingual:
            return self.language or "en", None
        torch = self._torch
        start = torch.tensor([[self._model.generation_config.decoder_start_token_id]], device=self._placement.device)
        with torch.inference_mode(), self._placement.autocast():
            logits = self._model(input_features=features.to(self._placement.device), decoder_input_ids=start,
                                 use_cache=False).logits[0, -1]
        ids = sorted(self._languages)
        probabilities = torch.softmax(logits.float()[ids], dim=-1).cpu().numpy()
        best = int(np.argmax(probabilities))  # the first of equals, in token order, as generate's argmax
        self.batches += 1
        return self._languages[ids[best]].strip("<|>"), float(probabilities[best])

    def _generate(self, features: list, language: str) -> list[list[int]]:
        """Each chunk's greedy tokens up to its end-of-text, in runs of the placement's shape."""
        torch = self._torch
        options = {"task": self.task, "language": f"<|{language}|>"} if self.multilingual else {}
        if self.max_new_tokens is not None:
            options["max_new_tokens"] = self.max_new_tokens
        tokens: list[list[int]] = []
        for start, stop, shape in self._placement.torch_runs(len(features), self.batch_frames):
            batch = torch.cat(padded(features[start:stop], shape)).to(self._placement.device)
            with torch.inference_mode(), self._placement.autocast():
                out = self._model.generate(batch, do_sample=False, num_beams=1, return_timestamps=False, **options)
            sequences = out if isinstance(out, torch.Tensor) else out["sequences"]
            tokens += [until_end(row, self._model.generation_config.eos_token_id) for row in sequences[: stop - start].tolist()]
            self.calls += stop - start
            self.batches += 1
            record_calls(stop - start)
        return tokens


def until_end(tokens: list[int], eos: int | list[int] | None) -> list[int]:
    """``tokens`` up to and with the first end-of-text token (what follows it in a batch is padding)."""
    ends = set(eos if isinstance(eos, list) else [eos])
    for i, token in enumerate(tokens):
        if token in ends:
            return tokens[: i + 1]
    return tokens

def _language_tokens(generation, path: Path) -> dict[int, str]:
    """token id -> language token (``<|en|>``) of a multilingual checkpoint's generation config."""
    lang_to_id = getattr(generation, "lang_to_id", None)
    if not lang_to_id or not getattr(generation, "task_to_id", None):
        raise ValueError(f"whisper: {path / 'generation_config.json'} has no lang_to_id / task_to_id (an outdated "
                         "generation config: save the checkpoint again with a current transformers)")
    return {int(i): token for token, i in lang_to_id.items()}
