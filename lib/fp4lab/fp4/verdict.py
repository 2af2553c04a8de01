"""Notebook 06's verdict from its run's records: AssertionError where a check failed or upstream
behaviour changed.

Fails on any ``error`` record (a check that raised), a peer difference no known convention
explains, a swizzle that disagrees with its formula or torch, NVFP4 no longer ahead of MXFP4 in
SNR, or a forwarding-bug answer that does not fit the installed FlashInfer. On a CUDA GPU every
GPU check must have run or been skipped with its reason, and the bytes must agree:

* fp4lab's Triton kernel with correctly rounded reciprocals, and every CUDA-graph replay, give
  the reference's bytes exactly;
* FlashInfer's kernel (SM100+) and the Triton kernel with ``rcp.approx`` may differ from the
  reference only in codes and scales that an ulp of reciprocal error could move
  (``reciprocals.reciprocal_sensitive``): ``*_mismatches_unexplained`` must be 0.

Speed goals are reported, not asserted.
"""

from __future__ import annotations

import re

import torch
from packaging.version import Version

from fp4lab.fp4 import forwarding_bug, gpu_checks, summary, throughput

FIRST_WITH_OP = Version("0.6.12")
"""The first FlashInfer with torch.ops.flashinfer.fp4_quantize, whose forwarding is captured."""


def _check_format_order(errors: list[dict]) -> None:
    """NVFP4 must beat MXFP4 in SNR on every distribution and shape."""
    snr = {(e["M"], e["K"], e["distribution"], e["format"]): e["snr_db"] for e in errors}
    for m, k, d, fmt in snr:
        if fmt != "nvfp4":
            continue
        nv, mx = snr[(m, k, d, "nvfp4")], snr[(m, k, d, "mxfp4")]
        if not nv > mx:
            raise AssertionError(
                f"observed NVFP4 SNR {nv:.2f} dB <= MXFP4 {mx:.2f} dB on {d} ({m}x{k})"
            )


def _check_forwarding_bug(forwarding: dict) -> None:
    """Where FlashInfer has the custom op, the captured (and, on an FP4 GPU, the numerical)
    answer must be the one expected for the installed release."""
    version = forwarding["flashinfer"]
    if version is None or Version(version) < FIRST_WITH_OP:
        return
    expected = "present" if forwarding_bug.present_in_release(version) else "absent"
    for how in ("capture", "numerical"):
        status = forwarding[how]["status"]
        if status != expected and not (how == "numerical" and status == "not testable here"):
            raise AssertionError(
                f"upstream behaviour changed: forwarding bug {status} ({how}) in flashinfer"
                f" {version}, expected {expected}"
            )


def _within_rcp(outcome: dict, what: str) -> None:
    """A kernel's bytes differ from the reference's only where rcp.approx could move them."""
    if outcome.get("skipped"):
        return
    if not outcome.get("shape_ok") or (
        outcome["code_mismatches_unexplained"] or outcome["scale_mismatches_unexplained"]
    ):
        raise AssertionError(f"{what} differs from the reference beyond rcp.approx: {outcome}")


def _check_gpu(by_kind: dict[str, list[dict]]) -> str:
    """The GPU checks of a CUDA run; returns the line that reports them."""
    skipped = {re.sub(r"_bs\d+$", "", s["check"]) for s in by_kind["skipped"]}
    for check in gpu_checks.CHECKS_ON_CUDA:
        if not by_kind[check] and check not in skipped:
            raise AssertionError(f"{check} neither ran nor was skipped with a reason")
    for r in by_kind["triton_bit_exact"]:
        exact = r["triton"]
        if not (exact.get("shape_ok") and exact["codes_equal"] and exact["scales_equal"]):
            raise AssertionError(
                f"the Triton kernel differs from the reference (block_size {r['block_size']}):"
                f" {exact}"
            )
        _within_rcp(r["triton_approx_rcp"], f"Triton with rcp.approx (bs {r['block_size']})")
    for r in by_kind["flashinfer_bit_exact"]:
        _within_rcp(r["flashinfer_direct"], f"FlashInfer (bs {r['block_size']})")
        _within_rcp(r["triton_approx_rcp"], f"Triton with rcp.approx (bs {r['block_size']})")
        if "flashinfer_custom_op" in r and not forwarding_bug.present_in_release(r["flashinfer"]):
            _within_rcp(r["flashinfer_custom_op"], f"FlashInfer's op (bs {r['block_size']})")
    for r in by_kind["capture_replay"]:
        if not (r["reference"]["equal"] and r["public"]["equal"]):
            raise AssertionError(f"a CUDA-graph replay differs from the reference: {r}")
    ran = [k for k in gpu_checks.CHECKS_ON_CUDA if by_kind[k]]
    return f"GPU checks passed: {', '.join(ran) or 'none'} (skipped: {', '.join(sorted(skipped))})"


def check_records(rows: list[dict], device: torch.device) -> str:
    """Check one run's records of notebook 06; returns the lines that report the run."""
    by_kind = summary.values_by_kind(rows)
    if by_kind["error"]:
        failed = "; ".join(f"{e['check']}: {e['message']}" for e in by_kind["error"])
        raise AssertionError(f"{len(by_kind['error'])} checks raised: {failed}")
    cross = by_kind["crosscheck"]
    bad = [r for r in cross if r["unexplained"]]
    if bad:
        raise AssertionError(
            "upstream behaviour changed: unexplained differences with an independent"
            f" implementation: {bad}"
        )
    [layout] = by_kind["swizzle"]
    if not (
        layout["matches_formula"] and layout["matches_torch_to_blocked"] and layout["round_trips"]
    ):
        raise AssertionError(f"swizzle layout disagrees: {layout}")
    _check_format_order(by_kind["quantization_error"])
    [forwarding] = by_kind["forwarding_bug"]
    _check_forwarding_bug(forwarding)
    lines = [
        f"cross-checks: {len(cross)} comparisons, 0 unexplained differences; forwarding bug in"
        f" flashinfer {forwarding['flashinfer']}: {forwarding['capture']['status']}"
    ]
    if device.type == "cuda":
        lines.append(_check_gpu(by_kind))
    goal = throughput.goal_for(device)
    kernel = goal[0] if goal else "public"
    ratios = [r["ratio_to_copy"] for r in by_kind["throughput"] if r["kernel"] == kernel]
    if ratios:
        target = (
            f"goal {goal[1]:.0%}"
            if goal
            else "no goal on a CPU's clone line: the goal is benchmarks/nvfp4_throughput.py's"
            " public call against a preallocated copy_"
        )
        lines.append(
            f"speed: {kernel} at {min(ratios):.0%} to {max(ratios):.0%} of the copy line"
            f" (x.clone(); {target})"
        )
    return "\n".join(lines)
