"""One call audited: dynamo and an eager call on the same inputs, on a simulated GPU, and the
verdict from both (eager first: a trace is blamed only where the eager call accepted the inputs).

``audit`` makes the call's inputs as fake CUDA tensors inside ``simulation.simulated_cuda`` (the
target SM, a CUDA build of torch) and ``toolkit.installed`` (the install mode), then:

1. traces the call under ``torch.compile(fullgraph=True)``; each blocker with a remedy of the
   story (``stages``: the CUDA version from torch, the JIT registry's bookkeeping) is removed in
   turn and the trace runs again (the ``chain``: what a user meets next);
2. calls it eagerly with the same inputs, to its first kernel (``eager``);
3. decides (``decide``, ``VERDICTS``).

An entry whose first blocker lies in FlashInfer's CUDA toolkit query is traced once more with
CUDA_HOME set (install mode ``jit_cuda_home``); the ``prebuilt`` mode is read from the frames
(``prebuilt``). Where the simulation meets the CPU build of torch (a C++ binding needing a CUDA
device guard), the call is tried once on real CPU tensors: only "one graph" there is kept, and
the record says which tensors decided.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from fp4lab.compile import stages, trace
from fp4lab.compile.audit import eager, simulation, toolkit

VERDICTS = (
    "one graph",
    "graph break",
    "compile error",
    "input rejected",
    "target unsupported",
    "undetermined on CPU",
)
"""How an audited call ends (``VERDICT_NOTES`` says each)."""
VERDICT_NOTES = {
    "one graph": "fullgraph=True compiled the call to one graph",
    "graph break": "dynamo stopped (Unsupported) where the eager call with the same inputs went "
    "on: a piecewise runner must wrap the call in a custom op",
    "compile error": "dynamo raised another error where the eager call went on (e.g. a node run "
    "on fake tensors): the call must be wrapped too",
    "input rejected": "the eager call raised FlashInfer's own error for these inputs: the input "
    "spec must change; nothing is said of the trace",
    "target unsupported": "the eager call raised because the target (its SM, or CUDA "
    f"{simulation.CUDA_VERSION}) is not one the entry point supports",
    "undetermined on CPU": "the CPU build of torch (or fake tensors, which carry no values) "
    "stopped the call before the line where the trace broke, or building its inputs reached a "
    "kernel (a JIT build, a cubin download): no verdict, kept out of every count",
}
MUST_WRAP = ("graph break", "compile error")
"""Verdicts that mean a piecewise runner must wrap the call."""
REMEDIES = ("story", "fresh_process")
"""The stage origins the chain may apply (the target itself is simulated from step 0)."""
STAGE_NOTES = {
    stages.PATCH_CUDA_VERSION.name: "the CUDA version read from torch.version.cuda, no nvcc (the "
    "story's msg 992)",
    stages.BYPASSED_JIT_REGISTRY.name: "the JIT registry's first-registration bookkeeping skipped",
}
"""The remedies the chain applies in turn, as the CLI's help names them."""
TENSORS = ("fake cuda", "cpu")
"""The tensors of a call: fake CUDA tensors on the simulated GPU, or (fallback) real CPU ones."""
_TOOLKIT = ("get_cuda_path", "get_cuda_version", "is_cuda_version_at_least")
_CUBIN = ("load_cubin", "get_artifact", "get_cubin")
_BUILD_AND_LOAD = ("build_and_load", "try_load", "aot_path", "aot_artifacts", "get_aot_artifacts")
TRACE_KEYS = ("signature", "status", "exception", "message", "explanation", "blocker_frame",
              "frames", "skipped_builtin", "gb_type", "graph_count", "seconds")  # fmt: skip
CHAIN_KEYS = ("step", "stage", "origin", "story", "signature", "status", "message",
              "blocker_frame", "skipped_builtin", "graph_count", "seconds")  # fmt: skip


def custom_op(qualname: str) -> dict:
    """Whether ``ns::name`` is a registered torch op, and whether it has a fake or meta kernel."""
    from torch._library import simple_registry

    present = qualname in torch._C._dispatch_get_all_op_names()
    fake = present and (
        simple_registry.singleton.find(qualname).fake_impl.kernel is not None
        or torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta")
    )
    return {"qualname": qualname, "present": present, "fake_or_meta": bool(fake)}


def _functions(row: dict) -> list[str]:
    return [f.rsplit(":", 1)[-1] for f in row.get("frames") or []]


def site(row: dict, package: str = "flashinfer") -> str | None:
    """The innermost frame of ``package`` on a trace row's stack: the package's line that led
    to the blocker (the blocker frame itself when the stack has none)."""
    inside = [f for f in row.get("frames") or [] if eager.in_package(f.split(":")[0], package)]
    return inside[-1] if inside else row.get("blocker_frame")


def decide(first: eager.Eager, row: dict | None, package: str = "flashinfer") -> tuple[str, str]:
    """One of VERDICTS for a call from its eager outcome and its first trace row, and how."""
    if first.outcome == "raised":
        verdict = "target unsupported" if first.names_sm else "input rejected"
        return verdict, f"eager: {first.exception}: {first.message} at {first.frame}"
    said = f"eager {first.outcome}" + (f" ({first.kernel})" if first.kernel else "")
    said += f" at {first.frame}" if first.frame and first.outcome != "kernel" else ""
    if row is None:
        return "undetermined on CPU", f"the inputs could not be built here: {said}"
    if row["status"] == "compiled":
        return "one graph", f"one graph; {said}"
    at = site(row, package)
    dynamo = f"dynamo: {row['message']} at {row['blocker_frame']}"
    text = " ".join([row.get("message") or "", *(row.get("explanation") or []),
                     *(row.get("hints") or []), row.get("debug_context") or ""])  # fmt: skip
    if eager.CPU_BUILD.search(text):
        return "undetermined on CPU", f"{dynamo}: the CPU build of torch, not the call; {said}"
    if first.outcome in ("cpu_build", "needs_values") and not first.ran(at):
        return "undetermined on CPU", f"{dynamo}; {said}, before reaching {at}"
    verdict = "graph break" if row["status"] == "unsupported" else "compile error"
    passed = "ran that line" if first.ran(at) else "took another path"
    return verdict, f"{dynamo}; the eager call with the same inputs {passed}: {said}"


def prebuilt(row: dict | None) -> dict:
    """Whether a trace row's blocker holds with prebuilt kernels (AOT or flashinfer-jit-cache
    modules), read from its frames: ``build_and_load`` looks for those only after the JitSpec
    is generated."""
    if row is None or row["status"] == "compiled":
        return {"holds": True, "why": "no blocker"}
    functions = _functions(row)
    if any(f in _BUILD_AND_LOAD for f in functions):
        return {"holds": False, "why": "the blocker is inside JitSpec.build_and_load, where a "
                "prebuilt module would be found instead"}  # fmt: skip
    if any(f in _TOOLKIT for f in functions):
        return {"holds": True, "why": "met while the JitSpec is generated (the CUDA toolkit "
                "query), before build_and_load looks for a prebuilt module"}  # fmt: skip
    if any(f in _CUBIN for f in functions):
        return {"holds": True, "why": "met in the cubin loader, which reads a cubin the same way "
                "whether flashinfer-cubin installed it or it was downloaded"}  # fmt: skip
    return {"holds": True, "why": "the blocker is not on FlashInfer's kernel-loading path"}


def _run(
    fn: Callable,
    build: Callable[[], tuple],
    sm: tuple[int, int],
    *,
    mode: str = "jit",
    fake: bool = True,
    walk: bool = True,
    package: str = "flashinfer",
    one_graph_only: bool = False,
) -> tuple[eager.Eager | None, list[dict]]:
    """The trace rows (the chain when ``walk``), then the eager call (``walk`` only), on the same
    inputs; a failure to build the inputs is the eager outcome, with no rows. With
    ``one_graph_only`` the walk stops after its first trace and the eager call is made only where
    that trace compiled (no eager outcome otherwise): what can make the verdict "one graph"."""
    with (
        simulation.simulated_cuda(sm),
        toolkit.installed(mode),
        simulation.fake_cuda() if fake else contextlib.nullcontext(),
        torch.no_grad(),
    ):
        try:  # a set-up that builds a kernel or fetches a cubin stops there, as the call does
            with simulation.kernel_boundary():
                args, kwargs = simulation.on_gpu(build) if fake else build()
        except Exception as exc:  # the package refused to build the inputs (e.g. a constructor)
            return eager.classify(exc, package), []

        def call(*tensors: Any) -> Any:
            return fn(*tensors, **kwargs)

        if not walk:
            return None, [trace.attempt(call, *args).as_record()]
        first_only = {"max_steps": 1} if one_graph_only else {}
        rows = stages.walk_blocker_chain(call, *args, sm=sm, until="never", origins=REMEDIES,
                                         **first_only)  # fmt: skip
        if one_graph_only and rows[0]["status"] != "compiled":
            return None, rows
        return eager.call(fn, args, kwargs, package), rows


def _trace(row: dict | None) -> dict | None:
    return None if row is None else {k: row.get(k) for k in TRACE_KEYS}


def audit(
    fn: Callable,
    build: Callable[[], tuple],
    sm: tuple[int, int],
    *,
    op: str | None = None,
    package: str = "flashinfer",
) -> dict:
    """The audit of ``fn(*args, **kwargs)`` (``build()`` gives them) on simulated ``sm``: the
    verdict and why, the eager outcome, the first trace and its chain, each install mode, the
    custom op ``op`` (``ns::name``) if one is named."""
    started = time.perf_counter()
    first, rows = _run(fn, build, sm, package=package)
    verdict, why = decide(first, rows[0] if rows else None, package)
    tensors = TENSORS[0]
    if verdict == "undetermined on CPU" and rows:  # only "one graph" on CPU tensors is kept
        on_cpu, cpu_rows = _run(fn, build, sm, fake=False, package=package, one_graph_only=True)
        cpu_verdict, cpu_why = (
            decide(on_cpu, cpu_rows[0] if cpu_rows else None, package) if on_cpu else ("", "")
        )
        if cpu_verdict == "one graph":
            verdict, why, tensors, first, rows = (
                cpu_verdict, f"{cpu_why} (on CPU tensors; fake CUDA tensors: {why})",
                TENSORS[1], on_cpu, cpu_rows,
            )  # fmt: skip
    head = rows[0] if rows else None
    install = {"jit": {"verdict": verdict, "blocker_frame": head and head["blocker_frame"]}}
    home = []
    if head is not None and any(f in _TOOLKIT for f in _functions(head)):
        _, home = _run(fn, build, sm, mode="jit_cuda_home", fake=tensors == TENSORS[0], walk=False)
    if home:
        home_verdict, _ = decide(first, home[0], package)
        install["jit_cuda_home"] = {"verdict": home_verdict, "blocker_frame": home[0]["blocker_frame"],
                                    "signature": home[0]["signature"]}  # fmt: skip
    install["prebuilt"] = prebuilt(head)
    return {
        "sm": f"{sm[0]}.{sm[1]}",
        "simulated": simulation.simulates(sm),
        "tensors": tensors,
        "verdict": verdict,
        "why": why,
        "eager": first.as_record() if first else None,
        "trace": _trace(head),
        "chain": [{k: r.get(k) for k in CHAIN_KEYS} for r in rows],
        "install": install,
        "custom_op": custom_op(op) if op else None,
        "seconds": time.perf_counter() - started,
    }
