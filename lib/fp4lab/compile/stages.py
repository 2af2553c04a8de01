"""The story's patches as stages, and the walk that removes one blocker after another.

Stages, in the order a blocker chain meets them on a CPU machine (``walk_blocker_chain``):

* ``simulated_sm`` and ``populated_arch_set`` (``target``): the Blackwell target, CPU-only
  artefacts.
* ``patch_cuda_version``: the story's msg 992 patch, CUDA version from torch.version.cuda.
* ``bypassed_jit_registry``: the JIT registry's first-registration bookkeeping
  (``datetime.now``) is skipped, as it is for a spec an earlier call in the process
  registered (``fresh_process``: not the story's patch; which versions meet it is the
  version matrix's to say).
* ``compiler_disabled_fp4_quantize``: the story's msg 1002 decoration (not part of the walk).

Each stage records where it comes from (``ORIGINS``) and whether it is one of the story's own
patches. Every context manager here restores what it changed on exit, even when the block raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fp4lab.compile import target, trace
from fp4lab.core import evidence, probe

ORIGINS = {
    "baseline": "nothing applied",
    "story": "one of the story's own patches",
    "cpu_artefact": "needed only where no Blackwell GPU is present",
    "fresh_process": "needed only in a process that has not yet registered the JIT spec",
    "environment": "a setting of the machine, not a patch",
}
"""Where a stage comes from."""


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
    origin: str  # one of ORIGINS
    story: str  # the story's message it reproduces, or "" when it is not the story's
    enter: Callable[[], contextlib.AbstractContextManager]

    def as_record(self) -> dict:
        """``{"stage", "origin", "story", "story_patch"}``."""
        return {
            "stage": self.name,
            "origin": self.origin,
            "story": self.story,
            "story_patch": self.origin == "story",
        }


PATCH_CUDA_VERSION = Stage("patch_cuda_version", "story", "msg 992", patch_cuda_version)
BYPASSED_JIT_REGISTRY = Stage("bypassed_jit_registry", "fresh_process", "", bypassed_jit_registry)
COMPILER_DISABLED = Stage(
    "compiler_disabled_fp4_quantize", "story", "msg 1002", compiler_disabled_fp4_quantize
)


def simulated_sm_stage(sm: tuple[int, int]) -> Stage:
    return Stage("simulated_sm", "cpu_artefact", "", lambda: target.simulated_sm(sm))


def populated_arch_set_stage(sm: tuple[int, int]) -> Stage:
    return Stage("populated_arch_set", "cpu_artefact", "", lambda: target.populated_arch_set(sm))


def target_stages(sm: tuple[int, int]) -> list[Stage]:
    """The stages that make FlashInfer see the target: none where a real FP4 GPU is present."""
    return [] if target.real_fp4_gpu() else [simulated_sm_stage(sm), populated_arch_set_stage(sm)]


@contextlib.contextmanager
def applied(chosen: list[Stage]) -> Iterator[list[dict]]:
    """Enter every stage of ``chosen`` for the block; yields their records, in order."""
    with contextlib.ExitStack() as stack:
        for stage in chosen:
            stack.enter_context(stage.enter())
        yield [stage.as_record() for stage in chosen]


def stage_for(
    outcome: trace.TraceOutcome,
    applied: set[str],
    sm: tuple[int, int],
    origins: tuple[str, ...] = tuple(ORIGINS),
) -> Stage | None:
    """The staged remedy (of one of ``origins``) for the blocker ``outcome`` shows, not applied
    yet; None when there is none."""
    candidates: list[Stage] = []
    signature = outcome.signature
    if signature == "device_check":
        candidates = [simulated_sm_stage(sm), populated_arch_set_stage(sm)]
    elif signature == "subprocess" and outcome.shows_nvcc_query:
        candidates = [PATCH_CUDA_VERSION]
    elif signature == "non_tensor_torch_op":
        candidates = [populated_arch_set_stage(sm)]
    elif signature == "unsupported_other" and any(
        f.function == "register" and "jit" in f.file for f in outcome.frames
    ):
        candidates = [BYPASSED_JIT_REGISTRY]
    return next((s for s in candidates if s.name not in applied and s.origin in origins), None)


def walk_blocker_chain(
    fn: Callable,
    *args: Any,
    sm: tuple[int, int] = target.STORY_SM,
    backend: str = "eager",
    until: str = "file_io",
    max_steps: int = 8,
    origins: tuple[str, ...] = tuple(ORIGINS),
) -> list[dict]:
    """Trace ``fn`` under fullgraph=True, remove each blocker with its staged remedy, trace again.

    Stops at the ``until`` signature (the JIT's file I/O, the story's second blocker), at a
    compiled trace, or at a blocker with no staged remedy (of ``origins``). Each row: the stage applied
    before the attempt, its origin, every stage applied so far (``stages_applied``), the
    evidence, and the outcome's record. Everything is restored after.
    """
    rows: list[dict] = []
    so_far: list[Stage] = []
    baseline_story = "msg 988" if target.real_fp4_gpu() else ""
    stage = Stage("none", "baseline", baseline_story, contextlib.nullcontext)
    with contextlib.ExitStack() as stack:
        for step in range(max_steps):
            stack.enter_context(stage.enter())
            so_far += [stage] if step else []
            outcome = trace.attempt(fn, *args, fullgraph=True, backend=backend)
            seen = probe.target()
            rows.append(
                {
                    "step": step,
                    "stage": stage.name,
                    "origin": stage.origin,
                    "story": stage.story,
                    "target": seen,
                    "stages_applied": [s.as_record() for s in so_far],
                    "evidence": evidence.of_run(
                        traced=True, simulated=seen["simulated"], kernel=None
                    ),
                    **outcome.as_record(),
                }
            )
            if outcome.signature in (until, "ok"):
                break
            stage = stage_for(outcome, {s.name for s in so_far}, sm, origins)
            if stage is None:
                rows[-1]["note"] = "no staged remedy for this blocker: the walk stops here"
                break
    return rows
