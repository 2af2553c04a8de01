"""One call run eagerly with the audit's inputs, to its first kernel: what FlashInfer's own Python
says of those inputs, before any trace is blamed.

``call`` runs ``fn(*args, **kwargs)`` inside the simulation the trace runs in (fake CUDA tensors,
the simulated GPU and toolkit) with the kernel boundary of ``simulation`` in effect, records every
line of the audited package it executed, and names the outcome (``OUTCOMES``). The JIT spec
registry is restored after the call, so the call leaves no trace for the next one.
"""

from __future__ import annotations

import contextlib
import copy
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fp4lab.compile import frames
from fp4lab.compile.audit import simulation

OUTCOMES = {
    "completed": "the call returned (its kernels are registered ops with fakes)",
    "kernel": "the call reached a kernel: a JIT build, a cubin download or a kernel library "
    "(cuDNN, the CuTe DSL compiler, the CUDA driver)",
    "raised": "the package's own code raised for these inputs on this SM",
    "needs_values": "the call needs a tensor's values, which fake tensors do not have",
    "cpu_build": "the CPU build of torch cannot do what a CUDA build does here (or lacks a package "
    "a CUDA build brings, such as triton)",
}
"""How an eager call ends."""

CPU_BUILD = re.compile(
    r"not linked with support for cuda|not compiled with CUDA|compiled without CUDA"
    r"|dummy base class|arguments from the 'CUDA' backend",
    re.IGNORECASE,
)
"""What a CPU build of torch says where a CUDA build would not (e.g. a C++ binding that needs a
CUDA device guard: indexing a CUDA tensor, ``Tensor.cuda()``)."""
KERNEL_LIBRARY = re.compile(
    r"Unable to find symbol cudnn|CUDA driver version is insufficient|cudaError"
    r"|NVIDIA driver library|libcuda",
    re.IGNORECASE,
)
"""What a kernel library says when the machine has no GPU driver or library under it: the call
got as far as launching or compiling a kernel."""

_DATA_DEPENDENT = ("DataDependentOutputException", "GuardOnDataDependentSymNode")
_SM_WORDS = re.compile(
    r"compute capability|capabilit(y|ies) \d|\bsm_?\d{2,3}\b|\bSM ?\d{2,3}\b|architecture"
    r"|requires CUDA \d|CUDA \d+(\.\d+)? or later|CUDA version",
    re.IGNORECASE,
)


def in_package(file: str, package: str) -> bool:
    """Whether a file named as ``frames`` names it belongs to ``package`` (a folder or a module)."""
    return file.startswith(f"{package}/") or file == f"{package}.py"


@dataclass
class Eager:
    """How one eager call ended, where, and the lines of the package it ran."""

    outcome: str  # one of OUTCOMES
    exception: str | None = None
    message: str | None = None
    frame: str | None = None
    kernel: str | None = None
    names_sm: bool = False
    executed: set[str] = field(default_factory=set, repr=False)

    def ran(self, frame: frames.Frame | str | None) -> bool:
        """Whether the call executed ``frame``'s line (``file:line[:function]``)."""
        if frame is None:
            return False
        file, line = str(frame).split(":")[:2]
        return f"{file}:{line}" in self.executed

    def as_record(self) -> dict:
        data = asdict(self)
        data["executed_lines"] = len(data.pop("executed"))
        return data


@contextlib.contextmanager
def _lines(package: str) -> Iterator[set[str]]:
    """Every ``file:line`` of ``package`` executed in the block (files as ``frames`` names them)."""
    seen: set[str] = set()
    names: dict[str, str | None] = {}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            seen.add(f"{names[frame.f_code.co_filename]}:{frame.f_lineno}")
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if filename not in names:
            relative = frames.relative_path(filename)
            names[filename] = relative if in_package(relative, package) else None
        if names[filename] is None:
            return None
        seen.add(f"{names[filename]}:{frame.f_lineno}")
        return local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield seen
    finally:
        sys.settrace(previous)


@contextlib.contextmanager
def _registry_restored() -> Iterator[None]:
    """FlashInfer's JIT spec registry as it was before the block."""
    core = sys.modules.get("flashinfer.jit.core")
    registry = getattr(core, "jit_spec_registry", None)
    saved = {k: copy.copy(v) for k, v in vars(registry).items()} if registry is not None else {}
    try:
        yield
    finally:
        if registry is not None:
            vars(registry).update(saved)


def _chained_text(exc: BaseException) -> str:
    """The messages of ``exc`` and of every exception it was raised from or during."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(texts)


def classify(exc: BaseException, package: str) -> Eager:
    """The outcome an exception from the call means."""
    stack = frames.user_frames(traceback.extract_tb(exc.__traceback__))
    inside = [f for f in stack if in_package(f.file, package)]
    where = str(inside[-1]) if inside else (str(stack[-1]) if stack else None)
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    found = Eager("raised", f"{type(exc).__module__}.{type(exc).__qualname__}", first, where)
    boundary = simulation.boundary_frame(stack)
    if isinstance(exc, simulation.KernelReached):
        found.outcome, found.kernel = "kernel", str(exc)
    elif type(exc).__name__ in _DATA_DEPENDENT:
        found.outcome = "needs_values"
    elif CPU_BUILD.search(_chained_text(exc)) or isinstance(exc, ImportError):
        found.outcome = "cpu_build"  # an import: what a CUDA build of torch brings (triton)
    elif boundary is not None or KERNEL_LIBRARY.search(_chained_text(exc)):
        found.outcome = "kernel"
        found.kernel = f"{boundary.module.split('.')[0]} ({boundary})" if boundary else first
    found.names_sm = found.outcome == "raised" and bool(_SM_WORDS.search(_chained_text(exc)))
    return found


def call(fn: Callable, args: tuple, kwargs: dict, package: str = "flashinfer") -> Eager:
    """``fn(*args, **kwargs)`` run eagerly to its first kernel; never raises for the call."""
    with _registry_restored(), simulation.kernel_boundary(), _lines(package) as executed:
        try:
            with torch.no_grad():
                fn(*args, **kwargs)
            found = Eager("completed")
        except Exception as exc:  # every way the call ends is what is measured
            found = classify(exc, package)
    found.executed = set(executed)
    return found
