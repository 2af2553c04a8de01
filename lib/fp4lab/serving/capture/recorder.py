"""CUDA-graph capture imitated at its boundary: ``torch.cuda.CUDAGraph`` and ``torch.cuda.graph``
replaced by a recorder, for a machine without a CUDA device.

A capture records every operator the block dispatches (a ``TorchDispatchMode``), with the very
tensors it read and wrote. A replay re-runs those operators on those tensors and writes each
result into the tensor the capture produced, so it reads whatever data sits at the captured
places now and leaves its output where the capture left it: what a CUDA graph does with its
fixed addresses. What it does not imitate: the graph pool's reuse of freed memory (captured
tensors stay alive here) and kernels that are not operators (none in SGLang's eager compiler).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fp4lab.compile import target


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    outputs: list | None
    """The captured results, leaf by leaf; None for an op whose result aliases its input."""


@dataclass
class RecordedGraph:
    """Stands for ``torch.cuda.CUDAGraph``: the operators of one capture, replayed in order."""

    keep_graph: bool = False
    ops: list[_Op] = field(default_factory=list)
    replays: int = 0
    _recording: _Recording | None = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Start recording (a segmented capture's begin; pool and mode are accepted, unused)."""
        self._recording = _Recording(self)
        self._recording.__enter__()

    def capture_end(self) -> None:
        self._recording.__exit__(None, None, None)
        self._recording = None

    def instantiate(self) -> None:
        """Nothing to build: the recorded operators are the graph."""

    def replay(self) -> None:
        self.replays += 1
        for op in self.ops:
            fresh = op.func(*op.args, **op.kwargs)
            if op.outputs is None:
                continue
            for captured, new in zip(op.outputs, tree_leaves(fresh), strict=True):
                if isinstance(new, torch.Tensor):
                    captured.copy_(new)


ALLOCATIONS = {
    torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided,
}  # fmt: skip
"""Allocations: no kernel in a CUDA graph, so not replayed (their memory keeps its data)."""


class _Recording(TorchDispatchMode):
    def __init__(self, into: RecordedGraph) -> None:
        super().__init__()
        self.into = into

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket not in ALLOCATIONS:
            aliases = any(r.alias_info is not None for r in func._schema.returns)
            self.into.ops.append(_Op(func, args, kwargs, None if aliases else tree_leaves(out)))
        return out


class graph(contextlib.ContextDecorator):
    """Stands for ``torch.cuda.graph``: records the block into ``cuda_graph`` (pool and stream
    are accepted and unused)."""

    def __init__(self, cuda_graph: RecordedGraph, pool: Any = None, stream: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        self.mode = _Recording(cuda_graph)

    def __enter__(self) -> None:
        self.mode.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)


def _current_stream(device: Any = None) -> torch.cpu.Stream:
    return torch.cpu.current_stream()


LISTED = {
    "name": "cuda_graph_recorder",
    "module": "torch.cuda",
    "why": "no CUDA device: torch.cuda.CUDAGraph and torch.cuda.graph record the operators a "
    "capture runs, with their tensors, and a replay re-runs them on those tensors and writes into "
    "the captured outputs (fixed addresses, as a CUDA graph); the graph pool's memory reuse is not "
    "imitated; torch.cuda's Stream, stream and current_stream are torch.cpu's (one stream)",
}
"""The stand-in as a record lists it."""


@contextlib.contextmanager
def simulated() -> Iterator[dict]:
    """``torch.cuda.CUDAGraph`` and ``torch.cuda.graph`` replaced by the recorder, and the
    capture's streams by the CPU's; yields the stand-in's listing."""
    with (
        target.attribute_replaced(torch.cuda, "CUDAGraph", RecordedGraph),
        target.attribute_replaced(torch.cuda, "graph", graph),
        target.attribute_replaced(torch.cuda, "Stream", torch.cpu.Stream),
        target.attribute_replaced(torch.cuda, "stream", torch.cpu.stream),
        target.attribute_replaced(torch.cuda, "current_stream", _current_stream),
    ):
        yield LISTED
