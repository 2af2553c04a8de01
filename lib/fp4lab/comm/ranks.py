"""The rank side of a benchmark under torchrun: where this process sits, its progress, its rows.

A benchmark module reads its rank and the world size from torchrun's environment
(``RankEnv.from_environ``), never spawning ranks itself, so the same command runs on one
machine or several nodes. It reports each step with ``progress`` (one line per step in
``$FP4LAB_PROGRESS_DIR/rank<N>.log`` when the driver set it), and rank 0 appends one JSON
line per finished measurement with ``append_row``, so results of finished steps survive a
later failure. ``fp4lab.comm.torchrun`` is the driver side.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass
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
    """Join the process group torchrun describes; NCCL ranks get the GPU of their local rank.
    A rank dies with its torchrun (which puts it in a session of its own)."""
    env = RankEnv.from_environ()
    process.exit_with_parent()
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
    return [max(column) for column in zip(*gathered, strict=True)]


def append_row(out: Path, row: dict) -> None:
    """Append one result as a JSON line and push it to disk before the next step starts."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
