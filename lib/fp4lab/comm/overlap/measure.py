"""One rank of the overlap microbenchmark: a MoE down-projection in chunks, each chunk's
combine in flight while the next computes.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m fp4lab.comm.overlap \\
        --scale 16 --tokens 256 --chunks 1,2,4,8 --out overlap.jsonl

This is the shape of SGLang's Single Batch Overlap (``--enable-single-batch-overlap``):
within one micro-batch, the down-projection GEMM of the routed experts overlaps with
the combine that sends its results back. Each rank holds ``experts / world`` experts of
GLM-5's MoE (widths divided by ``scale``) and receives ``tokens * topk`` routed rows.
Four timings per chunk count, taken in turn within each iteration, each the slowest rank's
per iteration, as a median:

- compute: the chunked GEMMs alone;
- comm: the chunked combines alone, each waited for before the next;
- overlapped: chunk k's combine issued with ``async_op=True`` (on a GPU NCCL runs it on
  its own stream) while chunk k+1's GEMM runs, all waited for at the end;
- sequential: the whole GEMM, then one combine: the baseline without SBO.

The overlapped results are compared with the blocking, chunk-by-chunk ones.
``fp4lab.comm.overlap.benchmark`` is the driver that starts this under torchrun.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from fp4lab.comm import ranks
from fp4lab.comm.overlap.params import (
    COLLECTIVES,
    DTYPES,
    MoeShape,
    parse_chunks,
    resolve_dtype,
    unavailable,
    validate,
)
from fp4lab.comm.torchrun import refuse_backend
from fp4lab.core import glm5, timing


def efficiency(t_compute: float, t_comm: float, t_overlapped: float) -> float:
    """(compute + comm - overlapped) / min(compute, comm): 1 when the shorter of the two is
    hidden completely, 0 when nothing overlaps, negative when the chunked pipeline costs more
    than running the two back to back."""
    return (t_compute + t_comm - t_overlapped) / min(t_compute, t_comm)


class Pipeline:
    """One rank's experts, its routed rows, and the combine it sends their outputs back with.

    Chunks are blocks of local experts, as SBO's down GEMM signals finished blocks of
    experts to the combine: chunk k is one batched GEMM over its experts, then their
    outputs go out while the next block computes.
    """

    def __init__(
        self,
        shape: MoeShape,
        tokens: int,
        collective: str,
        world_size: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.local_experts = shape.experts // world_size
        self.per_expert = tokens * shape.topk // self.local_experts
        self.collective = collective
        generator = torch.Generator().manual_seed(1000 + rank)

        def make(*size: int) -> torch.Tensor:
            scaled = torch.randn(*size, generator=generator) / size[-2] ** 0.5
            return scaled.to(dtype).to(device)

        self.x = make(self.local_experts, self.per_expert, shape.moe_ffn)
        self.w = make(self.local_experts, shape.moe_ffn, shape.hidden)

    def bounds(self, chunks: int) -> list[tuple[int, int]]:
        step = self.local_experts // chunks
        return [(k * step, (k + 1) * step) for k in range(chunks)]

    def gemm(self, start: int, stop: int) -> torch.Tensor:
        return torch.bmm(self.x[start:stop], self.w[start:stop])

    def combine(
        self, out: torch.Tensor, async_op: bool = False
    ) -> tuple[torch.Tensor, dist.Work | None]:
        flat = out.reshape(-1)
        if self.collective == "all_reduce":
            return flat, dist.all_reduce(flat, async_op=async_op)
        received = torch.empty_like(flat)
        return received, dist.all_to_all_single(received, flat, async_op=async_op)

    def compute(self, chunks: int) -> list[torch.Tensor]:
        return [self.gemm(start, stop) for start, stop in self.bounds(chunks)]

    def blocking(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each chunk's combine, waited for before the next starts."""
        return [self.combine(out)[0] for out in outputs]

    def overlapped(self, chunks: int) -> list[torch.Tensor]:
        """Each chunk's combine in flight while the next chunk computes; all waited for at the end."""
        pending = [
            self.combine(self.gemm(start, stop), async_op=True)
            for start, stop in self.bounds(chunks)
        ]
        for _, work in pending:
            work.wait()
        return [received for received, _ in pending]

    def sequential(self) -> torch.Tensor:
        """No overlap, no chunks: the whole GEMM, then one combine."""
        return self.combine(self.gemm(0, self.local_experts))[0]


def _timed(
    calls: dict[str, Callable[[], object]],
    iters: int,
    warmup: int,
    device: torch.device,
    meta: dist.ProcessGroup,
) -> dict[str, float]:
    """Median over iterations of the slowest rank's milliseconds for each call.

    The calls take turns within every iteration, so a busy spell of the machine falls on all
    of them alike instead of on whichever happened to be timed then."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    timing.sync(device)
    dist.barrier(group=meta)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(iters):
        for name, call in calls.items():
            dist.barrier(group=meta)  # every rank starts the call together; the wait is not timed
            started = time.perf_counter()
            call()
            timing.sync(device)
            samples[name].append((time.perf_counter() - started) * 1e3)
    return {
        name: timing.summarize(ranks.iteration_max(taken, meta))["median_ms"]
        for name, taken in samples.items()
    }


def measure_chunks(
    pipeline: Pipeline,
    chunks: int,
    world_size: int,
    iters: int,
    warmup: int,
    device: torch.device,
    meta: dist.ProcessGroup,
) -> dict:
    """The four timings, the efficiency and the correctness check for one chunk count."""
    outputs = pipeline.compute(chunks)
    ranks.progress(f"chunks {chunks}: timing")
    calls = {
        "compute": lambda: pipeline.compute(chunks),
        "comm": lambda: pipeline.blocking(outputs),
        "overlapped": lambda: pipeline.overlapped(chunks),
        "sequential": pipeline.sequential,
    }
    t_compute, t_comm, t_overlapped, t_sequential = _timed(
        calls, iters, warmup, device, meta
    ).values()
    ranks.progress(f"chunks {chunks}: checking")
    reference = torch.cat(pipeline.blocking(pipeline.compute(chunks))).float()
    local_diff = float((torch.cat(pipeline.overlapped(chunks)).float() - reference).abs().max())
    diffs: list[float | None] = [None] * world_size
    dist.all_gather_object(diffs, local_diff, group=meta)
    return {
        "chunks": chunks,
        "t_compute_ms": t_compute,
        "t_comm_ms": t_comm,
        "t_overlapped_ms": t_overlapped,
        "t_sequential_ms": t_sequential,
        "efficiency": efficiency(t_compute, t_comm, t_overlapped),
        "speedup_vs_sequential": t_sequential / t_overlapped,
        "max_abs_diff_vs_blocking": max(diffs),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.comm.overlap", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--backend", default="gloo", help="gloo (CPU) or nccl (one GPU per rank); default gloo"
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=16,
        help=f"divide GLM-5's widths by this: {', '.join(map(str, glm5.SCALES))}",
    )
    parser.add_argument(
        "--tokens", type=int, default=256, help="tokens in the batch on each rank (default 256)"
    )
    parser.add_argument(
        "--chunks", default="1,2,4,8", help="chunk counts, comma separated (default 1,2,4,8)"
    )
    parser.add_argument(
        "--collective",
        default="all_to_all",
        help=f"the combine: {', '.join(COLLECTIVES)} (default all_to_all)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        help="float32, bfloat16, or auto (bfloat16 on GPU, float32 on CPU)",
    )
    parser.add_argument("--iters", type=int, default=10, help="timed iterations (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations (default 2)")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="JSON lines file rank 0 appends one row per chunk count to",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """One rank of the microbenchmark; torchrun starts one per process."""
    args = _parser().parse_args(argv)
    env = ranks.RankEnv.from_environ()
    try:
        shape = MoeShape.glm5(args.scale)
        chunks = parse_chunks(args.chunks)
        validate(
            shape,
            args.tokens,
            chunks,
            env.world_size,
            args.backend,
            args.collective,
            args.iters,
            args.warmup,
        )
        refuse_backend(args.backend, unavailable(args.backend, env.local_world_size))
        dtype_name = resolve_dtype(args.dtype, args.backend)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env, device = ranks.init(args.backend)
    meta = dist.group.WORLD if args.backend == "gloo" else dist.new_group(backend="gloo")
    pipeline = Pipeline(
        shape, args.tokens, args.collective, env.world_size, env.rank, DTYPES[dtype_name], device
    )
    for c in chunks:
        ranks.progress(f"chunks {c}")
        row = measure_chunks(pipeline, c, env.world_size, args.iters, args.warmup, device, meta)
        row.update(
            asdict(shape),
            scale=args.scale,
            tokens=args.tokens,
            collective=args.collective,
            backend=args.backend,
            dtype=dtype_name,
            world_size=env.world_size,
            iters=args.iters,
            warmup=args.warmup,
        )
        if env.rank == 0:
            ranks.append_row(args.out, row)
            print(
                f"chunks {c}: compute {row['t_compute_ms']:.2f} ms, comm {row['t_comm_ms']:.2f} ms, "
                f"overlapped {row['t_overlapped_ms']:.2f} ms, sequential {row['t_sequential_ms']:.2f} ms, "
                f"efficiency {row['efficiency']:.2f}",
                flush=True,
            )
    ranks.finish(meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
