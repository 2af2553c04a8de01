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

from fp4lab.compile import segment, staging, trace
from fp4lab.core import timing

VARIANTS = ("eager", "compiled_with_breaks", "compiled_fullgraph_custom_op")


def kernel_name(device: torch.device) -> str:
    """Which quantize kernel runs on ``device``."""
    return "flashinfer" if staging.fp4_capable(device) else "fp4lab-reference"


def base_quantize(device: torch.device) -> segment.Quantize:
    """The quantize kernel itself, called eagerly."""
    return staging.fp4_quantize if staging.fp4_capable(device) else staging.reference_fp4_quantize


def quantize_for(variant: str, device: torch.device) -> segment.Quantize:
    """The quantize callable a variant's layers make."""
    if variant == "eager":
        return base_quantize(device)
    if variant == "compiled_with_breaks":
        return torch.compiler.disable(base_quantize(device))
    if variant == "compiled_fullgraph_custom_op":
        return lambda x, global_scale: torch.ops.fp4lab.fp4_quantize(x, global_scale)
    raise ValueError(f"variant={variant!r} is not allowed; allowed values: {', '.join(VARIANTS)}")


def run_variant(
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
