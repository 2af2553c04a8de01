"""Inside one SGLang environment: which of the CPU tensors of a simulated capture stand for GPU
tensors, so that a read of a tensor's value inside an open segment is flagged as the host sync a
real capture refuses only where the real tensor is on the GPU.

A tensor is on the GPU where the release made it so (a ``cuda`` device asked of a factory,
``.cuda()``, ``.to("cuda")``), where it was on the GPU before the capture began (the model's
weights and buffers, the request-to-token pool), or where it was computed from one; a tensor the
release keeps on the host (``seq_lens_cpu``, a list made a tensor) is not, and reading it inside
a segment is kept apart: its value is frozen into the graph, a real capture does not refuse it.
A copy the other way, host data into a GPU tensor (``torch.tensor(data, device="cuda")``,
``.to("cuda")`` or ``.cuda()`` of a host tensor, ``gpu.copy_(host)``), reads host memory the
release did not pin (pinning fails on this machine, so none that reaches a copy here is pinned):
torch's capture refuses it, and a torch without that check replays from a host address nothing
keeps alive (pytorch#172156, pytorch#171894).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

TO_HOST = {torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.numpy}
"""Tensor methods that copy a tensor's values to the host (a device-to-host copy from the GPU)."""
WITH_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
"""Factories that copy their data (host data unless it is a GPU tensor) into the new tensor."""


def _gpu_device(device: Any) -> bool:
    return (isinstance(device, int) and not isinstance(device, bool)) or str(device).startswith(
        "cuda"
    )


DEVICE = torch.Tensor.device.__get__
"""What ``tensor.device`` calls (a new ``torch.device`` each time)."""


def _to_host(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether the call copies to the host: ``TO_HOST``, or ``.to("cpu")`` that blocks."""
    if func in TO_HOST:
        return True
    return (func is torch.Tensor.to and not kwargs.get("non_blocking")
            and any(str(a) == "cpu" for a in [*args[1:], kwargs.get("device")]))  # fmt: skip


class OnGpu(TorchFunctionMode):
    """Tensors marked as on the GPU (``mark``), each result of a call marked where the call asks
    for the GPU or reads a marked tensor; ``to_host`` is called with each copy of a marked tensor
    to the host, ``from_host`` with each copy of host data into the GPU (its function's name);
    ``pools`` (``graph_pools.Pools``), while it watches, with each new GPU tensor's allocation.
    While dynamo traces a release's ``torch.compile``'d helper, each call passes through unseen:
    the helper runs as compiled code (inductor's kernels, no tensor function called), so its
    results are not marked."""

    def __init__(
        self, to_host: Callable[[str], None], from_host: Callable[[str], None], pools: Any = None
    ) -> None:
        super().__init__()
        self.tensors = WeakIdKeyDictionary()  # by identity: a tensor's == is elementwise
        self.devices: dict[int, torch.device] = {}  # each ``.device`` read of a GPU tensor, kept
        self.to_host, self.from_host, self.pools = to_host, from_host, pools

    def _asks_gpu(self, func: Callable, args: tuple, kwargs: dict) -> bool:
        """Whether the call puts its result on the GPU: a ``cuda`` device or the device of a GPU
        tensor (``device=x.device``), ``.cuda()``, ``.to`` either."""

        def gpu(device: Any) -> bool:
            return _gpu_device(device) or id(device) in self.devices

        if func is torch.Tensor.cuda or gpu(kwargs.get("device", "cpu")):
            return True
        return func is torch.Tensor.to and any(
            gpu(a) for a in args[1:] if isinstance(a, (str, int, torch.device))
        )

    def _from_host(self, func: Callable, args: tuple, kwargs: dict) -> bool:
        """Whether the call copies host data into the GPU: a host tensor moved there, copied into
        a GPU tensor, or data given to a factory asked for the GPU."""
        if func is torch.Tensor.copy_:
            return args[0] in self.tensors and not self.holds(args[1])
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            return not self.holds(args[0]) and self._asks_gpu(func, args, kwargs)
        if func not in WITH_DATA:
            return False
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        return not self.holds(data) and self._asks_gpu(func, args, kwargs)

    def mark(self, tensors: Iterable[Any]) -> None:
        self.tensors.update((t, True) for t in tensors if isinstance(t, torch.Tensor))

    def holds(self, *values: Any) -> bool:
        """Whether any tensor among ``values`` (at any depth) is on the GPU."""
        return any(isinstance(t, torch.Tensor) and t in self.tensors for t in tree_leaves(values))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        read = self.holds(args, kwargs)
        if self._from_host(func, args, kwargs):
            self.from_host(getattr(func, "__name__", str(func)))
        if func is torch.Tensor.copy_ and args[0] not in self.tensors and read:  # into the host
            if not kwargs.get("non_blocking", args[2] if len(args) > 2 else False):
                self.to_host("copy_")
            return func(*args, **kwargs)
        to_host = read and _to_host(func, args, kwargs)
        if to_host:
            self.to_host(getattr(func, "__name__", str(func)))
        result = func(*args, **kwargs)
        if func == DEVICE and read:
            self.devices[id(result)] = result
        elif (read and not to_host) or self._asks_gpu(func, args, kwargs):
            made = tree_leaves(result)
            if self.pools is not None and self.pools.watching and _new_storage(made, args, kwargs):
                self.pools.allocated(getattr(func, "__name__", str(func)))
            self.mark(made)
        return result


def _new_storage(made: list[Any], args: tuple, kwargs: dict) -> bool:
    """Whether a tensor among ``made`` has storage no tensor among the arguments has."""
    given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
             if isinstance(t, torch.Tensor)}  # fmt: skip
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given
               for t in made)  # fmt: skip


def resident(host: Any) -> list[torch.Tensor]:
    """What is on the GPU before a capture: the model's weights, buffers and the tensors its
    modules hold, and the request-to-token pool."""
    found = [host.req_to_token_pool.req_to_token]
    for module in host.model.modules():
        found += [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        found += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
    return found
