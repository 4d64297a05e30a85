"""The V-JEPA 2 export read by V-JEPA 2's own code (issue 44, item 4).

V-JEPA 2's ``VideoDataset`` (facebookresearch/vjepa2, ``src/datasets/video_dataset.py``) is not on
the package index, so the test suite reads our list with its documented read call and its decoder
(decord). This script runs the class itself from a checkout of that repository (or the git
directory ``fetch`` leaves, read with ``git archive``): ``vidassets export vjepa`` of a snapshot,
then every line through ``VideoDataset.__getitem__`` (decord decode, clip sampling), and writes
``bench/results/vjepa_readback.json`` with both commits.

Usage (after ``vidassets demo``, which leaves a snapshot in ``.vidassets/store``):
    python bench/vjepa_readback.py --vjepa2 /path/to/vjepa2 [--store .vidassets/store] [--snapshot N]
Needs decord and psutil (``pip install decord psutil``). torchvision, which the module imports for
still images only, is stood in by an empty module where its CPU build does not install (this
machine: the index holds only the CUDA wheel); the list holds video files only.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _source(vjepa2: Path, into: Path) -> tuple[Path, str]:
    """A directory holding the repository's ``src/`` and its commit."""
    git = ["git", "--git-dir", str(vjepa2)] if (vjepa2 / "HEAD").exists() and not (vjepa2 / "src").exists() \
        else ["git", "-C", str(vjepa2)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    if (vjepa2 / "src").is_dir():
        return vjepa2, commit
    archive = subprocess.run([*git, "archive", "HEAD", "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into, commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vjepa2", required=True, type=Path, help="a vjepa2 checkout or its git directory")
    parser.add_argument("--store", default=str(REPO / ".vidassets" / "store"))
    parser.add_argument("--snapshot", type=int)
    parser.add_argument("--frames-per-clip", type=int, default=16)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "vjepa_readback.json"))
    args = parser.parse_args()

    from vidassets.storage import TableStore, open_object_store
    from vidassets.train.exports import VJEPA_LIST, export_vjepa
    from vidassets.train.snapshot import read_snapshot, resolve_snapshot

    tables = TableStore(open_object_store(args.store))
    version = resolve_snapshot(tables.objects, args.snapshot)
    samples = read_snapshot(tables.objects, version)
    with tempfile.TemporaryDirectory(prefix="vjepa-readback-") as tmp:
        root, commit = _source(args.vjepa2, Path(tmp))
        export = Path(tmp) / "export"
        done = export_vjepa(tables, samples, version, export)
        try:
            import torchvision  # noqa: F401
            stood_in = False
        except (ImportError, RuntimeError):
            sys.modules["torchvision"] = types.ModuleType("torchvision")
            stood_in = True
        sys.path.insert(0, str(root))
        from src.datasets.video_dataset import VideoDataset

        dataset = VideoDataset(data_paths=[str(export / VJEPA_LIST)], frames_per_clip=args.frames_per_clip,
                               frame_step=1, num_clips=1, random_clip_sampling=False)
        legend = json.loads((export / "vjepa_videos.json").read_text())
        streams = dict(zip(samples.clip_id, samples.stream, strict=True))
        start = time.perf_counter()
        items = []
        for i in range(len(dataset)):
            buffer, label, clip_indices = dataset[i]
            clip = legend["clip_ids"][i]
            items.append({"clip_id": clip, "shape": list(buffer[0].shape), "label": int(label),
                          "label_is_stream": legend["labels"][str(int(label))] == streams[clip],
                          "frames_sampled": len(clip_indices[0])})
        seconds = time.perf_counter() - start
    ok = bool(items) and all(i["label_is_stream"] and i["shape"][0] == args.frames_per_clip for i in items)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    result = {
        "commit": head, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu_count": __import__("os").cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "bench/vjepa_readback.py", *sys.argv[1:]]),
        "vjepa2_commit": commit, "torchvision_stood_in": stood_in, "snapshot": version,
        "figures": {"listed": done["samples"], "skipped": done["skipped"], "read": len(items),
                    "read_seconds": round(seconds, 3)},
        "verdict": {"every listed video read by VideoDataset with its stream label": ok},
        "items": items,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("figures", "verdict")}, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
