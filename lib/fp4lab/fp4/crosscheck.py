"""The NVFP4/MXFP4 reference against independent implementations, every difference counted and named.

Peers: torchao's ``nvfp4_quantize`` (``torchao.prototype.mx_formats.nvfp4_tensor``) and
torch's own test helper ``to_mxfp(format="mxfp4")`` (``torch.testing._internal.common_quantized``).
They follow other conventions than FlashInfer's kernel; each known convention is a cause:

* ``scale_floor_clamp``: torchao clamps block scales to at least ``finfo(float8_e4m3fn).tiny``
  = 2**-6 (E4M3's smallest normal), so every block whose SF would be below 2**-6 (all-zero
  blocks, E4M3 subnormal SFs, SFs that underflow to 0) gets SF byte 0x08 and other codes.
* ``scale_rounding``: torchao divides (amax/6/per_tensor_scale) where the kernel multiplies
  (gs*(amax*rcp(6))); the two float32 values differ by an ulp or two and land on either side
  of an E4M3 rounding boundary.
* ``code_rounding``: the element scales differ by an ulp or two (torchao: (1/pts)/SF, kernel:
  1/(SF*(1/gs))) and the scaled values straddle an E2M1 rounding boundary.
* ``nan_policy`` / ``inf_policy``: the peers' amax propagates NaN; the kernel's skips it (see
  fp4lab.fp4.nvfp4); an infinite element meets a different scale (MXFP4: the kernel's scale is 0
  for exponent 254, torch's 2**-127).
* ``zero_exponent``: torch's MXFP4 uses scale 1.0 for exponent 0, the kernel 0.
* ``log2_rounding`` (MXFP4): torch takes ceil(log2(amax/6)) in float32, which rounds to the
  lower exponent when amax/6 is within float32 rounding of a power of two above it.
* ``bf16_rounding`` (MXFP4): torch rounds the scaled values to bfloat16 before E2M1.

A difference matching none is ``unexplained``; tests require that count to be zero.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from fp4lab.fp4 import encodings, nvfp4

_ULP_SLACK = 4
"""How many float32 ulps apart two arithmetic orders may land (each rounds 2-3 times)."""


@dataclass
class Comparison:
    """Differences between the reference and a peer, by cause."""

    peer: str
    elements: int
    blocks: int
    code_differences: Counter = field(default_factory=Counter)
    scale_differences: Counter = field(default_factory=Counter)

    @property
    def identical(self) -> bool:
        return not self.code_differences and not self.scale_differences

    @property
    def unexplained(self) -> int:
        return self.code_differences["unexplained"] + self.scale_differences["unexplained"]

    def as_record(self) -> dict:
        return {
            "peer": self.peer,
            "elements": self.elements,
            "blocks": self.blocks,
            "code_differences": dict(self.code_differences),
            "scale_differences": dict(self.scale_differences),
            "codes_differing": sum(self.code_differences.values()),
            "scales_differing": sum(self.scale_differences.values()),
            "unexplained": self.unexplained,
        }


def _close(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether float32 values are within a few ulps of each other."""
    ulp = torch.finfo(torch.float32).eps * torch.maximum(a.abs(), b.abs())
    return (a - b).abs() <= _ULP_SLACK * ulp


def _block_flags(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.isnan(blocks).any(-1), torch.isinf(blocks).any(-1)


def compare_torchao_nvfp4(x: torch.Tensor) -> Comparison:
    """The reference (gs = 448*6/amax) against torchao's nvfp4_quantize (per_tensor_scale = amax/(448*6))."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    nvfp4.check_input(x, nvfp4.NVFP4_BLOCK)
    xf = x.float()
    mag = xf.abs()
    gs = nvfp4.global_scale_for(x)
    # Deliberately not 1/gs: torchao's own convention, amax / (448*6) by its own function. An
    # all-zero tensor's amax counts as 1 there (torchao would divide by a zero scale).
    amax = nvfp4.finite_amax(x)
    pts = per_tensor_amax_to_scale(torch.where(amax > 0, amax, torch.ones_like(amax)))
    ours, our_sf = nvfp4.nvfp4_codes(xf, gs)
    their_sf_e4m3, their_packed = nvfp4_quantize(x.contiguous(), 16, pts)
    theirs, their_sf = (
        encodings.unpack_e2m1(their_packed.view(torch.uint8)),
        their_sf_e4m3.view(torch.uint8),
    )

    m, k = xf.shape
    blocks = xf.view(m, k // 16, 16)
    has_nan, has_inf = _block_flags(blocks)
    vec_max = nvfp4.block_amax(blocks)
    our_sf_value = gs * (vec_max * (1.0 / torch.tensor(6.0)))
    their_sf_value = (mag.view(m, k // 16, 16).amax(-1) / encodings.E2M1_MAX) / pts

    floor = torch.finfo(torch.float8_e4m3fn).tiny
    floor_byte = int(encodings.e4m3_encode(torch.tensor(floor)))
    scale_cause = np.full(tuple(our_sf.shape), "", dtype=object)
    differ = (our_sf != their_sf).numpy()
    for idx in zip(*differ.nonzero(), strict=True):
        if has_nan[idx]:
            cause = "nan_policy"
        elif has_inf[idx]:
            cause = "inf_policy"
        elif their_sf[idx] == floor_byte and their_sf_value[idx] < floor:
            cause = "scale_floor_clamp"
        elif our_sf_value[idx] > 0 and _close(our_sf_value[idx], their_sf_value[idx]):
            cause = "scale_rounding"
        else:
            cause = "unexplained"
        scale_cause[idx] = cause
    comparison = Comparison("torchao.nvfp4_quantize", xf.numel(), our_sf.numel())
    comparison.scale_differences.update(c for c in scale_cause.ravel() if c)

    our_scale_value = torch.where(
        our_sf != 0, 1.0 / (our_sf.view(torch.float8_e4m3fn).float() * (1.0 / gs)), torch.zeros(())
    )
    their_scale_value = (1.0 / pts) / their_sf.view(torch.float8_e4m3fn).float()
    code_differ = (ours != theirs).view(m, k // 16, 16)
    for b0, b1, e in zip(*code_differ.nonzero(as_tuple=True), strict=True):
        block = (int(b0), int(b1))
        value = blocks[block][e]
        if scale_cause[block]:
            cause = scale_cause[block]
        elif torch.isnan(value) or has_nan[block]:
            cause = "nan_policy"
        elif torch.isinf(value) or has_inf[block]:
            cause = "inf_policy"
        elif _close(value * our_scale_value[block], value * their_scale_value[block]):
            cause = "code_rounding"
        else:
            cause = "unexplained"
        comparison.code_differences[cause] += 1
    return comparison


def compare_torch_mxfp4(x: torch.Tensor) -> Comparison:
    """The reference's MXFP4 against torch's own test helper ``to_mxfp(format="mxfp4")``."""
    from torch.testing._internal.common_quantized import to_mxfp

    nvfp4.check_input(x, nvfp4.MXFP4_BLOCK)
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(
            f"x.dtype={x.dtype} is not allowed for torch's to_mxfp; allowed values: bfloat16, float32"
        )
    xf = x.float()
    ours, our_e = nvfp4.mxfp4_codes(xf)
    their_e, their_packed = to_mxfp(x.contiguous(), 32, "mxfp4")
    their_e, theirs = (
        their_e.view(torch.uint8),
        encodings.unpack_e2m1(their_packed.view(torch.uint8)),
    )

    m, k = xf.shape
    blocks = xf.view(m, k // 32, 32)
    has_nan, has_inf = _block_flags(blocks)
    descale = blocks.abs().amax(-1) / encodings.E2M1_MAX
    comparison = Comparison("torch.to_mxfp(mxfp4)", xf.numel(), our_e.numel())
    scale_cause = {}
    for idx in zip(*(our_e != their_e).nonzero(as_tuple=True), strict=True):
        idx = tuple(int(i) for i in idx)
        if has_nan[idx]:
            cause = "nan_policy"
        elif has_inf[idx]:
            cause = "inf_policy"
        elif (
            int(their_e[idx]) == int(our_e[idx]) - 1
            and torch.ceil(torch.log2(descale[idx])) + 127 == their_e[idx]
        ):
            cause = "log2_rounding"
        else:
            cause = "unexplained"
        scale_cause[idx] = cause
        comparison.scale_differences[cause] += 1

    code_differ = (ours != theirs).view(m, k // 32, 32)
    for b0, b1, e in zip(*code_differ.nonzero(as_tuple=True), strict=True):
        block = (int(b0), int(b1))
        value = blocks[block][e]
        if block in scale_cause:
            cause = scale_cause[block]
        elif has_nan[block]:
            cause = "nan_policy"
        elif has_inf[block]:
            cause = "inf_policy"
        elif int(our_e[block]) == 0:
            cause = "zero_exponent"
        else:
            scaled = value * torch.exp2(127.0 - our_e[block].float())
            rounded_first = encodings.e2m1_encode(scaled.to(torch.bfloat16).float())
            cause = (
                "bf16_rounding"
                if rounded_first == theirs.view(m, k // 32, 32)[block][e]
                else "unexplained"
            )
        comparison.code_differences[cause] += 1
    return comparison
