"""One callable through the blocker-chain walk: dynamo's verdict on this CPU machine and on the target.

``audit`` traces ``fn`` under ``torch.compile(fullgraph=True)`` with the target SM simulated
(``compile.stages.walk_blocker_chain``): each blocker met is removed by its staged remedy and
the trace runs again. Two answers come out of one walk:

* ``cpu``: the first attempt, what this machine sees with nothing staged;
* ``target``: the first attempt after only the CPU-artefact stages (simulated SM, populated
  arch set), i.e. what a machine with the target GPU would see; its stages are stated.

Nothing needs a kernel to run: where the traced program cannot run on CPU (its kernel is
CUDA-only), the walk is repeated on fake tensors (``FakeTensorMode``) and the record says so.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fp4lab.compile import stages

VERDICTS = ("one graph", "graph break", "unsupported", "undetermined on CPU")
"""Dynamo's verdict under fullgraph=True: one graph; a blocker dynamo reports as Unsupported
(fullgraph=False would break the graph there, so a piecewise runner must wrap the call); the
trace raised something else (the call cannot be traced as given); or the blocker is one no
stage removes on a CPU machine (a CUDA-device check on a CPU tensor, a torch without CUDA)."""
_CPU_ONLY = re.compile(r"not compiled with CUDA|Expected a cuda device|CUDA is not available", re.I)
TENSOR_MODES = ("auto", "real", "fake")
ROW_KEYS = (
    "step",
    "stage",
    "origin",
    "signature",
    "status",
    "exception",
    "message",
    "skipped_builtin",
    "blocker_frame",
    "graph_count",
    "seconds",
)
"""What an audit keeps of each walk row (``frames`` is kept for the two answers only)."""
STAGE_NOTES = {
    "simulated_sm": "the target SM and a CUDA build of torch simulated (CPU artefact)",
    "populated_arch_set": "FlashInfer's TARGET_CUDA_ARCHS holds the target (CPU artefact)",
    "patch_cuda_version": "the CUDA version read from torch.version.cuda, no nvcc (the story's msg 992)",
    "bypassed_jit_registry": "the JIT registry's first-registration bookkeeping skipped",
}
"""The stages a walk can apply, as the CLI's help names them."""


def verdict(row: dict, staged: bool = False) -> str:
    """One of VERDICTS for one walk row (``staged``: the CPU-artefact stages are in effect, so a
    device check left is one of the tensor's device, a CPU artefact no stage removes)."""
    if row["signature"] == "ok":
        return VERDICTS[0]
    if _CPU_ONLY.search(row["message"] or "") or (staged and row["signature"] == "device_check"):
        return VERDICTS[3]
    return VERDICTS[1] if row["status"] == "unsupported" else VERDICTS[2]


def target_index(rows: list[dict]) -> int:
    """The first row whose blocker no CPU-artefact stage removes: what the target GPU would see."""
    for i, following in enumerate(rows[1:]):
        if following["origin"] != "cpu_artefact":
            return i
    return len(rows) - 1


def custom_op(qualname: str) -> dict:
    """Whether ``ns::name`` is a registered torch op, and whether it has a fake or meta kernel."""
    from torch._library import simple_registry

    present = qualname in torch._C._dispatch_get_all_op_names()
    fake = present and (
        simple_registry.singleton.find(qualname).fake_impl.kernel is not None
        or torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta")
    )
    return {"qualname": qualname, "present": present, "fake_or_meta": bool(fake)}


def _walk(fn: Callable, build: Callable[[], tuple], sm: tuple[int, int]) -> list[dict]:
    args, kwargs = build()

    def call(*tensors: Any) -> Any:
        return fn(*tensors, **kwargs)

    with torch.no_grad():
        return stages.walk_blocker_chain(call, *args, sm=sm, until="never")


def _answer(row: dict, staged: bool = False) -> dict:
    return {
        "verdict": verdict(row, staged),
        "step": row["step"],
        "signature": row["signature"],
        "message": row["message"],
        "exception": row["exception"],
        "blocker_frame": row["blocker_frame"],
        "frames": row["frames"],
        "skipped_builtin": row["skipped_builtin"],
        "evidence": row["evidence"],
    }


def audit(
    fn: Callable,
    build: Callable[[], tuple],
    sm: tuple[int, int],
    *,
    tensors: str = "auto",
    op: str | None = None,
) -> dict:
    """The walk of ``fn(*args, **kwargs)`` (``build()`` gives them) on simulated ``sm``: both
    answers, the chain, the tensors used, the custom op ``op`` (``ns::name``) if one is named."""
    if tensors not in TENSOR_MODES:
        raise ValueError(f"tensors={tensors!r} is not allowed; allowed values: {TENSOR_MODES}")
    started = time.perf_counter()
    used = "fake" if tensors == "fake" else "real"
    with FakeTensorMode() if used == "fake" else contextlib.nullcontext():
        rows = _walk(fn, build, sm)
    note = None
    if tensors == "auto" and rows[-1]["status"] == "runtime_error":
        with FakeTensorMode():
            faked = _walk(fn, build, sm)
        if faked[-1]["signature"] == "ok" or len(faked) > len(rows):  # fake tensors got further
            note = f"on real CPU tensors: {rows[-1]['exception']}: {rows[-1]['message']}"
            used, rows = "fake", faked
    at = target_index(rows)
    staged = any(s["origin"] == "cpu_artefact" for s in rows[at]["stages_applied"])
    return {
        "sm": f"{sm[0]}.{sm[1]}",
        "tensors": used,
        "fake_because": note,
        "cpu": _answer(rows[0]),
        "target": _answer(rows[at], staged),
        "target_stages": [s["stage"] for s in rows[at]["stages_applied"]],
        "final": _answer(rows[-1], staged),
        "chain": [{k: r.get(k) for k in ROW_KEYS} for r in rows],
        "custom_op": custom_op(op) if op else None,
        "simulated": rows[at]["target"]["simulated"],
        "seconds": time.perf_counter() - started,
    }
