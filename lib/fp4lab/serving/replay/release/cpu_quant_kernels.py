"""Inside one SGLang environment: the CPU kernels that stand in for block-scaled quantize and
dequantize kernels outside NVFP4 (which ``cpu_kernels`` holds): FlashInfer's MXFP8 quantize,
triton_kernels' MXFP upcast and SGLang's per-token-group 8-bit quantize, each by its definition.
"""

from __future__ import annotations

from typing import Any

import torch

from fp4lab.fp4 import encodings, swizzle


def mxfp8_quantize(input: torch.Tensor, is_sf_swizzled_layout: bool = True, alignment: int = 32,
                   enable_pdl: bool | None = None, backend: str = "cuda",
                   sf_swizzle_layout: Any = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """FlashInfer's MXFP8 quantize (the MXFP4 MoE's activations, SM120) by its definition: blocks
    of 32 along the last dimension, each with the smallest power-of-two scale (UE8M0, stored as
    its exponent + 127) that brings the block's amax within e4m3's 448, codes in e4m3; scales
    in the 128x4 layout, flattened, or linear [M, K/32]."""
    x = input.float().reshape(-1, input.shape[-1])
    blocks = x.view(x.shape[0], -1, 32)
    exponent = torch.ceil(torch.log2(blocks.abs().amax(-1).clamp(min=2**-126) / 448.0))
    exponent = exponent.clamp(-127, 127)
    codes = (blocks / torch.exp2(exponent).unsqueeze(-1)).view(input.shape)
    scales = (exponent + 127).to(torch.uint8)
    linear = getattr(sf_swizzle_layout, "name", "") == "layout_linear" or (
        sf_swizzle_layout is None and not is_sf_swizzled_layout
    )
    return codes.to(torch.float8_e4m3fn), scales if linear else swizzle.swizzle_128x4(scales)


def upcast_from_mxfp(tensor: torch.Tensor, scale: torch.Tensor, axis: int,
                     target_dtype: torch.dtype | None = None, dtype: torch.dtype | None = None,
                     tensor_scale: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """triton_kernels' MXFP upcast (the MXFP4 MoE's weights dequantized at load where the release
    takes neither its Triton nor a FlashInfer MoE) by its definition: along ``axis``, two E2M1
    codes a byte (the even index low) or FP8 values, blocks of 32 each times 2^(scale - 127).
    The output dtype is ``target_dtype``, or ``dtype`` as older triton_kernels name it; newer
    ones multiply the output by ``tensor_scale`` (one value, or one per row across ``axis``)."""
    if scale.dtype != torch.uint8:
        raise NotImplementedError("fp4lab's upcast covers MX (UE8M0) block scales only, not "
                                  f"{scale.dtype} (NVFP4's e4m3 blocks of 16)")  # fmt: skip
    out = _upcast(tensor, scale, axis, target_dtype or dtype)
    if tensor_scale is None:
        return out
    axis = axis % tensor.ndim
    shape = ((1,) * out.ndim if tensor_scale.numel() == 1
             else (*tensor_scale.shape[:axis], 1, *tensor_scale.shape[axis:]))  # fmt: skip
    return out * tensor_scale.reshape(shape)


def _upcast(tensor: torch.Tensor, scale: torch.Tensor, axis: int, target_dtype: torch.dtype
            ) -> torch.Tensor:  # fmt: skip
    values = tensor.transpose(axis, -1)
    if tensor.dtype == torch.uint8:
        values = encodings.e2m1_decode(encodings.unpack_e2m1(values))
    values = values.float()
    factor = torch.exp2(scale.transpose(axis, -1).float() - 127).repeat_interleave(32, dim=-1)
    out = values * factor[..., : values.shape[-1]]
    finfo = torch.finfo(target_dtype)
    return out.clamp(finfo.min, finfo.max).to(target_dtype).transpose(axis, -1)


def per_token_group_quant(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor,
                          group_size: int, scale_ue8m0: bool = False, fuse_silu_and_mul: bool = False,
                          masked_m: torch.Tensor | None = None, expected_m: int | None = None) -> None:  # fmt: skip
    """SGLang's JIT per-token-group quantize by its definition: the input (SiLU(gate) * up where
    fused), each group of ``group_size`` along the last dimension scaled by its amax over the
    code range (e4m3's 448, int8's 127; rounded up to a power of two for UE8M0), codes written
    to ``output_q``; scales to ``output_s`` as float32, or as UE8M0 exponent bytes four to an
    int32, the first group lowest (the rows of a masked layout past ``masked_m`` too)."""
    x = input.float()
    if fuse_silu_and_mul:
        gate, up = x.chunk(2, dim=-1)
        x = torch.nn.functional.silu(gate) * up
    top = 127.0 if output_q.dtype == torch.int8 else 448.0
    groups = x.unflatten(-1, (-1, group_size))
    scale = groups.abs().amax(-1).clamp(min=1e-10) / top
    if scale_ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    codes = (groups / scale.unsqueeze(-1)).clamp(-top, top).flatten(-2)
    output_q.copy_(codes.round() if output_q.dtype == torch.int8 else codes)
    if output_s.dtype != torch.int32:
        output_s.copy_(scale)
        return
    exponents = (torch.log2(scale) + 127).to(torch.uint8)
    padded = torch.nn.functional.pad(exponents, (0, -exponents.shape[-1] % 4))
    output_s.copy_(padded.contiguous().view(torch.int32))
