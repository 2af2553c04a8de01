"""What this machine has: package versions, device, SM, GPU count, nvcc; and what it can run.

It also holds the one piece of state the other modules share: whether a target GPU is
being simulated (set by ``fp4lab.compile.staging.simulated_target``), so that every
record says whether its SM was real or simulated.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

NEEDS = ("cpu", "gpu", "fp4-gpu", "multi-gpu")
"""What a notebook may declare it needs, weakest first."""

FP4_MIN_SM = (10, 0)
"""FP4 (E2M1) conversion instructions exist from Blackwell (SM100) on."""

PACKAGES = (
    "torch",
    "flashinfer-python",
    "sglang",
    "triton",
    "torchao",
    "transformers",
    "papermill",
)

_simulated_sm: tuple[int, int] | None = None


@dataclass(frozen=True)
class Machine:
    """A snapshot of the hardware and software that results depend on."""

    python: str
    platform: str
    cpu_count: int
    packages: dict[str, str | None]
    torch_cuda: str | None
    cuda_available: bool
    gpu_count: int
    device_name: str
    sm: tuple[int, int] | None
    nvcc_path: str | None
    nvcc_version: str | None

    def capabilities(self) -> set[str]:
        """The needs (see NEEDS) this machine meets."""
        have = {"cpu"}
        if self.cuda_available and self.gpu_count >= 1:
            have.add("gpu")
            if self.sm is not None and self.sm >= FP4_MIN_SM:
                have.add("fp4-gpu")
        if self.gpu_count >= 2:
            have.add("multi-gpu")
        return have

    def missing(self, need: str) -> str | None:
        """Why this machine cannot meet ``need``, or None when it can."""
        if need not in NEEDS:
            raise ValueError(f"need={need!r} is not known; allowed values: {', '.join(NEEDS)}")
        if need in self.capabilities():
            return None
        if need == "gpu":
            return "no CUDA GPU visible to torch" + (
                "" if self.torch_cuda else " (torch is a CPU build)"
            )
        if need == "fp4-gpu":
            return f"needs SM{FP4_MIN_SM[0]}{FP4_MIN_SM[1]}+ (Blackwell); this machine has " + (
                f"SM{self.sm[0]}{self.sm[1]} ({self.device_name})" if self.sm else "no CUDA GPU"
            )
        return f"needs 2 or more GPUs; this machine has {self.gpu_count}"

    def as_dict(self) -> dict:
        """The snapshot as plain data; nvcc's location is kept as its file name, not this machine's path."""
        data = asdict(self)
        data["nvcc_path"] = os.path.basename(self.nvcc_path) if self.nvcc_path else None
        return data


def package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it; None when absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvcc() -> tuple[str | None, str | None]:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    path = shutil.which("nvcc") or (
        os.path.join(cuda_home, "bin", "nvcc")
        if cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc"))
        else None
    )
    if path is None:
        return None, None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return path, None
    match = re.search(r"release (\d+\.\d+)", out)
    return path, match.group(1) if match else None


@functools.cache
def machine() -> Machine:
    """Probe once per process: versions, device, SM, GPU count, nvcc."""
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    nvcc_path, nvcc_version = _nvcc()
    return Machine(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        cpu_count=os.cpu_count() or 1,
        packages={name: package_version(name) for name in PACKAGES},
        torch_cuda=torch.version.cuda,
        cuda_available=cuda,
        gpu_count=count,
        device_name=torch.cuda.get_device_name(0) if count else "cpu",
        sm=tuple(torch.cuda.get_device_capability(0)) if count else None,
        nvcc_path=nvcc_path,
        nvcc_version=nvcc_version,
    )


def target() -> dict:
    """The SM the experiments act on: the real GPU's, or the simulated one, and which."""
    if _simulated_sm is not None:
        return {"sm": f"{_simulated_sm[0]}.{_simulated_sm[1]}", "simulated": True}
    real = machine().sm
    return {"sm": f"{real[0]}.{real[1]}" if real else None, "simulated": False}


@contextlib.contextmanager
def simulating(sm: tuple[int, int]) -> Iterator[None]:
    """Mark everything recorded inside the block as made against a simulated target SM."""
    global _simulated_sm
    previous, _simulated_sm = _simulated_sm, sm
    try:
        yield
    finally:
        _simulated_sm = previous
