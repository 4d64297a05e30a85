"""Ladder rungs from one decode vs one decode+scale+encode pass per rung, side by side in one run;
plus what the ladder saves the latents stage afterwards.

    python bench/ladder.py [--reps 2] [--clip-seconds 10] [--presets veryfast,ultrafast] [--sources 720,1080]

Inputs: 40 s long-GOP (GOP 250) H.264 files made from the real Big Buck Bunny sample at 720p (the
source is as large as the top rung: the worst case for sharing a decode) and at 1080p (upscaled:
the usual HD source, whose decode costs 2.25x more per frame); the clip starts 25 s in, half a GOP
after a keyframe (the expected lead-in for a clip starting at a random frame). Rungs: short side
256 / 512 / 720 at 24 fps, libx264 CRF 23, one encoder thread per rung (the `clip_ladder` default).

  (a) `ladder_clip` with all rungs: ONE decode, every rung scaled and encoded on its own thread
  (b) `ladder_clip` once per rung: the same code, so the difference is the repeated decodes
  Both skip the non-reference frames no rung shows (packet index), as `clip_ladder` does.

CPU seconds of this process (all threads), best of --reps, interleaved. Target: (b)/(a) >= 1.5.
Also: the real-time factor per rung; (a) with x264's own thread count (threads=0) to show what
one thread per encoder saves; and the latents input: the frames of the largest 4k+1 bucket
(81 frames at 480 px short side) read from the raw source (seek + non-reference skipping) vs from
the 512 rung, which is what `latents` reads after a VAE or resolution change.
Results: ``bench/results/ladder.json`` (a verdict per source height and preset).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import cv2
import pandas as pd
from common import REPO, cpu_seconds, long_gop_source, write_results

from vidassets.demo.bucket import build_demo_bucket
from vidassets.derive.latents import center_crop, nearest_bucket, sample_frames, spatial_buckets
from vidassets.media.clip_reader import read_frames, read_sequential_frames
from vidassets.media.ladder import ladder_clip
from vidassets.media.packet_index import index_source, nonref_between

RUNGS = [{"name": f"{s}p24", "short_side": s, "fps": 24.0} for s in (256, 512, 720)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--clip-seconds", type=float, default=10.0)
    parser.add_argument("--presets", default="veryfast,ultrafast")
    parser.add_argument("--sources", default="720,1080", help="source heights")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    figures, verdict = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_demo_bucket(tmp / "bucket", REPO / ".vidassets" / "cache")
        for height in (int(h) for h in args.sources.split(",")):
            src = long_gop_source(tmp / f"longgop_{height}p.mp4", 40, height)
            figures[f"{height}p"] = bench_source(src, height, tmp, args)
            for preset, f in figures[f"{height}p"]["presets"].items():
                verdict[f"{height}p {preset}: separate / one-decode CPU >= 1.5"] = {
                    "ratio": f["separate_over_one_decode"], "target": ">= 1.5", "met": f["separate_over_one_decode"] >= 1.5}
    write_results(REPO / "bench" / "results" / "ladder.json", sys.argv, figures, verdict, settings=vars(args))


def bench_source(src: Path, height: int, tmp: Path, args: argparse.Namespace) -> dict:
    spec = {"path": str(src)}
    index = index_source(spec)
    packets = pd.DataFrame(index["arrays"])
    pts = sorted(int(p) for p in packets.pts)
    tb = float(Fraction(index["time_base"]))
    times = [(p - pts[0]) * tb for p in pts]
    first = 25 * 25
    last = first + int(args.clip_seconds * 25) - 1
    skip = nonref_between(packets, pts[first], pts[last])

    def run(rungs: list[dict], preset: str, threads: int = 1) -> tuple[float, int]:
        out = tempfile.mkdtemp(dir=tmp)
        t0 = cpu_seconds()
        result = ladder_clip(spec, pts, times, first, last, 0, rungs, "libx264", 23, preset, None, out,
                             threads, skip)
        return cpu_seconds() - t0, result["frames_decoded"]

    print(f"\n{height}p source: {args.clip_seconds:g} s clip of H.264 (GOP 250) starting 25 s in (mid-GOP); "
          f"CPU seconds, best of {args.reps}")
    out_figures: dict = {"clip_seconds": args.clip_seconds, "presets": {}}
    for preset in args.presets.split(","):
        best_one = best_sep = best_auto = float("inf")
        per_rung = {r["name"]: float("inf") for r in RUNGS}
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
            best_auto = min(best_auto, run(RUNGS, preset, threads=0)[0])
        ratio = best_sep / best_one
        print(f"preset {preset}:")
        print(f"  (a) one decode, 3 rungs:      {best_one:6.2f} CPU s, frames decoded {decoded_one}")
        print(f"  (b) 3 x decode+scale+encode:  {best_sep:6.2f} CPU s, frames decoded {decoded_sep}")
        print(f"  (b)/(a) = {ratio:.2f}  (target >= 1.5: {'MET' if ratio >= 1.5 else 'NOT MET'})")
        print(f"  (a) with x264's own thread count: {best_auto:6.2f} CPU s ({best_auto / best_one:.2f}x of one "
              "thread per encoder)")
        for name, seconds in per_rung.items():
            print(f"    rung {name}: {seconds:5.2f} CPU s alone, real-time factor {args.clip_seconds / seconds:5.1f}x")
        print(f"    all three from one decode: real-time factor {args.clip_seconds / best_one:5.1f}x")
        out_figures["presets"][preset] = {
            "one_decode_cpu_s": round(best_one, 3), "one_decode_frames_decoded": decoded_one,
            "separate_cpu_s": round(best_sep, 3), "separate_frames_decoded": decoded_sep,
            "separate_over_one_decode": round(ratio, 3),
            "one_decode_x264_auto_threads_cpu_s": round(best_auto, 3),
            "rungs_alone_cpu_s": {n: round(v, 3) for n, v in per_rung.items()},
            "real_time_factor_one_decode": round(args.clip_seconds / best_one, 2)}
    # latents input after a VAE change: the bucket's frames from raw vs from the 512 rung
    out = tempfile.mkdtemp(dir=tmp)
    rung = ladder_clip(spec, pts, times, first, last, 0, [RUNGS[1]], "libx264", 23, "veryfast", None, out, 1,
                       skip)["rungs"][0]
    sb = nearest_bucket(16, 9, spatial_buckets(["16:9"], 480))
    raw_idx = sample_frames(first, last, [17, 33, 49, 81], 25.0, None)
    rung_idx = sample_frames(0, rung["frames"] - 1, [17, 33, 49, 81], 24.0, None)
    raw_skip = nonref_between(packets, pts[raw_idx[0]], pts[raw_idx[-1]])
    best_raw = best_rung = float("inf")
    for _ in range(args.reps):
        t0 = cpu_seconds()
        raw = read_frames(spec, pts, raw_idx, 0, center_crop(height * 16 // 9, height, sb), (sb.width, sb.height),
                          raw_skip)
        best_raw = min(best_raw, cpu_seconds() - t0)
        t0 = cpu_seconds()
        from_rung = read_sequential_frames({"path": rung["path"]}, rung_idx,
                                           center_crop(rung["width"], rung["height"], sb), (sb.width, sb.height))
        best_rung = min(best_rung, cpu_seconds() - t0)
    print(f"  latents input ({len(raw_idx)} frames at {sb.width}x{sb.height}): raw {best_raw:.2f} CPU s "
          f"({raw['frames_decoded']} frames decoded at {height}p) vs 512p rung {best_rung:.2f} CPU s "
          f"({from_rung['frames_decoded']} decoded): {best_raw / best_rung:.1f}x less CPU from the rung")
    out_figures["latents_input"] = {"frames": len(raw_idx), "size": f"{sb.width}x{sb.height}",
                                    "raw_cpu_s": round(best_raw, 3), "raw_frames_decoded": raw["frames_decoded"],
                                    "rung_512_cpu_s": round(best_rung, 3),
                                    "rung_512_frames_decoded": from_rung["frames_decoded"],
                                    "raw_over_rung_cpu": round(best_raw / best_rung, 2)}
    return out_figures


if __name__ == "__main__":
    main()
