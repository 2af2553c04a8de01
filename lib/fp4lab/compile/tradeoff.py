"""The fullgraph=False trade-off (the story's untested assumption 1), measured.

Three ways to run the same stack of FP4 layers, all computing the same quantization:

* ``eager``: no compile.
* ``compiled_with_breaks``: ``torch.compile(fullgraph=False)`` with the quantize call behind
  ``torch.compiler.disable`` (the story's msg 1002 patch, allowed to break the graph).
* ``compiled_fullgraph_custom_op``: ``torch.compile(fullgraph=True)`` with the quantize call
  as a torch.library custom op (the fix).

The quantize kernel is FlashInfer's on an SM100+ GPU and fp4lab's reference elsewhere, the
same kernel in all three variants, so only how dynamo sees the call differs; each record names
the kernel that ran (observed) and its evidence. On a CUDA device every variant is captured into
a CUDA graph and replayed: a failed capture or replay is recorded as an error with its message
and fails the verdict; elsewhere it is recorded as skipped ("no CUDA device").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp4lab.compile import fix, segment, target, trace
from fp4lab.compile.story import Story
from fp4lab.core import evidence, timing

VARIANTS = ("eager", "compiled_with_breaks", "compiled_fullgraph_custom_op")
NO_CUDA = "skipped: no CUDA device"


def base_quantize(device: torch.device) -> segment.Quantize:
    """The quantize kernel itself, called directly (and reporting to ``fix.observing``)."""
    if fix.fp4_capable(device):
        return fix.reporting(fix.FLASHINFER, target.fp4_quantize)
    return fix.reporting(fix.REFERENCE_DIRECT, fix.reference_fp4_quantize)


def quantize_for(variant: str, device: torch.device) -> segment.Quantize:
    """The quantize callable a variant's layers make."""
    if variant == "eager":
        return base_quantize(device)
    if variant == "compiled_with_breaks":
        return torch.compiler.disable(base_quantize(device))
    if variant == "compiled_fullgraph_custom_op":
        return lambda x, global_scale: torch.ops.fp4lab.fp4_quantize(x, global_scale)
    raise ValueError(f"variant={variant!r} is not allowed; allowed values: {', '.join(VARIANTS)}")


def measure_variant(
    variant: str,
    shape: segment.LayerShape,
    layers: int,
    x: torch.Tensor,
    *,
    backend: str,
    warmup: int,
    iters: int,
    cuda_graphs: bool,
) -> tuple[dict, torch.Tensor]:
    """Compile (or not) one variant, count its graphs and breaks, time a step; returns (row, output)."""
    device = x.device
    model = segment.Stack(shape, layers, quantize_for(variant, device)).to(device)
    row: dict = {
        "variant": variant,
        "layers": layers,
        "backend": backend if variant != "eager" else None,
    }
    with torch.no_grad():
        if variant == "eager":
            step: Callable = model
            row.update(graph_count=0, graph_break_count=0, graph_calls=0, compile_seconds=0.0)
        else:
            outcome = trace.attempt(
                model, x, fullgraph=variant == "compiled_fullgraph_custom_op", backend=backend
            )
            if outcome.signature != "ok":
                raise RuntimeError(
                    f"{variant} did not compile: {outcome.signature}: {outcome.message}"
                )
            row.update(
                graph_count=outcome.graph_count,
                graph_break_count=outcome.graph_break_count,
                graph_calls=outcome.graph_calls,
                compile_seconds=outcome.seconds,
                break_reasons=sorted(set(outcome.break_reasons)),
            )
            step = outcome.compiled
        row["graph_calls_per_layer"] = row["graph_calls"] / layers
        with fix.observing() as seen:
            output = step(x)
        row.update(kernel=seen.kernel, kernel_calls=dict(seen.calls))
        row.update(
            {
                f"step_{k}": v
                for k, v in timing.measure(
                    step, x, warmup=warmup, iters=iters, device=device
                ).items()
            }
        )
        if cuda_graphs:
            row.update(_cuda_graph(step, x, warmup=warmup, iters=iters))
            if row["cuda_graph_capture"] == "ok":
                row["launch_overhead_share"] = launch_overhead_share(row)
        else:
            row["cuda_graph_capture"] = NO_CUDA
    row["evidence"] = evidence.of_run(
        traced=variant != "eager",
        simulated=False,
        kernel=seen.kernel,
        replayed=row["cuda_graph_capture"] == "ok",
    )
    return row, output


def _cuda_graph(step: Callable, x: torch.Tensor, *, warmup: int, iters: int) -> dict:
    """Capture ``step`` into a CUDA graph and time its replay; a failure is returned as
    ``cuda_graph_capture: "error: ..."`` with the message, for the verdict to raise."""
    try:
        timed = timing.cuda_graph_replay(step, x, warmup=warmup, iters=iters)
    except Exception as exc:  # recorded first, then the verdict fails the notebook
        message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return {"cuda_graph_capture": f"error: {message}", "cuda_graph_error": message}
    return {"cuda_graph_capture": "ok", **{f"cuda_graph_{k}": v for k, v in timed.items()}}


def launch_overhead_share(row: dict) -> float:
    """The share of a step that its CUDA-graph replay removes: 1 - replay / step (median ms);
    what launching kernels from Python costs, as far as a graph can save it."""
    return 1.0 - row["cuda_graph_median_ms"] / row["step_median_ms"]


def measure_variants(run: Story) -> list[dict]:
    """Every variant on the run's stack, its output compared with eager's; one "variant" record each.

    CUDA graph capture and replay run where the input is on a CUDA device and are recorded as
    skipped elsewhere. The eager row is the reference: its comparison fields are None.
    """
    p = run.params
    cuda_graphs = run.x.device.type == "cuda"
    rows, outputs = [], {}
    for variant in VARIANTS:
        print(f"{variant} ...", flush=True)
        row, outputs[variant] = measure_variant(
            variant,
            run.shape,
            run.layers,
            run.x,
            backend=p["backend"],
            warmup=p["warmup"],
            iters=p["iters"],
            cuda_graphs=cuda_graphs,
        )
        reference = variant == "eager"
        row["matches_eager"] = (
            None if reference else bool(torch.equal(outputs[variant], outputs["eager"]))
        )
        row["max_abs_diff_vs_eager"] = (
            None
            if reference
            else float((outputs[variant].float() - outputs["eager"].float()).abs().max())
        )
        run.rec.add("variant", row)
        rows.append(row)
    return rows


def _by_variant(rows: list[dict]) -> dict[str, dict]:
    return {r["variant"]: r for r in rows}


def break_reasons(rows: list[dict]) -> list[str]:
    """Dynamo's reasons for the breaks of the fullgraph=False variant, each with its frame."""
    return _by_variant(rows)["compiled_with_breaks"]["break_reasons"]


def tradeoff_verdict(run: Story, rows: list[dict]) -> str:
    """The custom op gives one graph and fullgraph=False splits every layer (recorded as the run's
    summary), or AssertionError; RuntimeError when a CUDA graph capture or replay failed."""
    failed = [r for r in rows if str(r.get("cuda_graph_capture", "")).startswith("error")]
    if failed:
        raise RuntimeError(
            "CUDA graph capture or replay failed: "
            + "; ".join(f"{r['variant']}: {r['cuda_graph_error']}" for r in failed)
        )
    variants = _by_variant(rows)
    breaks, fixed = variants["compiled_with_breaks"], variants["compiled_fullgraph_custom_op"]
    eager_ms, layers = variants["eager"]["step_median_ms"], run.layers
    assert (fixed["graph_count"], fixed["graph_break_count"], fixed["graph_calls"]) == (1, 0, 1), (
        "the custom op did not give one graph"
    )
    assert breaks["graph_calls"] >= 2 * layers, (
        "fullgraph=False should split every layer around its quantize call"
    )
    lines = [
        f"fullgraph=False: {breaks['graph_count']} distinct graphs, "
        f"{breaks['graph_break_count']} breaks (explain); {breaks['graph_calls']} graph runs per "
        f"step for {layers} layers ({breaks['graph_calls_per_layer']:.0f} per layer); step "
        f"{breaks['step_median_ms']:.2f} ms = {breaks['step_median_ms'] / eager_ms:.2f}x eager",
        f"fullgraph=True with the custom op: 1 graph, 0 breaks; step "
        f"{fixed['step_median_ms']:.2f} ms = {fixed['step_median_ms'] / eager_ms:.2f}x eager, "
        f"{fixed['step_median_ms'] / breaks['step_median_ms']:.2f}x fullgraph=False",
    ]
    structure = (
        f"fullgraph=False: {breaks['graph_calls']} graph runs per step for {layers} layers, vs 1"
    )
    if all(r["cuda_graph_capture"] == "ok" for r in rows):
        lines.append(
            "full CUDA graph (decode-style) replay: "
            + ", ".join(
                f"{r['variant']} {r['cuda_graph_median_ms']:.3f} ms (launch overhead "
                f"{r['launch_overhead_share']:.0%} of its step)"
                for r in rows
            )
        )
        decision = dict(
            verdict="MEASURED",
            number=f"{structure}; replayed as one whole-step CUDA graph: fullgraph=False "
            f"{breaks['cuda_graph_median_ms']:.2f} ms, custom op {fixed['cuda_graph_median_ms']:.2f} ms",
            why="the whole step was captured into one CUDA graph (decode-style), not piece by "
            "piece as SGLang's prefill runner does, so this is not the cost under piecewise graphs",
        )
    else:
        lines.append(
            f"CUDA graph capture and replay: SKIPPED ({NO_CUDA.removeprefix('skipped: ')} here); "
            "run this notebook on a GPU for those numbers"
        )
        decision = dict(
            verdict="UNMEASURED",
            number=structure,
            why="what the extra graphs cost is GPU launch overhead; without a GPU only the graph "
            "structure was measured, and CPU step times are not that cost",
        )
    return run.rec.summary("\n".join(lines), **decision, needs="cpu")["values"]["headline"]
