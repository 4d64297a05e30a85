"""Frames the latents reader decodes per clip vs a naive reader that decodes from frame 0, side by
side in one run over the demo corpus plus a 60 s 720p long-GOP (GOP 250) file.

    python bench/latents.py [--seconds 60]

Clips come from the real pipeline (probe -> packet index -> analysis -> clips, in-process); each
clip's frames are the ones `latents` would encode (largest 4k+1 bucket it fills, spread over the
clip, default buckets 17/33/49/81). Ours seeks to the keyframe before the clip and never decodes
unwanted non-reference frames (from the packet index); the naive reader decodes everything from
frame 0 to the clip's last sampled frame. Both convert only the sampled frames to RGB at the
bucket size, so the difference is decode work; the sampled frames are checked identical. Target: >= 3x fewer frames decoded for clips that
start late in long-GOP files. Also reports CPU seconds of both readers.
Results: ``bench/results/latents.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import av
import cv2
from common import REPO, cpu_seconds, media_corpus, write_results

from vidassets.derive.latents import center_crop, nearest_bucket, sample_frames, spatial_buckets
from vidassets.media.analysis import upright
from vidassets.media.clip_reader import read_frames
from vidassets.media.drop_steps import read_parquet_blob
from vidassets.media.packet_index import nonref_between
from vidassets.storage import TableStore, open_object_store


def naive_read(path: str, pts: list[int], indices: list[int], rotation: int, crop, size) -> tuple[int, list]:
    """Decode from the first frame (no seek) up to the last sampled frame; returns frames decoded."""
    wanted = {pts[i] for i in indices}
    last = pts[indices[-1]]
    decoded = 0
    images = []
    with av.open(path) as c:
        vs = c.streams.video[0]
        vs.codec_context.thread_type = "FRAME"
        for frame in c.decode(vs):
            decoded += 1
            if frame.pts in wanted:
                x, y, w, h = crop
                img = upright(frame.to_ndarray(format="rgb24"), rotation)[y : y + h, x : x + w]
                images.append(cv2.resize(img, size, interpolation=cv2.INTER_AREA))
            if frame.pts is not None and frame.pts >= last:
                break
    return decoded, images


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        settings = media_corpus(tmp, args.seconds)
        tables = TableStore(open_object_store(str(tmp / "store")))
        objects = open_object_store(str(tmp / "store"))
        lat = settings.latents
        buckets = spatial_buckets(lat.aspect_ratios, lat.resolutions[0])
        analysis = tables.read_all("video_analysis").set_index("asset_id")
        index = tables.read_all("frame_index").set_index("asset_id")
        inventory = tables.read_all("raw_inventory").drop_duplicates("asset_id").set_index("asset_id")
        rows = []
        for clip in tables.read_all("clips").itertuples():
            a = analysis.loc[clip.asset_id]
            inv = inventory.loc[clip.asset_id]
            if isinstance(inv.member, str):
                continue  # tar members: same reader, skipped here for a plain path
            path = str(tmp / "bucket" / inv.key)
            pts = read_parquet_blob(objects, a.signals_blob)["pts"].tolist()
            indices = sample_frames(clip.first_frame, clip.last_frame, lat.frame_buckets, float(a.fps), lat.fps)
            if indices is None:
                continue
            with av.open(path) as c:
                full = upright(next(c.decode(video=0)).to_ndarray(format="rgb24"), int(a.rotation or 0)).shape
            sb = nearest_bucket(full[1], full[0], buckets)
            crop = center_crop(full[1], full[0], sb)
            packets = read_parquet_blob(objects, index.loc[clip.asset_id, "index_blob"])
            skip = nonref_between(packets, pts[indices[0]], pts[indices[-1]])
            t0 = cpu_seconds()
            ours = read_frames({"path": path}, pts, indices, int(a.rotation or 0), crop, (sb.width, sb.height), skip)
            t1 = cpu_seconds()
            naive, images = naive_read(path, pts, indices, int(a.rotation or 0), crop, (sb.width, sb.height))
            t2 = cpu_seconds()
            plain = read_frames({"path": path}, pts, indices, int(a.rotation or 0), crop, (sb.width, sb.height))
            same_as_plain = all((x == y).all() for x, y in zip(ours["frames"], plain["frames"], strict=True))
            assert same_as_plain, f"skipping non-reference frames changed the frames of {path}"
            del images
            rows.append({"file": Path(path).name, "clip_first": clip.first_frame, "sampled": len(indices),
                         "ours": ours["frames_decoded"], "naive": naive, "ours_cpu": t1 - t0, "naive_cpu": t2 - t1})
        print(f"{'file':<28}{'first':>7}{'sampled':>9}{'ours':>7}{'naive':>7}{'ratio':>7}{'cpu ours':>10}{'cpu naive':>10}")
        for r in rows:
            print(f"{r['file'][:27]:<28}{r['clip_first']:>7}{r['sampled']:>9}{r['ours']:>7}{r['naive']:>7}"
                  f"{r['naive'] / r['ours']:>7.2f}{r['ours_cpu']:>10.3f}{r['naive_cpu']:>10.3f}")

        def total(sel: list[dict], label: str) -> dict:
            ours, naive = sum(r["ours"] for r in sel), sum(r["naive"] for r in sel)
            cpu_o, cpu_n = sum(r["ours_cpu"] for r in sel), sum(r["naive_cpu"] for r in sel)
            out = {"clips": len(sel), "frames_ours": ours, "frames_naive": naive,
                   "frames_ratio": round(naive / ours, 2) if ours else None,
                   "cpu_ratio": round(cpu_n / cpu_o, 2) if cpu_o else None}
            print(f"{label}: {json.dumps(out)}")
            return out

        everything = total(rows, "all clips")
        not_first = total([r for r in rows if r["clip_first"] > 0], "clips not starting at frame 0")
        late = total([r for r in rows if r["file"].startswith("longgop") and r["clip_first"] >= 250],
                     "long-GOP clips starting after the first GOP")
        met = (late["frames_ratio"] or 0) >= 3
        print(f"target >= 3x fewer frames for late clips in long-GOP files: {'MET' if met else 'NOT MET'}")
    figures = {"all_clips": everything, "clips_not_starting_at_frame_0": not_first,
               "long_gop_clips_after_first_gop": late,
               "clips": [{**r, "ours_cpu": round(r["ours_cpu"], 4), "naive_cpu": round(r["naive_cpu"], 4)} for r in rows]}
    verdict = {"naive / ours frames decoded >= 3 (long-GOP clips starting after the first GOP)": {
        "ratio": late["frames_ratio"], "target": ">= 3", "met": met}}
    write_results(REPO / "bench" / "results" / "latents.json", sys.argv, figures, verdict, settings=vars(args))


if __name__ == "__main__":
    main()
