"""Benchmarks across ranks under torchrun: the rank side and a driver that runs torchrun as a child.

Rank side: a benchmark module reads its rank and the world size from torchrun's
environment (``RankEnv.from_environ``), never spawning ranks itself, so the same
command runs on one machine or several nodes. It reports each step with ``progress``
(one line per step in ``$FP4LAB_PROGRESS_DIR/rank<N>.log`` when the driver set it), and
rank 0 appends one JSON line per finished measurement with ``append_row``, so results
of finished steps survive a later failure.

Driver side: ``run`` starts ``python -m torch.distributed.run`` in its own process
group with a timeout; on a timeout or a failure it names the rank that stopped
progressing (from the progress files) and the rank torchrun saw fail first.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from fp4lab.core import process

PROGRESS_ENV = "FP4LAB_PROGRESS_DIR"
DONE = "done"
_TORCHRUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits among the ranks, as torchrun told it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @classmethod
    def from_environ(cls) -> RankEnv:
        missing = [v for v in _TORCHRUN_VARIABLES if v not in os.environ]
        if missing:
            raise RuntimeError(
                f"not started by torchrun ({', '.join(missing)} unset): run it as "
                "`python -m torch.distributed.run --nproc-per-node N -m <module> ...`"
            )
        get = lambda name: int(os.environ[name])  # noqa: E731
        return cls(get("RANK"), get("WORLD_SIZE"), get("LOCAL_RANK"), get("LOCAL_WORLD_SIZE"))


def init(backend: str, timeout_s: float = 600.0) -> tuple[RankEnv, torch.device]:
    """Join the process group torchrun describes; NCCL ranks get the GPU of their local rank."""
    env = RankEnv.from_environ()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=dt.timedelta(seconds=timeout_s))
    progress("initialized")
    return env, device


def progress(step: str) -> None:
    """Record that this rank reached ``step`` (no-op unless the driver asked for progress files)."""
    folder = os.environ.get(PROGRESS_ENV)
    if not folder:
        return
    rank = os.environ.get("RANK", "?")
    line = json.dumps({"time": time.time(), "pid": os.getpid(), "step": step}) + "\n"
    with open(Path(folder) / f"rank{rank}.log", "a") as f:
        f.write(line)
        f.flush()


def finish(group: dist.ProcessGroup) -> None:
    """Mark this rank done, wait for every rank, and leave the process group."""
    progress(DONE)
    dist.barrier(group=group)
    dist.destroy_process_group()


def iteration_max(samples: list[float], group: dist.ProcessGroup | None = None) -> list[float]:
    """Per iteration, the slowest rank's time: a collective is done when its last rank is."""
    gathered: list[list[float] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, samples, group=group)
    return [max(column) for column in zip(*gathered)]


def append_row(out: Path, row: dict) -> None:
    """Append one result as a JSON line and push it to disk before the next step starts."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(out: Path) -> list[dict]:
    """The rows a run appended ([] when it wrote none)."""
    out = Path(out)
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- driver side


@dataclass(frozen=True)
class RankProgress:
    rank: int
    pid: int | None
    steps: int
    last_step: str | None
    last_time: float | None

    @property
    def finished(self) -> bool:
        return self.last_step == DONE


@dataclass
class Run:
    """How a torchrun run ended, and in words which rank is to blame when it did not succeed."""

    finished: process.Finished
    ranks: list[RankProgress] = field(default_factory=list)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.finished.ok


def torchrun_command(
    target: Sequence[str],
    args: Sequence[str],
    nproc_per_node: int,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """``python -m torch.distributed.run ...`` for ``target`` (``["-m", "pkg.mod"]`` or ``["script.py"]``)."""
    cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ValueError(
                f"rdzv_endpoint is required when nnodes={nnodes}; allowed values: host:port of node 0"
            )
        cmd += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
        ]
    target = list(target)
    if target[:1] == ["-m"]:
        cmd += ["--module", *target[1:]]
    else:
        cmd += target
    return cmd + [str(a) for a in args]


def rank_progress(folder: Path, ranks: Sequence[int]) -> list[RankProgress]:
    """What each of ``ranks`` (the global ranks of this node) last reported."""
    found = []
    for rank in ranks:
        path = Path(folder) / f"rank{rank}.log"
        lines = (
            [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if path.exists()
            else []
        )
        last = lines[-1] if lines else {}
        found.append(
            RankProgress(rank, last.get("pid"), len(lines), last.get("step"), last.get("time"))
        )
    return found


_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\s*\n\s*\[\d+\]:(?P<block>(?:\n.*){1,8})"
)
_RANK_LINE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT_LINE = re.compile(r"exitcode\s*:\s*(-?\d+)")


def first_failure(log_text: str) -> tuple[int, int | None] | None:
    """The rank torchrun reports as the first observed failure, with its exit code."""
    match = _ROOT_CAUSE.search(log_text)
    if not match:
        return None
    rank = _RANK_LINE.search(match.group("block"))
    code = _EXIT_LINE.search(match.group("block"))
    return (int(rank.group(1)), int(code.group(1)) if code else None) if rank else None


def blame(finished: process.Finished, ranks: list[RankProgress], log_text: str) -> str:
    """One paragraph naming the rank(s) that hung or failed, from progress files and torchrun's report."""
    if finished.ok:
        return ""
    parts = []
    unfinished = [r for r in ranks if not r.finished]
    if unfinished:
        least = min(r.steps for r in unfinished)
        laggards = [r for r in unfinished if r.steps == least]
        ahead = [r for r in unfinished if r.steps > least]
        names = ", ".join(f"rank {r.rank}" + (f" (pid {r.pid})" if r.pid else "") for r in laggards)
        where = laggards[0].last_step or "before reporting any progress"
        verb = "hung" if finished.timed_out else "stopped"
        if len(laggards) > 1 and not ahead:
            parts.append(
                f"{names} all {verb} at the same step '{where}' (waiting on each other, or on a rank of another node)"
            )
        else:
            parts.append(f"{names} {verb} at '{where}'")
        parts += [f"rank {r.rank} had reached '{r.last_step}'" for r in ahead]
    failure = first_failure(log_text)
    if failure:
        parts.append(f"torchrun saw rank {failure[0]} fail first (exit code {failure[1]})")
    head = (
        "killed after the timeout"
        if finished.timed_out
        else f"failed with exit code {finished.returncode}"
    )
    return (
        f"torchrun {head}: "
        + ("; ".join(parts) if parts else "no rank reported progress")
        + f". Log: {finished.log_path}"
    )


def run(
    target: Sequence[str],
    args: Sequence[str],
    nproc_per_node: int,
    timeout_s: float,
    log_path: Path,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run ``target`` under torchrun as a child process group; never raises for a rank's failure or hang."""
    log_path = Path(log_path)
    folder = log_path.with_suffix(".progress")
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("rank*.log"):
        stale.unlink()
    child_env = {**os.environ, **(env or {}), PROGRESS_ENV: str(folder), "PYTHONUNBUFFERED": "1"}
    cmd = torchrun_command(
        target,
        args,
        nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
    )
    finished = process.run(cmd, log_path, timeout_s, env=child_env)
    ranks = rank_progress(
        folder, range(node_rank * nproc_per_node, (node_rank + 1) * nproc_per_node)
    )
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return Run(finished, ranks, blame(finished, ranks, log_text))
