"""The bits of FP4: E2M1 element codes, E4M3 and E8M0 scale bytes, two codes a byte.

Each encode is the conversion FlashInfer's kernel uses (``cvt.rn.satfinite.e2m1x2.f32``,
``cvt.rn.satfinite.e4m3x2.f32``, ``cvt.rp.satfinite.ue8m0x2.f32``), in float32 on any device;
``fp4lab.fp4.nvfp4`` builds the quantize reference from them.
"""

from __future__ import annotations

import functools

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
"""Code the reference gives a NaN reaching the E2M1 conversion (+6); unverified, see fp4lab.fp4.nvfp4."""


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
    # the sign bit, -0.0 included (copysign vectorizes; signbit does not)
    negative = torch.copysign(torch.ones_like(m), v) < 0
    code = code + negative.float() * 8.0
    return torch.where(v != v, torch.full_like(code, E2M1_CODE_FOR_NAN), code).to(torch.uint8)


@functools.cache
def _e2m1_table(device: torch.device) -> torch.Tensor:
    """E2M1_VALUES on ``device``, copied from the host once per device."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of 4-bit codes (uint8 holding 0..15); under torch.compile the table is a
    constant of the graph (dynamo traces through a cache, and warns that it does)."""
    if torch.compiler.is_compiling():
        table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    else:
        table = _e2m1_table(codes.device)
    return table[codes.long()]


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
