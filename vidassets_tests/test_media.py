"""Media core on real and awkward files: sandbox, probe, packet index, analysis pass, clips."""

from __future__ import annotations

import json
import time
from pathlib import Path

import av
import numpy as np
import pytest

from vidassets.config import Settings
from vidassets.media.analysis import analyze_source
from vidassets.media.clip_reader import export_clip, iter_clip_frames
from vidassets.media.clips import clip_rows, cut_windows
from vidassets.media.packet_index import index_source
from vidassets.media.probe import probe_source
from vidassets.runtime import tasks
from vidassets.runtime.sandbox import Sandbox
from vidassets_tests.media_files import make_awkward_files

SETTINGS = Settings()
LIMITS = SETTINGS.probe.model_dump()


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(memory_mb=2048) as box:
        yield box


@pytest.fixture(scope="module")
def awkward(demo_bucket: Path, tmp_path_factory) -> dict[str, Path]:
    return make_awkward_files(tmp_path_factory.mktemp("awkward"), demo_bucket / "raw/licensed/drop-0001/bikes.mp4")


def _probe(sandbox: Sandbox, path: Path) -> dict:
    size = path.stat().st_size if path.is_file() else 0
    return tasks.probe(sandbox, {"path": str(path)}, LIMITS, size)


EXPECTED = {
    "empty.mp4": ("quarantined", "empty"),
    "random.mp4": ("quarantined", "not a readable video container"),
    "page.mp4": ("quarantined", "not a readable video container"),
    "playlist.mp4": ("quarantined", "not a readable video container"),
    "fifo.mp4": ("quarantined", "not a regular file"),
    "one_frame.mp4": ("quarantined", "too short: 1 frame"),
    "tiny_32x24.mp4": ("quarantined", "32x24 below the minimum"),
    "truncated_index_at_end.mp4": ("quarantined", "not a readable video container"),
    "mpeg2.ts": ("ok", None),
    "vp9.webm": ("ok", None),
    "mjpeg.avi": ("ok", None),
    "hevc.mp4": ("ok", None),
    "vfr.mp4": ("ok", None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_awkward_files_get_the_right_status_and_reason(sandbox: Sandbox, awkward: dict, name: str) -> None:
    started = time.monotonic()
    facts = _probe(sandbox, awkward[name])
    status, reason = EXPECTED[name]
    assert facts["status"] == status, facts
    if reason:
        assert reason in facts["reason"]
    else:
        assert facts["counted_frames"] == 60 and facts["width"] == 320 or name == "vfr.mp4"
    assert time.monotonic() - started < 30  # nothing hangs (the FIFO above all)


def test_playlist_disguised_as_video_never_reads_other_files(awkward: dict) -> None:
    facts = probe_source({"path": str(awkward["playlist.mp4"])}, LIMITS)
    assert facts["status"] == "quarantined" and "container" not in facts


def test_vfr_file_is_flagged_with_right_frame_count(awkward: dict) -> None:
    facts = probe_source({"path": str(awkward["vfr.mp4"])}, LIMITS)
    assert facts["vfr"] is True and facts["counted_frames"] == 60
    index = index_source({"path": str(awkward["vfr.mp4"])})
    assert index["profile"]["vfr"] is True and index["profile"]["packets"] == 60


def test_rotated_file_is_reported_and_analysed_upright(demo_bucket: Path) -> None:
    path = demo_bucket / "raw/licensed/drop-0002/bigbuckbunny_rot90.mp4"
    facts = probe_source({"path": str(path)}, LIMITS)
    assert facts["rotation"] == 90 and (facts["display_width"], facts["display_height"]) == (720, 1280)
    result = analyze_source({"path": str(path)}, {"width": 320}, facts)
    assert result["context"][0]["width"] < result["context"][0]["height"]  # portrait after rotation
    w, h = result["analysis_size"]
    assert (w, h) == (568, 320)  # coded orientation; upright it is 320 wide
    # the upright frame equals np.rot90 of the coded frame, clockwise
    straight = demo_bucket / "raw/licensed/drop-0001/bigbuckbunny.mp4"
    same_frames = analyze_source({"path": str(straight)}, {"width": 320}, {"rotation": 0, "counted_frames": 132})
    assert result["frames_decoded"] == same_frames["frames_decoded"] == 132


def test_truncated_file_is_salvaged_to_its_clean_prefix(sandbox: Sandbox, demo_bucket: Path) -> None:
    path = demo_bucket / "raw/licensed/drop-0002/bikes_truncated.mp4"
    facts = _probe(sandbox, path)
    assert facts["status"] == "salvaged" and "clean prefix" in facts["reason"]
    assert 100 < facts["counted_frames"] < 250
    result = analyze_source({"path": str(path)}, {}, facts)
    assert facts["counted_frames"] - 3 <= result["frames_decoded"] <= facts["counted_frames"]


def test_too_large_is_refused_before_decoding(sandbox: Sandbox, demo_bucket: Path) -> None:
    limits = {**LIMITS, "max_pixel_frames": 1280 * 720 * 100}
    facts = tasks.probe(sandbox, {"path": str(demo_bucket / "raw/licensed/drop-0001/bigbuckbunny.mp4")}, limits, 1)
    assert facts["status"] == "quarantined" and "refused before decoding" in facts["reason"]
    assert facts["frames_decoded"] == 0


def test_sandbox_watchdog_cpu_limit_and_clean_environment(monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("SOME_API_TOKEN", "do-not-leak")
    with Sandbox(memory_mb=1024) as box:
        env = box.run("environment", {}, cpu_seconds=10, wall_seconds=30)
        assert env.ok and not any("AWS" in k or "TOKEN" in k for k in env.value["keys"])
        assert env.value["address_space_limit"] == 1024 * 1024 * 1024
        hung = box.run("sleep", {"seconds": 30}, cpu_seconds=60, wall_seconds=1)
        assert not hung.ok and "timed out" in hung.error and hung.seconds < 5
        burn = box.run("burn", {"seconds": 0}, cpu_seconds=1, wall_seconds=20)
        assert not burn.ok and "SIGXCPU" in burn.error
        assert box.run("sleep", {"seconds": 0}, cpu_seconds=5, wall_seconds=20).ok  # a fresh worker took over
        assert box.restarts == 2


def test_packet_index_frame_types_and_profile(demo_bucket: Path) -> None:
    bikes = index_source({"path": str(demo_bucket / "raw/licensed/drop-0001/bikes.mp4")})
    arrays, profile = bikes["arrays"], bikes["profile"]
    assert profile["packets"] == 250 and len(arrays["pts"]) == 250
    assert set(np.unique(arrays["frame_type"])) <= {1, 2, 3} and profile["b_share"] > 0.3
    assert np.all(arrays["frame_type"][arrays["keyframe"]] == 1)
    # H.264 B-frames here are non-reference and I frames always reference
    assert profile["nonref_share"] > 0.3 and np.all(arrays["is_ref"][arrays["keyframe"]] == 1)
    assert profile["bits_per_pixel"] > 0 and profile["gop_max"] >= profile["gop_mean"]
    # the index agrees with what a demuxer reports, byte for byte
    with av.open(str(demo_bucket / "raw/licensed/drop-0001/bikes.mp4")) as c:
        sizes = [p.size for p in c.demux(video=0) if p.size]
    assert sizes == arrays["size"].tolist()
    mjpeg = index_source({"path": str(demo_bucket / "raw/licensed/drop-0002/carphone_mjpeg.avi")})
    assert mjpeg["profile"]["i_share"] == 1.0 and mjpeg["profile"]["gop_max"] == 1


def _f1(found: list[int], truth: list[int], tolerance: int = 1) -> float:
    matched = sum(1 for t in truth if any(abs(f - t) <= tolerance for f in found))
    precision = matched / len(found) if found else 0.0
    recall = matched / len(truth) if truth else 1.0
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def test_shot_boundaries_on_the_hard_cut_compilation(demo_bucket: Path) -> None:
    truth = json.loads((demo_bucket.parent / "demo_truth.json").read_text())["compilation_cut_frames"]
    path = demo_bucket / "raw/licensed/drop-0002/compilation_hardcuts.mp4"
    facts = probe_source({"path": str(path)}, LIMITS)
    assert facts["counted_frames"] == 190
    for detector in ("adaptive", "content"):
        result = analyze_source({"path": str(path)}, {"detector": detector}, facts)
        assert _f1(result["cuts"], truth) >= 0.95, (detector, result["cuts"], truth)
        assert result["frames_decoded"] == 190  # every frame decoded exactly once
        assert [s[0] for s in result["shots"][1:]] == result["cuts"]
        assert len(result["context"]) == 16  # 7.6 s at 2 fps: t = 0, 0.5, ..., 7.5
        assert all(len(c["pdq"]) == 64 for c in result["context"])


def test_batched_signals_equal_the_per_frame_definition(demo_bucket: Path) -> None:
    """Signals are computed a batch of frames at a time; every batch size must give the per-frame
    definition exactly: luma statistics of each frame, motion as the mean absolute difference of
    consecutive blurred luma frames, and PySceneDetect's own content score (its unpatched detector)."""
    import cv2
    from scenedetect import ContentDetector
    from scenedetect.common import FrameTimecode

    from vidassets.media.analysis import LIMITED_RANGE_GAIN, FrameShrinker, luma_stats

    path = demo_bucket / "raw/licensed/drop-0002/compilation_hardcuts.mp4"
    facts = probe_source({"path": str(path)}, LIMITS)
    runs = {b: analyze_source({"path": str(path)}, {"batch_frames": b}, facts) for b in (1, 7, 16)}
    reference, library, previous = [], ContentDetector(), None
    with av.open(str(path)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            bgr, luma, limited = FrameShrinker(*runs[16]["analysis_size"])(frame)
            blurred = cv2.GaussianBlur(luma, (5, 5), 0)
            motion = 0.0 if previous is None else cv2.absdiff(blurred, previous).mean() * (LIMITED_RANGE_GAIN if limited else 1)
            previous = blurred
            library.process_frame(FrameTimecode(index, fps=25.0), bgr)
            reference.append((*luma_stats(luma, limited), motion, library._frame_score or 0.0))
    reference = np.asarray(reference, np.float32)
    for batch, result in runs.items():
        assert result["cuts"] == runs[16]["cuts"], batch
        np.testing.assert_allclose(result["signals"][:, :8], reference, rtol=0, atol=1e-4, err_msg=f"batch {batch}")
        np.testing.assert_array_equal(result["signals"][:, 8:], runs[16]["signals"][:, 8:])  # grid columns too
    assert runs[16]["signals"][:, 7].max() > 30  # the hard cuts are in it


def test_clip_reader_returns_exactly_the_clip_frames(demo_bucket: Path, tmp_path: Path) -> None:
    path = demo_bucket / "raw/licensed/drop-0002/compilation_hardcuts.mp4"
    result = analyze_source({"path": str(path)}, {}, {"counted_frames": 190})
    pts = result["frame_pts"]
    with av.open(str(path)) as c:
        plain = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    for first, last in [(0, 39), (45, 89), (90, 139), (141, 189), (120, 120)]:
        got = list(iter_clip_frames({"path": str(path)}, pts, first, last))
        assert [i for i, _ in got] == list(range(first, last + 1))
        assert all(np.array_equal(img, plain[i]) for i, img in got)
    index = index_source({"path": str(path)})
    keyframe_pts = index["arrays"]["pts"][index["arrays"]["keyframe"]]
    out = tmp_path / "clip.mp4"
    mode = export_clip({"path": str(path)}, pts, keyframe_pts, 45, 89, str(out))
    assert mode == "reencode"
    with av.open(str(out)) as c:
        assert sum(1 for _ in c.decode(video=0)) == 45
    copy = tmp_path / "copy.mp4"
    assert export_clip({"path": str(path)}, pts, keyframe_pts, 0, 39, str(copy)) == "stream_copy"
    with av.open(str(copy)) as c:
        assert sum(1 for _ in c.decode(video=0)) == 40


def test_clip_windows_split_long_shots_and_drop_short_ones() -> None:
    times = [i / 10 for i in range(700)]  # 70 s at 10 fps
    shots = [[0, 14], [15, 264], [265, 699]]  # 1.5 s, 25 s, 43.5 s
    windows = cut_windows(shots, times, min_seconds=2.0, max_seconds=20.0)
    assert [w[2] for w in windows] == [1, 1, 2, 2, 2]
    assert windows[0] == (15, 139, 1) and windows[1] == (140, 264, 1)
    assert all((b - a + 1) / 10 <= 20.0 for a, b, _ in windows)
    trimmed = cut_windows(shots, times, 2.0, 20.0, trim_frames=2)
    assert trimmed[0][0] == 17 and trimmed[-1][1] == 699
    rows = clip_rows("a" * 64, shots, times, {"min_seconds": 2.0, "max_seconds": 20.0, "trim_frames": 0}, "seg-v1")
    again = clip_rows("a" * 64, shots, times, {"min_seconds": 2.0, "max_seconds": 20.0, "trim_frames": 0}, "seg-v1")
    assert [r["clip_id"] for r in rows] == [r["clip_id"] for r in again]
    other = clip_rows("a" * 64, shots, times, {"min_seconds": 2.0, "max_seconds": 20.0, "trim_frames": 0}, "seg-v2")
    assert not {r["clip_id"] for r in rows} & {r["clip_id"] for r in other}


class _ConnectionCounter:
    """A loopback TCP server that counts every connection made to it (an HTTP server that never
    needs to answer: one accepted connection is already a leak)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0

        def serve() -> None:
            while True:
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    return
                self.connections += 1
                conn.close()

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _network_bait(root: Path, sample: Path, port: int) -> dict[str, Path]:
    from vidassets_tests.media_files import mov_with_external_reference

    url = f"http://127.0.0.1:{port}"
    hls = f"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2.0,\n{url}/seg0.ts\n#EXT-X-ENDLIST\n"
    master = f"#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=800000\n{url}/low.m3u8\n"
    concat = f"ffconcat version 1.0\nfile '{url}/a.mp4'\nfile 'crypto+{url}/b.mp4'\n"
    files = {"playlist.m3u8": hls, "playlist_as.mp4": hls, "master.m3u8": master, "concat.ffconcat": concat,
             "concat_as.mp4": concat, "url_as.mp4": f"{url}/video.mp4\n", "subfile.mp4": f"subfile,,start,0,end,0,,:{url}/x\n"}
    out = {}
    for name, text in files.items():
        (root / name).write_text(text)
        out[name] = root / name
    mov_with_external_reference(sample, root / "external_ref.mov", f"{url}/media.mov")
    out["external_ref.mov"] = root / "external_ref.mov"
    return out


def test_no_network_from_the_decoding_process(sandbox: Sandbox, demo_bucket: Path, tmp_path: Path, monkeypatch) -> None:
    """Playlists (HLS, master HLS, ffconcat), text files named .mp4 holding URLs and a MOV whose data
    reference is an http URL, all pointing at a loopback server: probed through the sandbox, each
    file gets a status and a reason and the server sees no connection. Then the first wall (the
    container whitelist) is taken down in-process: the protocol whitelist alone still lets nothing out."""
    from vidassets.media import source

    server = _ConnectionCounter()
    try:
        bait = _network_bait(tmp_path, demo_bucket / "raw/licensed/drop-0001/carphone.mp4", server.port)
        for name, path in bait.items():
            facts = _probe(sandbox, path)
            assert facts["status"] in ("quarantined", "ok") and (facts["status"] == "ok" or facts["reason"]), (name, facts)
            if name != "external_ref.mov":
                assert facts["status"] == "quarantined", (name, facts)
        assert server.connections == 0
        monkeypatch.setattr(source, "FORMAT_WHITELIST", source.FORMAT_WHITELIST + ",hls,concat,data")
        for path in bait.values():
            try:
                with source.open_container({"path": str(path)}) as container:
                    for _ in container.demux():
                        pass
            except Exception:  # noqa: BLE001 - refusing is the point
                pass
        assert server.connections == 0
        # control: the bait is live: a reader allowed onto http fetches the playlist's segment
        with pytest.raises(av.error.InvalidDataError):
            av.open(str(bait["playlist.m3u8"]), options={"protocol_whitelist": "file,http,tcp"}, timeout=5)
        time.sleep(0.2)
        assert server.connections >= 1
    finally:
        server.close()
