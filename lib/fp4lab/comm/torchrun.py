"""The driver side of a benchmark under torchrun: run it as a child, and say which rank failed.

``run_ranks`` starts ``python -m torch.distributed.run`` in its own process group with a
timeout; on a timeout or a failure it names the rank that stopped progressing (from the
progress files ``fp4lab.comm.ranks.progress`` writes) and the rank torchrun saw fail first.
Rank 0's rows are read back with ``read_rows``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fp4lab.comm.ranks import DONE, PROGRESS_ENV
from fp4lab.core import process


def read_rows(out: Path) -> list[dict]:
    """The rows a run appended ([] when it wrote none)."""
    out = Path(out)
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def refuse_backend(backend: str, reason: str | None, allowed_here: str = "") -> None:
    """Raise ValueError naming ``backend`` when ``reason`` says why it cannot run here."""
    if reason:
        allowed = f"; allowed values here: {allowed_here}" if allowed_here else ""
        raise ValueError(f"backend={backend!r} cannot run here: {reason}{allowed}")


def require_new_out(out: Path) -> None:
    """Refuse an ``out`` file that already holds rows: a run appends, so old rows would mix in."""
    if Path(out).exists() and Path(out).stat().st_size:
        raise ValueError(f"out={str(out)!r} already holds results; choose a new file")


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


def run_ranks(
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
    python: str = sys.executable,
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
        python=python,
    )
    finished = process.run(cmd, log_path, timeout_s, env=child_env)
    ranks = rank_progress(
        folder, range(node_rank * nproc_per_node, (node_rank + 1) * nproc_per_node)
    )
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return Run(finished, ranks, blame(finished, ranks, log_text))
