"""The parameters papermill injected into this kernel, checked against the notebook's own.

papermill runs a notebook's ``parameters`` cell, then the cell it injects (its source starts
``# Parameters``) with the values given, and warns, nothing more, about a name the notebook does
not declare. Read from the kernel's input history (``In``), a name the injected cell assigns that
the cell before it does not is refused here, with the declared ones, before any work: on every
route, fp4lab's runner or papermill by hand.
"""

from __future__ import annotations

import ast

INJECTED = "# Parameters"
"""How papermill's injected cell begins."""


def assigned(source: str) -> set[str]:
    """The names a cell's top-level assignments bind."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def undeclared(history: list[str]) -> tuple[list[str], list[str]]:
    """The names papermill's last injected cell in ``history`` assigns that the cell before it
    (the notebook's parameters cell) does not; and the declared names. ([], []) without one."""
    cells = [i for i, source in enumerate(history) if source.lstrip().startswith(INJECTED)]
    if not cells or cells[-1] == 0:
        return [], []
    declared = assigned(history[cells[-1] - 1])
    return sorted(assigned(history[cells[-1]]) - declared), sorted(declared)


def refuse_undeclared() -> None:
    """ValueError naming each injected parameter this notebook does not declare, and the ones it
    does; nothing outside a kernel that papermill fed."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    unknown, declared = undeclared(list(shell.user_ns.get("In", [])))
    if unknown:
        raise ValueError(f"this notebook has no parameter {', '.join(unknown)}; allowed values: "
                         f"{', '.join(declared)}")  # fmt: skip
