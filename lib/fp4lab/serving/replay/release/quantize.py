"""Which FP4 quantize SGLang's NVFP4 linear method calls, as the installed release imports it.

The name is read from the release's own source (the call that produces ``x_fp4`` in
``ModelOptFp4LinearMethod.apply``), the object from the imported ``modelopt_quant`` module, and
it is named by what it is: FlashInfer's Python function (direct), SGLang's custom op
(``torch.ops.sglang.*``) or sgl_kernel's.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import torch

MODULE = "sglang.srt.layers.quantization.modelopt_quant"
IMPLEMENTATIONS = (
    "flashinfer_direct",
    "sglang_op",
    "sglang_jit_op",
    "sgl_kernel_op",
    "none",
    "other",
)
"""What the linear method's quantize can be."""


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
    if name.startswith("sglang.jit_kernel"):
        return "sglang_jit_op", name
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
    wrapped_op = {
        "sgl_kernel_op": "sgl_kernel::scaled_fp4_quant",
        "sglang_jit_op": "sglang::scaled_fp4_quant",
    }
    op = qualified if "::" in qualified else wrapped_op.get(kind)
    return {
        "implementation": kind, "object": qualified, "called_as": name,
        "call_site": f"sglang/srt/layers/quantization/modelopt_quant.py:{line}",
        "op": op, "op_exists": bool(op and op_exists(op)),
        "fake_registered": bool(op and has_fake(op)), "callable": obj, "import_error": None,
    }  # fmt: skip
