"""Where a model runs and in which dtype (no model code here: every wrapper imports it)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

CPU_RUN_FRAMES = 1
"""Frames per model run on the CPU. Batching there buys no CPU time, it costs some: measured at one
thread on 455x256 context frames, CPU-ms a frame alone vs in runs of 16: PP-OCRv4 detection 6.7 vs
10.2, NudeNet 320n 15.1 vs 16.6, open_nsfw 13.6 either way, MobileNetV2 22 vs 25. (A step still
groups the clips of several model calls into one task: that saves per-task overheads, not model
time.)"""


@dataclass(frozen=True)
class Placement:
    """Where a model runs (``cpu`` / ``cuda:N``) and in which dtype it computes."""

    device: str = "cpu"
    dtype: str = "fp32"

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def onnx_providers(self) -> list:
        """ONNX Runtime providers for this placement: the CPU's, or on a GPU the CUDA provider first.
        A GPU placement whose onnxruntime has no CUDA provider is an error, not a quiet CPU fallback
        (a pod that reserved a GPU would score on its CPU while its rows say cuda)."""
        import onnxruntime

        if not self.cuda:
            return ["CPUExecutionProvider"]
        available = onnxruntime.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise RuntimeError(f"models.device is {self.device} but onnxruntime {onnxruntime.__version__} has no "
                               f"CUDAExecutionProvider (it has {', '.join(available)}): install onnxruntime-gpu "
                               "(the GPU image: --build-arg ONNXRUNTIME=onnxruntime-gpu==<version>), or set models.device: cpu")
        return [("CUDAExecutionProvider", {"device_id": int(self.device.partition(":")[2] or 0)}), "CPUExecutionProvider"]

    def check_session(self, name: str, session) -> None:
        """An ONNX session built for a GPU placement runs on the CUDA provider (some packages build
        their own sessions): otherwise an error naming the model."""
        if self.cuda and session.get_providers()[:1] != ["CUDAExecutionProvider"]:
            raise RuntimeError(f"{name} was placed on {self.device} but its ONNX Runtime session runs on "
                               f"{session.get_providers()}: install onnxruntime-gpu or set models.device: cpu")

    def run_frames(self, batch_frames: int) -> int:
        """Frames per model run: ``batch_frames`` on a GPU, ``CPU_RUN_FRAMES`` on the CPU."""
        return batch_frames if self.cuda else CPU_RUN_FRAMES

    def torch_runs(self, frames: int, batch_frames: int) -> list[tuple[int, int, int]]:
        """(start, stop, shape) of the runs a torch model makes over ``frames`` frames: every run has
        the same shape, padded where short, so a frame's output never depends on which frames share
        its run (the kernels torch picks, and with them the last float bits, change with the batch
        shape)."""
        shape = self.run_frames(batch_frames)
        return [(start, min(start + shape, frames), shape) for start in range(0, frames, shape)]

    def autocast(self):
        """Context for torch inference in this placement's dtype (a no-op for fp32)."""
        import contextlib

        import torch

        if self.dtype != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda" if self.cuda else "cpu", dtype=torch.bfloat16)

    def cudnn_benchmark(self):
        """Context in which cuDNN times its convolution algorithms once per new shape and keeps the
        fastest (``torch.backends.cudnn.benchmark``), restored on exit so that other models of the
        process keep their setting. A no-op on the CPU."""
        import contextlib

        if not self.cuda:
            return contextlib.nullcontext()
        return _cudnn_benchmark()


def _cudnn_benchmark():
    import contextlib

    import torch

    @contextlib.contextmanager
    def scope():
        before = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark = before

    return scope()


def package_dir(module: str) -> Path:
    """A package's directory, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))
