"""Which FP4 quantize SGLang's NVFP4 linear method calls, as the installed release imports it.

The name is read from the release's own source (the call that produces ``x_fp4`` in
``ModelOptFp4LinearMethod.apply``), the object from the imported ``modelopt_quant`` module, and
it is named by what it is: FlashInfer's Python function (direct), SGLang's custom op
(``torch.ops.sglang.*``) or sgl_kernel's. An op whose only kernel is CUDA's gets fp4lab's
reference as its CPU kernel for a block (``kernel_on_reference``), so the compiled layer runs.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import fix

MODULE = "sglang.srt.layers.quantization.modelopt_quant"
SGLANG_OP = "sglang::flashinfer_fp4_quantize"
IMPLEMENTATIONS = ("flashinfer_direct", "sglang_op", "sgl_kernel_op", "none", "other")
"""What the linear method's quantize can be."""

REFERENCE_FOR_SGLANG_OP = "fp4lab reference (CPU kernel lent to the op; its own kernel is CUDA's)"


def linear_call(path: str) -> tuple[str | None, int | None]:
    """The callee producing ``x_fp4`` in the NVFP4 linear method's ``apply``, and its line."""
    tree = ast.parse(Path(path).read_text())
    for cls in ast.walk(tree):
        if not (isinstance(cls, ast.ClassDef) and "Fp4LinearMethod" in cls.name):
            continue
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Tuple)
                and getattr(node.targets[0].elts[0], "id", "") == "x_fp4"
                and isinstance(node.value, ast.Call)
            ):
                return ast.unparse(node.value.func), node.lineno
    return None, None


def _qualified(obj: Any) -> str | None:
    if isinstance(obj, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        return obj._qualified_op_name if hasattr(obj, "_qualified_op_name") else obj.name()
    return None


def implementation(obj: Any) -> tuple[str, str]:
    """(one of IMPLEMENTATIONS, the object's qualified name)."""
    if obj is None:
        return "none", "None"
    op = _qualified(obj)
    if op is not None:
        kind = "sglang_op" if op.startswith("sglang::") else "other"
        return ("sgl_kernel_op" if op.startswith("sgl_kernel::") else kind), op
    name = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"
    if name.startswith("flashinfer"):
        return "flashinfer_direct", name
    if name.startswith("sgl_kernel"):
        return "sgl_kernel_op", name
    return "other", name


def op_exists(qualified: str) -> bool:
    namespace, name = qualified.split("::")
    return hasattr(getattr(torch.ops, namespace), name)


def has_fake(qualified: str) -> bool:
    """Whether the op has a fake (or Meta) kernel, so dynamo can trace it as one node."""
    if not op_exists(qualified):
        return False
    entry = torch._library.simple_registry.singleton.find(qualified)
    if entry.fake_impl.kernel is not None:
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Meta")


def chosen() -> dict:
    """The release's NVFP4 linear quantize as imported now: name, line, implementation, fake;
    ``callable`` is the object itself (None where the import failed)."""
    try:
        module = importlib.import_module(MODULE)
    except Exception as exc:  # recorded: which import needs a stand-in not yet written
        return {"implementation": "none", "callable": None,
                "import_error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}  # fmt: skip
    name, line = linear_call(inspect.getsourcefile(module))
    obj = getattr(module, name.split(".")[0], None) if name else None
    for part in (name or "").split(".")[1:]:
        obj = getattr(obj, part, None)
    kind, qualified = implementation(obj)
    op = (
        qualified
        if "::" in qualified
        else ("sgl_kernel::scaled_fp4_quant" if kind == "sgl_kernel_op" else None)
    )
    return {
        "implementation": kind, "object": qualified, "called_as": name,
        "call_site": f"sglang/srt/layers/quantization/modelopt_quant.py:{line}",
        "op": op, "op_exists": bool(op and op_exists(op)),
        "fake_registered": bool(op and has_fake(op)), "callable": obj, "import_error": None,
    }  # fmt: skip


@contextlib.contextmanager
def cpu_kernel(qualified: str) -> Iterator[None]:
    """fp4lab's reference as the op's CPU kernel for the block (reports itself to ``observing``)."""
    namespace, name = qualified.split("::")
    library = torch.library.Library(namespace, "IMPL")

    def reference(x: torch.Tensor, global_scale: torch.Tensor | None = None, *args: Any, **kw: Any):
        return fix.reporting(REFERENCE_FOR_SGLANG_OP, fix.reference_fp4_quantize)(x, global_scale)

    library.impl(name, reference, "CPU")
    try:
        yield
    finally:
        library._destroy()


@contextlib.contextmanager
def kernel_on_reference(found: dict) -> Iterator[Callable]:
    """``quantize(h, global_scale)`` calling the chosen implementation; an op without a CPU kernel
    gets fp4lab's reference for the block. FlashInfer's function is called as it is."""
    obj = found["callable"]
    with contextlib.ExitStack() as stack:
        if found["implementation"] == "sglang_op" and found["op_exists"]:
            stack.enter_context(cpu_kernel(found["op"]))
        yield lambda h, global_scale: obj(h, global_scale)


@contextlib.contextmanager
def sglang_op_on_reference() -> Iterator[tuple[str, Callable] | None]:
    """SGLang's own wrapped quantize (``fp4_utils``) with a lent CPU kernel, or None where the
    release has none."""
    with contextlib.suppress(ImportError):
        importlib.import_module("sglang.srt.layers.quantization.fp4_utils")
    if not op_exists(SGLANG_OP):
        yield None
        return
    op = torch.ops.sglang.flashinfer_fp4_quantize
    with cpu_kernel(SGLANG_OP):
        yield SGLANG_OP, lambda h, global_scale: op(h, global_scale)
