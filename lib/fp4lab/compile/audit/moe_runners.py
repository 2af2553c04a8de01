"""FlashInfer's unified MoE runners (``fused_moe.*Runner.forward``) called as FlashInfer's own
``MoELayer`` calls them, every choice read from FlashInfer's declarations:

* the backend config is the one ``fused_moe.layer._BACKEND_RUNNERS`` maps to the runner;
* the ``MoEConfig``: routing of ``E`` experts, top ``TOPK``, ``ExpertConfig(I)``, the first quant
  the runner declares (``supported_quant_variants``: a format pair, or a variant in 0.6.18), the
  first activation it declares for that quant (``supported_activation_classes[_by_quant]``);
* the lifecycle ``MoERunner`` documents: construct on the GPU, ``check_support()``, ``build()``,
  weights from the backend config's ``prepare_weights`` on canonical BF16 weights (``w1``
  ``[E, 2I, H]``, ``w2`` ``[E, H, I]``, ``MoEWeightPack``'s contract) registered under the runner's
  ``backend_key``, activations from its ``prepare_activations`` (raw BF16 where it has none),
  ``pack_inputs``; the audited call is ``forward(packed)``.

A step that raises is the eager outcome (FlashInfer's own check, e.g. an SM the runner does not
support), as for any input the package refuses to build.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fp4lab.compile.audit import inputs

CANONICAL = {"w1": "bf16[E,2*I,K]", "w2": "bf16[E,K,I]", "x": "bf16[M,K]",
             "topk_ids": "i32[M,TOPK]", "topk_weights": "f32[M,TOPK]"}  # fmt: skip
"""The canonical inputs every backend config prepares from (``api.MoEWeightPack``'s layout)."""


def is_runner(owner: type | None) -> bool:
    """Whether ``owner`` follows FlashInfer's ``MoERunner`` lifecycle."""
    return owner is not None and all(
        hasattr(owner, a) for a in ("pack_inputs", "check_support", "supported_quant_variants")
    )


def backend_config(owner: type) -> type | None:
    """The backend config FlashInfer's ``MoELayer`` builds ``owner`` for (None: not mapped)."""
    from flashinfer.fused_moe import layer

    found = [cfg for cfg, runner in layer._BACKEND_RUNNERS.items() if runner is owner]
    return found[0] if found else None


def _activation(owner: type, pair: Any) -> type | None:
    by_quant = getattr(owner, "supported_activation_classes_by_quant", {}) or {}
    declared = by_quant.get(pair) or getattr(owner, "supported_activation_classes", ())
    return declared[0] if declared else None


def _call(fn: Callable, positional: list, offered: dict[str, Any]) -> Any:
    """``fn(*positional, **the offered keywords its signature takes)``."""
    params = inspect.signature(fn).parameters
    return fn(*positional, **{k: v for k, v in offered.items() if k in params})


def quant_config(declared: Any) -> Any:
    """FlashInfer's ``QuantConfig`` for a quant the runner declares: a (weight, activation) pair
    of ``QuantFormat`` (0.7 on), or one ``QuantVariant`` (0.6.18)."""
    from flashinfer.fused_moe import api

    if isinstance(declared, tuple):
        return api.QuantConfig(*declared)
    return api.QuantConfig(variant=declared)


def describe(owner: type) -> dict[str, str]:
    """The choices made for ``owner``, as text for the record."""
    cfg, pair = backend_config(owner), owner.supported_quant_variants[:1]
    activation = _activation(owner, pair[0]) if pair else None
    quant = pair[0] if pair else None
    return {
        "backend_config": cfg.__name__ if cfg else "none",
        "quant": (", ".join(map(repr, quant)) if isinstance(quant, tuple) else repr(quant))
        if pair else "none declared",
        "activation": activation.__name__ if activation else "none declared",
        "routing": "E experts, top TOPK", "experts": "intermediate_size=I",
        **{k: v for k, v in CANONICAL.items()},
    }  # fmt: skip


def build_packed(owner: type) -> tuple[Any, Any]:
    """The runner, built, checked and given its packed inputs (in the current tensor mode)."""
    from flashinfer.fused_moe import api

    cfg = backend_config(owner)
    if cfg is None or not owner.supported_quant_variants:
        raise TypeError(f"{owner.__name__} has no backend config or quant pair in FlashInfer")
    pair = owner.supported_quant_variants[0]
    quant = quant_config(pair)
    activation = _activation(owner, pair)
    sizes = {s: inputs.value(s) for s in ("E", "TOPK", "I", "K")}
    config = api.MoEConfig(
        routing=api.RoutingConfig(num_experts=sizes["E"], top_k=sizes["TOPK"]),
        quant=quant,
        experts=api.ExpertConfig(intermediate_size=sizes["I"]),
        **({"activation": activation()} if activation else {}),
    )
    device = torch.device("cuda")
    runner = owner(config, device)
    runner.check_support()
    runner.build()
    offered = {"quant": quant, "num_local_experts": sizes["E"], "hidden_size": sizes["K"],
               "intermediate_size": sizes["I"], "activation": config.activation,
               "device": device}  # fmt: skip
    tensors = {k: inputs.value(v) for k, v in CANONICAL.items()}
    view = _call(cfg.prepare_weights, [tensors["w1"], tensors["w2"]], offered)
    weights = api.MoEWeightPack()
    weights.prepare_for(runner.backend_key, view)
    if hasattr(cfg, "prepare_activations"):
        hidden, scale = _call(cfg.prepare_activations, [tensors["x"]], offered)
    else:
        hidden, scale = tensors["x"], None
    act = api.MoEActivationPack(hidden, scale, tensors["topk_ids"], tensors["topk_weights"])
    return runner, runner.pack_inputs(act, weights)


def for_runner(owner: type, method: str, entry: str) -> inputs.Call:
    """The call of a runner's ``forward`` on the inputs its own ``pack_inputs`` made."""
    choices = describe(owner)

    def build() -> tuple:
        with inputs.sized(entry):
            runner, packed = build_packed(owner)
        return [runner, packed], {}

    note = (f"{owner.__name__} configured as FlashInfer's MoELayer configures it: "
            + ", ".join(f"{k}={v}" for k, v in choices.items()))  # fmt: skip
    return inputs.Call(getattr(owner, method), ["runner", "runner.pack_inputs(act, weights)"],
                       {}, build, [note])  # fmt: skip
