"""compile.piecewise and notebook 04's verdict: SGLang's split rule, what one step runs under
piecewise capture, and a verdict that says what was measured and what was not."""

from __future__ import annotations

import types

import pytest
import torch
from torch import fx

from fp4lab.compile import fix, piecewise, segment, tradeoff
from fp4lab.core import records

SHAPE = segment.LayerShape(hidden=64, heads=2, ffn=128)


def test_a_split_op_gets_a_piece_of_its_own_and_the_order_is_kept():
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x) + 1
        out = torch.empty_like(y)
        torch.ops.fp4lab.attention(y.view(4, 1, 8), y.view(4, 1, 8), y.view(4, 1, 8), out, 0)
        return out * 2

    graph = fx.symbolic_trace(f)
    _, items = piecewise.split_graph(graph, piecewise.SPLIT_OPS)
    assert [(i.graph_id, i.is_splitting_graph) for i in items] == [
        (0, False),
        (1, True),
        (2, False),
    ]
    pieces = piecewise.structure(items)
    assert pieces[1]["calls"] == ["fp4lab.attention"]
    assert "fp4lab.attention" not in pieces[0]["calls"] + pieces[2]["calls"]


def _step(variant: str, layers: int) -> tuple[piecewise.Backend, piecewise.Counts, torch.Tensor]:
    torch._dynamo.reset()
    model = segment.Stack(
        SHAPE, layers, fix.quantize_for(variant, torch.device("cpu")), split_attention=True
    )
    backend = piecewise.Backend("eager")
    step = torch.compile(model, backend=backend, fullgraph=variant != "compiled_with_breaks")
    x = segment.tokens_input(SHAPE, 16)
    with torch.no_grad():
        step(x), step(x)  # the warm-up run, then the capture's place
        with backend.counted() as counts:
            out = step(x)
        eager = segment.Stack(SHAPE, layers, fix.base_quantize(torch.device("cpu")))(x)
    assert torch.equal(out, eager), "the pieces and the islands compute what eager computes"
    return backend, counts, out


def test_the_fix_is_one_graph_split_only_at_attention_with_inputs_in_place():
    backend, counts, _ = _step("compiled_fullgraph_custom_op", layers=3)
    assert len(backend.graphs) == 1
    assert (counts.graphs, counts.pieces, counts.split_ops) == (1, 4, 3)
    assert (counts.moved_inputs, counts.moved_weights) == (0, 0)


def test_fullgraph_false_reuses_each_graph_for_every_layer_and_moves_inputs():
    backend, counts, _ = _step("compiled_with_breaks", layers=3)
    assert counts.graphs >= 2 * 3 and counts.graphs > len(backend.graphs), (
        "compiled graphs are re-entered per layer"
    )
    assert counts.split_ops == 3
    assert counts.moved_weights > 0 and counts.moved_inputs >= counts.moved_weights, (
        "a piece captured once per token count meets other layers' weights at later calls"
    )


UNMEASURED = {"verdict": "UNMEASURED", "number": "no release measured", "why": "none ran"}
"""What ``capture.study.decision`` says where SGLang's backend ran nowhere (a GPU machine)."""


def _row(variant: str, tokens: int, capture: str, **extra: object) -> dict:
    structure = {
        "compiled_with_breaks": dict(graph_count=4, graph_break_count=3, dynamo_graphs=4,
                                     graph_runs_per_step=8, piece_runs_per_step=10, pieces=5,
                                     split_op_runs_per_step=2, eager_quantize_runs_per_step=2,
                                     eager_islands_per_step=4, moved_inputs=10, moved_weights=8),
        "compiled_fullgraph_custom_op": dict(graph_count=1, graph_break_count=0, dynamo_graphs=1,
                                             graph_runs_per_step=1, piece_runs_per_step=3, pieces=3,
                                             split_op_runs_per_step=2, eager_quantize_runs_per_step=0,
                                             eager_islands_per_step=2, moved_inputs=0, moved_weights=0),
    }.get(variant, {})  # fmt: skip
    return {"variant": variant, "label": tradeoff.LABELS[variant], "tokens": tokens,
            "capture": capture, **structure, **extra}  # fmt: skip


def _run() -> types.SimpleNamespace:
    return types.SimpleNamespace(layers=2, rec=records.Recorder("04_fullgraph_false_tradeoff", {}))


def test_a_failed_capture_fails_the_verdict_before_any_summary(isolated_outputs):
    run = _run()
    rows = [_row("eager", 64, "none"), _row("compiled_with_breaks", 64, tradeoff.NO_CUDA),
            _row("compiled_fullgraph_custom_op", 64, "error: RuntimeError: capturing",
                 capture_error="RuntimeError: capturing"),
            _row("full_cuda_graph", 64, tradeoff.NO_CUDA)]  # fmt: skip
    with pytest.raises(RuntimeError, match="custom_op at 64 tokens: RuntimeError: capturing"):
        tradeoff.tradeoff_verdict(run, rows, UNMEASURED)
    assert run.rec.written == [], "a failed verdict writes no summary: the run did not finish"


def test_without_a_gpu_sglangs_backend_decides_and_the_structure_is_quoted(isolated_outputs):
    run = _run()
    rows = [_row(v, 64, "none" if v == "eager" else tradeoff.NO_CUDA) for v in tradeoff.VARIANTS]
    wrong = {"verdict": "WRONG OUTPUT", "number": "up to 12.2", "why": "shared pieces"}
    text = tradeoff.tradeoff_verdict(run, rows, wrong)
    assert "SKIPPED (no CUDA device here)" in text
    assert "8 of the piece runs met weights other than their capture's" in text
    assert "SGLang's own backend: WRONG OUTPUT, up to 12.2; shared pieces" in text
    [summary] = [r["values"] for r in run.rec.written]
    assert (summary["verdict"], summary["number"]) == ("WRONG OUTPUT", "up to 12.2")


def test_with_replays_the_verdict_gives_the_ratio_per_token_count(isolated_outputs):
    run = _run()
    ms = {"eager": 5.0, "compiled_with_breaks": 3.0, "compiled_fullgraph_custom_op": 2.0,
          "full_cuda_graph": 1.5}  # fmt: skip
    rows = [
        _row(
            v,
            t,
            "none" if v == "eager" else "ok",
            ms_median=ms[v] * t / 64,
            matches_uncaptured=True,
        )
        for t in (64, 256)
        for v in tradeoff.VARIANTS
    ]
    text = tradeoff.tradeoff_verdict(run, rows, UNMEASURED)
    assert "64 tokens: fullgraph=False 1.50x the custom op (3.00 vs 2.00 ms)" in text
    [summary] = [r["values"] for r in run.rec.written]
    assert summary["verdict"] == "MEASURED" and summary["number"].startswith("256 tokens:")
    assert "outputs of a full replay differing from the same step run uncaptured: none" in text


@pytest.mark.gpu
def test_a_captured_piece_replays_its_weak_referenced_output():
    torch._dynamo.reset()
    backend = piecewise.Backend(
        "eager", capture=True, pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.Stream()
    )
    model = segment.Stack(SHAPE, 2, fix.quantize_for("compiled_fullgraph_custom_op",
                          torch.device("cuda")), split_attention=True).cuda()  # fmt: skip
    step = torch.compile(model, backend=backend, fullgraph=True)
    x = segment.tokens_input(SHAPE, 16, device="cuda")
    with torch.no_grad():
        first = step(x).clone()
        with torch.cuda.stream(backend.stream):
            step(x)
        torch.cuda.synchronize()
        with backend.counted() as counts:
            replayed = step(x)
    assert torch.equal(replayed, first) and counts.moved_inputs == 0
    t = torch.arange(8.0, device="cuda")
    assert (
        torch.equal(piecewise.weak_ref(t), t) and piecewise.weak_ref(t).data_ptr() == t.data_ptr()
    )
