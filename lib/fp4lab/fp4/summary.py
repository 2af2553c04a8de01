"""Notebook 06's records in one summary row for the decision report."""

from __future__ import annotations


def _of_kind(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r["kind"] == kind]


def summarize(rows: list[dict]) -> dict | None:
    """Notebook 06's records in one line each: cross-checks, error by format, speed, GPU checks."""
    if not rows:
        return None
    checks = [r["values"] for r in _of_kind(rows, "crosscheck")]
    unexplained = sum(c["unexplained"] for c in checks)
    errors = {
        (e["values"]["distribution"], e["values"]["format"]): e["values"]["snr_db"]
        for e in _of_kind(rows, "error")
    }
    snr = "; ".join(
        f"{dist}: "
        + " / ".join(
            f"{errors[(dist, fmt)]:.1f}"
            for fmt in ("nvfp4", "mxfp4", "fp8_e4m3_per_tensor")
            if (dist, fmt) in errors
        )
        for dist in dict.fromkeys(d for d, _ in errors)
    )
    speed = [
        t["values"] for t in _of_kind(rows, "throughput") if t["values"]["kernel"] == "compiled"
    ]
    best = max(speed, key=lambda t: t["ratio_to_copy"]) if speed else None
    skipped = [r["values"]["check"] for r in _of_kind(rows, "skipped")]
    bug = _of_kind(rows, "forwarding_bug")
    headline = f"reference vs {len({c['peer'] for c in checks})} independent peers: {unexplained} unexplained differences"
    headline += f"; SNR dB NVFP4 / MXFP4 / FP8 per-tensor: {snr}" if snr else ""
    if best:
        headline += f"; compiled quantize at best {best['ratio_to_copy']:.0%} of copy bandwidth ({best['M']}x{best['K']}, {best['device']})"
    if bug:
        headline += f"; FlashInfer {bug[0]['values']['flashinfer']} argument-forwarding bug: {bug[0]['values']['capture']['status']}"
    return {
        "status": "measured" + (f"; not run here: {', '.join(skipped)}" if skipped else ""),
        "headline": headline,
        "needs": "cpu for the reference and its checks; an SM100+ GPU for FlashInfer's kernel and GPU speed",
    }
