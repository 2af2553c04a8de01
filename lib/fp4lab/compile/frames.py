"""The user-code frames dynamo reports, named as a reader finds them: ``file:line:function``.

Files are written relative to the ``sys.path`` entry holding them (``flashinfer/jit/core.py``),
standard-library files as ``<stdlib>/subprocess.py``, so records name no path of this machine.
"""

from __future__ import annotations

import json
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
_ROOTS = sorted(
    {
        Path(p).resolve()
        for p in [*sys.path, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        if p
    },
    key=lambda p: len(str(p)),
    reverse=True,
)


@dataclass(frozen=True)
class Frame:
    """One frame of the user code dynamo was tracing, its path relative to its package root."""

    file: str
    line: int
    function: str
    source: str = ""

    @property
    def module(self) -> str:
        dotted = self.file.removesuffix(".py").replace("/", ".")
        return dotted.removesuffix(".__init__")

    @property
    def in_stdlib(self) -> bool:
        return self.file.startswith("<stdlib>/")

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.function}"


def said(exc: BaseException) -> str:
    """``exc`` as one line of a record: its type and the first line of its message."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def relative_path(filename: str) -> str:
    """A file name relative to the sys.path entry holding it; stdlib files get ``<stdlib>/``."""
    path = Path(filename)
    try:
        resolved = path.resolve()
    except OSError:
        return path.name
    if resolved.is_relative_to(_STDLIB) and "site-packages" not in resolved.parts:
        return "<stdlib>/" + resolved.relative_to(_STDLIB).as_posix()
    for root in _ROOTS:
        if resolved.is_relative_to(root) and resolved != root:
            return resolved.relative_to(root).as_posix()
    return path.name  # notebook cells and scripts: the name is what a reader recognises


def release_frame(stack: list[traceback.FrameSummary], skip: tuple[str, ...] = ()) -> str:
    """The deepest frame outside torch and fp4lab (its recorder, stand-ins) and the functions named
    in ``skip``: ``file:line:function`` of the code that asked, or "unknown"."""
    for f in reversed(stack):
        where = relative_path(f.filename)
        if f.name not in skip and not where.startswith(("torch/", "fp4lab/")):
            return f"{where}:{f.lineno}:{f.name}"
    return "unknown"


def user_frames(stack: traceback.StackSummary | list | None) -> list[Frame]:
    """The traced program's frames from a stack summary, without dynamo's own polyfills."""
    frames = []
    for summary in stack or []:
        rel = relative_path(summary.filename)
        if rel.startswith("torch/_dynamo/"):
            continue
        frames.append(Frame(rel, summary.lineno or 0, summary.name, (summary.line or "").strip()))
    return frames


@cache
def _graph_breaks() -> dict[str, str]:
    """Dynamo's graph-break registry of the installed torch: each break's type to its code."""
    import torch._dynamo

    registry = Path(torch._dynamo.__file__).parent / "graph_break_registry.json"
    if not registry.is_file():  # a torch before the registry
        return {}
    found = json.loads(registry.read_text())
    return {entry["Gb_type"]: code for code, entries in found.items() for entry in entries}


def graph_break_code(message: str | None) -> str | None:
    """The code (``GB0088``) torch's own registry gives the graph break whose message starts with
    its type, or None (not a registered break, or a torch without the registry)."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    return _graph_breaks().get(first)
