"""FlashInfer's public FP4 surface, found by inspecting the installed package (listed by hand only
in ``BY_USE``: what SGLang's NVFP4 code builds that the package itself does not call FP4).

Three forms (``FORMS``):

* ``function``: a public callable of a public package (``flashinfer`` and each subpackage whose
  path has no ``_`` part and none of ``INTERNAL``; its ``__all__``, else its public names) that
  takes a tensor and is FP4 by ``why_fp4``; named by its shortest public path
  (``fp4_quantize``, ``fused_moe.alphamoe_nvfp4_routed_moe``);
* ``method``: the run method (``RUN_METHODS``) of a public FP4 wrapper class (``Class.run``);
* ``op``: an operator FlashInfer registered with torch (any namespace torch itself does not
  have, e.g. ``torch.ops.flashinfer``, ``torch.ops.trtllm``) whose name is FP4 by ``why_fp4``.

An entry is FP4 when its name holds ``fp4`` (``nvfp4``, ``mxfp4``, ``mm_fp4``, ...), when it is a
MoE entry whose documentation names FP4 (a wrapper class's own or its run method's: e.g.
``CuteDslMoEWrapper.run`` takes "packed NVFP4 input"), when it is a scale-layout helper (a
``shuffle`` / ``interleave`` / ``swizzle`` name that handles scale factors or lives in an FP4
module), or when it is a class ``BY_USE`` names.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import frames
from fp4lab.core import paths

_FP4 = re.compile(r"fp4", re.IGNORECASE)
_LAYOUT = re.compile(r"shuffle|interleave|swizzle", re.IGNORECASE)
_TENSOR_NAMES = re.compile(r"^(input|x|a|b|input_tensor|unswizzled_sf|hidden_states|q|k|v)$")

KINDS = ("quantize", "gemm", "moe", "attention", "comm", "scale_layout", "other")
"""How an entry point is grouped in the tables: by what its name and package say it does."""
FORMS = ("function", "method", "op")
INTERNAL = ("jit", "testing", "aot", "artifacts", "trace", "kernels", "kernel_src", "experimental",
            "tuning", "autotuner", "data", "csrc", "include", "profiler")  # fmt: skip
"""Subpackages that are FlashInfer's machinery, not its API (kernel builders, kernel sources,
tests, experimental code)."""
RUN_METHODS = ("run", "forward", "__call__")
"""The method of a wrapper class that a forward pass calls, in the order looked for."""
OWN_NAMESPACES = ("fp4lab", "fp4lab_test")
"""Operator namespaces of this project (never FlashInfer's)."""
BY_USE = {
    "moe_ep.MoEEpMegaLayer": "SGLang 0.5.20+ layers/moe/flashinfer_megamoe.py builds it for NVFP4 "
    "with moe_ep.Nvfp4CutedslMegaMoeConfig",
}
"""FP4 classes whose own name and documentation do not say FP4 but that SGLang's NVFP4 code
builds (public name: where it came from); ``mega_moe`` builds them as SGLang does."""


@dataclass(frozen=True)
class EntryPoint:
    """One public FP4 callable: its public name, form, where it is defined, why it was picked."""

    name: str
    module: str
    kind: str
    reason: str
    fn: Callable[..., Any] = field(repr=False)
    form: str = "function"
    group: str = "flashinfer"
    owner: type | None = field(default=None, repr=False)

    def as_record(self) -> dict:
        return {
            "entry_point": self.name,
            "module": self.module,
            "kind": self.kind,
            "form": self.form,
            "group": self.group,
        }


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def takes_tensor(fn: Callable) -> bool:
    """Whether some parameter is annotated as a tensor, or, unannotated, is named like one or is
    required (``self`` aside)."""
    signature = _signature(fn)
    if signature is None:
        return False
    for p in signature.parameters.values():
        note = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
        bare = (
            p.annotation is p.empty
            and p.name != "self"
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        )
        if "Tensor" in note or (bare and (_TENSOR_NAMES.match(p.name) or p.default is p.empty)):
            return True
    return False


def kind_of(name: str, group: str = "") -> str:
    """One of KINDS, from the name and the package it is exported from."""
    lower, where = name.lower(), group.lower()
    if "moe" in lower or "moe" in where:
        return "moe"
    if "allreduce" in lower or where.endswith(".comm"):
        return "comm"
    if _LAYOUT.search(lower):
        return "scale_layout"
    if re.search(r"attention|mla|decode|prefill|paged|kv_|mqa|_attn", lower) or any(
        w in where for w in ("mla", "attention", "decode", "prefill")
    ):
        return "attention"
    if lower.startswith(("mm_", "grouped_mm", "gemm", "bmm")) or re.search(r"gemm|linear", lower):
        return "gemm"
    if "quant" in lower:
        return "quantize"
    return "other"


def why_fp4(name: str, fn: Any) -> str | None:
    """The reason ``name`` belongs to the FP4 surface, or None when it does not."""
    module = getattr(fn, "__module__", "") or ""
    try:
        doc = (inspect.getdoc(fn) or "").lower()
    except Exception:  # an object whose documentation cannot be read has none
        doc = ""
    if _FP4.search(name):
        return "fp4 in the name"
    if "moe" in name.lower() and _FP4.search(doc):
        return "MoE entry point documented for FP4"
    if _LAYOUT.search(name) and ("scale" in name or "sf" in name or _FP4.search(module)):
        return "scale-layout helper"
    return None


def public_packages(flashinfer: Any) -> list[str]:
    """``flashinfer`` and its public subpackages, shallowest first."""
    root = Path(flashinfer.__file__).parent
    found = []
    for init in root.rglob("__init__.py"):
        parts = init.parent.relative_to(root.parent).parts
        if not any(p.startswith("_") or p in INTERNAL for p in parts[1:]):
            found.append(".".join(parts))
    return sorted(found, key=lambda name: (name.count("."), name))


def _public_names(module: Any) -> list[str]:
    names = getattr(module, "__all__", None) or list(vars(module))
    return [n for n in names if isinstance(n, str) and not n.startswith("_")]


def run_method(cls: type) -> str | None:
    """The name of ``cls``'s run method (RUN_METHODS), defined by it or a FlashInfer base."""
    for name in RUN_METHODS:
        for base in cls.__mro__[:-1]:
            if name in vars(base) and (base.__module__ or "").startswith("flashinfer"):
                return name
    return None


def entry_of(name: str, package: str, obj: Any) -> EntryPoint | None:
    """The entry point a public ``package.name`` makes, or None when it is not one (a class is
    FP4 by its own name and documentation or by its run method's)."""
    leaf, module = name.split(".")[-1], getattr(obj, "__module__", "") or ""
    public = name if package == "flashinfer" else f"{package.removeprefix('flashinfer.')}.{name}"
    if not module.startswith("flashinfer"):
        return None
    if inspect.isclass(obj):
        method = run_method(obj)
        fn = getattr(obj, method, None) if method else None
        reason = (
            why_fp4(leaf, obj)
            or why_fp4(leaf, fn)
            or ("built by SGLang's NVFP4 code" if public in BY_USE else None)
        )
        if not reason or fn is None or not takes_tensor(fn):
            return None
        return EntryPoint(f"{public}.{method}", module, kind_of(name, package), reason, fn,
                          "method", package, obj)  # fmt: skip
    reason = why_fp4(leaf, obj)
    if reason and callable(obj) and not inspect.ismodule(obj) and takes_tensor(obj):
        return EntryPoint(public, module, kind_of(name, package), reason, obj, "function",
                          package)  # fmt: skip
    return None


def discover(flashinfer: Any, errors: dict[str, str] | None = None) -> list[EntryPoint]:
    """Every FP4 function and wrapper method of the installed ``flashinfer``'s public packages,
    then every FP4 operator it registered; a package or name that fails to load goes to
    ``errors`` (name: why) and the others go on."""
    errors = {} if errors is None else errors
    seen: dict[int, EntryPoint] = {}
    for package in public_packages(flashinfer):
        try:
            module = importlib.import_module(package)
        except BaseException as exc:  # a package that cannot load here is not part of the surface
            errors[package] = frames.said(exc)
            continue
        for name in _public_names(module):
            try:
                obj = getattr(module, name)
            except BaseException as exc:  # a lazy attribute that fails to load
                errors[f"{package}.{name}"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                continue
            entry = entry_of(name, package, obj)
            if entry is not None and id(obj) not in seen:
                seen[id(obj)] = entry
    return sorted(seen.values(), key=lambda e: e.name) + registered_ops()


@functools.cache
def torch_namespaces() -> set[str]:
    """The operator namespaces torch registers by itself: asked of a fresh interpreter once per
    torch install (its version and place), kept in build/cache/audit for the next process."""
    install = f"{torch.__version__} {Path(torch.__file__).resolve()}"
    key = hashlib.sha256(install.encode()).hexdigest()[:16]
    kept = paths.build_dir() / "cache" / "audit" / f"torch-namespaces-{key}.json"
    if kept.exists():
        return set(json.loads(kept.read_text()))
    code = "import json, torch; print(json.dumps(sorted({n.split('::')[0] for n in torch._C._dispatch_get_all_op_names()})))"  # noqa: E501
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    kept.parent.mkdir(parents=True, exist_ok=True)
    written = kept.with_name(f"{kept.name}.{os.getpid()}")  # whole or absent: another child reads
    written.write_text(json.dumps(found))
    written.replace(kept)
    return set(found)


def registered_ops(exclude: set[str] | None = None) -> list[EntryPoint]:
    """Every FP4 operator registered in this process under a namespace torch does not have."""
    exclude = torch_namespaces() if exclude is None else exclude
    found = []
    for qualname in sorted(torch._C._dispatch_get_all_op_names()):
        namespace, _, rest = qualname.partition("::")
        name = rest.split(".")[0]
        if namespace in exclude or namespace in OWN_NAMESPACES or not why_fp4(name, None):
            continue
        packet = getattr(getattr(torch.ops, namespace), name)
        public = f"torch.ops.{namespace}.{name}"
        if any(e.name == public for e in found):
            continue
        found.append(EntryPoint(public, f"torch.ops.{namespace}", kind_of(name), why_fp4(name, None),
                                packet, "op", f"torch.ops.{namespace}"))  # fmt: skip
    return found


def find(
    entries: list[EntryPoint], names: list[str], version: str
) -> tuple[list[EntryPoint], list[dict]]:
    """The named entry points among ``entries`` (FlashInfer ``version``'s), and one row per name
    it does not have (with why)."""
    by_name = {e.name: e for e in entries}
    missing = [
        {
            "entry_point": name,
            "status": "unknown entry point",
            "reason": f"{name!r} is not an FP4 entry point of flashinfer {version}; its FP4 "
            "entry points: " + ", ".join(by_name),
        }
        for name in names
        if name not in by_name
    ]
    return [by_name[n] for n in names if n in by_name], missing
