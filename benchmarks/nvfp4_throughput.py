"""NVFP4/MXFP4 quantize throughput against the memory-copy line, measured in one run.

Prints a table (GB/s of input, ratio to copy bandwidth, peak memory) and appends one record
per row to data/nvfp4_throughput.jsonl. On a GPU (H200) the table's goal: a fused kernel at 70%
or more of device-to-device copy bandwidth and at least FlashInfer's speed where both run. On a
CPU the table has no goal (its clone line moves with page faults and cache fits); the goal is the
public call's below. Kernels that cannot run here are printed and recorded as skipped, with the
reason.

Then the public call as users call it, ``kernels.quantize(x)`` on a float32 --goal-shape, against
a preallocated ``copy_`` of x and torchao's compiled ``nvfp4_quantize``, one call of each per
round (--goal-rounds): the two ratios are printed (goals: >= 25% of copy, >= 1.0x torchao).

    build/venv/bin/python benchmarks/nvfp4_throughput.py [--shapes 1024x1024,8192x8192]
        [--device auto|cpu|cuda] [--dtype bfloat16|float16|float32] [--formats nvfp4,mxfp4]
        [--iters 10] [--warmup 3 (0 or more)] [--threads N] [--goal-shape 4096x4096]
        [--goal-rounds 9]

CPU numbers move with whatever else runs on the machine: each record carries the load
average seen when the run started, and --threads 1 keeps OpenMP from waiting on a busy core.
"""

from __future__ import annotations

import argparse
import os
import sys

import fp4lab

fp4lab.setup()  # caches into build/ before torch is imported

import torch  # noqa: E402

from fp4lab.core import params, records  # noqa: E402
from fp4lab.fp4 import harness, throughput  # noqa: E402

NOTEBOOK = "nvfp4_throughput"
FORMATS = {"nvfp4": 16, "mxfp4": 32}
DEFAULT_SHAPES = "1024x1024,2048x2048,4096x4096"


def parse_shapes(text: str, name: str = "--shapes") -> list[tuple[int, int]]:
    """``MxK,MxK`` -> [(M, K), ...], each checked as notebook 06 checks its shapes."""
    pairs = []
    for item in text.split(","):
        try:
            m, k = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"{name} item {item!r} is not MxK (e.g. 1024x1024)") from None
        pairs.append([m, k])
    return harness.check_shapes(name, pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default=DEFAULT_SHAPES,
        help=f"comma-separated MxK, K a multiple of 32 (default {DEFAULT_SHAPES})",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 | float16 | float32")
    parser.add_argument("--formats", default="nvfp4", help="comma-separated: nvfp4, mxfp4")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--goal-shape", default="4096x4096", help="MxK of the public call's goal check"
    )
    parser.add_argument("--goal-rounds", type=int, default=9)
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="CPU threads for torch (default: torch's)",
    )
    args = parser.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
        goal_shapes = parse_shapes(args.goal_shape, "--goal-shape")
        if len(goal_shapes) != 1:
            raise ValueError(f"--goal-shape={args.goal_shape!r} must be one MxK")
        [goal_shape] = goal_shapes
        params.positive("--goal-rounds", args.goal_rounds)
        device = params.device("--device", args.device)
        params.choice("--dtype", args.dtype, tuple(throughput.DTYPES))
        formats = args.formats.split(",")
        params.choices("--formats", formats, tuple(FORMATS))
        params.positive("--iters", args.iters)
        if args.warmup < 0:
            raise ValueError(f"--warmup={args.warmup} must be 0 or more")
        params.positive("--threads", args.threads)
    except ValueError as e:
        parser.error(str(e))
    torch.set_num_threads(args.threads)
    run_params = {
        "shapes": [list(s) for s in shapes],
        "device": device.type,
        "dtype": args.dtype,
        "formats": formats,
        "iters": args.iters,
        "warmup": args.warmup,
        "threads": args.threads,
        "goal_shape": list(goal_shape),
        "goal_rounds": args.goal_rounds,
        "load_average_1min": os.getloadavg()[0],
    }
    rows, skipped = throughput.quantize_vs_copy(
        shapes,
        device=device,
        dtype=throughput.DTYPES[args.dtype],
        block_sizes=tuple(FORMATS[f] for f in formats),
        warmup=args.warmup,
        iters=args.iters,
    )
    rec = records.Recorder(NOTEBOOK, run_params)
    print(
        f"{'shape':>11} {'fmt':>5} {'kernel':>18} {'ms':>9} {'GB/s':>8} {'copy GB/s':>9}"
        f" {'ratio':>6} {'copy-into':>9} {'peak MiB':>9}"
    )
    for r in rec.add_all("throughput", rows):
        fmt = "nvfp4" if r["block_size"] == 16 else "mxfp4"
        print(
            f"{r['M']:>5}x{r['K']:<5} {fmt:>5} {r['kernel']:>18} {r['median_ms']:>9.2f}"
            f" {r['gbps']:>8.2f} {r['copy_gbps']:>9.2f} {r['ratio_to_copy']:>6.2f}"
            f" {r['copy_into_gbps']:>9.2f} {r['peak_bytes'] / 2**20:>9.1f}"
        )
    for name, reason in sorted(skipped.items()):
        rec.add("skipped", {"kernel": name, "status": "skipped", "reason": reason})
        print(f"skipped {name}: {reason}")
    goal = throughput.goal_summary(rows, device)
    if device.type == "cpu":
        print("goal on a CPU: the public call below, against a preallocated copy_")
    elif goal:
        rec.add("goal", goal)
        verdict = "met" if goal["met"] else "NOT met"
        (m, k), worst = goal["worst_shape"], goal["worst_ratio"]
        print(
            f"goal: {goal['kernel']} at >= {goal['goal_ratio']:.0%} of copy bandwidth: {verdict}"
            f" (worst {worst:.0%} at {m}x{k})"
        )
    public = throughput.public_goal(goal_shape, device=device, rounds=args.goal_rounds)
    rec.add("public_goal", public)
    print(public_goal_lines(public))
    return 0


def public_goal_lines(r: dict) -> str:
    """The public call's two ratios, each against its goal, and what they were measured under."""
    ms = r["median_ms"]
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    lines = [
        f"public kernels.quantize(x), {r['M']}x{r['K']} {r['dtype']} on {r['device']}"
        f" (ran: {r['ran']}; {r['threads']} threads, load {r['load_average_before']:.1f}"
        f" -> {r['load_average_after']:.1f}; medians of {r['rounds']} rounds):"
        f" {ms['public']:.1f} ms, copy_ {ms['copy_']:.1f} ms",
        f"  ratio to copy_: {r['ratio_to_copy']:.2f} (goal >= {r['copy_goal']:.2f}:"
        f" {met(r['meets_copy_goal'])})",
    ]
    if "speed_vs_torchao" in r:
        lines.append(
            f"  speed vs torchao compiled nvfp4_quantize ({ms['torchao_compiled']:.1f} ms):"
            f" {r['speed_vs_torchao']:.2f}x (goal >= {throughput.TORCHAO_GOAL:.1f}x:"
            f" {met(r['meets_torchao_goal'])})"
        )
    else:
        lines.append(f"  torchao: skipped ({r['torchao_skipped']})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
