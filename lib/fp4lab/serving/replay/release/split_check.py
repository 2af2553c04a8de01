"""Inside one SGLang environment: the release's own ``split_graph`` against fp4lab's
(``compile.piecewise``) on the same dynamo graph, and the prefill capture sizes the release's
``ServerArgs`` generates.

    python -m fp4lab.serving.replay.release.split_check OUT.json

The graph is fp4lab's GLM-5-shaped stack with attention as the split op and the quantize as the
custom op (``fullgraph=True``, the fix), captured by a backend that keeps dynamo's graph. SGLang
is made to see a GPU (``inside.simulated_gpu``) and given its CPU stand-ins
(``inside.runtime_standins``) before its compilation package is imported; both are listed.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import torch
from torch import fx

from fp4lab.compile import fix, piecewise, segment
from fp4lab.serving.replay.release import inside

SHAPE = segment.LayerShape(hidden=64, heads=2, ffn=128)
LAYERS, TOKENS, MAX_TOKENS = 2, 16, 2048


def dynamo_graph() -> fx.GraphModule:
    """The fix's stack as dynamo hands it to a backend (one graph: the custom op, fullgraph)."""
    kept: list[fx.GraphModule] = []

    def keep(graph: fx.GraphModule, example_inputs: list) -> fx.GraphModule:
        kept.append(graph)
        return graph

    model = segment.Stack(SHAPE, LAYERS, fix.custom_op(), split_attention=True)
    with torch.no_grad():
        torch.compile(model, backend=keep, fullgraph=True)(segment.tokens_input(SHAPE, TOKENS))
    return kept[0]


CAPTURE_SIZE_SOURCES = (
    ("sglang.srt.server_args", "ServerArgs._generate_piecewise_cuda_graph_tokens"),
    ("sglang.srt.arg_groups.cuda_graph_hook", "generate_prefill_cuda_graph_batch_sizes"),
)
"""Where releases generate the prefill capture list: a ServerArgs method (0.5.x up to the
0.5.1x), then a function of the CUDA-graph argument group (tc_piecewise releases)."""


def capture_sizes(max_tokens: int) -> tuple[list[int] | None, str | None]:
    """The release's own prefill capture list up to ``max_tokens``, and where it was read."""
    for module, name in CAPTURE_SIZE_SOURCES:
        try:
            found: object = importlib.import_module(module)
        except ImportError:
            continue
        for part in name.split("."):
            found = getattr(found, part, None)
        if found is None:
            continue
        if "." in name:  # a method of ServerArgs: only the field it reads is needed
            return found(types.SimpleNamespace(piecewise_cuda_graph_max_tokens=max_tokens)), name
        return found(max_tokens), name
    return None, None


def main(out: Path) -> int:
    graph = dynamo_graph()  # before the simulated GPU: dynamo would save its RNG state
    with inside.simulated_gpu((9, 0)) as patched:
        standins = inside.runtime_standins()
        import sglang
        from sglang.srt.compilation.backend import split_graph

    _, theirs = split_graph(graph, list(piecewise.SPLIT_OPS))
    _, ours = piecewise.split_graph(graph, piecewise.SPLIT_OPS)
    sizes, where = capture_sizes(MAX_TOKENS)
    found = {
        "sglang_version": sglang.__version__, "patched": patched, "standins": standins,
        "sglang": piecewise.structure(theirs), "fp4lab": piecewise.structure(ours),
        "capture_sizes": sizes, "capture_sizes_from": where, "max_tokens": MAX_TOKENS,
    }  # fmt: skip
    Path(out).write_text(json.dumps(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
