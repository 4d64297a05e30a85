"""Shot detectors side by side on an evaluation set of real-footage compilations with known cuts.

    python bench/shots.py [--per-kind 6] [--out bench/results/shots.json] [--threads 2]

The set (``vidassets.demo.shot_eval``: hard cuts, splices between similar-looking spans, one
palette, cuts right after flashes plus flashes inside shots, dissolves and fades labelled as gradual)
is built once under .vidassets/shot_eval. Every compilation goes through the real analysis pass
(``analyze_source``: one decode, PySceneDetect fed our frames, 48x27 frames for the network) and
the cuts of each detector are scored: precision / recall / F1 with a hard cut matched within
+-1 frame and a gradual transition matched anywhere inside its span (+-1). Costs are CPU ms per
frame: the pass itself (decode + signals + context frames + the PySceneDetect detector) and the
TransNetV2 network on top (torch, ``--threads`` threads). The last line is the table as JSON, also
written under "figures" to ``--out`` (no target is stated, so its verdict is empty).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import REPO, cpu_seconds, write_results

from vidassets.config import AnalysisSettings, ProbeSettings
from vidassets.demo.shot_eval import KINDS, build_set, score
from vidassets.media.analysis import analyze_source, final_cuts
from vidassets.media.probe import probe_source
from vidassets.models.registry import ModelRegistry

DETECTORS = ("adaptive", "content", "transnetv2", "ensemble")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-kind", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "shots.json")
    args = parser.parse_args()
    made = build_set(REPO / ".vidassets" / "shot_eval", REPO / ".vidassets" / "cache", per_kind=args.per_kind)
    network = ModelRegistry("auto", torch_threads=args.threads).get("transnetv2")  # pins torch's threads
    counts = {d: {k: [0, 0, 0] for k in (*KINDS, "all")} for d in DETECTORS}
    cpu = {"pass_adaptive": 0.0, "pass_content": 0.0, "network": 0.0}
    frames_total = 0
    wall0 = time.time()
    for comp, path in made:
        spec = {"path": str(path), "offset": None, "size": None}
        facts = probe_source(spec, ProbeSettings().model_dump())
        found: dict[str, list[int]] = {}
        for pass_detector in ("content", "ensemble"):
            params = AnalysisSettings(detector=pass_detector).model_dump()
            before = cpu_seconds()
            out = analyze_source(spec, {**params, "safe_mode": False}, facts)
            cpu["pass_content" if pass_detector == "content" else "pass_adaptive"] += cpu_seconds() - before
            if pass_detector == "content":
                found["content"] = out["cuts"]
                continue
            found["adaptive"] = out["cuts"]
            before = cpu_seconds()
            probabilities = network(out["shot_frames"])
            cpu["network"] += cpu_seconds() - before
            n = out["frames_decoded"]
            frames_total += n
            for d in ("transnetv2", "ensemble"):
                found[d] = final_cuts(AnalysisSettings(detector=d), out["cuts"], probabilities, out["signals"][:, 0])
        for d in DETECTORS:
            hits, detections, truths = score(found[d], comp)
            for k in (comp.kind, "all"):
                c = counts[d][k]
                c[0], c[1], c[2] = c[0] + hits, c[1] + detections, c[2] + truths
    rows = []
    for d in DETECTORS:
        row: dict = {"detector": d}
        for k, (hits, detections, truths) in counts[d].items():
            p = hits / detections if detections else 1.0
            r = hits / truths if truths else 1.0
            row[k] = {"precision": round(p, 3), "recall": round(r, 3), "f1": round(2 * p * r / (p + r) if p + r else 0, 3)}
        pass_ms = 1000 * (cpu["pass_content"] if d == "content" else cpu["pass_adaptive"]) / frames_total
        net_ms = 1000 * cpu["network"] / frames_total if d in ("transnetv2", "ensemble") else 0.0
        row["cpu_ms_per_frame"] = {"pass": round(pass_ms, 2), "network": round(net_ms, 2), "total": round(pass_ms + net_ms, 2)}
        rows.append(row)
    print(f"{len(made)} compilations, {frames_total} frames (640x360, 25 fps), {time.time() - wall0:.0f} s wall; "
          f"torch threads {args.threads}, device {network.placement.device}")
    print(f"{'detector':<11} {'P':>6} {'R':>6} {'F1':>6}  " + "  ".join(f"{k:>8}" for k in KINDS) + "   CPU ms/frame")
    for row in rows:
        a = row["all"]
        print(f"{row['detector']:<11} {a['precision']:>6.3f} {a['recall']:>6.3f} {a['f1']:>6.3f}  "
              + "  ".join(f"{row[k]['f1']:>8.3f}" for k in KINDS) + f"   {row['cpu_ms_per_frame']['total']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"compilations": len(made), "frames": frames_total, "threads": args.threads, "rows": rows}
    write_results(args.out, sys.argv, result, {}, settings={**vars(args), "out": str(args.out)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
