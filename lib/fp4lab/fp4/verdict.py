"""Notebook 06's verdict from its run's records: AssertionError where upstream behaviour changed.

Fails on a peer difference no known convention explains, a swizzle that disagrees with its
formula or torch, NVFP4 no longer ahead of MXFP4 in SNR, or a forwarding-bug answer that does
not fit the installed FlashInfer. Speed goals are reported, not asserted.
"""

from __future__ import annotations

import torch

from fp4lab.fp4 import forwarding_bug, summary, throughput


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
    """The captured answer must match the installed release (nothing to check if not testable)."""
    capture, version = forwarding["capture"]["status"], forwarding["flashinfer"]
    if capture == "not testable here":
        return
    if (capture == "present") != forwarding_bug.present_in_release(version):
        raise AssertionError(
            f"upstream behaviour changed: forwarding bug {capture} in flashinfer {version}"
        )


def check_records(rows: list[dict], device: torch.device) -> str:
    """Check one run's records of notebook 06; returns the lines that report the run."""
    by_kind = summary.values_by_kind(rows)
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
    _check_format_order(by_kind["error"])
    [forwarding] = by_kind["forwarding_bug"]
    _check_forwarding_bug(forwarding)
    lines = [
        f"cross-checks: {len(cross)} comparisons, 0 unexplained differences; forwarding bug in"
        f" flashinfer {forwarding['flashinfer']}: {forwarding['capture']['status']}"
    ]
    goal_kernel, goal = throughput.goal_for(device)
    ratios = [r["ratio_to_copy"] for r in by_kind["throughput"] if r["kernel"] == goal_kernel]
    if ratios:
        lines.append(
            f"speed: {goal_kernel} at {min(ratios):.0%} to {max(ratios):.0%} of copy bandwidth"
            f" (goal {goal:.0%})"
        )
    return "\n".join(lines)
