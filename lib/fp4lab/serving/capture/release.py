"""A release's own piecewise backend, found by name in its installed code: the parts the drive
(``sglang_backend``) calls and the contexts its runner enters, with no version checks.

Releases before ``CompilationConfig.add_split_op`` split only at SGLang's own attention op,
which reads SGLang's forward batch: ``Release.load`` says so as ``Unsplittable``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fp4lab.compile import piecewise

RUNNER_MARK = ("sglang.srt.compilation.piecewise_context_manager", "enable_piecewise_cuda_graph")

PHASES = {
    "compiled": (("sglang.srt.compilation.compile", "set_compiled"),
                 ("sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph",
                  "enable_tc_piecewise_cuda_graph"),
                 RUNNER_MARK),
    "runner": (RUNNER_MARK,),
    "warmup": (("sglang.srt.compilation.piecewise_context_manager",
                "enable_piecewise_cuda_graph_compile"),
               ("sglang.srt.compilation.compile_phase", "enable_torch_compile_warmup")),
    "capture_stream": (("sglang.srt.compilation.piecewise_context_manager", "set_pcg_capture_stream"),
                       ("sglang.srt.compilation.compile_phase", "set_pcg_capture_stream")),
}  # fmt: skip
"""Where releases keep the contexts their runner enters, first found wins: the switch that sends
``install_torch_compiled``'s trampoline to the compiled forward (``set_compiled``, or the
runner's own marker where the trampoline reads that), the runner's marker, the compile pass's
warm-up marker (pieces run without capture) and the capture stream."""


def _found(candidates: tuple[tuple[str, str], ...]) -> tuple[Callable | None, str | None]:
    for module, name in candidates:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(owner, name):
            return getattr(owner, name), f"{module}.{name}"
    return None, None


class Unsplittable(LookupError):
    """The release's backend cannot split the stack: read from its own code."""


@dataclass
class Release:
    """The release's own parts this drive calls, found by name."""

    install: Callable
    backend: type
    config: type
    contexts: dict[str, Callable]
    where: dict[str, str]
    cuda: bool
    """Whether a real CUDA device captures (else the recorder does)."""

    @classmethod
    def load(cls, cuda: bool) -> Release:
        from sglang.srt.compilation.backend import SGLangBackend
        from sglang.srt.compilation.compilation_config import CompilationConfig
        from sglang.srt.compilation.compile import install_torch_compiled

        contexts, where = {}, {}
        for role, candidates in PHASES.items():
            found, name = _found(candidates)
            if found is not None:
                contexts[role], where[role] = found, name
        if "compiled" not in contexts:
            raise LookupError(f"no switch to the compiled forward: none of {PHASES['compiled']}")
        if not hasattr(CompilationConfig, "add_split_op"):
            raise Unsplittable(
                "the release's CompilationConfig has no add_split_op: its backend splits only at "
                "SGLang's own attention op, which needs SGLang's forward batch"
            )
        return cls(install_torch_compiled, SGLangBackend, CompilationConfig, contexts, where, cuda)

    def compile_config(self, sizes: list[int], debug: bool) -> Any:
        """The release's ``CompilationConfig``: SGLang's eager compiler, debug mode as asked, the
        stack's attention added to the split ops."""
        config = self.config(sizes, "eager", debug)
        for op in piecewise.SPLIT_OPS:  # SGLang's own is its attention, reading its forward batch
            config.add_split_op(op)
        return config

    @contextlib.contextmanager
    def phase(self, *roles: str, stream: Any = None) -> Iterator[None]:
        """The runner's contexts for ``roles`` (those this release has), entered in order."""
        entered: list[Callable] = []
        with contextlib.ExitStack() as stack:
            for role in ("runner", "compiled", *roles):
                context = self.contexts.get(role)
                if context is None or context in entered:
                    continue
                entered.append(context)
                args = (True,) if role == "compiled" and "set_compiled" in self.where[role] else ()
                stack.enter_context(context(stream) if role == "capture_stream" else context(*args))
            yield
