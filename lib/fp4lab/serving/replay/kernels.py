"""Inside one SGLang environment: what replaces, on a CPU, the kernels SGLang's GLM-5 calls.

Every replacement sits at a kernel or split-op boundary and is returned as a record (``name``,
``boundary``, ``why``), so each run lists what stood in. Four kinds:

* **opaque ops** (``sgl_kernel::*``): on a GPU these are C++ ops with a schema, which dynamo
  records as one node; here the schema is defined with a CPU kernel and a fake, before SGLang
  is imported, so SGLang's own fakes register on them as they do on a GPU;
* **CPU kernels lent to SGLang's custom ops** (``sglang::*``): SGLang registers its ops for the
  CUDA dispatch key only; the op's own Python code is registered for CPU too, and the few ops
  whose body is a CUDA kernel (FP4 GEMM and quantize, rotary, activation) get a reference CPU
  kernel instead;
* **eager-only kernels** (FlashInfer's quantize and norms, the Hadamard transform, the indexer's
  FP8 quantize, the FP4 MoEs): run only eagerly (the runner's eager forward, split ops, SGLang's
  MoE op); while dynamo traces, the release's own function is called, so a stand-in can never
  hide a trace blocker. The TRT-LLM FP4 MoE (SM100) has no CPU reference: its routed experts
  contribute zero, in the compiled and the eager pass alike;
* **load-time kernels** (FlashInfer's block-scale interleave for the TRT-LLM MoE's weights).

The attention backend stands in for ``NativeSparseAttnBackend`` at SGLang's attention split op:
dense causal MLA attention, which equals DSA's sparse attention while every sequence is at most
``index_topk`` tokens long (DSA then selects every earlier token).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fp4lab.compile import fix
from fp4lab.fp4 import nvfp4, swizzle


def record(name: str, boundary: str, why: str) -> dict:
    return {"name": name, "boundary": boundary, "why": why}


def attribute(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


# --- sgl_kernel's C++ ops: schema, CPU kernel, fake -------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool):
    out.copy_(_rms(x, weight, eps))


def _fused_add_rmsnorm(x, residual, weight, eps, pdl) -> None:
    residual.add_(x)
    x.copy_(_rms(residual, weight, eps))


def _silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    out.copy_(
        (torch.nn.functional.silu(x[..., :half].float()) * x[..., half:].float()).to(out.dtype)
    )


LINEAR_QUANTIZE = "fp4lab reference (CPU kernel of sgl_kernel::scaled_fp4_quant)"


def _scaled_fp4_quant(output, x, output_scale, global_scale) -> None:
    codes, scales = fix._ran(LINEAR_QUANTIZE, fix.reference_fp4_quantize(x, global_scale))
    output.copy_(codes)
    output_scale.view(torch.uint8).reshape(-1).copy_(scales.reshape(-1))


def _moe_fused_gate(x, bias, groups, topk_group, topk, shared, scaling, on_output):
    """SGLang's own torch implementation of the grouped top-k (``biased_grouped_topk_impl``),
    undecorated: the reference the fused gate kernel implements."""
    from sglang.srt.layers.moe import topk as module

    impl = module.biased_grouped_topk_impl
    impl = getattr(impl, "_torchdynamo_orig_callable", impl)
    given = {"hidden_states": x, "gating_output": x, "correction_bias": bias, "topk": topk,
             "renormalize": True, "num_expert_group": groups, "topk_group": topk_group,
             "num_fused_shared_experts": shared, "routed_scaling_factor": scaling,
             "apply_routed_scaling_factor_on_output": on_output}  # fmt: skip
    accepted = inspect.signature(impl).parameters
    weights, ids = impl(**{k: v for k, v in given.items() if k in accepted})[:2]
    return [weights, ids]


def _triton_router(scores, bias, topk, scoring_func="sigmoid", num_fused_shared_experts=0,
                   renormalize=True, routed_scaling_factor=1.0,
                   apply_routed_scaling_factor_on_output=False, moe_softcapping=0.0,
                   num_expert_group=1, topk_group=1, **triton_only: Any):  # fmt: skip
    """SGLang's Triton router (0.5.16 on) by SGLang's own torch grouped top-k, for sigmoid scores,
    behind the stood-in ``sgl_kernel::moe_fused_gate`` op: one opaque node while traced, as a
    kernel launch is (fp4lab's Python never enters the trace)."""
    extras = [k for k, v in triton_only.items()
              if v is not None and not (isinstance(v, (bool, int, float)) and not v)]  # fmt: skip
    if scoring_func != "sigmoid" or not renormalize or moe_softcapping or extras:
        raise NotImplementedError("fp4lab's router reference covers renormalized sigmoid routing "
                                  f"only (asked: {scoring_func}, extras {extras})")  # fmt: skip
    return torch.ops.sgl_kernel.moe_fused_gate(scores, bias, num_expert_group, topk_group, topk,
                                               num_fused_shared_experts, routed_scaling_factor,
                                               apply_routed_scaling_factor_on_output)  # fmt: skip


def _moe_fused_gate_fake(x, bias, groups, topk_group, topk, shared, scaling, on_output):
    rows = x.shape[0]
    return [x.new_empty((rows, topk), dtype=torch.float32),
            x.new_empty((rows, topk), dtype=torch.int32)]  # fmt: skip


SGL_KERNEL_OPS = {
    "rmsnorm": ("rmsnorm(Tensor(a!) output, Tensor input, Tensor weight, float eps, "
                "bool enable_pdl) -> ()", _rmsnorm, None),
    "fused_add_rmsnorm": ("fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, "
                          "float eps, bool enable_pdl) -> ()", _fused_add_rmsnorm, None),
    "silu_and_mul": ("silu_and_mul(Tensor(a!) out, Tensor input) -> ()", _silu_and_mul, None),
    "scaled_fp4_quant": ("scaled_fp4_quant(Tensor(a!) output, Tensor input, Tensor(b!) "
                         "output_scale, Tensor input_global_scale) -> ()", _scaled_fp4_quant, None),
    "moe_fused_gate": ("moe_fused_gate(Tensor input, Tensor bias, int num_expert_group, "
                       "int topk_group, int topk, int num_fused_shared_experts, "
                       "float routed_scaling_factor, bool apply_routed_scaling_factor_on_output) "
                       "-> Tensor[]", _moe_fused_gate, _moe_fused_gate_fake),
}  # fmt: skip
"""The sgl_kernel ops GLM-5's forward calls: schema (as sgl_kernel's Python wrapper calls the
op), CPU kernel, and a fake where the op returns tensors (in-place ops need none)."""

_LIBRARIES: dict[str, torch.library.Library] = {}
"""The libraries the stand-ins live in (kept alive: an op lives as long as its library)."""


def sgl_kernel_ops() -> list[dict]:
    """Define every op of SGL_KERNEL_OPS that is absent (sgl_kernel's binary is not loaded);
    call before SGLang is imported, so that SGLang's own fakes register on them."""
    library = _LIBRARIES.setdefault("sgl_kernel", torch.library.Library("sgl_kernel", "FRAGMENT"))
    defined = []
    for name, (schema, kernel, _) in SGL_KERNEL_OPS.items():
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        library.define(schema)
        library.impl(name, kernel, "CPU")
        defined.append(name)
    return [record("sgl_kernel_ops", f"sgl_kernel::{{{','.join(defined)}}}",
                    "sgl_kernel's C++ op library is a CUDA-only binary; each op GLM-5 calls is "
                    "defined with the schema its Python wrapper calls, a torch CPU kernel and "
                    "a fake, so dynamo sees one opaque node as on a GPU")] if defined else []  # fmt: skip


def _no_outputs(*args: Any, **kwargs: Any) -> None:
    return None


def fakes_where_missing() -> None:
    """Fakes for the stood-in sgl_kernel ops SGLang registered none for (after its import; an
    in-place op's fake returns nothing)."""
    for name, (_, _, fake) in SGL_KERNEL_OPS.items():
        entry = torch._library.simple_registry.singleton.find(f"sgl_kernel::{name}")
        if (
            "sgl_kernel" in _LIBRARIES
            and hasattr(torch.ops.sgl_kernel, name)
            and entry.fake_impl.kernel is None
        ):
            _LIBRARIES["sgl_kernel"]._register_fake(name, fake or _no_outputs)


# --- SGLang's own custom ops on CPU -------------------------------------------------------------


def sglang_ops_on_cpu() -> list[dict]:
    """SGLang's ``direct_register_custom_op`` registers each op's Python code for CUDA only; the
    same code is registered for CPU too. Call before SGLang's layers are imported."""
    common = importlib.import_module("sglang.srt.utils.common")
    library = getattr(common, "sglang_lib", None)
    if library is None:
        return []
    register = library.impl

    def impl(name: str, fn: Callable, key: str = "", *args: Any, **kwargs: Any) -> Any:
        done = register(name, fn, key, *args, **kwargs)
        if key == "CUDA":
            register(name, fn, "CPU", *args, **kwargs)
        return done

    library.impl = impl
    return [record("sglang_ops_own_code_on_cpu", "sglang.srt.utils.common.sglang_lib",
                    "SGLang registers its custom ops' Python code for the CUDA dispatch key "
                    "only; the same code is registered for CPU (the ops' own code runs)")]  # fmt: skip


def _dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return nvfp4.dequantize(codes, scales.reshape(-1), None, swizzle=True)


def fp4_gemm(x, weight, x_scale, weight_scale, alpha, out_dtype, out_features) -> torch.Tensor:
    """NVFP4 GEMM by dequantizing both operands (block scales, 128x4 layout) and a float matmul
    scaled by alpha, as FlashInfer's ``mm_fp4`` defines it; the weight may come transposed
    (FlashInfer's layout: [K/2, N] codes, scales transposed)."""
    a = _dequantize(x, x_scale)
    transposed = weight.shape[0] * 2 == a.shape[1] and weight.shape[1] * 2 != a.shape[1]
    codes = weight.T.contiguous() if transposed else weight
    scales = weight_scale.T.contiguous() if transposed else weight_scale
    return ((a @ _dequantize(codes, scales).T) * alpha.float()).to(out_dtype)


def _rope(positions, x, head_size, cache, is_neox) -> None:
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


def _rope_with_key(positions, query, key, head_size, cache, is_neox=True) -> None:
    _rope(positions, query, head_size, cache, is_neox)
    _rope(positions, key, head_size, cache, is_neox)


def _rope_without_key(positions, query, head_size, cache, is_neox=True) -> None:
    _rope(positions, query, head_size, cache, is_neox)


def _rope_inplace(q, k, cache, positions, *, is_neox: bool, rope_dim: int = 0) -> None:
    for x in (q, k):
        _rope(positions, x, x.shape[-1], cache, is_neox)


def _rope_pos_ids(q, k, q_rope, k_rope, cache, pos_ids, interleave=False, enable_pdl=False):
    for source, into in ((q, q_rope), (k, k_rope)):
        rotated = source.clone()
        _rope(pos_ids, rotated, source.shape[-1], cache, not interleave)
        into.copy_(rotated)


def _activation_and_mul(op_name: str, x: torch.Tensor, out: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[op_name]  # fmt: skip
    out.copy_((act(x[..., :half].float()) * x[..., half:].float()).to(out.dtype))


SGLANG_OP_QUANTIZE = "fp4lab reference (CPU kernel lent to sglang::flashinfer_fp4_quantize)"


def _fp4_bytes(x: torch.Tensor, global_scale, swizzled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4lab's reference quantize: codes [M, K/2] and scale bytes [M↑128, S↑4] (swizzled,
    the 128x4 layout) or [M, S] (linear), S = K/16."""
    codes, scales, _ = nvfp4.quantize_bytes(x, global_scale, swizzle=swizzled)
    rows, columns = (
        swizzle.swizzled_shape(x.shape[0], x.shape[-1] // 16) if swizzled else (x.shape[0], -1)
    )
    return codes, scales.reshape(rows, columns)


def _sglang_fp4_quantize(x, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False,
                         is_sf_swizzled_layout=True, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """SGLang's wrapped FlashInfer quantize (its fake's shapes) on fp4lab's reference."""
    return fix._ran(SGLANG_OP_QUANTIZE, _fp4_bytes(x, global_scale, is_sf_swizzled_layout))


SGLANG_JIT_QUANTIZE = "fp4lab reference (CPU kernel lent to sglang::scaled_fp4_quant)"


def _sglang_scaled_fp4_quant(x, output, output_scale, global_scale) -> None:
    """SGLang's JIT NVFP4 quantize op (0.5.10+ off SM120): codes and swizzled scales in place."""
    codes, scales = fix._ran(SGLANG_JIT_QUANTIZE, _fp4_bytes(x, global_scale, True))
    output.copy_(codes)
    output_scale.view(torch.uint8).reshape(-1).copy_(scales.reshape(-1))


def _marlin_repack_shape(b_q_weight, perm, size_k, size_n, num_bits):
    """Marlin's weight repack (a CUDA JIT kernel) by shape only: the Marlin GEMM that reads the
    repacked weight is stood in for as well (``_marlin_linear_zero``)."""
    return torch.zeros((size_k // 16, size_n * 16 // (32 // num_bits)), dtype=b_q_weight.dtype)


def _marlin_linear_zero(input, weight, weight_scale, weight_global_scale, workspace, size_n,
                        size_k, bias=None, use_fp32_reduce=False):  # fmt: skip
    """SGLang's NVFP4 Marlin linear (Hopper's NVFP4 path from 0.5.2x): zeros of its shape."""
    return input.new_zeros((*input.shape[:-1], size_n))


def _hadamard(x, scale=1.0):
    import scipy.linalg

    matrix = torch.tensor(scipy.linalg.hadamard(x.shape[-1]), dtype=torch.float32)
    return ((x.float() @ matrix) * scale).to(x.dtype)


def _indexer_topk(layer_id, key, q_fp8, weights, topk_result) -> None:
    """The DSA indexer's top-k as SGLang's split op computes it from 0.5.13 (index key cache
    write, FP8 MQA logits, top-k: DeepGEMM kernels): for one extend batch from an empty cache,
    token i keeps tokens 0..i (every sequence is within ``index_topk``), padding rows stay -1."""
    tokens = min(q_fp8.shape[0], topk_result.shape[0])
    index = torch.arange(topk_result.shape[1], dtype=topk_result.dtype)
    seen = torch.arange(1, tokens + 1, dtype=topk_result.dtype)[:, None]
    topk_result[:tokens].copy_(torch.where(index < seen, index, -1))


SGLANG_OP_KERNELS = {
    "layernorm": (
        lambda input, gamma, beta, eps=1e-6: _layernorm(input, gamma, beta, eps),
        "SGLang's layernorm op (0.5.13 on; the DSA indexer's k_norm) runs FlashInfer's CuTe-DSL "
        "layernorm: torch layer_norm",
    ),
    "k_cache_and_topk_result": (
        _indexer_topk,
        "the DSA indexer's split op (0.5.13 on): its index-cache write and FP8 MQA logits are "
        "DeepGEMM kernels; the causal top-k of an extend batch from an empty cache instead",
    ),
    "scaled_fp4_quant": (
        _sglang_scaled_fp4_quant,
        "SGLang's JIT NVFP4 quantize kernel: fp4lab's spec-exact reference",
    ),
    "flashinfer_fp4_quantize": (
        _sglang_fp4_quantize,
        "FlashInfer's FP4 quantize inside SGLang's own op: fp4lab's spec-exact reference",
    ),
    "fp4_gemm": (fp4_gemm, "FlashInfer's mm_fp4 / CUTLASS FP4 GEMM: dequantize-matmul reference"),
    "_run_activation_inplace": (
        _activation_and_mul,
        "SGLang's JIT activation-and-mul kernel: torch",
    ),
    "rotary_embedding_with_key": (_rope_with_key, "SGLang's JIT rotary kernel: torch rotary"),
    "rotary_embedding_without_key": (_rope_without_key, "SGLang's JIT rotary kernel: torch rotary"),
    "apply_rope_inplace": (_rope_inplace, "SGLang's JIT fused rotary kernel: torch rotary"),
    "apply_rope_pos_ids_cos_sin_cache_without_kv_cache": (
        _rope_pos_ids,
        "SGLang's JIT rotary kernel (FlashInfer-style, by position ids): torch rotary",
    ),
    "apply_fp4_marlin_linear": (
        _marlin_linear_zero,
        "SGLang's NVFP4 Marlin GEMM (Hopper, 0.5.2x): no CPU reference for Marlin's repacked "
        "layout, so zeros of its shape (the linear layers' numerics are not checked on SM90)",
    ),
    "hadamard_transform": (
        _hadamard,
        "SGLang's JIT Hadamard transform (DSA indexer, an op from 0.5.2x): matmul with the "
        "Hadamard matrix",
    ),
}
"""SGLang ops whose body is a CUDA kernel: the CPU kernel lent to them instead of their body."""

SGLANG_OP_MODULES = (
    "sglang.kernels.ops.quantization.hadamard",
    "sglang.jit_kernel.hadamard",
    "sglang.jit_kernel.rope",
)
"""Where a release defines such an op in a module its model imports only when first called
(0.5.2x; the JIT kernel package from 0.5.13)."""


def sglang_op_kernels() -> list[dict]:
    """SGLANG_OP_KERNELS registered for CPU on the ops the release has (after SGLang's import)."""
    for module in SGLANG_OP_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    library = _LIBRARIES.setdefault("sglang", torch.library.Library("sglang", "IMPL"))
    lent = []
    for name, (kernel, why) in SGLANG_OP_KERNELS.items():
        if hasattr(torch.ops.sglang, name):
            library.impl(name, kernel, "CPU", allow_override=True)
            lent.append(record(f"sglang::{name}_cpu_kernel", f"sglang::{name}", why))
    return lent


def _mm_out_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.mm(a.float(), b.float()).to(out_dtype)


ATEN_CPU_KERNELS = {
    "mm.dtype": (
        _mm_out_dtype,
        "aten::mm with out_dtype has CUDA kernels only (the DSA indexer's float32 projections "
        "from 0.5.13): a float matmul cast to out_dtype",
    ),
}
"""torch ops with no CPU kernel in torch's CPU build that a release's forward calls."""


def aten_cpu_kernels() -> list[dict]:
    """ATEN_CPU_KERNELS registered for CPU where torch has no CPU kernel for them."""
    library = _LIBRARIES.setdefault("aten", torch.library.Library("aten", "IMPL"))
    lent = []
    for name, (kernel, why) in ATEN_CPU_KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"):
            library.impl(name, kernel, "CPU")
            lent.append(record(f"aten::{name}_cpu_kernel", f"aten::{name}", why))
    return lent


# --- eager-only kernels -------------------------------------------------------------------------


def eager_only(real: Callable, cpu: Callable) -> Callable:
    """``real`` while dynamo traces (the release's code is what gets traced), ``cpu`` when run."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return real(*args, **kwargs)
        return cpu(*args, **kwargs)

    call.__wrapped__ = real
    return call


def _layernorm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(
        x.float(), (x.shape[-1],), weight.float(), None if bias is None else bias.float(), eps
    ).to(x.dtype)


def _flashinfer_rmsnorm(x, weight, eps=1e-6, out=None, enable_pdl=None):
    out = torch.empty_like(x) if out is None else out
    _rmsnorm(out, x, weight, eps, False)
    return out


def _flashinfer_fused_add_rmsnorm(x, residual, weight, eps=1e-6, enable_pdl=None) -> None:
    _fused_add_rmsnorm(x, residual, weight, eps, False)


def _act_quant(x, block_size=128, scale_fmt=None):
    blocks = x.float().view(*x.shape[:-1], x.shape[-1] // block_size, block_size)
    scale = blocks.abs().amax(-1).clamp(min=1e-4) / 448.0
    if scale_fmt is not None:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return (blocks / scale.unsqueeze(-1)).view(x.shape).to(torch.float8_e4m3fn), scale


def _act_quant_fake(x, block_size=128, scale_fmt=None):
    scales = x.new_empty(*x.shape[:-1], x.shape[-1] // block_size, dtype=torch.float32)
    return torch.empty_like(x, dtype=torch.float8_e4m3fn), scales


TRITON_LAUNCHES = {
    "act_quant": ("act_quant(Tensor x, int block_size=128, str? scale_fmt=None) -> (Tensor, Tensor)",
                  _act_quant, _act_quant_fake),
}  # fmt: skip
"""Python functions of SGLang whose body is one Triton kernel launch: schema, CPU kernel, fake.
On a GPU dynamo takes such a launch as one node (its Triton wrapper); on a CPU build it cannot,
and would trace into Triton's launcher. Each is stood in for by an op of ``fp4lab_triton``:
one opaque node while traced, the CPU kernel when run."""


def triton_launch(name: str) -> Callable:
    """The stand-in for the Triton-launching function ``name`` (defined on first use)."""
    if "fp4lab_triton" not in _LIBRARIES:
        _LIBRARIES["fp4lab_triton"] = torch.library.Library("fp4lab_triton", "FRAGMENT")
    library = _LIBRARIES["fp4lab_triton"]
    if not hasattr(torch.ops.fp4lab_triton, name):
        schema, kernel, fake = TRITON_LAUNCHES[name]
        library.define(schema)
        library.impl(name, kernel, "CPU")
        library._register_fake(name, fake)
    return getattr(torch.ops.fp4lab_triton, name)


def _act_quant_launch(x, block_size=128, scale_fmt=None):
    return triton_launch("act_quant")(x, block_size, scale_fmt)


def _pick(t: torch.Tensor, expert: int) -> torch.Tensor:
    return t if t.numel() == 1 else t[expert]


def cutlass_moe_fp4(a, a1_gscale, w1_fp4, w1_blockscale, w1_alphas, a2_gscale, w2_fp4,
                    w2_blockscale, w2_alphas, topk_weights, topk_ids, params=None,
                    apply_router_weight_on_input=False, **_: Any) -> torch.Tensor:  # fmt: skip
    """The NVFP4 MoE by its definition: per selected expert, the activations quantized with the
    expert's input scale (fp4lab's reference quantize), gate-up GEMM, SiLU-and-mul, quantized
    again, down GEMM, weighted by the router and summed."""
    out = torch.zeros(a.shape[0], w2_fp4.shape[1], dtype=torch.float32)
    for expert in topk_ids.unique().tolist():
        rows, slot = (topk_ids == expert).nonzero(as_tuple=True)
        weight = topk_weights[rows, slot, None].float()
        x = (a[rows].float() * weight).to(a.dtype) if apply_router_weight_on_input else a[rows]
        qx, sx = fix.reference_fp4_quantize(x, _pick(a1_gscale, expert))
        h = fp4_gemm(qx, w1_fp4[expert], sx, w1_blockscale[expert], _pick(w1_alphas, expert),
                     torch.float32, w1_fp4.shape[1])  # fmt: skip
        half = h.shape[-1] // 2
        act = (torch.nn.functional.silu(h[:, :half]) * h[:, half:]).to(a.dtype)
        qa, sa = fix.reference_fp4_quantize(act, _pick(a2_gscale, expert))
        y = fp4_gemm(qa, w2_fp4[expert], sa, w2_blockscale[expert], _pick(w2_alphas, expert),
                     torch.float32, w2_fp4.shape[1])  # fmt: skip
        out.index_add_(0, rows, y if apply_router_weight_on_input else y * weight)
    return out.to(a.dtype)


FLASHINFER_QUANTIZE = "fp4lab reference (eager-only stand-in for FlashInfer's fp4_quantize)"


def _flashinfer_fp4_quantize(x, global_scale=None, sf_vec_size=16, sf_use_ue8m0=False,
                             is_sf_swizzled_layout=True, *args: Any, **kwargs: Any):  # fmt: skip
    """FlashInfer's ``fp4_quantize`` contract on fp4lab's reference: codes [M, K/2], scale bytes
    swizzled (or linear) reshaped to [-1, K/sf_vec_size]."""
    codes, scales = _fp4_bytes(x, global_scale, is_sf_swizzled_layout)
    return fix._ran(FLASHINFER_QUANTIZE, (codes, scales.reshape(-1, x.shape[-1] // sf_vec_size)))


def _trtllm_fp4_moe_zero(*args: Any, output: torch.Tensor | None = None, **kwargs: Any):
    """No CPU reference for the TRT-LLM FP4 MoE's shuffled, row-reordered weight layout: the
    routed experts contribute zero (the same in the compiled and the eager pass)."""
    hidden = kwargs.get("hidden_states", args[2] if len(args) > 2 else None)
    if output is None:
        output = torch.empty(hidden.shape[0], hidden.shape[-1] * 2, dtype=torch.bfloat16)
    return [output.zero_()]


def _cutlass_fused_moe_zero(*args: Any, output: torch.Tensor | None = None, **kwargs: Any):
    """FlashInfer's CUTLASS fused MoE (SGLang 0.5.2x's NVFP4 MoE runner on SM120): no CPU
    reference for its packed weight and interleaved scale layout, so the routed experts
    contribute zero (the same in the compiled and the eager pass)."""
    if output is None:
        rows, hidden = kwargs["input"].shape[0], kwargs["fc2_expert_weights"].shape[1]
        output = torch.empty(rows, hidden, dtype=kwargs.get("output_dtype") or torch.bfloat16)
    return [output.zero_()]


def _block_scale_interleave(scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's NVFP4 block-scale interleave: the 128x4 layout (fp4lab's swizzle), per
    matrix of a batch."""
    flat = scales.reshape(-1, *scales.shape[-2:])
    done = [swizzle.swizzle_128x4(m) for m in flat]
    return torch.stack(done).reshape(*scales.shape[:-2], -1) if scales.ndim > 2 else done[0]


LOAD_TIME = (
    ("flashinfer", "nvfp4_block_scale_interleave", _block_scale_interleave,
     "FlashInfer's JIT block-scale interleave, which the TRT-LLM FP4 MoE's weight preparation "
     "calls at load time: fp4lab's 128x4 swizzle"),
    ("flashinfer", "block_scale_interleave", _block_scale_interleave,
     "FlashInfer's JIT block-scale interleave (its older name, the same call): fp4lab's swizzle"),
    ("sglang.srt.layers.quantization.marlin_utils_fp4", "gptq_marlin_repack", _marlin_repack_shape,
     "Marlin's JIT weight repack (NVFP4 on Hopper, 0.5.2x): a tensor of the repacked shape; the "
     "Marlin GEMM reading it is stood in for too"),
)  # fmt: skip
"""(module, name, CPU kernel, why): kernels the model's weight preparation calls on load."""


def _installed(table: tuple, suffix: str) -> list[dict]:
    """Each (module, name, CPU kernel, why) of ``table`` set where the release has the module and
    name; the records, named ``<name>_<suffix>``."""
    done = []
    for module, name, cpu, why in table:
        if attribute(module, name) is not None:
            setattr(importlib.import_module(module), name, cpu)
            done.append(record(f"{name}_{suffix}", f"{module}.{name}", why))
    return done


def load_time_kernels() -> list[dict]:
    """LOAD_TIME installed where the release has the module and name (before the model loads)."""
    return _installed(LOAD_TIME, "load_time")


TRTLLM_WHY = ("FlashInfer's TRT-LLM FP4 MoE kernel: no CPU reference for its shuffled weight "
              "layout, the routed experts contribute zero (the MoE's numerics are not checked "
              "where this runs)")  # fmt: skip

EAGER_ONLY = (
    ("flashinfer.norm", "rmsnorm", _flashinfer_rmsnorm,
     "FlashInfer's CuTe-DSL / JIT RMSNorm, which sgl_kernel's rmsnorm calls eagerly (while "
     "dynamo traces, sgl_kernel takes its own op): torch RMSNorm"),
    ("flashinfer.norm", "fused_add_rmsnorm", _flashinfer_fused_add_rmsnorm,
     "FlashInfer's fused add + RMSNorm, called eagerly by sgl_kernel: torch add and RMSNorm"),
    ("sglang.srt.layers.layernorm", "layernorm", _layernorm,
     "FlashInfer's JIT layernorm (the DSA indexer's k_norm): torch layer_norm"),
    ("sglang.jit_kernel.hadamard", "hadamard_transform", _hadamard,
     "SGLang's JIT Hadamard transform (DSA indexer): matmul with the Hadamard matrix"),
    ("sglang.srt.layers.moe.cutlass_moe", "cutlass_moe_fp4", cutlass_moe_fp4,
     "sgl_kernel's CUTLASS NVFP4 MoE (prepare_moe_input, grouped FP4 GEMMs): the MoE by its "
     "definition on fp4lab's reference quantize and the dequantize-matmul GEMM"),
    ("sglang.srt.layers.moe.fused_moe_triton.layer", "trtllm_fp4_block_scale_moe",
     _trtllm_fp4_moe_zero, TRTLLM_WHY),
    ("flashinfer.fused_moe", "trtllm_fp4_block_scale_moe", _trtllm_fp4_moe_zero, TRTLLM_WHY),
    ("flashinfer.fused_moe", "cutlass_fused_moe", _cutlass_fused_moe_zero,
     "FlashInfer's CUTLASS NVFP4 fused MoE: no CPU reference for its packed weight layout, the "
     "routed experts contribute zero (the MoE's numerics are not checked where this runs)"),
    ("sglang.srt.layers.quantization.modelopt_quant", "flashinfer_cutlass_fused_moe",
     _cutlass_fused_moe_zero, "FlashInfer's CUTLASS NVFP4 fused MoE as 0.5.13+ binds it in "
     "modelopt_quant: the routed experts contribute zero (the MoE's numerics are not checked)"),
)  # fmt: skip
"""(module, name, CPU kernel, why): the kernels that run only eagerly in GLM-5's PCG forward."""


BINDS_FLASHINFER_QUANTIZE = (
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.srt.layers.moe.fused_moe_triton.layer",
    "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm",
)
"""Modules that may bind FlashInfer's ``fp4_quantize`` by name (the NVFP4 linear method, the
FP4 MoE layer, the TRT-LLM MoE runner), depending on the release and the SM."""


def _marlin_workspace(device: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.zeros(132 * 4, dtype=torch.int32)


def _marlin_moe_zero(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """SGLang's fused Marlin MoE (NVFP4 MoE on Hopper, 0.5.2x): the routed experts contribute
    zero (no CPU reference for Marlin's repacked layout)."""
    return torch.zeros_like(hidden_states)


REPLACED = (
    ("sglang.srt.layers.attention.nsa.triton_kernel", "act_quant", _act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.3-0.5.12), traced and run: one opaque op "
     "(fp4lab_triton::act_quant) as dynamo takes a Triton launch on a GPU; torch amax/scale; "
     "SGLang's Python wrapper around the launch is not traced here"),
    ("sglang.srt.layers.attention.dsa.triton_kernel", "act_quant", _act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.13 on), traced and run: one opaque op "
     "(fp4lab_triton::act_quant) as dynamo takes a Triton launch on a GPU; torch amax/scale; "
     "SGLang's Python wrapper around the launch is not traced here"),
    ("sglang.kernels.ops.attention.dsa.triton_kernel", "act_quant", _act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.2x home), traced and run: one opaque op "
     "(fp4lab_triton::act_quant) as dynamo takes a Triton launch on a GPU; torch amax/scale; "
     "SGLang's Python wrapper around the launch is not traced here"),
    ("sglang.kernels.ops.moe.moe_fused_gate", "moe_fused_gate", _triton_router,
     "SGLang's Triton MoE router (0.5.2x), traced and run: SGLang's own torch grouped top-k "
     "(biased_grouped_topk_impl); whether dynamo takes the Triton launch is not checked here"),
    ("sglang.jit_kernel.moe_fused_gate", "moe_fused_gate", _triton_router,
     "SGLang's Triton MoE router at its 0.5.1x home, traced and run: SGLang's own torch grouped "
     "top-k (biased_grouped_topk_impl) behind one opaque op; SGLang's Python wrapper around the "
     "launch is not traced here, nor whether dynamo takes the launch"),
    ("sglang.srt.layers.quantization.marlin_utils", "marlin_make_workspace", _marlin_workspace,
     "Marlin's workspace sized from the GPU's SM count (asks torch.cuda for it): a CPU tensor"),
    ("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe", "fused_marlin_moe",
     _marlin_moe_zero, "SGLang's fused Marlin NVFP4 MoE (Hopper, 0.5.2x, inside SGLang's MoE op): "
     "the routed experts contribute zero (the MoE's numerics are not checked on SM90)"),
)  # fmt: skip
"""(module, name, CPU kernel, why): kernels replaced both while traced and when run (a Triton
launch has no CPU backend to run on, traced or not)."""


def replaced_kernels() -> list[dict]:
    """REPLACED installed where the release has the module and name."""
    return _installed(REPLACED, "replaced")


def eager_only_kernels() -> list[dict]:
    """EAGER_ONLY installed where the release has the module and name; and FlashInfer's
    ``fp4_quantize`` wherever a module binds it by name (the runner of 0.5.10+ runs one eager
    forward before it compiles; the MoE runs it eagerly inside SGLang's MoE op)."""
    done = []
    for module in BINDS_FLASHINFER_QUANTIZE:
        bound = attribute(module, "fp4_quantize")
        if getattr(bound, "__module__", "").startswith("flashinfer"):
            importlib.import_module(module).fp4_quantize = eager_only(
                bound, _flashinfer_fp4_quantize
            )
            done.append(record("fp4_quantize_eager_only", f"{module}.fp4_quantize",
                               "FlashInfer's fp4_quantize as the release binds it: fp4lab's "
                               "reference when run eagerly; while dynamo traces, FlashInfer's "
                               "own function (the story's path)"))  # fmt: skip
    for module, name, cpu, why in EAGER_ONLY:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(owner, name):  # where the import it binds failed, the name is None: still called
            setattr(owner, name, eager_only(getattr(owner, name), cpu))
            done.append(record(f"{name}_eager_only", f"{module}.{name}", why))
    return done


# --- the attention backend at SGLang's attention split op ---------------------------------------


class IndexerMetadata:
    """What the DSA indexer asks its backend's metadata (``get_seqlens_expanded``,
    ``topk_transform``) for one extend batch starting from an empty cache: token i sees i + 1
    tokens; top-k of at most ``index_topk`` tokens keeps them all (the kernel's fast path)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def get_seqlens_expanded(self) -> torch.Tensor:
        return torch.arange(1, self.tokens + 1, dtype=torch.int32)

    def topk_transform(self, logits: torch.Tensor, topk: int) -> torch.Tensor:
        index = torch.arange(topk, dtype=torch.int32).expand(logits.shape[0], topk)
        return torch.where(index < self.get_seqlens_expanded()[:, None], index, -1)


class AttentionBackend:
    """In place of ``NativeSparseAttnBackend``: dense causal MLA attention in float32 for one
    extend batch from an empty cache (the KV cache is not written: nothing reads it back)."""

    prefill_attention_backend_str = decode_attention_backend_str = None
    """Read by DeepSeek's attention dispatch from 0.5.2x on: None selects the server's choice."""

    def __init__(self) -> None:
        self.calls = 0

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self.tokens = int(forward_batch.input_ids.shape[0])

    def get_indexer_metadata(self, layer_id: int, forward_batch: Any) -> IndexerMetadata:
        return IndexerMetadata(int(forward_batch.input_ids.shape[0]))

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs) -> torch.Tensor:
        self.calls += 1
        n, heads = q.shape[0], layer.tp_q_head_num
        query = q.reshape(n, heads, -1).float()
        key = k.reshape(n, -1, k.shape[-1]).float()
        if kwargs.get("q_rope") is not None:
            query = torch.cat([query, kwargs["q_rope"].reshape(n, heads, -1).float()], -1)
            key = torch.cat(
                [key, kwargs["k_rope"].reshape(n, -1, kwargs["k_rope"].shape[-1]).float()], -1
            )
        value = v.reshape(n, -1, v.shape[-1]).float()[..., : layer.v_head_dim]
        key, value = key.expand(n, heads, -1), value.expand(n, heads, -1)
        scores = torch.einsum("qhd,khd->hqk", query, key) * layer.scaling
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", weights, value).reshape(n, -1).to(q.dtype)


class KVPool:
    """In place of the DSA KV pool: the indexer's key cache write is accepted (nothing reads it
    back in one extend batch from an empty cache)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    def set_index_k_scale_buffer(self, layer_id, loc, index_k, index_k_scale) -> None:
        return None


ATTENTION = record(
    "attention_backend", "sglang::unified_attention_with_output (the split op) -> attn_backend.forward",
    "NativeSparseAttnBackend runs FlashMLA / DeepGEMM kernels; dense causal MLA attention in "
    "torch equals DSA's top-k sparse attention here (every sequence <= index_topk tokens), and "
    "the indexer metadata answers as the backend's does for one extend batch from an empty cache",
)  # fmt: skip
KV_POOL = record("dsa_kv_pool", "forward_batch.token_to_kv_pool",
                  "the DSA KV pool needs GPU memory pools; the indexer's key write is accepted "
                  "and dropped (one extend batch from an empty cache reads nothing back)")  # fmt: skip


@contextlib.contextmanager
def device_queries(sm: tuple[int, int]) -> Iterator[list[dict]]:
    """``torch.cuda.current_device`` / ``get_device_capability`` answering as one GPU of ``sm``
    (sgl_kernel's ``is_arch_support_pdl`` asks them while traced; dynamo folds them to constants
    on a GPU); ``torch.cuda.is_available`` stays False, so dynamo saves no CUDA RNG state."""
    from fp4lab.compile import target

    props = types.SimpleNamespace(name=f"simulated SM{sm[0]}{sm[1]}", major=sm[0], minor=sm[1],
                                  multi_processor_count=132, total_memory=80 * 2**30)  # fmt: skip
    with (
        target.attribute_replaced(torch.cuda, "current_device", lambda: 0),
        target.attribute_replaced(torch.cuda, "get_device_capability", lambda device=None: sm),
        target.attribute_replaced(torch.cuda, "get_device_properties", lambda device=None: props),
    ):
        yield [record("device_queries", "torch.cuda.current_device, get_device_capability, "
                       "get_device_properties",
                       "a CPU build of torch raises on them; sgl_kernel's wrappers ask them for "
                       "PDL support, which dynamo folds to a constant on a GPU")]  # fmt: skip
