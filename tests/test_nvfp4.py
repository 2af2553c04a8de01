"""fp4lab.fp4.nvfp4, the spec: encodings, the kernel's edge cases, swizzle, error bounds,
independent peers and reciprocal sensitivity."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4lab.fp4 import crosscheck, edge_cases, encodings, kernels, nvfp4, reciprocals, swizzle

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_every_code_round_trips_and_packs_even_index_low():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encodings.e2m1_encode(encodings.e2m1_decode(codes)), codes)
    packed = encodings.pack_e2m1(codes.view(2, 8))
    assert packed[0, 0] == 0x10 and packed[1, 3] == (15 << 4 | 14)
    assert torch.equal(encodings.unpack_e2m1(packed), codes.view(2, 8))
    view = encodings.float4_view(packed)
    assert (
        view.dtype == torch.float4_e2m1fn_x2
        and view.shape == (2, 4)
        and view.data_ptr() == packed.data_ptr()
    )
    with pytest.raises(ValueError, match="must be even"):
        encodings.pack_e2m1(torch.zeros(2, 3, dtype=torch.uint8))


@pytest.mark.parametrize("low, high", list(itertools.pairwise(E2M1_MAGNITUDES)))
def test_ties_go_to_the_even_code_and_neighbours_to_the_nearest(low, high):
    mid = torch.tensor((low + high) / 2)
    low_code, high_code = E2M1_MAGNITUDES.index(low), E2M1_MAGNITUDES.index(high)
    even = low_code if low_code % 2 == 0 else high_code
    assert encodings.e2m1_encode(mid) == even
    assert encodings.e2m1_encode(-mid) == even | 8
    assert encodings.e2m1_encode(torch.nextafter(mid, torch.tensor(0.0))) == low_code
    assert encodings.e2m1_encode(torch.nextafter(mid, torch.tensor(9.0))) == high_code


def test_saturation_signed_zero_and_non_finite():
    v = torch.tensor(
        [6.0, 6.0001, 100.0, float("inf"), -7.0, -float("inf"), -0.0, -1e-30, 1e-30, float("nan")]
    )
    assert encodings.e2m1_encode(v).tolist() == [
        7,
        7,
        7,
        7,
        15,
        15,
        8,
        8,
        0,
        encodings.E2M1_CODE_FOR_NAN,
    ]


def test_e4m3_scale_rounding_is_nearest_even_and_saturating():
    values = (
        torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    )  # every finite non-negative E4M3
    assert torch.equal(encodings.e4m3_encode(values), torch.arange(0, 127, dtype=torch.uint8))
    lo, hi = values[:-1], values[1:]
    mid = (lo + hi) / 2  # exact in float32
    expected_even = torch.where(
        torch.arange(126) % 2 == 0, torch.arange(126), torch.arange(1, 127)
    ).to(torch.uint8)
    assert torch.equal(encodings.e4m3_encode(mid), expected_even)
    assert torch.equal(
        encodings.e4m3_encode(torch.nextafter(mid, hi)), torch.arange(1, 127, dtype=torch.uint8)
    )
    assert torch.equal(
        encodings.e4m3_encode(torch.nextafter(mid, lo)), torch.arange(0, 126, dtype=torch.uint8)
    )
    special = torch.tensor(
        [448.0, 463.0, 464.0, 1e9, float("inf"), float("nan"), -float("nan"), 2.0**-10, 1e-30]
    )
    assert encodings.e4m3_encode(special).tolist() == [
        0x7E,
        0x7E,
        0x7E,
        0x7E,
        0x7E,
        0x7F,
        0x7F,
        0,
        0,
    ]


def test_e8m0_rounds_up_to_a_power_of_two():
    v = torch.tensor(
        [
            1.0,
            1.0000001,
            0.75,
            2.0**-127,
            1.5 * 2.0**-127,
            2.0**-130,
            0.0,
            2.0**127,
            3e38,
            float("inf"),
            float("nan"),
        ]
    )
    assert encodings.e8m0_encode_round_up(v).tolist() == [
        127,
        128,
        127,
        0,
        1,
        0,
        0,
        254,
        254,
        254,
        255,
    ]


def test_block_amax_follows_the_kernels_nan_lanes():
    nan = float("nan")
    block = torch.arange(1.0, 17.0).repeat(4, 1)
    block[1, 1::2] = nan  # every odd position NaN: the odd lane wins the final compare, NaN
    block[2, 0::2] = nan  # every even position NaN: the odd lane's max
    block[3, 5] = nan  # one NaN: skipped
    amax = nvfp4.block_amax(block)
    assert amax[0] == 16 and math.isnan(amax[1]) and amax[2] == 16 and amax[3] == 16


def _nvfp4_block(values: list[float], gs: float = 1.0) -> tuple[list[int], int]:
    x = torch.tensor(values, dtype=torch.float32).view(1, 16)
    codes, sf, _ = kernels.quantize(x, gs)
    return encodings.unpack_e2m1(codes)[0].tolist(), int(_u8(sf)[0, 0])


def test_kernel_edge_cases_nvfp4():
    assert _nvfp4_block([0.0] * 16) == ([0] * 16, 0)
    assert _nvfp4_block([-0.0] * 16) == ([8] * 16, 0)
    # A block whose SF underflows to 0: codes are x * 0, signed zeros.
    assert _nvfp4_block([1e-6, -1e-6] * 8) == ([0, 8] * 8, 0)
    # +-inf: SF saturates to 448 (0x7E); inf -> +6, -inf -> -6, finite values vanish at that scale.
    codes, sf = _nvfp4_block([float("inf"), -float("inf")] + [1.0] * 14)
    assert sf == 0x7E and codes == [7, 15] + [0] * 14
    # every odd position NaN: SF is NaN (0x7F) and every code is the NaN code.
    codes, sf = _nvfp4_block([1.0, float("nan")] * 8)
    assert sf == 0x7F and codes == [encodings.E2M1_CODE_FOR_NAN] * 16
    # a single NaN is skipped by the max; that element alone gets the NaN code.
    codes, sf = _nvfp4_block([float("nan")] + [6.0] * 15)
    assert (
        sf == encodings.e4m3_encode(torch.tensor(1.0))
        and codes == [encodings.E2M1_CODE_FOR_NAN] + [7] * 15
    )


def test_kernel_edge_cases_mxfp4():
    def block(values):
        codes, e, gs = kernels.quantize(torch.tensor(values).view(1, 32), block_size=32)
        assert gs is None and e.dtype == torch.float8_e8m0fnu
        return encodings.unpack_e2m1(codes)[0].tolist(), int(_u8(e)[0, 0])

    assert block([0.0] * 32) == ([0] * 32, 0)
    assert block([6.0] * 32) == ([7] * 32, 127)  # 6 * rcp(6) rounds to exactly 1.0
    # exponent 0 (amax/6 <= 2**-127) uses scale 0, not 2**127: codes are signed zeros.
    assert block([1e-39, -1e-39] * 16) == ([0, 8] * 16, 0)
    # +inf saturates the exponent to 254, whose scale the kernel builds as 0: inf * 0 = NaN.
    codes, e = block([float("inf")] + [1.0] * 31)
    assert e == 254 and codes == [encodings.E2M1_CODE_FOR_NAN] + [0] * 31


def test_global_scale_is_flashinfers_convention():
    x = torch.tensor([[3.0, -7.0, float("inf"), float("nan")] * 4])
    assert nvfp4.global_scale_for(x) == torch.tensor(448.0 * 6.0 / 7.0, dtype=torch.float32)
    assert nvfp4.global_scale_for(torch.zeros(1, 16)) == 1.0


def test_swizzle_offsets_roundtrip_and_peers():
    from torch.testing._internal.common_quantized import from_blocked, to_blocked
    from torchao.prototype.mx_formats.utils import to_blocked as torchao_to_blocked

    grid = torch.randint(
        1, 255, (300, 13), generator=torch.Generator().manual_seed(0), dtype=torch.uint8
    )
    swizzled = swizzle.swizzle_128x4(grid)
    assert swizzled.numel() == 384 * 16 and nvfp4.swizzled_shape(300, 13) == (384, 16)
    m, k = torch.meshgrid(torch.arange(300), torch.arange(13), indexing="ij")
    assert torch.equal(swizzled[swizzle.swizzled_offset(m, k, 13)], grid)
    assert int(swizzled.count_nonzero()) == grid.numel()  # every pad is zero
    assert torch.equal(swizzle.unswizzle_128x4(swizzled, 300, 13), grid)
    assert torch.equal(swizzled, to_blocked(grid)) and torch.equal(
        swizzled, torchao_to_blocked(grid)
    )
    small = grid[:130, :5].contiguous()
    assert torch.equal(
        from_blocked(torch.empty(130, 5 * 16), swizzle.swizzle_128x4(small), 16), small
    )
    with pytest.raises(ValueError, match="padded to 128x4 needs"):
        swizzle.unswizzle_128x4(swizzled[:-1], 300, 13)


def test_quantize_swizzle_matches_unswizzled_and_dequantize_agrees():
    x = torch.randn(200, 96, dtype=torch.bfloat16)
    for block_size in (16, 32):
        codes, scales, gs = kernels.quantize(x, block_size=block_size)
        codes_s, scales_s, _ = kernels.quantize(x, block_size=block_size, swizzle=True)
        assert torch.equal(codes, codes_s) and scales_s.dim() == 1
        plain = nvfp4.dequantize(codes, scales, gs, block_size=block_size)
        assert torch.equal(
            plain, nvfp4.dequantize(codes_s, scales_s, gs, block_size=block_size, swizzle=True)
        )


def test_values_on_the_grid_round_trip_exactly():
    g = torch.Generator().manual_seed(1)
    grid = torch.tensor(encodings.E2M1_VALUES)[torch.randint(0, 16, (64, 64), generator=g)]
    grid[:, ::16] = 6.0  # every block reaches 6: SF = 2**j exactly at gs = 1
    x = grid * 2.0 ** torch.randint(-4, 5, (64, 4), generator=g).float().repeat_interleave(
        16, dim=1
    )
    codes, scales, gs = kernels.quantize(x, 1.0)
    assert torch.equal(nvfp4.dequantize(codes, scales, gs), x)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(x=torch.zeros(2, 4, 16)), "must be 2-D"),
        (dict(x=torch.zeros(2, 24)), "multiple of block_size=16"),
        (dict(x=torch.zeros(2, 16, dtype=torch.float64)), "x.dtype=torch.float64 is not allowed"),
        (dict(x=torch.zeros(2, 64), block_size=8), "block_size=8 is not allowed"),
        (dict(x=torch.zeros(2, 64), global_scale=1.0, block_size=32), "MXFP4 has no global scale"),
    ],
)
def test_bad_input_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        kernels.quantize(**bad)


def _half_step(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v < 2.0, 0.25, torch.where(v < 4.0, 0.5, 1.0))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    blocks=st.integers(1, 4),
    data=st.data(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_error_is_within_half_a_step_of_the_block_scale(rows, blocks, data, dtype):
    n = rows * blocks * 16
    magnitude = data.draw(st.floats(1e-3, 1e3))
    values = data.draw(
        st.lists(st.floats(-1.0, 1.0, allow_nan=False, width=32), min_size=n, max_size=n)
    )
    x = (torch.tensor(values).view(rows, blocks * 16) * magnitude).to(dtype)
    codes, scales, gs = kernels.quantize(x)
    xf = x.float()
    block_scale = (scales.float() / gs).repeat_interleave(
        16, dim=1
    )  # dequantized value = e2m1 * block_scale
    error = (nvfp4.dequantize(codes, scales, gs) - xf).abs()
    normal_sf = (scales.float() >= 2.0**-6).repeat_interleave(16, dim=1)
    scaled = xf.abs() / block_scale
    # E4M3 rounds the SF to within 2**-4 relative, so amax/SF exceeds 6 by at most that.
    assert bool((scaled[normal_sf] <= 6.0 * (1 + 2.0**-4) * (1 + 1e-6)).all())
    bound = (_half_step(scaled) + (scaled - 6.0).clamp(min=0)) * block_scale
    assert bool((error[normal_sf] <= bound[normal_sf] * (1 + 1e-6)).all())
    zero_sf = (scales.float() == 0).repeat_interleave(16, dim=1)
    assert bool((error[zero_sf] == xf.abs()[zero_sf]).all())


def _bf16(distribution: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 512, generator=g)
    if distribution == "heavy":
        x = x / torch.randn(256, 512, generator=g).abs().clamp(min=0.05)
    return x.to(torch.bfloat16)


def test_torchao_nvfp4_identical_on_random_inputs():
    # seeded: an unseeded float32 draw now and then rounds one scale apart (torchao divides
    # where the kernel multiplies: the difference crosscheck explains as "scale_rounding")
    float32 = torch.randn(128, 256, generator=torch.Generator().manual_seed(0))
    for x in (_bf16("normal"), _bf16("heavy"), float32):
        comparison = crosscheck.compare_torchao_nvfp4(x)
        assert comparison.identical, comparison.as_record()


def test_torch_mxfp4_identical_on_bfloat16_and_explained_on_float32():
    for x in (_bf16("normal"), _bf16("heavy")):
        comparison = crosscheck.compare_torch_mxfp4(x)
        assert comparison.identical, comparison.as_record()
    f32 = crosscheck.compare_torch_mxfp4(torch.randn(128, 256))
    assert (
        f32.unexplained == 0
        and set(f32.code_differences) <= {"bf16_rounding"}
        and not f32.scale_differences
    )


def test_peers_differ_on_adversarial_inputs_only_for_named_conventions():
    x = edge_cases.adversarial_input()
    ao = crosscheck.compare_torchao_nvfp4(x)
    assert ao.unexplained == 0, ao.as_record()
    assert ao.scale_differences["scale_floor_clamp"] > 0 and ao.code_differences["nan_policy"] > 0
    mx = crosscheck.compare_torch_mxfp4(x)
    assert mx.unexplained == 0 and mx.code_differences["nan_policy"] > 0, mx.as_record()
    ties = crosscheck.compare_torchao_nvfp4(edge_cases.tie_input())
    assert ties.unexplained == 0 and set(ties.code_differences) <= {"code_rounding"}


def test_reciprocal_sensitivity_marks_exact_ties_only():
    assert reciprocals.reciprocal_sensitivity(torch.randn(128, 256))["codes_that_could_move"] == 0
    assert (
        reciprocals.reciprocal_sensitivity(edge_cases.tie_input(), 1.0)["codes_that_could_move"]
        == 0
    )
    movable = reciprocals.reciprocal_sensitivity(_bf16("normal"))
    assert 0 < movable["code_fraction"] < 0.01 and movable["scales_that_could_move"] == 0
    assert (
        reciprocals.reciprocal_sensitivity(_bf16("normal"), block_size=32)["codes_that_could_move"]
        == 0
    )
