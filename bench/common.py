"""What the side-by-side benchmarks share: CPU-time readings and the long-GOP test source."""

from __future__ import annotations

import resource
from pathlib import Path

import cv2

from vidassets.demo.bucket import decode_rgb, encode

REPO = Path(__file__).resolve().parents[1]
BUNNY = REPO / ".vidassets" / "cache" / "bigbuckbunny.mp4"  # fetched by build_demo_bucket


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
