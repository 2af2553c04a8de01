"""FP4 numerics, the spec: NVFP4 and MXFP4 quantize / dequantize, E2M1 packing, 128x4 scale swizzle.

The reference reproduces FlashInfer's CUDA kernel, ``cvt_warp_fp16_to_fp4`` in
``nv_internal/tensorrt_llm/kernels/quantization_utils.cuh`` (default NVFP4 branch and the
``UE8M0_SF`` branch for MXFP4), operation by operation in float32:

* ``vecMax``: the kernel takes |x| with ``__habs2`` and reduces pairs with ``__hmax2``, which
  skips NaN ("if either input is NaN, the other is returned"). Even and odd positions of a
  block stay in separate lanes and are joined last by ``(even > odd) ? even : odd``. So NaN
  elements are ignored unless *every odd position* of the block is NaN; then vecMax is NaN.
  An infinite element makes vecMax infinite.
* NVFP4: ``SF = e4m3_satfinite(gs * (vecMax * rcp(6)))``, round to nearest even; +-inf and
  values above 448 saturate to 448 (0x7E), NaN gives the canonical NaN 0x7F (PTX
  ``cvt.rn.satfinite.e4m3x2.f32``; CUDA's ``__nv_fp8_e4m3(float)`` uses ``__NV_SATFINITE``).
  ``scale = rcp(fp32(SF) * rcp(gs))`` when the SF byte is nonzero, else 0: an all-zero block,
  or a block whose SF rounds to 0, gives codes x*0 = +-0, i.e. 0x0 for positive and 0x8
  (negative zero) for negative elements. A NaN SF gives a NaN scale, so every code of that
  block is the NaN code below.
* MXFP4: ``e = e8m0(vecMax * rcp(6))`` rounded toward +inf to a power of two (satfinite: inf
  gives 254, NaN 255); scale = 2**(127 - e), except that the kernel uses 0 for e == 0 (its
  byte-zero sentinel, vecMax/6 <= 2**-127), for e == 254 (2**-127 is built as a float with a
  zero exponent field, i.e. 0) and for e == 255. Scaling is ``mul.rn`` (no flush to zero).
* ``code = e2m1_satfinite(x * scale)``: round to nearest, ties to the even code, +-inf and
  |v| > 6 saturate to +-6, the sign of zero is kept (-0.0 and negative values rounding to 0
  give 0x8).
* NaN input to the E2M1 conversion: E2M1 has no NaN. The PTX text available to us states the
  .satfinite rule (NaN -> NaN, overflow -> sign-preserved MAX_NORM) only for destinations that
  have a NaN; public sources disagree on what ``cvt.rn.satfinite.e2m1x2.f32`` returns for NaN
  (positive MAX_NORM, or 0). The reference uses ``encodings.E2M1_CODE_FOR_NAN`` (0x7, +6): NOT
  verified on hardware here; the GPU test compares it with the kernel.

Where the kernel and this reference can differ, by design of the CPU:

* the kernel's reciprocals are ``rcp.approx.ftz.f32`` (max error 1 ulp, not correctly rounded);
  the reference rounds them correctly. A code or SF moves only where a value sits within an
  ulp of a rounding boundary; ``fp4lab.fp4.reciprocals.reciprocal_sensitivity`` counts how
  often that can happen on given data.
* FlashInfer compiles with ``-use_fast_math`` (flush to zero): float32 subnormal intermediates
  become 0. That changes nothing for SF and codes (both round such values to zero) as long as
  2**-117 < gs < 2**117; outside that range the kernel's scale can flush to 0 or become inf.
* FlashInfer's kernel takes fp16/bf16 (and fp8) input; float32 input is this reference's own
  extension of the same arithmetic.

The global scale follows FlashInfer: ``gs = 448 * 6 / amax`` (torchao stores the inverse).
The encodings live in ``fp4lab.fp4.encodings``, the scale layout in ``fp4lab.fp4.swizzle``
(``swizzled_shape`` is importable from here too).

The public call is ``fp4lab.fp4.kernels.quantize``: it runs the fastest kernel that gives these
bytes; ``reference_quantize`` always runs this module's eager arithmetic, the spec the
cross-checks compare with. Neither builds a tensor from
Python data (a host-to-device copy, illegal during CUDA-graph capture): constants are fills on
x's device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fp4lab.fp4.encodings import (
    E2M1_MAX,
    E4M3_MAX,
    E8M0_MAX_FINITE,
    e2m1_decode,
    e2m1_encode,
    e4m3_encode,
    e8m0_encode_round_up,
    pack_e2m1,
    unpack_e2m1,
)
from fp4lab.fp4.swizzle import swizzle_128x4, unswizzle_128x4
from fp4lab.fp4.swizzle import swizzled_shape as swizzled_shape

NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
BLOCK_SIZES = (NVFP4_BLOCK, MXFP4_BLOCK)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_block_size(block_size: int) -> None:
    """``block_size`` must be 16 (NVFP4) or 32 (MXFP4)."""
    if block_size not in BLOCK_SIZES:
        raise ValueError(
            f"block_size={block_size!r} is not allowed; allowed values: 16 (NVFP4), 32 (MXFP4)"
        )


def check_input(x: torch.Tensor, block_size: int) -> None:
    """The input contract of quantize: 2-D float32/bfloat16/float16, K a multiple of block_size."""
    check_block_size(block_size)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K]; got {x.dim()}-D shape {tuple(x.shape)}")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(
            f"x.dtype={x.dtype} is not allowed; allowed values: float32, bfloat16, float16"
        )
    if x.shape[1] % block_size:
        raise ValueError(f"K={x.shape[1]} must be a multiple of block_size={block_size}")


def reciprocal(v: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 reciprocal (where the kernel uses rcp.approx.ftz)."""
    return torch.reciprocal(v)


def block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """The kernel's vecMax over the last dim: the max of |x| skipping NaN, but NaN when every odd
    position is NaN (the even and odd lanes are NaN-skipping maxima joined by ``(even > odd) ? even : odd``)."""
    mag = blocks.abs()
    nan = mag != mag
    largest = torch.where(nan, torch.full_like(mag, -1.0), mag).amax(dim=-1)
    half = blocks.shape[-1] // 2
    odd = (torch.arange(2 * half, device=blocks.device) % 2).float()  # no host data: capture-safe
    odd_lane_all_nan = torch.where(nan, odd, 0.0).sum(dim=-1) == half
    return torch.where(odd_lane_all_nan, torch.full_like(largest, float("nan")), largest)


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    """The largest |x| over the finite elements (0 when there are none), float32."""
    mag = x.detach().float().abs()
    return torch.where(mag < float("inf"), mag, torch.zeros_like(mag)).amax()  # NaN < inf is False


def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """448*6/amax as float32, 1.0 where amax is 0."""
    # A correctly rounded division: ``2688 / tensor`` in torch is reciprocal(tensor) * 2688, rounded twice.
    return torch.where(
        amax > 0, torch.full_like(amax, E4M3_MAX * E2M1_MAX) / amax, torch.ones_like(amax)
    )


def global_scale_for(x: torch.Tensor) -> torch.Tensor:
    """FlashInfer's NVFP4 global scale, 448*6/amax over the finite elements, float32 (1.0 when that amax is 0)."""
    return global_scale_from_amax(finite_amax(x))


def global_scale_tensor(global_scale: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """A given global scale as a float32 scalar on ``device``; a Python number becomes a fill there,
    not a copy from the host (a tensor on another device is copied)."""
    if isinstance(global_scale, torch.Tensor):
        return global_scale.to(device=device, dtype=torch.float32).reshape(())
    return torch.full((), float(global_scale), dtype=torch.float32, device=device)


def resolve_global_scale(
    x: torch.Tensor, global_scale: torch.Tensor | float | None, block_size: int
) -> torch.Tensor | None:
    """The global scale quantize uses: None for MXFP4, else ``global_scale`` or global_scale_for(x),
    as a float32 scalar on x's device. MXFP4 with a global scale is an error."""
    if block_size == MXFP4_BLOCK:
        if global_scale is not None:
            raise ValueError(
                "global_scale must be None for MXFP4 (block_size=32): MXFP4 has no global scale"
            )
        return None
    if global_scale is None:
        return global_scale_for(x)
    return global_scale_tensor(global_scale, x.device)


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), value, dtype=torch.float32, device=like.device)


class Reciprocals(NamedTuple):
    """The kernel's reciprocal sites: of 6, of the global scale, of SF/gs (the element scale)."""

    six: Callable[[torch.Tensor], torch.Tensor] = reciprocal
    global_scale: Callable[[torch.Tensor], torch.Tensor] = reciprocal
    scale: Callable[[torch.Tensor], torch.Tensor] = reciprocal


CORRECTLY_ROUNDED = Reciprocals()


def nvfp4_codes(
    xf: torch.Tensor, gs: torch.Tensor, *, rcp: Reciprocals = CORRECTLY_ROUNDED
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 of float32 [M, K]: (unpacked codes uint8 [M, K], SF bytes uint8 [M, K/16]).

    ``rcp`` defaults to correct rounding at every site; ``fp4lab.fp4.reciprocals`` passes
    directed roundings to bound the kernel's rcp.approx.
    """
    m, k = xf.shape
    blocks = xf.view(m, k // NVFP4_BLOCK, NVFP4_BLOCK)
    sf_byte = e4m3_encode(gs * (block_amax(blocks) * rcp.six(_f32(E2M1_MAX, xf))))
    sf = sf_byte.view(torch.float8_e4m3fn).float()
    scale = torch.where(sf_byte != 0, rcp.scale(sf * rcp.global_scale(gs)), torch.zeros_like(sf))
    return e2m1_encode(blocks * scale.unsqueeze(-1)).view(m, k), sf_byte


def mxfp4_codes(
    xf: torch.Tensor, *, rcp: Reciprocals = CORRECTLY_ROUNDED
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 of float32 [M, K]: (unpacked codes uint8 [M, K], E8M0 bytes uint8 [M, K/32])."""
    m, k = xf.shape
    blocks = xf.view(m, k // MXFP4_BLOCK, MXFP4_BLOCK)
    e = e8m0_encode_round_up(block_amax(blocks) * rcp.six(_f32(E2M1_MAX, xf)))
    usable = (e != 0) & (e < E8M0_MAX_FINITE)
    scale = torch.where(
        usable, torch.exp2(127.0 - e.float()), torch.zeros(e.shape, device=xf.device)
    )
    return e2m1_encode(blocks * scale.unsqueeze(-1)).view(m, k), e


def quantize_bytes(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = NVFP4_BLOCK,
    swizzle: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """reference_quantize with the scales as raw uint8 bytes."""
    check_input(x, block_size)
    xf = x.float()
    gs = resolve_global_scale(x, global_scale, block_size)
    codes, sf_byte = mxfp4_codes(xf) if gs is None else nvfp4_codes(xf, gs)
    return pack_e2m1(codes), swizzle_128x4(sf_byte) if swizzle else sf_byte, gs


def scales_view(sf_bytes: torch.Tensor, block_size: int) -> torch.Tensor:
    """Scale bytes viewed as their format: float8_e4m3fn (NVFP4) or float8_e8m0fnu (MXFP4)."""
    return sf_bytes.view(torch.float8_e8m0fnu if block_size == MXFP4_BLOCK else torch.float8_e4m3fn)


def reference_quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = NVFP4_BLOCK,
    swizzle: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """quantize by this module's eager arithmetic, whatever the device: the spec."""
    codes, sf_bytes, gs = quantize_bytes(x, global_scale, block_size=block_size, swizzle=swizzle)
    return codes, scales_view(sf_bytes, block_size), gs


def dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    global_scale: torch.Tensor | float | None,
    *,
    block_size: int = NVFP4_BLOCK,
    swizzle: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of quantize: x ~= e2m1 * scale / global_scale, as ``dtype`` [M, K]."""
    check_block_size(block_size)
    values = e2m1_decode(unpack_e2m1(codes))
    m, k = values.shape
    if swizzle:
        scales = unswizzle_128x4(scales.reshape(-1), m, k // block_size)
    scale = scales.float()
    if global_scale is not None:
        scale = scale / global_scale_tensor(global_scale, scale.device)
    return (values.view(m, k // block_size, block_size) * scale.unsqueeze(-1)).view(m, k).to(dtype)
