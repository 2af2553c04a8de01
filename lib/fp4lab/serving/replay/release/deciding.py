"""Inside one SGLang environment: which of the release's lines decided its prefill graph.

While ``ServerArgs`` resolves, every write of the prefill graph is recorded with its frames
(``recorded``): from 0.5.14 ``PhaseConfig.backend`` of the objects that are some
``CudaGraphConfig``'s ``prefill``, before it the piecewise fields of ``ServerArgs``; the rule is
the release's last write that gave the resolved graph (``rule``), next to what it logged
(``Logged``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

from fp4lab.compile import target
from fp4lab.serving.replay.release import kernels

OLD_FIELDS = ("enable_piecewise_cuda_graph", "disable_piecewise_cuda_graph")
"""Where releases before ``cuda_graph_config`` (0.5.14) keep torch.compile piecewise graphs."""


def server_args_class() -> Any:
    """The release's ``ServerArgs``."""
    from sglang.srt.server_args import ServerArgs

    return ServerArgs


def prefill_graph(args: Any, config: Any) -> str:
    """The prefill graph resolved ``ServerArgs`` give: its ``cuda_graph_config`` (0.5.14 on),
    or before it, torch.compile piecewise graphs where they are on and not disabled."""
    if config is not None:
        return str(config.prefill.backend)
    enabled = getattr(args, "enable_piecewise_cuda_graph", None)
    disabled = getattr(args, "disable_piecewise_cuda_graph", None)
    if disabled is None:  # only the enable option: off unless enabled
        return "tc_piecewise" if enabled else "disabled"
    return "disabled" if disabled else "tc_piecewise"


@dataclasses.dataclass
class _Decision:
    """One write of the prefill graph: the graph it gave and the frames that wrote it."""

    owner: Any
    graph: str
    frames: list[str]
    copied: bool = False
    """A ``dataclasses.replace`` that copied the value and did not change it."""


def _frames(depth: int = 2) -> list[str]:
    frame, found = sys._getframe(depth), []
    while frame is not None and len(found) < 12:
        name = frame.f_code.co_filename.split("site-packages/")[-1]
        found.append(f"{name}:{frame.f_lineno}:{frame.f_code.co_name}")
        frame = frame.f_back
    return found


def _copied(depth: int = 2) -> bool:
    """Whether the write is a ``dataclasses.replace`` leaving ``backend`` unchanged."""
    frame = sys._getframe(depth)
    while frame is not None:
        if frame.f_code.co_name in ("replace", "_replace") and "changes" in frame.f_locals:
            return "backend" not in frame.f_locals["changes"]
        frame = frame.f_back
    return False


@contextlib.contextmanager
def recorded() -> Iterator[list[_Decision]]:
    """Every write of the prefill graph while the block runs, each with its frames: from 0.5.14
    ``PhaseConfig.backend`` of the objects that are some ``CudaGraphConfig``'s ``prefill``;
    before, the piecewise fields of ``ServerArgs`` (the graph they give after the write)."""
    writes: list[_Decision] = []
    prefill: list[Any] = []  # held, so that no id is reused while the block runs
    module = "sglang.srt.model_executor.cuda_graph_config"
    phase, config = (
        kernels.attribute(module, "PhaseConfig"),
        kernels.attribute(module, "CudaGraphConfig"),
    )
    with contextlib.ExitStack() as stack:
        if phase is not None:
            _watch(stack, phase, ("backend",), lambda o, v: str(v), writes)
            _watch(stack, config, ("prefill",), None, prefill)
        else:
            cls = server_args_class()
            _watch(stack, cls, OLD_FIELDS, lambda o, v: prefill_graph(o, None), writes)
        yield writes
        if phase is not None:
            kept = [w for w in writes if any(w.owner is p for p in prefill) and not w.copied]
            writes[:] = kept


def _watch(stack: contextlib.ExitStack, owner: Any, names: tuple[str, ...], graph: Any,
           into: list) -> None:  # fmt: skip
    """``owner``'s writes of ``names`` appended to ``into``: a ``_Decision`` (``graph`` giving
    the graph after the write), or with no ``graph`` the value written."""
    original = owner.__setattr__

    def setattr_(self: Any, name: str, value: Any) -> None:
        original(self, name, value)
        if name in names:
            into.append(value if graph is None else
                        _Decision(self, graph(self, value), _frames(), _copied()))  # fmt: skip

    stack.enter_context(target.attribute_replaced(owner, "__setattr__", setattr_))


def rule(decisions: list[_Decision], graph: str) -> list[str]:
    """The release's frames (at most 3) of the last write that gave the resolved ``graph``; none
    where no write of the release's gave it (the value parsed stood)."""
    for decision in reversed(decisions):
        if decision.graph == graph:
            frames = [f for f in decision.frames if f.startswith("sglang/")
                      and not f.endswith(":with_phase")]  # fmt: skip
            if frames:
                return frames[:3]
    return []


LOGGED_WORDS = ("graph", "backend", "kv cache", "disabl", "attention", "quantiz")
"""What the release logs during its resolution that is kept: its words on graphs and kernels."""

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Logged(logging.Handler):
    """The release's log lines on graphs and kernels (``LOGGED_WORDS``), as it logs them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        said = ANSI.sub("", record.getMessage())
        if any(w in said.lower() for w in LOGGED_WORDS):
            where = record.pathname.split("site-packages/")[-1]
            self.lines.append(f"{where}:{record.lineno}: {said[:240]}")
