"""The fullgraph=False trade-off (the story's untested assumption 1) under fp4lab's mirror of
SGLang's piecewise runner (``compile.piecewise``, proven equal to SGLang's own backend by a
test); SGLang's own backend runs it in ``serving.capture``, whose decision this one defers to.

The same stack of FP4 layers, attention as a split op, four ways, one quantize kernel:
``eager`` (the reference); ``compiled_with_breaks`` (``fullgraph=False``, the quantize behind
``torch.compiler.disable``: the story's msg 1002 patch); ``compiled_fullgraph_custom_op`` (the
fix: one dynamo graph, split at attention only); ``full_cuda_graph`` (the fix's whole step as
one CUDA graph, decode-style, never a piecewise cost). Per token count: on a CUDA device each
piece is captured and replayed, the step timed, its output checked against a compile of its own
with capture off and against eager; on a CPU only the structure (graphs, pieces, eager islands,
piece runs meeting other weights than at their capture), with CPU timings recorded apart.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_leaves

from fp4lab.compile import fix, frames, piecewise, segment, trace
from fp4lab.compile.story import Story
from fp4lab.core import evidence, timing

VARIANTS = fix.QUANTIZE_VARIANTS
LABELS = {
    "eager": "eager",
    "compiled_with_breaks": "fullgraph=False, piecewise",
    "compiled_fullgraph_custom_op": "custom op, piecewise",
    "full_cuda_graph": "full CUDA graph (decode-style)",
}
CAPTURE_MODES = {
    "eager": "none",
    "compiled_with_breaks": "piecewise",
    "compiled_fullgraph_custom_op": "piecewise",
    "full_cuda_graph": "full",
}
NO_CUDA = "skipped: no CUDA device"


def model_for(variant: str, run: Story) -> segment.Stack:
    """The run's stack (same weights for every variant), attention as the split op."""
    device = run.x.device
    return segment.Stack(
        run.shape, run.layers, fix.quantize_for(variant, device), split_attention=True
    ).to(device)


def _explain(variant: str, model: torch.nn.Module, x: torch.Tensor, backend: str) -> dict:
    """Dynamo's own count of the variant's graphs and breaks (``torch._dynamo.explain``)."""
    outcome = trace.attempt(model, x, fullgraph=variant != "compiled_with_breaks", backend=backend)
    if outcome.signature != "ok":
        raise RuntimeError(f"{variant} did not compile: {outcome.signature}: {outcome.message}")
    return {
        "graph_count": outcome.graph_count,
        "graph_break_count": outcome.graph_break_count,
        "break_reasons": sorted(set(outcome.break_reasons)),
    }


def _timed(step: Callable, x: torch.Tensor, warmup: int, iters: int) -> dict:
    key = "ms" if x.device.type == "cuda" else "cpu_step_ms"
    measured = timing.measure(step, x, warmup=warmup, iters=iters, device=x.device)
    return {f"{key}_{k.removesuffix('_ms')}": v for k, v in measured.items()}


def _compare(output: torch.Tensor, reference: torch.Tensor) -> dict:
    return {
        "matches_eager": bool(torch.equal(output, reference)),
        "max_abs_diff_vs_eager": float((output.float() - reference.float()).abs().max()),
    }


def _compiled(variant: str, run: Story, backend: piecewise.Backend) -> Callable:
    torch._dynamo.reset()
    fullgraph = variant != "compiled_with_breaks"
    return torch.compile(
        model_for(variant, run), backend=backend, fullgraph=fullgraph, dynamic=False
    )


def _piecewise(variant: str, run: Story, x: torch.Tensor, reference: torch.Tensor) -> dict:
    """One piecewise variant at one token count: compile, warm up, capture, replay, count, time;
    the uncaptured step is a compile of its own with capture off (a step of the captured one
    already replays the pieces that layers share)."""
    p, cuda = run.params, x.device.type == "cuda"
    uncaptured = _compiled(variant, run, piecewise.Backend(p["backend"]))(x).clone()
    backend = piecewise.Backend(
        p["backend"], capture=cuda,
        pool=torch.cuda.graph_pool_handle() if cuda else None,
        stream=torch.cuda.Stream() if cuda else None,
    )  # fmt: skip
    step = _compiled(variant, run, backend)
    row: dict = {"capture": "ok" if cuda else NO_CUDA}
    try:
        backend.snapshots = []
        step(x)  # compiles every graph; each piece's warm-up run
        warm, backend.snapshots = backend.snapshots, None
        if cuda:
            with torch.cuda.stream(backend.stream):
                step(x)  # each piece captured, in order, as SGLang's capture pass does
            torch.cuda.synchronize()
        backend.snapshots = []
        with backend.counted() as counts, fix.observing() as seen:
            output = step(x)
        replayed, backend.snapshots = backend.snapshots, None
    except Exception as exc:  # recorded first; the verdict fails the notebook
        message = frames.said(exc)
        return {"capture": f"error: {message}", "capture_error": message}
    eager_quantize = sum(seen.calls.values()) if variant == "compiled_with_breaks" else 0
    graphs = backend.graphs
    row.update(
        dynamo_graphs=len(graphs),
        pieces=sum(1 for g in graphs for piece in g if not piece["split_op"]),
        split_op_pieces=sum(1 for g in graphs for piece in g if piece["split_op"]),
        graph_runs_per_step=counts.graphs,
        piece_runs_per_step=counts.pieces,
        split_op_runs_per_step=counts.split_ops,
        eager_quantize_runs_per_step=eager_quantize,
        eager_islands_per_step=counts.split_ops + eager_quantize,
        moved_inputs=counts.moved_inputs,
        moved_weights=counts.moved_weights,
        graphs_differing_after_replay=[
            i for i, (a, b) in enumerate(zip(warm, replayed, strict=True)) if not _same(a, b)
        ],
        kernel=seen.kernel or fix.direct_quantize(x.device)[0],
        matches_uncaptured=bool(torch.equal(output, uncaptured)),
        **_compare(output, reference),
        **_timed(step, x, p["warmup"], p["iters"]),
    )
    return row


def _same(a: object, b: object) -> bool:
    """Whether two outputs hold equal tensors, leaf by leaf."""
    left, right = tree_leaves(a), tree_leaves(b)
    return len(left) == len(right) and all(
        torch.equal(x, y) for x, y in zip(left, right, strict=True) if isinstance(x, torch.Tensor)
    )


def _full(run: Story, x: torch.Tensor, reference: torch.Tensor) -> dict:
    """The fix's whole step as one CUDA graph (decode-style), where a CUDA device is."""
    row = {"dynamo_graphs": 1, "graph_runs_per_step": 1, "eager_islands_per_step": 0}
    if x.device.type != "cuda":
        return {**row, "capture": NO_CUDA}
    p = run.params
    torch._dynamo.reset()
    step = torch.compile(model_for("full_cuda_graph", run), backend=p["backend"], fullgraph=True)
    try:
        with fix.observing() as seen:
            step(x)
        timed = timing.cuda_graph_replay(step, x, warmup=p["warmup"], iters=p["iters"])
    except Exception as exc:
        message = frames.said(exc)
        return {**row, "capture": f"error: {message}", "capture_error": message}
    return {
        **row,
        "capture": "ok",
        "kernel": seen.kernel,
        **{f"ms_{k.removesuffix('_ms')}": v for k, v in timed.items()},
    }


def measure_variants(run: Story) -> list[dict]:
    """Every variant at every token count, checked against eager; one "variant" record each."""
    p = run.params
    explained: dict[str, dict] = {}
    rows = []
    for tokens in p["token_counts"]:
        x = segment.tokens_input(run.shape, tokens, device=run.x.device.type)
        with torch.no_grad():
            eager = model_for("eager", run)
            with fix.observing() as seen:
                reference = eager(x)
            for variant in VARIANTS:
                print(f"{tokens} tokens: {LABELS[variant]} ...", flush=True)
                row = {"variant": variant, "label": LABELS[variant], "capture_mode": CAPTURE_MODES[variant],
                       "tokens": tokens, "layers": run.layers, "backend": p["backend"]}  # fmt: skip
                if variant == "eager":
                    row.update(
                        kernel=seen.kernel,
                        capture="none",
                        **_timed(eager, x, p["warmup"], p["iters"]),
                    )
                else:
                    if variant not in explained and variant != "full_cuda_graph":
                        explained[variant] = _explain(
                            variant, model_for(variant, run), x, p["backend"]
                        )
                    row.update(
                        explained.get(variant, explained.get("compiled_fullgraph_custom_op", {}))
                    )
                    row.update(
                        _full(run, x, reference) if variant == "full_cuda_graph"
                        else _piecewise(variant, run, x, reference)
                    )  # fmt: skip
                row["evidence"] = evidence.of_run(
                    traced=variant != "eager", simulated=False, kernel=row.get("kernel"),
                    replayed=row["capture"] == "ok",
                )  # fmt: skip
                run.rec.add("variant", row)
                rows.append(row)
    return rows


def _of(rows: list[dict], variant: str) -> list[dict]:
    return [r for r in rows if r["variant"] == variant]


def break_reasons(rows: list[dict]) -> list[str]:
    """Dynamo's reasons for the breaks of the fullgraph=False variant, each with its frame."""
    return _of(rows, "compiled_with_breaks")[0]["break_reasons"]


def _structure(r: dict) -> str:
    return (
        f"{r['graph_runs_per_step']} dynamo graph runs ({r['dynamo_graphs']} compiled), "
        f"{r['piece_runs_per_step']} piece runs and {r['eager_islands_per_step']} eager islands "
        f"per step; {r['moved_weights']} of the piece runs met weights other than their capture's"
    )


def tradeoff_verdict(run: Story, rows: list[dict], sglang: dict) -> str:
    """The run's summary: the structure fp4lab's backend measured (the custom op gives one graph
    split only at attention, fullgraph=False splits every layer further, or AssertionError), its
    cost per step where a GPU captured, and the decision: ``sglang`` (``capture.study.decision``,
    what SGLang's own backend returned) wherever it measured, else the cost. RuntimeError when a
    capture or replay failed."""
    failed = [r for r in rows if str(r["capture"]).startswith("error")]
    if failed:
        raise RuntimeError(
            "CUDA graph capture or replay failed: "
            + "; ".join(
                f"{r['variant']} at {r['tokens']} tokens: {r['capture_error']}" for r in failed
            )
        )
    layers = run.layers
    for fixed in _of(rows, "compiled_fullgraph_custom_op"):
        counts = (fixed["graph_count"], fixed["graph_break_count"], fixed["dynamo_graphs"])
        evidence.guard(counts == (1, 0, 1), "the custom op did not give one graph")
        evidence.guard((fixed["pieces"], fixed["split_op_runs_per_step"]) == (layers + 1, layers),
                       "one graph should be split at each layer's attention only")  # fmt: skip
    for breaks in _of(rows, "compiled_with_breaks"):
        evidence.guard(breaks["graph_runs_per_step"] >= 2 * layers,
                       "fullgraph=False should split every layer around its quantize call")  # fmt: skip
        evidence.guard(breaks["eager_quantize_runs_per_step"] == layers,
                       f"fullgraph=False should run the quantize eagerly once per layer "
                       f"({layers}), ran {breaks['eager_quantize_runs_per_step']}")  # fmt: skip
    largest = max(r["tokens"] for r in rows)
    at = {r["variant"]: r for r in rows if r["tokens"] == largest}
    breaks, fixed = at["compiled_with_breaks"], at["compiled_fullgraph_custom_op"]
    structure = (
        f"fullgraph=False: {_structure(breaks)} for {layers} layers; custom op: {_structure(fixed)}"
    )
    lines = [structure]
    mismatched = [
        f"{r['label']} at {r['tokens']}" for r in rows if r.get("matches_uncaptured") is False
    ]
    moved = [f"{r['label']} at {r['tokens']}" for r in rows if r.get("moved_weights")]
    differing = [
        f"{r['label']} at {r['tokens']}" for r in rows if r.get("graphs_differing_after_replay")
    ]
    if all(r["capture"] in ("ok", "none") for r in rows):
        ratios = [
            f"{t} tokens: fullgraph=False {b['ms_median'] / f['ms_median']:.2f}x the custom op "
            f"({b['ms_median']:.2f} vs {f['ms_median']:.2f} ms), full graph {g['ms_median']:.2f} ms"
            for t in sorted({r["tokens"] for r in rows})
            for b, f, g in [[next(r for r in rows if r["tokens"] == t and r["variant"] == v)
                             for v in ("compiled_with_breaks", "compiled_fullgraph_custom_op", "full_cuda_graph")]]
        ]  # fmt: skip
        lines += ["piecewise replay, ms per step: " + "; ".join(ratios)]
        lines += [f"outputs of a full replay differing from the same step run uncaptured: "
                  f"{', '.join(mismatched) or 'none'}; "
                  f"weights moved since capture: {', '.join(moved) or 'none'}; dynamo graphs whose output "
                  f"changed after replay: {', '.join(differing) or 'none'}"]  # fmt: skip
        decision = dict(
            verdict="MEASURED",
            number=ratios[-1],
            why="each piece was captured per token count and replayed with the eager islands run "
            "between them, as fp4lab's mirror of SGLang's piecewise runner does",
        )
    else:
        lines.append(
            f"CUDA graph capture and replay by fp4lab's backend: SKIPPED "
            f"({NO_CUDA.removeprefix('skipped: ')} here); run this notebook on a GPU for the cost "
            "per step"
        )
        decision = None
    lines.append(f"SGLang's own backend: {sglang['verdict']}, {sglang['number']}; {sglang['why']}")
    if decision is None or sglang["verdict"] != "UNMEASURED":
        decision = sglang
    return run.rec.summary("\n".join(lines), **decision, needs="cpu")["values"]["headline"]
