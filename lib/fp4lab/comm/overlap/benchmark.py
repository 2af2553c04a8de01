"""The driver side of the overlap microbenchmark: validate, then run
``python -m fp4lab.comm.overlap`` under torchrun as a child with a timeout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp4lab.comm import torchrun
from fp4lab.comm.overlap.params import MoeShape, resolve_dtype, unavailable, validate
from fp4lab.core import params


@dataclass
class Benchmark:
    """The rows the microbenchmark wrote (every finished chunk count) and how its torchrun run ended."""

    rows: list[dict]
    run: torchrun.Run

    def table(self) -> pd.DataFrame:
        """Per chunk count: the four timings, the efficiency, the speedup and the check."""
        table = pd.DataFrame(self.rows)
        if table.empty:
            return table
        columns = [
            "t_compute_ms",
            "t_comm_ms",
            "t_overlapped_ms",
            "t_sequential_ms",
            "efficiency",
            "speedup_vs_sequential",
            "max_abs_diff_vs_blocking",
        ]
        return table.set_index("chunks")[columns].round(3)


def benchmark(
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
) -> Benchmark:
    """Validate, then run the microbenchmark under torchrun; returns the rows finished even when it failed."""
    params.positive("nproc", nproc)
    validate(MoeShape.glm5(scale), tokens, list(chunks), nproc, backend, collective, iters, warmup)
    resolve_dtype(dtype, backend)
    torchrun.refuse_backend(backend, unavailable(backend, nproc))
    torchrun.require_new_out(out)
    args = [
        "--backend",
        backend,
        "--scale",
        scale,
        "--tokens",
        tokens,
        "--chunks",
        ",".join(map(str, chunks)),
        "--collective",
        collective,
        "--dtype",
        dtype,
        "--iters",
        iters,
        "--warmup",
        warmup,
        "--out",
        out,
    ]
    run = torchrun.run_ranks(["-m", "fp4lab.comm.overlap"], args, nproc, timeout_s, log_path)
    return Benchmark(torchrun.read_rows(out), run)
