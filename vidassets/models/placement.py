"""Where a model runs and in which dtype (no model code here: every wrapper imports it)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Placement:
    """Where a model runs (``cpu`` / ``cuda:N``) and in which dtype it computes."""

    device: str = "cpu"
    dtype: str = "fp32"

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def onnx_providers(self) -> list:
        """ONNX Runtime providers for this placement (CUDA first when on a GPU and available)."""
        import onnxruntime

        if self.cuda and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            return [("CUDAExecutionProvider", {"device_id": int(self.device.partition(":")[2] or 0)}),
                    "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def autocast(self):
        """Context for torch inference in this placement's dtype (a no-op for fp32)."""
        import contextlib

        import torch

        if self.dtype != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda" if self.cuda else "cpu", dtype=torch.bfloat16)


def package_dir(module: str) -> Path:
    """A package's directory, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))
