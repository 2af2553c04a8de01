"""Notebook 06's GPU checks, failing loud.

Each check runs through ``guarded``: an exception becomes an ``error`` record naming the check
and its message, and the verdict (``fp4lab.fp4.verdict``) then fails. A check is skipped only
where its hardware or package is absent, with that reason. On a CUDA GPU:

* ``triton_bit_exact``: fp4lab's Triton kernel against the reference, per format. With correctly
  rounded reciprocals it must give the same bytes; with ``rcp.approx`` only codes and scales
  that an ulp of reciprocal error could move may differ (``reciprocals.reciprocal_sensitive``).
* ``capture_replay``: the reference and the public quantize captured into a CUDA graph after a
  warm-up call, replayed, and their bytes compared with the reference run eagerly.
* ``flashinfer_bit_exact`` (SM100+) and ``flashinfer_hopper`` (below SM100): see
  ``fp4lab.fp4.flashinfer_kernel``.

On any machine, ``forwarding`` records FlashInfer's argument-forwarding bug
(``fp4lab.fp4.forwarding_bug``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fp4lab.core import evidence, probe, records
from fp4lab.fp4 import edge_cases, flashinfer_kernel, forwarding_bug, kernels, nvfp4

REFERENCE = evidence.check(["reference_kernel"])
CHECKS_ON_CUDA = ("triton_bit_exact", "capture_replay", "flashinfer_bit_exact", "flashinfer_hopper")
"""What a CUDA run must account for: each as a record, a skip with its reason, or an error."""


def error(recorder: records.Recorder, check: str, message: str) -> None:
    """Record that ``check`` failed, with its message: the verdict fails on it."""
    print(f"ERROR {check}: {message}")
    recorder.add("error", {"check": check, "message": message})


def guarded(recorder: records.Recorder, check: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; an exception becomes an ``error`` record {check, message} and None comes back."""
    try:
        return fn()
    except Exception as e:
        error(recorder, check, f"{type(e).__name__}: {e}"[:500])
        return None


def _kernel_bytes(out: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales, _ = out
    return codes, scales.view(torch.uint8).reshape(-1)


def triton_bit_exact(x: torch.Tensor, global_scale: torch.Tensor, *, block_size: int) -> dict:
    """fp4lab's Triton kernel, correctly rounded and with rcp.approx, against the reference."""
    reason = kernels.triton_available()
    if x.device.type != "cuda" or reason:
        return {"status": "not testable here", "reason": reason or "needs a CUDA tensor"}
    gs = None if block_size == nvfp4.MXFP4_BLOCK else global_scale
    record: dict[str, Any] = {"status": "ran", "block_size": block_size, "kernel": "triton"}
    for name, approx in (("triton", False), ("triton_approx_rcp", True)):
        codes, sf = _kernel_bytes(
            kernels.triton_quantize(x, gs, block_size=block_size, swizzle=True, approx_rcp=approx)
        )
        record[name] = flashinfer_kernel.compare_bytes(codes, sf, x, gs, block_size=block_size)
    return {**record, "evidence": REFERENCE}


def capture_replay(x: torch.Tensor, global_scale: torch.Tensor) -> dict:
    """The reference and the public quantize (NVFP4, swizzled) captured into CUDA graphs and
    replayed: whether each replay gives the reference's eager bytes."""
    if x.device.type != "cuda":
        return {"status": "not testable here", "reason": "CUDA-graph capture needs a CUDA tensor"}
    expected = _kernel_bytes(nvfp4.reference_quantize(x.cpu(), global_scale.cpu(), swizzle=True))
    record: dict[str, Any] = {"status": "ran", "public_kernel": kernels.public_kernel(x)}
    for name, quantize in (("reference", nvfp4.reference_quantize), ("public", kernels.quantize)):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            quantize(x, global_scale, swizzle=True)  # warm-up: tables, compiles
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = quantize(x, global_scale, swizzle=True)
        graph.replay()
        torch.cuda.synchronize()
        got = _kernel_bytes(out)
        record[name] = {
            "captured": True,
            "equal": all(torch.equal(g.cpu(), e) for g, e in zip(got, expected, strict=True)),
        }
    return {**record, "evidence": evidence.check(["reference_kernel", "cuda_graph_replay"])}


def _add(
    recorder: records.Recorder, check: str, kind: str, result: dict | None, *, fail: bool = True
) -> None:
    """A check's result as a record of ``kind``, or a skip with its reason; with ``fail``, each
    kernel that raised inside it (``{"ran": False, "error": ...}``) is also an error."""
    if result is None:
        return
    if result["status"] == "not testable here":
        recorder.skip(check, result["reason"])
        return
    for name, outcome in result.items():
        if fail and isinstance(outcome, dict) and outcome.get("error"):
            error(recorder, f"{check}.{name}", outcome["error"])
    recorder.add(kind, result)
    print(result)


def run_on_cuda(recorder: records.Recorder, device: torch.device, seed: int) -> None:
    """Every GPU check of notebook 06 on ``device``, each guarded, recorded or skipped."""
    x = edge_cases.kernel_check_input(seed).to(device)
    gs = nvfp4.global_scale_for(x).reshape(1)
    fp4 = torch.cuda.get_device_capability(device) >= probe.FP4_MIN_SM
    for block_size in (nvfp4.NVFP4_BLOCK, nvfp4.MXFP4_BLOCK):
        check = f"triton_bit_exact_bs{block_size}"
        result = guarded(
            recorder, check, lambda b=block_size: triton_bit_exact(x, gs, block_size=b)
        )
        _add(recorder, check, "triton_bit_exact", result)
        check = f"flashinfer_bit_exact_bs{block_size}"
        result = guarded(
            recorder, check, lambda b=block_size: flashinfer_kernel.bit_exact(x, gs, block_size=b)
        )
        if result and result["status"] == "ran":
            result["evidence"] = evidence.check(["reference_kernel", "real_fp4_kernel"])
        _add(recorder, check, "flashinfer_bit_exact", result)
    result = guarded(recorder, "capture_replay", lambda: capture_replay(x, gs.reshape(())))
    _add(recorder, "capture_replay", "capture_replay", result)
    if fp4:
        recorder.skip("flashinfer_hopper", "this GPU is SM100+: FlashInfer's FP4 kernel runs here")
        return
    result = guarded(recorder, "flashinfer_hopper", lambda: flashinfer_kernel.hopper_probe(x, gs))
    if result:
        result["evidence"] = REFERENCE  # FlashInfer ran on a GPU without FP4: no real FP4 kernel
    _add(recorder, "flashinfer_hopper", "flashinfer_hopper", result, fail=False)  # refusals: data


SKIP_REASONS = {
    "triton_bit_exact": "fp4lab's Triton kernel runs on a CUDA GPU",
    "capture_replay": "CUDA-graph capture needs a CUDA GPU",
    "flashinfer_bit_exact": "FlashInfer's FP4 kernel needs an SM100+ GPU",
    "flashinfer_hopper": "the Hopper probe needs a GPU below SM100",
}


def skip_without_cuda(recorder: records.Recorder) -> None:
    """No CUDA GPU: each GPU check skipped with that reason."""
    missing = probe.machine().missing("gpu") or "no CUDA GPU"
    for check in CHECKS_ON_CUDA:
        recorder.skip(check, f"{missing}; {SKIP_REASONS[check]}")


def forwarding(recorder: records.Recorder, device: torch.device) -> dict | None:
    """The forwarding-bug detector's record; its numerical check skipped with the reason where
    it cannot run, an error where it raised."""
    found = guarded(recorder, "forwarding_bug", lambda: forwarding_bug.detect(device))
    if found is None:
        return None
    numerical = found["numerical"]
    if numerical["status"] == "error":
        error(recorder, "forwarding_bug_numerical", numerical["error"])
    elif numerical["status"] == "not testable here":
        recorder.skip("forwarding_bug_numerical", numerical["reason"])
    ran = numerical["status"] not in ("error", "not testable here")
    # the capture only calls the op's Python body: no kernel runs, no level of evidence
    found["evidence"] = evidence.of_run(
        traced=False, simulated=False, kernel="flashinfer" if ran else None
    )
    recorder.add("forwarding_bug", found)
    return found
