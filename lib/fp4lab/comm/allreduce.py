"""Allreduce latency and bandwidth over message sizes, one backend per run, under torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m fp4lab.comm.allreduce \\
        --backend gloo --sizes 1KiB:64MiB --iters 20 --warmup 5 --out allreduce.jsonl

Backends: ``gloo`` (CPU), ``nccl`` (eager, and replayed from a CUDA graph), ``mscclpp``
(SGLang's ``PyMscclppCommunicator`` through its own parallel-state setup, eager and in
a graph; only where sglang, mscclpp and several GPUs exist). Sizes are powers of two.
Every rank fills its buffer with ``(rank + 1) * (1 + i % 3)`` so each size is checked
for the exact sum (16-bit dtypes only for world sizes whose partial sums they hold exactly). Times are per iteration, the slowest rank's, as median and
10th/90th percentiles; bandwidths follow nccl-tests: ``algbw = bytes / time`` and
``busbw = algbw * 2 (n - 1) / n`` for n ranks. Rank 0 appends one JSON line per size
and mode as soon as it is measured, so a later failure keeps what was finished.

``sweep`` is the driver a notebook calls: it validates everything before launching,
runs torchrun as a child with a timeout (``fp4lab.comm.torchrun.run``) and returns the
rows written together with how the run ended.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from fp4lab.comm import torchrun
from fp4lab.core import params, probe, timing

BACKENDS = ("gloo", "nccl", "mscclpp")
MODES = ("eager", "graph")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EXACT_INTEGERS = {"float32": 1 << 24, "bfloat16": 1 << 8, "float16": 1 << 11}
"""Up to these, every integer is representable: the exact-sum check's partial sums must stay below."""
GRAPH_OPS = 10
"""Allreduces captured back to back in one CUDA graph; a replay's time is divided by this."""

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_SIZE = re.compile(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*")
_SIZE_HELP = (
    "powers of two such as 1KiB or 64MiB (units B, KiB, MiB, GiB), as a range LO:HI or a comma list"
)


# ----------------------------------------------------------------------------- sizes and checks


def parse_size(text: str) -> int:
    """``"64MiB"`` -> 67108864; the size must be a power of two."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"sizes contains {text!r}; allowed values: {_SIZE_HELP}")
    value = int(match.group(1)) * _UNITS[match.group(2) or "B"]
    if value <= 0 or value & (value - 1):
        raise ValueError(
            f"sizes contains {text!r} = {value} bytes, not a power of two; allowed values: {_SIZE_HELP}"
        )
    return value


def parse_sizes(spec: str) -> list[int]:
    """``"1KiB:64MiB"`` -> every power of two from 1 KiB to 64 MiB; ``"4KiB,1MiB"`` -> those two."""
    spec = str(spec)
    if ":" in spec:
        low_text, _, high_text = spec.partition(":")
        low, high = parse_size(low_text), parse_size(high_text)
        if low > high:
            raise ValueError(
                f"sizes={spec!r} runs from {low} down to {high} bytes; allowed values: {_SIZE_HELP}, LO <= HI"
            )
        return [1 << k for k in range(low.bit_length() - 1, high.bit_length())]
    sizes = [parse_size(part) for part in spec.split(",") if part.strip()]
    if not sizes:
        raise ValueError(f"sizes={spec!r} is empty; allowed values: {_SIZE_HELP}")
    return sorted(set(sizes))


def format_size(nbytes: int) -> str:
    """1048576 -> '1MiB'."""
    for unit in ("GiB", "MiB", "KiB"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes}B"


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce: ``algbw * 2 (n - 1) / n``."""
    return algbw * 2 * (world_size - 1) / world_size


def modes_for(backend: str) -> tuple[str, ...]:
    """The timing modes a backend supports (CUDA graphs need a GPU backend)."""
    return ("eager",) if backend == "gloo" else MODES


def validate(
    backend: str,
    sizes: list[int],
    world_size: int,
    iters: int,
    warmup: int,
    dtype: str,
    modes: tuple[str, ...],
) -> None:
    """Raise ValueError, naming the parameter and what is allowed, for any bad input."""
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} is not allowed; allowed values: {', '.join(BACKENDS)}"
        )
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; allowed values: {', '.join(DTYPES)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(
            f"world size {world_size!r} is too small; an allreduce needs at least 2 ranks (nproc x nnodes >= 2)"
        )
    for name, value, least in (("iters", iters, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r} must be an integer >= {least}")
    if 3 * world_size * (world_size + 1) // 2 > _EXACT_INTEGERS[dtype]:
        raise ValueError(
            f"dtype={dtype!r} cannot hold the exact sums of {world_size} ranks' check pattern; allowed values: float32"
        )
    itemsize = DTYPES[dtype].itemsize
    too_small = [s for s in sizes if s < itemsize]
    if too_small:
        raise ValueError(
            f"sizes contains {too_small[0]} bytes, less than one {dtype} element ({itemsize} bytes)"
        )
    unsupported = [m for m in modes if m not in modes_for(backend)]
    if not modes or unsupported:
        raise ValueError(
            f"modes={','.join(modes)!r} is not allowed for backend {backend!r}; allowed values: {', '.join(modes_for(backend))}"
        )


def _sglang_mscclpp_world_sizes() -> tuple[int, ...] | None:
    """The world sizes the installed SGLang's MSCCLPP communicator accepts, or None when it cannot be imported."""
    try:
        from sglang.srt.distributed.device_communicators.pymscclpp import PyMscclppCommunicator
    except Exception:  # absent, or broken on this machine: either way not usable
        return None
    return tuple(PyMscclppCommunicator._SUPPORTED_WORLD_SIZES)


def unavailable(
    backend: str,
    world_size: int,
    machine: probe.Machine | None = None,
    *,
    per_node: int | None = None,
) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks (``per_node`` of them on this node), or None when it can."""
    machine = machine or probe.machine()
    per_node = world_size if per_node is None else per_node
    if backend == "gloo":
        return None if dist.is_gloo_available() else "this torch build has no gloo backend"
    if not machine.cuda_available:
        return "no CUDA GPU visible to torch" + (
            "" if machine.torch_cuda else " (torch is a CPU build)"
        )
    if not dist.is_nccl_available():
        return "this torch build has no NCCL backend"
    if machine.gpu_count < 2:
        return f"needs 2 or more GPUs; this machine has {machine.gpu_count}"
    if per_node > machine.gpu_count:
        return f"{per_node} ranks need {per_node} GPUs on this node; it has {machine.gpu_count}"
    if backend == "mscclpp":
        if not machine.packages.get("sglang"):
            return "sglang is not installed (MSCCLPP is measured through SGLang's communicator)"
        if importlib.util.find_spec("mscclpp") is None:
            return "the mscclpp Python package is not importable"
        supported = _sglang_mscclpp_world_sizes()
        if supported is None:
            return "sglang's PyMscclppCommunicator cannot be imported here"
        if world_size not in supported:
            return f"SGLang's MSCCLPP communicator supports world sizes {', '.join(map(str, supported))}, not {world_size}"
    return None


# ----------------------------------------------------------------------------- the rank side


class TorchAllreduce:
    """``torch.distributed.all_reduce`` on the default group (gloo or NCCL)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def __call__(self, x: torch.Tensor) -> None:
        dist.all_reduce(x)

    def not_routed(self, x: torch.Tensor) -> str | None:
        return None

    @contextlib.contextmanager
    def capturing(self) -> Iterator[torch.cuda.Stream | None]:
        yield None


class SGLangMscclpp:
    """SGLang's MSCCLPP communicator, set up the way SGLang's own benchmark sets it up."""

    backend = "mscclpp"

    def __init__(self, env: torchrun.RankEnv) -> None:
        from sglang.srt.distributed import parallel_state

        parallel_state.set_mscclpp_all_reduce(True)
        parallel_state.init_distributed_environment(
            world_size=env.world_size,
            rank=env.rank,
            local_rank=env.local_rank,
            distributed_init_method="env://",
            backend="nccl",
        )
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=env.world_size)
        self._state = parallel_state
        self.comm = parallel_state.get_tensor_model_parallel_group().pymscclpp_comm
        if self.comm is None or not getattr(self.comm, "available", False):
            raise RuntimeError(
                "SGLang created no usable MSCCLPP communicator (is the mscclpp package importable?)"
            )
        if not getattr(self.comm, "best_configs", None):
            raise RuntimeError(
                f"SGLang's MSCCLPP communicator tuned no algorithm for world size {env.world_size}"
            )

    def __call__(self, x: torch.Tensor) -> None:
        self.comm.all_reduce(x)

    def not_routed(self, x: torch.Tensor) -> str | None:
        with self.comm.change_state(enable=True):
            routed = self.comm.should_mscclpp_allreduce(x)
        return (
            None
            if routed
            else "SGLang would not route this size to MSCCLPP (it falls back to NCCL)"
        )

    @contextlib.contextmanager
    def capturing(self) -> Iterator[torch.cuda.Stream | None]:
        with self._state.graph_capture() as context:
            yield context.stream


Allreduce = TorchAllreduce | SGLangMscclpp


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
        torch.cuda.synchronize(device)
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
    with op.capturing() as stream:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            for _ in range(ops):
                op(x)
    torch.cuda.synchronize()
    return graph


def _check(
    op: Allreduce,
    mode: str,
    n: int,
    env: torchrun.RankEnv,
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
    env: torchrun.RankEnv,
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
    }  # fmt: skip
    label = f"{op.backend} {mode} {format_size(nbytes)}"
    torchrun.progress(f"{label}: routing")
    reason = op.not_routed(torch.empty(n, dtype=dtype, device=device))
    reasons: list[str | None] = [None] * env.world_size
    dist.all_gather_object(reasons, reason, group=meta)
    if any(reasons):
        return {**row, "status": "skipped", "reason": next(r for r in reasons if r)}
    torchrun.progress(f"{label}: checking the sum")
    correct, error = _check(op, mode, n, env, dtype, device)
    verdicts: list[tuple[bool, float] | None] = [None] * env.world_size
    dist.all_gather_object(verdicts, (correct, error), group=meta)
    x = torch.zeros(n, dtype=dtype, device=device)
    torchrun.progress(f"{label}: timing")
    dist.barrier(group=meta)
    if mode == "graph":
        graph = _capture(op, x, GRAPH_OPS)
        samples = _time_calls(graph.replay, iters, warmup, device, per_call_ops=GRAPH_OPS)
    else:
        samples = _time_calls(lambda: op(x), iters, warmup, device)
    summary = timing.summarize(torchrun.iteration_max(samples, meta))
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
    parser.add_argument("--sizes", default="1KiB:64MiB", help=_SIZE_HELP + " (default 1KiB:64MiB)")
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


def _modes(spec: str, backend: str) -> tuple[str, ...]:
    return (
        modes_for(backend)
        if spec == "auto"
        else tuple(m.strip() for m in spec.split(",") if m.strip())
    )


def main(argv: list[str] | None = None) -> int:
    """One rank of a sweep; torchrun starts one per process and tells each who it is."""
    args = _parser().parse_args(argv)
    env = torchrun.RankEnv.from_environ()
    try:
        sizes = parse_sizes(args.sizes)
        modes = _modes(args.modes, args.backend)
        validate(args.backend, sizes, env.world_size, args.iters, args.warmup, args.dtype, modes)
        reason = unavailable(args.backend, env.world_size, per_node=env.local_world_size)
        if reason:
            raise ValueError(f"backend={args.backend!r} cannot run here: {reason}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env, device = torchrun.init("gloo" if args.backend == "gloo" else "nccl")
    meta = dist.group.WORLD if args.backend == "gloo" else dist.new_group(backend="gloo")
    op: Allreduce = (
        SGLangMscclpp(env) if args.backend == "mscclpp" else TorchAllreduce(args.backend)
    )
    for nbytes in sizes:
        for mode in modes:
            torchrun.progress(f"{args.backend} {mode} {format_size(nbytes)}")
            row = measure_size(
                op, mode, nbytes, env, args.dtype, device, args.iters, args.warmup, meta
            )
            if env.rank == 0:
                torchrun.append_row(args.out, row)
                print(f"{row['backend']:7} {mode:5} {row['size']:>6}: " + (
                    f"{row['median_us']:10.1f} us  busbw {row['busbw_GBps']:8.3f} GB/s  correct={row['correct']}" if row["status"] == "ok" else f"skipped: {row['reason']}"
                ), flush=True)  # fmt: skip
    torchrun.finish(meta)
    return 0


# ----------------------------------------------------------------------------- the driver side


@dataclass
class Sweep:
    """The rows a sweep wrote (every finished size) and how its torchrun run ended."""

    backend: str
    rows: list[dict]
    run: torchrun.Run


def cli_args(
    backend: str, sizes: str, iters: int, warmup: int, dtype: str, modes: str, out: Path
) -> list[str]:
    """The module's command-line arguments for one sweep."""
    return [
        "--backend",
        backend,
        "--sizes",
        sizes,
        "--iters",
        iters,
        "--warmup",
        warmup,
        "--dtype",
        dtype,
        "--modes",
        modes,
        "--out",
        out,
    ]


def sweep(
    backend: str,
    sizes: str = "1KiB:64MiB",
    *,
    out: Path,
    log_path: Path,
    nproc: int = 2,
    iters: int = 20,
    warmup: int = 5,
    dtype: str = "float32",
    modes: str = "auto",
    timeout_s: float = 600.0,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
) -> Sweep:
    """Validate, then run one backend's sweep under torchrun; returns the rows finished even when it failed."""
    params.positive("nproc", nproc)
    params.positive("nnodes", nnodes)
    validate(
        backend, parse_sizes(sizes), nproc * nnodes, iters, warmup, dtype, _modes(modes, backend)
    )
    reason = unavailable(backend, nproc * nnodes, per_node=nproc)
    if reason:
        raise ValueError(f"backend={backend!r} cannot run here: {reason}")
    if Path(out).exists() and Path(out).stat().st_size:
        raise ValueError(f"out={str(out)!r} already holds results; choose a new file")
    args = cli_args(backend, sizes, iters, warmup, dtype, modes, out)
    run = torchrun.run(
        ["-m", "fp4lab.comm.allreduce"],
        args,
        nproc,
        timeout_s,
        log_path,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
    )
    return Sweep(backend, torchrun.read_rows(out), run)


def crossover(candidate: list[dict], baseline: list[dict], mode: str) -> dict:
    """Where ``candidate`` stops being faster than ``baseline`` (same mode, sizes both measured)."""
    ok = lambda rows: {
        r["bytes"]: r["median_us"] for r in rows if r["mode"] == mode and r["status"] == "ok"
    }
    ours, theirs = ok(candidate), ok(baseline)
    sizes = sorted(set(ours) & set(theirs))
    wins = [ours[s] < theirs[s] for s in sizes]
    result = {
        "mode": mode,
        "sizes_compared": len(sizes),
        "sizes_won": sum(wins),
        "last_win_bytes": None,
        "crossover_bytes": None,
    }
    if not sizes:
        return {**result, "summary": "no size was measured by both"}
    if all(wins):
        return {
            **result,
            "last_win_bytes": sizes[-1],
            "summary": f"faster at every size measured, up to {format_size(sizes[-1])}",
        }
    if not wins[0]:
        return {**result, "summary": f"not faster at the smallest size ({format_size(sizes[0])})"}
    stop = wins.index(False)
    result.update(last_win_bytes=sizes[stop - 1], crossover_bytes=sizes[stop])
    return {
        **result,
        "summary": f"faster up to {format_size(sizes[stop - 1])}, not from {format_size(sizes[stop])} on",
    }


@dataclass(frozen=True)
class Planned:
    """One backend of a notebook's plan: how many ranks, and why it cannot run here (None when it can)."""

    backend: str
    ranks: int
    skip: str | None


def plan(
    backends: list[str],
    sizes: str,
    cpu_ranks: int,
    gpu_ranks: int,
    iters: int,
    warmup: int,
    dtype: str,
    machine: probe.Machine | None = None,
) -> list[Planned]:
    """Validate a notebook's parameters and decide, per backend, its rank count or why it is skipped here."""
    machine = machine or probe.machine()
    params.choices("backends", backends, BACKENDS)
    params.positive("cpu_ranks", cpu_ranks)
    if (
        isinstance(gpu_ranks, bool)
        or not isinstance(gpu_ranks, int)
        or gpu_ranks < 0
        or gpu_ranks == 1
    ):
        raise ValueError(
            f"gpu_ranks={gpu_ranks!r} is not allowed; allowed values: 0 (every visible GPU) or an integer >= 2"
        )
    size_list = parse_sizes(sizes)
    validate("gloo", size_list, cpu_ranks, iters, warmup, dtype, ("eager",))
    planned = []
    for backend in dict.fromkeys(backends):
        ranks = cpu_ranks if backend == "gloo" else (gpu_ranks or machine.gpu_count)
        planned.append(Planned(backend, ranks, unavailable(backend, ranks, machine)))
    return planned


def summarize(rows: list[dict], planned: list[Planned], crossovers: list[dict]) -> dict:
    """The notebook's one-line verdict for the decision report: status, headline, what it needs."""
    ran = sorted({r["backend"] for r in rows if r["status"] == "ok"})
    skipped = [f"{p.backend} ({p.skip})" for p in planned if p.skip]
    needs = "2+ GPUs for nccl; SGLang with the mscclpp package and a world size its communicator supports for MSCCLPP"
    found = [c for c in crossovers if c.get("sizes_compared")]
    if found:
        c = found[0]
        headline = f"MSCCLPP vs NCCL ({c['mode']}): {c['summary']}"
        status = "measured"
    else:
        measured = [r for r in rows if r["status"] == "ok"]
        if measured:
            small, large = (
                min(measured, key=lambda r: r["bytes"]),
                max(measured, key=lambda r: r["bytes"]),
            )
            headline = (f"{', '.join(ran)} only: {small['median_us']:.0f} µs at {small['size']}, busbw {large['busbw_GBps']:.2f} GB/s at "
                        f"{large['size']}; no MSCCLPP-vs-NCCL numbers on this machine")  # fmt: skip
        else:
            headline = "no size finished on any backend (see the backend records)"
        reasons = dict.fromkeys(
            p.skip for p in planned if p.skip and p.backend in ("nccl", "mscclpp")
        )
        status = "not measured here: " + (
            "; ".join(reasons) if reasons else "the backends did not include both mscclpp and nccl"
        )
    return {
        "status": status,
        "headline": headline,
        "needs": needs,
        "backends_run": ran,
        "backends_skipped": skipped,
    }


if __name__ == "__main__":
    sys.exit(main())
