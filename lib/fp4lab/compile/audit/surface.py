"""FlashInfer's public FP4 surface, found by inspecting the installed package (nothing listed by hand).

An entry point is a public callable of the top-level ``flashinfer`` namespace (not a class) that
takes at least one tensor and is one of: a name holding ``fp4`` (``nvfp4``, ``mxfp4``, ``mm_fp4``,
the FP4 MoE runners), a MoE entry point whose documentation names FP4, or a scale-layout helper
(a ``shuffle`` / ``interleave`` name that handles scale factors or lives in an FP4 module).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_FP4 = re.compile(r"fp4", re.IGNORECASE)
_LAYOUT = re.compile(r"shuffle|interleave", re.IGNORECASE)
_TENSOR_NAMES = re.compile(r"^(input|x|a|b|input_tensor|unswizzled_sf|hidden_states|q|k|v)$")

KINDS = ("quantize", "gemm", "moe", "scale_layout", "other")
"""How an entry point is grouped in the tables: by what its name says it does."""


@dataclass(frozen=True)
class EntryPoint:
    """One public FP4 callable: its public name, where it is defined, why it was picked."""

    name: str
    module: str
    kind: str
    reason: str
    fn: Callable[..., Any]

    def as_record(self) -> dict:
        return {"entry_point": self.name, "module": self.module, "kind": self.kind}


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def takes_tensor(fn: Callable) -> bool:
    """Whether some parameter is annotated as a tensor (or, unannotated, is named like one)."""
    signature = _signature(fn)
    if signature is None:
        return False
    for p in signature.parameters.values():
        note = p.annotation if isinstance(p.annotation, str) else repr(p.annotation)
        if "Tensor" in note or (p.annotation is p.empty and _TENSOR_NAMES.match(p.name)):
            return True
    return False


def kind_of(name: str) -> str:
    """One of KINDS, from the name."""
    lower = name.lower()
    if "moe" in lower:
        return "moe"
    if _LAYOUT.search(lower):
        return "scale_layout"
    if lower.startswith(("mm_", "grouped_mm", "gemm", "bmm")) or "gemm" in lower:
        return "gemm"
    if "quant" in lower:
        return "quantize"
    return "other"


def why_fp4(name: str, fn: Callable) -> str | None:
    """The reason ``name`` belongs to the FP4 surface, or None when it does not."""
    module = getattr(fn, "__module__", "") or ""
    doc = (inspect.getdoc(fn) or "").lower()
    if _FP4.search(name):
        return "fp4 in the name"
    if "moe" in name.lower() and _FP4.search(doc):
        return "MoE entry point documented for FP4"
    if _LAYOUT.search(name) and ("scale" in name or "sf" in name or _FP4.search(module)):
        return "scale-layout helper"
    return None


def discover(flashinfer: Any) -> list[EntryPoint]:
    """Every FP4 entry point of the installed ``flashinfer`` module, sorted by name."""
    found = []
    for name in sorted(dir(flashinfer)):
        if name.startswith("_"):
            continue
        try:
            fn = getattr(flashinfer, name)
        except Exception:  # a lazy attribute that fails to load is not part of the surface
            continue
        if inspect.isclass(fn) or inspect.ismodule(fn) or not callable(fn):
            continue
        reason = why_fp4(name, fn)
        if reason and takes_tensor(fn):
            module = getattr(fn, "__module__", "") or ""
            found.append(EntryPoint(name, module, kind_of(name), reason, fn))
    return found


def find(flashinfer: Any, names: list[str]) -> tuple[list[EntryPoint], list[dict]]:
    """The named entry points of this version, and one row per name it does not have (with why)."""
    by_name = {e.name: e for e in discover(flashinfer)}
    missing = []
    for name in names:
        if name in by_name:
            continue
        present = hasattr(flashinfer, name)
        why = "is not an FP4 entry point" if present else "does not exist"
        missing.append(
            {
                "entry_point": name,
                "status": "unknown entry point",
                "reason": f"{name!r} {why} "
                f"in flashinfer {getattr(flashinfer, '__version__', '?')}; FP4 entry points here: "
                + ", ".join(by_name),
            }
        )
    return [by_name[n] for n in names if n in by_name], missing
