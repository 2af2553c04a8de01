"""Every call of a FlashInfer FP4 entry point in an installed SGLang's source, read with ``ast``.

A call counts when its callee is a FlashInfer FP4 function: a name imported from a
``flashinfer`` module (``from flashinfer import fp4_quantize``, aliases followed) or an
attribute path starting at ``flashinfer``. Each call says whether it sits in a function SGLang
registers as a custom op (``wrapped``: dynamo then sees one opaque node) or not (direct: dynamo
traces into FlashInfer), and every module the same name is also imported from in that file
(0.5.9's ``fp4_quantize`` is FlashInfer's on SM120 and sgl_kernel's elsewhere).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

FP4_NAME = re.compile(r"fp4|nvfp4|mxfp4|e2m1", re.IGNORECASE)
"""What makes a FlashInfer function an FP4 entry point (``fp4_quantize``, ``mm_fp4``, ...)."""

REGISTRARS = re.compile(r"register_custom_op|direct_register_custom_op|custom_op$")
"""SGLang's (and torch's) functions that make a Python function a custom op."""


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except (AttributeError, ValueError):
        return ""


def _imports(tree: ast.AST) -> tuple[dict[str, str], dict[str, set[str]]]:
    """FlashInfer FP4 names bound by imports (local name -> flashinfer path), and every module
    each local name is imported from."""
    flashinfer, sources = {}, defaultdict(set)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                local = alias.asname or alias.name
                sources[local].add(f"{node.module}.{alias.name}")
                if node.module.split(".")[0] == "flashinfer" and FP4_NAME.search(alias.name):
                    flashinfer[local] = f"{node.module}.{alias.name}"
    return flashinfer, sources


def _wrapped_functions(tree: ast.AST) -> set[str]:
    """Names of functions registered as custom ops in this file (by call or decorator)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and REGISTRARS.search(_dotted(node.func).split(".")[-1]):
            names |= {a.id for a in node.args[:1] if isinstance(a, ast.Name)}
            names |= {k.value.id for k in node.keywords if k.arg in ("fn", "op_func")
                      and isinstance(k.value, ast.Name)}  # fmt: skip
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                callee = decorator.func if isinstance(decorator, ast.Call) else decorator
                if REGISTRARS.search(_dotted(callee).split(".")[-1]):
                    names.add(node.name)
    return names


def _enclosing(tree: ast.AST) -> dict[int, str]:
    """id(call node) -> the innermost function around it."""
    around: dict[int, str] = {}

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                else function
            )
            if isinstance(child, ast.Call):
                around[id(child)] = function
            visit(child, inner)

    visit(tree, "<module>")
    return around


def scan_file(path: Path, relative: str) -> list[dict]:
    """The FlashInfer FP4 calls of one file (a file that never names ``flashinfer`` and an FP4
    name has none, and is not parsed)."""
    text = path.read_text(errors="replace")
    if "flashinfer" not in text or not FP4_NAME.search(text):
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    flashinfer, sources = _imports(tree)
    wrapped, around = _wrapped_functions(tree), _enclosing(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = _dotted(node.func)
        head, last = callee.split(".")[0], callee.split(".")[-1]
        if head in flashinfer and callee == head:
            entry = flashinfer[head]
        elif head == "flashinfer" and FP4_NAME.search(last):
            entry = callee
        else:
            continue
        function = around.get(id(node), "<module>")
        found.append({
            "file": relative, "line": node.lineno, "call": callee, "entry_point": entry,
            "function": function, "wrapped": function in wrapped,
            "also_bound_from": sorted(s for s in sources.get(head, ()) if s != entry),
        })  # fmt: skip
    return found


def scan(package: Path) -> list[dict]:
    """Every FlashInfer FP4 call in an installed ``sglang`` package folder, by file and line."""
    rows = []
    for path in sorted(package.rglob("*.py")):
        found = scan_file(path, f"sglang/{path.relative_to(package)}")
        rows += sorted(found, key=lambda r: r["line"])
    return rows


def cached(package: Path, kept: Path) -> list[dict]:
    """``scan(package)``, kept in ``kept`` (inside the release's environment, which a rebuild
    starts afresh) with this scanner's own source hash: an installed release never changes, so a
    warm run reads the same rows back; a changed scanner scans again."""
    scanner = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    try:
        found = json.loads(kept.read_text())
        if found.get("scanner") == scanner:
            return found["rows"]
    except (OSError, ValueError):
        pass
    rows = scan(package)
    kept.write_text(json.dumps({"scanner": scanner, "rows": rows}) + "\n")
    return rows


def direct(rows: list[dict]) -> list[dict]:
    """The calls not inside a registered custom op."""
    return [r for r in rows if not r["wrapped"]]
