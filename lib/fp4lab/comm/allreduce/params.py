"""What an allreduce sweep may run: backends, timing modes, dtypes, their checks, and why a
backend cannot run here. The rank side and the driver both check with these."""

from __future__ import annotations

import importlib.util

import torch
import torch.distributed as dist

from fp4lab.core import probe

BACKENDS = ("gloo", "nccl", "mscclpp")
MODES = ("eager", "graph")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EXACT_INTEGERS = {"float32": 1 << 24, "bfloat16": 1 << 8, "float16": 1 << 11}
"""Up to these, every integer is representable: the exact-sum check's partial sums must stay below."""


def modes_for(backend: str) -> tuple[str, ...]:
    """The timing modes a backend supports (CUDA graphs need a GPU backend)."""
    return ("eager",) if backend == "gloo" else MODES


def parse_modes(spec: str, backend: str) -> tuple[str, ...]:
    """``"auto"`` -> every mode ``backend`` supports; otherwise the comma-separated modes named."""
    if spec == "auto":
        return modes_for(backend)
    return tuple(m.strip() for m in spec.split(",") if m.strip())


def validate(
    backend: str,
    sizes: list[int],
    world_size: int,
    iters: int,
    warmup: int,
    dtype: str,
    modes: tuple[str, ...],
) -> None:
    """Raise ValueError, naming the parameter and what is allowed, for any bad input."""
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not allowed; allowed values: {', '.join(BACKENDS)}"
        )
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; allowed values: {', '.join(DTYPES)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(
            f"world size {world_size!r} is too small; an allreduce needs at least 2 ranks (nproc x nnodes >= 2)"
        )
    for name, value, least in (("iters", iters, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r} must be an integer >= {least}")
    if 3 * world_size * (world_size + 1) // 2 > _EXACT_INTEGERS[dtype]:
        raise ValueError(
            f"dtype={dtype!r} cannot hold the exact sums of {world_size} ranks' check pattern; allowed values: float32"
        )
    itemsize = DTYPES[dtype].itemsize
    too_small = [s for s in sizes if s < itemsize]
    if too_small:
        raise ValueError(
            f"sizes contains {too_small[0]} bytes, less than one {dtype} element ({itemsize} bytes)"
        )
    supported = modes_for(backend)
    if not modes or any(m not in supported for m in modes):
        raise ValueError(
            f"modes={','.join(modes)!r} is not allowed for backend {backend!r}; "
            f"allowed values: {', '.join(supported)}"
        )


def _sglang_mscclpp_world_sizes() -> tuple[int, ...] | None:
    """The world sizes the installed SGLang's MSCCLPP communicator accepts, or None when it cannot be imported."""
    try:
        from sglang.srt.distributed.device_communicators.pymscclpp import PyMscclppCommunicator
    except Exception:  # absent, or broken on this machine: either way not usable
        return None
    return tuple(PyMscclppCommunicator._SUPPORTED_WORLD_SIZES)


def unavailable(
    backend: str,
    world_size: int,
    machine: probe.Machine | None = None,
    *,
    per_node: int | None = None,
) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks (``per_node`` of them on this node), or None when it can."""
    machine = machine or probe.machine()
    per_node = world_size if per_node is None else per_node
    if backend == "gloo":
        return None if dist.is_gloo_available() else "this torch build has no gloo backend"
    if not machine.cuda_available:
        return "no CUDA GPU visible to torch" + (
            "" if machine.torch_cuda else " (torch is a CPU build)"
        )
    if not dist.is_nccl_available():
        return "this torch build has no NCCL backend"
    if machine.gpu_count < 2:
        return f"needs 2 or more GPUs; this machine has {machine.gpu_count}"
    if per_node > machine.gpu_count:
        return f"{per_node} ranks need {per_node} GPUs on this node; it has {machine.gpu_count}"
    if backend == "mscclpp":
        if not machine.packages.get("sglang"):
            return "sglang is not installed (MSCCLPP is measured through SGLang's communicator)"
        if importlib.util.find_spec("mscclpp") is None:
            return "the mscclpp Python package is not importable"
        supported = _sglang_mscclpp_world_sizes()
        if supported is None:
            return "sglang's PyMscclppCommunicator cannot be imported here"
        if world_size not in supported:
            sizes = ", ".join(map(str, supported))
            return f"SGLang's MSCCLPP communicator supports world sizes {sizes}, not {world_size}"
    return None
