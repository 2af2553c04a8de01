"""Inside one SGLang environment: the release's piecewise CUDA-graph runner driven on its GLM-5.

``drive`` calls the release's own ``ModelRunner.init_piecewise_cuda_graphs`` on the model's
runner host, or, in a release without it (0.5.3.post2), the release's own ``ModelRunner.__init__``
on the host with its GPU set-up steps stood in for (``INIT_STANDINS``). The release's gate
collects the attention and MoE layers and builds ``PiecewiseCudaGraphRunner``, whose ``__init__``
installs ``install_torch_compiled(fullgraph=True)`` on the language model, enters the release's
compiled contexts and runs its compile warm-up, one forward per capture size, each inside
``set_forward_context``; where the gate builds no runner, the pass is ``declined``, with the
reason the release's ModelRunner logged. Only what needs a GPU is left out and listed: the
CUDA-graph capture itself (``capture``) and the graph memory pool handle. Every dynamo graph
SGLang's backend receives is read (the ops it holds, the split ops it cuts at, the pieces).

``drive(eager=True)`` is the same runner without ``install_torch_compiled``: the same warm-up
forwards, contexts, inputs and stand-ins, run eagerly. ``forward.output`` then runs one more
forward and returns the logits.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fp4lab.compile import target, trace
from fp4lab.compile.audit import simulation
from fp4lab.serving.replay.release import (
    backend_graphs,
    inside,
    kernels,
    model,
    reworked,
    setup_standins,
)

RUNNER = "sglang.srt.model_executor.piecewise_cuda_graph_runner"
LOGGER = "sglang.srt.model_executor.model_runner"
ENTRY = f"{LOGGER}.ModelRunner.init_piecewise_cuda_graphs"
INIT = f"{LOGGER}.ModelRunner.__init__"

INIT_STANDINS = (
    kernels.record("init_torch_distributed", f"{LOGGER}.ModelRunner.init_torch_distributed",
                   "it sets the CUDA device and builds the NCCL groups; the one-process gloo "
                   "groups are set up already, and the simulated GPU's memory is returned"),
    kernels.record("model_runner_initialize", f"{LOGGER}.ModelRunner.initialize",
                   "it loads the model, builds the KV pools, the attention backend and the "
                   "decode CUDA graphs on the GPU; the built model and the runner host's "
                   "values (model.host_values) are set instead"),
)  # fmt: skip
"""What ``ModelRunner.__init__`` calls that is stood in for, where it is the entry."""

CAPTURE = kernels.record(
    "cuda_graph_capture_not_run", f"{RUNNER}.PiecewiseCudaGraphRunner.capture",
    "capturing CUDA graphs needs a CUDA GPU; the runner's compile warm-up before it runs whole, "
    "and inside it the piecewise backend returns before any capture",
)  # fmt: skip
POOL = kernels.record("graph_pool_handle", "torch.cpu.graph_pool_handle",
                       "the runner asks its device module for a CUDA graph memory pool handle; "
                       "an opaque object stands for it (nothing is captured)")  # fmt: skip
EAGER = kernels.record("eager_pass", f"{RUNNER}.install_torch_compiled",
                        "the eager pass is the same runner with install_torch_compiled left out")  # fmt: skip


@dataclass
class Run:
    """One pass of the release's piecewise runner over its GLM-5."""

    compiled: inside.Compiled
    graphs: backend_graphs.Graphs
    eager: bool
    runner: Any = None

    def as_record(self) -> dict:
        splits = self.graphs.splits
        return {
            **self.compiled.as_record(),
            "eager": self.eager,
            "graph_custom_ops": self.graphs.custom(),
            "split_ops_used": sorted({op for s in splits for op in s["split_ops"]}),
            "split_op_calls": [s["split_op_calls"] for s in splits],
            "expected_pieces": sum(s["split_op_calls"] + 1 for s in splits) if splits else None,
            "cut_pieces": sum(s["pieces"] for s in splits) if splits else None,
        }


def standins(built: model.Built) -> list[dict]:
    """The stand-ins of every pass: the capture, the pool handle, the eager pass's and, where
    ``__init__`` is the entry, ``INIT_STANDINS``; in a reworked release its own (``reworked``)."""
    if built.reworked:
        return [reworked.CAPTURE, POOL, reworked.DEVICE, *reworked.HOST_STANDINS, reworked.EAGER]
    init = [] if hasattr(built.host, "init_piecewise_cuda_graphs") else list(INIT_STANDINS)
    return [CAPTURE, POOL, *init, EAGER]


def _release_init(built: model.Built, sm: tuple[int, int]) -> None:
    """The release's ``ModelRunner.__init__`` on the host, one rank of one GPU, its
    ``INIT_STANDINS`` in place."""
    cls = type(built.host)
    memory = setup_standins.gpu_memory_mib(sm) / 1024  # GB, as init_torch_distributed returns

    def initialize(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, value in model.host_values(built).items():
            setattr(self, name, value)

    given = {"model_config": built.model_config, "server_args": built.server_args,
             "mem_fraction_static": built.server_args.mem_fraction_static, "gpu_id": 0,
             "tp_rank": 0, "tp_size": 1, "moe_ep_rank": 0, "moe_ep_size": 1, "pp_rank": 0,
             "pp_size": 1, "nccl_port": 0, "dp_rank": None, "is_draft_worker": False}  # fmt: skip
    wanted = inspect.signature(cls.__init__).parameters
    with (
        target.attribute_replaced(cls, "init_torch_distributed", lambda self: memory),
        target.attribute_replaced(cls, "initialize", initialize),
    ):
        cls.__init__(built.host, **{k: v for k, v in given.items() if k in wanted})


@contextlib.contextmanager
def logged(name: str) -> Iterator[list[str]]:
    """The messages logger ``name`` logs meanwhile at INFO and above (its level lowered to INFO
    for the while if higher)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger, handler = logging.getLogger(name), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level if logging.NOTSET < level <= logging.INFO else logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def declined_reason(lines: list[str]) -> str | None:
    """The last logged line about piecewise (or prefill) CUDA graphs: why the release built no
    runner."""
    words = ("piecewise", "prefill cuda graph")
    return next((line for line in reversed(lines) if any(w in line.lower() for w in words)), None)


def _built_runner(built: model.Built) -> Any:
    """The piecewise runner the release built on the host, or None (a reworked release that
    declines routes prefill to its ``EagerRunner``)."""
    if not built.reworked:
        return built.host.piecewise_cuda_graph_runner
    found = getattr(built.host, "prefill_cuda_graph_runner", None)
    return found if type(found).__name__ == "PrefillCudaGraphRunner" else None


def _fullgraph_false(install: Any) -> Any:
    """``install_torch_compiled`` with ``fullgraph=False`` whatever its caller passes: the line a
    user would have to change in the release (no server option reaches it)."""

    def installed(module: Any, **kwargs: Any) -> Any:
        return install(module, **{**kwargs, "fullgraph": False})

    return installed


@contextlib.contextmanager
def _entered(built: model.Built, sm: tuple[int, int], eager: bool, capture: Any,
             fullgraph: bool) -> Iterator[tuple]:  # fmt: skip
    """The release's piecewise set-up made runnable here; yields the call that runs it, the
    entry's name and the contexts its runner compiles in."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(target.attribute_replaced(torch.cpu, "graph_pool_handle", object))
        if built.reworked:
            stack.enter_context(simulation.simulated_cuda(sm))
            run = stack.enter_context(reworked.driven(eager))
            yield run, reworked.ENTRY, [reworked.RUNNER + ".PrefillCudaGraphRunner.__init__"]
            return
        pcgr = __import__(RUNNER, fromlist=["PiecewiseCudaGraphRunner"])
        if capture is None:
            stack.enter_context(target.attribute_replaced(pcgr.PiecewiseCudaGraphRunner, "capture",
                                                          lambda self: None))  # fmt: skip
        else:
            stack.enter_context(_capturing(pcgr.PiecewiseCudaGraphRunner, capture))
        stack.enter_context(kernels.device_queries(sm))
        if eager:
            stack.enter_context(target.attribute_replaced(pcgr, "install_torch_compiled",
                                                          lambda module, **kwargs: module))  # fmt: skip
        elif not fullgraph:
            stack.enter_context(target.attribute_replaced(
                pcgr, "install_torch_compiled", _fullgraph_false(pcgr.install_torch_compiled)))  # fmt: skip
        contexts = [RUNNER + ".PiecewiseCudaGraphRunner.__init__"]
        entry = getattr(built.host, "init_piecewise_cuda_graphs", None)
        if entry is not None:
            yield (lambda host: entry()), ENTRY, contexts
        else:
            yield (lambda host: _release_init(built, sm)), INIT, contexts


def _capturing(runner_class: type, before: Any) -> contextlib.AbstractContextManager:
    """The runner's own ``capture``, with ``before`` called first (the compile pass is over)."""
    capture = runner_class.capture

    def captured(self: Any) -> None:
        before()
        capture(self)

    return target.attribute_replaced(runner_class, "capture", captured)


def drive(built: model.Built, sm: tuple[int, int], *, eager: bool = False, capture: Any = None,
          fullgraph: bool = True) -> Run:  # fmt: skip
    """The release's piecewise set-up on ``built`` (see the module docstring); never raises for
    a compile failure. With ``capture`` (called with the graphs SGLang's backend received, when
    the compile pass is over) the runner's own capture runs too, taken by a GPU or by the caller's
    recorder (``capture.recorder``); ``fullgraph=False`` is passed to ``install_torch_compiled``
    as a user's edit of the release would."""
    torch._dynamo.reset()
    language = getattr(built.model, "language_model", built.model)
    language.model.__dict__.pop("forward", None)  # an earlier pass's trampoline
    built.host.piecewise_cuda_graph_runner = built.host.prefill_cuda_graph_runner = None
    outcome = trace.TraceOutcome(status="compiled", fullgraph=True, backend="sglang", seconds=0.0)
    before, cause, found = inside.counter(), "", []
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        graphs = stack.enter_context(backend_graphs.observed())
        hook = None if capture is None else lambda: capture(graphs)
        run, name, contexts = stack.enter_context(_entered(built, sm, eager, hook, fullgraph))
        lines = stack.enter_context(logged("sglang"))
        try:
            run(built.host)
        except Exception as exc:  # a compile failure is what is measured
            cause, found = inside.failed(outcome, exc)
    built_runner = _built_runner(built)
    if outcome.status == "compiled" and built_runner is None:
        outcome.status, outcome.message = "declined", declined_reason(lines)
    outcome.seconds = time.perf_counter() - started
    after = inside.counter()
    counts = {k: after[k] - before[k] for k in after}
    if outcome.status == "compiled":
        outcome.graph_count, outcome.graph_break_count = counts["num_graphs_seen"], 0
    compiled = inside.Compiled(outcome, counts, backend_graphs.config_split_ops(), contexts, found, cause,
                               entry=name)  # fmt: skip
    return Run(compiled, graphs, eager, built_runner)


def unlisted_moe(built: model.Built) -> list[int]:
    """The decoder layers holding a ``FusedMoE`` that the release's own prefill-graph layer table
    (``ModelRunner.moe_layers``, filled by its set-up; its MoE split op looks a layer up there)
    lists as None; empty where it keeps no table or lists every one."""
    table = getattr(built.host, "moe_layers", None) or []
    stack = getattr(built.model, "language_model", built.model)
    while not hasattr(stack, "layers") and hasattr(stack, "model"):
        stack = stack.model
    return [i for i, (layer, listed) in enumerate(zip(getattr(stack, "layers", []), table, strict=False))
            if listed is None and any(any(c.__name__ == "FusedMoE" for c in type(m).__mro__)
                                      for m in layer.modules())]  # fmt: skip
