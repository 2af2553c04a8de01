"""Inside one SGLang environment: which kernel each stand-in replaces, where, and why.

Each table row names a boundary in the release (a module and name, an op, a schema) and the CPU
kernel of ``cpu_kernels`` put there; ``kernels`` installs them and records each. Adding a
stand-in is one row here (docs/architecture.md says which table is for which kind).
"""

from __future__ import annotations

import torch

from fp4lab.serving.replay.release import (
    cpu_graph_kernels,
    cpu_kernels,
    cpu_moe_kernels,
    cpu_quant_kernels,
    triton_ops,
)

SGL_KERNEL_OPS = {
    "rmsnorm": ("rmsnorm(Tensor(a!) output, Tensor input, Tensor weight, float eps, "
                "bool enable_pdl) -> ()", cpu_kernels.rmsnorm, None),
    "fused_add_rmsnorm": ("fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, "
                          "float eps, bool enable_pdl) -> ()", cpu_kernels.fused_add_rmsnorm, None),
    "silu_and_mul": ("silu_and_mul(Tensor(a!) out, Tensor input) -> ()", cpu_kernels.silu_and_mul, None),
    "scaled_fp4_quant": ("scaled_fp4_quant(Tensor(a!) output, Tensor input, Tensor(b!) "
                         "output_scale, Tensor input_global_scale) -> ()", cpu_kernels.scaled_fp4_quant, None),
    "moe_fused_gate": ("moe_fused_gate(Tensor input, Tensor bias, int num_expert_group, "
                       "int topk_group, int topk, int num_fused_shared_experts, "
                       "float routed_scaling_factor, bool apply_routed_scaling_factor_on_output) "
                       "-> Tensor[]", cpu_moe_kernels.moe_fused_gate, cpu_moe_kernels.moe_fused_gate_fake),
    "apply_rope_pos_ids_cos_sin_cache": (
        "apply_rope_pos_ids_cos_sin_cache(Tensor q, Tensor k, Tensor(a!) q_rope, Tensor(b!) k_rope, "
        "Tensor cos_sin_cache, Tensor pos_ids, bool interleave, bool enable_pdl, Tensor? v, "
        "Tensor? k_buffer, Tensor? v_buffer, Tensor? kv_cache_loc) -> ()",
        cpu_kernels.rope_pos_ids_kv, None),
    "topk_softmax": ("topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor "
                     "gating_output, bool renormalize, float moe_softcapping=0.0, Tensor? "
                     "correction_bias=None) -> ()", cpu_moe_kernels.topk_softmax, None),
    "topk_sigmoid": ("topk_sigmoid(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor "
                     "gating_output, bool renormalize=False, Tensor? correction_bias=None) -> ()",
                     cpu_moe_kernels.topk_sigmoid, None),
    "fast_hadamard_transform": ("fast_hadamard_transform(Tensor x, float scale) -> Tensor",
                                cpu_kernels.hadamard, lambda x, scale: torch.empty_like(x)),
}  # fmt: skip
"""The sgl_kernel ops the models' forwards call: schema (as sgl_kernel's Python wrapper calls the
op; later arguments a release added have their defaults, so every release's call fits), CPU
kernel, and a fake where the op returns tensors (in-place ops need none)."""


LIBRARIES: dict[str, torch.library.Library] = {}
"""The libraries the stand-ins live in (kept alive: an op lives as long as its library)."""


SGLANG_OP_KERNELS = {
    "layernorm": (lambda input, gamma, beta, eps=1e-6: cpu_kernels.layernorm(input, gamma, beta, eps),
                  "SGLang's layernorm op (0.5.13 on; the DSA indexer's k_norm) runs FlashInfer's "
                  "CuTe-DSL layernorm: torch layer_norm"),
    "k_cache_and_topk_result": (cpu_kernels.indexer_topk,
        "the DSA indexer's split op (0.5.13 on): its index-cache write and FP8 MQA logits are "
        "DeepGEMM kernels; the causal top-k of an extend batch from an empty cache instead"),
    "scaled_fp4_quant": (cpu_kernels.sglang_scaled_fp4_quant,
                         "SGLang's JIT NVFP4 quantize kernel: fp4lab's spec-exact reference"),
    "flashinfer_fp4_quantize": (cpu_kernels.sglang_fp4_quantize,
        "FlashInfer's FP4 quantize inside SGLang's own op: fp4lab's spec-exact reference"),
    "fp4_gemm": (cpu_kernels.fp4_gemm,
                 "FlashInfer's mm_fp4 / CUTLASS FP4 GEMM: dequantize-matmul reference"),
    "_run_activation_inplace": (cpu_kernels.activation_and_mul,
                                "SGLang's JIT activation-and-mul kernel: torch"),
    "rotary_embedding_with_key": (cpu_kernels.rope_with_key, "SGLang's JIT rotary kernel: torch rotary"),
    "rotary_embedding_without_key": (cpu_kernels.rope_without_key,
                                     "SGLang's JIT rotary kernel: torch rotary"),
    "apply_rope_inplace": (cpu_kernels.rope_inplace, "SGLang's JIT fused rotary kernel: torch rotary"),
    "apply_rope_inplace_with_kvcache": (cpu_kernels.rope_inplace_with_kvcache,
        "SGLang's JIT fused rotary + KV-cache store (where the KV pool is bf16): torch rotary and "
        "row writes"),
    "apply_rope_pos_ids_cos_sin_cache_with_kv_cache": (cpu_kernels.rope_pos_ids_with_kv_cache,
        "SGLang's JIT rotary kernel by position ids with its KV-cache store (where the KV pool is "
        "bf16): torch rotary and row writes"),
    "apply_rope_pos_ids_cos_sin_cache_without_kv_cache": (cpu_kernels.rope_pos_ids,
        "SGLang's JIT rotary kernel (FlashInfer-style, by position ids): torch rotary"),
    "apply_fp4_marlin_linear": (cpu_kernels.marlin_linear_zero,
        "SGLang's NVFP4 Marlin GEMM (Hopper, 0.5.2x): no CPU reference for Marlin's repacked "
        "layout, so zeros of its shape (the linear layers' numerics are not checked on SM90)"),
    "jit_dsv3_fused_a_gemm": (cpu_kernels.fused_a_gemm,
        "SGLang's JIT DeepSeek-V3 fused QKV-A GEMM (its choice below SM120): a bf16 matmul"),
    "cutedsl_dsv3_fused_a_gemm": (cpu_kernels.fused_a_gemm,
        "SGLang's CuTe-DSL DeepSeek-V3 fused QKV-A GEMM (its choice on SM120): a bf16 matmul; the "
        "real kernel asserts K a multiple of 1024, which the full model's hidden size (7168) "
        "meets and the shrunk model's (256) does not"),
    "per_token_group_quant": (cpu_quant_kernels.per_token_group_quant,
        "SGLang's JIT per-token-group 8-bit quantize (the MXFP4 MoE's MXFP8 activations on SM100, "
        "0.5.17 on): group amax scales, UE8M0-packed where asked, e4m3 or int8 codes in torch"),
    "hadamard_transform": (cpu_kernels.hadamard,
        "SGLang's JIT Hadamard transform (DSA indexer, an op from 0.5.2x): matmul with the "
        "Hadamard matrix"),
}  # fmt: skip
"""SGLang ops whose body is a CUDA kernel: the CPU kernel lent to them instead of their body."""


SGLANG_OP_MODULES = (
    "sglang.kernels.ops.quantization.hadamard",
    "sglang.jit_kernel.hadamard",
    "sglang.jit_kernel.rope",
    "sglang.jit_kernel.dsv3_fused_a_gemm",
    "sglang.jit_kernel.cutedsl_dsv3_fused_a_gemm",
    "sglang.kernels.ops.gemm.dsv3_fused_a_gemm",
    "sglang.kernels.ops.gemm.cutedsl_dsv3_fused_a_gemm",
    "sglang.kernels.ops.quantization.per_token_group_quant",
)
"""Where a release defines such an op in a module its model imports only when first called
(0.5.2x; the JIT kernel package from 0.5.13, its ops package in later releases)."""


ATEN_CPU_KERNELS = {
    "mm.dtype": (
        cpu_kernels.mm_out_dtype,
        "aten::mm with out_dtype has CUDA kernels only (the DSA indexer's float32 projections "
        "from 0.5.13): a float matmul cast to out_dtype",
    ),
}
"""torch ops with no CPU kernel in torch's CPU build that a release's forward calls."""


LOAD_TIME = (
    ("flashinfer", "nvfp4_block_scale_interleave", cpu_kernels.block_scale_interleave,
     "FlashInfer's JIT block-scale interleave, which the TRT-LLM FP4 MoE's weight preparation "
     "calls at load time: fp4lab's 128x4 swizzle"),
    ("flashinfer", "block_scale_interleave", cpu_kernels.block_scale_interleave,
     "FlashInfer's JIT block-scale interleave (its older name, the same call): fp4lab's swizzle"),
    ("flashinfer.fp4_quantization", "block_scale_interleave", cpu_kernels.block_scale_interleave,
     "FlashInfer's JIT block-scale interleave where its own shuffle_matrix_sf_a calls it (the "
     "TRT-LLM MoE's weight preparation, FlashInfer 0.4-0.5): fp4lab's swizzle"),
    ("sglang.srt.layers.quantization.mxfp4", "nvfp4_block_scale_interleave",
     cpu_kernels.block_scale_interleave,
     "FlashInfer's JIT block-scale interleave as the MXFP4 MoE binds it at import, for its "
     "TRT-LLM weight preparation: fp4lab's swizzle"),
    ("triton_kernels.numerics_details.mxfp", "upcast_from_mxfp",
     cpu_moe_kernels.ByReleaseSignature(cpu_quant_kernels.upcast_from_mxfp),
     "triton_kernels' Triton upcast of the MXFP4 MoE's weights to BF16 at load (Hopper, with no "
     "Triton or FlashInfer MoE; bound to each release's triton_kernels signature): E2M1 codes "
     "times their block's power-of-two scale, in torch"),
    ("sglang.srt.layers.quantization.marlin_utils_fp4", "gptq_marlin_repack", cpu_kernels.marlin_repack_shape,
     "Marlin's JIT weight repack (NVFP4 on Hopper, 0.5.2x): a tensor of the repacked shape; the "
     "Marlin GEMM reading it is stood in for too"),
)  # fmt: skip
"""(module, name, CPU kernel, why): kernels the model's weight preparation calls on load."""


TRTLLM_WHY = ("FlashInfer's TRT-LLM FP4 MoE kernel: no CPU reference for its shuffled weight "
              "layout, the routed experts contribute zero (the MoE's numerics are not checked "
              "where this runs)")  # fmt: skip


EAGER_ONLY = (
    ("flashinfer.norm", "rmsnorm", cpu_kernels.flashinfer_rmsnorm,
     "FlashInfer's CuTe-DSL / JIT RMSNorm, which sgl_kernel's rmsnorm calls eagerly (while "
     "dynamo traces, sgl_kernel takes its own op): torch RMSNorm"),
    ("flashinfer.norm", "fused_add_rmsnorm", cpu_kernels.flashinfer_fused_add_rmsnorm,
     "FlashInfer's fused add + RMSNorm, called eagerly by sgl_kernel: torch add and RMSNorm"),
    ("sglang.srt.layers.layernorm", "layernorm", cpu_kernels.layernorm,
     "FlashInfer's JIT layernorm (the DSA indexer's k_norm): torch layer_norm"),
    ("sglang.jit_kernel.hadamard", "hadamard_transform", cpu_kernels.hadamard,
     "SGLang's JIT Hadamard transform (DSA indexer): matmul with the Hadamard matrix"),
    ("sglang.srt.layers.moe.topk", "fused_topk_deepseek", cpu_moe_kernels.fused_topk_deepseek,
     "FlashInfer's JIT DeepSeek-V3 grouped routing as 0.5.9 binds it (0.5.10 on: SGLang's op "
     "around it): the routing by its definition"),
    ("sglang.srt.layers.moe.topk", "_fused_topk_deepseek", cpu_moe_kernels.fused_topk_deepseek,
     "FlashInfer's JIT DeepSeek-V3 grouped routing inside SGLang's op (0.5.10 on): the routing "
     "by its definition"),
    ("sglang.srt.layers.moe.cutlass_moe", "cutlass_moe_fp4", cpu_moe_kernels.cutlass_moe_fp4,
     "sgl_kernel's CUTLASS NVFP4 MoE (prepare_moe_input, grouped FP4 GEMMs): the MoE by its "
     "definition on fp4lab's reference quantize and the dequantize-matmul GEMM"),
    ("sglang.srt.layers.moe.fused_moe_triton.layer", "trtllm_fp4_block_scale_moe",
     cpu_moe_kernels.trtllm_fp4_moe_zero, TRTLLM_WHY),
    ("flashinfer.fused_moe", "trtllm_fp4_block_scale_moe", cpu_moe_kernels.trtllm_fp4_moe_zero, TRTLLM_WHY),
    ("sglang.srt.layers.quantization.mxfp4", "trtllm_fp4_block_scale_moe", cpu_moe_kernels.trtllm_fp4_moe_zero,
     TRTLLM_WHY + "; as the MXFP4 MoE binds it (SM100)"),
    ("flashinfer", "trtllm_fp4_block_scale_moe", cpu_moe_kernels.trtllm_fp4_moe_zero,
     TRTLLM_WHY + "; imported where it is called (the TRT-LLM MoE runner, 0.5.20 on)"),
    *((module, "trtllm_fp4_block_scale_routed_moe", cpu_moe_kernels.trtllm_fp4_moe_zero,
       TRTLLM_WHY + "; its routed form, from top-k ids packed by SGLang (sigmoid routing)")
      for module in ("flashinfer", "flashinfer.fused_moe")),
    ("sglang.kernels.ops.moe.moe_finalize_fuse_shared", "moe_finalize_fuse_shared",
     cpu_moe_kernels.moe_finalize, "SGLang's JIT MoE finalize fused with the shared experts' add "
     "(after the TRT-LLM FP4 MoE with do_finalize=False, 0.5.17 on): the weighted sum of each "
     "token's FC2 rows plus the shared output, by its definition"),
    *((module, "nvfp4_gemm_swiglu_nvfp4_quant", cpu_kernels.nvfp4_gemm_swiglu_quant,
       "SGLang's SM100 CuTe-DSL FC1 NVFP4 GEMM + SwiGLU + NVFP4 quantize (the shared/dense MLP, "
       "0.5.17 on): the GEMM on fp4lab's dequantize-matmul, SwiGLU and reference quantize")
      for module in ("sglang.srt.layers.quantization.nvfp4_gemm_swiglu_nvfp4_quant",
                     "sglang.kernels.ops.quantization.nvfp4_gemm_swiglu_nvfp4_quant",
                     "sglang.kernels.ops.gemm.nvfp4_gemm_swiglu_nvfp4_quant")),
    *((module, "concat_and_cast_mha_k_triton", cpu_kernels.concat_and_cast_mha_k,
       "SGLang's Triton MLA key concat (DeepSeek's MHA prefill, as its model binds it): the "
       "concat and cast in torch")
      for module in ("sglang.srt.models.deepseek_common.attention_forward_methods.forward_mha",
                     "sglang.srt.models.deepseek_v2")),
    *((module, "fused_experts_impl", cpu_moe_kernels.ByReleaseSignature(cpu_moe_kernels.triton_fused_experts),
       "SGLang's Triton MoE (token sort, grouped GEMM kernels, activation, weighted sum), which "
       "its fused-experts op runs (the MXFP4 MoE on Hopper, its weights dequantized at load): "
       "the MoE by its definition in torch, unquantized weights only")
      for module in ("sglang.srt.layers.moe.fused_moe_triton.fused_moe",
                     "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")),
    *((module, "mxfp8_quantize", cpu_quant_kernels.mxfp8_quantize,
       "FlashInfer's MXFP8 quantize of the MXFP4 MoE's activations (imported where it is called, "
       "or bound at import): UE8M0 block scales and e4m3 codes by their definition, 128x4 layout")
      for module in ("flashinfer", "sglang.srt.layers.quantization.mxfp4")),
    ("flashinfer.fused_moe", "cutlass_fused_moe", cpu_moe_kernels.cutlass_fused_moe_zero,
     "FlashInfer's CUTLASS NVFP4 fused MoE: no CPU reference for its packed weight layout, the "
     "routed experts contribute zero (the MoE's numerics are not checked where this runs)"),
    ("sglang.srt.layers.quantization.modelopt_quant", "flashinfer_cutlass_fused_moe",
     cpu_moe_kernels.cutlass_fused_moe_zero, "FlashInfer's CUTLASS NVFP4 fused MoE as 0.5.13+ binds it in "
     "modelopt_quant: the routed experts contribute zero (the MoE's numerics are not checked)"),
)  # fmt: skip
"""(module, name, CPU kernel, why): the kernels that run only eagerly in a model's PCG forward."""


BINDS_FLASHINFER_QUANTIZE = (
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.srt.layers.moe.fused_moe_triton.layer",
    "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm",
)
"""Modules that may bind FlashInfer's ``fp4_quantize`` by name (the NVFP4 linear method, the
FP4 MoE layer, the TRT-LLM MoE runner), depending on the release and the SM."""


CHUNKED_PREFIX = cpu_graph_kernels.Launch(cpu_graph_kernels.chunked_prefix_kv_indices)
"""The chunked-prefix KV gather as a Triton launch (``kernel[grid](*args)``)."""
KV_INDICES = cpu_graph_kernels.Launch(cpu_graph_kernels.flashinfer_kv_indices)
"""A request's KV slots gathered, as a Triton launch (``kernel[grid](*args)``)."""
REPLACED = (
    ("sglang.srt.layers.attention.nsa.triton_kernel", "act_quant", triton_ops.act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.3-0.5.12), traced and run: one opaque op "
     "(fp4lab_triton::act_quant) as dynamo takes a Triton launch on a GPU; torch amax/scale; "
     "SGLang's Python wrapper around the launch is not traced here"),
    ("sglang.srt.layers.attention.dsa.triton_kernel", "act_quant", triton_ops.act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.13 on), traced and run: one opaque op "
     "(fp4lab_triton::act_quant) as dynamo takes a Triton launch on a GPU; torch amax/scale; "
     "SGLang's Python wrapper around the launch is not traced here"),
    ("sglang.kernels.ops.attention.dsa.triton_kernel", "act_quant", triton_ops.act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.2x home), traced and run: one opaque op "
     "(fp4lab_triton::act_quant) as dynamo takes a Triton launch on a GPU; torch amax/scale; "
     "SGLang's Python wrapper around the launch is not traced here"),
    ("sglang.kernels.ops.quantization.act_quant_triton", "act_quant", triton_ops.act_quant_launch,
     "the DSA indexer's Triton FP8 block quantize (0.5.23 home, imported where it is called): one "
     "opaque op (fp4lab_triton::act_quant); torch amax/scale"),
    ("sglang.kernels.ops.moe.moe_fused_gate", "moe_fused_gate", cpu_moe_kernels.triton_router,
     "SGLang's Triton MoE router (0.5.2x), traced and run: SGLang's own torch grouped top-k "
     "(biased_grouped_topk_impl); whether dynamo takes the Triton launch is not checked here"),
    ("sglang.jit_kernel.moe_fused_gate", "moe_fused_gate", cpu_moe_kernels.triton_router,
     "SGLang's Triton MoE router at its 0.5.1x home, traced and run: SGLang's own torch grouped "
     "top-k (biased_grouped_topk_impl) behind one opaque op; SGLang's Python wrapper around the "
     "launch is not traced here, nor whether dynamo takes the launch"),
    *((module, "create_chunked_prefix_cache_kv_indices", CHUNKED_PREFIX,
       "SGLang's Triton gather of a chunk's KV slots (0.5.2x full prefill graphs with chunked "
       "prefix, DeepSeek's MHA prefix chunks), launched as kernel[grid]: the gather in torch")
      for module in ("sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
                     "sglang.srt.model_executor.runner.eager_runner",
                     "sglang.srt.model_executor.forward_batch_deepseek_mha_mixin")),
    *((module, "create_flashinfer_kv_indices_triton", KV_INDICES,
       "SGLang's Triton gather of each request's KV slots (DeepSeek's one-shot MHA prefill, the "
       "KV index translator), launched as kernel[grid]: the gather in torch")
      for module in ("sglang.srt.model_executor.forward_batch_deepseek_mha_mixin",
                     "sglang.srt.mem_cache.kv_index_translator")),
    *((module, "get_cuda_stream", cpu_kernels.default_stream,
       "sgl_kernel's CUDA stream handle (sgl-kernel 0.3.16 passes it to its ops; torch's CUDA "
       "API raises on a CPU build): the default stream's handle, 0, a constant as dynamo takes "
       "a stream's cuda_stream on a GPU")
      for module in ("sgl_kernel.elementwise", "sgl_kernel.gemm", "sgl_kernel.speculative")),
    ("sglang.kernels.ops.moe.pack_topk_ids", "_pack_topk_ids_triton_kernel",
     cpu_graph_kernels.Launch(triton_ops.pack_topk_ids_launch),
     "SGLang's Triton packing of top-k ids and weights for FlashInfer's routed TRT-LLM MoE "
     "(0.5.18 on), launched as kernel[grid]: one opaque op (fp4lab_triton::pack_topk_ids) "
     "writing the packed int32s, by the kernel's definition"),
    ("sglang.srt.layers.moe.topk", "mask_topk_ids", cpu_moe_kernels.mask_topk_ids,
     "SGLang's JIT mask of padded rows' expert ids (0.5.12 on, as its top-k binds it; reached "
     "with padded prefill graphs), traced and run: -1 in the rows past the real tokens, in "
     "torch; whether dynamo takes the JIT call in the release's own torch.compile is not "
     "checked here"),
    ("sglang.srt.models.minimax_m2", "rms_sumsq_serial", triton_ops.rms_sumsq_launch,
     "MiniMax-M2's Triton QK-norm sum of squares, traced and run: one opaque op "
     "(fp4lab_triton::rms_sumsq_serial) as dynamo takes a Triton launch on a GPU; torch sums"),
    ("sglang.srt.models.minimax_m2", "rms_apply_serial", triton_ops.rms_apply_launch,
     "MiniMax-M2's Triton QK-norm apply, traced and run: one opaque op "
     "(fp4lab_triton::rms_apply_serial); torch rsqrt and scale"),
    ("sglang.srt.layers.quantization.marlin_utils", "marlin_make_workspace", cpu_moe_kernels.marlin_workspace,
     "Marlin's workspace sized from the GPU's SM count (asks torch.cuda for it): a CPU tensor"),
    ("sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe", "fused_marlin_moe",
     cpu_moe_kernels.marlin_moe_zero, "SGLang's fused Marlin NVFP4 MoE (Hopper, 0.5.2x, inside SGLang's MoE op): "
     "the routed experts contribute zero (the MoE's numerics are not checked on SM90)"),
)  # fmt: skip
"""(module, name, CPU kernel, why): kernels replaced both while traced and when run (a Triton
launch has no CPU backend to run on, traced or not)."""
