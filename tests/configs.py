"""Configs of published FP4 checkpoints as their users hold them, written by the tests (never
downloaded): each with the fields that decide what the replay builds."""

from __future__ import annotations

import json
from pathlib import Path

NVFP4_GROUP = {"num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group",
               "symmetric": True, "dynamic": False, "observer": "minmax"}  # fmt: skip

COMPRESSED_TENSORS = {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": NVFP4_GROUP,
                                  "input_activations": {**NVFP4_GROUP, "dynamic": "local"}}},
}  # fmt: skip
"""LLM Compressor's NVFP4 (``nvfp4-pack-quantized``): weights and activations."""

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
         "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
         "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 40960,
         "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": False}  # fmt: skip
"""Qwen3-8B's shape."""

GLM45_AIR = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
             "torch_dtype": "bfloat16", "vocab_size": 151552, "hidden_size": 4096,
             "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 46,
             "first_k_dense_replace": 1, "num_attention_heads": 96, "num_key_value_heads": 8,
             "head_dim": 128, "partial_rotary_factor": 0.5, "attention_bias": True,
             "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8,
             "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
             "num_nextn_predict_layers": 1, "use_qk_norm": False, "hidden_act": "silu",
             "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
             "tie_word_embeddings": False}  # fmt: skip
"""GLM-4.5-Air's shape (``zai-org/GLM-4.5-Air``)."""

MODELOPT = {"producer": {"name": "modelopt", "version": "0.31.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                             "group_size": 16, "exclude_modules": ["lm_head"]}}  # fmt: skip
"""A ModelOpt NVFP4 ``hf_quant_config.json``."""


def written(folder: Path, config: dict, hf_quant: dict | None = None) -> Path:
    """``config.json`` (and ``hf_quant_config.json``) in ``folder``; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return folder


LLAMA4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "torch_dtype": "bfloat16", "boi_token_index": 200080, "eoi_token_index": 200081,
    "image_token_index": 200092, "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama4_text", "vocab_size": 202048, "hidden_size": 5120,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_act": "silu", "max_position_embeddings": 10485760, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0,
        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "use_qk_norm": True, "attention_chunk_size": 8192, "attn_temperature_tuning": True,
        "floor_scale": 8192, "attn_scale": 0.1, "no_rope_layers": [1, 1, 1, 0] * 12,
        "attention_bias": False, "router_aux_loss_coef": 0.001, "torch_dtype": "bfloat16"},
    "vision_config": {
        "model_type": "llama4_vision_model", "hidden_size": 1408, "intermediate_size": 5632,
        "num_hidden_layers": 34, "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
        "num_channels": 3, "norm_eps": 1e-05, "pixel_shuffle_ratio": 0.5,
        "projector_input_dim": 4096, "projector_output_dim": 4096, "vision_output_dim": 4096,
        "rope_theta": 10000, "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default", "hidden_act": "gelu", "multi_modal_projector_bias": False,
        "projector_dropout": 0.0, "attention_dropout": 0.0},
}  # fmt: skip
"""Llama-4 Scout's shape (``meta-llama/Llama-4-Scout-17B-16E-Instruct``): a multimodal wrapper."""

MODELOPT_LLAMA4 = {"producer": {"name": "modelopt", "version": "0.31.0"},
                   "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                    "exclude_modules": ["lm_head", "vision_model*", "multi_modal_projector*",
                                                        "*router*"]}}  # fmt: skip
"""NVIDIA's NVFP4 Llama-4 Scout: the vision tower, projector and routers left in BF16."""
