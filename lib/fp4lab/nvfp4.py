"""FP4 numerics: NVFP4 and MXFP4 quantize / dequantize, E2M1 packing, 128x4 scale swizzle.

The reference follows FlashInfer's CUDA kernel (``cvt_warp_fp16_to_fp4`` in
``nv_internal/tensorrt_llm/kernels/quantization_utils.cuh``), default NVFP4 branch:

* ``vecMax``  = max |x| over a block of 16 along K (NaN elements are ignored, as CUDA's
  ``fmax`` ignores them; an infinite element makes the block's scale saturate);
* ``SF``      = e4m3(gs * (vecMax * (1/6))), round to nearest even, saturating at 448;
* ``scale``   = 1 / (fp32(SF) * (1/gs)), or 0 when SF is 0 (an all-zero block, or one so
  small its scale underflows, quantizes to +0 codes);
* ``code``    = e2m1(x * scale): round to nearest, ties to the even code, saturating at
  +-6. Negative zero keeps its sign bit (code 0x8); NaN elements give code 0.

The CUDA kernel takes its reciprocals with ``rcp.approx.ftz``; this reference rounds
them correctly, which can move a value sitting exactly on a rounding boundary by one
code. MXFP4 (blocks of 32): scale = e8m0(vecMax / 6) rounded up to a power of two, no
global scale. The global scale follows FlashInfer: ``gs = 448 * 6 / amax`` (torchao keeps
the inverse).
"""

from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The value of each 4-bit E2M1 code: bit 3 is the sign."""

E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Boundaries between neighbouring magnitudes; at a tie the even code wins, so the
# boundary belongs to the lower code where that code is even (0, 1.0, 2.0, 4.0).
_TIE_DOWN = (0.25, 1.25, 2.5, 5.0)
_TIE_UP = (0.75, 1.75, 3.5)


def _check(x: torch.Tensor, block_size: int) -> None:
    if block_size not in (NVFP4_BLOCK, MXFP4_BLOCK):
        raise ValueError(f"block_size={block_size} is not allowed; allowed values: 16 (NVFP4), 32 (MXFP4)")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K]; got {x.dim()}-D shape {tuple(x.shape)}")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"x.dtype={x.dtype} is not allowed; allowed values: float32, bfloat16, float16")
    if x.shape[1] % block_size:
        raise ValueError(f"K={x.shape[1]} must be a multiple of block_size={block_size}")


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (uint8, 0..15) of float32 values: ties to even, saturating at +-6."""
    mag = v.abs()
    code = sum((mag > t).to(torch.uint8) for t in _TIE_DOWN) + sum((mag >= t).to(torch.uint8) for t in _TIE_UP)
    code = torch.where(torch.isnan(v), torch.zeros_like(code), code)
    return code | (torch.signbit(v) & ~torch.isnan(v)).to(torch.uint8) << 3


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of 4-bit codes (uint8 holding 0..15)."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[M, K] codes -> [M, K/2] bytes, the even index in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack two codes a byte; got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[M, K/2] bytes -> [M, K] codes."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def float4_view(packed: torch.Tensor) -> torch.Tensor:
    """The packed bytes viewed as torch.float4_e2m1fn_x2 (same memory, no conversion)."""
    return packed.view(torch.float4_e2m1fn_x2)


def _round_up(n: int, base: int) -> int:
    return (n + base - 1) // base * base


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """[M, S] scales -> 1-D swizzled order (rows padded to 128, columns to 4, pads zero).

    Within a 512-byte tile the scale of (m, k) sits at ``(m%32)*16 + ((m%128)//32)*4 + k%4``;
    tiles are ordered [M/128, S/4], row tiles outermost.
    """
    m, s = scales.shape
    mp, sp = _round_up(m, 128), _round_up(s, 4)
    raw = scales.view(torch.uint8) if scales.element_size() == 1 else scales
    padded = torch.zeros(mp, sp, dtype=raw.dtype, device=raw.device)
    padded[:m, :s] = raw
    tiled = padded.view(mp // 128, 4, 32, sp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)
    return tiled.view(scales.dtype) if raw is not scales else tiled


def unswizzle_128x4(swizzled: torch.Tensor, m: int, s: int) -> torch.Tensor:
    """Inverse of swizzle_128x4: the 1-D swizzled scales back to [m, s]."""
    mp, sp = _round_up(m, 128), _round_up(s, 4)
    if swizzled.numel() != mp * sp:
        raise ValueError(f"swizzled has {swizzled.numel()} scales; [{m}, {s}] padded to 128x4 needs {mp * sp}")
    raw = swizzled.view(torch.uint8) if swizzled.element_size() == 1 else swizzled
    grid = raw.reshape(mp // 128, sp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(mp, sp)
    out = grid[:m, :s].contiguous()
    return out.view(swizzled.dtype) if raw is not swizzled else out


def global_scale_for(x: torch.Tensor) -> torch.Tensor:
    """FlashInfer's NVFP4 global scale, 448*6/amax, as a float32 scalar (1.0 for an all-zero x)."""
    amax = x.detach().float().abs().nan_to_num(nan=0.0).amax()
    return torch.where(amax > 0, (E4M3_MAX * E2M1_MAX) / amax, torch.ones_like(amax)).to(torch.float32)


def _e8m0_round_up(v: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 code of 2**ceil(log2(v)), saturating at 2**127; 0 for v == 0, 255 (NaN) for NaN."""
    mantissa, exponent = torch.frexp(v)
    log2_up = torch.where(mantissa == 0.5, exponent - 1, exponent)
    code = (log2_up + 127).clamp(0, 254)
    code = torch.where(v == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isinf(v), torch.full_like(code, 254), code)
    code = torch.where(torch.isnan(v), torch.full_like(code, 255), code)
    return code.to(torch.uint8)


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
    ``swizzle``; global_scale a float32 scalar tensor (NVFP4) or None (MXFP4).
    """
    _check(x, block_size)
    m, k = x.shape
    xf = x.float()
    blocks = xf.view(m, k // block_size, block_size)
    vec_max = blocks.abs().nan_to_num(nan=0.0).amax(dim=-1)
    if block_size == MXFP4_BLOCK:
        if global_scale is not None:
            raise ValueError("global_scale must be None for MXFP4 (block_size=32): MXFP4 has no global scale")
        sf_code = _e8m0_round_up(vec_max * torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32))
        inv = torch.where(sf_code == 255, torch.zeros(()), torch.exp2(127.0 - sf_code.float()))
        scales, gs = sf_code.view(torch.float8_e8m0fnu), None
    else:
        gs = global_scale_for(x) if global_scale is None else torch.as_tensor(global_scale, dtype=torch.float32).reshape(())
        gs = gs.to(xf.device)
        sf_value = gs * (vec_max * torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32))
        scales = sf_value.nan_to_num(nan=E4M3_MAX).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        sf = scales.float()
        inv = torch.where(sf != 0, 1.0 / (sf * (1.0 / gs)), torch.zeros_like(sf))
    codes = e2m1_encode(blocks * inv.unsqueeze(-1)).view(m, k)
    if swizzle:
        scales = swizzle_128x4(scales)
    return pack_e2m1(codes), scales, gs


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
    if block_size not in (NVFP4_BLOCK, MXFP4_BLOCK):
        raise ValueError(f"block_size={block_size} is not allowed; allowed values: 16 (NVFP4), 32 (MXFP4)")
    values = e2m1_decode(unpack_e2m1(codes))
    m, k = values.shape
    if swizzle:
        scales = unswizzle_128x4(scales.reshape(-1), m, k // block_size)
    scale = scales.float()
    if global_scale is not None:
        scale = scale / torch.as_tensor(global_scale, dtype=torch.float32, device=scale.device)
    return (values.view(m, k // block_size, block_size) * scale.unsqueeze(-1)).view(m, k).to(dtype)
