"""The package map of docs/architecture.md, kept: each subpackage imports only the ones below
it, no module imports itself through others, none runs past 300 lines."""

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


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module under ``root`` (a package named by its folder) and the modules of it it
    imports, at any depth of its code (imports inside functions count)."""
    package = root.name
    modules = {}
    for path in root.rglob("*.py"):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
                for alias in node.names:
                    found = f"{node.module}.{alias.name}"
                    graph[name].add(found if found in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others."""
    reach = {name: set() for name in graph}
    for name in graph:
        todo = list(graph[name])
        while todo:
            found = todo.pop()
            if found in graph and found not in reach[name]:
                reach[name].add(found)
                todo += graph[found]
    groups = {frozenset(n for n in graph if n in reach[m] and m in reach[n]) for m in graph}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def test_no_module_imports_itself_through_others():
    assert circles(import_graph(LIB)) == []


def test_the_circle_check_sees_a_circle(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text("from pkg.a import f\n")
    (package / "c.py").write_text("from pkg import a\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.b"]]


def test_every_module_stays_within_300_lines():
    long = {str(p.relative_to(LIB)): n for p in LIB.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}  # fmt: skip
    assert long == {}, f"split these by concern (docs/architecture.md): {long}"


REPLAY = "fp4lab.serving.replay"
SIDES = {"release": {"release", "shared"}, "shared": {"shared"}, "notebook": {"notebook", "shared"}}
"""Which side of the replay's process boundary each side's modules may import: a release's
environment runs ``release/`` (and what it reads of ``shared/``), the notebook's side the rest;
it starts the children by their module's name, never by importing them."""


def side(module: str) -> str | None:
    """The side of the replay's process boundary ``module`` is on (None outside the replay)."""
    if not module.startswith(REPLAY + "."):
        return None
    part = module.removeprefix(REPLAY + ".").split(".")[0]
    return part if part in ("release", "shared") else "notebook"


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Each import across the replay's process boundary that ``SIDES`` does not allow."""
    return sorted(f"{name} -> {found}" for name, imported in graph.items() if side(name)
                  for found in imported if side(found) and side(found) not in SIDES[side(name)])  # fmt: skip


def test_the_replay_imports_across_its_process_boundary_only_the_shared_rules():
    assert crossings(import_graph(LIB)) == []


def test_the_boundary_check_sees_the_notebooks_side_import_a_release_module():
    graph = {f"{REPLAY}.matrix": {f"{REPLAY}.release.child", f"{REPLAY}.shared.flags"},
             f"{REPLAY}.shared.flags": {f"{REPLAY}.versions"}}  # fmt: skip
    assert crossings(graph) == [f"{REPLAY}.matrix -> {REPLAY}.release.child",
                                f"{REPLAY}.shared.flags -> {REPLAY}.versions"]  # fmt: skip
