"""Notebook 06's GPU checks fail loud: an exception is an `error` record and a failing verdict; a
skip carries the reason (absent hardware or package). Runs on a CPU with the GPU parts stubbed."""

from __future__ import annotations

import pytest
import torch

from fp4lab.core import records
from fp4lab.fp4 import flashinfer_kernel, forwarding_bug, gpu_checks, harness, kernels, verdict

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SMALL = dict(
    shapes=[[64, 256]],
    distributions=["normal"],
    seed=0,
    device="cpu",
    throughput_shapes=[[128, 256]],
    throughput_iters=1,
)


def _kinds(run: harness.Run, kind: str) -> list[dict]:
    return [r["values"] for r in run.recorder.written if r["kind"] == kind]


def _raises(message: str):
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError(message)

    return fail


def test_a_numerical_forwarding_check_that_raises_is_an_error_not_a_skip(
    isolated_outputs, monkeypatch
):
    monkeypatch.setattr(forwarding_bug, "compare_op_with_direct_call", _raises("kernel exploded"))
    run = harness.validate(**SMALL)
    harness.gpu_checks(run)
    assert _kinds(run, "error") == [
        {"check": "forwarding_bug_numerical", "message": "RuntimeError: kernel exploded"}
    ]
    assert "forwarding_bug_numerical" not in {s["check"] for s in _kinds(run, "skipped")}
    with pytest.raises(AssertionError, match="forwarding_bug_numerical: RuntimeError: kernel"):
        verdict.check_records(run.recorder.written, CPU)


@pytest.fixture
def fake_fp4_gpu(monkeypatch):
    """run_on_cuda on a CPU: an SM100 capability, Triton absent."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    monkeypatch.setattr(kernels, "triton_available", lambda: "triton is not installed")


def test_a_gpu_check_that_raises_is_an_error_and_fails_the_verdict(
    isolated_outputs, monkeypatch, fake_fp4_gpu
):
    monkeypatch.setattr(flashinfer_kernel, "bit_exact", _raises("illegal instruction"))
    recorder = records.Recorder("06_nvfp4_kernels", {})
    written = []
    monkeypatch.setattr(recorder, "add", lambda kind, values: written.append(_r(kind, values)))
    gpu_checks.run_on_cuda(recorder, CPU, seed=0)
    errors = [r["values"] for r in written if r["kind"] == "error"]
    assert errors == [
        {"check": f"flashinfer_bit_exact_bs{bs}", "message": "RuntimeError: illegal instruction"}
        for bs in (16, 32)
    ]
    skipped = {
        r["values"]["check"]: r["values"]["reason"] for r in written if r["kind"] == "skipped"
    }
    assert skipped["triton_bit_exact_bs16"] == "triton is not installed"
    with pytest.raises(AssertionError, match="2 checks raised: flashinfer_bit_exact_bs16: Runtime"):
        verdict.check_records(written, CUDA)


def _r(kind: str, values: dict) -> dict:
    return {"kind": kind, "values": values}


def test_a_kernel_that_raised_inside_a_check_is_an_error(
    isolated_outputs, monkeypatch, fake_fp4_gpu
):
    ran = {"status": "ran", "block_size": 16, "flashinfer": "0.7.4"}
    monkeypatch.setattr(
        flashinfer_kernel,
        "bit_exact",
        lambda x, gs, block_size: {
            **ran,
            "flashinfer_direct": {"ran": False, "error": "RuntimeError: no kernel image"},
        },
    )
    recorder = records.Recorder("06_nvfp4_kernels", {})
    written = []
    monkeypatch.setattr(recorder, "add", lambda kind, values: written.append(_r(kind, values)))
    gpu_checks.run_on_cuda(recorder, CPU, seed=0)
    assert [r["values"]["check"] for r in written if r["kind"] == "error"] == [
        "flashinfer_bit_exact_bs16.flashinfer_direct",
        "flashinfer_bit_exact_bs32.flashinfer_direct",
    ]


def test_without_a_gpu_every_gpu_check_is_skipped_with_the_missing_hardware(isolated_outputs):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    run = harness.validate(**SMALL)
    harness.gpu_checks(run)
    skipped = {s["check"]: s["reason"] for s in _kinds(run, "skipped")}
    assert set(skipped) == {*gpu_checks.CHECKS_ON_CUDA, "forwarding_bug_numerical"}
    for check in gpu_checks.CHECKS_ON_CUDA:
        assert (
            skipped[check].startswith("no CUDA GPU")
            and gpu_checks.SKIP_REASONS[check] in (skipped[check])
        )
    assert "SM100" in skipped["forwarding_bug_numerical"]
    assert _kinds(run, "error") == []
    [bug] = _kinds(run, "forwarding_bug")
    assert bug["evidence"] == []  # the capture runs no kernel


def _compare(**changes: object) -> dict:
    same = {
        "ran": True,
        "shape_ok": True,
        "codes_equal": True,
        "scales_equal": True,
        "code_mismatches_unexplained": 0,
        "scale_mismatches_unexplained": 0,
    }
    return {**same, **changes}


def _cuda_records(**changes: dict) -> list[dict]:
    values = {
        "triton_bit_exact": {
            "block_size": 16,
            "triton": _compare(),
            "triton_approx_rcp": _compare(codes_equal=False, code_mismatches_rcp_movable=3),
        },
        "flashinfer_bit_exact": {
            "block_size": 16,
            "flashinfer": "0.7.4",
            "flashinfer_direct": _compare(),
            "flashinfer_custom_op": _compare(),
            "triton_approx_rcp": _compare(),
        },
        "capture_replay": {"reference": {"equal": True}, "public": {"equal": True}},
        "crosscheck": {"peer": "torchao.nvfp4_quantize", "unexplained": 0},
        "swizzle": {"matches_formula": True, "matches_torch_to_blocked": True, "round_trips": True},
        "forwarding_bug": {
            "flashinfer": "0.7.4",
            "capture": {"status": "absent"},
            "numerical": {"status": "absent"},
        },
        **changes,
    }
    rows = [_r(kind, v) for kind, v in values.items() if v is not None]
    return [*rows, _r("skipped", {"check": "flashinfer_hopper", "reason": "SM100+"})]


def test_the_verdict_on_cuda_asserts_the_bytes():
    assert "GPU checks passed: triton_bit_exact, capture_replay, flashinfer_bit_exact" in (
        verdict.check_records(_cuda_records(), CUDA)
    )
    differs = {"block_size": 16, "triton": _compare(codes_equal=False), "triton_approx_rcp": {}}
    with pytest.raises(AssertionError, match="the Triton kernel differs from the reference"):
        verdict.check_records(_cuda_records(triton_bit_exact=differs), CUDA)
    beyond = _cuda_records()[1]["values"] | {
        "flashinfer_direct": _compare(scale_mismatches_unexplained=1)
    }
    with pytest.raises(AssertionError, match=r"FlashInfer \(bs 16\) differs .* beyond rcp.approx"):
        verdict.check_records(_cuda_records(flashinfer_bit_exact=beyond), CUDA)
    replay = {"reference": {"equal": True}, "public": {"equal": False}}
    with pytest.raises(AssertionError, match="a CUDA-graph replay differs"):
        verdict.check_records(_cuda_records(capture_replay=replay), CUDA)
    with pytest.raises(AssertionError, match="capture_replay neither ran nor was skipped"):
        verdict.check_records(_cuda_records(capture_replay=None), CUDA)
