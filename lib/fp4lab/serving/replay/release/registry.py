"""Inside one SGLang environment: the release's model registry imported once, before the walks
fork, where that changes nothing a walk sees.

The release's loader imports ``sglang.srt.models.registry``, which imports every module of
``sglang.srt.models`` (1-3 s on this machine); each walk's fork did so again. Where every model
module imports without what a walk sets up first (its parallel groups and global server args:
0.5.3.post3's and 0.5.5's ``deepseek_v2`` ask for them when imported), the process that forks
imports the registry once, under the stand-ins a walk imports it under
(``setup_standins.building``, ``kernels.load_time_kernels``), and every fork finds it imported.
Whether it does is asked first in a throwaway fork (``failures``): a model module that fails
with anything but a package missing from the environment (the same in every process) leaves the
import to each walk, as before.

Likewise the modules of torch and sympy that dynamo imports at its first trace (``LAZY``): each
walk's fork imported them again (about 0.1-0.5 s a fork); they import nothing of the release.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from pathlib import Path

from fp4lab.core import forks
from fp4lab.serving.replay.release import kernels, setup_standins

REGISTRY = "sglang.srt.models.registry"
SKIPPED = "Ignore import error when loading "
"""The release's own words for a model module its registry leaves out (``import_model_classes``)."""
MISSING = ("No module named ", "cannot import name ", "Can not import ")
"""A model module left out for a package or name the environment lacks, or sgl_kernel's CUDA library
missing on this machine (the release's words): the same in every process. A module attribute the
environment lacks does not count: where every other module imports, the registry would be imported
here, and with it SGLang's MoE layer ahead of a walk's MoE set-up; 0.5.3.post2-0.5.9's layer reads
the MoE runner backend when imported (0.5.3.post2's DeepSeek then took another MoE path)."""


LAZY = ("torch.distributed.tensor.experimental._func_map", "torch._dynamo.backends.inductor",
        "torch._export.passes.add_runtime_assertions_for_constraints_pass", "torch.export._trace",
        "torch._higher_order_ops.passes.inline_invoke_subgraph",
        "torch._functorch._aot_autograd.subclass_codegen", "torch._inductor.hooks",
        "torch._subclasses.schema_check_mode", "torch._dynamo.dce_extra_outputs",
        "sympy.physics.units", "sympy.combinatorics", "sympy.tensor.tensor")  # fmt: skip
"""Modules dynamo (torch 2.13) and sympy import lazily at a first trace: dynamo's ``local_map``
check, its backends, export's passes, sympy's unit and group modules its simplification asks."""


def lazy_imports() -> None:
    """``LAZY`` imported in this process, so that the forks find them; one a torch lacks is left
    to the forks (only their speed depends on it)."""
    for name in LAZY:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class _Skipped(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(SKIPPED):
            self.said.append(message.removeprefix(SKIPPED))


def _imported(sm: tuple[int, int]) -> list[str]:
    """The registry imported as a walk imports it; the model modules it left out, each with the
    release's words."""
    logger, skipped = logging.getLogger(REGISTRY), _Skipped()
    logger.addHandler(skipped)
    try:
        kernels.load_time_kernels()
        with setup_standins.building(sm):
            importlib.import_module(REGISTRY)
    finally:
        logger.removeHandler(skipped)
    return skipped.said


def failures(sm: tuple[int, int], out: Path) -> list[str]:
    """The model modules the registry leaves out here for anything but a missing package, asked
    in a fork (``out``: its result file); the fork's own failure is one entry."""
    found = forks.forked(lambda: {"said": _imported(sm)}, out, 120)
    if "error" in found:
        return [f"the registry's fork: {found['error']}"]
    return [s for s in found["said"] if not any(m in s for m in MISSING)]


def imported_once(sm: tuple[int, int], out: Path) -> dict:
    """The registry imported in this process where ``failures`` finds none (``LAZY`` in any
    case), and what was found:
    ``{"imported_once": bool, "modules_failing_here": n, "first": [...]}`` (the first three)."""
    failed = failures(sm, out)
    if not failed:
        _imported(sm)
    lazy_imports()
    return {"imported_once": not failed, "modules_failing_here": len(failed), "first": failed[:3]}
