"""Inside a release's environment or the offline bundle: what a break of the release's breakable
CUDA graph costs, on the release's own ``BreakableCUDAGraph``, ``BreakableCUDAGraphCapture`` and
``eager_on_graph``.

The workload is fp4lab's, not a model: ``layers`` residual layers ``x + silu(x @ W)``, each
followed by a call of ``mix`` (a row normalisation times a scale) that stands where a prefill
layer's attention breaks the graph. Every variant runs the same calls: ``eager``; ``graph``, the
whole forward in one ``torch.cuda.graph``; and ``breakable`` at each count of ``break_counts``,
the release's capture with that many of the ``mix`` calls (spread evenly) wrapped by its
``eager_on_graph`` and the rest captured. Each capture is replayed on a fresh input and compared
with eager on it. On a CUDA device each replay is timed with CUDA events (``warmup`` replays, then
``iters``); without one the capture is imitated at its boundary (``capture.recorder``) and nothing
is timed. The release's modules load either installed (its environment) or, in the offline
bundle, from its two files (``FILES``) under their own names, the rest of SGLang being the
bundle's release (``bundled``); its ``weak_ref_tensor`` stands in at the kernel call
(``WEAK_REF``).

    python -m fp4lab.serving.capture.breakable_timing OUT FOLDER|- TOKENS,HIDDEN,LAYERS COUNTS ITERS,WARMUP [PLANT]
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from fp4lab.compile import frames, piecewise
from fp4lab.serving.capture import recorder

MODULE = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"
FILES = ("breakable_cuda_graph.py", "cuda_utils.py")
"""The release's files that make its breakable capture: the capture, replay and ``eager_on_graph``,
and its CUDA-runtime error check."""
WEAK_REF_MODULES = (
    "sglang.srt.compilation.weak_ref_tensor",  # 0.5.15-0.5.22
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",  # 0.5.23
)
WEAK_REF = {
    "name": "weak_ref_tensor_cuda_view",
    "module": " | ".join(WEAK_REF_MODULES),
    "why": "sgl_kernel's op library is not loaded (its CUDA binaries are not bundled, and are "
    "removed from CPU environments): a view of the same CUDA memory through "
    "__cuda_array_interface__ (compile.piecewise.weak_ref), which keeps no reference, as the "
    "kernel's does; off CUDA the tensor itself",
}
PLANTS = ("stale_argument",)
"""Faults a test plants: ``stale_argument`` gives ``mix`` a new scale on the compared step, a
Python value each capture keeps (0.5.23's ``eager_on_graph``: arguments keep their capture-time
identity), so no replay can equal eager."""
SCALE, NEW_SCALE = 0.5, 0.75


def load(folder: Path | None) -> types.ModuleType:
    """The release's breakable module: installed (``folder`` None), or its ``FILES`` in ``folder``
    under their own names, on the installed SGLang (packages the installed release lacks are
    made for them, pointing at ``folder``)."""
    for name in WEAK_REF_MODULES:
        standin = types.ModuleType(name, "fp4lab stand-in: weak_ref_tensor, compile.piecewise")
        standin.weak_ref_tensor = piecewise.weak_ref
        standin.weak_ref_tensors = lambda tensors: tree_map(
            lambda t: piecewise.weak_ref(t) if isinstance(t, torch.Tensor) else t, tensors
        )
        sys.modules[name] = standin
    if folder is not None:
        parts = MODULE.split(".")
        for depth in (len(parts) - 2, len(parts) - 1):
            package = types.ModuleType(".".join(parts[:depth]))
            package.__path__ = [str(folder)]
            sys.modules[package.__name__] = package
    return importlib.import_module(MODULE)


def files(module: types.ModuleType) -> dict[str, str]:
    """Each of the release's ``FILES`` that ran, and its SHA-256."""
    folder = Path(module.__file__).parent
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def positions(layers: int, breaks: int) -> frozenset[int]:
    """The ``breaks`` layers (of ``layers``) whose ``mix`` is a break, spread evenly."""
    if not 0 <= breaks <= layers:
        raise ValueError(f"break_counts: each count must be 0..{layers} (layers), not {breaks}")
    return frozenset(((k + 1) * layers) // breaks - 1 for k in range(breaks))


def mix(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Where a prefill layer's attention would break the graph: each row normalised, scaled."""
    return torch.nn.functional.normalize(x, dim=-1) * scale


class Counted:
    """``mix``, counting its calls: a replay runs each break's function once, eagerly."""

    def __init__(self) -> None:
        self.calls = 0
        self.__name__ = mix.__name__  # the release logs and wraps it by name

    def __call__(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        self.calls += 1
        return mix(x, scale)


class Stack:
    """``layers`` residual layers ``x + silu(x @ W)``, each followed by ``mix``."""

    def __init__(self, tokens: int, hidden: int, layers: int, device: str) -> None:
        g = torch.Generator().manual_seed(0)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.weights = [(torch.randn(hidden, hidden, generator=g) / hidden**0.5).to(device, dtype)
                        for _ in range(layers)]  # fmt: skip
        self.x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
        self.fresh = torch.randn(tokens, hidden, generator=g).to(device, dtype)

    def forward(self, x: torch.Tensor, scale: float, mixes: list[Callable]) -> torch.Tensor:
        for w, at in zip(self.weights, mixes, strict=True):
            x = at(x + torch.nn.functional.silu(x @ w), scale)
        return x


def _timed(step: Callable[[], Any], iters: int, warmup: int, cuda: bool) -> float | None:
    """Milliseconds per ``step`` on the GPU (CUDA events over ``iters`` after ``warmup``);
    None without CUDA (an imitated capture's CPU time says nothing of a GPU's)."""
    if not cuda:
        return None
    for _ in range(warmup):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure(release: types.ModuleType, shape: tuple[int, int, int], counts: list[int],
            timing: tuple[int, int], plant: str | None = None) -> list[dict]:  # fmt: skip
    """One row per variant: eager, graph, and breakable at each of ``counts`` breaks."""
    tokens, hidden, layers = shape
    iters, warmup = timing
    cuda = torch.cuda.is_available()
    stack = Stack(tokens, hidden, layers, "cuda" if cuda else "cpu")
    replay_scale = NEW_SCALE if plant == "stale_argument" else SCALE
    expected = stack.forward(stack.fresh, replay_scale, [mix] * layers)
    static = stack.x.clone()
    rows = [{"variant": "eager", "breaks": 0, "replay_ms": _timed(
        lambda: stack.forward(static, SCALE, [mix] * layers), iters, warmup, cuda)}]  # fmt: skip
    pool = torch.cuda.graph_pool_handle() if cuda else None
    stream = torch.cuda.Stream() if cuda else None  # the runner's capture stream, not the default
    counted = Counted()

    def compared(row: dict, out: torch.Tensor, replay: Callable[[], None], began: float) -> dict:
        _sync(cuda)
        row["capture_ms"] = (time.perf_counter() - began) * 1e3 if cuda else None
        static.copy_(stack.fresh)
        calls = counted.calls
        replay()
        _sync(cuda)
        diff = (out.float() - expected.float()).abs().max().item()
        row.update(eager_calls_per_replay=counted.calls - calls, max_abs_diff=diff,
                   max_abs_expected=expected.float().abs().max().item(),
                   equal=bool(torch.equal(out, expected)),
                   replay_ms=_timed(replay, iters, warmup, cuda))  # fmt: skip
        static.copy_(stack.x)
        return row

    for _ in range(2):  # the runner's two eager warm-ups before each capture
        stack.forward(static, SCALE, [mix] * layers)
    graph, began = torch.cuda.CUDAGraph(), time.perf_counter()
    with torch.cuda.graph(graph, pool=pool):
        out = stack.forward(static, SCALE, [mix] * layers)
    rows.append(
        compared({"variant": "graph", "breaks": 0, "segments": 1}, out, graph.replay, began)
    )
    broken = release.eager_on_graph(True)(counted)
    for count in counts:
        at = positions(layers, count)
        mixes = [broken if i in at else mix for i in range(layers)]
        for _ in range(2):
            stack.forward(static, SCALE, mixes)
        _sync(cuda)
        bcg, began = release.BreakableCUDAGraph(), time.perf_counter()
        with release.BreakableCUDAGraphCapture(cuda_graph=bcg, pool=pool, stream=stream):
            out = stack.forward(static, SCALE, mixes)
        row = {"variant": "breakable", "breaks": len(bcg._break_fns),
               "segments": len(bcg._segments), "break_layers": sorted(at)}  # fmt: skip
        rows.append(compared(row, out, bcg.replay, began))
    return rows


def main(out: Path, folder: str, shape: str, counts: str, timing: str, plant: str = "") -> int:
    found: dict = {"capture": "cuda" if torch.cuda.is_available() else "simulated",
                   "loaded_from": "installed" if folder == "-" else "files"}  # fmt: skip
    try:
        with contextlib.ExitStack() as stack:
            found["standins"] = [WEAK_REF]
            if found["capture"] == "simulated":
                found["standins"].append(stack.enter_context(recorder.simulated()))
            release = load(None if folder == "-" else Path(folder))
            found["files"] = files(release)
            if found["capture"] == "cuda":
                found["device"] = torch.cuda.get_device_name()
                found["sm"] = "{}.{}".format(*torch.cuda.get_device_capability())
            found["rows"] = measure(release, tuple(int(v) for v in shape.split(",")),
                                    [int(c) for c in counts.split(",")],
                                    tuple(int(v) for v in timing.split(",")), plant or None)  # fmt: skip
    except Exception as exc:  # the parent records it as not measured, with its frames
        found["error"] = frames.said(exc)
        found["traceback"] = traceback.format_exc()[-4000:]
    out.write_text(json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), *sys.argv[2:7]))
