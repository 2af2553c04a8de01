"""Fast FP4 quantize kernels beside the reference: a fused Triton kernel and a compiled torch formulation.

``fp4lab.fp4.nvfp4`` stays the spec; everything here must give its bytes. The Triton kernel reads
x once and writes packed codes and scales (linear, or the 128x4 swizzled layout with zero
padding) in one pass, with the reference's arithmetic: the kernel's NaN-skipping block max,
E4M3 and E8M0 encodes done with integer bit operations (no reliance on a backend's fp8 cast),
and E2M1 by threshold comparison (SM90 has no cvt to e2m1).

Reciprocals: on a GPU the kernel can use ``rcp.approx.ftz.f32`` exactly as FlashInfer does
(``approx_rcp=True``, inline PTX), so the two should agree bit for bit; with correctly rounded
division (``approx_rcp=False``, the only choice under TRITON_INTERPRET=1) it agrees with the
reference bit for bit. Triton is imported lazily: the module loads without it.

``compiled_quantize`` is torch.compile of ``fused_quantize_bytes``, the reference's arithmetic
rearranged for inductor's CPU code: E4M3 by bit operations (the fp8 cast compiles to a scalar
software conversion, the larger part of the time), the element scales returned so they are
computed once per block in a vector loop, the global max taken from the block maxima (one read
of x fewer), codes packed eight to a 64-bit word, and x seen as one flat dimension of blocks
(dynamic M and K otherwise put integer divisions into every vector iteration: 1.4x slower).
``quantize`` is the public call (what users call): ``public_kernel`` picks the kernel it runs.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from fp4lab.fp4 import nvfp4
from fp4lab.fp4.encodings import (
    E2M1_MAX,
    E4M3_MAX,
    E4M3_NAN,
    E8M0_MAX_FINITE,
    e2m1_encode,
    e8m0_encode_round_up,
)
from fp4lab.fp4.swizzle import swizzle_128x4, swizzled_shape

E4M3_MIN_NORMAL = 2.0**-6


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


AMAX_CHUNK = 4096
"""Elements per program of the one-pass amax kernel."""


def triton_finite_amax(x: torch.Tensor) -> torch.Tensor:
    """nvfp4.finite_amax(x) in one pass over x (one Triton kernel and a zero fill), float32."""
    from fp4lab.fp4 import triton_kernel

    out = torch.zeros((), dtype=torch.float32, device=x.device)
    n = x.numel()
    triton_kernel.finite_amax_kernel[(max(1, -(-n // AMAX_CHUNK)),)](x, out, n, CHUNK=AMAX_CHUNK)
    return out


def triton_quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = nvfp4.NVFP4_BLOCK,
    swizzle: bool = False,
    approx_rcp: bool = False,
    block_m: int | None = None,
    block_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """quantize's contract, one fused Triton kernel (and, for NVFP4 without a global scale,
    a one-pass amax kernel before it). ``approx_rcp`` needs a real GPU. The tile is
    ``block_m`` x ``block_k`` when given; otherwise Triton's autotuner picks it per (M, K) on a
    GPU (``tuned_config``), and 16 x 256 is used under the interpreter."""
    nvfp4.check_input(x, block_size)
    if (block_m is None) != (block_k is None):
        raise ValueError(f"block_m={block_m}, block_k={block_k}: give both or neither")
    if block_k is not None and (block_k % 32 or block_k & (block_k - 1)):
        raise ValueError(f"block_k={block_k} must be a power of two and a multiple of 32")
    reason = triton_available()
    if reason:
        raise RuntimeError(f"the Triton kernel cannot run here: {reason}")
    if approx_rcp and x.device.type != "cuda":
        raise ValueError(
            "approx_rcp=True uses inline PTX (rcp.approx.ftz.f32); it needs a CUDA tensor"
        )
    mx = block_size == nvfp4.MXFP4_BLOCK
    x = x if x.stride(-1) == 1 else x.contiguous()
    if global_scale is None and not mx:
        gs = nvfp4.global_scale_from_amax(triton_finite_amax(x))
    else:
        gs = nvfp4.resolve_global_scale(x, global_scale, block_size)
    gs_arg = torch.ones((), dtype=torch.float32, device=x.device) if gs is None else gs
    m, k = x.shape
    s = k // block_size
    rows, cols = swizzled_shape(m, s)
    codes = torch.empty(m, k // 2, dtype=torch.uint8, device=x.device)
    sf = (
        torch.zeros(rows * cols, dtype=torch.uint8, device=x.device)
        if swizzle
        else torch.empty(m, s, dtype=torch.uint8, device=x.device)
    )
    from fp4lab.fp4 import triton_kernel

    args = (x, gs_arg, codes, sf, m, k, x.stride(0), cols // 4)
    flags = {"BLOCK": block_size, "MX": mx, "SWIZZLE": swizzle, "APPROX_RCP": approx_rcp}
    if block_m is None and x.device.type == "cuda":
        grid = lambda meta: (-(-m // meta["BM"]), -(-k // meta["BK"]))  # noqa: E731
        triton_kernel.tuned_quantize_kernel[grid](*args, **flags)
    else:
        block_m, block_k = block_m or 16, block_k or 256
        grid = (-(-m // block_m), -(-k // block_k))
        triton_kernel.quantize_kernel[grid](*args, **flags, BM=block_m, BK=block_k)
    return codes, nvfp4.scales_view(sf, block_size), gs


def tuned_config() -> dict[str, int] | None:
    """The tile and warps the autotuner chose on its latest tuning (None before any)."""
    from fp4lab.fp4 import triton_kernel

    best = getattr(triton_kernel.tuned_quantize_kernel, "best_config", None)
    return None if best is None else {**best.kwargs, "num_warps": best.num_warps}


RECOMPILE_LIMIT = 64
"""Graphs kept: one per (dtype, block_size, global scale given or not); the block count is
dynamic from the first call, so a new M or K reuses the graph."""
FAST_PATH_MIN_ELEMENTS = 1 << 20
"""Below this many elements the public call stays eager on a CPU: a first compile (seconds) would
cost more than thousands of eager calls of that size."""


def e4m3_by_bits(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cvt.rn.satfinite.e4m3`` of float32 values by integer bit operations: (the E4M3 value as
    float32, its byte as uint8). The same rounding as ``encodings.e4m3_encode``: ties to even,
    +-448 saturation, NaN 0x7F."""
    negative = v.view(torch.int32) < 0
    a = v.abs().clamp(max=E4M3_MAX)
    bits = a.view(torch.int32)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -(1 << 20)).view(torch.float32)
    subnormal = (a + 16384.0) - 16384.0  # float32 spacing at 2**14 is 2**-9, E4M3's subnormal step
    value = torch.where(a >= E4M3_MIN_NORMAL, normal, subnormal)
    vbits = value.view(torch.int32)
    byte = torch.where(
        value >= E4M3_MIN_NORMAL,
        (((vbits >> 23) - 120) << 3) | ((vbits >> 20) & 7),
        (value * 512.0).to(torch.int32),
    )
    nan = v != v
    byte = torch.where(nan, E4M3_NAN, byte | (negative.to(torch.int32) << 7))
    value = torch.where(nan, v, torch.where(negative, -value, value))
    return value, byte.to(torch.uint8)


def pack_e2m1_words(codes: torch.Tensor) -> torch.Tensor:
    """encodings.pack_e2m1 for K a multiple of 8, eight codes to a 64-bit word (vectorizes on a CPU)."""
    words = codes.contiguous().view(torch.int64)
    packed = words & 0xF
    for i in range(1, 8):
        packed = packed | ((words >> (4 * i)) & (0xF << (4 * i)))
    return packed.to(torch.int32).view(torch.uint8).view(codes.shape[0], -1)


def fused_quantize_bytes(
    blocks: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """nvfp4.quantize_bytes (linear scales) of x viewed as blocks [M*K/block_size, block_size],
    arranged for torch.compile: (packed codes [N, block_size/2], scale bytes [N], global scale,
    element scales [N]). One flat block dimension keeps the loops' index arithmetic free of
    divisions when M and K become dynamic; the element scales are an output so inductor computes
    them once per block instead of inlining them."""
    block_size = blocks.shape[1]
    blocks = blocks.float()
    vec_max = nvfp4.block_amax(blocks)
    six = nvfp4.reciprocal(torch.full((), E2M1_MAX, dtype=torch.float32, device=blocks.device))
    if block_size == nvfp4.MXFP4_BLOCK:
        sf_byte = e8m0_encode_round_up(vec_max * six)
        usable = (sf_byte != 0) & (sf_byte < E8M0_MAX_FINITE)
        scale = torch.where(usable, torch.exp2(127.0 - sf_byte.float()), 0.0)
        gs = None
    else:
        gs = global_scale
        if gs is None:  # the largest finite |x| per block (in the block max's loop), then of those
            mag = blocks.abs()
            finite = torch.where(mag < float("inf"), mag, 0.0).amax(-1)
            gs = nvfp4.global_scale_from_amax(finite.amax())
        sf, sf_byte = e4m3_by_bits(gs * (vec_max * six))
        scale = torch.where(sf_byte != 0, nvfp4.reciprocal(sf * nvfp4.reciprocal(gs)), 0.0)
    codes = e2m1_encode(blocks * scale.unsqueeze(-1))
    return pack_e2m1_words(codes), sf_byte, gs, scale


@functools.cache
def _compiled() -> Any:
    """fused_quantize_bytes compiled (on first use: importing stays free of torch.compile)."""
    return torch.compile(fused_quantize_bytes)


def compiled_quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = nvfp4.NVFP4_BLOCK,
    swizzle: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """quantize's contract through ``torch.compile`` of fused_quantize_bytes.

    The 128x4 swizzle of the (16x smaller) scales runs eagerly after the compiled graph: inside
    it, inductor materialized a float32 copy of x and the graph ran at half the speed.
    """
    nvfp4.check_input(x, block_size)
    # None stays None (computed in the graph); MXFP4 with a global scale is refused here
    gs = None if global_scale is None else nvfp4.resolve_global_scale(x, global_scale, block_size)
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        m, k = x.shape
        blocks = x.reshape(-1, block_size)
        torch._dynamo.maybe_mark_dynamic(blocks, 0)  # one graph for every M and K
        torch._dynamo.mark_static(blocks, 1)  # the block size: a constant in each format's graph
        codes, sf_bytes, gs, _ = _compiled()(blocks, gs)
    codes, sf_bytes = codes.view(m, k // 2), sf_bytes.view(m, k // block_size)
    if swizzle:
        sf_bytes = swizzle_128x4(sf_bytes)
    return codes, nvfp4.scales_view(sf_bytes, block_size), gs


def public_kernel(x: torch.Tensor) -> str:
    """The kernel ``quantize`` runs for x: ``triton`` on a CUDA GPU with Triton installed,
    ``compiled`` on a CPU for FAST_PATH_MIN_ELEMENTS elements or more, else ``reference``. While
    torch.compile traces, under a dispatch mode (opcheck, fake tensors) or for a tensor subclass,
    the reference: plain torch ops, which every tracer and mode sees through."""
    if (
        torch.compiler.is_compiling()
        or _get_current_dispatch_mode() is not None
        or type(x) not in (torch.Tensor, torch.nn.Parameter)
    ):
        return "reference"
    if x.device.type == "cuda":
        return "triton" if triton_available() is None else "reference"
    if x.device.type == "cpu" and x.numel() >= FAST_PATH_MIN_ELEMENTS:
        return "compiled"
    return "reference"


KERNELS = {
    "reference": nvfp4.reference_quantize,
    "compiled": compiled_quantize,
    "triton": triton_quantize,
}
"""The kernels public_kernel can name, each with quantize's signature."""


def quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = nvfp4.NVFP4_BLOCK,
    swizzle: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Quantize a 2-D tensor to NVFP4 (block_size=16) or MXFP4 (block_size=32).

    Returns ``(codes, scales, global_scale)``: codes uint8 [M, K/2]; scales float8_e4m3fn
    [M, K/16] for NVFP4 or float8_e8m0fnu [M, K/32] for MXFP4, 1-D in the 128x4 order when
    ``swizzle``; global_scale a float32 scalar tensor (NVFP4; 448*6/amax when None) or None (MXFP4).
    The bytes are reference_quantize's; the kernel is the fastest that gives them here (see
    ``public_kernel``).
    """
    nvfp4.check_input(x, block_size)
    kernel = KERNELS[public_kernel(x)]
    return kernel(x, global_scale, block_size=block_size, swizzle=swizzle)
