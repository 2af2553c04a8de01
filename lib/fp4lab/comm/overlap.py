"""Overlap within one batch: a MoE down-projection in chunks, each chunk's combine in flight while the next computes.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m fp4lab.comm.overlap \\
        --scale 16 --tokens 256 --chunks 1,2,4,8 --out overlap.jsonl

This is the shape of SGLang's Single Batch Overlap (``--enable-single-batch-overlap``):
within one micro-batch, the down-projection GEMM of the routed experts overlaps with
the combine that sends its results back. Each rank holds ``experts / world`` experts of
GLM-5's MoE (widths divided by ``scale``) and receives ``tokens * topk`` routed rows.
Four timings per chunk count, each the slowest rank's per iteration, as a median:

- compute: the chunked GEMMs alone;
- comm: the chunked combines alone, each waited for before the next;
- overlapped: chunk k's combine issued with ``async_op=True`` (on a GPU NCCL runs it on
  its own stream) while chunk k+1's GEMM runs, all waited for at the end;
- sequential: the whole GEMM, then one combine: the baseline without SBO.

Overlap efficiency = (compute + comm - overlapped) / min(compute, comm): 1 when the
shorter of the two is hidden completely, 0 when nothing overlaps, negative when the
chunked pipeline costs more than running the two back to back. The overlapped results
are compared with the blocking, chunk-by-chunk ones. ``run`` is the driver a notebook calls.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from fp4lab.comm import torchrun
from fp4lab.compile import segment
from fp4lab.core import params, probe, timing

GLM5_MOE_FFN, GLM5_TOPK, GLM5_EXPERTS = 2048, 8, 256
"""GLM-5's routed-expert FFN width, experts per token and routed experts (hidden: segment.GLM5_HIDDEN)."""

BACKENDS = ("gloo", "nccl")
COLLECTIVES = ("all_to_all", "all_reduce")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class MoeShape:
    hidden: int
    moe_ffn: int
    topk: int
    experts: int

    @classmethod
    def glm5(cls, scale: int) -> MoeShape:
        """GLM-5's routed-expert widths divided by ``scale`` (one of segment.SCALES); top-k and experts kept."""
        if scale not in segment.SCALES:
            raise ValueError(
                f"scale={scale!r} is not allowed; allowed values: {', '.join(map(str, segment.SCALES))}"
            )
        return cls(segment.GLM5_HIDDEN // scale, GLM5_MOE_FFN // scale, GLM5_TOPK, GLM5_EXPERTS)


def validate(
    shape: MoeShape,
    tokens: int,
    chunks: list[int],
    world_size: int,
    backend: str,
    collective: str,
    iters: int,
    warmup: int,
) -> None:
    """Raise ValueError, naming the parameter and what is allowed, before anything starts."""
    params.choice("backend", backend, BACKENDS)
    params.choice("collective", collective, COLLECTIVES)
    params.positive("tokens", tokens)
    params.positive("iters", iters)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(
            f"world size {world_size!r} is too small; a combine needs at least 2 ranks (nproc >= 2)"
        )
    if shape.experts % world_size:
        raise ValueError(f"world size {world_size} must divide the {shape.experts} experts")
    if not chunks:
        raise ValueError("chunks is empty; allowed values: positive integers, e.g. 1,2,4,8")
    local_experts = shape.experts // world_size
    rows = tokens * shape.topk
    if rows % local_experts:
        raise ValueError(
            f"tokens={tokens}: tokens x top-{shape.topk} = {rows} rows must split evenly over {local_experts} local experts"
        )
    per_expert = rows // local_experts
    for c in chunks:
        params.positive("chunks", c)
        if local_experts % c or (local_experts // c * per_expert * shape.hidden) % world_size:
            raise ValueError(
                f"chunks contains {c}, which does not divide the {local_experts} local experts into blocks the combine can split; allowed values: divisors of {local_experts}"
            )


def backend_for(machine: probe.Machine, world_size: int) -> str:
    """nccl where there are enough GPUs for one per rank, gloo otherwise."""
    return (
        "nccl"
        if machine.cuda_available
        and machine.gpu_count >= max(2, world_size)
        and dist.is_nccl_available()
        else "gloo"
    )


def unavailable(backend: str, world_size: int, machine: probe.Machine | None = None) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks here, or None."""
    machine = machine or probe.machine()
    if backend == "nccl" and backend_for(machine, world_size) != "nccl":
        return (
            f"nccl needs a CUDA GPU per rank ({world_size}); this machine has {machine.gpu_count}"
        )
    return None


# ----------------------------------------------------------------------------- the rank side


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
        make = lambda *size: (
            (torch.randn(*size, generator=generator) / size[-2] ** 0.5).to(dtype).to(device)
        )
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
    call: Callable[[], object],
    iters: int,
    warmup: int,
    device: torch.device,
    meta: dist.ProcessGroup,
) -> float:
    """Median over iterations of the slowest rank's milliseconds for ``call``."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        call()
    sync()
    dist.barrier(group=meta)
    samples = []
    for _ in range(iters):
        dist.barrier(group=meta)  # every rank starts the iteration together; the wait is not timed
        started = time.perf_counter()
        call()
        sync()
        samples.append((time.perf_counter() - started) * 1e3)
    return timing.summarize(torchrun.iteration_max(samples, meta))["median_ms"]


def measure(
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
    timings = {}
    for name, call in (
        ("compute", lambda: pipeline.compute(chunks)),
        ("comm", lambda: pipeline.blocking(outputs)),
        ("overlapped", lambda: pipeline.overlapped(chunks)),
        ("sequential", pipeline.sequential),
    ):
        torchrun.progress(f"chunks {chunks}: {name}")
        timings[name] = _timed(call, iters, warmup, device, meta)
    t_compute, t_comm, t_overlapped, t_sequential = timings.values()
    torchrun.progress(f"chunks {chunks}: checking")
    reference = torch.cat(pipeline.blocking(pipeline.compute(chunks))).float()
    local_diff = float((torch.cat(pipeline.overlapped(chunks)).float() - reference).abs().max())
    diffs: list[float | None] = [None] * world_size
    dist.all_gather_object(diffs, local_diff, group=meta)
    hidden = t_compute + t_comm - t_overlapped
    return {
        "chunks": chunks,
        "t_compute_ms": t_compute,
        "t_comm_ms": t_comm,
        "t_overlapped_ms": t_overlapped,
        "t_sequential_ms": t_sequential,
        "efficiency": hidden / min(t_compute, t_comm),
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
        help=f"divide GLM-5's widths by this: {', '.join(map(str, segment.SCALES))}",
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


def parse_chunks(spec: str) -> list[int]:
    try:
        return [int(c) for c in str(spec).split(",") if c.strip()]
    except ValueError:
        raise ValueError(
            f"chunks={spec!r} is not a comma list of integers; allowed values: positive integers, e.g. 1,2,4,8"
        ) from None


def _dtype(spec: str, backend: str) -> str:
    if spec == "auto":
        return "bfloat16" if backend == "nccl" else "float32"
    params.choice("dtype", spec, (*DTYPES, "auto"))
    return spec


def main(argv: list[str] | None = None) -> int:
    """One rank of the microbenchmark; torchrun starts one per process."""
    args = _parser().parse_args(argv)
    env = torchrun.RankEnv.from_environ()
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
        reason = unavailable(args.backend, env.local_world_size)
        if reason:
            raise ValueError(f"backend={args.backend!r} cannot run here: {reason}")
        dtype_name = _dtype(args.dtype, args.backend)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env, device = torchrun.init(args.backend)
    meta = dist.group.WORLD if args.backend == "gloo" else dist.new_group(backend="gloo")
    pipeline = Pipeline(
        shape, args.tokens, args.collective, env.world_size, env.rank, DTYPES[dtype_name], device
    )
    for c in chunks:
        torchrun.progress(f"chunks {c}")
        row = measure(pipeline, c, env.world_size, args.iters, args.warmup, device, meta)
        row.update(asdict(shape), scale=args.scale, tokens=args.tokens, collective=args.collective, backend=args.backend,
                   dtype=dtype_name, world_size=env.world_size, iters=args.iters, warmup=args.warmup)  # fmt: skip
        if env.rank == 0:
            torchrun.append_row(args.out, row)
            print(f"chunks {c}: compute {row['t_compute_ms']:.2f} ms, comm {row['t_comm_ms']:.2f} ms, overlapped "
                  f"{row['t_overlapped_ms']:.2f} ms, sequential {row['t_sequential_ms']:.2f} ms, efficiency {row['efficiency']:.2f}", flush=True)  # fmt: skip
    torchrun.finish(meta)
    return 0


# ----------------------------------------------------------------------------- the driver side


@dataclass
class Result:
    rows: list[dict]
    run: torchrun.Run


def run(
    *,
    out: Path,
    log_path: Path,
    scale: int = 16,
    tokens: int = 256,
    chunks: tuple[int, ...] = (1, 2, 4, 8),
    nproc: int = 2,
    backend: str = "gloo",
    collective: str = "all_to_all",
    dtype: str = "auto",
    iters: int = 10,
    warmup: int = 2,
    timeout_s: float = 600.0,
) -> Result:
    """Validate, then run the microbenchmark under torchrun; returns the rows finished even when it failed."""
    params.positive("nproc", nproc)
    validate(MoeShape.glm5(scale), tokens, list(chunks), nproc, backend, collective, iters, warmup)
    _dtype(dtype, backend)
    reason = unavailable(backend, nproc)
    if reason:
        raise ValueError(f"backend={backend!r} cannot run here: {reason}")
    if Path(out).exists() and Path(out).stat().st_size:
        raise ValueError(f"out={str(out)!r} already holds results; choose a new file")
    args = ["--backend", backend, "--scale", scale, "--tokens", tokens, "--chunks", ",".join(map(str, chunks)),
            "--collective", collective, "--dtype", dtype, "--iters", iters, "--warmup", warmup, "--out", out]  # fmt: skip
    finished = torchrun.run(["-m", "fp4lab.comm.overlap"], args, nproc, timeout_s, log_path)
    return Result(torchrun.read_rows(out), finished)


def summarize(rows: list[dict], server_rows: list[dict], server_skip: str | None) -> dict:
    """The notebook's one-line verdict for the decision report: status, headline, what it needs."""
    needs = "cpu for the microbenchmark; SGLang on a multi-GPU Blackwell node (with expert parallelism) for serving numbers"
    parts = []
    if rows:
        chunked = [r for r in rows if r["chunks"] > 1] or rows
        best = max(chunked, key=lambda r: r["efficiency"])
        parts.append(f"microbenchmark ({best['backend']}, {best['world_size']} ranks): best overlap efficiency {best['efficiency']:.2f} "
                     f"at {best['chunks']} chunks, {best['speedup_vs_sequential']:.2f}x the unchunked sequential speed")  # fmt: skip
        control = next((r for r in rows if r["chunks"] == 1), None)
        if (
            control
        ):  # one chunk cannot overlap anything: its efficiency is the measurement's own noise
            parts.append(
                f"the 1-chunk control, which cannot overlap, reads {control['efficiency']:.2f}"
            )
    ran = [r for r in server_rows if r.get("status") == "ran"]
    if ran:
        parts.append(
            "serving: " + ", ".join(f"{r['label']} {r['output_throughput']:.0f} tok/s" for r in ran)
        )
        status = "measured"
    else:
        status = f"microbenchmark only; serving comparison not run: {server_skip or 'every configuration failed (see the server records)'}"
    return {"status": status, "headline": "; ".join(parts) or "nothing finished", "needs": needs}


if __name__ == "__main__":
    sys.exit(main())
