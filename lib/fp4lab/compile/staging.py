"""The story staged on the installed FlashInfer: simulated target, the story's patches, the fix.

Every context manager here restores what it changed on exit, even when the block raises.
The segment under test calls ``fp4_quantize`` below, which looks ``flashinfer.fp4_quantize``
up at call time exactly as SGLang's FP4 layers call it, so each patch takes effect there.

Stages, in the order a blocker chain meets them on a CPU machine (``walk_blocker_chain``):

* ``simulated_sm``: FlashInfer sees a Blackwell compute capability and a CUDA build of
  torch (CPU-only artefact: a GPU machine has both).
* ``patch_cuda_version``: the story's msg 992 patch, CUDA version from torch.version.cuda.
* ``populated_arch_set``: FlashInfer's TARGET_CUDA_ARCHS holds the target (CPU-only
  artefact: empty where torch sees no GPU).
* ``bypassed_jit_registry``: the JIT registry's bookkeeping (``datetime.now``) is skipped,
  as it is for a spec an earlier eager call registered (version-specific).
* ``compiler_disabled_fp4_quantize``: the story's msg 1002 decoration.
* ``custom_op_fp4_quantize``: the fix the story rejected, a torch.library custom op.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from fp4lab.compile import trace
from fp4lab.core import probe
from fp4lab.fp4 import nvfp4

STORY_SM = (12, 0)
"""RTX PRO 6000 Blackwell, the story's GPU."""

_MISSING = object()


def _import_flashinfer() -> tuple[types.ModuleType, str | None]:
    """Import FlashInfer; where it queries GPU 0 at import time and torch has none (a CPU-only
    artefact of some versions, e.g. 0.6.11), retry with simulated device properties.

    Returns the module and a note of that staging (None when the plain import worked).
    """
    try:
        import flashinfer

        return flashinfer, None
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
_FLASHINFER_FP4_QUANTIZE = flashinfer.fp4_quantize
_state = {"upstream_cpu_kernel": False}


def fp4_quantize(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The story's call site: ``flashinfer.fp4_quantize(x, global_scale)``, looked up at call time."""
    return flashinfer.fp4_quantize(x, global_scale)


def reference_fp4_quantize(
    x: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp4lab.fp4.nvfp4's quantize in FlashInfer's output layout: codes [M, K/2], swizzled scales [M↑128, S↑4] uint8."""
    m, k = x.shape
    codes, scales, _ = nvfp4.quantize(
        x, global_scale if global_scale is not None else 1.0, swizzle=True
    )
    return codes, scales.view(torch.uint8).reshape(nvfp4.swizzled_shape(m, k // 16))


def _flashinfer_modules() -> list[Any]:
    return [
        m
        for name, m in list(sys.modules.items())
        if m is not None and (name == "flashinfer" or name.startswith("flashinfer."))
    ]


@contextlib.contextmanager
def _rebound(name: str, original: Any, replacement: Any) -> Iterator[int]:
    """Rebind every FlashInfer module's ``name`` that is ``original`` to ``replacement``; yields how many."""
    changed = []
    for module in _flashinfer_modules():
        if getattr(module, name, _MISSING) is original:
            setattr(module, name, replacement)
            changed.append(module)
    try:
        yield len(changed)
    finally:
        for module in changed:
            setattr(module, name, original)


@contextlib.contextmanager
def _attribute(owner: Any, name: str, value: Any) -> Iterator[None]:
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
            _rebound("get_compute_capability", fi_utils.get_compute_capability, lambda device: sm)
        )
        if hasattr(fi_utils, "device_support_pdl"):
            stack.enter_context(
                _rebound(
                    "device_support_pdl", fi_utils.device_support_pdl, lambda device: sm[0] >= 9
                )
            )
        if torch.version.cuda is None:
            stack.enter_context(_attribute(torch.version, "cuda", cuda_version))
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


@contextlib.contextmanager
def patch_cuda_version(version: str | None = None) -> Iterator[None]:
    """The story's msg 992 patch: FlashInfer's get_cuda_version reads torch.version.cuda, no nvcc."""
    from flashinfer.jit import cpp_ext
    from packaging.version import Version

    def get_cuda_version() -> Version:
        return Version(version or torch.version.cuda)

    with _rebound("get_cuda_version", cpp_ext.get_cuda_version, get_cuda_version):
        yield


@contextlib.contextmanager
def bypassed_jit_registry() -> Iterator[None]:
    """Skip the JIT spec registry's bookkeeping (``datetime.now``), as for an already registered spec."""
    from flashinfer.jit import core

    registry = getattr(core, "JitSpecRegistry", None)
    if registry is None:
        yield
        return
    with _attribute(registry, "register", lambda self, spec: None):
        yield


@contextlib.contextmanager
def compiler_disabled_fp4_quantize() -> Iterator[None]:
    """The story's msg 1002 patch: ``flashinfer.fp4_quantize`` wrapped in ``torch.compiler.disable``."""
    with _rebound(
        "fp4_quantize", _FLASHINFER_FP4_QUANTIZE, torch.compiler.disable(_FLASHINFER_FP4_QUANTIZE)
    ):
        yield


# -- the fix: a real custom op ---------------------------------------------------------

_OP = "fp4lab::fp4_quantize"


def _fake_outputs(x: torch.Tensor, sf_vec_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    rows, cols = -(-m // 128) * 128, -(-(k // sf_vec_size) // 4) * 4
    return x.new_empty((m, k // 2), dtype=torch.uint8), x.new_empty((rows, cols), dtype=torch.uint8)


def fp4_capable(device: torch.device) -> bool:
    """Whether FlashInfer's FP4 kernel runs on ``device`` (a real CUDA GPU of SM100 or newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= probe.FP4_MIN_SM


@torch.library.custom_op(_OP, mutates_args=())
def _fp4_quantize_op(
    x: torch.Tensor, global_scale: torch.Tensor | None, sf_vec_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's kernel where the device runs it; elsewhere (CPU, pre-Blackwell GPUs) the nvfp4 reference."""
    if fp4_capable(x.device):
        return _FLASHINFER_FP4_QUANTIZE(x, global_scale, sf_vec_size)
    if sf_vec_size != 16:
        raise ValueError(
            f"sf_vec_size={sf_vec_size} is not allowed for the reference kernel; allowed values: 16"
        )
    return reference_fp4_quantize(x, global_scale)


@_fp4_quantize_op.register_fake
def _fp4_quantize_fake(
    x: torch.Tensor, global_scale: torch.Tensor | None, sf_vec_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    return _fake_outputs(x, sf_vec_size)


def custom_op() -> Any:
    """fp4lab's custom op: FlashInfer's kernel on SM100+ GPUs, the nvfp4 reference elsewhere."""
    return torch.ops.fp4lab.fp4_quantize.default


@contextlib.contextmanager
def custom_op_fp4_quantize() -> Iterator[None]:
    """The fix: ``flashinfer.fp4_quantize`` routed through a torch.library custom op with a fake.

    Dynamo sees one opaque node with exact output shapes and dtypes, so fullgraph=True holds.
    """

    def fp4_quantize_through_op(
        x: torch.Tensor,
        global_scale: torch.Tensor | None = None,
        sf_vec_size: int = 16,
        *args: Any,
        **kwargs: Any,
    ):
        return torch.ops.fp4lab.fp4_quantize(x, global_scale, sf_vec_size)

    with _rebound("fp4_quantize", _FLASHINFER_FP4_QUANTIZE, fp4_quantize_through_op):
        yield


def upstream_op() -> Any | None:
    """FlashInfer's own ``torch.ops.flashinfer.fp4_quantize`` (PR #3081, 0.6.12+), or None."""
    try:
        return torch.ops.flashinfer.fp4_quantize.default
    except (AttributeError, RuntimeError):
        return None


@contextlib.contextmanager
def upstream_op_cpu_kernel() -> Iterator[Any]:
    """Give the upstream op the nvfp4 reference as its CPU kernel for the block (its own is CUDA-only).

    Yields the op, or None where the installed FlashInfer has none.
    """
    op = upstream_op()
    if op is None:
        yield None
        return
    opdef = torch._library.custom_ops._maybe_get_opdef("flashinfer::fp4_quantize")
    if opdef is None:
        raise RuntimeError(
            "torch.ops.flashinfer.fp4_quantize exists but is not a torch.library.custom_op"
        )

    def cpu_kernel(x, global_scale=None, sf_vec_size=16, *args, **kwargs):
        if not _state["upstream_cpu_kernel"]:
            raise NotImplementedError(
                "flashinfer::fp4_quantize has a CPU kernel only inside fp4lab's upstream_op_cpu_kernel()"
            )
        return reference_fp4_quantize(x, global_scale)

    if "cpu" not in opdef._backend_fns:
        opdef.register_kernel("cpu")(cpu_kernel)
    _state["upstream_cpu_kernel"] = True
    try:
        yield op
    finally:
        _state["upstream_cpu_kernel"] = False


# -- walking the blocker chain -----------------------------------------------------------


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
    if signature == "device_check":
        candidates = [
            Stage("simulated_sm", "cpu_artefact", "", lambda: simulated_sm(sm)),
            Stage("populated_arch_set", "cpu_artefact", "", lambda: populated_arch_set(sm)),
        ]
    elif signature == "subprocess" and outcome.shows_nvcc_query:
        candidates = [Stage("patch_cuda_version", "story", "msg 992", patch_cuda_version)]
    elif signature == "non_tensor_torch_op":
        candidates = [
            Stage("populated_arch_set", "cpu_artefact", "", lambda: populated_arch_set(sm))
        ]
    elif signature == "unsupported_other" and any(
        f.function == "register" and "jit" in f.file for f in outcome.frames
    ):
        candidates = [Stage("bypassed_jit_registry", "version_specific", "", bypassed_jit_registry)]
    return next((s for s in candidates if s.name not in applied), None)


def walk_blocker_chain(
    fn: Callable,
    *args: Any,
    sm: tuple[int, int] = STORY_SM,
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
    stage = Stage("none", "baseline", "msg 988" if real_fp4_gpu() else "", contextlib.nullcontext)
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
