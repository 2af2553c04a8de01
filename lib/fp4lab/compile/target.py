"""The installed FlashInfer, and the Blackwell target it is made to see on a machine without one.

Every context manager here restores what it changed on exit, even when the block raises.
The segment under test calls ``fp4_quantize`` below, which looks ``flashinfer.fp4_quantize``
up at call time exactly as SGLang's FP4 layers call it, so each patch takes effect there.

* ``simulated_sm``: FlashInfer sees a Blackwell compute capability and a CUDA build of
  torch (CPU-only artefact: a GPU machine has both).
* ``populated_arch_set``: FlashInfer's TARGET_CUDA_ARCHS holds the target (CPU-only
  artefact: empty where torch sees no GPU).
* ``simulated_target``: both.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from fp4lab.core import probe

STORY_SM = (12, 0)
"""RTX PRO 6000 Blackwell, the story's GPU."""

_MISSING = object()


def _import_flashinfer() -> tuple[types.ModuleType | None, str | None]:
    """Import FlashInfer; where it queries GPU 0 at import time and torch has none (a CPU-only
    artefact of some versions, e.g. 0.6.11), retry with simulated device properties.

    Returns the module (None where FlashInfer is not installed: the story's call site then
    raises, everything else runs) and a note of that staging (None when the plain import worked).
    """
    try:
        import flashinfer

        return flashinfer, None
    except ImportError as exc:
        return None, f"flashinfer is not installed: {exc}"
    except (AssertionError, RuntimeError) as exc:
        if torch.cuda.is_available():
            raise
        note = f"import needed simulated device properties: {type(exc).__name__}: {exc}"
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        del sys.modules[name]
    props = types.SimpleNamespace(
        name=f"simulated SM{STORY_SM[0]}{STORY_SM[1]}",
        major=STORY_SM[0],
        minor=STORY_SM[1],
        multi_processor_count=188,
        total_memory=96 * 2**30,
    )
    with (
        mock.patch.object(torch.cuda, "get_device_properties", lambda device=None: props),
        mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: STORY_SM),
    ):
        import flashinfer
    return flashinfer, note


flashinfer, IMPORT_STAGING = _import_flashinfer()
FLASHINFER_FP4_QUANTIZE = flashinfer.fp4_quantize if flashinfer else None
"""``flashinfer.fp4_quantize`` as the installed version ships it, before any patch."""


def fp4_quantize(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The story's call site: ``flashinfer.fp4_quantize(x, global_scale)``, looked up at call time."""
    if flashinfer is None:
        raise RuntimeError(f"the story's call site needs FlashInfer; {IMPORT_STAGING}")
    return flashinfer.fp4_quantize(x, global_scale)


def flashinfer_modules() -> list[Any]:
    """Every imported FlashInfer module."""
    return [
        m
        for name, m in list(sys.modules.items())
        if m is not None and (name == "flashinfer" or name.startswith("flashinfer."))
    ]


@contextlib.contextmanager
def rebound(name: str, original: Any, replacement: Any) -> Iterator[int]:
    """Rebind every FlashInfer module's ``name`` that is ``original`` to ``replacement``; yields how many."""
    changed = []
    for module in flashinfer_modules():
        if getattr(module, name, _MISSING) is original:
            setattr(module, name, replacement)
            changed.append(module)
    try:
        yield len(changed)
    finally:
        for module in changed:
            setattr(module, name, original)


@contextlib.contextmanager
def attribute_replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` set to ``value`` for the block, then restored (or removed if it was absent)."""
    previous = getattr(owner, name, _MISSING)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if previous is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, previous)


def real_fp4_gpu() -> bool:
    """Whether torch sees a GPU that runs FP4 kernels (no simulation needed then)."""
    return "fp4-gpu" in probe.machine().capabilities()


@contextlib.contextmanager
def simulated_sm(sm: tuple[int, int] = STORY_SM, cuda_version: str = "12.9") -> Iterator[dict]:
    """Make FlashInfer see compute capability ``sm`` and a CUDA build of torch; records say simulated.

    A no-op (yielding ``simulated: False``) where a real FP4-capable GPU is present.
    """
    if real_fp4_gpu():
        yield probe.target()
        return
    import flashinfer.utils as fi_utils

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            rebound("get_compute_capability", fi_utils.get_compute_capability, lambda device: sm)
        )
        if hasattr(fi_utils, "device_support_pdl"):
            stack.enter_context(
                rebound(
                    "device_support_pdl", fi_utils.device_support_pdl, lambda device: sm[0] >= 9
                )
            )
        if torch.version.cuda is None:
            stack.enter_context(attribute_replaced(torch.version, "cuda", cuda_version))
        stack.enter_context(probe.simulating(sm))
        yield probe.target()


@contextlib.contextmanager
def populated_arch_set(sm: tuple[int, int] = STORY_SM) -> Iterator[None]:
    """Put ``sm`` into FlashInfer's TARGET_CUDA_ARCHS where it is empty (no GPU visible)."""
    try:
        from flashinfer.jit import core
    except ImportError:
        yield
        return
    context = getattr(core, "current_compilation_context", None)
    archs = getattr(context, "TARGET_CUDA_ARCHS", None)
    if archs is None or archs or real_fp4_gpu():
        yield
        return
    archs.add((sm[0], f"{sm[1]}a"))
    try:
        yield
    finally:
        archs.clear()


@contextlib.contextmanager
def simulated_target(sm: tuple[int, int] = STORY_SM, cuda_version: str = "12.9") -> Iterator[dict]:
    """A Blackwell target as FlashInfer sees it: ``simulated_sm`` plus ``populated_arch_set``."""
    with simulated_sm(sm, cuda_version) as target, populated_arch_set(sm):
        yield target
