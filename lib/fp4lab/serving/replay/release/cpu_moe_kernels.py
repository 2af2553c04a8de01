"""Inside one SGLang environment: the CPU kernels that stand in for the MoE's routing and expert
kernels SGLang's models call: the grouped top-k by SGLang's own torch implementation, the
softmax top-k by its definition, the NVFP4 MoE by its definition on fp4lab's reference, SGLang's
Triton MoE by its definition (unquantized weights), and zeros where no CPU reference exists for
a kernel's weight layout (FlashInfer's TRT-LLM and CUTLASS FP4 MoEs, Marlin), each record saying
so. The dense kernels are ``cpu_kernels``, the quantize kernels ``cpu_quant_kernels``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fp4lab.compile import fix
from fp4lab.serving.replay.release import cpu_kernels


def moe_fused_gate(x, bias, groups, topk_group, topk, shared, scaling, on_output):
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


def triton_router(scores, bias, topk, scoring_func="sigmoid", num_fused_shared_experts=0,
                   renormalize=True, routed_scaling_factor=1.0,
                   apply_routed_scaling_factor_on_output=False, moe_softcapping=0.0,
                   num_expert_group=1, topk_group=1, **triton_only: Any):  # fmt: skip
    """SGLang's Triton router (0.5.16 on): sigmoid scores by SGLang's own torch grouped top-k
    behind the stood-in ``sgl_kernel::moe_fused_gate`` op, softmax scores (one group, no fused
    shared expert) by the stood-in ``sgl_kernel::topk_softmax`` op: one opaque node while
    traced, as a kernel launch is (fp4lab's Python never enters the trace)."""
    extras = [k for k, v in triton_only.items()
              if v is not None and not (isinstance(v, (bool, int, float)) and not v)]  # fmt: skip
    if (
        scoring_func == "softmax"
        and num_expert_group <= 1
        and not num_fused_shared_experts
        and not extras
    ):
        weights = torch.empty(scores.shape[0], topk, dtype=torch.float32)
        ids = torch.empty(scores.shape[0], topk, dtype=torch.int32)
        torch.ops.sgl_kernel.topk_softmax(weights, ids, scores, renormalize, moe_softcapping, bias)
        scale = routed_scaling_factor or 1.0
        return (weights * scale if apply_routed_scaling_factor_on_output else weights), ids
    if scoring_func != "sigmoid" or not renormalize or moe_softcapping or extras:
        raise NotImplementedError("fp4lab's router reference covers renormalized sigmoid routing "
                                  f"and one-group softmax routing only (asked: {scoring_func}, "
                                  f"extras {extras})")  # fmt: skip
    return torch.ops.sgl_kernel.moe_fused_gate(scores, bias, num_expert_group, topk_group, topk,
                                               num_fused_shared_experts, routed_scaling_factor,
                                               apply_routed_scaling_factor_on_output)  # fmt: skip


def _top_k(weights, ids, scores, renormalize, bias) -> None:
    """sgl_kernel's top-k on ``scores``: the experts chosen on the scores plus the correction
    bias, their scores written as weights (renormalized if asked), their ids as ids."""
    chosen = (scores if bias is None else scores + bias.float()).topk(weights.shape[-1], -1)[1]
    picked = scores.gather(-1, chosen)
    if renormalize:
        picked = picked / picked.sum(-1, keepdim=True)
    weights.copy_(picked)
    ids.copy_(chosen)


def topk_softmax(weights, ids, gating, renormalize, softcapping=0.0, bias=None) -> None:
    """sgl_kernel's softmax top-k by its definition (its docstring): softmax of the (softcapped)
    gating logits, the top-k experts chosen on the scores plus the correction bias, their
    scores as weights, renormalized if asked."""
    logits = gating.float()
    if softcapping:
        logits = softcapping * torch.tanh(logits / softcapping)
    _top_k(weights, ids, logits.softmax(-1), renormalize, bias)


def topk_sigmoid(weights, ids, gating, renormalize=False, bias=None) -> None:
    """sgl_kernel's sigmoid top-k by its docstring: sigmoid of the gating logits, the top-k
    experts chosen on the scores plus the correction bias, their scores as weights,
    renormalized if asked."""
    _top_k(weights, ids, gating.float().sigmoid(), renormalize, bias)


def fused_topk_deepseek(scores, bias, n_group, topk_group, topk, scaling, values, indices,
                        launch_with_pdl=True) -> None:  # fmt: skip
    """FlashInfer's DeepSeek-V3 routing by its definition (its docstring's five steps): sigmoid
    scores plus bias, each group scored by its top two, the best ``topk_group`` groups kept, the
    top-k experts of those by biased score, their sigmoid scores normalized and scaled."""
    sig = scores.float().sigmoid()
    biased = sig + bias.float()
    rows, experts = biased.shape
    grouped = biased.view(rows, n_group, experts // n_group)
    best = grouped.topk(2, -1)[0].sum(-1).topk(topk_group, -1)[1]
    keep = torch.zeros(rows, n_group, dtype=torch.bool).scatter_(1, best, True)
    masked = grouped.masked_fill(~keep[..., None], float("-inf")).view(rows, experts)
    chosen = masked.topk(topk, -1)[1]
    picked = sig.gather(-1, chosen)
    values.copy_(picked / picked.sum(-1, keepdim=True) * scaling)
    indices.copy_(chosen)


def mask_topk_ids(topk_ids: torch.Tensor, num_token_non_padded: torch.Tensor) -> None:
    """SGLang's JIT mask of the padded rows' expert ids (-1 from row ``num_token_non_padded``
    on), with tensor ops only (no host sync inside a capture)."""
    rows = torch.arange(topk_ids.shape[0], device=topk_ids.device)
    topk_ids.masked_fill_((rows >= num_token_non_padded)[:, None], -1)


def moe_fused_gate_fake(x, bias, groups, topk_group, topk, shared, scaling, on_output):
    rows = x.shape[0]
    return [x.new_empty((rows, topk), dtype=torch.float32),
            x.new_empty((rows, topk), dtype=torch.int32)]  # fmt: skip


def pick(t: torch.Tensor, expert: int) -> torch.Tensor:
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
        qx, sx = fix.reference_fp4_quantize(x, pick(a1_gscale, expert))
        h = cpu_kernels.fp4_gemm(qx, w1_fp4[expert], sx, w1_blockscale[expert], pick(w1_alphas, expert),
                     torch.float32, w1_fp4.shape[1])  # fmt: skip
        half = h.shape[-1] // 2
        act = (torch.nn.functional.silu(h[:, :half]) * h[:, half:]).to(a.dtype)
        qa, sa = fix.reference_fp4_quantize(act, pick(a2_gscale, expert))
        y = cpu_kernels.fp4_gemm(qa, w2_fp4[expert], sa, w2_blockscale[expert], pick(w2_alphas, expert),
                     torch.float32, w2_fp4.shape[1])  # fmt: skip
        out.index_add_(0, rows, y if apply_router_weight_on_input else y * weight)
    return out.to(a.dtype)


def trtllm_fp4_moe_zero(*args: Any, output: torch.Tensor | None = None, **kwargs: Any):
    """No CPU reference for the TRT-LLM FP4 MoE's shuffled weight layout: the routed experts
    contribute zero (compiled and eager alike); with ``do_finalize=False`` the release finalizes
    (``moe_finalize``) a zero FC2 row per slot, zero weights, each slot at its own row."""
    hidden = kwargs.get("hidden_states", args[2] if len(args) > 2 else None)
    rows, width = hidden.shape[0], hidden.shape[-1] * 2  # two FP4 codes per byte
    if kwargs.get("do_finalize") is False:
        top_k = kwargs["top_k"]
        return [torch.zeros(rows * top_k, width, dtype=torch.bfloat16),
                torch.zeros(rows, top_k, dtype=torch.bfloat16),
                torch.arange(rows * top_k, dtype=torch.int32)]  # fmt: skip
    if output is None:
        output = torch.empty(rows, width, dtype=torch.bfloat16)
    return [output.zero_()]


def moe_finalize(gemm2_out: torch.Tensor, expanded_idx_to_permuted_idx: torch.Tensor,
                 expert_weights: torch.Tensor, shared_output: torch.Tensor | None, top_k: int,
                 enable_pdl: bool = False) -> torch.Tensor:  # fmt: skip
    """SGLang's JIT MoE finalize fused with the shared experts' add, by its definition: each
    token's FC2 rows (a slot's permuted row; -1: dropped) weighted by its expert weights and
    summed, plus the shared experts' output."""
    rows = expert_weights.shape[0]
    width = gemm2_out.shape[1] if shared_output is None else shared_output.shape[1]
    slots = expanded_idx_to_permuted_idx.reshape(rows, top_k).long()
    picked = gemm2_out[slots.clamp(min=0), :width].float() * (slots >= 0)[..., None]
    out = (picked * expert_weights.float()[..., None]).sum(1)
    if shared_output is not None:
        out = out + shared_output.float()
    return out.to(torch.bfloat16)


def cutlass_fused_moe_zero(*args: Any, output: torch.Tensor | None = None, **kwargs: Any):
    """FlashInfer's CUTLASS fused MoE (SGLang 0.5.2x's NVFP4 MoE runner on SM120): no CPU
    reference for its packed weight and interleaved scale layout, so the routed experts
    contribute zero (the same in the compiled and the eager pass)."""
    if output is None:
        rows, hidden = kwargs["input"].shape[0], kwargs["fc2_expert_weights"].shape[1]
        output = torch.empty(rows, hidden, dtype=kwargs.get("output_dtype") or torch.bfloat16)
    return [output.zero_()]


def marlin_workspace(device: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.zeros(132 * 4, dtype=torch.int32)


def marlin_moe_zero(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """SGLang's fused Marlin MoE (NVFP4 MoE on Hopper, 0.5.2x): the routed experts contribute
    zero (no CPU reference for Marlin's repacked layout)."""
    return torch.zeros_like(hidden_states)


QUANTIZED = ("use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16", "use_int4_w4a16", "a1_q")


UNGATED = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "relu2": lambda h: torch.nn.functional.relu(h).square()}  # fmt: skip


def _activation(h: torch.Tensor, given: dict) -> torch.Tensor:
    """The Triton MoE's activation of the gate-up output, as the release's ``fused_experts_impl``
    chooses it: SiLU or GELU times up; GPT-OSS's SwiGLU with alpha and limit (gate and up
    interleaved or halved); SiLU clamped by the limit alone; DeepSeek-V4's clamp before SiLU; or
    SiLU, GELU, squared ReLU ungated."""
    activation, gated = given.get("activation", "silu"), given.get("is_gated", True)
    alpha, limit, clamp = (
        given.get("gemm1_alpha"),
        given.get("gemm1_limit"),
        given.get("swiglu_limit"),
    )
    if not gated and activation in UNGATED:
        return UNGATED[activation](h)
    if not gated or activation not in ("silu", "gelu"):
        raise NotImplementedError(f"fp4lab's Triton MoE stand-in has no activation "
                                  f"{activation!r} (is_gated={gated})")  # fmt: skip
    silu = activation == "silu"
    if silu and alpha is not None:
        interleaved = given.get("gate_up_interleaved", True)
        gate, up = (h[..., ::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return gate * torch.sigmoid(gate * alpha) * (up + 1)
    gate, up = h.chunk(2, dim=-1)
    if silu and limit is not None:
        return UNGATED["silu"](gate).clamp(max=limit) * up.clamp(-limit, limit)
    if silu and clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    return UNGATED[activation](gate) * up


def triton_fused_experts(**given: Any) -> torch.Tensor:
    """SGLang's Triton MoE (``fused_experts_impl``: token sort, two grouped GEMM kernels, the
    activation, the weighted sum) by its definition, for unquantized weights: per selected expert
    (ids of -1 filtered out), x @ w1[e]^T + b1[e] in the activations' dtype, the activation, then
    @ w2[e]^T + b2[e] times the router weight (on the input instead where asked), summed and
    scaled by ``routed_scaling_factor``; written in place, or per top-k slot (``no_combine``)."""
    quantized = [k for k in QUANTIZED if given.get(k) not in (None, False)]
    if quantized:
        raise NotImplementedError(f"fp4lab's Triton MoE stand-in takes unquantized weights only "
                                  f"({', '.join(quantized)} given)")  # fmt: skip
    x, w1, w2 = given["hidden_states"], given["w1"], given["w2"]
    weights, ids = given["topk_weights"].float(), given["topk_ids"]
    b1, b2, dtype = given.get("b1"), given.get("b2"), x.dtype
    on_input = given.get("apply_router_weight_on_input", False)
    per_slot = torch.zeros(x.shape[0], ids.shape[1], w2.shape[1], dtype=torch.float32)
    for expert in ids.unique().tolist():
        if expert < 0:
            continue
        rows, slot = (ids == expert).nonzero(as_tuple=True)
        weight = weights[rows, slot, None]
        a = (x[rows].float() * weight).to(dtype) if on_input else x[rows]
        h = a.float() @ w1[expert].float().T + (0 if b1 is None else b1[expert].float())
        act = _activation(h.to(dtype).float(), given).to(dtype)
        y = act.float() @ w2[expert].float().T + (0 if b2 is None else b2[expert].float())
        weighted = not on_input and not given.get("no_combine")
        per_slot[rows, slot] = (y * weight if weighted else y).to(dtype).float()
    if given.get("no_combine"):
        return per_slot.to(dtype)
    out = (per_slot.sum(1) * (given.get("routed_scaling_factor") or 1.0)).to(dtype)
    return x.copy_(out) if given.get("inplace") else out


class CallRefused(TypeError):
    """The release called a function it installs with arguments that function's own signature
    refuses: the real function raises this ``TypeError`` before any kernel runs, on a GPU too."""


class ByReleaseSignature:
    """A CPU kernel whose release function's parameters differ by release: called with every
    argument named, bound to the release function's own signature (defaults applied); a call
    that signature refuses raises ``CallRefused``, as the real function would."""

    def __init__(self, kernel: Callable) -> None:
        self.kernel = kernel

    def bound_to(self, real: Callable) -> Callable:
        signature = inspect.signature(real)
        name = f"{getattr(real, '__module__', '?')}.{getattr(real, '__qualname__', '?')}"

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                given = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise CallRefused(f"{name}{signature}, as the release installs it, refuses the "
                                  f"release's call: {exc}") from None  # fmt: skip
            given.apply_defaults()
            return self.kernel(**given.arguments)

        return call
