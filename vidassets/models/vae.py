"""Video VAE encoder/decoder: any diffusers video autoencoder class (``AutoencoderKLWan`` by default)
loaded with ``from_pretrained`` from a local directory.

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
                 cache_root: str | Path = ".vidassets/models"):
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

    def encode(self, frames: np.ndarray):
        """(T, H, W, 3) uint8 RGB -> latents (C, T', H', W') float32 tensor on the CPU."""
        return self.encode_batch([frames])[0]

    def encode_batch(self, clips: Sequence[np.ndarray]) -> list:
        """Clips of one shape (T, H, W, 3) uint8 RGB, encoded in one run -> latents per clip (as
        ``encode`` gives them, within float rounding: the batch changes the kernels' summation
        order). On a GPU a run of several short clips uses the chip better than one clip a run."""
        import torch

        x = torch.from_numpy(np.ascontiguousarray(np.stack(clips))).to(self.device, torch.float32)
        x = (x / 127.5 - 1.0).permute(0, 4, 1, 2, 3)
        with torch.no_grad(), self._placement.autocast():
            latents = self.model.encode(x).latent_dist.mode()
        self.calls += len(clips)
        self.batches += 1
        record_calls(len(clips))
        return [clip.float().cpu() for clip in latents]

    def decode(self, latents) -> np.ndarray:
        """Latents (C, T', H', W') -> (T, H, W, 3) uint8 RGB."""
        import torch

        with torch.no_grad(), self._placement.autocast():
            video = self.model.decode(latents.to(self.device, torch.float32).unsqueeze(0)).sample[0]
        video = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return video.permute(1, 2, 3, 0).cpu().numpy()
