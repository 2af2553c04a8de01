"""Inside one SGLang environment: the schema each stood-in ``sgl_kernel`` op is defined with, as
the installed sgl_kernel's own Python wrapper calls it.

sgl_kernel's C++ library (and the schemas it registers) is a CUDA-only binary. Its Python
wrappers are plain source, so where a release's wrapper passes the CUDA stream handle
(``get_cuda_stream()``, sgl-kernel 0.3.16) the op's schema takes it at that position.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

STREAM_PARAMETER = "int cuda_stream"
"""The stream handle's parameter, where a wrapper passes ``get_cuda_stream()``."""


@functools.cache
def stream_positions() -> dict[str, int]:
    """Per op, the position of ``get_cuda_stream()`` among the arguments the installed
    sgl_kernel's wrappers pass to ``torch.ops.sgl_kernel.<op>``; ops whose wrappers pass none (or
    a package whose source is not at hand) are absent."""
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return {}
    found = {}
    for source in sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            called = ast.unparse(node.func).split(".") if isinstance(node, ast.Call) else []
            if called[:3] != ["torch", "ops", "sgl_kernel"] or len(called) < 4:
                continue
            for index, argument in enumerate(node.args):
                if (
                    isinstance(argument, ast.Call)
                    and ast.unparse(argument.func) == "get_cuda_stream"
                ):
                    found[called[3]] = index
    return found


def as_called(op: str, schema: str) -> str:
    """``schema`` with the stream handle's parameter where the installed wrapper passes it."""
    position = stream_positions().get(op)
    if position is None:
        return schema
    head, rest = schema.split("(", 1)
    parameters, returns = rest.rsplit(") ->", 1)
    names = [p.strip() for p in parameters.split(",")]
    names.insert(position, STREAM_PARAMETER)
    return f"{head}({', '.join(names)}) ->{returns}"
