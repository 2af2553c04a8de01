"""The fullgraph=False trade-off (the story's untested assumption 1), measured.

Three ways to run the same stack of FP4 layers, all computing the same quantization:

* ``eager``: no compile.
* ``compiled_with_breaks``: ``torch.compile(fullgraph=False)`` with the quantize call behind
  ``torch.compiler.disable`` (the story's msg 1002 patch, allowed to break the graph).
* ``compiled_fullgraph_custom_op``: ``torch.compile(fullgraph=True)`` with the quantize call
  as a torch.library custom op (the fix).

The quantize kernel is FlashInfer's on an SM100+ GPU and fp4lab's reference elsewhere, the
same kernel in all three variants, so only how dynamo sees the call differs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp4lab.compile import fix, segment, target, trace
from fp4lab.compile.story import Story
from fp4lab.core import timing

VARIANTS = ("eager", "compiled_with_breaks", "compiled_fullgraph_custom_op")


def kernel_name(device: torch.device) -> str:
    """Which quantize kernel runs on ``device``."""
    return "flashinfer" if fix.fp4_capable(device) else "fp4lab-reference"


def base_quantize(device: torch.device) -> segment.Quantize:
    """The quantize kernel itself, called eagerly."""
    return target.fp4_quantize if fix.fp4_capable(device) else fix.reference_fp4_quantize


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
        "kernel": kernel_name(device),
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
        output = step(x)
        row.update(
            {
                f"step_{k}": v
                for k, v in timing.measure(
                    step, x, warmup=warmup, iters=iters, device=device
                ).items()
            }
        )
        if cuda_graphs:
            try:
                row.update(
                    {
                        f"cuda_graph_{k}": v
                        for k, v in timing.cuda_graph_replay(
                            step, x, warmup=warmup, iters=iters
                        ).items()
                    }
                )
                row["cuda_graph_capture"] = "ok"
            except Exception as exc:  # record why capture failed; it is a result, not a crash
                row["cuda_graph_capture"] = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
    return row, output


def measure_variants(run: Story) -> list[dict]:
    """Every variant on the run's stack, its output compared with eager's; one "variant" record each.

    CUDA graph capture and replay run where the input is on a CUDA GPU and are marked skipped
    elsewhere.
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
        row["matches_eager"] = bool(torch.equal(outputs[variant], outputs["eager"]))
        row["max_abs_diff_vs_eager"] = float(
            (outputs[variant].float() - outputs["eager"].float()).abs().max()
        )
        if not cuda_graphs:
            row["cuda_graph_capture"] = "skipped: no CUDA GPU"
        run.rec.add("variant", row)
        rows.append(row)
    return rows


def _by_variant(rows: list[dict]) -> dict[str, dict]:
    return {r["variant"]: r for r in rows}


def break_reasons(rows: list[dict]) -> list[str]:
    """Dynamo's reasons for the breaks of the fullgraph=False variant, each with its frame."""
    return _by_variant(rows)["compiled_with_breaks"]["break_reasons"]


def tradeoff_verdict(run: Story, rows: list[dict]) -> str:
    """The custom op gives one graph and fullgraph=False splits every layer, or AssertionError."""
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
    if run.x.device.type != "cuda":
        lines.append(
            "CUDA graph capture and replay: SKIPPED (no CUDA GPU here); "
            "run this notebook on a GPU for those numbers"
        )
    return "\n".join(lines)
