"""Where the GPU kernel's approximate reciprocals could move a code or a scale.

FlashInfer's kernel takes its reciprocals with ``rcp.approx.ftz.f32`` (error up to 1 ulp); the
reference (``fp4lab.fp4.nvfp4``) rounds them correctly. Re-running the reference with each
reciprocal rounded down or up marks every output such an error could change.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from fp4lab.fp4 import nvfp4


def directed_reciprocal(direction: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A float32 reciprocal rounded down (-1) or up (+1): the two values rcp.approx (<= 1 ulp) can give."""

    def rcp(v: torch.Tensor) -> torch.Tensor:
        r = torch.reciprocal(v)
        product = r.double() * v.double()  # exact: two 24-bit significands
        if direction < 0:
            return torch.where(product > 1, torch.nextafter(r, torch.zeros_like(r)), r)
        return torch.where(product < 1, torch.nextafter(r, torch.full_like(r, float("inf"))), r)

    return rcp


def reciprocal_sensitive(
    x: torch.Tensor, global_scale: torch.Tensor | float | None = None, *, block_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks of the codes [M, K] and scales [M, K/block] that an ulp of reciprocal error could move.

    Runs the reference with every combination of round-down / round-up at each reciprocal site
    (2**3 for NVFP4, 2 for MXFP4) and marks what differs from the correctly rounded result in
    any combination: where the kernel's rcp.approx (error <= 1 ulp) may disagree.
    """
    nvfp4.check_input(x, block_size)
    xf = x.float()
    gs = nvfp4.resolve_global_scale(x, global_scale, block_size)
    if gs is None:
        combos = [nvfp4.Reciprocals(six=directed_reciprocal(d)) for d in (-1, 1)]
    else:
        combos = [
            nvfp4.Reciprocals(*(directed_reciprocal(d) for d in ds))
            for ds in itertools.product((-1, 1), repeat=3)
        ]

    def codes_with(rcp: nvfp4.Reciprocals) -> tuple[torch.Tensor, torch.Tensor]:
        return nvfp4.mxfp4_codes(xf, rcp=rcp) if gs is None else nvfp4.nvfp4_codes(xf, gs, rcp=rcp)

    codes, scales = codes_with(nvfp4.CORRECTLY_ROUNDED)
    code_moved = torch.zeros_like(codes, dtype=torch.bool)
    scale_moved = torch.zeros_like(scales, dtype=torch.bool)
    for rcp in combos:
        c, s = codes_with(rcp)
        code_moved |= c != codes
        scale_moved |= s != scales
    return code_moved, scale_moved


def reciprocal_sensitivity(
    x: torch.Tensor, global_scale: torch.Tensor | float | None = None, *, block_size: int = 16
) -> dict:
    """Counts of reciprocal_sensitive: how many codes and scales rcp.approx could move on this input."""
    code_moved, scale_moved = reciprocal_sensitive(x, global_scale, block_size=block_size)
    return {
        "block_size": block_size,
        "elements": code_moved.numel(),
        "blocks": scale_moved.numel(),
        "codes_that_could_move": int(code_moved.sum()),
        "scales_that_could_move": int(scale_moved.sum()),
        "code_fraction": float(code_moved.float().mean()),
        "scale_fraction": float(scale_moved.float().mean()),
    }
