"""Inside one SGLang environment: a captured prefill bucket replayed as the release's runner
replays it, against the same forward run eagerly (``breakable.drive`` calls ``compare``)."""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any

import torch


def forward_context(runner: Any, batch: Any, tokens: int) -> contextlib.AbstractContextManager:
    """The contexts the runner's ``execute`` replays a bucket in: its ``_prefill_forward_context``
    (0.5.16 on), or where it has none the two it enters inline (0.5.14, 0.5.15: the release's
    ``forward_context`` and ``set_tc_piecewise_forward_context``, from the runner's module)."""
    own = getattr(runner, "_prefill_forward_context", None)
    if own is not None:
        given = {"num_tokens": tokens, "raw_num_tokens": tokens}
        wanted = inspect.signature(own).parameters
        return own(batch, **{k: v for k, v in given.items() if k in wanted})
    module = sys.modules[type(runner).__module__]
    stack = contextlib.ExitStack()
    stack.enter_context(module.forward_context(
        module.ForwardContext(attn_backend=runner.model_runner.attn_backend)))  # fmt: skip
    stack.enter_context(module.set_tc_piecewise_forward_context(
        batch, runner.attention_layers, runner.quant_config, runner.moe_layers,
        runner.moe_fusions, dsa_indexers=runner.dsa_indexers))  # fmt: skip
    return stack


def compare(runner: Any, captured: Any, key: Any, generator: torch.Generator) -> dict:
    """Fresh input ids in the runner's static slot; the captured forward (``captured.forwards``)
    run eagerly, then the backend's replay, both in the runner's forward context for the
    captured batch (``captured.batches``); the outputs compared, and the replayed output with
    what the capture left there."""
    ids = runner.buffer_registry.get_slot("input_ids").buffer
    ids.copy_(torch.randint(0, 64, ids.shape, generator=generator, dtype=ids.dtype))
    batch = captured.batches[key.size]
    entered = getattr(runner, "model_context", contextlib.nullcontext)  # 0.5.2x
    with entered(), runner.backend.replay_session():
        with forward_context(runner, batch, key.size):
            eager = captured.forwards[key]().clone()
        stale = runner.backend._outputs[key].clone()
        with forward_context(runner, batch, key.size):
            replayed = runner.backend.replay(key, batch)
    rows = replayed.shape[0]
    diff = float((eager[:rows].float() - replayed.float()).abs().max())
    moved = float((stale.float() - replayed.float()).abs().max())
    return {"bucket": key.size, "max_abs_diff": diff, "equals_eager": diff == 0.0,
            "output_changed_by_replay": moved > 0.0}  # fmt: skip
