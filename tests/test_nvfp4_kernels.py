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

from fp4lab.core import records
from fp4lab.fp4 import accuracy, crosscheck, flashinfer_kernel, kernels, nvfp4

REPO = Path(__file__).resolve().parents[1]

_TRITON_CHECK = textwrap.dedent(
    """
    import torch
    from fp4lab.fp4 import nvfp4
    from fp4lab.fp4 import kernels
    from fp4lab.fp4 import crosscheck as cc
    cases = [torch.randn(37, 96, dtype=torch.bfloat16), torch.randn(130, 512, dtype=torch.float16) * 100,
             torch.randn(64, 256), cc.adversarial_input(), cc.adversarial_input(dtype=torch.float16), cc.tie_input()]
    checked = 0
    for x in cases:
        for block_size in (16, 32):
            if x.shape[1] % block_size:
                continue
            for swizzle in (False, True):
                for gs in ([None] if block_size == 32 else [None, 1.0, 3.7]):
                    a = nvfp4.quantize(x, gs, block_size=block_size, swizzle=swizzle)
                    b = kernels.triton_quantize(x, gs, block_size=block_size, swizzle=swizzle, block_m=16, block_k=64)
                    assert torch.equal(a[0], b[0]), ("codes", x.dtype, tuple(x.shape), block_size, swizzle, gs)
                    assert torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8)), ("scales", x.dtype, tuple(x.shape), block_size, swizzle, gs)
                    assert a[1].dtype == b[1].dtype
                    checked += 1
    print("checked", checked)
    """
)


def test_triton_kernel_matches_reference_bytes_under_the_interpreter():
    pytest.importorskip("triton")
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


def test_compiled_quantize_matches_reference_bytes():
    for x in (crosscheck.adversarial_input(), torch.randn(130, 256, dtype=torch.bfloat16)):
        for block_size, swizzle in ((16, True), (32, False)):
            a = nvfp4.quantize(x, block_size=block_size, swizzle=swizzle)
            b = kernels.compiled_quantize(x, block_size=block_size, swizzle=swizzle)
            assert (
                torch.equal(a[0], b[0])
                and torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8))
                and a[1].dtype == b[1].dtype
            )


# -- FlashInfer ---------------------------------------------------------------------------


def fp4_quantize(input, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False, is_sf_swizzled_layout=True,
                 is_sf_8x4_layout=False, is_global_scale_inversed=False, enable_pdl=None):  # fmt: skip
    """Stands in for flashinfer.fp4_quantize's signature: the spy stops the call before this body."""
    raise AssertionError("the spy should have stopped the call")


@torch.library.custom_op("fp4labtest::positional_fp4_quantize", mutates_args=())
def _positional(input: torch.Tensor, global_scale: torch.Tensor | None = None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False, enable_pdl: bool | None = None) -> torch.Tensor:  # fmt: skip
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
def _keyword(input: torch.Tensor, global_scale: torch.Tensor | None = None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
             is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False, enable_pdl: bool | None = None) -> torch.Tensor:  # fmt: skip
    return fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout=is_sf_swizzled_layout,
                        is_sf_8x4_layout=is_sf_8x4_layout, enable_pdl=enable_pdl)  # fmt: skip


def test_forwarding_spy_tells_positional_from_keyword_forwarding():
    opdef = torch._library.custom_ops._maybe_get_opdef
    buggy = flashinfer_kernel._spy_forwarding(opdef("fp4labtest::positional_fp4_quantize"))
    fixed = flashinfer_kernel._spy_forwarding(opdef("fp4labtest::keyword_fp4_quantize"))
    assert buggy["status"] == "present" and buggy["forwarded_is_global_scale_inversed"] == "True"
    assert fixed["status"] == "absent" and fixed["forwarded_enable_pdl"] == "True"


def test_forwarding_bug_on_the_installed_flashinfer():
    from packaging.version import Version

    result = flashinfer_kernel.forwarding_bug("cpu")
    installed = result["flashinfer"]
    if installed is None or Version(installed) < Version("0.6.12"):
        assert result["capture"]["status"] == "not testable here"
        return
    buggy = Version(installed) < Version("0.6.19")
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
    x = crosscheck.adversarial_input()
    gs = nvfp4.global_scale_for(x)
    codes, sf, _ = nvfp4.quantize_bytes(x, gs, swizzle=True)
    same = flashinfer_kernel.compare_bytes(codes, sf, x, gs)
    assert same["codes_equal"] and same["scales_equal"] and same["code_mismatches"] == 0
    flipped = codes.clone()
    flipped[0, 0] ^= 0x01
    assert flashinfer_kernel.compare_bytes(flipped, sf, x, gs)["code_mismatches_unexplained"] == 1
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
    x = torch.cat(
        [crosscheck.adversarial_input(k=64), accuracy.activations("normal", 256, 64)]
    ).cuda()
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
            result["flashinfer_direct"]["scales_equal"]
            and result["flashinfer_direct"]["code_mismatches_unexplained"] == 0
        ), result
        assert result.get("triton_equals_flashinfer"), result


@pytest.mark.gpu
def test_hopper_probe_never_raises():
    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU runs FP4: nothing to probe")
    x, gs = _gpu_input()
    result = flashinfer_kernel.hopper_probe(x, gs)
    assert result["status"] == "ran" and "public" in result
    public = result["public"]
    assert (not public["ran"] and "SM100" in public["error"]) or public["returned"] in (
        "unwritten (poison survives)",
        "all zero",
        "other",
    )


@pytest.mark.gpu
def test_triton_kernel_on_the_gpu_matches_the_reference():
    x, _ = _gpu_input()
    for block_size in (16, 32):
        a = nvfp4.quantize(x.cpu(), block_size=block_size, swizzle=True)
        b = kernels.triton_quantize(x, block_size=block_size, swizzle=True)
        assert torch.equal(a[0], b[0].cpu()) and torch.equal(
            a[1].view(torch.uint8), b[1].view(torch.uint8).cpu()
        )


# -- the throughput benchmark ---------------------------------------------------------------


def _benchmark(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/nvfp4_throughput.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shapes", "64x48"], "--shapes K=48 must be a multiple of 32"),
        (["--shapes", "64"], "is not MxK"),
        (["--formats", "nvfp8"], "--formats contains 'nvfp8'; allowed values: nvfp4, mxfp4"),
        (["--dtype", "float64"], "--dtype='float64' is not allowed"),
    ],
)
def test_benchmark_names_bad_arguments(args, message):
    done = _benchmark(*args)
    assert done.returncode == 2 and message in done.stderr


def test_benchmark_prints_ratios_and_records_them(isolated_outputs):
    done = _benchmark("--shapes", "128x256", "--formats", "nvfp4,mxfp4", "--iters", "2", "--warmup", "1", "--threads", "1",
                      env={"FP4LAB_DATA_DIR": str(isolated_outputs / "data")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        "copy GB/s" in done.stdout and "goal: compiled at >= 25% of copy bandwidth" in done.stdout
    )
    rows = records.read("nvfp4_throughput")
    throughput = [r["values"] for r in rows if r["kind"] == "throughput"]
    assert {(r["kernel"], r["block_size"]) for r in throughput} == {
        ("compiled", 16),
        ("eager", 16),
        ("compiled", 32),
        ("eager", 32),
    }
    for r in throughput:
        assert (
            r["gbps"] > 0
            and r["copy_gbps"] > 0
            and r["ratio_to_copy"] == pytest.approx(r["gbps"] / r["copy_gbps"])
            and r["peak_bytes"] > 0
        )
    skipped = {r["values"]["kernel"]: r["values"] for r in rows if r["kind"] == "skipped"}
    assert (
        skipped["flashinfer"]["status"] == "skipped" and "SM100" in skipped["flashinfer"]["reason"]
    )
    assert (
        all(r["provenance"]["packages"]["torch"] for r in rows)
        and rows[0]["params"]["threads"] == 1
    )
