"""One rank of an allreduce sweep under torchrun: latency and bandwidth over message sizes.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m fp4lab.comm.allreduce \\
        --backend gloo --sizes 1KiB:64MiB --iters 20 --warmup 5 --out allreduce.jsonl

Backends: ``gloo`` (CPU), ``nccl`` (eager, and replayed from a CUDA graph), ``mscclpp``
(SGLang's ``PyMscclppCommunicator`` through its own parallel-state setup, eager and in
a graph; only where sglang, mscclpp and several GPUs exist). Sizes are powers of two.
Every rank fills its buffer with ``(rank + 1) * (1 + i % 3)`` so each size is checked
for the exact sum (16-bit dtypes only for world sizes whose partial sums they hold
exactly). Times are per iteration, the slowest rank's, as median and 10th/90th
percentiles; bandwidths follow nccl-tests: ``algbw = bytes / time`` and
``busbw = algbw * 2 (n - 1) / n`` for n ranks. Rank 0 appends one JSON line per size
and mode as soon as it is measured, so a later failure keeps what was finished.
``fp4lab.comm.allreduce.sweep`` is the driver that starts this under torchrun.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from fp4lab.comm import ranks
from fp4lab.comm.allreduce.ops import Allreduce, SGLangMscclpp, TorchAllreduce
from fp4lab.comm.allreduce.params import BACKENDS, DTYPES, parse_modes, unavailable, validate
from fp4lab.comm.allreduce.sizes import SIZE_HELP, format_size, parse_sizes
from fp4lab.comm.torchrun import refuse_backend
from fp4lab.core import timing

GRAPH_OPS = 10
"""Allreduces captured back to back in one CUDA graph; a replay's time is divided by this."""


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce: ``algbw * 2 (n - 1) / n``."""
    return algbw * 2 * (world_size - 1) / world_size


def _pattern(n: int, rank: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return ((torch.arange(n, device=device) % 3 + 1) * (rank + 1)).to(dtype)


def _time_calls(
    call: Callable[[], None], iters: int, warmup: int, device: torch.device, per_call_ops: int = 1
) -> list[float]:
    """Milliseconds per op for each of ``iters`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    timing.sync(device)
    samples = []
    if device.type == "cuda":
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(iters)
        ]
        for start, end in events:
            start.record()
            call()
            end.record()
        timing.sync(device)
        samples = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(iters):
            started = time.perf_counter()
            call()
            samples.append((time.perf_counter() - started) * 1e3)
    return [s / per_call_ops for s in samples]


def _capture(op: Allreduce, x: torch.Tensor, ops: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(x)  # warm up outside the capture (communicators initialise lazily)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with (
        op.capturing() as stream,
        torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"),
    ):
        for _ in range(ops):
            op(x)
    torch.cuda.synchronize()
    return graph


def _check(
    op: Allreduce,
    mode: str,
    n: int,
    env: ranks.RankEnv,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[bool, float]:
    """Run one allreduce (eagerly or from a one-op graph) on the pattern; compare with the exact sum."""
    x = _pattern(n, env.rank, dtype, device)
    if mode == "graph":
        graph = _capture(op, x, 1)
        x.copy_(_pattern(n, env.rank, dtype, device))
        graph.replay()
        timing.sync(device)
    else:
        op(x)
        timing.sync(device)
    expected = _pattern(n, 0, torch.float64, device) * (env.world_size * (env.world_size + 1) // 2)
    error = float((x.double() - expected).abs().max())
    return error == 0.0, error


def measure_size(
    op: Allreduce,
    mode: str,
    nbytes: int,
    env: ranks.RankEnv,
    dtype_name: str,
    device: torch.device,
    iters: int,
    warmup: int,
    meta: dist.ProcessGroup,
) -> dict:
    """One row: exactness and the time of an allreduce of ``nbytes`` on every rank."""
    dtype = DTYPES[dtype_name]
    n = nbytes // dtype.itemsize
    row = {
        "backend": op.backend, "mode": mode, "world_size": env.world_size, "nodes": env.nodes, "dtype": dtype_name,
        "bytes": nbytes, "size": format_size(nbytes), "elements": n, "iters": iters, "warmup": warmup,
        **op.state(),  # the communicator's own proof of what ran (MSCCL++ or not)
    }  # fmt: skip
    label = f"{op.backend} {mode} {format_size(nbytes)}"
    ranks.progress(f"{label}: routing")
    reason = op.not_routed(torch.empty(n, dtype=dtype, device=device))
    reasons: list[str | None] = [None] * env.world_size
    dist.all_gather_object(reasons, reason, group=meta)
    if any(reasons):
        return {**row, "status": "skipped", "reason": next(r for r in reasons if r)}
    ranks.progress(f"{label}: checking the sum")
    correct, error = _check(op, mode, n, env, dtype, device)
    verdicts: list[tuple[bool, float] | None] = [None] * env.world_size
    dist.all_gather_object(verdicts, (correct, error), group=meta)
    x = torch.zeros(n, dtype=dtype, device=device)
    ranks.progress(f"{label}: timing")
    dist.barrier(group=meta)
    if mode == "graph":
        graph = _capture(op, x, GRAPH_OPS)
        samples = _time_calls(graph.replay, iters, warmup, device, per_call_ops=GRAPH_OPS)
    else:
        samples = _time_calls(lambda: op(x), iters, warmup, device)
    summary = timing.summarize(ranks.iteration_max(samples, meta))
    algbw = nbytes / (summary["median_ms"] / 1e3) / 1e9
    return {
        **row, "status": "ok", "reason": "",
        "correct": all(v[0] for v in verdicts), "max_abs_err": max(v[1] for v in verdicts),
        "median_us": summary["median_ms"] * 1e3, "p10_us": summary["p10_ms"] * 1e3, "p90_us": summary["p90_ms"] * 1e3,
        "algbw_GBps": algbw, "busbw_GBps": bus_bandwidth(algbw, env.world_size),
    }  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.comm.allreduce", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--backend", default="gloo", help=f"one of {', '.join(BACKENDS)} (default gloo)"
    )
    parser.add_argument("--sizes", default="1KiB:64MiB", help=SIZE_HELP + " (default 1KiB:64MiB)")
    parser.add_argument(
        "--iters", type=int, default=20, help="timed iterations per size (default 20)"
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed iterations per size (default 5)"
    )
    parser.add_argument(
        "--dtype", default="float32", help=f"one of {', '.join(DTYPES)} (default float32)"
    )
    parser.add_argument(
        "--modes",
        default="auto",
        help="eager, graph or both, comma separated; auto = all the backend supports",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="JSON lines file rank 0 appends one row per size and mode to",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """One rank of a sweep; torchrun starts one per process and tells each who it is."""
    args = _parser().parse_args(argv)
    env = ranks.RankEnv.from_environ()
    try:
        sizes = parse_sizes(args.sizes)
        modes = parse_modes(args.modes, args.backend)
        validate(args.backend, sizes, env.world_size, args.iters, args.warmup, args.dtype, modes)
        refuse_backend(
            args.backend, unavailable(args.backend, env.world_size, per_node=env.local_world_size)
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env, device = ranks.init("gloo" if args.backend == "gloo" else "nccl")
    meta = dist.group.WORLD if args.backend == "gloo" else dist.new_group(backend="gloo")
    op: Allreduce = (
        SGLangMscclpp(env) if args.backend == "mscclpp" else TorchAllreduce(args.backend)
    )
    for nbytes in sizes:
        for mode in modes:
            ranks.progress(f"{args.backend} {mode} {format_size(nbytes)}")
            row = measure_size(
                op, mode, nbytes, env, args.dtype, device, args.iters, args.warmup, meta
            )
            if env.rank == 0:
                ranks.append_row(args.out, row)
                shown = (
                    f"{row['median_us']:10.1f} us  busbw {row['busbw_GBps']:8.3f} GB/s  correct={row['correct']}"
                    if row["status"] == "ok"
                    else f"skipped: {row['reason']}"
                )
                print(f"{args.backend:7} {mode:5} {row['size']:>6}: {shown}", flush=True)
    ranks.finish(meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
