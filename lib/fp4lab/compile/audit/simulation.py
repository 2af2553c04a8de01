"""The machine the audit simulates on a CPU: a CUDA build of torch with one GPU of the target SM
and (for the eager call only) the kernel boundary; its CUDA toolkit is ``toolkit``'s.

* ``simulated_cuda``: torch's CUDA runtime answers as one GPU of ``sm`` (device count, current
  device, properties, streams, RNG state, ``torch.version.cuda``). Only the runtime bindings
  below ``torch.cuda``'s Python functions are replaced, so FlashInfer and dynamo meet torch's own
  ``torch.cuda.get_device_capability`` & co. and dynamo applies its own rules to them. Tensors
  are fake CUDA tensors (``FakeTensorMode``), so nothing needs a kernel to run.
* ``kernel_boundary``: for the eager call, the point where FlashInfer hands work to CUDA (a JIT
  build, a cubin download, a CuTe DSL compile) raises ``KernelReached`` instead; a cuDNN call
  fails inside its own package, which ``boundary_frame`` recognises. The trace always meets
  FlashInfer's real code.

Every context manager restores what it changed on exit, even when the block raises.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fp4lab.compile import target
from fp4lab.core import probe

CUDA_VERSION = "12.9"
"""The CUDA build torch claims and the toolkit's nvcc reports (FlashInfer's SM120 kernels need
12.8 or later, 0.6.11+ compare against 12.9)."""

STANDINS = (
    {
        "name": "simulated_cuda_runtime",
        "replaces": "torch._C CUDA bindings, torch.cuda._get_device_properties, "
        "torch.cuda.default_generators, torch.cuda.Stream/Event/MemPool and the pool bindings, "
        "dynamo's copies of torch.cuda._exchange_device, torch.version.cuda",
        "why": "this torch is a CPU build; a CUDA build with one GPU of the target SM answers "
        "these",
    },
    {
        "name": "fake_cuda_tensors",
        "replaces": "every tensor input",
        "why": "FakeTensorMode tensors on device cuda: shapes, dtypes and devices without data",
    },
    {
        "name": "cuda_toolkit",
        "replaces": "nvcc",
        "why": f"a script answering `nvcc --version` with release {CUDA_VERSION}: FlashInfer "
        "queries the toolkit; nothing is compiled",
    },
    {
        "name": "kernel_boundary",
        "replaces": "flashinfer.jit.cpp_ext.run_ninja, flashinfer.jit.cubin_loader.download_file, "
        "cutlass.base_dsl.dsl.BaseDSL._preprocess_and_replace_code",
        "why": "the eager call (and the building of its inputs) stops where FlashInfer would "
        "compile a kernel (a JIT build, a CuTe DSL compile) or download a cubin (no CUDA, no "
        "network here); the trace meets the real functions",
    },
)
"""What stands in for what, listed in every record."""

CUTE_DSL_COMPILE = ("cutlass.base_dsl.dsl", "BaseDSL", "_preprocess_and_replace_code")
"""The first step of every CuTe DSL compile (``cute.compile`` and a direct ``@cute.jit`` call):
the preprocessing of the ``@cute.jit`` function (module, class, static method)."""
BOUNDARY_PACKAGES = ("cudnn", "cutlass", "cuda", "tvm_ffi", "nvidia", "triton")
"""Packages whose frames mean the call reached a kernel library (cuDNN, the CuTe DSL compiler,
the CUDA driver bindings, the compiled-module loader, Triton)."""

_MISSING = object()
DEVICE_KEYS = ("device", "device_index", "device_id", "device_key")
"""The parameter names of FlashInfer's memoised per-device queries (``device_caches_cleared``)."""
_caches_sm: tuple[int, int] | None = None


class KernelReached(Exception):
    """The eager call reached a kernel launch or build (``kernel_boundary``)."""


@contextlib.contextmanager
def _replaced(pairs: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``owner.name`` set to its value for the block (added where absent), then restored."""
    previous = []
    try:
        for owner, name, value in pairs:
            previous.append((owner, name, getattr(owner, name, _MISSING)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(previous):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _properties(sm: tuple[int, int]) -> Any:
    """Device properties of the target, as the type dynamo treats as a constant."""
    props = object.__new__(torch.cuda._CudaDeviceProperties)  # the CPU build's placeholder type
    values = dict(
        name=f"simulated SM{sm[0]}{sm[1]}", major=sm[0], minor=sm[1], multi_processor_count=148,
        total_memory=96 * 2**30, L2_cache_size=96 * 2**20, warp_size=32, is_integrated=False,
        max_threads_per_multi_processor=1536, shared_memory_per_block_optin=232448,
        shared_memory_per_multiprocessor=233472, regs_per_multiprocessor=65536, uuid="simulated",
    )  # fmt: skip
    for name, value in values.items():
        setattr(props, name, value)
    return props


class _Stream:
    """A CUDA stream of the simulated GPU: the default stream of device 0."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device, self.priority = torch.device("cuda", 0), priority
        self.stream_id, self.device_index, self.device_type, self.cuda_stream = 0, 0, 1, 0

    def wait_stream(self, stream: Any) -> None: ...
    def wait_event(self, event: Any) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool:
        return True

    def record_event(self, event: Any = None) -> Any:
        return event or _Event()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None: ...


class _MemPool:
    """A memory pool of the simulated GPU (allocations route nowhere: tensors are fake)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.id = (0, 1)


class _Event:
    """A CUDA event of the simulated GPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def record(self, stream: Any = None) -> None: ...
    def wait(self, stream: Any = None) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def simulates(sm: tuple[int, int]) -> bool:
    """Whether ``sm`` must be simulated here (no real GPU of that SM)."""
    machine = probe.machine()
    return not (machine.cuda_available and machine.sm == sm)


@contextlib.contextmanager
def simulated_cuda(sm: tuple[int, int]) -> Iterator[dict]:
    """torch as a CUDA build with one GPU of ``sm``, and FlashInfer's arch set holding it; yields
    the target as records name it. A no-op where a real GPU of ``sm`` is present."""
    if not simulates(sm):
        yield probe.target()
        return
    from torch._dynamo import device_interface as interface
    from torch._dynamo.variables import ctx_manager as contexts

    c = torch._C
    stream = (0, 0, 1)  # stream id, device index, device type (CUDA)
    props = _properties(sm)
    pairs = [
        (c, "_cuda_getDeviceCount", lambda: 1),
        (c, "_cuda_getDevice", lambda: 0),
        (c, "_cuda_setDevice", lambda device: None),
        (c, "_cuda_exchangeDevice", lambda device: 0),
        (c, "_cuda_maybeExchangeDevice", lambda device: 0),
        (c, "_cuda_getCurrentRawStream", lambda device=0: 0),
        (c, "_cuda_getCurrentStream", lambda device=0: stream),
        (c, "_cuda_getDefaultStream", lambda device=0: stream),
        (c, "_cuda_synchronize", lambda: None),
        (c, "_cuda_isCurrentStreamCapturing", lambda: False),
        (torch.cuda.graphs, "_cuda_isCurrentStreamCapturing", lambda: False),
        (c, "_cuda_getArchFlags", lambda: f"sm_{sm[0]}{sm[1]}"),
        (torch.cuda, "_initialized", True),
        (torch.cuda, "_get_device_properties", lambda device=None: props),
        (torch.cuda, "_exchange_device", lambda device: 0),
        (torch.cuda, "_maybe_exchange_device", lambda device: 0),
        (torch.cuda, "_cached_device_count", 1),
        (torch.cuda, "default_generators", (torch.Generator(),)),
        (torch.cuda, "Stream", _Stream),
        (torch.cuda, "Event", _Event),
        (torch.cuda, "MemPool", _MemPool),
        (torch.cuda.memory, "MemPool", _MemPool),
        (torch.cuda.memory, "_cuda_beginAllocateCurrentThreadToPool", lambda device, pool: None),
        (torch.cuda.memory, "_cuda_endAllocateToPool", lambda device, pool: None),
        (torch.cuda.memory, "_cuda_releasePool", lambda device, pool: None),
        (interface.CudaInterface, "exchange_device", staticmethod(lambda device: 0)),
        (interface.CudaInterface, "maybe_exchange_device", staticmethod(lambda device: 0)),
        (contexts.CUDADeviceVariable, "_exchange_fn", staticmethod(lambda device: 0)),
        (contexts.CUDADeviceVariable, "_maybe_exchange_fn", staticmethod(lambda device: 0)),
        (torch.version, "cuda", CUDA_VERSION),
    ]  # fmt: skip
    device_caches_cleared(sm)
    with _replaced(pairs), probe.simulating(sm), target.populated_arch_set(sm):
        yield probe.target()


def device_caches_cleared(sm: tuple[int, int]) -> int:
    """FlashInfer's memoised per-device queries (``get_compute_capability`` and its kin, keyed by
    the device, not the SM) forgotten when the simulated SM changes, so no SM's answers reach the
    next one simulated in the same process; how many were cleared."""
    global _caches_sm
    if _caches_sm == sm:
        return 0
    cleared = 0
    for module in target.flashinfer_modules():
        for value in list(vars(module).values()):
            if (
                isinstance(value, functools._lru_cache_wrapper)
                and value.__module__ == module.__name__
            ):
                with contextlib.suppress(TypeError, ValueError):  # no signature to read
                    if set(inspect.signature(value).parameters) & set(DEVICE_KEYS):
                        value.cache_clear()
                        cleared += 1
    _caches_sm = sm
    return cleared


def _reached(what: str) -> Any:
    """A stand-in raising KernelReached, naming ``what`` and the last part of its first
    argument (a JIT build folder is named by its module, a cubin by its file)."""

    def stop(*args: Any, **kwargs: Any) -> Any:
        part = str(args[0]).rstrip("/").rsplit("/", 1)[-1] if args else ""
        raise KernelReached(f"{what} {part}".strip())

    return stop


def _compile_reached(func: Any) -> None:
    """The stand-in for ``CUTE_DSL_COMPILE``: KernelReached naming the ``@cute.jit`` function."""
    raise KernelReached(f"CuTe DSL compile of {getattr(func, '__qualname__', func)}")


@contextlib.contextmanager
def kernel_boundary() -> Iterator[None]:
    """For an eager call: FlashInfer's kernel build (``run_ninja``) and cubin download
    (``download_file``) raise ``KernelReached`` wherever a module imported them, and so does a
    CuTe DSL compile (``CUTE_DSL_COMPILE``) where the CuTe DSL is imported and has that step."""
    with contextlib.ExitStack() as stack:
        for module, name, what in (
            ("flashinfer.jit.cpp_ext", "run_ninja", "JIT build of"),
            ("flashinfer.jit.cubin_loader", "download_file", "cubin download of"),
        ):
            original = getattr(sys.modules.get(module), name, None)
            if original is not None:
                stack.enter_context(target.rebound(name, original, _reached(what)))
        module, owner, name = CUTE_DSL_COMPILE
        dsl = getattr(sys.modules.get(module), owner, None)
        step = vars(dsl).get(name) if isinstance(dsl, type) else None
        if isinstance(step, staticmethod):  # restored as the static method it is
            stack.callback(setattr, dsl, name, step)
            setattr(dsl, name, staticmethod(_compile_reached))
        yield


def boundary_frame(frames: list[Any]) -> Any | None:
    """The first frame of a kernel library (``BOUNDARY_PACKAGES``) in ``frames``, if any."""
    for frame in frames:
        if frame.module.split(".")[0] in BOUNDARY_PACKAGES:
            return frame
    return None


def fake_cuda() -> FakeTensorMode:
    """The tensor mode of an audited call: fake tensors (real ones met are made fake)."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def on_gpu(build: Callable[[], tuple]) -> tuple:
    """``build()`` with factories creating their tensors on the (simulated) GPU; call it inside
    ``fake_cuda`` and ``simulated_cuda``."""
    with torch.device("cuda"):
        return build()
