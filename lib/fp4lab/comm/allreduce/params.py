"""What an allreduce sweep may run: backends, timing modes, dtypes, their checks, and why a
backend cannot run here. The rank side and the driver both check with these."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from fp4lab.comm.allreduce import mscclpp_api
from fp4lab.comm.allreduce.sizes import format_size
from fp4lab.core import params, probe

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
    return tuple(params.items("modes", spec))


def size_limit(backend: str, world_size: int) -> tuple[int, str]:
    """The largest message a rank may allreduce here, and what bounds it: a quarter of one GPU's
    memory per nccl rank, a quarter of this machine's memory shared by its gloo ranks."""
    if backend == "nccl" and torch.cuda.is_available():
        memory = torch.cuda.get_device_properties(0).total_memory
        return memory // 4, f"a quarter of one GPU's {memory / 2**30:.0f} GiB"
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return memory // (4 * world_size), (
        f"a quarter of this machine's {memory / 2**30:.0f} GiB shared by {world_size} ranks"
    )


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
    limit, why = size_limit(backend, world_size)
    too_big = [s for s in sizes if s > limit]
    if too_big:
        raise ValueError(
            f"sizes contains {format_size(too_big[0])}, more than a rank can hold here "
            f"({format_size(limit)}: {why}); allowed values: sizes up to that"
        )
    supported = modes_for(backend)
    if not modes or any(m not in supported for m in modes):
        raise ValueError(
            f"modes={','.join(modes)!r} is not allowed for backend {backend!r}; "
            f"allowed values: {', '.join(supported)}"
        )


@functools.lru_cache(maxsize=8)
def read_mscclpp_api(python: str) -> dict:
    """The MSCCL++ API of the SGLang installed for interpreter ``python``
    (``mscclpp_api.describe``), read once per process; never raises."""
    if python == sys.executable:
        return mscclpp_api.describe()
    done = subprocess.run(
        [python, mscclpp_api.__file__], capture_output=True, text=True, timeout=600
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        error = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"importable": False, "error": error}
    return json.loads(lines[-1])


def unavailable(
    backend: str,
    world_size: int,
    machine: probe.Machine | None = None,
    *,
    per_node: int | None = None,
    sglang_python: Callable[[], str] | None = None,
) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks (``per_node`` of them on this node), or None when it can.

    For ``mscclpp`` the SGLang of the interpreter ``sglang_python()`` gives (called only once
    the GPUs are there; default: this interpreter) is asked what its MSCCL++ API supports
    (``mscclpp_api``); an interpreter that cannot be had is a reason, never an exception.
    """
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
        try:
            python = sglang_python() if sglang_python else sys.executable
        except RuntimeError as exc:
            return f"no SGLang interpreter for MSCCL++: {exc}"
        return mscclpp_api.unsupported(read_mscclpp_api(python), world_size)
    return None
