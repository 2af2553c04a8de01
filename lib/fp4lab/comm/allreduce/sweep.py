"""The driver side of an allreduce sweep: one backend under torchrun, and where one backend
stops being faster than another.

``sweep`` validates everything before launching, runs ``python -m fp4lab.comm.allreduce``
under torchrun as a child with a timeout (``fp4lab.comm.torchrun.run_ranks``) and returns
the rows written together with how the run ended.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from fp4lab.comm import torchrun
from fp4lab.comm.allreduce.params import parse_modes, unavailable, validate
from fp4lab.comm.allreduce.sizes import format_size, parse_sizes
from fp4lab.core import params, paths


@dataclass
class Sweep:
    """The rows a sweep wrote (every finished size) and how its torchrun run ended."""

    backend: str
    rows: list[dict]
    run: torchrun.Run


def cli_args(
    backend: str, sizes: str, iters: int, warmup: int, dtype: str, modes: str, out: Path
) -> list[str]:
    """The rank module's command-line arguments for one sweep."""
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
    python: str = sys.executable,
) -> Sweep:
    """Validate, then run one backend's sweep under torchrun, its ranks in interpreter ``python``
    (for ``mscclpp``, one with SGLang installed); returns the rows finished even when it failed."""
    params.positive("nproc", nproc)
    params.positive("nnodes", nnodes)
    world_size = nproc * nnodes
    validate(
        backend, parse_sizes(sizes), world_size, iters, warmup, dtype, parse_modes(modes, backend)
    )
    torchrun.refuse_backend(
        backend, unavailable(backend, world_size, per_node=nproc, sglang_python=lambda: python)
    )
    torchrun.require_new_out(out)
    # another interpreter (SGLang's own environment) finds fp4lab through PYTHONPATH
    env = None if python == sys.executable else {"PYTHONPATH": str(paths.REPO_ROOT / "lib")}
    run = torchrun.run_ranks(
        ["-m", "fp4lab.comm.allreduce"],
        cli_args(backend, sizes, iters, warmup, dtype, modes, out),
        nproc,
        timeout_s,
        log_path,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        env=env,
        python=python,
    )
    return Sweep(backend, torchrun.read_rows(out), run)


def crossover(candidate: list[dict], baseline: list[dict], mode: str) -> dict:
    """Where ``candidate`` stops being faster than ``baseline`` (same mode, sizes both measured)."""

    def medians(rows: list[dict]) -> dict[int, float]:
        return {
            r["bytes"]: r["median_us"] for r in rows if r["mode"] == mode and r["status"] == "ok"
        }

    ours, theirs = medians(candidate), medians(baseline)
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
