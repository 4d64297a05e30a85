"""Frame identity across containers: the analysis pass, the clip reader (whole clips and the
latents' sampled frames) and the resolution ladder agree on which pictures a clip holds, for every
container/codec of the demo plus the awkward ones (MKV, VFR, H.264 and open-GOP MPEG-2 in MPEG-TS,
open-GOP HEVC, a tar member, a concatenated MPEG-TS whose pts restart).

Frame i of a video is the i-th picture a decoder outputs when the whole file is decoded from the
start; each test decodes every file that way once as the reference and checks, on real files, that

- the analysis pass recorded exactly those frames (pts, and luma means that follow the reference);
- ``iter_clip_frames`` returns the reference pictures, bit for bit, for every frame of a clip;
- ``read_frames`` (seek + skipped non-reference frames, as the latents' raw path uses it) returns the
  reference pictures at sampled indices, bit for bit;
- ``ladder_clip`` encodes, at each rung position, the reference picture its retiming plan names
  (rungs are encoded losslessly here so the comparison is exact), and never reports missing frames.

Clips are the production windows of the analysed shots plus windows starting on a keyframe, in the
middle of a GOP and running to the last frame, so that every reader has to seek."""

from __future__ import annotations

import hashlib
import itertools
import tarfile
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pandas as pd
import pytest

from vidassets.demo.bucket import decode_rgb, encode
from vidassets.media.analysis import analyze_source, upright
from vidassets.media.clip_reader import crop_and_resize, export_clip, iter_clip_frames, read_frames
from vidassets.media.clips import clip_rows
from vidassets.media.ladder import ladder_clip, output_ticks, rung_size, rung_yuv
from vidassets.media.packet_index import index_source, nonref_between
from vidassets.media.probe import probe_source
from vidassets_tests.media_files import vfr_mp4

PROBE_LIMITS = {"max_side": 8192, "min_side": 32, "max_pixel_frames": 4096 * 2160 * 30 * 3600, "min_frames": 2,
                "min_salvage_seconds": 1.0}
CLIP_PARAMS = {"min_seconds": 1.0, "max_seconds": 6.0, "trim_frames": 2}
# a rung below and one above every source rate: frames dropped by retiming, and every frame shown (some twice)
RUNGS = [{"name": "64p24", "short_side": 64, "fps": 24.0}, {"name": "64p60", "short_side": 64, "fps": 60.0}]
READ_SIZE = (48, 32)

DEMO = "raw/licensed/drop-0001/", "raw/licensed/drop-0002/"
CASES = {
    "mp4_h264": DEMO[0] + "bikes.mp4",
    "mp4_h264_720p": DEMO[0] + "bigbuckbunny.mp4",
    "mp4_hevc": DEMO[1] + "carphone_hevc.mp4",
    "webm_vp9": DEMO[1] + "carphone_vp9.webm",
    "mpegts_mpeg2": DEMO[1] + "bikes_mpeg2.ts",
    "avi_mjpeg": DEMO[1] + "carphone_mjpeg.avi",
    "rotated": DEMO[1] + "bigbuckbunny_rot90.mp4",
    "truncated": DEMO[1] + "bikes_truncated.mp4",
    "tar_member": DEMO[1] + "shard-000000.tar:clips/bikes_small.mp4",
    "mkv_h264": "made:mkv_h264",
    "vfr": "made:vfr",
    "mpegts_h264": "made:mpegts_h264",
    "mpegts_mpeg2_open_gop": "made:mpegts_mpeg2_open_gop",
    "mp4_hevc_open_gop": "made:mp4_hevc_open_gop",
    "mpegts_concatenated": "made:mpegts_concatenated",
}


def _make(name: str, bucket: Path, out: Path) -> Path:
    """The containers the demo does not hold as files of their own, made from its real footage."""
    bikes = bucket / DEMO[0] / "bikes.mp4"
    path = out / {"mkv_h264": "bikes.mkv", "vfr": "vfr.mp4", "mpegts_h264": "bikes_h264.ts",
                  "mpegts_mpeg2_open_gop": "bikes_mpeg2_bframes.ts", "mp4_hevc_open_gop": "bikes_hevc.mp4",
                  "mpegts_concatenated": "concatenated.ts"}[name]
    if name == "mpegts_concatenated":  # two recordings joined byte for byte: pts restart (not increasing)
        data = (bucket / DEMO[1] / "bikes_mpeg2.ts").read_bytes()
        half = len(data) // 2 - (len(data) // 2) % 188
        path.write_bytes(data[:half] + data)
        return path
    frames = decode_rgb(bikes, limit=120, start=60)  # spans two of its cuts
    small = (320, 136)
    if name == "mkv_h264":  # B-frames, ms timestamps
        encode(frames, path, "libx264", 25, container_format="matroska", size=small,
               options={"preset": "veryfast", "g": "30", "bf": "3"})
    elif name == "vfr":
        vfr_mp4(path, n=90)
    elif name == "mpegts_h264":
        encode(frames, path, "libx264", 25, container_format="mpegts", size=small,
               options={"preset": "veryfast", "g": "25", "bf": "2"})
    elif name == "mpegts_mpeg2_open_gop":  # B-frames before each I reference the previous GOP
        encode(frames, path, "mpeg2video", 25, container_format="mpegts", size=small, options={"g": "12", "bf": "2"})
    elif name == "mp4_hevc_open_gop":  # CRA keyframes with leading (RASL) pictures
        encode(frames, path, "libx265", 25, size=small,
               options={"preset": "ultrafast", "x265-params": "log-level=error:keyint=24:min-keyint=24:open-gop=1:bframes=3"})
    return path


@pytest.fixture(scope="module")
def made(demo_bucket: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("identity")
    return {name[len("made:"):]: _make(name[len("made:"):], demo_bucket, out)
            for name in CASES.values() if name.startswith("made:")}


def _spec(case: str, bucket: Path, made: dict[str, Path]) -> dict:
    where = CASES[case]
    if where.startswith("made:"):
        return {"path": str(made[where[len("made:"):]])}
    if ".tar:" in where:
        tar_path, member = where.split(":", 1)
        with tarfile.open(bucket / tar_path) as tar:
            info = tar.getmember(member)
        return {"path": str(bucket / tar_path), "offset": info.offset_data, "size": info.size}
    return {"path": str(bucket / where)}


def _open(spec: dict):
    from vidassets.media.source import open_container

    return open_container(spec)


def _reference_frames(spec: dict) -> Iterator[av.VideoFrame]:
    """Every frame a plain decode from the start outputs, with the analysis pass's tolerance of a
    corrupt packet or a truncated end (skip the packet; flush the decoder)."""
    with _open(spec) as container:
        vs = container.streams.video[0]
        packets = container.demux(vs)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                return
            except av.error.FFmpegError:
                yield from vs.codec_context.decode(None)
                return
            try:
                frames = packet.decode()
            except av.error.FFmpegError:
                continue
            yield from frames


def _digest(image: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()


def _clips(analysis: dict, times: np.ndarray, keyframes: list[int]) -> list[tuple[int, int]]:
    """Production windows of the analysed shots, and windows that make every reader seek: from the
    last keyframe but one, from just before it (open GOPs: a leading picture), from the middle of a
    GOP, to the very last frame."""
    n = len(times)
    rows = clip_rows("0" * 64, analysis["shots"], times, CLIP_PARAMS, "identity-test")
    clips = {(r["first_frame"], r["last_frame"]) for r in rows}
    later = [k for k in keyframes if 0 < k < n - 8]
    if later:
        k = later[-1] if len(later) == 1 else later[-2]
        clips.add((k, min(n - 1, k + 30)))
        clips.add((k - 2, min(n - 1, k + 20)))
    gop_start = later[0] if later else 0
    mid = min(gop_start + 5, n - 10)
    clips.add((mid, min(n - 1, mid + 40)))
    clips.add((max(1, n - 30), n - 1))
    return sorted(clips)


def _keyframe_indices(spec: dict, frame_pts: np.ndarray) -> list[int]:
    index = index_source(spec)
    key_pts = set(int(p) for p in index["arrays"]["pts"][index["arrays"]["keyframe"]])
    return [i for i, p in enumerate(frame_pts) if int(p) in key_pts]


def _packets(spec: dict) -> pd.DataFrame:
    return pd.DataFrame(index_source(spec)["arrays"])


@pytest.mark.parametrize("case", list(CASES))
def test_analysis_clip_reader_and_ladder_agree_on_every_clip_frame(case: str, demo_bucket: Path, made: dict,
                                                                   tmp_path: Path) -> None:
    spec = _spec(case, demo_bucket, made)
    facts = probe_source(spec, PROBE_LIMITS)
    assert facts["status"] in ("ok", "salvaged"), facts
    rotation = int(facts.get("rotation") or 0)
    analysis = analyze_source(spec, {}, facts)
    pts = np.asarray(analysis["frame_pts"], dtype=np.int64)
    times = (pts - pts[0]) * float(analysis["time_base"])
    keyframes = _keyframe_indices(spec, pts)
    clips = _clips(analysis, times, keyframes)
    packets = _packets(spec)

    # the plan of every reader, before the reference pass: which rung shows which source frame
    sampled = {clip: [int(i) for i in np.linspace(clip[0], clip[1], 9).round()] for clip in clips}
    plans = {clip: [output_ticks(times, *clip, r["fps"]) for r in RUNGS] for clip in clips}
    wanted_rgb = {i for ids in sampled.values() for i in ids}

    # the reference: a plain decode of the whole file from the start
    ref_pts, digests, luma, rgb_at, rung_ref = [], [], [], {}, []
    size = None
    small = _reader_size(facts)  # large sources are compared at a quarter size (same swscale call)
    for i, frame in enumerate(_reference_frames(spec)):
        ref_pts.append(frame.pts)
        image = upright(frame.to_ndarray(format="rgb24"), rotation) if not small or rotation or i in wanted_rgb else None
        digests.append(_digest(upright(frame.to_ndarray(format="rgb24", **small), rotation) if small else image))
        luma.append(float(frame.to_ndarray(format="gray").mean()) / 255.0)
        if i in wanted_rgb:
            rgb_at[i] = image
        if size is None:
            size = rung_size(*((frame.height, frame.width) if rotation in (90, 270) else (frame.width, frame.height)), 64)
        rung_ref.append(_rung_luma(frame, image, rotation, size))

    # 1. the analysis pass saw exactly the reference frames
    assert ref_pts == pts.tolist(), f"{case}: the analysis pass did not record the frames a plain decode gives"
    assert keyframes and len(clips) >= 3
    signal_luma = np.asarray(analysis["signals"])[:, 0]
    assert np.corrcoef(signal_luma, luma)[0, 1] > 0.98 or np.ptp(luma) < 0.02, case
    assert np.abs(signal_luma - np.asarray(luma)).max() < 0.03, case

    for first, last in clips:
        where = f"{case} clip {first}..{last}"
        # 2. the clip reader: every frame of the clip, bit for bit
        reader_size = (small["width"], small["height"]) if small else None
        got = [(i, _digest(img)) for i, img in iter_clip_frames(spec, pts, first, last, rotation, reader_size)]
        assert [i for i, _ in got] == list(range(first, last + 1)), where
        assert [d for _, d in got] == digests[first : last + 1], f"{where}: the clip reader returned other pictures"

        # 3. the latents' raw path: sampled frames with non-reference packets skipped
        indices = sampled[(first, last)]
        skip = nonref_between(packets, int(pts[indices[0]]), int(pts[indices[-1]]))
        read = read_frames(spec, pts.tolist(), indices, rotation, None, READ_SIZE, skip)
        for k, i in enumerate(indices):
            expected = crop_and_resize(rgb_at[i], None, READ_SIZE)
            assert np.array_equal(read["frames"][k], expected), f"{where}: read_frames frame {i} is another picture"

        # 4. the ladder: rung position j shows the source frame its plan names
        out_dir = tmp_path / f"{first}-{last}"
        out_dir.mkdir()
        skip = nonref_between(packets, int(pts[first]), int(pts[last]))
        result = ladder_clip(spec, pts.tolist(), times.tolist(), first, last, rotation, RUNGS, "libx264", 0,
                             "ultrafast", None, str(out_dir), 1, skip)
        for rung, plan in zip(result["rungs"], plans[(first, last)], strict=True):
            assert rung["frames"] == len(plan), where
            assert (rung["width"], rung["height"]) == size, where
            decoded = _rung_lumas(rung["path"])
            assert len(decoded) == len(plan), where
            for j, (y, source) in enumerate(zip(decoded, plan, strict=True)):
                diffs = [np.abs(y - rung_ref[k]).mean() for k in range(first, last + 1)]
                own = diffs[source - first]
                assert own < 0.5 and own <= min(diffs) + 1e-6, (
                    f"{where}: rung {rung['name']} frame {j} should show source frame {source} "
                    f"(mean abs diff {own:.2f}) but is closest to {first + int(np.argmin(diffs))}")


def _reader_size(facts: dict) -> dict:
    """A quarter of the coded size for sources above 640x360 (``to_ndarray`` keywords), else nothing."""
    width, height = int(facts["width"]), int(facts["height"])
    if width * height <= 640 * 360:
        return {}
    return {"width": width // 8 * 2, "height": height // 8 * 2}


def _rung_luma(frame: av.VideoFrame, upright_rgb: np.ndarray, rotation: int, size: tuple[int, int]) -> np.ndarray:
    """The luma a rung encoder gets for ``frame`` at ``size``: swscale's area filter on the decoded
    frame, or for rotated sources the upright RGB picture scaled with OpenCV's area filter."""
    if not rotation:
        from av.video.reformatter import VideoReformatter

        scaled = rung_yuv(VideoReformatter(), frame, *size)
    else:
        import cv2

        small = cv2.resize(upright_rgb, size, interpolation=cv2.INTER_AREA)
        scaled = av.VideoFrame.from_ndarray(small, format="rgb24").reformat(format="yuv420p")
    return scaled.to_ndarray()[: size[1]].astype(np.float32)


def _rung_lumas(path: str) -> list[np.ndarray]:
    with av.open(path) as c:
        vs = c.streams.video[0]
        assert vs.average_rate in (Fraction(24), Fraction(60))
        return [f.to_ndarray()[: f.height].astype(np.float32) for f in c.decode(vs)]


def test_the_mpeg_ts_seek_that_lands_a_gop_late_is_caught_in_the_sandbox(demo_bucket: Path, tmp_path: Path) -> None:
    """The reported failure, through the sandbox worker as the pipeline runs it: on the demo's
    MPEG-2 TS a seek to a keyframe's pts lands one GOP late; the ladder and the raw frame reader
    must still get every frame of a clip that starts on that keyframe, and so must a stream copy."""
    from vidassets.runtime.sandbox import Sandbox

    path = demo_bucket / DEMO[1] / "bikes_mpeg2.ts"
    spec = {"path": str(path)}
    analysis = analyze_source(spec, {}, {"counted_frames": 250})
    pts = [int(p) for p in analysis["frame_pts"]]
    times = [(p - pts[0]) * float(analysis["time_base"]) for p in pts]
    first = _keyframe_indices(spec, np.asarray(pts))[10]
    last = first + 40
    with _open(spec) as c:  # the container's own seek lands after the clip's first frame
        vs = c.streams.video[0]
        c.seek(pts[first], stream=vs, backward=True, any_frame=False)
        assert next(iter(c.decode(vs))).pts > pts[first]
    with Sandbox(2048) as box:
        ladder = box.run("ladder", {"spec": spec, "frame_pts": pts, "frame_times": times, "first_frame": first,
                                    "last_frame": last, "rotation": 0, "rungs": RUNGS[:1], "codec": "libx264",
                                    "crf": 23, "preset": "ultrafast", "crop": None, "out_dir": str(tmp_path)},
                         cpu_seconds=60, wall_seconds=60)
        assert ladder.ok, ladder.error
        assert ladder.value["rungs"][0]["frames"] == len(output_ticks(times, first, last, 24.0))
        read = box.run("read_frames", {"spec": spec, "frame_pts": pts, "indices": [first, first + 20, last],
                                       "size": [64, 48]}, cpu_seconds=60, wall_seconds=60)
        assert read.ok, read.error
    plain = [f.to_ndarray(format="rgb24") for f in _reference_frames(spec)]
    for k, i in enumerate([first, first + 20, last]):
        assert np.array_equal(read.value["frames"][k], crop_and_resize(plain[i], None, (64, 48)))
    # a stream copy of the clip starts on its own keyframe packet, not on the frame after it
    index = index_source(spec)
    out = tmp_path / "copy.mp4"
    assert export_clip(spec, pts, index["arrays"]["pts"][index["arrays"]["keyframe"]], first, last, str(out)) == "stream_copy"
    with av.open(str(out)) as c:
        copied = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(copied) == last - first + 1
    assert all(np.array_equal(img, plain[first + k]) for k, img in enumerate(copied))


def test_a_full_range_source_keeps_its_colours_in_every_rung(demo_bucket: Path, tmp_path: Path) -> None:
    """MJPEG decodes to full-range samples; a rung's H.264 stream declares limited range. The ladder
    converts (ladder-v2): written as they came, the rung showed ~9 levels of contrast too many."""
    import cv2

    path = demo_bucket / DEMO[1] / "carphone_mjpeg.avi"
    with av.open(str(path)) as container:
        frames = [(f.pts, float(f.time), f.to_ndarray(format="rgb24"))
                  for f in itertools.islice(container.decode(video=0), 30)]
    pts, times = [p for p, _, _ in frames], [t - frames[0][1] for _, t, _ in frames]
    rungs = [{"name": "96p25", "short_side": 96, "fps": 25.0}]
    spec = {"path": str(path), "offset": None, "size": None}
    result = ladder_clip(spec, pts, times, 0, 29, 0, rungs, "libx264", 12, "ultrafast", None, str(tmp_path))
    rung = result["rungs"][0]
    with av.open(rung["path"]) as container:
        shown = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(np.float32)
    source = cv2.resize(frames[0][2], (rung["width"], rung["height"]), interpolation=cv2.INTER_AREA).astype(np.float32)
    assert np.abs(shown - source).mean() < 4.0
