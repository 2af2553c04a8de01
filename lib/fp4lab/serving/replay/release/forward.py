"""Inside one SGLang environment: one more forward of the release's piecewise runner after
``runner.drive``, on fixed inputs written into its static buffers, and its logits.

In the compile pass's contexts (the compiled pieces run, nothing is captured) or, with
``replay``, outside the compile marker, as the runner's ``replay`` runs it (every piece captured
for the size replays its capture).
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any

import torch

from fp4lab.compile import fix, frames, target
from fp4lab.core import paths
from fp4lab.serving.replay.release import kernels, model, reworked
from fp4lab.serving.replay.release.runner import Run
from fp4lab.serving.replay.shared import models

CONTEXTS = (
    ("sglang.srt.compilation.compile", "set_compiled", (True,)),
    ("sglang.srt.compilation.piecewise_context_manager", "enable_piecewise_cuda_graph", ()),
    ("sglang.srt.compilation.piecewise_context_manager", "enable_piecewise_cuda_graph_compile", ()),
)
"""The contexts the runner's compile warm-up runs in (``set_compiled`` only in releases that
gate the compiled forward on it, 0.5.9-0.5.11)."""


def compile_contexts(replay: bool = False) -> list:
    """The release's own CONTEXTS, those it has, ready to enter; with ``replay`` all but the
    compile pass's marker."""
    found = []
    for module, name, args in CONTEXTS[:2] if replay else CONTEXTS:
        manager = kernels.attribute(module, name)
        if manager is not None:
            found.append(lambda m=manager, a=args: m(*a))
    return found


def _static(runner: Any, name: str, tokens: int) -> torch.Tensor:
    """The runner's static input buffer ``name`` for one request of ``tokens`` tokens, wherever
    the release keeps it: a buffer registry's slot (0.5.13 on), one buffers record (0.5.12), or
    the runner itself."""
    registry = getattr(runner, "buffer_registry", None)
    if registry is not None:
        return registry.get_slot(name).slice_for(1, tokens)
    return getattr(getattr(runner, "buffers", runner), name)[:tokens]


def output(run: Run, sm: tuple[int, int], *, replay: bool = False
           ) -> tuple[torch.Tensor | None, str | None, str]:  # fmt: skip
    """The logits of one more warm-up forward of the runner on fixed inputs (the compiled path
    when the pass compiled), the quantize kernel that ran, and '' or why it failed (the exception
    and its deepest frame, ``[at file:line]``). With
    ``replay`` the forward runs outside the compile pass's marker, as the runner's ``replay``
    runs it: every piece captured for the size replays its capture."""
    runner = run.runner
    if runner is None:
        return None, None, "the runner was not built"
    tokens = model.TOKENS
    generator = torch.Generator().manual_seed(0)
    input_ids, positions = (_static(runner, name, tokens) for name in ("input_ids", "positions"))
    vocab = models.TINY["vocab_size"]
    input_ids.copy_(torch.randint(0, vocab, (tokens,), generator=generator))
    positions.copy_(torch.arange(tokens))
    warmup = getattr(runner, "warmup_torch_compile", None) or getattr(
        runner, "warmup_compile", None
    )
    contexts = compile_contexts(replay)
    if warmup is None and hasattr(runner, "_run_dummy_forward"):  # the tc_piecewise runner
        warmup, contexts = runner._run_dummy_forward, reworked.compile_contexts()
    if warmup is None:
        return None, None, "the release's runner has no compile warm-up to compare logits through"
    top = runner.model_runner.model
    kept: list[Any] = []

    def forward(*args: Any, **kwargs: Any) -> Any:
        kept.append(type(top).forward(top, *args, **kwargs))
        return kept[-1]

    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(target.attribute_replaced(top, "forward", forward))
            stack.enter_context(kernels.device_queries(sm))
            ran = stack.enter_context(fix.observing())
            for enter in contexts:
                stack.enter_context(enter())
            stack.enter_context(torch.no_grad())
            warmup(num_tokens=tokens)
    except Exception as exc:  # recorded: the comparison could not run
        line = paths.unrooted(traceback.format_exception_only(exc)[-1].strip())
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return None, None, f"{line[:500]} [at {frames.relative_path(last.filename)}:{last.lineno}]"
    return kept[-1].next_token_logits, ran.kernel, ""
