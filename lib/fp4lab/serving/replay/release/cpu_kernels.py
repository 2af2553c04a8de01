"""Inside one SGLang environment: the CPU kernels that stand in for the CUDA, JIT and Triton
kernels SGLang's GLM-5 calls outside its MoE, each by its definition (fp4lab's spec-exact NVFP4
reference, torch norms, rotary and attention math), and the fakes of those that are ops. The
MoE's are ``cpu_moe_kernels``; where they are installed, and why, is ``kernel_tables``; how,
``kernels``.
"""

from __future__ import annotations

from typing import Any

import torch

from fp4lab.compile import fix
from fp4lab.fp4 import nvfp4, swizzle


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool):
    out.copy_(rms(x, weight, eps))


def fused_add_rmsnorm(x, residual, weight, eps, pdl) -> None:
    residual.add_(x)
    x.copy_(rms(residual, weight, eps))


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    out.copy_(
        (torch.nn.functional.silu(x[..., :half].float()) * x[..., half:].float()).to(out.dtype)
    )


LINEAR_QUANTIZE = "fp4lab reference (CPU kernel of sgl_kernel::scaled_fp4_quant)"


def scaled_fp4_quant(output, x, output_scale, global_scale) -> None:
    codes, scales = fix._ran(LINEAR_QUANTIZE, fix.reference_fp4_quantize(x, global_scale))
    output.copy_(codes)
    output_scale.view(torch.uint8).reshape(-1).copy_(scales.reshape(-1))


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return nvfp4.dequantize(codes, scales.reshape(-1), None, swizzle=True)


def fp4_gemm(x, weight, x_scale, weight_scale, alpha, out_dtype, out_features) -> torch.Tensor:
    """NVFP4 GEMM by dequantizing both operands (block scales, 128x4 layout) and a float matmul
    scaled by alpha, as FlashInfer's ``mm_fp4`` defines it; the weight may come transposed
    (FlashInfer's layout: [K/2, N] codes, scales transposed)."""
    a = dequantize(x, x_scale)
    transposed = weight.shape[0] * 2 == a.shape[1] and weight.shape[1] * 2 != a.shape[1]
    codes = weight.T.contiguous() if transposed else weight
    scales = weight_scale.T.contiguous() if transposed else weight_scale
    return ((a @ dequantize(codes, scales).T) * alpha.float()).to(out_dtype)


def nvfp4_gemm_swiglu_quant(a, a_scale, b, b_scale, alpha, output_global_scale, *, out=None,
                            out_scale=None, **options: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """SGLang's fused NVFP4 FC1 GEMM + SwiGLU + NVFP4 quantize (SM100 CuTe DSL, 0.5.17 on) by its
    definition: ``fp4_gemm`` over the interleaved weight ([up 64 rows][gate 64 rows]...), up *
    silu(gate) in float32, quantized by fp4lab's reference with the output global scale into
    codes [M, I/2] and swizzled float8 scales."""
    acc = fp4_gemm(a, b, a_scale, b_scale, alpha, torch.float32, b.shape[0])
    pairs = acc.view(acc.shape[0], -1, 2, 64)
    hidden = (pairs[:, :, 0] * torch.nn.functional.silu(pairs[:, :, 1])).reshape(acc.shape[0], -1)
    codes, scales = fp4_bytes(hidden, output_global_scale, True)
    out = codes if out is None else out.copy_(codes)
    scales = scales.view(torch.float8_e4m3fn)
    return out, scales if out_scale is None else out_scale.copy_(scales)


def concat_and_cast_mha_k(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
    """SGLang's Triton MLA key concat (DeepSeek's MHA prefill): ``k`` = [k_nope, k_rope] per head,
    the one rope head broadcast, cast to ``k``'s dtype."""
    k[..., : k_nope.shape[-1]] = k_nope
    k[..., k_nope.shape[-1] :] = k_rope


def rope(positions, x, head_size, cache, is_neox) -> None:
    if x is None:
        return
    view = x.view(positions.numel(), -1, head_size)
    rot = cache.shape[-1]
    cos, sin = cache[positions.reshape(-1)].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    part = view[..., :rot].float()
    if is_neox:
        a, b = part[..., : rot // 2], part[..., rot // 2 :]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = part[..., 0::2], part[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    view[..., :rot] = out.to(x.dtype)


def default_stream() -> int:
    """The handle of CUDA's default stream, which ``torch.cuda.current_stream().cuda_stream``
    gives outside a stream context."""
    return 0


def rope_with_key(positions, query, key, head_size, cache, is_neox=True) -> None:
    rope(positions, query, head_size, cache, is_neox)
    rope(positions, key, head_size, cache, is_neox)


def rope_without_key(positions, query, head_size, cache, is_neox=True) -> None:
    rope(positions, query, head_size, cache, is_neox)


def rope_inplace(q, k, cache, positions, *, is_neox: bool, rope_dim: int = 0) -> None:
    for x in (q, k):
        rope(positions, x, x.shape[-1], cache, is_neox)


def rope_inplace_with_kvcache(
    q, k, v, k_cache, v_cache, cache, positions, out_loc, *, is_neox: bool, rope_dim: int = 0
) -> None:
    """SGLang's JIT fused rotary + KV-cache store: the rotary above, then the rotated k and the
    v written into the caches' rows ``out_loc``."""
    rope_inplace(q, k, cache, positions, is_neox=is_neox, rope_dim=rope_dim)
    _store(out_loc, (k, k_cache), (v, v_cache))


def _store(rows: torch.Tensor, *pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Each (tokens, cache) pair: the tokens written into the cache's rows ``rows``."""
    rows = rows.long()
    for tokens, into in pairs:
        into[rows] = tokens.reshape(rows.numel(), *into.shape[1:]).to(into.dtype)


def rope_pos_ids(q, k, q_rope, k_rope, cache, pos_ids, interleave=False, enable_pdl=False):
    for source, into in ((q, q_rope), (k, k_rope)):
        rotated = source.clone()
        rope(pos_ids, rotated, source.shape[-1], cache, not interleave)
        into.copy_(rotated)


def rope_pos_ids_with_kv_cache(q, k, q_rope, k_rope, cache, pos_ids, v, k_buffer, v_buffer,
                               kv_cache_loc, interleave=False, enable_pdl=False) -> None:  # fmt: skip
    """SGLang's JIT rotary by position ids with its KV-cache store (0.5.9-0.5.12): the rotary
    above, then the rotated k and the v written into the buffers' rows ``kv_cache_loc``."""
    rope_pos_ids(q, k, q_rope, k_rope, cache, pos_ids, interleave, enable_pdl)
    _store(kv_cache_loc, (k_rope, k_buffer), (v, v_buffer))


def rope_pos_ids_kv(q, k, q_rope, k_rope, cache, pos_ids, interleave, enable_pdl, *kv_write):
    """sgl_kernel's fused rotary (0.5.4-0.5.8): the rotary above; the stream handle sgl-kernel
    0.3.16 passes first and the KV-cache write it may fuse are dropped (one extend batch from an
    empty cache reads nothing back)."""
    rope_pos_ids(q, k, q_rope, k_rope, cache, pos_ids, interleave, enable_pdl)


def activation_and_mul(op_name: str, x: torch.Tensor, out: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[op_name]  # fmt: skip
    out.copy_((act(x[..., :half].float()) * x[..., half:].float()).to(out.dtype))


SGLANG_OP_QUANTIZE = "fp4lab reference (CPU kernel lent to sglang::flashinfer_fp4_quantize)"


def fp4_bytes(x: torch.Tensor, global_scale, swizzled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4lab's reference quantize: codes [M, K/2] and scale bytes [M↑128, S↑4] (swizzled,
    the 128x4 layout) or [M, S] (linear), S = K/16."""
    codes, scales, _ = nvfp4.quantize_bytes(x, global_scale, swizzle=swizzled)
    rows, columns = (
        swizzle.swizzled_shape(x.shape[0], x.shape[-1] // 16) if swizzled else (x.shape[0], -1)
    )
    return codes, scales.reshape(rows, columns)


def sglang_fp4_quantize(x, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False,
                         is_sf_swizzled_layout=True, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """SGLang's wrapped FlashInfer quantize (its fake's shapes) on fp4lab's reference."""
    return fix._ran(SGLANG_OP_QUANTIZE, fp4_bytes(x, global_scale, is_sf_swizzled_layout))


SGLANG_JIT_QUANTIZE = "fp4lab reference (CPU kernel lent to sglang::scaled_fp4_quant)"


def sglang_scaled_fp4_quant(x, output, output_scale, global_scale) -> None:
    """SGLang's JIT NVFP4 quantize op (0.5.10+ off SM120): codes and swizzled scales in place."""
    codes, scales = fix._ran(SGLANG_JIT_QUANTIZE, fp4_bytes(x, global_scale, True))
    output.copy_(codes)
    output_scale.view(torch.uint8).reshape(-1).copy_(scales.reshape(-1))


def marlin_repack_shape(b_q_weight, perm, size_k, size_n, num_bits):
    """Marlin's weight repack (a CUDA JIT kernel) by shape only: the Marlin GEMM that reads the
    repacked weight is stood in for as well (``marlin_linear_zero``)."""
    return torch.zeros((size_k // 16, size_n * 16 // (32 // num_bits)), dtype=b_q_weight.dtype)


def marlin_linear_zero(input, weight, weight_scale, weight_global_scale, workspace, size_n,
                        size_k, bias=None, use_fp32_reduce=False):  # fmt: skip
    """SGLang's NVFP4 Marlin linear (Hopper's NVFP4 path from 0.5.2x): zeros of its shape."""
    return input.new_zeros((*input.shape[:-1], size_n))


def hadamard(x, scale=1.0):
    import scipy.linalg

    matrix = torch.tensor(scipy.linalg.hadamard(x.shape[-1]), dtype=torch.float32)
    return ((x.float() @ matrix) * scale).to(x.dtype)


def indexer_topk(layer_id, key, q_fp8, weights, topk_result) -> None:
    """The DSA indexer's top-k as SGLang's split op computes it from 0.5.13 (index key cache
    write, FP8 MQA logits, top-k: DeepGEMM kernels): for one extend batch from an empty cache,
    token i keeps tokens 0..i (every sequence is within ``index_topk``), padding rows stay -1."""
    tokens = min(q_fp8.shape[0], topk_result.shape[0])
    index = torch.arange(topk_result.shape[1], dtype=topk_result.dtype)
    seen = torch.arange(1, tokens + 1, dtype=topk_result.dtype)[:, None]
    topk_result[:tokens].copy_(torch.where(index < seen, index, -1))


def mm_out_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.mm(a.float(), b.float()).to(out_dtype)


def fused_a_gemm(mat_a: torch.Tensor, mat_b: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's fused QKV-A GEMM, ``mat_a [M, K] @ mat_b [K, N]`` in bf16, float accumulate."""
    return torch.mm(mat_a.float(), mat_b.float()).to(torch.bfloat16)


def layernorm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(
        x.float(), (x.shape[-1],), weight.float(), None if bias is None else bias.float(), eps
    ).to(x.dtype)


def flashinfer_rmsnorm(x, weight, eps=1e-6, out=None, enable_pdl=None):
    out = torch.empty_like(x) if out is None else out
    rmsnorm(out, x, weight, eps, False)
    return out


def flashinfer_fused_add_rmsnorm(x, residual, weight, eps=1e-6, enable_pdl=None) -> None:
    fused_add_rmsnorm(x, residual, weight, eps, False)


def act_quant(x, block_size=128, scale_fmt=None):
    blocks = x.float().view(*x.shape[:-1], x.shape[-1] // block_size, block_size)
    scale = blocks.abs().amax(-1).clamp(min=1e-4) / 448.0
    if scale_fmt is not None:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return (blocks / scale.unsqueeze(-1)).view(x.shape).to(torch.float8_e4m3fn), scale


def act_quant_fake(x, block_size=128, scale_fmt=None):
    scales = x.new_empty(*x.shape[:-1], x.shape[-1] // block_size, dtype=torch.float32)
    return torch.empty_like(x, dtype=torch.float8_e4m3fn), scales


FLASHINFER_QUANTIZE = "fp4lab reference (eager-only stand-in for FlashInfer's fp4_quantize)"


def flashinfer_fp4_quantize(x, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False,
                             is_sf_swizzled_layout=True, *args: Any, **kwargs: Any):  # fmt: skip
    """FlashInfer's ``fp4_quantize`` contract on fp4lab's reference: codes [M, K/2], scale bytes
    swizzled (or linear) reshaped to [-1, K/sf_vec_size]."""
    codes, scales = fp4_bytes(x, global_scale, is_sf_swizzled_layout)
    return fix._ran(FLASHINFER_QUANTIZE, (codes, scales.reshape(-1, x.shape[-1] // sf_vec_size)))


def block_scale_interleave(scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's NVFP4 block-scale interleave: the 128x4 layout (fp4lab's swizzle), per
    matrix of a batch."""
    flat = scales.reshape(-1, *scales.shape[-2:])
    done = [swizzle.swizzle_128x4(m) for m in flat]
    return torch.stack(done).reshape(*scales.shape[:-2], -1) if scales.ndim > 2 else done[0]
