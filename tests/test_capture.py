"""The CUDA-graph recorder against what a CUDA graph does, and the decision over SGLang's backend."""

from __future__ import annotations

import pytest
import torch

from fp4lab.serving.capture import recorder, study


def _capture(graph_type: type, graph_context: type, x: torch.Tensor, w: torch.Tensor,
             **where: object) -> tuple[object, torch.Tensor]:  # fmt: skip
    graph = graph_type()
    with graph_context(graph, **where):
        scratch = torch.empty_like(x)
        scratch.copy_(x * 2)
        out = scratch @ w
        out.add_(1)
    return graph, out


def _replays(graph_type: type, graph_context: type, device: str, **where: object) -> list:
    """Capture ``(2x) @ w + 1``, then: new data in the captured input, a replay; the name bound
    to another tensor, a replay (it reads the captured tensor still)."""
    x, w = torch.ones(4, 4, device=device), torch.eye(4, device=device)
    graph, out = _capture(graph_type, graph_context, x, w, **where)
    seen = [out.clone()]
    x.fill_(3)
    graph.replay()
    seen.append(out.clone())
    x = torch.full((4, 4), 5.0, device=device)
    graph.replay()
    seen.append(out.clone())
    return [t.cpu() for t in seen]


def test_a_replay_reruns_the_captured_operators_on_the_captured_tensors():
    with recorder.simulated() as listed:
        assert torch.cuda.CUDAGraph is recorder.RecordedGraph and torch.cuda.graph is recorder.graph
        seen = _replays(torch.cuda.CUDAGraph, torch.cuda.graph, "cpu")
    assert listed["name"] == "cuda_graph_recorder"
    assert [float(t[0, 0]) for t in seen] == [3.0, 7.0, 7.0]
    assert torch.cuda.CUDAGraph is not recorder.RecordedGraph, "restored after the block"


def test_allocations_and_views_are_not_replayed_as_kernels():
    graph = recorder.RecordedGraph()
    x = torch.arange(4.0)
    with recorder.graph(graph):
        y = torch.empty(4)
        z = x.view(2, 2)
        y.copy_(z.reshape(-1) + 1)
    names = [str(op.func.overloadpacket) for op in graph.ops]
    assert "aten.empty" not in names and "aten.view" in names
    x.fill_(10)
    graph.replay()
    assert y.tolist() == [11.0] * 4 and graph.replays == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the recorder's "
                    "contract is checked against real torch.cuda.graph capture")  # fmt: skip
def test_the_recorder_replays_as_a_real_cuda_graph_does():
    stream = torch.cuda.Stream()
    real = _replays(torch.cuda.CUDAGraph, torch.cuda.graph, "cuda", stream=stream)
    with recorder.simulated():
        imitated = _replays(torch.cuda.CUDAGraph, torch.cuda.graph, "cuda")
    assert all(torch.equal(a, b) for a, b in zip(real, imitated, strict=True))


def _row(version: str, variant: str, diff: float, **extra: object) -> dict:
    return {"sglang_version": version, "variant": variant, "tokens": 16, "capture": "simulated",
            "max_abs_vs_uncaptured": diff, "max_abs_eager": 6.5, "replays_of_another_layer": [],
            **extra}  # fmt: skip


def test_the_decision_can_come_out_each_way():
    shared = [{"graph": 5, "piece": "submod_0", "layers": [0], "captured_for": [1]}]
    asserted = {"assertion": "AssertionError: Input addresses", "during": "capture pass"}
    wrong = study.decision([_row("0.5.9", "fullgraph_false", 12.25, replays_of_another_layer=shared,
                                 debug_mode=asserted), _row("0.5.9", "custom_op", 0.0)], ["0.5.9"])  # fmt: skip
    assert wrong["verdict"] == "WRONG OUTPUT" and "up to 12.2 " in wrong["number"]
    assert "graph 5 submod_0" in wrong["why"] and "(capture pass)" in wrong["why"]
    right = study.decision([_row("0.5.9", "fullgraph_false", 0.0), _row("0.5.9", "custom_op", 0.0)],
                           ["0.5.9", "0.5.21"])  # fmt: skip
    assert right["verdict"] == "WORKS" and "(not measured: 0.5.21)" in right["why"]
    broken = study.decision([_row("0.5.9", "fullgraph_false", 3.0), _row("0.5.9", "custom_op", 1.0)],
                            ["0.5.9"])  # fmt: skip
    assert broken["verdict"] == "FAILED"
    assert study.decision([], ["0.5.9"])["verdict"] == "UNMEASURED"


def test_the_decision_weighs_the_releases_own_glm5():
    """A GLM-5 replay SGLang refuses under fullgraph=False is quoted, not dropped; a correct stack
    with a wrong GLM-5 replay is WRONG OUTPUT; a refused custom op fails the decision."""
    stack = [_row("0.5.9", "fullgraph_false", 0.0), _row("0.5.9", "custom_op", 0.0)]
    refused = {"sglang_version": "0.5.12", "sm": "10.0", "variant": "fullgraph_false",
               "replay_error": "AssertionError: PCG capture stream is not set [at sglang/x.py:1]",
               "graphs_first_compiled_in_capture": 3}  # fmt: skip
    wrong = _row("0.5.9", "fullgraph_false", 2.5e-5, sm="10.0", max_abs_eager=2e-5)
    fixed = _row("0.5.9", "custom_op", 0.0, sm="10.0")
    decided = study.decision(stack, ["0.5.9"], [wrong, refused, fixed])
    assert decided["verdict"] == "WRONG OUTPUT"
    assert "SGLang 0.5.9, SM10.0: by up to 2.5e-05 (logits up to 2e-05)" in decided["number"]
    said = ("SGLang 0.5.12, SM10.0: its replayed forward fails in SGLang's own code (AssertionError: "
            "PCG capture stream is not set; 3 graphs were first compiled in the capture pass)")  # fmt: skip
    assert said in decided["number"]
    assert study.decision(stack, ["0.5.9"], [wrong])["number"].endswith(
        "its custom op not measured; custom op: 0"
    )
    assert study.decision(stack, ["0.5.9"], [_row("0.5.9", "fullgraph_false", 0.0, sm="10.0"), fixed])[
        "verdict"] == "WORKS"  # fmt: skip
    assert (
        study.decision(stack, ["0.5.9"], [{**refused, "variant": "custom_op"}])["verdict"]
        == "FAILED"
    )
