"""Inside one SGLang environment: ``weak_ref_tensor``'s stand-in, and which tensors a captured
prefill graph holds by weak reference only once its capture is over.

Every breakable release here keeps each break's inputs as ``weak_ref_tensor`` views (0.5.15 its
output too). On a GPU such a view does not own its memory: once the release drops its other
references, the block is free in the graph pool, and a bucket captured later is carved from it
(sglang#37606: wrong output or an illegal memory access; its fix, sglang#37448, is in no release
here). From 0.5.20 the release keeps CPU tensors as they are, so it is asked of a tensor that
stands for a GPU one with that tensor's device read as the GPU's (``seen_on_gpu``). A CPU
cannot read freed memory safely, so the stand-in's view shares the tensor's storage
and keeps it alive; once the capture and its replays are over, a storage no tensor holds but the
views is memory the release has let go.
"""

from __future__ import annotations

import contextlib
import gc
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4lab.compile import frames

UPSTREAM = "sglang#37606"
"""Upstream's report of what a weak-referenced break input does on a GPU."""


@dataclass
class Held:
    """One ``weak_ref_tensor`` view the release took: the view, its bucket, where it was taken."""

    view: torch.Tensor
    bucket: int
    frame: str


@dataclass
class Watched:
    """The views taken while a capture is watched (``active``); ``bucket`` names the open one."""

    bucket: Callable[[], int]
    held: list[Held] = field(default_factory=list)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        _WATCHING.append(self)
        try:
            yield
        finally:
            _WATCHING.remove(self)


_WATCHING: list[Watched] = []


def weak_ref(tensor: Any) -> Any:
    """``weak_ref_tensor``'s stand-in: the tensor itself, or, while a capture is watched, a view
    of its storage (of the tensor an ``_OnGpu`` stands for), kept with its bucket and the
    release's frame that asked."""
    if not _WATCHING or not isinstance(tensor, torch.Tensor):
        return tensor
    view = getattr(tensor, "stands_for", tensor).detach()
    where = frames.release_frame(traceback.extract_stack(), skip=("_weak_ref_if_tensor",))
    _WATCHING[-1].held.append(Held(view, _WATCHING[-1].bucket(), where))
    return view


class _OnGpu(torch.Tensor):
    """A CPU tensor that stands for a GPU one (``stands_for``), its device read as the GPU's."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def seen_on_gpu(release_fn: Callable[[Any], Any], on_gpu: Callable[[Any], bool]) -> Callable:
    """The release's ``_weak_ref_if_tensor`` asked of a tensor that stands for a GPU one
    (``on_gpu``) with its device read as the GPU's: from 0.5.20 it keeps a CPU tensor as it is,
    which every tensor of a simulated capture is; anything else is asked as given."""

    def asked(x: Any) -> Any:
        if not (isinstance(x, torch.Tensor) and on_gpu(x)):
            return release_fn(x)
        seen = x.as_subclass(_OnGpu)
        seen.stands_for = x
        got = release_fn(seen)
        return x if got is seen else got

    return asked


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _free(watched: Watched) -> dict[int, bool]:
    """Each held storage: whether nothing but its views holds it."""
    probe = torch.empty(1)
    extra = torch._C._storage_Use_Count(_storage(probe)) - 1  # a storage's own Python object
    views = Counter(_storage(h.view) for h in watched.held)  # each call made its own view
    return {s: torch._C._storage_Use_Count(s) == n + extra for s, n in views.items()}


def released(watched: Watched, recorded: Iterable[Any], order: list[int]) -> dict:
    """Which views' memory only the views hold once the capture and its replays are over: the
    recorder's graphs (``recorded``, nothing replays them after this) let go of their tensors
    first, so a storage's use count beyond its views' is the release's. ``order``: the buckets
    as they were captured; ``at_risk``: released in a bucket another was captured after."""
    for graph in recorded:
        getattr(graph, "ops", []).clear()
    frees = _free(watched)
    if not all(frees.values()):  # a collection frees more, never less: run it where it may
        gc.collect()  # (a full one walks the whole heap, which the release's capture unfroze)
        frees = _free(watched)
    by_frame: dict[str, dict[str, int]] = {}
    for h in watched.held:
        free = frees[_storage(h.view)]
        later = h.bucket in order and order.index(h.bucket) < len(order) - 1
        row = by_frame.setdefault(h.frame, {"held": 0, "released": 0, "at_risk": 0})
        row["held"] += 1
        row["released"] += free
        row["at_risk"] += free and later
    total = {k: sum(r[k] for r in by_frame.values()) for k in ("held", "released", "at_risk")}
    return {**total, "frames": by_frame, "capture_order": order, "upstream": UPSTREAM}
