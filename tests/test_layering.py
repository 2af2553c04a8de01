"""The package map of docs/architecture.md, kept: each subpackage imports only the ones below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).parents[1] / "lib" / "fp4lab"
ALLOWED = {
    "core": {"core"},
    "fp4": {"core", "fp4"},
    "compile": {"core", "fp4", "compile"},
    "comm": {"core", "comm"},
    "serving": {"core", "fp4", "compile", "serving"},
    "report": {"core", "report"},
}
"""What each subpackage may import of fp4lab: comm knows nothing of serving or compile, and the
report reads records only."""


def imported(path: Path) -> set[str]:
    """The fp4lab subpackages a module imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        found |= {n.split(".")[1] for n in names if n.startswith("fp4lab.") and n.count(".") >= 1}
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_subpackage_imports_only_what_the_map_allows(package):
    wrong = {
        str(path.relative_to(LIB)): sorted(imported(path) - ALLOWED[package])
        for path in sorted((LIB / package).rglob("*.py"))
        if imported(path) - ALLOWED[package]
    }
    assert wrong == {}, f"{package} imports outside docs/architecture.md's map: {wrong}"


def test_the_check_sees_an_import_it_must_refuse(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fp4lab.serving import sglang_env\n")
    assert imported(module) == {"serving"}
