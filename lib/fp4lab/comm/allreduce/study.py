"""What notebook 07 runs: the plan per backend, one recorded sweep per backend, the MSCCLPP
vs NCCL crossover, the figure, and the verdict for the decision report."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp4lab.comm import torchrun
from fp4lab.comm.allreduce import plots
from fp4lab.comm.allreduce.params import BACKENDS, MODES, modes_for, unavailable, validate
from fp4lab.comm.allreduce.sizes import parse_sizes
from fp4lab.comm.allreduce.sweep import crossover, sweep
from fp4lab.core import figures, params, paths, probe, records

GPU_BACKENDS = ("mscclpp", "nccl")
"""The crossover compares the first with the second."""


@dataclass(frozen=True)
class Planned:
    """One backend of the plan: ranks, why it cannot run here (None if it can), ranks' python."""

    backend: str
    ranks: int
    skip: str | None
    python: str = sys.executable


@dataclass(frozen=True)
class Plan:
    """The notebook's checked parameters: a rank count or a reason to skip per backend."""

    backends: list[Planned]
    sizes: str
    iters: int
    warmup: int
    dtype: str
    timeout_s: int
    params: dict
    run_dir: Path

    def table(self) -> pd.DataFrame:
        """Per backend: its ranks, whether it runs here, and why not."""
        rows = [
            {
                "backend": p.backend,
                "ranks": p.ranks,
                "runs here": p.skip is None,
                "skipped because": p.skip or "",
            }
            for p in self.backends
        ]
        return pd.DataFrame(rows).set_index("backend")


def plan(
    *,
    backends: list[str],
    sizes: str,
    cpu_ranks: int,
    gpu_ranks: int,
    iters: int,
    warmup: int,
    dtype: str,
    timeout_s: int,
    sglang_python: Callable[[], str] | None = None,
    machine: probe.Machine | None = None,
) -> Plan:
    """Check every parameter (ValueError naming it and its allowed values); per backend, its
    rank count or why it is skipped here. ``sglang_python`` gives the interpreter of an SGLang
    installation for ``mscclpp`` (asked only where the GPUs are; default: this interpreter)."""
    machine = machine or probe.machine()
    sglang_python = functools.cache(sglang_python or (lambda: sys.executable))
    params.choices("backends", backends, BACKENDS)
    params.positive("cpu_ranks", cpu_ranks)
    params.positive("timeout_s", timeout_s)
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
        skip = unavailable(backend, ranks, machine, sglang_python=sglang_python)
        python = sys.executable
        if skip is None:
            validate(backend, size_list, ranks, iters, warmup, dtype, modes_for(backend))
            python = sglang_python() if backend == "mscclpp" else python
        planned.append(Planned(backend, ranks, skip, python))
    chosen = dict(
        backends=backends,
        sizes=sizes,
        cpu_ranks=cpu_ranks,
        gpu_ranks=gpu_ranks,
        iters=iters,
        warmup=warmup,
        dtype=dtype,
        timeout_s=timeout_s,
    )
    run_dir = paths.build_dir() / "collectives" / records.RUN_ID
    return Plan(planned, sizes, iters, warmup, dtype, timeout_s, chosen, run_dir)


@dataclass
class Sweeps:
    """Every backend's rows, and how each backend's torchrun run ended."""

    rows: list[dict]
    runs: dict[str, torchrun.Run]

    def table(self) -> pd.DataFrame:
        """Median latency and bus bandwidth per size, one column per backend and mode."""
        table = pd.DataFrame(self.rows)
        if "median_us" not in table:
            return table
        return table.pivot_table(
            index="size",
            columns=["backend", "mode"],
            values=["median_us", "busbw_GBps"],
            sort=False,
        ).round(3)


def sweep_backends(plan: Plan, rec: records.Recorder) -> Sweeps:
    """One torchrun sweep per backend that runs here; records each size and each backend (skipped ones too)."""
    rows, runs = [], {}
    for p in plan.backends:
        if p.skip:
            print(f"{p.backend}: SKIPPED: {p.skip}")
            rec.add(
                "backend",
                {
                    "backend": p.backend,
                    "ranks": p.ranks,
                    "status": "skipped",
                    "reason": p.skip,
                    "sizes_finished": 0,
                },
            )
            continue
        print(f"{p.backend}: {p.ranks} ranks ...", flush=True)
        done = sweep(
            p.backend,
            plan.sizes,
            out=plan.run_dir / f"{p.backend}.jsonl",
            log_path=plan.run_dir / f"{p.backend}.log",
            nproc=p.ranks,
            iters=plan.iters,
            warmup=plan.warmup,
            dtype=plan.dtype,
            timeout_s=plan.timeout_s,
            python=p.python,
        )
        rows += rec.add_all("size", done.rows)
        runs[p.backend] = done.run
        status = "ran" if done.run.ok else "failed"
        seconds = done.run.finished.seconds
        rec.add(
            "backend",
            {
                "backend": p.backend,
                "ranks": p.ranks,
                "status": status,
                "reason": done.run.message,
                "sizes_finished": len(done.rows),
                "seconds": round(seconds, 1),
            },
        )
        failure = "" if done.run.ok else f": {done.run.message}"
        print(f"    {status.upper()} in {seconds:.0f} s, {len(done.rows)} rows{failure}")
    return Sweeps(rows, runs)


def crossovers(plan: Plan, sweeps: Sweeps, rec: records.Recorder) -> list[dict]:
    """Per mode, where MSCCLPP stops beating NCCL (recorded); a skipped record says why when either is missing."""
    mscclpp, nccl = ([r for r in sweeps.rows if r["backend"] == b] for b in GPU_BACKENDS)
    if not (mscclpp and nccl):
        skipped = [
            f"{p.backend}: {p.skip}" for p in plan.backends if p.skip and p.backend in GPU_BACKENDS
        ]
        reason = "; ".join(skipped) or "mscclpp and nccl were not both measured"
        rec.add("crossover", {"status": "skipped", "reason": reason})
        print(f"crossover: SKIPPED: {reason}")
        return []
    found = [crossover(mscclpp, nccl, mode) for mode in MODES]
    for c in found:
        rec.add("crossover", {**c, "status": "measured"})
        print(f"{c['mode']}: {c['summary']}")
    return found


def save_sweep_figure(sweeps: Sweeps, found: list[dict], rec: records.Recorder) -> Path | None:
    """Draw latency and bus bandwidth against size (the first crossover marked) and save it as 07_allreduce_sweep."""
    if not sweeps.rows:
        print("no figure: no backend wrote a row")
        return None
    marked = next((c for c in found if c.get("crossover_bytes")), None)
    fig = plots.plot_allreduce(sweeps.rows, marked)
    source = f"data/{rec.notebook}.jsonl run {records.RUN_ID}"
    return figures.save_figure(
        fig, "07_allreduce_sweep", records.provenance(), source=source, evidence=[]
    )  # collective timings: no FP4 kernel, trace or target involved


def summary_for_report(rows: list[dict], planned: list[Planned], found: list[dict]) -> dict:
    """The notebook's summary for the decision report: status, headline, the decision (verdict,
    number, why), what it needs."""
    ran = sorted({r["backend"] for r in rows if r["status"] == "ok"})
    skipped = [f"{p.backend} ({p.skip})" for p in planned if p.skip]
    needs = "2+ GPUs for nccl; SGLang with the mscclpp package and a world size its communicator supports for MSCCLPP"
    compared = [c for c in found if c.get("sizes_compared")]
    if compared:
        c = compared[0]
        headline = f"MSCCLPP vs NCCL ({c['mode']}): {c['summary']}"
        status, verdict, number = "measured", "MEASURED", headline
        why = "both collectives were timed on the same GPUs, eagerly and replayed from a CUDA graph"
    else:
        measured = [r for r in rows if r["status"] == "ok"]
        number = "no MSCCLPP-vs-NCCL timing"
        if measured:
            small = min(measured, key=lambda r: r["bytes"])
            large = max(measured, key=lambda r: r["bytes"])
            headline = (
                f"{', '.join(ran)} only: {small['median_us']:.0f} µs at {small['size']}, "
                f"busbw {large['busbw_GBps']:.2f} GB/s at {large['size']}; "
                "no MSCCLPP-vs-NCCL numbers on this machine"
            )
            number += f" ({', '.join(ran)} only: {small['median_us']:.0f} µs at {small['size']})"
        else:
            headline = "no size finished on any backend (see the backend records)"
        reasons = dict.fromkeys(p.skip for p in planned if p.skip and p.backend in GPU_BACKENDS)
        why = (
            "; ".join(reasons) if reasons else "the backends did not include both mscclpp and nccl"
        )
        status, verdict = f"not measured here: {why}", "UNMEASURED"
    return {
        "status": status,
        "headline": headline,
        "verdict": verdict,
        "number": number,
        "why": why,
        "needs": needs,
        "backends_run": ran,
        "backends_skipped": skipped,
    }


SPAN = 1024
"""Sizes this far apart are compared (closer ones differ by latency noise, not by bytes)."""


def _bytes(row: dict) -> int:
    return row["bytes"]


def verdict(plan: Plan, sweeps: Sweeps, found: list[dict], rec: records.Recorder) -> str:
    """Record the summary, then check every sweep finished every size with exact sums, and that
    the largest message took longer and moved more bytes per second than the smallest
    (where the two are at least SPAN times apart)."""
    summary = summary_for_report(sweeps.rows, plan.backends, found)
    rec.summary(**summary)
    failed = {b: r.message for b, r in sweeps.runs.items() if not r.ok}
    if failed:
        raise AssertionError(f"a sweep did not finish: {failed}")
    measured = [r for r in sweeps.rows if r["status"] == "ok"]
    if not measured:
        raise AssertionError("no backend measured any size")
    wrong = [f"{r['backend']} {r['mode']} {r['size']}" for r in measured if not r["correct"]]
    if wrong:
        raise AssertionError("an allreduce returned a wrong sum: " + ", ".join(wrong))
    expected = parse_sizes(plan.sizes)
    for backend in sorted({r["backend"] for r in measured}):
        done = sorted({r["bytes"] for r in sweeps.rows if r["backend"] == backend})
        if done != expected:
            raise AssertionError(f"{backend} finished {len(done)} of {len(expected)} sizes")
    for key in sorted({(r["backend"], r["mode"]) for r in measured}):
        series = sorted((r for r in measured if (r["backend"], r["mode"]) == key), key=_bytes)
        small, large = series[0], series[-1]
        if large["bytes"] >= SPAN * small["bytes"] and not (
            large["median_us"] > small["median_us"] and large["busbw_GBps"] > small["busbw_GBps"]
        ):
            raise AssertionError(
                f"{' '.join(key)}: {large['size']} took {large['median_us']:.0f} us at "
                f"{large['busbw_GBps']:.3g} GB/s, {small['size']} {small['median_us']:.0f} us at "
                f"{small['busbw_GBps']:.3g} GB/s: a larger message cannot be both faster and slower"
            )
    return f"{summary['status']}\n{summary['headline']}"
