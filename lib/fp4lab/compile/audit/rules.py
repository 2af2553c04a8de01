"""Input specs a parameter's own signature and documentation give, where ``parameters.PARAMETERS``
has none: the shape and dtype its docstring states, or a neutral value its scalar annotation
allows.

* Docstring: the parameter's entry (numpy style ``name : type`` or Google style ``name: text``;
  one entry may name several parameters; ``As in :func:`other``` reads ``other``'s) states a
  dtype (``uint8``, ``float32``, ...) and a shape (``[M, K / 2]``, ``(total_q, num_heads, 64)``);
  each dimension is an integer expression of ``inputs.SIZES`` symbols, FlashInfer's own
  dimension words read through ``DIM_WORDS``.
* Annotation: ``float`` (or a float-or-tensor union) is ``1.0``, ``bool`` is ``False``,
  ``torch.device`` the simulated GPU, ``torch.dtype`` bf16. An ``int`` is never guessed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

DOC_DTYPES = {
    "uint8": "u8", "int32": "i32", "int64": "i64", "float32": "f32", "fp32": "f32",
    "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "fp16": "f16",
    "float8_e4m3fn": "f8", "e4m3": "f8",
}  # fmt: skip
"""FlashInfer's dtype words in docstrings, as spec dtypes (first one named wins)."""
DIM_WORDS = {
    "num_tokens": "M", "total_q": "M", "total_k": "M", "tokens": "M", "T": "M", "M": "M",
    "hidden": "K", "hidden_size": "K", "K": "K", "N": "N", "E": "E", "num_experts": "E",
    "head_dim": "D", "num_heads": "H", "num_qo_heads": "H", "num_kv_heads": "H",
    "batch": "B", "batch_size": "B", "num_pages": "P", "page_size": "PS", "seq_len": "S",
    "top_k": "TOPK", "topk": "TOPK", "intermediate_size": "I",
}  # fmt: skip
"""Dimension words of FlashInfer's docstrings and the ``inputs.SIZES`` symbol each one is."""
_DTYPE = re.compile(r"\b(" + "|".join(DOC_DTYPES) + r")\b")
_SHAPE = re.compile(r"[\[(]([^\[\]()]+)[\])]")
_ENTRY = re.compile(r"^(\s*)([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?::(.*))?$")
_WORD = re.compile(r"[A-Za-z_]\w*")


def doc_entries(doc: str) -> dict[str, str]:
    """Each documented parameter's text (its entry line and the lines indented below it)."""
    lines, found = doc.splitlines(), {}
    for i, line in enumerate(lines):
        match = _ENTRY.match(line)
        if not match:
            continue
        indent, body = len(match.group(1)), [match.group(3) or ""]
        for below in lines[i + 1 :]:
            if below.strip() and len(below) - len(below.lstrip()) <= indent:
                break
            body.append(below.strip())
        for name in re.split(r"\s*,\s*", match.group(2)):
            found.setdefault(name, " ".join(body))
    return found


def _dims(text: str) -> str | None:
    """``text`` (a bracket's content) as spec dimensions, or None when a word is not known."""
    dims = []
    for dim in text.split(","):
        words = _WORD.findall(dim)
        if not dim.strip() or any(w not in DIM_WORDS for w in words):
            return None
        if not re.fullmatch(r"[\w\s+\-*/]+", dim):
            return None
        dims.append(_WORD.sub(lambda m: DIM_WORDS[m.group(0)], dim).replace(" ", ""))
    return ",".join(dims)


def from_doc(fn: Callable, name: str, depth: int = 0) -> str | None:
    """The tensor spec (``dtype[dims]``) ``fn``'s docstring states for parameter ``name``; an
    entry saying ``As in :func:`other``` is read from ``other``'s docstring."""
    try:
        text = doc_entries(inspect.getdoc(fn) or "").get(name)
    except Exception:  # an object whose documentation cannot be read states nothing
        return None
    other = re.match(r"\s*As in :func:`~?([\w.]+)`", text or "")
    if other and depth < 2:
        target = getattr(fn, "__globals__", {}).get(other.group(1).rsplit(".", 1)[-1])
        return from_doc(target, name, depth + 1) if callable(target) else None
    dtype = _DTYPE.search(text or "")
    if not text or not dtype:
        return None
    for bracket in _SHAPE.finditer(text):
        dims = _dims(bracket.group(1))
        if dims:
            return f"{DOC_DTYPES[dtype.group(1)]}[{dims}]"
    return None


def from_annotation(annotation: str) -> str | None:
    """A neutral value for a scalar annotation (its text), or None where none is safe."""
    kinds = set(re.findall(r"\b(float|bool|int|Tensor|device|dtype|str)\b", annotation))
    if kinds <= {"float", "Tensor"} and "float" in kinds:
        return "1.0"
    if kinds == {"bool"}:
        return "False"
    if kinds == {"device"}:
        return "device:cuda"
    if kinds == {"dtype"}:
        return "dtype:bf16"
    return None


def spec_for(fn: Callable, name: str, annotation: str) -> tuple[str | None, str]:
    """The spec ``fn``'s docstring or annotation gives parameter ``name``, and where from."""
    found = from_doc(fn, name)
    if found:
        return found, "docstring"
    found = from_annotation(annotation)
    return (found, "annotation") if found else (None, "")
