"""Inside one SGLang environment: a simulated capture's stand-ins for ``torch.cuda.CUDAGraph``
(a breakable segment) and ``torch.cuda.graph`` (a full graph), and what they flag inside an open
segment: a host sync a real capture refuses (a GPU tensor's value read or copied to the host,
``devices.OnGpu``) apart from a host tensor's value read (frozen into the graph, allowed), a copy
of unpinned host memory into the GPU, what CUDA's stream-capture rules refuse across streams
(``streams``), an allocation outside the graph's pool (``graph_pools``), a collective no replay
repeats (``collectives``), and a JIT build the warm-ups did not ask for (its module compiled and
loaded while the stream captures)."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import frames
from fp4lab.serving.capture import recorder
from fp4lab.serving.replay.release import collectives, devices, graph_pools, kernels
from fp4lab.serving.replay.release.streams import Streams

HOST_SYNCS = {torch.ops.aten._local_scalar_dense, torch.ops.aten.nonzero}
"""Operators that wait for the GPU (``.item()``, ``nonzero``): a capturing stream refuses them."""


@dataclass
class Capture:
    """What the segments saw: the open segment's bucket and index, and the flags (each what a
    real capture refuses, where: its bucket, segment and the frame that asked)."""

    bucket: int = 0
    segment: int = 0
    flags: list[dict] = field(default_factory=list)
    host_reads: list[dict] = field(default_factory=list)
    asked: dict[str, bool] = field(default_factory=dict)
    built: set[str] = field(default_factory=set)
    gpu: devices.OnGpu | None = None
    streams: Streams = field(init=False)
    pools: graph_pools.Pools = field(init=False)
    collectives: collectives.Collectives = field(init=False)

    def __post_init__(self) -> None:
        self.streams = Streams(lambda what: self.flag(what, kernels_too=True),
                               lambda: frames.release_frame(traceback.extract_stack()))  # fmt: skip
        self.pools = graph_pools.Pools(self.streams.capturing, self.flag)
        self.collectives = collectives.Collectives(lambda: self.open, self.flag)

    def begin(self, pool: Any) -> None:
        """A segment's capture opens on the current stream, allocating from ``pool``."""
        self.segment += 1
        self.builds(closing=False)
        self.streams.begin()
        self.pools.begin_capture(pool)

    def end(self) -> None:
        self.streams.end()
        self.pools.end_capture()
        self.builds(closing=True)

    @property
    def open(self) -> bool:
        """Whether a segment is being captured (its stream capture open)."""
        return self.streams.capture != 0

    def flag(self, what: str, into: list[dict] | None = None, kernels_too: bool = False) -> None:
        """Keep ``what`` with where it was asked; an operator a stand-in kernel issues is its GPU
        kernel's own work and not flagged, unless ``kernels_too`` (a launch on a stream)."""
        stack = traceback.extract_stack()[:-2]
        if not kernels_too and _inside_standin(stack):
            return
        frame = frames.release_frame(stack)
        (self.flags if into is None else into).append(
            {"what": what, "bucket": self.bucket, "segment": self.segment, "frame": frame}
        )

    def copied_to_host(self, name: str) -> None:
        if self.open:
            self.flag(f"host sync {name} (a GPU tensor copied to the host)")

    def copied_from_host(self, name: str) -> None:
        if self.open:
            self.flag(f"host-to-GPU copy {name} from unpinned host memory (torch's capture "
                      "refuses it; older torch replays a host address nothing keeps alive)")  # fmt: skip

    def builds(self, closing: bool) -> None:
        """At a segment's start, the JIT builds asked for so far (the warm-ups', earlier
        segments'); at its end, each build first asked for while it was open is flagged: its
        module is compiled and loaded while the stream captures."""
        log = os.environ.get("FP4LAB_REFUSED_BUILDS")
        for name in kernels.build_names(Path(log)) if log else []:
            if closing and name not in self.built:
                self.flags.append({"what": f"JIT build of {name} (the warm-ups did not build it)",
                                   "bucket": self.bucket, "segment": self.segment,
                                   "frame": "ninja (the build the open segment asked for)"})  # fmt: skip
            self.built.add(name)


STANDIN_CODE = (
    "fp4lab/serving/replay/release/cpu_",
    "fp4lab/serving/replay/release/kernels.py",
    "fp4lab/serving/replay/release/reached.py",
    "fp4lab/serving/replay/release/attention.py",
    "fp4lab/compile/fix.py",
    "fp4lab/fp4/",
)
"""fp4lab's stand-in kernels (and the references they call): their own operators are a GPU
kernel's work, not the release's."""


def _inside_standin(stack: list[traceback.FrameSummary]) -> bool:
    """Whether the operator was called by a stand-in kernel (``STANDIN_CODE``) rather than the
    release: the first frame, from the operator out, outside torch and fp4lab's watching code
    (its modes, recorder) is a stand-in's."""
    for f in reversed(stack):
        where = frames.relative_path(f.filename)
        if where.startswith(STANDIN_CODE):
            return True
        if not where.startswith(("torch/", "fp4lab/")):
            return False
    return False


class _Watching(recorder._Recording):
    """The recorder's mode, flagging host syncs into ``capture``."""

    def __init__(self, into: recorder.RecordedGraph, capture: Capture) -> None:
        super().__init__(into)
        self.capture = capture

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.capture.streams.issued()
        if func.overloadpacket in HOST_SYNCS:
            name, gpu = func.overloadpacket.__name__, self.capture.gpu
            if gpu is None or gpu.holds(args, kwargs):
                self.capture.flag(f"host sync {name}")
            else:  # a host tensor: its value is frozen into the graph, a capture allows it
                self.capture.flag(f"host read {name}", self.capture.host_reads)
        return super().__torch_dispatch__(func, types, args, kwargs)


def segment_class(capture: Capture) -> type:
    """``torch.cuda.CUDAGraph`` for the breakable capture: ``capture_begin`` opens a recording,
    ``capture_end`` closes it, ``replay`` re-runs it (``recorder.RecordedGraph``)."""

    class Segment(recorder.RecordedGraph):
        def __init__(self, keep_graph: bool = False) -> None:
            super().__init__()
            self.mode: _Watching | None = None

        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
            capture.begin(pool)
            self.mode = _Watching(self, capture)
            self.mode.__enter__()

        def capture_end(self) -> None:
            if self.mode is None:
                raise RuntimeError("capture_end without capture_begin")
            self.mode.__exit__(None, None, None)
            capture.end()
            self.mode = None

    return Segment


def whole_class(capture: Capture) -> type:
    """``torch.cuda.graph`` for the full capture: the whole block one recorded graph."""

    class Whole(recorder.graph):
        def __init__(
            self, cuda_graph: Any, pool: Any = None, stream: Any = None, **kwargs: Any
        ) -> None:
            self.mode, self.pool = _Watching(cuda_graph, capture), pool

        def __enter__(self) -> None:
            capture.begin(self.pool)
            self.mode.__enter__()

        def __exit__(self, *exc: object) -> None:
            self.mode.__exit__(*exc)
            capture.end()

    return Whole
