"""Notebook 06's records in one summary row for the decision report."""

from __future__ import annotations

from collections import defaultdict

from fp4lab.core import evidence

FORMAT_ORDER = ("nvfp4", "mxfp4", "fp8_e4m3_per_tensor")
NEEDS = "cpu for the reference and its checks; an SM100+ GPU for FlashInfer's kernel and GPU speed"


def _snr_by_distribution(errors: list[dict]) -> str:
    """``distribution: nvfp4 / mxfp4 / fp8`` SNR in dB, one part per distribution, in first-seen order."""
    snr = {(e["distribution"], e["format"]): e["snr_db"] for e in errors}
    parts = []
    for distribution in dict.fromkeys(d for d, _ in snr):
        measured = [snr[(distribution, f)] for f in FORMAT_ORDER if (distribution, f) in snr]
        parts.append(f"{distribution}: " + " / ".join(f"{v:.1f}" for v in measured))
    return "; ".join(parts)


def values_by_kind(rows: list[dict]) -> defaultdict[str, list[dict]]:
    """Records' values grouped by kind, oldest first; a kind with no record gives []."""
    by_kind: defaultdict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_kind[row["kind"]].append(row["values"])
    return by_kind


def _best_speed(speeds: list[dict], kernel: str, label: str, with_device: bool = False) -> str:
    """The headline part "; <label> at best N% of the copy line, x.clone() (MxK)", or "" without rows."""
    rows = [t for t in speeds if t["kernel"] == kernel]
    if not rows:
        return ""
    best = max(rows, key=lambda t: t["ratio_to_copy"])
    where = f"{best['M']}x{best['K']}" + (f", {best['device']}" if with_device else "")
    return (
        f"; {label.format(ran=best['ran'])} at best {best['ratio_to_copy']:.0%} of the copy"
        f" line, x.clone() ({where})"
    )


def summarize(rows: list[dict]) -> dict | None:
    """Notebook 06's records as {status, headline, needs, evidence}: cross-checks, error by format,
    speed of the public quantize, the forwarding bug, the checks that raised and what did not run
    here. None without records."""
    if not rows:
        return None
    by_kind = values_by_kind(rows)
    checks = by_kind["crosscheck"]
    unexplained = sum(c["unexplained"] for c in checks)
    peers = len({c["peer"] for c in checks})
    headline = f"reference vs {peers} independent peers: {unexplained} unexplained differences"
    snr = _snr_by_distribution(by_kind["quantization_error"])
    headline += f"; SNR dB NVFP4 / MXFP4 / FP8 per-tensor: {snr}" if snr else ""
    speeds = by_kind["throughput"]
    headline += _best_speed(speeds, "public", "public quantize ({ran})", with_device=True)
    headline += _best_speed(speeds, "triton_approx_rcp", "Triton kernel given the global scale")
    if by_kind["forwarding_bug"]:
        bug = by_kind["forwarding_bug"][0]
        headline += (
            f"; FlashInfer {bug['flashinfer']} argument-forwarding bug: {bug['capture']['status']}"
        )
    failed = [e["check"] for e in by_kind["error"]]
    skipped = [s["check"] for s in by_kind["skipped"]]
    status = f"FAILED: {', '.join(failed)} raised" if failed else "measured"
    levels = {level for r in rows for level in r["values"].get("evidence", [])}
    speed = _best_speed(speeds, "public", "public quantize ({ran})", with_device=True)
    number = f"{unexplained} unexplained differences vs {peers} independent peers" + (
        speed or "; GPU speed not measured"
    )
    why = "fp4lab's spec-exact NVFP4 reference was cross-checked against independent peers" + (
        f"; not run here: {', '.join(skipped)}" if skipped else ""
    )
    return {
        "status": status + (f"; not run here: {', '.join(skipped)}" if skipped else ""),
        "headline": headline,
        "verdict": "FAILED" if failed or unexplained else "WORKS",
        "number": f"{', '.join(failed)} raised" if failed else number,
        "why": why,
        "needs": NEEDS,
        "evidence": evidence.check(sorted(levels)),
    }
