"""Inside one SGLang environment: the memory pool each allocation of a simulated capture goes to,
by the rule of torch's CUDA caching allocator, so that an allocation inside an open segment
outside the graph's private pool is flagged.

A capture begins routing its stream's allocations to the graph's pool; ``beginAllocateToPool``
routes more (``torch._C._cuda_beginAllocateToPool``: every stream; ``..CurrentThreadToPool``,
which ``torch.cuda.use_mem_pool`` calls: this thread) and ``endAllocateToPool`` stops one. An
allocation goes to the first pool begun whose filter takes its stream (the allocator's
``get_pool``), else to the default pool. So ``use_mem_pool`` inside a capture still allocates
from the graph's pool, and only a release that first ends the graph's routing (SGLang's
``SymmetricMemoryContext`` does) allocates elsewhere. Such memory is not reserved for the graph:
once freed, the allocator may give it to another tensor while the graph still writes it on every
replay (PyTorch's "Graph memory management"). Upstream met it: sglang#33037 forces
``--enable-symm-mem`` off under CUDA graphs on Kimi hybrid models, as an address taken from that
pool during capture is not reserved for the graph and output was silently corrupted; sglang#34230
routes such allocations into a pool of their own. The replay runs one rank, where the release
never enters its symmetric-memory context (``use_symmetric_memory``: off at world size 1).
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fp4lab.compile import frames, target

MADE_AT: dict[tuple[int, int], str] = {}
"""Each ``MemPool``'s id and the release's line that made it."""


class MemPool:
    """``torch.cuda.MemPool``: a user pool with an id (``MADE_AT``)."""

    def __init__(self, allocator: Any = None, *args: Any, **kwargs: Any) -> None:
        self.id, self.allocator = (0, len(MADE_AT) + 1), allocator
        MADE_AT[self.id] = frames.release_frame(traceback.extract_stack()[:-1])


class Pools:
    """The allocator's routing, (pool, filter) in the order begun; ``capturing`` answers whether a
    stream is in the open capture, ``flag`` is called with an allocation outside its pool."""

    def __init__(self, capturing: Callable[[Any], bool], flag: Callable[[str], None]) -> None:
        self.capturing, self.flag = capturing, flag
        self.routed: list[tuple[Any, Any]] = []  # filter: "capture", "any" (a thread's), a stream
        self.graph: Any = None  # the open capture's pool
        self.watching = False  # whether routing other than the capture's own is in place

    def begin_capture(self, pool: Any) -> None:
        self.graph = pool if pool is not None else object()
        self.routed, self.watching = [(self.graph, "capture")], False

    def end_capture(self) -> None:
        self.graph, self.routed, self.watching = None, [], False

    def begin(self, pool: Any, taken: Any) -> None:
        self.routed.append((pool, taken))
        self.watching = self.graph is not None

    def end(self, pool: Any) -> None:
        for i, (routed, _) in enumerate(self.routed):
            if routed == pool:  # the first route begun to it, as the allocator removes
                del self.routed[i]
                break
        self.watching = self.graph is not None

    def allocated(self, name: str) -> None:
        """A tensor allocated on the GPU by ``name``: flagged where, inside an open capture, the
        allocator gives it memory outside the graph's pool."""
        stream = torch.cpu.current_stream()
        if not self.watching or not self.capturing(stream):
            return
        pool = next((p for p, taken in self.routed if taken in ("capture", "any") or taken is stream),
                    None)  # fmt: skip
        if pool == self.graph:
            return
        where = (f"the MemPool made at {MADE_AT[pool]}" if pool in MADE_AT
                 else "the default pool (the graph's routing was ended)")  # fmt: skip
        self.flag(f"allocation by {name} into {where}, outside the graph's private pool (once "
                  "freed, the allocator may give it to another tensor while every replay still "
                  "writes it)")  # fmt: skip

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """``torch.cuda.MemPool`` and the routing bindings (in ``torch._C`` and wherever the
        release imported them) going through this record."""
        bindings = {
            "_cuda_beginAllocateToPool": lambda device, pool: self.begin(pool, "any"),
            "_cuda_beginAllocateCurrentThreadToPool": lambda device, pool: self.begin(pool, "any"),
            "_cuda_beginAllocateCurrentStreamToPool": lambda device, pool: self.begin(
                pool, torch.cpu.current_stream()
            ),
            "_cuda_endAllocateToPool": lambda device, pool: self.end(pool),
            "_cuda_endAllocateCurrentStreamToPool": lambda device, pool: self.end(pool),
            "_cuda_releasePool": lambda device, pool: None,
        }
        imported = [m for n, m in list(sys.modules.items()) if n.startswith("sglang.") and m]
        with contextlib.ExitStack() as stack:
            for module in (torch.cuda, torch.cuda.memory):
                stack.enter_context(target.attribute_replaced(module, "MemPool", MemPool))
            for name, binding in bindings.items():
                original = getattr(torch._C, name, None)
                for module in [torch._C, torch.cuda.memory, *imported]:
                    if module is torch._C or (original is not None and
                                              getattr(module, name, None) is original):  # fmt: skip
                        stack.enter_context(target.attribute_replaced(module, name, binding))
            yield
