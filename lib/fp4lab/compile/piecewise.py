"""Piecewise CUDA graphs the way SGLang's piecewise runner takes them (``sglang.srt.compilation``).

Each graph dynamo hands the backend is split at the split ops (attention here, as SGLang's
``unified_attention_with_output``); every piece between two split ops is compiled and, on a CUDA
device, captured into a CUDA graph of its own for the token count at hand, all pieces in one
shared graph pool. At every step the split ops, and any code dynamo broke out of the graph
(the ``torch.compiler.disable``'d quantize under ``fullgraph=False``), run eagerly in Python
between the piece replays, and the model's forward is re-run.

* ``split_graph`` is SGLang's rule (``backend.split_graph``): a split op gets a subgraph of its
  own, ``split_module`` keeps the original order. The tests check, in an SGLang release's
  environment, that SGLang's own function splits the same graph into the same pieces.
* ``Piece`` mirrors ``CUDAPiecewiseBackend`` for one token count: one warm-up run, then a
  capture (the last piece of a graph turns its output into a weak reference, as SGLang's does:
  its memory goes back to the pool), then replays that return the captured output. It counts
  the replays whose tensor inputs are not where they were at the capture (SGLang's debug-mode
  check): a replay reads the captured addresses, so those read other data. The count is kept
  on a CPU too, where nothing is captured and each call runs the piece.
* ``Backend`` is the torch.compile backend: one split per dynamo graph, each piece compiled by
  the chosen torch.compile backend with the real inputs of its first call (SGLang compiles on
  fake inputs through its own compiler manager), ``Counts`` of what one step ran.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch.fx.passes.split_module import split_module
from torch.utils._pytree import tree_map

SPLIT_OPS = ("fp4lab.attention",)
"""The ops a graph is split at (``str`` of the node's target, as SGLang compares them)."""


@dataclass
class SplitItem:
    """One piece of a split graph, as SGLang's ``SplitItem``."""

    submod_name: str
    graph_id: int
    is_splitting_graph: bool
    graph: fx.GraphModule


def split_graph(
    graph: fx.GraphModule, ops: tuple[str, ...]
) -> tuple[fx.GraphModule, list[SplitItem]]:
    """SGLang's split: every call of an op in ``ops`` becomes a subgraph of its own, the nodes
    between them the pieces; the original order is kept (mutations stay where they were)."""
    subgraph_id, ids, splitting = 0, {}, []
    for node in graph.graph.nodes:
        if node.op in ("output", "placeholder"):
            continue
        if node.op == "call_function" and str(node.target) in ops:
            subgraph_id += 1
            ids[node] = subgraph_id
            splitting.append(subgraph_id)
            subgraph_id += 1
        else:
            ids[node] = subgraph_id
    split_gm = split_module(graph, None, lambda node: ids[node], keep_original_order=True)
    items = [
        SplitItem(
            name,
            int(name.replace("submod_", "")),
            int(name.replace("submod_", "")) in splitting,
            module,
        )
        for name, module in split_gm.named_children()
    ]
    return split_gm, sorted(items, key=lambda item: item.graph_id)


def structure(items: list[SplitItem]) -> list[dict]:
    """Each piece as data: its name, whether it is a split op, the call targets it holds."""
    return [
        {
            "name": item.submod_name,
            "split_op": item.is_splitting_graph,
            "calls": [str(n.target) for n in item.graph.graph.nodes if n.op.startswith("call_")],
        }
        for item in items
    ]


def weak_ref(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor on ``tensor``'s CUDA memory that does not keep it alive (SGLang's
    ``weak_ref_tensor``, a kernel of its own, here through ``__cuda_array_interface__``); off
    CUDA (capture imitated by ``capture.recorder``) the tensor itself: no pool reuses CPU memory."""
    if tensor.device.type != "cuda":
        return tensor
    nbytes = tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()

    memory = types.SimpleNamespace(
        __cuda_array_interface__={
            "shape": (nbytes,), "typestr": "|u1", "data": (tensor.data_ptr(), False), "version": 3,
        }
    )  # fmt: skip

    raw = torch.as_tensor(memory, device=tensor.device)
    return raw.view(tensor.dtype).as_strided(tensor.shape, tensor.stride())


def _weak_refs(output: object) -> object:
    return tree_map(lambda t: weak_ref(t) if isinstance(t, torch.Tensor) else t, output)


def _copied(output: object) -> object:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, output)


def _addresses(args: tuple, positions: list[int]) -> list[int]:
    return [args[i].data_ptr() for i in positions if isinstance(args[i], torch.Tensor)]


@dataclass
class Counts:
    """What steps ran, counted while ``Backend.counting``: dynamo graphs, piece calls (replays
    once captured), split-op calls; piece calls after the capture whose inputs from outside the
    dynamo graph (its own inputs: weights, activations made eagerly) were not where they were at
    the capture, and of those, the ones where a weight had moved (another layer's)."""

    graphs: int = 0
    pieces: int = 0
    split_ops: int = 0
    moved_inputs: int = 0
    moved_weights: int = 0


class Piece:
    """One compiled piece at one token count: run, then captured on a CUDA device, then replayed.
    ``positions`` are the arguments that are the dynamo graph's own inputs: the only ones whose
    place a capture does not fix (the others come out of earlier pieces, in the graph pool)."""

    def __init__(
        self, backend: Backend, runnable: Callable, last: bool, positions: list[int]
    ) -> None:
        self.backend, self.runnable, self.last, self.positions = backend, runnable, last, positions
        self.warmed = self.captured = False
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: object = None
        self.addresses: list[int] = []
        self.weights: list[int] = []

    def _where(self, args: tuple) -> tuple[list[int], list[int]]:
        weights = [i for i in self.positions if isinstance(args[i], torch.nn.Parameter)]
        return _addresses(args, self.positions), _addresses(args, weights)

    def __call__(self, *args: object) -> object:
        b = self.backend
        b.counts.pieces += b.counting
        if not self.warmed:  # SGLang: one warm-up run per shape before the capture
            self.warmed = True
            return self.runnable(*args)
        if not self.captured:
            self.captured = True
            self.addresses, self.weights = self._where(args)
            if not b.capture:  # no CUDA device: the capture's place in the order, its inputs noted
                return self.runnable(*args)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=b.pool, stream=b.stream):
                output = self.runnable(*args)
                if self.last:  # SGLang: "only safe ... for the last graph"
                    output = _weak_refs(output)
            self.output, self.graph = _weak_refs(output), graph
            return output
        if b.counting:
            addresses, weights = self._where(args)
            b.counts.moved_inputs += addresses != self.addresses
            b.counts.moved_weights += weights != self.weights
        if self.graph is None:
            return self.runnable(*args)
        self.graph.replay()
        return self.output


class _Compiler(fx.Interpreter):
    """Runs the split module on fake tensors and replaces each piece by a ``Piece`` of it,
    compiled for the inputs it gets (SGLang's ``PiecewiseCompileInterpreter``)."""

    def __init__(self, backend: Backend, split_gm: fx.GraphModule, pieces: list[str]) -> None:
        super().__init__(split_gm)
        self.backend, self.pieces = backend, pieces
        self.graph_inputs = {
            node.target: [
                i
                for i, a in enumerate(node.args)
                if isinstance(a, fx.Node) and a.op == "placeholder"
            ]
            for node in split_gm.graph.nodes
            if node.op == "call_module"
        }

    def run(self, *args: object) -> object:
        fake_mode = detect_fake_mode(args) or torch._subclasses.FakeTensorMode()
        fake = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with fake_mode:
            return super().run(*fake)

    def call_module(self, target: str, args: tuple, kwargs: dict) -> object:
        output = super().call_module(target, args, kwargs)
        if target in self.pieces:
            compiled = self.backend.compile_piece(self.fetch_attr(target), list(args))
            last = target == self.pieces[-1]
            positions = self.graph_inputs[target]
            self.module.__dict__[target] = Piece(self.backend, compiled, last, positions)
        return output


class _SplitOp:
    """A split-op subgraph, run eagerly and counted."""

    def __init__(self, backend: Backend, module: fx.GraphModule) -> None:
        self.backend, self.module = backend, module

    def __call__(self, *args: object) -> object:
        self.backend.counts.split_ops += self.backend.counting
        return self.module(*args)


@dataclass
class Backend:
    """A torch.compile backend doing what SGLang's does: split each dynamo graph at ``split_ops``,
    compile each piece with ``piece_backend`` and, with ``capture``, capture it per token count
    in ``pool`` on ``stream``. ``graphs`` holds each dynamo graph's pieces (``structure``)."""

    piece_backend: str = "inductor"
    split_ops: tuple[str, ...] = SPLIT_OPS
    capture: bool = False
    pool: object = None
    stream: torch.cuda.Stream | None = None
    counts: Counts = field(default_factory=Counts)
    counting: bool = False
    graphs: list[list[dict]] = field(default_factory=list)
    snapshots: list | None = None
    """While a list, each dynamo graph run appends a copy of its outputs."""

    def compile_piece(self, piece: fx.GraphModule, example_inputs: list) -> Callable:
        """``piece``, compiled by the piece backend with the real inputs of its first call
        (``eager`` keeps it as it is); shapes are static: one compile per token count."""
        if self.piece_backend == "eager":
            return piece
        from torch._dynamo.backends.registry import lookup_backend

        compiled: list[Callable] = []

        def run(*args: object) -> object:
            if not compiled:
                compiled.append(lookup_backend(self.piece_backend)(piece, list(args)))
            return compiled[0](*args)

        return run

    def __call__(self, graph: fx.GraphModule, example_inputs: list) -> Callable:
        split_gm, items = split_graph(graph, self.split_ops)
        self.graphs.append(structure(items))
        pieces = [i.submod_name for i in items if not i.is_splitting_graph]
        for item in items:
            if item.is_splitting_graph:
                split_gm.__dict__[item.submod_name] = _SplitOp(self, item.graph)
        _Compiler(self, split_gm, pieces).run(*example_inputs)

        def run(*args: object) -> object:
            self.counts.graphs += self.counting
            output = split_gm(*args)
            if self.snapshots is not None:
                self.snapshots.append(_copied(output))
            return output

        return run

    @contextlib.contextmanager
    def counted(self) -> Iterator[Counts]:
        """Count what the block runs (one step, typically)."""
        self.counts, self.counting = Counts(), True
        try:
            yield self.counts
        finally:
            self.counting = False
