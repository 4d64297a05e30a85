"""What the side-by-side benchmarks share: CPU-time readings and the long-GOP test source."""

from __future__ import annotations

import contextlib
import importlib.util
import resource
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from unittest import mock

import cv2

from vidassets.demo.bucket import decode_rgb, encode
from vidassets.storage.objects import ObjectStore

REPO = Path(__file__).resolve().parents[1]
BUNNY = REPO / ".vidassets" / "cache" / "bigbuckbunny.mp4"  # fetched by build_demo_bucket


class Counting:
    """An object store that counts ``get_bytes`` calls (the decision's reads)."""

    def __init__(self, inner: ObjectStore):
        self.inner, self.reads = inner, 0

    def get_bytes(self, key: str) -> bytes:
        self.reads += 1
        return self.inner.get_bytes(key)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def module_at(rev: str, path: str) -> ModuleType:
    """The module at ``path`` (e.g. ``vidassets/curate/dedup.py``) as it was at git ``rev``, imported
    under another name beside today's: a baseline run in the same process."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True,
                            text=True).stdout
    spec = importlib.util.spec_from_loader(f"{Path(path).stem}_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


HOUR_NS = 3600 * 10**9


@contextlib.contextmanager
def clock_shifted(ns: int):
    """The tables' journal clock (``journal_clock``: its records, the global stages' reads) ``ns``
    behind (ahead when negative): a store's history written as if it happened earlier."""
    import time

    with mock.patch("vidassets.storage.tables.journal_clock", lambda: time.time_ns() - ns):
        yield


def cpu_seconds(children: bool = False) -> float:
    """User+system CPU seconds of this process (all its threads), plus its finished children if asked."""
    who = [resource.RUSAGE_SELF] + ([resource.RUSAGE_CHILDREN] if children else [])
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who))


def long_gop_source(path: Path, seconds: int, height: int | None = None) -> Path:
    """An H.264 file (GOP 250, 25 fps, veryfast CRF 23) of the real Big Buck Bunny sample played
    forwards then backwards for ``seconds``; at the sample's 720p or rescaled to ``height``."""
    frames = list(decode_rgb(BUNNY))
    if height and height != frames[0].shape[0]:
        frames = [cv2.resize(f, (height * 16 // 9, height), interpolation=cv2.INTER_CUBIC) for f in frames]
    n, k = seconds * 25, len(frames)
    loop = (frames[i % k] if (i // k) % 2 == 0 else frames[-1 - i % k] for i in range(n))
    encode(loop, path, "libx264", 25, options={"preset": "veryfast", "g": "250", "crf": "23"})
    return path


AD_LINES = ("SALE 50% OFF NOW", "CALL 555 0199 TODAY", "WATCH MORE VIDEOS", "SUBSCRIBE FOR MORE")


def text_heavy_drop(drop: Path, samples: list[Path]) -> None:
    """A drop of the real ``samples`` with an advertising slate burnt in: four lines of outlined text
    across the whole frame (PP-OCRv4 finds text on ~90% of it) in grey levels that clip nothing:
    clips a default recipe rejects on its text rule, not on exposure."""
    drop.mkdir(parents=True)
    font = cv2.FONT_HERSHEY_DUPLEX

    def slate(rgb):
        rgb, (h, w) = rgb.copy(), rgb.shape[:2]
        stroke = max(1, round(h / 90))  # strokes in proportion to the frame, as a subtitle renderer draws them
        for i, line in enumerate(AD_LINES):
            scale = (w * 0.95) / cv2.getTextSize(line, font, 1.0, 2)[0][0]
            at = (int(w * 0.02), int((i + 0.5) * h / len(AD_LINES) + h * 0.06))
            cv2.putText(rgb, line, at, font, scale, (40, 40, 40), 3 * stroke, cv2.LINE_AA)  # no clipped pixels:
            cv2.putText(rgb, line, at, font, scale, (235, 235, 235), stroke, cv2.LINE_AA)  # exposure as the footage's
        return rgb

    for sample in samples:
        encode((slate(f) for f in decode_rgb(sample)), drop / f"{sample.stem}_slate.mp4", "libx264", 25,
               options={"preset": "veryfast", "crf": "23"})
    (drop / "_SUCCESS").write_bytes(b"")


MEDIA_STAGES = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_analysis", "clips"]


def media_corpus(tmp: Path, seconds: int, text_heavy: bool = False):
    """The demo bucket plus a drop holding a ``seconds`` long 720p long-GOP file (and with
    ``text_heavy`` a drop of the samples under an advertising slate, ``text_heavy_drop``), taken
    through the media stages (up to clips) by the real graph under ``tmp``; returns its settings."""
    from vidassets.config import load_settings
    from vidassets.demo.bucket import build_demo_bucket
    from vidassets.runner import local_instance, materialize_bucket

    build_demo_bucket(tmp / "bucket", REPO / ".vidassets" / "cache")
    drop = tmp / "bucket/raw/bench/drop-longgop"
    drop.mkdir(parents=True)
    long_gop_source(drop / "longgop_720p.mp4", seconds)
    (drop / "_SUCCESS").write_bytes(b"")
    if text_heavy:
        cache = REPO / ".vidassets" / "cache"
        text_heavy_drop(tmp / "bucket/raw/bench/drop-slate", [cache / n for n in ("bikes.mp4", "carphone.mp4", "bigbuckbunny.mp4")])
    settings = load_settings(env={}, overrides={"bucket.uri": str(tmp / "bucket"), "store.uri": str(tmp / "store"),
                                                "store.eval_vault_uri": str(tmp / "vault"), "eval.fraction": 0.0})
    summary = materialize_bucket(settings, local_instance(str(tmp / "home")), log=lambda _: None,
                                 select=MEDIA_STAGES, complete_only=True)
    assert summary.ok, summary.render()
    return settings


def provenance(argv: list[str]) -> dict:
    """What every results file starts with: the commit measured, when, on what machine, by what command."""
    import os
    import platform
    import time

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpu_count": os.cpu_count(), "cpu_model": cpu, "platform": platform.platform()},
            "command": " ".join(["python", *argv])}


def write_results(path: str | Path, argv: list[str], figures: dict, verdict: dict | None = None, **extra) -> dict:
    """``bench/results/<name>.json``: provenance, then the figures and per target met or not met."""
    import json

    result = {**provenance(argv), **extra, "figures": figures, "verdict": verdict or {}}
    Path(path).write_text(json.dumps(result, indent=1))
    return result
