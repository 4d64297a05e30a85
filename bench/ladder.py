"""Three ladder rungs from one decode vs three separate decode+scale+encode passes, in one run.

    python bench/ladder.py [--reps 2] [--clip-seconds 10] [--presets veryfast,ultrafast]

Input: a 40 s 720p long-GOP (GOP 250) H.264 file made from the real Big Buck Bunny sample; the
clip starts 25 s in, half a GOP after a keyframe (the expected lead-in for a clip starting at a
random frame), so every decode also decodes the 125 frames before it. Rungs: short side 256 / 512 / 720 at
24 fps, libx264 CRF 23. (a) `ladder_clip` with all three rungs (what `clip_ladder` runs);
(b) `ladder_clip` three times, one rung each (same code, so the difference is the decodes).
CPU seconds of this process, best of --reps, interleaved. Target: (b)/(a) >= 1.5.
Also the real-time factor (clip seconds per CPU second) of each rung when produced alone.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from pathlib import Path

import av

from vidassets.demo.bucket import build_demo_bucket, decode_rgb, encode
from vidassets.media.ladder import ladder_clip

REPO = Path(__file__).resolve().parents[1]
RUNGS = [{"name": f"{s}p24", "short_side": s, "fps": 24.0} for s in (256, 512, 720)]


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--clip-seconds", type=float, default=10.0)
    parser.add_argument("--presets", default="veryfast,ultrafast")
    parser.add_argument("--threads", type=int, default=0, help="x264 threads per encoder (0 = x264's default)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_demo_bucket(tmp / "bucket", REPO / ".vidassets" / "cache")
        frames = list(decode_rgb(REPO / ".vidassets" / "cache" / "bigbuckbunny.mp4"))
        n = 40 * 25
        loop = (frames[i % len(frames)] if (i // len(frames)) % 2 == 0 else frames[-1 - i % len(frames)] for i in range(n))
        src = tmp / "longgop_720p.mp4"
        encode(loop, src, "libx264", 25, options={"preset": "veryfast", "g": "250", "crf": "23"})
        with av.open(str(src)) as c:
            vs = c.streams.video[0]
            pts = sorted(p.pts for p in c.demux(vs) if p.pts is not None)
            tb = float(vs.time_base)
        times = [(p - pts[0]) * tb for p in pts]
        first = 25 * 25
        last = first + int(args.clip_seconds * 25) - 1
        spec = {"path": str(src)}

        def run(rungs: list[dict], preset: str) -> tuple[float, int]:
            out = tempfile.mkdtemp(dir=tmp)
            t0 = cpu_now()
            result = ladder_clip(spec, pts, times, first, last, 0, rungs, "libx264", 23, preset, None, out,
                                 args.threads)
            return cpu_now() - t0, result["frames_decoded"]

        print(f"clip: {args.clip_seconds:g} s of 720p H.264 (GOP 250) starting 25 s in (mid-GOP); "
              f"CPU seconds, best of {args.reps}")
        for preset in args.presets.split(","):
            best_one, best_sep, per_rung = float("inf"), float("inf"), {r["name"]: float("inf") for r in RUNGS}
            decoded_one = decoded_sep = 0
            for _ in range(args.reps):
                seconds, decoded_one = run(RUNGS, preset)
                best_one = min(best_one, seconds)
                total, decoded_sep = 0.0, 0
                for r in RUNGS:
                    seconds, decoded = run([r], preset)
                    per_rung[r["name"]] = min(per_rung[r["name"]], seconds)
                    total += seconds
                    decoded_sep += decoded
                best_sep = min(best_sep, total)
            ratio = best_sep / best_one
            print(f"preset {preset}:")
            print(f"  (a) one decode, 3 rungs:      {best_one:6.2f} CPU s, frames decoded {decoded_one}")
            print(f"  (b) 3 x decode+scale+encode:  {best_sep:6.2f} CPU s, frames decoded {decoded_sep}")
            print(f"  (b)/(a) = {ratio:.2f}  (target >= 1.5: {'MET' if ratio >= 1.5 else 'NOT MET'})")
            for name, seconds in per_rung.items():
                print(f"    rung {name}: {seconds:5.2f} CPU s alone, real-time factor {args.clip_seconds / seconds:5.1f}x")
            print(f"    all three from one decode: real-time factor {args.clip_seconds / best_one:5.1f}x")


if __name__ == "__main__":
    main()
