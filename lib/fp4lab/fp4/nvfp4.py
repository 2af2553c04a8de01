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
  (positive MAX_NORM, or 0). The reference uses ``E2M1_CODE_FOR_NAN`` (0x7, +6): NOT verified
  on hardware here; the GPU test compares it with the kernel.

Where the kernel and this reference can differ, by design of the CPU:

* the kernel's reciprocals are ``rcp.approx.ftz.f32`` (max error 1 ulp, not correctly rounded);
  the reference rounds them correctly. A code or SF moves only where a value sits within an
  ulp of a rounding boundary; ``fp4lab.fp4.crosscheck.reciprocal_sensitivity`` counts how
  often that can happen on given data.
* FlashInfer compiles with ``-use_fast_math`` (flush to zero): float32 subnormal intermediates
  become 0. That changes nothing for SF and codes (both round such values to zero) as long as
  2**-117 < gs < 2**117; outside that range the kernel's scale can flush to 0 or become inf.
* FlashInfer's kernel takes fp16/bf16 (and fp8) input; float32 input is this reference's own
  extension of the same arithmetic.

The global scale follows FlashInfer: ``gs = 448 * 6 / amax`` (torchao stores the inverse).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
"""The value of each 4-bit E2M1 code: bit 3 is the sign."""

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_NAN = 0x7F
E8M0_NAN = 0xFF
E8M0_MAX_FINITE = 0xFE
E2M1_CODE_FOR_NAN = 0x7
"""Code the reference gives a NaN reaching the E2M1 conversion (+6); unverified, see module doc."""

NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
BLOCK_SIZES = (NVFP4_BLOCK, MXFP4_BLOCK)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_block_size(block_size: int) -> None:
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


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (uint8, 0..15) of float32 values: ties to even, saturating, sign of zero kept.

    Per binade the E2M1 grid is evenly spaced, so the code is an integer rounding (torch.round
    rounds half to even, and the even integer is the even code): [0, 2) in steps of 0.5,
    [2, 4) in steps of 1, [4, 6] in steps of 2. Every scaling here is exact.
    """
    m = v.abs().clamp(max=E2M1_MAX)
    code = torch.where(
        m < 2.0,
        torch.round(m * 2.0),
        torch.where(m < 4.0, torch.round(m) + 2.0, torch.round(m * 0.5) + 4.0),
    )
    negative = (
        torch.copysign(torch.ones_like(m), v) < 0
    )  # the sign bit, -0.0 included (vectorizes; signbit does not)
    code = code + negative.float() * 8.0
    return torch.where(v != v, torch.full_like(code, E2M1_CODE_FOR_NAN), code).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of 4-bit codes (uint8 holding 0..15)."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)[codes.long()]


def e4m3_encode(v: torch.Tensor) -> torch.Tensor:
    """uint8 E4M3 bytes of float32 values as ``cvt.rn.satfinite.e4m3x2.f32``: RNE, +-448 saturation, NaN 0x7F."""
    byte = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(v), torch.full_like(byte, E4M3_NAN), byte)


def e8m0_encode_round_up(v: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 code of the smallest power of two >= v, clamped to [2**-127, 2**127]; 255 for NaN.

    ``cvt.rp.satfinite.ue8m0x2.f32`` for v >= 0: 0 and values up to 2**-127 give 0, +inf gives 254.
    """
    mantissa, exponent = torch.frexp(v)
    log2_up = torch.where(mantissa == 0.5, exponent - 1, exponent)
    code = (log2_up + 127).clamp(0, E8M0_MAX_FINITE)
    code = torch.where(v == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isinf(v), torch.full_like(code, E8M0_MAX_FINITE), code)
    code = torch.where(torch.isnan(v), torch.full_like(code, E8M0_NAN), code)
    return code.to(torch.uint8)


def block_amax(blocks: torch.Tensor) -> torch.Tensor:
    """The kernel's vecMax over the last dim: the max of |x| skipping NaN, but NaN when every odd
    position is NaN (the even and odd lanes are NaN-skipping maxima joined by ``(even > odd) ? even : odd``)."""
    mag = blocks.abs()
    nan = mag != mag
    largest = torch.where(nan, torch.full_like(mag, -1.0), mag).amax(dim=-1)
    half = blocks.shape[-1] // 2
    odd = torch.tensor([0.0, 1.0] * half, device=blocks.device)
    odd_lane_all_nan = torch.where(nan, odd, 0.0).sum(dim=-1) == half
    return torch.where(odd_lane_all_nan, torch.full_like(largest, float("nan")), largest)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[M, K] codes -> [M, K/2] bytes, the even index in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(
            f"the last dimension must be even to pack two codes a byte; got {codes.shape[-1]}"
        )
    pairs = codes.contiguous().view(torch.int16)  # little-endian: the even code is the low byte
    return ((pairs & 0x0F) | ((pairs >> 4) & 0xF0)).to(torch.uint8)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[M, K/2] bytes -> [M, K] codes."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def float4_view(packed: torch.Tensor) -> torch.Tensor:
    """The packed bytes viewed as torch.float4_e2m1fn_x2 (same memory, no conversion)."""
    return packed.view(torch.float4_e2m1fn_x2)


def _round_up(n: int, base: int) -> int:
    return (n + base - 1) // base * base


def swizzled_shape(m: int, scale_cols: int) -> tuple[int, int]:
    """The [rows, cols] of [m, scale_cols] scales in the 128x4 layout: rows padded to 128, columns to 4."""
    return _round_up(m, 128), _round_up(scale_cols, 4)


def swizzled_offset(
    m: torch.Tensor | int, k: torch.Tensor | int, scale_cols: int
) -> torch.Tensor | int:
    """Position of scale (m, k) in the 128x4 layout of [M, scale_cols] scales (cuBLAS formula)."""
    k_tiles = _round_up(scale_cols, 4) // 4
    return (m // 128 * k_tiles + k // 4) * 512 + (m % 32) * 16 + (m % 128) // 32 * 4 + k % 4


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[M, S] scales -> 1-D swizzled order (rows padded to 128, columns to 4, pads zero).

    Within a 512-byte tile the scale of (m, k) sits at ``(m%32)*16 + ((m%128)//32)*4 + k%4``;
    tiles are ordered [M/128, S/4], row tiles outermost.
    """
    m, s = scales.shape
    mp, sp = swizzled_shape(m, s)
    raw = scales.view(torch.uint8) if scales.element_size() == 1 else scales
    padded = torch.zeros(mp, sp, dtype=raw.dtype, device=raw.device)
    padded[:m, :s] = raw
    tiled = padded.view(mp // 128, 4, 32, sp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
    return tiled.view(scales.dtype) if raw is not scales else tiled


def unswizzle_128x4(swizzled: torch.Tensor, m: int, s: int) -> torch.Tensor:
    """Inverse of swizzle_128x4: the 1-D swizzled scales back to [m, s]."""
    mp, sp = swizzled_shape(m, s)
    if swizzled.numel() != mp * sp:
        raise ValueError(
            f"swizzled has {swizzled.numel()} scales; [{m}, {s}] padded to 128x4 needs {mp * sp}"
        )
    raw = swizzled.view(torch.uint8) if swizzled.element_size() == 1 else swizzled
    grid = raw.reshape(mp // 128, sp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(mp, sp)
    out = grid[:m, :s].contiguous()
    return out.view(swizzled.dtype) if raw is not swizzled else out


def global_scale_for(x: torch.Tensor) -> torch.Tensor:
    """FlashInfer's NVFP4 global scale, 448*6/amax over the finite elements, float32 (1.0 when that amax is 0)."""
    mag = x.detach().float().abs()
    amax = torch.where(
        mag < float("inf"), mag, torch.zeros_like(mag)
    ).amax()  # finite only; NaN < inf is False
    # A correctly rounded division: ``2688 / tensor`` in torch is reciprocal(tensor) * 2688, rounded twice.
    return torch.where(
        amax > 0, torch.full_like(amax, E4M3_MAX * E2M1_MAX) / amax, torch.ones_like(amax)
    ).to(torch.float32)


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


class Reciprocals(NamedTuple):
    """The kernel's reciprocal sites: of 6, of the global scale, of SF/gs (the element scale)."""

    six: Callable[[torch.Tensor], torch.Tensor] = reciprocal
    global_scale: Callable[[torch.Tensor], torch.Tensor] = reciprocal
    scale: Callable[[torch.Tensor], torch.Tensor] = reciprocal


def nvfp4_codes(
    xf: torch.Tensor, gs: torch.Tensor, *, rcp: Reciprocals = Reciprocals()
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 of float32 [M, K]: (unpacked codes uint8 [M, K], SF bytes uint8 [M, K/16]).

    ``rcp`` defaults to correct rounding at every site; ``fp4lab.fp4.crosscheck`` passes
    directed roundings to bound the kernel's rcp.approx.
    """
    m, k = xf.shape
    blocks = xf.view(m, k // NVFP4_BLOCK, NVFP4_BLOCK)
    sf_byte = e4m3_encode(gs * (block_amax(blocks) * rcp.six(_f32(E2M1_MAX, xf))))
    sf = sf_byte.view(torch.float8_e4m3fn).float()
    scale = torch.where(sf_byte != 0, rcp.scale(sf * rcp.global_scale(gs)), torch.zeros_like(sf))
    return e2m1_encode(blocks * scale.unsqueeze(-1)).view(m, k), sf_byte


def mxfp4_codes(
    xf: torch.Tensor, *, rcp: Reciprocals = Reciprocals()
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
    """quantize with the scales as raw uint8 bytes (what a compiled graph can return on every backend)."""
    check_input(x, block_size)
    xf = x.float()
    if block_size == MXFP4_BLOCK:
        if global_scale is not None:
            raise ValueError(
                "global_scale must be None for MXFP4 (block_size=32): MXFP4 has no global scale"
            )
        codes, sf_byte = mxfp4_codes(xf)
        gs = None
    else:
        gs = (
            global_scale_for(x)
            if global_scale is None
            else torch.as_tensor(global_scale, dtype=torch.float32).reshape(())
        )
        gs = gs.to(xf.device)
        codes, sf_byte = nvfp4_codes(xf, gs)
    return pack_e2m1(codes), swizzle_128x4(sf_byte) if swizzle else sf_byte, gs


def scales_view(sf_bytes: torch.Tensor, block_size: int) -> torch.Tensor:
    """Scale bytes viewed as their format: float8_e4m3fn (NVFP4) or float8_e8m0fnu (MXFP4)."""
    return sf_bytes.view(torch.float8_e8m0fnu if block_size == MXFP4_BLOCK else torch.float8_e4m3fn)


def quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    *,
    block_size: int = NVFP4_BLOCK,
    swizzle: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Quantize a 2-D tensor to NVFP4 (block_size=16) or MXFP4 (block_size=32).

    Returns ``(codes, scales, global_scale)``: codes uint8 [M, K/2]; scales float8_e4m3fn
    [M, K/16] for NVFP4 or float8_e8m0fnu [M, K/32] for MXFP4, 1-D in the 128x4 order when
    ``swizzle``; global_scale a float32 scalar tensor (NVFP4; 448*6/amax when None) or None (MXFP4).
    """
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
        scale = scale / torch.as_tensor(global_scale, dtype=torch.float32, device=scale.device)
    return (values.view(m, k // block_size, block_size) * scale.unsqueeze(-1)).view(m, k).to(dtype)
