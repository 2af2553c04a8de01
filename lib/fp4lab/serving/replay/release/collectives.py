"""Inside one SGLang environment: the ``torch.distributed`` collectives of a simulated capture,
so that a collective inside an open segment that no replay repeats is flagged.

The release builds each group twice (``GroupCoordinator``): a device group (NCCL on a GPU, gloo
on this machine) and a CPU group (gloo). Inside an open capture:

* a tensor collective on a device group is NCCL's kernel on the capturing stream, which the graph
  holds (counted);
* a collective on a CPU group runs on the host, once, at capture: no replay repeats it (flagged);
* a barrier or an object collective (pickled through host memory) waits on the host, whatever
  its group (flagged).

Outside an open segment (warm-ups, a break, the capture's barrier between segments) a collective
runs eagerly, as on a GPU (counted).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed

from fp4lab.compile import target

TENSOR = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
          "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single",
          "gather", "scatter", "send", "recv", "isend", "irecv")  # fmt: skip
"""``torch.distributed``'s tensor collectives: NCCL kernels on a device group."""
ON_HOST = ("barrier", "monitored_barrier", "all_gather_object", "broadcast_object_list",
           "gather_object", "scatter_object_list", "send_object_list", "recv_object_list")  # fmt: skip
"""``torch.distributed``'s collectives that wait on the host whatever the group."""


def _groups() -> dict[int, str]:
    """Each process group of the release's coordinators by id: '<name>'s device group' or
    '<name>'s CPU group'."""
    state = importlib.import_module("sglang.srt.distributed.parallel_state")
    found = {}
    for name, ref in getattr(state, "_groups", {}).items():
        coordinator = ref()
        for kind in ("device", "cpu"):
            group = getattr(coordinator, f"{kind}_group", None)
            if group is not None:
                found[id(group)] = f"{name}'s {kind.replace('cpu', 'CPU')} group"
    return found


class Collectives:
    """The collectives seen (``seen``); ``open`` answers whether a segment is being captured,
    ``flag`` is called with a collective that leaves the graph."""

    def __init__(self, open: Callable[[], bool], flag: Callable[[str], None]) -> None:
        self.open, self.flag = open, flag
        self.seen = {"in_segments": 0, "outside_segments": 0}

    def called(self, name: str, group: Any) -> None:
        if not self.open():
            self.seen["outside_segments"] += 1
            return
        said = "the default group" if group is None else _groups().get(id(group), "a group")
        if name in ON_HOST:
            self.flag(f"collective {name} on {said} (it waits on the host: it runs once, at "
                      "capture, and is in no replay)")  # fmt: skip
        elif said.endswith("CPU group"):
            self.flag(f"collective {name} on {said} (gloo: it runs on the host once, at capture, "
                      "and is in no replay)")  # fmt: skip
        else:
            self.seen["in_segments"] += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Each of ``torch.distributed``'s collectives the release calls going through this
        record first."""

        def watched(name: str, collective: Callable) -> Callable:
            signature = inspect.signature(collective)

            def call(*args: Any, **kwargs: Any) -> Any:
                self.called(name, signature.bind_partial(*args, **kwargs).arguments.get("group"))
                return collective(*args, **kwargs)

            return call

        with contextlib.ExitStack() as stack:
            for name in (*TENSOR, *ON_HOST):
                collective = getattr(torch.distributed, name)
                stack.enter_context(
                    target.attribute_replaced(torch.distributed, name, watched(name, collective))
                )
            yield
