"""Fast FP4 quantize kernels beside the reference: a fused Triton kernel and torch.compile of the reference.

``fp4lab.fp4.nvfp4`` stays the spec; everything here must give its bytes. The Triton kernel reads
x once and writes packed codes and scales (linear, or the 128x4 swizzled layout with zero
padding) in one pass, with the reference's arithmetic: the kernel's NaN-skipping block max,
E4M3 and E8M0 encodes done with integer bit operations (no reliance on a backend's fp8 cast),
and E2M1 by threshold comparison (SM90 has no cvt to e2m1).

Reciprocals: on a GPU the kernel can use ``rcp.approx.ftz.f32`` exactly as FlashInfer does
(``approx_rcp=True``, inline PTX), so the two should agree bit for bit; with correctly rounded
division (``approx_rcp=False``, the only choice under TRITON_INTERPRET=1) it agrees with the
reference bit for bit. Triton is imported lazily: the module loads without it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from fp4lab.fp4 import nvfp4
from fp4lab.fp4.swizzle import swizzle_128x4, swizzled_shape


def triton_available() -> str | None:
    """None when Triton can run here (a CUDA GPU, or TRITON_INTERPRET=1 on CPU), else the reason."""
    import os

    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA GPU, and TRITON_INTERPRET=1 was not set before importing triton"
    return None


def triton_quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = nvfp4.NVFP4_BLOCK,
    swizzle: bool = False,
    approx_rcp: bool = False,
    block_m: int = 16,
    block_k: int = 256,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """nvfp4.quantize's contract, one fused Triton kernel. ``approx_rcp`` needs a real GPU."""
    nvfp4.check_input(x, block_size)
    if block_k % 32 or block_k & (block_k - 1):
        raise ValueError(f"block_k={block_k} must be a power of two and a multiple of 32")
    reason = triton_available()
    if reason:
        raise RuntimeError(f"the Triton kernel cannot run here: {reason}")
    if approx_rcp and x.device.type != "cuda":
        raise ValueError(
            "approx_rcp=True uses inline PTX (rcp.approx.ftz.f32); it needs a CUDA tensor"
        )
    mx = block_size == nvfp4.MXFP4_BLOCK
    gs = nvfp4.resolve_global_scale(x, global_scale, block_size)
    gs_arg = torch.ones((), dtype=torch.float32, device=x.device) if gs is None else gs
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    s = k // block_size
    rows, cols = swizzled_shape(m, s)
    codes = torch.empty(m, k // 2, dtype=torch.uint8, device=x.device)
    sf = (
        torch.zeros(rows * cols, dtype=torch.uint8, device=x.device)
        if swizzle
        else torch.empty(m, s, dtype=torch.uint8, device=x.device)
    )
    grid = (-(-m // block_m), -(-k // block_k))
    from fp4lab.fp4 import triton_kernel

    triton_kernel.quantize_kernel[grid](
        x,
        gs_arg,
        codes,
        sf,
        m,
        k,
        x.stride(0),
        cols // 4,
        BLOCK=block_size,
        MX=mx,
        SWIZZLE=swizzle,
        APPROX_RCP=approx_rcp,
        BM=block_m,
        BK=block_k,
    )
    return codes, nvfp4.scales_view(sf, block_size), gs


RECOMPILE_LIMIT = 64
"""Graphs kept per process: one per (shape, dtype, block_size, swizzle) met (shapes are static)."""


@functools.cache
def _compiled_quantize_bytes() -> Any:
    return torch.compile(nvfp4.quantize_bytes, dynamic=False)


def compiled_quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = nvfp4.NVFP4_BLOCK,
    swizzle: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """nvfp4.quantize through ``torch.compile``: static shapes (float constants stay float32 constants).

    The 128x4 swizzle of the (16x smaller) scales runs eagerly after the compiled graph: inside
    it, inductor materialized a float32 copy of x and the graph ran at half the speed.
    """
    nvfp4.check_input(x, block_size)
    if global_scale is not None and not isinstance(global_scale, torch.Tensor):
        global_scale = torch.tensor(global_scale, dtype=torch.float32)
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        codes, sf_bytes, gs = _compiled_quantize_bytes()(x, global_scale, block_size=block_size)
    if swizzle:
        sf_bytes = swizzle_128x4(sf_bytes)
    return codes, nvfp4.scales_view(sf_bytes, block_size), gs
