"""Quantize throughput against the memory-copy line, measured in one run.

Used by benchmarks/nvfp4_throughput.py and notebook 06. ``public`` is ``kernels.quantize`` as users
call it (each row says which kernel it ran), ``reference`` the eager spec, ``compiled`` the
torch.compile'd formulation; ``triton`` (and FlashInfer, where it runs) are given the global
scale, as a serving stack calls its quantize kernel, where ``public`` computes it (one more read
of x). On a GPU times are CUDA events over back-to-back calls (the kernels' time, launch cost
included only where the GPU waits for it), elsewhere the wall clock. ``public_goal`` measures
the public call against a preallocated copy and torchao's compiled quantize in interleaved
rounds.

GB/s are bytes of *input* per second. The copy line is ``x.clone()`` of the same tensor (it
reads x, allocates and writes a copy, as a kernel returning new tensors does), timed before
and after the kernels of a shape so a busy machine shows in both; the ratio uses their mean.
``copy_into_gbps`` is a copy into a preallocated buffer, the allocator taken out: on a CPU
the two differ by whether fresh pages are faulted in, which moves the line severalfold.
Peak memory is the most bytes allocated during one call beyond its input: the CUDA caching
allocator's peak on a GPU, the running sum of the profiler's allocation events on a CPU.
"""

from __future__ import annotations

import functools
import itertools
import os
import statistics
import time
from collections.abc import Callable

import torch

from fp4lab.core import evidence, probe, timing
from fp4lab.fp4 import flashinfer_kernel, kernels, nvfp4

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CPU_GOAL = 0.25
"""On a CPU, the public quantize at 25% or more of a preallocated ``copy_`` (``public_goal``)."""
TORCHAO_GOAL = 1.0
"""The public quantize at least as fast as torchao's compiled nvfp4_quantize."""
CPU = torch.device("cpu")
GPU_GOAL = 0.70
"""A fused kernel at 70% or more of device-to-device copy bandwidth on a GPU (H200)."""


def candidates(
    device: torch.device, block_size: int
) -> tuple[dict[str, Callable[[torch.Tensor], object]], dict[str, str]]:
    """The quantize kernels that run on ``device``, and the skipped ones with the reason."""
    run: dict[str, Callable] = {
        "public": lambda x: kernels.quantize(x, block_size=block_size, swizzle=True),
        "compiled": lambda x: kernels.compiled_quantize(x, block_size=block_size, swizzle=True),
    }
    skipped: dict[str, str] = {}
    if device.type == "cpu":
        run["reference"] = lambda x: nvfp4.reference_quantize(
            x, block_size=block_size, swizzle=True
        )
        skipped["triton"] = "Triton's CPU interpreter measures nothing about speed"
        skipped["flashinfer"] = "FlashInfer's kernel needs an SM100+ GPU"
        return run, skipped
    reason = kernels.triton_available()
    if reason:
        skipped["triton"] = reason
    else:
        # given the global scale, as a serving stack calls a quantize kernel (FlashInfer's too)
        gs = None if block_size == nvfp4.MXFP4_BLOCK else torch.ones((), device=device)
        run["triton"] = lambda x: kernels.triton_quantize(
            x, gs, block_size=block_size, swizzle=True
        )
        run["triton_approx_rcp"] = lambda x: kernels.triton_quantize(
            x, gs, block_size=block_size, swizzle=True, approx_rcp=True
        )
    sm = torch.cuda.get_device_capability(device)
    if sm >= probe.FP4_MIN_SM:
        gs = torch.ones(1, device=device)
        run["flashinfer"] = lambda x: flashinfer_kernel.flashinfer_quantize(
            x, None if block_size == 32 else gs, block_size=block_size
        )
    else:
        skipped["flashinfer"] = (
            f"FlashInfer's FP4 quantize needs SM100+; this GPU is SM{sm[0]}{sm[1]}"
        )
    return run, skipped


def peak_bytes(fn: Callable, x: torch.Tensor) -> int:
    """Most bytes allocated at once during ``fn(x)``, beyond what was allocated before."""
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
        before = torch.cuda.memory_allocated(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
        fn(x)
        torch.cuda.synchronize(x.device)
        return torch.cuda.max_memory_allocated(x.device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(x)
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    return max(itertools.accumulate((e.nbytes() for e in events), initial=0))


def quantize_vs_copy(
    shapes: list[tuple[int, int]],
    *,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    block_sizes: tuple[int, ...] = (16,),
    warmup: int = 2,
    iters: int = 5,
    seed: int = 0,
) -> tuple[list[dict], dict[str, str]]:
    """One row per (shape, block_size, kernel): ms, GB/s, copy GB/s, ratio, peak bytes; and what was skipped."""
    rows, skipped = [], {}
    generator = torch.Generator().manual_seed(seed)
    for (m, k), block_size in itertools.product(shapes, block_sizes):
        nvfp4.check_block_size(block_size)
        if k % block_size:
            raise ValueError(f"shape [{m}, {k}]: K must be a multiple of block_size={block_size}")
        x = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
        nbytes = x.numel() * x.element_size()
        run, skipped_here = candidates(device, block_size)
        skipped.update(skipped_here)
        timed = functools.partial(_time, device=device, warmup=warmup, iters=iters)
        copy_before = timed(torch.clone, x)
        measured, configs = {}, {}
        for name, fn in run.items():
            measured[name] = timed(fn, x)
            if name.startswith("triton"):
                configs[name] = kernels.tuned_config()
        copy_after = timed(torch.clone, x)
        copy_into = timed(torch.empty_like(x).copy_, x)
        copy_ms = (copy_before["median_ms"] + copy_after["median_ms"]) / 2
        copy_gbps = nbytes / copy_ms / 1e6
        for name, t in measured.items():
            gbps = nbytes / t["median_ms"] / 1e6
            rows.append(
                {
                    "device": device.type,
                    "M": m,
                    "K": k,
                    "dtype": str(dtype).removeprefix("torch."),
                    "block_size": block_size,
                    "kernel": name,
                    "ran": kernels.public_kernel(x) if name == "public" else name,
                    "evidence": evidence.check(
                        ["real_fp4_kernel" if name == "flashinfer" else "reference_kernel"]
                    ),
                    "median_ms": t["median_ms"],
                    "p10_ms": t["p10_ms"],
                    "p90_ms": t["p90_ms"],
                    "gbps": gbps,
                    "copy_ms_before": copy_before["median_ms"],
                    "copy_ms_after": copy_after["median_ms"],
                    "copy_gbps": copy_gbps,
                    "ratio_to_copy": gbps / copy_gbps,
                    "copy_into_gbps": nbytes / copy_into["median_ms"] / 1e6,
                    "peak_bytes": peak_bytes(run[name], x),
                    "input_bytes": nbytes,
                    "timed_by": "cuda_events" if device.type == "cuda" else "wall_clock",
                    **({"tile": configs[name]} if name in configs else {}),
                }
            )
    return rows, skipped


def _time(fn: Callable, x: torch.Tensor, *, device: torch.device, warmup: int, iters: int) -> dict:
    """Kernel time: CUDA events over back-to-back calls on a GPU, the wall clock elsewhere."""
    if device.type == "cuda":
        return timing.device_ms(fn, x, warmup=warmup, iters=iters)
    return timing.measure(fn, x, warmup=warmup, iters=iters, device=device)


def goal_for(device: torch.device) -> tuple[str, float] | None:
    """The table's speed goal on this device: (kernel, ratio to the copy line) on a GPU. None on a
    CPU, whose goal is ``public_goal``'s (the public call against a preallocated ``copy_``): there
    the clone line moves severalfold with page faults and cache fits, and is no yardstick."""
    return None if device.type == "cpu" else ("triton_approx_rcp", GPU_GOAL)


def _case(row: dict) -> tuple[int, int, int]:
    return row["M"], row["K"], row["block_size"]


def goal_summary(rows: list[dict], device: torch.device) -> dict | None:
    """The goal kernel's worst ratio to copy over the rows, whether it meets the goal and whether
    it is at least FlashInfer's speed wherever both ran. None without goal rows, or on a CPU."""
    target = goal_for(device)
    if target is None:
        return None
    kernel, goal = target
    goal_rows = [r for r in rows if r["kernel"] == kernel]
    if not goal_rows:
        return None
    worst = min(goal_rows, key=lambda r: r["ratio_to_copy"])
    summary = {
        "kernel": kernel,
        "goal_ratio": goal,
        "worst_ratio": worst["ratio_to_copy"],
        "worst_shape": [worst["M"], worst["K"]],
        "met": worst["ratio_to_copy"] >= goal,
    }
    flashinfer = {_case(r): r["gbps"] for r in rows if r["kernel"] == "flashinfer"}
    both = [r for r in goal_rows if _case(r) in flashinfer]
    summary["at_least_flashinfer"] = (
        all(r["gbps"] >= flashinfer[_case(r)] for r in both) if flashinfer else None
    )
    return summary


def _torchao_compiled() -> Callable[[torch.Tensor], object]:
    """torchao's NVFP4 quantize as its users call it, compiled: the per-tensor scale from amax(|x|),
    then ``nvfp4_quantize`` (linear scales), in one torch.compile'd function."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    def quantize(x: torch.Tensor) -> object:
        return nvfp4_quantize(x, nvfp4.NVFP4_BLOCK, per_tensor_amax_to_scale(x.abs().amax()))

    return torch.compile(quantize)


def public_goal(
    shape: tuple[int, int] = (4096, 4096),
    *,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    rounds: int = 9,
    seed: int = 0,
) -> dict:
    """``kernels.quantize(x)`` as users call it against ``out.copy_(x)`` (preallocated) and torchao's
    compiled quantize, one call of each per round so a busy machine slows all three alike; medians
    over the rounds, first calls (compiles included) timed apart. torchao is left out, with the
    reason, where it cannot run."""
    m, k = shape
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty_like(x)
    calls: dict[str, Callable] = {
        "copy_": lambda: out.copy_(x),
        "public": lambda: kernels.quantize(x),
    }
    record: dict = {"M": m, "K": k, "dtype": str(dtype).removeprefix("torch."), "rounds": rounds}
    record |= {
        "device": device.type,
        "threads": torch.get_num_threads(),
        "ran": kernels.public_kernel(x),
    }
    if dtype not in (torch.float32, torch.bfloat16):
        record["torchao_skipped"] = (
            f"torchao's nvfp4_quantize takes float32 or bfloat16, not {dtype}"
        )
    else:
        try:
            torchao = _torchao_compiled()
            calls["torchao_compiled"] = lambda: torchao(x)
        except ImportError as e:
            record["torchao_skipped"] = f"torchao cannot be imported: {e}"
    record["load_average_before"] = os.getloadavg()[0]
    first = {}
    for name, call in calls.items():
        started = time.perf_counter()
        call()
        timing.sync(device)
        first[name] = time.perf_counter() - started
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            timing.sync(device)
            samples[name].append((time.perf_counter() - started) * 1e3)
    record["load_average_after"] = os.getloadavg()[0]
    median = {name: statistics.median(s) for name, s in samples.items()}
    record |= {"median_ms": median, "first_call_s": first}
    record["ratio_to_copy"] = median["copy_"] / median["public"]
    record["copy_goal"] = CPU_GOAL if device.type == "cpu" else GPU_GOAL
    record["meets_copy_goal"] = record["ratio_to_copy"] >= record["copy_goal"]
    if "torchao_compiled" in median:
        record["speed_vs_torchao"] = median["torchao_compiled"] / median["public"]
        record["meets_torchao_goal"] = record["speed_vs_torchao"] >= TORCHAO_GOAL
    record["evidence"] = evidence.check(["reference_kernel"])
    return record
