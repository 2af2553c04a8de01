"""The fast kernels give the reference's bytes; FlashInfer checks; the throughput benchmark's contract.

The Triton kernel's numerics run under TRITON_INTERPRET=1 in a child process (the variable
must be set before triton is imported). GPU checks carry @pytest.mark.gpu.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fp4lab.core import probe, records
from fp4lab.fp4 import (
    edge_cases,
    flashinfer_kernel,
    forwarding_bug,
    gpu_checks,
    kernels,
    nvfp4,
    summary,
    throughput,
    verdict,
)

REPO = Path(__file__).resolve().parents[1]

_TRITON_CHECK = textwrap.dedent(
    """
    import torch
    from fp4lab.fp4 import edge_cases, kernels, nvfp4
    inputs = [
        torch.randn(37, 96, dtype=torch.bfloat16),
        torch.randn(130, 512, dtype=torch.float16) * 100,
        torch.randn(64, 256),
        edge_cases.adversarial_input(),
        edge_cases.adversarial_input(dtype=torch.float16),
        edge_cases.tie_input(),
    ]
    checked = 0
    for x in inputs:
        for block_size in (16, 32):
            if x.shape[1] % block_size:
                continue
            for swizzle in (False, True):
                for gs in ([None] if block_size == 32 else [None, 1.0, 3.7]):
                    case = (x.dtype, tuple(x.shape), block_size, swizzle, gs)
                    a = kernels.quantize(x, gs, block_size=block_size, swizzle=swizzle)
                    b = kernels.triton_quantize(
                        x, gs, block_size=block_size, swizzle=swizzle, block_m=16, block_k=64
                    )
                    assert torch.equal(a[0], b[0]), ("codes", *case)
                    assert torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8)), ("scales", *case)
                    assert a[1].dtype == b[1].dtype
                    checked += 1
    for x in inputs + [torch.full((3, 40), float("nan")), -torch.rand(5000)]:
        assert torch.equal(kernels.triton_finite_amax(x), nvfp4.finite_amax(x)), x.shape
    print("checked", checked)
    """
)


def test_triton_kernel_matches_reference_bytes_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", _TRITON_CHECK],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 48" in done.stdout


def test_triton_kernel_refuses_to_run_without_a_backend():
    if kernels.triton_available() is None:
        pytest.skip("Triton can run in this process")
    with pytest.raises(RuntimeError, match="cannot run here"):
        kernels.triton_quantize(torch.randn(16, 64))


# -- FlashInfer ---------------------------------------------------------------------------


def fp4_quantize(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True,
                 is_sf_8x4_layout=False, is_global_scale_inversed=False, enable_pdl=None):  # fmt: skip
    """Stands in for flashinfer.fp4_quantize's signature: the spy stops the call before this body."""
    raise AssertionError("the spy should have stopped the call")


@torch.library.custom_op("fp4labtest::positional_fp4_quantize", mutates_args=())
def _positional(
    input: torch.Tensor,
    global_scale: torch.Tensor | None = None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    # FlashInfer 0.6.12's forwarding: enable_pdl lands in is_global_scale_inversed.
    return fp4_quantize(
        input,
        global_scale,
        sf_vec_size,
        sf_use_ue8m0,
        is_sf_swizzled_layout,
        is_sf_8x4_layout,
        enable_pdl,
    )


@torch.library.custom_op("fp4labtest::keyword_fp4_quantize", mutates_args=())
def _keyword(
    input: torch.Tensor,
    global_scale: torch.Tensor | None = None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    return fp4_quantize(
        input,
        global_scale,
        sf_vec_size,
        sf_use_ue8m0,
        is_sf_swizzled_layout=is_sf_swizzled_layout,
        is_sf_8x4_layout=is_sf_8x4_layout,
        enable_pdl=enable_pdl,
    )


def test_forwarding_spy_tells_positional_from_keyword_forwarding():
    opdef = torch._library.custom_ops._maybe_get_opdef
    buggy = forwarding_bug.capture_forwarded_arguments(opdef("fp4labtest::positional_fp4_quantize"))
    fixed = forwarding_bug.capture_forwarded_arguments(opdef("fp4labtest::keyword_fp4_quantize"))
    assert buggy["status"] == "present" and buggy["forwarded_is_global_scale_inversed"] == "True"
    assert fixed["status"] == "absent" and fixed["forwarded_enable_pdl"] == "True"


def test_forwarding_bug_on_the_installed_flashinfer():
    from packaging.version import Version

    result = forwarding_bug.detect("cpu")
    installed = result["flashinfer"]
    assert installed == probe.package_version("flashinfer-python")
    assert Version(installed) >= Version("0.6.12"), "the pinned release has the upstream op"
    buggy = forwarding_bug.present_in_release(installed)
    assert result["capture"]["status"] == ("present" if buggy else "absent"), result
    assert (
        result["numerical"]["status"] == "not testable here"
        and "SM100" in result["numerical"]["reason"]
    )


def test_gpu_checks_say_why_they_cannot_run_on_a_cpu():
    x, gs = torch.randn(128, 64), torch.tensor([1.0])
    assert flashinfer_kernel.bit_exact(x, gs)["status"] == "not testable here"
    assert flashinfer_kernel.hopper_probe(x, gs) == {
        "status": "not testable here",
        "reason": "needs a CUDA tensor (a GPU below SM100)",
    }


def test_compare_bytes_and_classify_output_on_reference_bytes():
    x = edge_cases.adversarial_input()
    gs = nvfp4.global_scale_for(x)
    codes, sf, _ = nvfp4.quantize_bytes(x, gs, swizzle=True)
    same = flashinfer_kernel.compare_bytes(codes, sf, x, gs)
    assert same["codes_equal"] and same["scales_equal"] and same["code_mismatches"] == 0
    flipped = codes.clone()
    flipped[0, 0] ^= 0x01
    assert flashinfer_kernel.compare_bytes(flipped, sf, x, gs)["code_mismatches_unexplained"] == 1
    bumped = sf.clone()
    bumped[0] += 1  # row 0 is all zero: no reciprocal error could move its scale
    moved = flashinfer_kernel.compare_bytes(codes, bumped, x, gs)
    assert moved["scale_mismatches"] == moved["scale_mismatches_unexplained"] == 1
    assert flashinfer_kernel.classify_output(codes, sf, x, gs) == "matches reference"
    poison = lambda t: torch.full_like(t, flashinfer_kernel.POISON)  # noqa: E731
    assert (
        flashinfer_kernel.classify_output(poison(codes), poison(sf), x, gs)
        == "unwritten (poison survives)"
    )
    assert (
        flashinfer_kernel.classify_output(torch.zeros_like(codes), torch.zeros_like(sf), x, gs)
        == "all zero"
    )


def _gpu_input() -> tuple[torch.Tensor, torch.Tensor]:
    x = edge_cases.kernel_check_input().cuda()
    return x, nvfp4.global_scale_for(x).reshape(1)


@pytest.mark.gpu
def test_flashinfer_bit_exact_on_an_fp4_gpu():
    if torch.cuda.get_device_capability() < (10, 0):
        pytest.skip("FlashInfer's FP4 kernel needs SM100+")
    x, gs = _gpu_input()
    for block_size in (16, 32):
        result = flashinfer_kernel.bit_exact(x, gs, block_size=block_size)
        assert result["flashinfer_direct"]["ran"], result
        assert (
            result["flashinfer_direct"]["scale_mismatches_unexplained"] == 0
            and result["flashinfer_direct"]["code_mismatches_unexplained"] == 0
        ), result
        assert result.get("triton_equals_flashinfer"), result


@pytest.mark.gpu
def test_hopper_probe_never_raises():
    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU runs FP4: nothing to probe")
    x, gs = _gpu_input()
    result = flashinfer_kernel.hopper_probe(x, gs)
    if probe.package_version("flashinfer-python") is None:  # the offline bundle on a Hopper GPU
        assert result == {
            "status": "not testable here",
            "reason": "flashinfer-python is not installed",
        }
        return
    assert result["status"] == "ran" and "public" in result
    public = result["public"]
    assert (not public["ran"] and "SM100" in public["error"]) or public["returned"] in (
        "unwritten (poison survives)",
        "all zero",
        "other",
    )


@pytest.mark.gpu
def test_reference_and_public_quantize_replay_from_a_cuda_graph():
    x, gs = _gpu_input()
    result = gpu_checks.capture_replay(x, gs.reshape(()))
    assert result["reference"]["equal"] and result["public"]["equal"], result


@pytest.mark.gpu
def test_triton_kernel_on_the_gpu_matches_the_reference():
    x, _ = _gpu_input()
    for block_size in (16, 32):
        a = kernels.quantize(x.cpu(), block_size=block_size, swizzle=True)
        b = kernels.triton_quantize(x, block_size=block_size, swizzle=True)
        assert torch.equal(a[0], b[0].cpu()) and torch.equal(
            a[1].view(torch.uint8), b[1].view(torch.uint8).cpu()
        )


# -- the throughput benchmark ---------------------------------------------------------------


def _benchmark(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/nvfp4_throughput.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shapes", "64x48"], "--shapes K=48 must be a multiple of 32"),
        (["--goal-shape", "64x64,64x64"], "--goal-shape='64x64,64x64' must be one MxK"),
        (["--shapes", "64"], "is not MxK"),
        (["--formats", "nvfp8"], "--formats contains 'nvfp8'; allowed values: nvfp4, mxfp4"),
        (["--dtype", "float64"], "--dtype='float64' is not allowed"),
    ],
)
def test_benchmark_names_bad_arguments(args, message):
    done = _benchmark(*args)
    assert done.returncode == 2 and message in done.stderr


def test_benchmark_prints_ratios_and_records_them(isolated_outputs):
    done = _benchmark(
        *("--shapes", "128x256", "--formats", "nvfp4,mxfp4"),
        *("--iters", "2", "--warmup", "1", "--threads", "1"),
        *("--goal-shape", "64x256", "--goal-rounds", "2"),
        env={"FP4LAB_DATA_DIR": str(isolated_outputs / "data")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "copy GB/s" in done.stdout and "goal on a CPU: the public call below" in done.stdout
    assert "public kernels.quantize(x), 64x256 float32 on cpu (ran: reference" in done.stdout
    assert "ratio to copy_: " in done.stdout and "speed vs torchao compiled" in done.stdout
    rows = records.read("nvfp4_throughput")
    throughput = [r["values"] for r in rows if r["kind"] == "throughput"]
    assert {(r["kernel"], r["block_size"]) for r in throughput} == {
        (kernel, block_size)
        for kernel in ("public", "compiled", "reference")
        for block_size in (16, 32)
    }
    for r in throughput:
        assert (
            r["gbps"] > 0
            and r["copy_gbps"] > 0
            and r["ratio_to_copy"] == pytest.approx(r["gbps"] / r["copy_gbps"])
            and r["peak_bytes"] > 0
            and r["evidence"] == ["reference_kernel"]
        )
        assert r["ran"] == ("reference" if r["kernel"] == "public" else r["kernel"])
    skipped = {r["values"]["kernel"]: r["values"] for r in rows if r["kind"] == "skipped"}
    assert (
        skipped["flashinfer"]["status"] == "skipped" and "SM100" in skipped["flashinfer"]["reason"]
    )
    [public] = [r["values"] for r in rows if r["kind"] == "public_goal"]
    ms = public["median_ms"]
    assert public["ratio_to_copy"] == pytest.approx(ms["copy_"] / ms["public"])
    assert public["speed_vs_torchao"] == pytest.approx(ms["torchao_compiled"] / ms["public"])
    assert public["threads"] == 1 and public["load_average_before"] >= 0
    assert (
        all(r["provenance"]["packages"]["torch"] for r in rows)
        and rows[0]["params"]["threads"] == 1
    )


def test_forwarding_bug_releases():
    assert [
        forwarding_bug.present_in_release(v) for v in ("0.6.11", "0.6.12", "0.7.0", "0.7.1")
    ] == [False, True, True, False]


def _row(kernel: str, ratio: float, m: int = 128, gbps: float = 1.0) -> dict:
    return {
        "kernel": kernel,
        "ran": "compiled" if kernel == "public" else kernel,
        "ratio_to_copy": ratio,
        "M": m,
        "K": 256,
        "block_size": 16,
        "gbps": gbps,
        "device": "cpu",
    }


def test_goal_summary_takes_the_worst_shape_and_compares_with_flashinfer():
    rows = [_row("public", 0.3), _row("public", 0.2, m=256), _row("reference", 0.9)]
    assert throughput.goal_summary(rows, torch.device("cpu")) is None  # the public call's goal
    gpu = [
        _row("triton_approx_rcp", 0.8, gbps=5.0),
        _row("triton_approx_rcp", 0.6, m=256, gbps=6.0),
        _row("flashinfer", 0.7, gbps=4.0),
    ]
    assert throughput.goal_summary(gpu, torch.device("cuda")) == {
        "kernel": "triton_approx_rcp",
        "goal_ratio": throughput.GPU_GOAL,
        "worst_ratio": 0.6,
        "worst_shape": [256, 256],
        "met": False,
        "at_least_flashinfer": True,
    }
    assert throughput.goal_summary(gpu[2:], torch.device("cuda")) is None


def _record(kind: str, **values: object) -> dict:
    return {"kind": kind, "values": values}


def test_summary_of_notebook_06_records():
    rows = [
        _record("crosscheck", peer="torchao.nvfp4_quantize", unexplained=0),
        _record("crosscheck", peer="torch.to_mxfp(mxfp4)", unexplained=1),
        _record("quantization_error", distribution="normal", format="nvfp4", snr_db=20.04),
        _record("quantization_error", distribution="normal", format="mxfp4", snr_db=17.96),
        _record(
            "quantization_error",
            distribution="normal",
            format="fp8_e4m3_per_tensor",
            snr_db=30.0,
            evidence=["reference_kernel"],
        ),
        _record("throughput", **_row("public", 0.3)),
        _record("throughput", **_row("public", 0.5, m=256)),
        _record("throughput", **_row("reference", 0.9)),
        _record("forwarding_bug", flashinfer="0.6.13", capture={"status": "present"}),
        _record("skipped", check="flashinfer_bit_exact", status="skipped", reason="no GPU"),
    ]
    assert summary.summarize(rows) == {
        "status": "measured; not run here: flashinfer_bit_exact",
        "headline": "reference vs 2 independent peers: 1 unexplained differences; "
        "SNR dB NVFP4 / MXFP4 / FP8 per-tensor: normal: 20.0 / 18.0 / 30.0; "
        "public quantize (compiled) at best 50% of the copy line, x.clone() (256x256, cpu); "
        "FlashInfer 0.6.13 argument-forwarding bug: present",
        "verdict": "FAILED",
        "number": "1 unexplained differences vs 2 independent peers; public quantize (compiled) "
        "at best 50% of the copy line, x.clone() (256x256, cpu)",
        "why": "fp4lab's spec-exact NVFP4 reference was cross-checked against independent peers; "
        "not run here: flashinfer_bit_exact",
        "needs": summary.NEEDS,
        "evidence": ["reference_kernel"],
    }
    assert summary.summarize(rows[:2])["status"] == "measured"
    failed = summary.summarize([*rows[:2], _record("error", check="capture_replay", message="x")])
    assert failed["status"] == "FAILED: capture_replay raised"
    assert summary.summarize([]) is None


def _verdict_records(**changes: object) -> list[dict]:
    values = {
        "crosscheck": {"peer": "torchao.nvfp4_quantize", "unexplained": 0},
        "swizzle": {"matches_formula": True, "matches_torch_to_blocked": True, "round_trips": True},
        "forwarding_bug": {
            "flashinfer": "0.6.13",
            "capture": {"status": "present"},
            "numerical": {"status": "not testable here", "reason": "no GPU"},
        },
        **changes,
    }
    errors = [
        _record("quantization_error", M=64, K=256, distribution="normal", format=f, snr_db=snr)
        for f, snr in (("nvfp4", 20.0), ("mxfp4", 18.0))
    ]
    speed = [_record("throughput", **_row("public", r)) for r in (0.3, 0.5)]
    return [_record(kind, **v) for kind, v in values.items()] + errors + speed


def test_verdict_reports_a_good_run_and_names_what_changed():
    cpu = torch.device("cpu")
    assert verdict.check_records(_verdict_records(), cpu) == (
        "cross-checks: 1 comparisons, 0 unexplained differences; forwarding bug in flashinfer"
        " 0.6.13: present\nspeed: public at 30% to 50% of the copy line (x.clone(); no goal on"
        " a CPU's clone line: the goal is benchmarks/nvfp4_throughput.py's public call against a"
        " preallocated copy_)"
    )
    unexplained = {"peer": "torch.to_mxfp(mxfp4)", "unexplained": 2}
    with pytest.raises(AssertionError, match="upstream behaviour changed: unexplained"):
        verdict.check_records(_verdict_records(crosscheck=unexplained), cpu)
    fixed = {"flashinfer": "0.7.1", "capture": {"status": "present"}, "numerical": {}}
    with pytest.raises(AssertionError, match=r"forwarding bug present \(capture\) in flashinfer"):
        verdict.check_records(_verdict_records(forwarding_bug=fixed), cpu)
    lost = {"flashinfer": "0.7.4", "capture": {"status": "not testable here"}, "numerical": {}}
    with pytest.raises(AssertionError, match=r"not testable here \(capture\).*expected absent"):
        verdict.check_records(_verdict_records(forwarding_bug=lost), cpu)
    order = _verdict_records()
    order[3]["values"]["snr_db"] = 17.0
    with pytest.raises(AssertionError, match=r"NVFP4 SNR 17\.00 dB <= MXFP4 18\.00 dB on normal"):
        verdict.check_records(order, cpu)
