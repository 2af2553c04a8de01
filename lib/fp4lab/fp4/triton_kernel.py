"""The fused NVFP4/MXFP4 quantize kernel in Triton (imported only when used; see fp4lab.fp4.kernels).

Each program quantizes a [BM, BK] tile: loads x once, computes the kernel's block max, the
E4M3 or E8M0 scale by integer bit operations, E2M1 codes by threshold comparison, and stores
packed codes and scale bytes (linear or 128x4 swizzled). ``tuned_quantize_kernel`` is the same
kernel with its tile and warp count chosen per (M, K) by Triton's autotuner on a GPU; every
choice gives the same bytes, as each element's arithmetic is the same.
``finite_amax_kernel`` is the NVFP4 global scale's amax in one pass over x.
"""

import triton
import triton.language as tl


@triton.jit
def _rcp(v, APPROX: tl.constexpr):
    if APPROX:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [v], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.math.div_rn(
            tl.full(v.shape, 1.0, tl.float32), v
        )  # "/" may be approximate on a GPU


@triton.jit
def _e4m3_satfinite(v):
    """float32 -> (E4M3 value as float32, its byte as int32): RNE, +-448 saturation, NaN 0x7F."""
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    a = tl.minimum(tl.abs(v), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # keep 3 mantissa bits, ties to even
    sub = (a + 16384.0) - 16384.0  # multiples of 2**-9, ties to even
    value = tl.where(a >= 0.015625, normal.to(tl.float32, bitcast=True), sub)
    vbits = value.to(tl.int32, bitcast=True)
    byte = tl.where(
        value >= 0.015625,
        ((((vbits >> 23) & 0xFF) - 120) << 3) | ((vbits >> 20) & 7),
        (value * 512.0).to(tl.int32),
    )
    byte = tl.where(v != v, 0x7F, byte | (sign << 7))
    value = tl.where(v != v, v, tl.where(sign == 1, -value, value))
    return value, byte


@triton.jit
def _e2m1(v):
    mag = tl.abs(v)
    code = (
        (mag > 0.25).to(tl.int32)
        + (mag >= 0.75).to(tl.int32)
        + (mag > 1.25).to(tl.int32)
        + (mag >= 1.75).to(tl.int32)
    )
    code += (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32) + (mag > 5.0).to(tl.int32)
    code = code | (((v.to(tl.int32, bitcast=True) >> 31) & 1) << 3)
    return tl.where(v != v, 7, code)


@triton.jit
def _nan_skipping_max(t, AXIS: tl.constexpr):
    m = tl.max(tl.where(t != t, -1.0, t), axis=AXIS)
    return tl.where(m < 0, float("nan"), m)


@triton.jit
def quantize_kernel(
    x_ptr,
    gs_ptr,
    codes_ptr,
    sf_ptr,
    M,
    K,
    stride_xm,
    k_tiles,
    BLOCK: tl.constexpr,
    MX: tl.constexpr,
    SWIZZLE: tl.constexpr,
    APPROX_RCP: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
):
    NB: tl.constexpr = BK // BLOCK
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    inside = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(
        x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=inside, other=0.0
    ).to(tl.float32)
    even, odd = tl.split(tl.reshape(x, [BM, NB, BLOCK // 2, 2]))
    e_max, o_max = _nan_skipping_max(tl.abs(even), 2), _nan_skipping_max(tl.abs(odd), 2)
    vec_max = tl.where(e_max > o_max, e_max, o_max)
    r6 = _rcp(tl.full([BM, NB], 6.0, tl.float32), APPROX_RCP)
    if MX:
        v = vec_max * r6
        vbits = v.to(tl.int32, bitcast=True)
        exp_field = (vbits >> 23) & 0xFF
        up = tl.where(
            exp_field == 0,
            (vbits > 0x00400000).to(tl.int32),
            exp_field + ((vbits & 0x7FFFFF) != 0).to(tl.int32),
        )
        sf_byte = tl.where(v != v, 255, tl.minimum(up, 254))
        usable = (sf_byte != 0) & (sf_byte < 254)
        scale = tl.where(usable, ((254 - sf_byte) << 23).to(tl.float32, bitcast=True), 0.0)
    else:
        gs = tl.load(gs_ptr)
        sf_value, sf_byte = _e4m3_satfinite(gs * (vec_max * r6))
        scale = tl.where(
            sf_byte != 0,
            _rcp(sf_value * _rcp(gs + tl.zeros([BM, NB], tl.float32), APPROX_RCP), APPROX_RCP),
            0.0,
        )
    lo, hi = even * scale[:, :, None], odd * scale[:, :, None]
    packed = tl.reshape((_e2m1(lo) | (_e2m1(hi) << 4)).to(tl.uint8), [BM, BK // 2])
    half_cols = tl.program_id(1) * (BK // 2) + tl.arange(0, BK // 2)
    tl.store(
        codes_ptr + rows[:, None].to(tl.int64) * (K // 2) + half_cols[None, :],
        packed,
        mask=(rows[:, None] < M) & (half_cols[None, :] < K // 2),
    )
    sf_cols = tl.program_id(1) * NB + tl.arange(0, NB)
    sf_inside = (rows[:, None] < M) & (sf_cols[None, :] < K // BLOCK)
    if SWIZZLE:
        m, k = rows[:, None].to(tl.int64), sf_cols[None, :]
        offset = (
            ((m // 128) * k_tiles + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
        )
    else:
        offset = rows[:, None].to(tl.int64) * (K // BLOCK) + sf_cols[None, :]
    tl.store(sf_ptr + offset, sf_byte.to(tl.uint8), mask=sf_inside)


TILE_CONFIGS = [
    triton.Config({"BM": bm, "BK": bk}, num_warps=warps)
    for bm, bk, warps in (
        (16, 256, 4),
        (32, 256, 4),
        (32, 256, 8),
        (64, 256, 8),
        (16, 512, 4),
        (32, 512, 8),
        (64, 128, 4),
        (128, 128, 8),
    )
]
"""Tiles from 2K to 16K elements at 4 or 8 warps (BK a power of two and a multiple of 32). On an
H200 (8192x8192 bf16) 16x256 at 4 warps was fastest; loading even and odd elements as two
stride-2 loads instead of splitting the loaded tile was 3.5x slower and is not offered."""

tuned_quantize_kernel = triton.autotune(configs=TILE_CONFIGS, key=["M", "K"])(quantize_kernel)


@triton.jit
def finite_amax_kernel(x_ptr, out_ptr, n, CHUNK: tl.constexpr):
    """out[0] = max(out[0], max |x| over the finite elements of this program's chunk); out must
    start at 0. Exact: a maximum does not round, and every |x| is >= 0, so the float atomic max
    orders like the values."""
    offsets = tl.program_id(0).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mag = tl.abs(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32))
    tl.atomic_max(out_ptr, tl.max(tl.where(mag < float("inf"), mag, 0.0), axis=0))
