"""Notebook 06 (NVFP4/MXFP4 kernel harness) through papermill with small parameters; its records checked."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from browser import exported
from fp4lab.core import probe
from fp4lab.fp4 import forwarding_bug, gpu_checks

pytestmark = pytest.mark.notebook
NAME = "06_nvfp4_kernels"
SMALL = dict(
    shapes=[[64, 256]],
    distributions=["normal", "outlier_channels"],
    seed=3,
    device="cpu",
    throughput_shapes=[[128, 256]],
    throughput_iters=2,
)
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pinned_flashinfer() -> str:
    """flashinfer-python's version as pyproject.toml pins it (``==``)."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [pin] = [d for d in dependencies if d.startswith("flashinfer-python==")]
    return pin.split("==")[1]


@pytest.mark.browser
def test_06_records_errors_crosschecks_skips_and_speed(run_notebook, isolated_outputs):
    rows, executed = run_notebook(NAME, **SMALL)
    by_kind: dict[str, list[dict]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r["values"])
        assert (
            r["provenance"]["packages"]["torch"]
            and r["provenance"]["time_utc"]
            and r["params"]["seed"] == 3
        )
    assert "error" not in by_kind, by_kind.get("error")
    errors = {(e["distribution"], e["format"]): e for e in by_kind["quantization_error"]}
    assert len(errors) == 6 and all(e["M"] == 64 and e["K"] == 256 for e in errors.values())
    for d in ("normal", "outlier_channels"):
        assert errors[(d, "nvfp4")]["snr_db"] > errors[(d, "mxfp4")]["snr_db"]
        assert errors[(d, "fp8_e4m3_per_tensor")]["snr_db"] > errors[(d, "nvfp4")]["snr_db"]
    assert (
        15 < errors[("normal", "nvfp4")]["snr_db"] < 25
    )  # about 20 dB for 4-bit codes with 16-element blocks
    [swizzle] = by_kind["swizzle"]
    assert (
        swizzle["matches_formula"]
        and swizzle["matches_torch_to_blocked"]
        and swizzle["round_trips"]
    )
    cross = by_kind["crosscheck"]
    assert {c["input"] for c in cross} == {"normal", "outlier_channels", "adversarial", "e2m1_ties"}
    assert all(c["unexplained"] == 0 for c in cross)
    normal = [c for c in cross if c["input"] == "normal"]
    assert all(c["codes_differing"] == 0 and c["scales_differing"] == 0 for c in normal)
    assert any(
        c["code_differences"].get("nan_policy") for c in cross if c["input"] == "adversarial"
    )
    assert {s["block_size"] for s in by_kind["reciprocal_sensitivity"]} == {16, 32}
    for kind in ("quantization_error", "swizzle", "crosscheck", "reciprocal_sensitivity"):
        assert all(r["evidence"] == ["reference_kernel"] for r in by_kind[kind]), kind
    assert all(c["kernel"] == "reference" for c in cross)
    [forwarding] = by_kind["forwarding_bug"]
    pinned = _pinned_flashinfer()
    assert forwarding["flashinfer"] == pinned, "the installed FlashInfer is not the pinned one"
    expected = "present" if forwarding_bug.present_in_release(pinned) else "absent"  # 0.7.4: absent
    assert forwarding["capture"]["status"] == expected
    speed = by_kind["throughput"]
    assert {s["kernel"] for s in speed} >= {"public", "compiled", "reference"} and all(
        s["gbps"] > 0 and s["copy_gbps"] > 0 and s["evidence"] for s in speed
    )
    [public] = [s for s in speed if s["kernel"] == "public"]
    assert public["ran"] == "reference"  # 128x256 on a CPU: below the compiled path's size
    skipped = {s["check"]: s for s in by_kind["skipped"]}
    if not probe.machine().cuda_available:
        for check in (
            *gpu_checks.CHECKS_ON_CUDA,
            "forwarding_bug_numerical",
            "throughput_flashinfer",
        ):
            assert skipped[check]["status"] == "skipped" and skipped[check]["reason"]
        assert "SKIPPED flashinfer_bit_exact: no CUDA GPU" in executed.read_text()
    assert rows[-1]["kind"] == "summary", "the run's summary is its last record"
    run_summary = rows[-1]["values"]
    assert run_summary["status"].startswith("measured") and run_summary["needs"]
    assert "reference_kernel" in run_summary["evidence"]
    assert run_summary["headline"].startswith("reference vs 2 independent peers: 0 unexplained")
    for figure in ("06_fp4_error", "06_swizzle_128x4", "06_quantize_throughput"):
        assert (isolated_outputs / "figures" / f"{figure}.png").stat().st_size > 1000
    exported(executed)  # its tables fit the window, no warnings on the page
