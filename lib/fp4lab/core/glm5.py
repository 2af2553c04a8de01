"""GLM-5 (``GlmMoeDsaForCausalLM``), the model of the story: the widths fp4lab's experiments
scale down, in one place for every concern."""

from __future__ import annotations

ARCHITECTURE = "GlmMoeDsaForCausalLM"
"""The architecture name GLM-5's config gives SGLang (``architectures`` in config.json)."""

HIDDEN, HEADS, DENSE_FFN, LAYERS = 6144, 64, 12288, 78
"""Hidden size, attention heads, dense FFN width, layers."""

MOE_FFN, TOPK, EXPERTS = 2048, 8, 256
"""Routed-expert FFN width, experts per token, routed experts."""

SCALES = (1, 2, 4, 8, 16, 32, 64)
"""Allowed divisors of the widths (each keeps hidden and FFN widths multiples of 16)."""
