"""FlashInfer's MegaMoE layer (``moe_ep.MoEEpMegaLayer``) built as SGLang builds it for NVFP4
(``layers/moe/flashinfer_megamoe.py``, 0.5.20 on: its NVFP4 ``prepare_*_weights`` and
``ensure_*_layer`` functions):

* the NVFP4 weights and block scales (``WEIGHTS``) preprocessed first by
  ``moe_ep.preprocess_nvfp4_cutedsl_mega_weights`` and handed to the layer as
  ``MegaConfig(transformed_weights=..., preprocess_weights=False)`` with ``weights=None``;
* the kernel config ``moe_ep.Nvfp4CutedslMegaMoeConfig`` (``CONFIG``) of ``I`` and ``TOPK`` with
  the FC1/FC2 alphas and the FC1 norm constant (``SCALES``);
* one rank of one (``BootstrapConfig(world_size=1, rank=0, device=0)``) and
  ``FleetParams(E, M, K)``;
* the audited call ``forward(MoEEpTensors(hidden_states, topk_ids, topk_weights, **SCALES))``.

A step that raises is the eager outcome (e.g. a kernel module the CPU build of torch cannot
import), as for any input the package refuses to build.
"""

from __future__ import annotations

import sys
from typing import Any

from fp4lab.compile.audit import inputs

CONFIG = "Nvfp4CutedslMegaMoeConfig"
WEIGHTS = {"w13": "u8[E,2*I,K/2]", "w2": "u8[E,K,I/2]", "w13_scale": "f8[E,2*I,K/16]",
           "w2_scale": "f8[E,K,I/16]"}  # fmt: skip
SCALES = {"fc1_alpha": "f32[E]", "fc2_alpha": "f32[E]", "fc1_norm_const": "f32[1]"}
TENSORS = {"hidden_states": "bf16[M,K]", "topk_ids": "i32[M,TOPK]", "topk_weights": "f32[M,TOPK]"}


def is_mega_layer(owner: type | None) -> bool:
    """Whether ``owner`` is the installed FlashInfer's ``moe_ep.MoEEpMegaLayer``."""
    layer = getattr(sys.modules.get("flashinfer.moe_ep"), "MoEEpMegaLayer", None)
    return owner is not None and owner is layer


def build_layer() -> tuple[Any, Any]:
    """The layer and its ``MoEEpTensors``, built in the current tensor mode."""
    from flashinfer import moe_ep

    sizes = {s: inputs.value(s) for s in ("E", "TOPK", "I", "K", "M")}
    pack = moe_ep.MoEWeightPack(**{k: inputs.value(v) for k, v in WEIGHTS.items()})
    transformed = moe_ep.preprocess_nvfp4_cutedsl_mega_weights(
        pack, intermediate_size=sizes["I"], hidden_size=sizes["K"]
    )
    config = getattr(moe_ep, CONFIG)(intermediate_size=sizes["I"], top_k=sizes["TOPK"],
                                     **{k: inputs.value(v) for k, v in SCALES.items()})  # fmt: skip
    layer = moe_ep.MoEEpMegaLayer(
        bootstrap=moe_ep.BootstrapConfig(world_size=1, rank=0, device=0),
        fleet_params=moe_ep.FleetParams(
            num_experts=sizes["E"], max_tokens_per_rank=sizes["M"], token_hidden_size=sizes["K"]
        ),
        weights=None,
        backend=moe_ep.MegaConfig(
            megakernel=config, preprocess_weights=False, transformed_weights=transformed
        ),
    )
    values = {k: inputs.value(v) for k, v in {**TENSORS, **SCALES}.items()}
    return layer, moe_ep.MoEEpTensors(**values)


def for_layer(owner: type, method: str, entry: str) -> inputs.Call:
    """The call of the layer's ``forward`` on the tensors SGLang hands it."""

    def build() -> tuple:
        with inputs.sized(entry):
            return list(build_layer()), {}

    note = (f"{owner.__name__} built as SGLang builds it for NVFP4: {CONFIG}, one rank of one, "
            + ", ".join(f"{k}={v}" for k, v in {**WEIGHTS, **SCALES}.items()))  # fmt: skip
    return inputs.Call(getattr(owner, method), ["layer", f"MoEEpTensors({', '.join(TENSORS)})"],
                       {}, build, [note])  # fmt: skip
