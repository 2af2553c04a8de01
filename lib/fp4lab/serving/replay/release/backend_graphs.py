"""Inside one SGLang environment: what the release's own backend receives, read without changing
it: each dynamo graph's ops, how its ``split_graph`` cut it, and the split ops its compile
config holds.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4lab.compile import target


@dataclass
class Graphs:
    """What SGLang's backend received from dynamo: per graph, the ops it calls, in order; per
    graph how its ``split_graph`` cut it (the split ops met, how often, the pieces); and the
    backend instances (``SGLangBackend``), whose pieces a capture study observes."""

    ops: list[list[str]] = field(default_factory=list)
    splits: list[dict] = field(default_factory=list)
    backends: list[Any] = field(default_factory=list)

    def calls(self) -> dict[str, int]:
        """Every torch op called in the graphs, with how often."""
        return dict(collections.Counter(op for graph in self.ops for op in graph))

    def custom(self) -> dict[str, int]:
        """The custom ops (any namespace but aten/prims) and how often."""
        return {
            op: n for op, n in self.calls().items() if op.split(".")[0] not in ("aten", "prims")
        }


def _op_name(node: torch.fx.Node) -> str | None:
    called = node.target
    if isinstance(called, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(called)
    return None


@contextlib.contextmanager
def observed() -> Iterator[Graphs]:
    """Read each graph SGLang's backend receives (nothing of it changes)."""
    from sglang.srt.compilation import backend

    seen = Graphs()
    call, split = backend.SGLangBackend.__call__, backend.split_graph

    def observe(self: Any, graph: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.ops.append([n for n in map(_op_name, graph.graph.nodes) if n])
        seen.backends.append(self)
        return call(self, graph, example_inputs)

    def observe_split(graph: torch.fx.GraphModule, ops: list[str]) -> Any:
        cut, items = split(graph, ops)
        used = {
            n
            for i in items
            if i.is_splitting_graph
            for n in map(_op_name, i.graph.graph.nodes)
            if n
        }
        seen.splits.append({"split_ops": sorted(used), "pieces": sum(not i.is_splitting_graph for i in items),
                            "split_op_calls": sum(_op_name(n) in used for n in graph.graph.nodes)})  # fmt: skip
        return cut, items

    with (
        target.attribute_replaced(backend.SGLangBackend, "__call__", observe),
        target.attribute_replaced(backend, "split_graph", observe_split),
    ):
        yield seen


def config_split_ops() -> list[str]:
    """The split ops the release's compile config holds now (its registry)."""
    from sglang.srt.compilation import compilation_config

    config = compilation_config.CompilationConfig([1])
    return list(getattr(config, "split_ops", None) or getattr(compilation_config, "SPLIT_OPS", []))
