"""What notebook 08 runs: its parameters checked, the overlap microbenchmark recorded, its
figure, and the verdict for the decision report. Its serving section is
``fp4lab.serving.compare.switch_comparison``, whose outcome the verdict is handed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fp4lab.comm import torchrun
from fp4lab.comm.overlap import plots
from fp4lab.comm.overlap.benchmark import Benchmark, benchmark
from fp4lab.comm.overlap.params import BACKENDS, MoeShape, backend_for, unavailable, validate
from fp4lab.core import figures, params, paths, probe, records


class ServingOutcome(Protocol):
    """What the verdict reads of the serving comparison: its "server" rows, or why it did not run."""

    rows: list[dict]
    skip: str | None


@dataclass(frozen=True)
class Plan:
    """The notebook's checked parameters, with ``backend`` resolved from auto."""

    scale: int
    shape: MoeShape
    tokens: int
    chunks: list[int]
    collective: str
    ranks: int
    backend: str
    iters: int
    warmup: int
    timeout_s: int
    params: dict
    run_dir: Path

    def describe(self) -> str:
        """Ranks, backend, experts per rank and routed rows, in one line."""
        experts = self.shape.experts // self.ranks
        return (
            f"{self.ranks} ranks on {self.backend}, each with {experts} experts of {self.shape}, "
            f"{self.tokens * self.shape.topk} routed rows"
        )


def plan(
    *,
    scale: int,
    tokens: int,
    chunks: list[int],
    collective: str,
    ranks: int,
    backend: str,
    iters: int,
    warmup: int,
    timeout_s: int,
    machine: probe.Machine | None = None,
) -> Plan:
    """Check every parameter (ValueError naming it and its allowed values) and resolve ``backend="auto"``."""
    machine = machine or probe.machine()
    shape = MoeShape.glm5(scale)
    params.choice("backend", backend, ("auto", *BACKENDS))
    run_backend = backend_for(machine, ranks) if backend == "auto" else backend
    validate(shape, tokens, chunks, ranks, run_backend, collective, iters, warmup)
    params.positive("timeout_s", timeout_s)
    torchrun.refuse_backend(backend, unavailable(run_backend, ranks, machine), "auto, gloo")
    chosen = dict(
        scale=scale,
        tokens=tokens,
        chunks=chunks,
        collective=collective,
        ranks=ranks,
        backend=run_backend,
        iters=iters,
        warmup=warmup,
    )
    run_dir = paths.build_dir() / "overlap" / records.RUN_ID
    return Plan(
        scale,
        shape,
        tokens,
        list(chunks),
        collective,
        ranks,
        run_backend,
        iters,
        warmup,
        timeout_s,
        chosen,
        run_dir,
    )


def microbenchmark(plan: Plan, rec: records.Recorder) -> Benchmark:
    """Run the chunked pipeline under torchrun and record one "overlap" row per finished chunk count."""
    result = benchmark(
        out=plan.run_dir / "overlap.jsonl",
        log_path=plan.run_dir / "overlap.log",
        scale=plan.scale,
        tokens=plan.tokens,
        chunks=tuple(plan.chunks),
        nproc=plan.ranks,
        backend=plan.backend,
        collective=plan.collective,
        iters=plan.iters,
        warmup=plan.warmup,
        timeout_s=plan.timeout_s,
    )
    rec.add_all("overlap", result.rows)
    print("ran" if result.run.ok else f"FAILED: {result.run.message}")
    return result


def save_overlap_figure(result: Benchmark, rec: records.Recorder) -> Path | None:
    """Draw the four timings per chunk count and save it as 08_overlap_microbenchmark."""
    if not result.rows:
        print("no figure: no chunk count finished")
        return None
    fig = plots.plot_overlap(result.rows)
    source = f"data/{rec.notebook}.jsonl run {records.RUN_ID}"
    return figures.save_figure(
        fig, "08_overlap_microbenchmark", records.provenance(), source=source, evidence=[]
    )  # timings of collectives and matmuls: no FP4 kernel, trace or target involved


def summary_for_report(rows: list[dict], serving: ServingOutcome) -> dict:
    """The notebook's summary for the decision report: status, headline, the decision (verdict,
    number, why), what it needs."""
    needs = (
        "cpu for the microbenchmark; "
        "SGLang on a multi-GPU Blackwell node (with expert parallelism) for serving numbers"
    )
    parts, number = [], "no chunk count finished"
    if rows:
        chunked = [r for r in rows if r["chunks"] > 1] or rows
        best = max(chunked, key=lambda r: r["efficiency"])
        number = (
            f"microbenchmark ({best['backend']}, {best['world_size']} ranks): overlap efficiency "
            f"{best['efficiency']:.2f} at {best['chunks']} chunks"
        )
        parts.append(
            f"{number}, {best['speedup_vs_sequential']:.2f}x the unchunked sequential speed"
        )
        control = next((r for r in rows if r["chunks"] == 1), None)
        # one chunk cannot overlap anything: its efficiency is the measurement's own noise
        if control:
            parts.append(
                f"the 1-chunk control, which cannot overlap, reads {control['efficiency']:.2f}"
            )
    ran = [r for r in serving.rows if r.get("status") == "ran"]
    if ran:
        measured = ", ".join(f"{r['label']} {r['output_throughput']:.0f} tok/s" for r in ran)
        parts.append(f"serving: {measured}")
        status, verdict, number = "measured", "MEASURED", f"serving: {measured}"
        why = "SGLang served the same requests with each switch on and off"
    else:
        why = serving.skip or "every configuration failed (see the server records)"
        status = f"microbenchmark only; serving comparison not run: {why}"
        verdict = "UNMEASURED"
        why = f"SBO is a serving switch and its serving comparison did not run: {why}"
    return {
        "status": status,
        "headline": "; ".join(parts) or "nothing finished",
        "verdict": verdict,
        "number": number,
        "why": why,
        "needs": needs,
    }


def check_rows(rows: list[dict], chunks: list[int], collective: str) -> None:
    """Raise AssertionError unless every chunk count finished with the blocking result.

    The timings are reported, not judged: at a test's size on a small CPU they are latency
    and scheduler noise (measured on 2 cores at 256 tokens: the 1-chunk control read from -1.5
    to +2.3, and several combines in flight overlap one another's latency, so the overlapped
    pipeline can beat the blocking comm alone), so no bound on them holds both ways."""
    if [r["chunks"] for r in rows] != chunks:
        raise AssertionError("a chunk count is missing")
    tolerance = 0.0 if collective == "all_to_all" else 1e-3
    if any(r["max_abs_diff_vs_blocking"] > tolerance for r in rows):
        raise AssertionError("the overlapped combines delivered different data")


def verdict(plan: Plan, result: Benchmark, serving: ServingOutcome, rec: records.Recorder) -> str:
    """Record the summary, then check the microbenchmark finished and its rows (``check_rows``)."""
    summary = summary_for_report(result.rows, serving)
    rec.summary(**summary)
    if not result.run.ok:
        raise AssertionError(f"the microbenchmark did not finish: {result.run.message}")
    check_rows(result.rows, plan.chunks, plan.collective)
    if not serving.skip and not any(r["status"] == "ran" for r in serving.rows):
        reasons = "; ".join(r["reason"] for r in serving.rows)
        raise AssertionError(f"every server configuration failed: {reasons}")
    return f"{summary['status']}\n{summary['headline']}"
