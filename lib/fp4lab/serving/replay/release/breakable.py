"""Inside one SGLang environment: the release's breakable (0.5.15 on) or full prefill CUDA
graphs, captured by its own runner and replayed.

``drive`` calls the release's ``ModelRunner.init_cuda_graphs(capture_decode_cuda_graph=False)``
on the model's runner host, its resolution set to the graph: ``PrefillCudaGraphRunner`` runs its
own warm-up, ``graph_capture``, its backend's ``capture_session`` and, per token bucket, largest
first, ``capture_one_shape`` (two eager warm-ups, then the capture: ``BreakableCudaGraphBackend``
opens a ``torch.cuda.CUDAGraph`` segment after each ``eager_on_graph`` break, which it runs once
and keeps for replay; ``FullCudaGraphBackend`` captures the whole body in ``torch.cuda.graph``).
What stands in is only the capture's boundary (``CAPTURE_STANDINS``): a segment records the
operators it dispatches, with their tensors, and replays them in place.

Then, per compared bucket, the runner's static input ids get fresh values, the captured forward
runs eagerly and the backend's own ``replay`` (segments and breaks in order) runs in the runner's
forward context; the two outputs are compared. Inside an open segment the recorder flags what a
real capture refuses (``segments``): a host sync (a GPU tensor's value read or copied to the
host, ``torch.cuda.synchronize``) and, by CUDA's stream-capture rules (``streams``), a side stream
never joined, a wait on an event from outside the capture, work on a stream not capturing; by the
caching allocator's routing (``graph_pools``), an allocation outside the graph's pool; a collective
no replay repeats (``collectives``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4lab.compile import frames, target
from fp4lab.compile.audit import simulation
from fp4lab.serving.capture import recorder
from fp4lab.serving.replay.release import (
    attention,
    devices,
    inside,
    kernels,
    replayed,
    reworked,
    runner,
    segments,
    weak_refs,
)
from fp4lab.serving.replay.release.failed import failure
from fp4lab.serving.replay.shared import breakable_outcome

BACKENDS = {"breakable": ("sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend",
                         "BreakableCudaGraphBackend"),
            "full": ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend",
                     "FullCudaGraphBackend")}  # fmt: skip
"""Each prefill graph captured here: the module and class of the release's backend for it."""
GRAPH = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph"

COMPARED = 3
"""Buckets replayed and compared with eager: the smallest captured ones of the plain shape (a
variant, such as 0.5.2x's chunked-prefix graphs, is captured, not compared), after every
capture."""

CAPTURE_STANDINS = [
    kernels.record("breakable_segment_recorder", "torch.cuda.CUDAGraph (capture_begin, "
                   "capture_end, instantiate, replay)",
                   "no CUDA device: each segment records the operators it dispatches, with their "
                   "tensors, and a replay re-runs them on those tensors (fixed addresses); the "
                   "graph pool's memory reuse is not imitated: a tensor the release holds only by "
                   "weak reference keeps its memory here, and is counted (``weak_refs``)"),
    kernels.record("capture_status", f"{GRAPH}._is_stream_capturing, "
                   "torch.cuda.is_current_stream_capturing",
                   "cuda-python's cudaStreamGetCaptureInfo and torch's query need a CUDA stream: "
                   "answered by CUDA's capture rules as the capture's streams and events were "
                   "used (``streams``)"),
    kernels.record("graph_pools", "torch.cuda.MemPool, torch._C._cuda_beginAllocate*ToPool, "
                   "_cuda_endAllocate*ToPool, _cuda_releasePool",
                   "no CUDA caching allocator: the pool each GPU allocation would go to is kept "
                   "by the allocator's routing rule (``graph_pools``), no memory is pooled"),
    kernels.record("graph_streams", "torch.cuda.Stream, stream, current_stream, Event",
                   "torch.cpu's streams, their id standing for stream_id and cuda_stream; work runs "
                   "in order on the CPU, and forks, joins and waits are kept to flag what a real "
                   "capture refuses across streams"),
    kernels.record("record_stream", "torch.Tensor.record_stream",
                   "the caching allocator's cross-stream bookkeeping: no CUDA allocator here"),
    kernels.record("graph_pool_handle", "torch.cpu.graph_pool_handle", "an opaque object: the pool"),
    kernels.record("weak_ref_device", f"{GRAPH}._weak_ref_if_tensor",
                   "the release's own function, asked of a tensor that stands for a GPU one with "
                   "its device read as the GPU's: from 0.5.20 it keeps CPU tensors as they are, "
                   "and every tensor of the simulated capture is one (``weak_refs.seen_on_gpu``)"),
    kernels.record("kv_index_translator_allocator", "ModelRunner.init_kv_index_translator",
                   "the release's own translator, over the stand-in KV pool, with no KV "
                   "allocator (nothing is allocated in the cache)"),
    kernels.record("release_attention_defaults", "layers.attention.base_attn_backend.AttentionBackend",
                   "the stand-in attention backend takes the release's base class's defaults for "
                   "what a prefill graph runner asks of it, and the answers of the class the "
                   "release's registry builds where that class holds them"),
    kernels.record("replay_inputs", "PrefillCudaGraphRunner.load_batch",
                   "a replay writes fresh input ids into the runner's static slot and runs in "
                   "the runner's forward context for the captured batch, where load_batch would "
                   "copy a request in"),
]  # fmt: skip


def _attention_defaults(host: Any, capture: segments.Capture) -> dict:
    """The stand-in attention backend with the release's base class under it (its defaults),
    answering ``attention.CAPABILITIES`` as the class the release builds does, each question
    asked kept in ``capture.asked``; returns that class and its answers
    (``attention.release_backend``)."""
    base = kernels.attribute("sglang.srt.layers.attention.base_attn_backend", "AttentionBackend")
    ours = type(host.attn_backend)
    real = attention.release_backend(host)

    def answer(name: str, value: bool) -> property:
        def asked(self: Any) -> bool:
            capture.asked[name] = value
            return value

        return property(asked)

    if base is not None and not issubclass(ours, base):
        borrowed = {c: answer(c, v) for c, v in real.get("capabilities", {}).items()}
        host.attn_backend.__class__ = type(breakable_outcome.STAND_IN, (ours, base),
                                           {"__abstractmethods__": frozenset(), **borrowed})  # fmt: skip
    return real


@dataclass
class Captured:
    """The runner's captured buckets: each one's forward and batch, kept for the replay."""

    forwards: dict[Any, Any] = field(default_factory=dict)
    batches: dict[int, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _boundary(sm: tuple[int, int], capture: segments.Capture, captured: Captured) -> Iterator[None]:
    """The capture's boundary stood in for (``CAPTURE_STANDINS``), each bucket's forward and
    batch kept, the synchronize calls inside an open segment flagged."""
    backends = [kernels.attribute(*where) for where in BACKENDS.values()]
    runner_class = kernels.attribute(reworked.RUNNER, "PrefillCudaGraphRunner")
    graph_module = __import__(GRAPH, fromlist=["_is_stream_capturing"])
    prepare, synchronize = runner_class.capture_prepare, torch.cuda.synchronize

    def kept(capture_one: Any) -> Any:
        def kept_capture_one(self: Any, shape_key: Any, forward_fn: Any, *args: Any,
                             **kwargs: Any) -> Any:  # fmt: skip
            captured.forwards[shape_key] = forward_fn
            capture.bucket, capture.segment = shape_key.size, 0
            return capture_one(self, shape_key, forward_fn, *args, **kwargs)

        return kept_capture_one

    def kept_prepare(self: Any, num_tokens: int) -> Any:
        found = prepare(self, num_tokens)
        captured.batches[num_tokens] = found[0]
        return found

    def watched_synchronize(*args: Any, **kwargs: Any) -> Any:
        if capture.open:
            capture.flag("host sync torch.cuda.synchronize")
        return synchronize(*args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(target.attribute_replaced(torch.cpu, "graph_pool_handle", object))
        stack.enter_context(simulation.simulated_cuda(sm))
        stack.enter_context(inside.CudaOnCpu())
        stack.enter_context(recorder.simulated())
        for name in ("stream_id", "cuda_stream"):  # what the capture asks a stream for
            stack.enter_context(target.attribute_replaced(torch.cpu.Stream, name, property(id)))
        stack.enter_context(
            target.attribute_replaced(torch.cuda, "CUDAGraph", segments.segment_class(capture))
        )
        stack.enter_context(
            target.attribute_replaced(torch.cuda, "synchronize", watched_synchronize)
        )
        stack.enter_context(target.attribute_replaced(graph_module, "_is_stream_capturing",
                                                      capture.streams.capturing))  # fmt: skip
        if hasattr(graph_module, "_weak_ref_if_tensor"):
            stack.enter_context(target.attribute_replaced(
                graph_module, "_weak_ref_if_tensor",
                weak_refs.seen_on_gpu(graph_module._weak_ref_if_tensor, capture.gpu.holds)))  # fmt: skip
        stack.enter_context(capture.streams.installed())
        stack.enter_context(capture.pools.installed())
        stack.enter_context(capture.collectives.installed())
        for owner in (torch._C, torch.cuda.graphs):  # torch's own capture query
            stack.enter_context(target.attribute_replaced(
                owner, "_cuda_isCurrentStreamCapturing",
                lambda: capture.streams.capturing(torch.cpu.current_stream())))  # fmt: skip
        stack.enter_context(target.attribute_replaced(torch.Tensor, "record_stream",
                                                      lambda tensor, stream: None))  # fmt: skip
        for module in (torch.cuda, torch.cpu):  # the runner's device module is the host's CPU
            stack.enter_context(
                target.attribute_replaced(module, "graph", segments.whole_class(capture))
            )
        for backend in filter(None, backends):
            stack.enter_context(target.attribute_replaced(backend, "capture_one",
                                                          kept(backend.capture_one)))  # fmt: skip
        stack.enter_context(
            target.attribute_replaced(runner_class, "capture_prepare", kept_prepare)
        )
        yield


def _break_name(replay_fn: Any) -> str:
    """The function an ``eager_on_graph`` break runs: ``file:line:name``, or an op's name."""
    cells = dict(zip(replay_fn.__code__.co_freevars, replay_fn.__closure__ or (), strict=False))
    inner = getattr(cells.get("captured_inner"), "cell_contents", None)
    code = getattr(inner, "__code__", None)
    if code is None:
        return str(getattr(inner, "__name__", None) or "unknown")  # an op: no Python code
    return f"{frames.relative_path(code.co_filename)}:{code.co_firstlineno}:{code.co_name}"


def _variant(key: Any) -> str | None:
    """A captured shape's variant (0.5.2x: a prefix or attention variant; None: the plain one)."""
    return getattr(key, "variant_label", None) or getattr(key, "attention_variant", None)


def drive(host: Any, sm: tuple[int, int]) -> dict:
    """The release's capture of every bucket, then ``COMPARED`` replays against eager;
    never raises for what the release does (a failure is the record's ``blocked``)."""
    capture, captured = segments.Capture(), Captured()
    host.token_to_kv_pool_allocator, host.page_size = None, host.server_args.page_size
    if hasattr(host, "init_kv_index_translator"):  # 0.5.2x
        host.init_kv_index_translator()
    found: dict[str, Any] = {"standins": CAPTURE_STANDINS}
    capture.gpu = devices.OnGpu(capture.copied_to_host, capture.copied_from_host, capture.pools)
    capture.gpu.mark(devices.resident(host))
    watched = weak_refs.Watched(lambda: capture.bucket)
    with torch.no_grad(), _boundary(sm, capture, captured), capture.gpu:
        real = _attention_defaults(host, capture)  # the factory reads the simulated GPU
        try:
            with runner.logged("sglang") as lines, watched.active():
                host.init_cuda_graphs(capture_decode_cuda_graph=False)
        except Exception as exc:  # the release's capture failed: what is measured
            asked = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
            found["blocked"] = failure(exc) | {
                "harness_object": asked is not None and (asked in (host, torch.cpu) or
                                                         type(asked).__module__.startswith("fp4lab"))}  # fmt: skip
        built = getattr(host, "prefill_cuda_graph_runner", None)
        if "blocked" not in found and type(built).__name__ != "PrefillCudaGraphRunner":
            found["declined"] = runner.declined_reason(lines) or "no line logged"
        graphs = getattr(getattr(built, "backend", None), "_graphs", {})
        found["backend"] = type(getattr(built, "backend", None)).__name__
        found["buckets"] = [  # a full graph is one segment with no breaks
            {"bucket": key.size, "variant": _variant(key),
             "segments": len(getattr(graph, "_segments", [graph])),
             "ops_per_segment": [len(s.ops) for s in getattr(graph, "_segments", [graph])],
             "breaks": [_break_name(fn) for fn in getattr(graph, "_break_fns", [])]}
            for key, graph in graphs.items()
        ]  # fmt: skip
        found["flags"], found["streams"] = capture.flags, capture.streams.seen
        found["collectives"] = capture.collectives.seen
        found["host_reads"] = [  # each frame once: where a host value is frozen into a graph
            {**r, "times": sum(o["frame"] == r["frame"] for o in capture.host_reads)}
            for r in {r["frame"]: r for r in reversed(capture.host_reads)}.values()
        ]
        found["attention"] = real | {"asked": capture.asked}
        if "blocked" not in found and graphs:
            generator = torch.Generator().manual_seed(1)
            plain = [k for k in graphs if _variant(k) is None] or list(graphs)
            keys = sorted(plain, key=lambda k: k.size)[:COMPARED]
            found["replays"] = [replayed.compare(built, captured, key, generator) for key in keys]
        recorded = [s for graph in graphs.values() for s in getattr(graph, "_segments", [graph])]
        found["weak_refs"] = weak_refs.released(watched, recorded,
                                                [key.size for key in captured.forwards])  # fmt: skip
    return found
