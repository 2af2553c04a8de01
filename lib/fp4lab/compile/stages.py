"""The story's patches as stages, and the walk that removes one blocker after another.

Stages, in the order a blocker chain meets them on a CPU machine (``walk_blocker_chain``):

* ``simulated_sm`` and ``populated_arch_set`` (``target``): the Blackwell target, CPU-only
  artefacts.
* ``patch_cuda_version``: the story's msg 992 patch, CUDA version from torch.version.cuda.
* ``bypassed_jit_registry``: the JIT registry's bookkeeping (``datetime.now``) is skipped,
  as it is for a spec an earlier eager call registered (version-specific).
* ``compiler_disabled_fp4_quantize``: the story's msg 1002 decoration (not part of the walk).

Every context manager here restores what it changed on exit, even when the block raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fp4lab.compile import target, trace
from fp4lab.core import probe


@contextlib.contextmanager
def patch_cuda_version(version: str | None = None) -> Iterator[None]:
    """The story's msg 992 patch: FlashInfer's get_cuda_version reads torch.version.cuda, no nvcc."""
    from flashinfer.jit import cpp_ext
    from packaging.version import Version

    def get_cuda_version() -> Version:
        return Version(version or torch.version.cuda)

    with target.rebound("get_cuda_version", cpp_ext.get_cuda_version, get_cuda_version):
        yield


@contextlib.contextmanager
def bypassed_jit_registry() -> Iterator[None]:
    """Skip the JIT spec registry's bookkeeping (``datetime.now``), as for an already registered spec."""
    from flashinfer.jit import core

    registry = getattr(core, "JitSpecRegistry", None)
    if registry is None:
        yield
        return
    with target.attribute_replaced(registry, "register", lambda self, spec: None):
        yield


@contextlib.contextmanager
def compiler_disabled_fp4_quantize() -> Iterator[None]:
    """The story's msg 1002 patch: ``flashinfer.fp4_quantize`` wrapped in ``torch.compiler.disable``."""
    original = target.FLASHINFER_FP4_QUANTIZE
    with target.rebound("fp4_quantize", original, torch.compiler.disable(original)):
        yield


@dataclass(frozen=True)
class Stage:
    """One patch the walk can apply, and where it comes from."""

    name: str
    origin: str  # story | cpu_artefact | version_specific
    story: str  # the story's message it reproduces, or "" when it is not the story's
    enter: Callable[[], contextlib.AbstractContextManager]


def stage_for(outcome: trace.TraceOutcome, applied: set[str], sm: tuple[int, int]) -> Stage | None:
    """The staged remedy for the blocker ``outcome`` shows, not applied yet; None when there is none."""
    candidates: list[Stage] = []
    signature = outcome.signature
    arch_set = Stage(
        "populated_arch_set", "cpu_artefact", "", lambda: target.populated_arch_set(sm)
    )
    if signature == "device_check":
        candidates = [
            Stage("simulated_sm", "cpu_artefact", "", lambda: target.simulated_sm(sm)),
            arch_set,
        ]
    elif signature == "subprocess" and outcome.shows_nvcc_query:
        candidates = [Stage("patch_cuda_version", "story", "msg 992", patch_cuda_version)]
    elif signature == "non_tensor_torch_op":
        candidates = [arch_set]
    elif signature == "unsupported_other" and any(
        f.function == "register" and "jit" in f.file for f in outcome.frames
    ):
        candidates = [Stage("bypassed_jit_registry", "version_specific", "", bypassed_jit_registry)]
    return next((s for s in candidates if s.name not in applied), None)


def walk_blocker_chain(
    fn: Callable,
    *args: Any,
    sm: tuple[int, int] = target.STORY_SM,
    backend: str = "eager",
    until: str = "file_io",
    max_steps: int = 8,
) -> list[dict]:
    """Trace ``fn`` under fullgraph=True, remove each blocker with its staged remedy, trace again.

    Stops at the ``until`` signature (the JIT's file I/O, the story's second blocker), at a
    compiled trace, or at a blocker with no staged remedy. Each row: the stage applied
    before the attempt, its origin, and the outcome's record. Everything is restored after.
    """
    rows: list[dict] = []
    applied: set[str] = set()
    baseline_story = "msg 988" if target.real_fp4_gpu() else ""
    stage = Stage("none", "baseline", baseline_story, contextlib.nullcontext)
    with contextlib.ExitStack() as stack:
        for step in range(max_steps):
            stack.enter_context(stage.enter())
            applied.add(stage.name)
            outcome = trace.attempt(fn, *args, fullgraph=True, backend=backend)
            rows.append(
                {
                    "step": step,
                    "stage": stage.name,
                    "origin": stage.origin,
                    "story": stage.story,
                    "target": probe.target(),
                    **outcome.as_record(),
                }
            )
            if outcome.signature in (until, "ok"):
                break
            stage = stage_for(outcome, applied, sm)
            if stage is None:
                rows[-1]["note"] = "no staged remedy for this blocker: the walk stops here"
                break
    return rows
