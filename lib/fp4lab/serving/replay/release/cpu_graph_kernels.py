"""Inside one SGLang environment: the CPU kernels that stand in for the Triton kernels a prefill
graph runner launches around the model (the buffers a capture reads), each by its definition,
launched as SGLang launches them (``kernel[grid](*args)``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from fp4lab.serving.replay.release.reached import counted


class Launch:
    """A Triton kernel as ``kernel[grid](*args)`` launches it: the CPU kernel, called with the
    grid first, each launch counted under ``name`` (``reached.REACHED``)."""

    def __init__(self, kernel: Callable, name: str | None = None) -> None:
        self.kernel, self.__name__ = kernel, getattr(kernel, "__name__", "kernel")
        self.run = counted(name, kernel) if name else kernel

    def counted(self, name: str) -> Launch:
        return Launch(self.kernel, name)

    def __getitem__(self, grid: tuple[int, ...]) -> Callable:
        return partial(self.run, grid)


def chunked_prefix_kv_indices(grid, req_to_token, req_pool_indices, starts, seq_lens,
                              cu_seq_lens, kv_indices, stride: int) -> None:  # fmt: skip
    """SGLang's ``create_chunked_prefix_cache_kv_indices``: for each request of the grid, its
    chunk's KV slots (``req_to_token`` from the chunk start, ``seq_lens`` long) written at its
    ``cu_seq_lens`` offset; with tensor ops only (no host sync inside a capture)."""
    slot = torch.arange(kv_indices.shape[0], device=kv_indices.device)
    request = torch.searchsorted(cu_seq_lens[1 : grid[0] + 1].long(), slot, right=True)
    owned = request < grid[0]
    request = request.clamp(max=grid[0] - 1)
    local = slot - cu_seq_lens[request].long()
    owned &= local < seq_lens[request].long()
    column = (starts[request].long() + local).clamp(0, stride - 1)
    found = req_to_token[req_pool_indices[request].long(), column]
    kv_indices.copy_(torch.where(owned, found.to(kv_indices.dtype), kv_indices))


def flashinfer_kv_indices(grid, req_to_token, req_pool_indices, page_kernel_lens, kv_indptr,
                          kv_start_idx, kv_indices, stride: int) -> None:  # fmt: skip
    """SGLang's ``create_flashinfer_kv_indices_triton``: for each request of the grid, its KV
    slots (``req_to_token`` from ``kv_start_idx``, or 0, ``page_kernel_lens`` long) written at its
    ``kv_indptr`` offset; the same gather as ``chunked_prefix_kv_indices``."""
    starts = torch.zeros_like(page_kernel_lens) if kv_start_idx is None else kv_start_idx
    chunked_prefix_kv_indices(grid, req_to_token, req_pool_indices, starts, page_kernel_lens,
                              kv_indptr, kv_indices, stride)  # fmt: skip
