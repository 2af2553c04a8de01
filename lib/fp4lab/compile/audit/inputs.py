"""Small valid inputs for a callable, from an input spec or from its signature.

An input spec is a list of values written as text, ``name=`` for keywords::

    bf16[M,K] f32[1] sf_vec_size=16 backend='cudnn' scales=[f32[E],f8[E,K/16]]

``dtype[dims]`` is a tensor (dtypes: see DTYPES; dims are integers or SIZES symbols with
``+ - * /``), ``dtype:bf16`` a dtype, a SIZES symbol an int, anything else a Python literal.
``for_signature`` builds a FlashInfer entry point's inputs from its required parameters,
``parameters.PARAMETERS`` (a table of parameter names) and ``rules`` (docstrings, annotations); a
required parameter none of them gives makes the entry point "no input spec", with its name.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import inspect
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4lab.compile.audit import backends, rules
from fp4lab.compile.audit.parameters import PARAMETERS, SIZES_FOR

DTYPES = {
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "f32": torch.float32,
    "f8": torch.float8_e4m3fn,
    "u8": torch.uint8,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}
SIZES = {"M": 128, "K": 128, "N": 128, "E": 4, "TOPK": 2, "I": 128, "B": 2, "H": 2, "D": 64}
"""Tokens, hidden, output features, experts, top-k, MoE intermediate, batch, heads, head dim."""
SIZES |= {"S": 128, "P": 4, "PS": 16, "R": 64}  # sequence, pages, page size, latent (MLA) dim
_sizes: contextvars.ContextVar[dict[str, int]] = contextvars.ContextVar("sizes", default=SIZES)

_TENSOR = re.compile(r"^(\w+)\[([^\[\]]*)\]$")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,
}


class SpecError(ValueError):
    """An input spec that cannot be read, or that does not fit the callable's signature."""


def _dim(text: str) -> int:
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in _sizes.get():
            return _sizes.get()[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise SpecError(
            f"dimension {text!r} is not an integer expression of {', '.join(SIZES)} (+ - * /)"
        )

    try:
        return value(ast.parse(text.strip(), mode="eval").body)
    except SyntaxError:
        raise SpecError(f"dimension {text!r} is not an integer expression") from None


def _split(text: str, sep: str | None) -> list[str]:
    """``text`` split on ``sep`` (None: whitespace) outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if depth == 0 and (char == sep or (sep is None and char.isspace())):
            parts.append(current)
            current = ""
        else:
            current += char
    return [p.strip() for p in [*parts, current] if p.strip()]


def tensor(dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A small tensor of ``shape``: normal values for floating dtypes, zeros otherwise."""
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return torch.randn(shape, dtype=dtype)
    return torch.zeros(shape, dtype=dtype)


def value(text: str) -> Any:
    """One spec value built (tensors are created in the current mode: fake inside FakeTensorMode)."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]") and not _TENSOR.match(text):
        return [value(item) for item in _split(text[1:-1], ",")]
    match = _TENSOR.match(text)
    if match and match.group(1) in DTYPES:
        return tensor(DTYPES[match.group(1)], [_dim(d) for d in _split(match.group(2), ",")])
    if match:
        raise SpecError(
            f"{text!r}: dtype {match.group(1)!r} is unknown; known: {', '.join(DTYPES)}"
        )
    if text.startswith("dtype:") and text[6:] in DTYPES:
        return DTYPES[text[6:]]
    if text == "device:cuda":
        return torch.device("cuda")
    if re.fullmatch(r"[A-Z][A-Z0-9]*([ +\-*/]+([A-Z][A-Z0-9]*|\d+))*", text):
        return _dim(text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise SpecError(
            f"{text!r} is neither a tensor (dtype[dims], dtypes {', '.join(DTYPES)}), a size "
            f"({', '.join(SIZES)}) nor a Python literal"
        ) from None


def parse(spec: str) -> tuple[list[str], dict[str, str]]:
    """A spec string split into positional and keyword value texts."""
    args, kwargs = [], {}
    for item in _split(spec, None):
        name, eq, rest = item.partition("=")
        if eq and name.isidentifier():
            kwargs[name] = rest
        elif kwargs:
            raise SpecError(f"positional value {item!r} follows a keyword value")
        else:
            args.append(item)
    return args, kwargs


def bind(fn: Callable, args: list[str], kwargs: dict[str, str]) -> Callable[[], tuple]:
    """Check the spec against ``fn``'s signature now; returns the builder of (args, kwargs)."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise SpecError(
            f"the input spec does not match {getattr(fn, '__qualname__', fn)}{_sig(fn)}: {exc}"
        ) from None
    except ValueError:  # no signature to check against: let the call say
        pass
    for text in [*args, *kwargs.values()]:  # read every value once, before any tracing
        with torch._subclasses.fake_tensor.FakeTensorMode():
            value(text)
    return lambda: ([value(a) for a in args], {k: value(v) for k, v in kwargs.items()})


def _readable(text: str) -> bool:
    with contextlib.suppress(SpecError), torch._subclasses.fake_tensor.FakeTensorMode():
        return value(text) is not None
    return False


def for_signature(
    fn: Callable,
    entry: str,
    kind: str,
    overrides: dict[str, str] | None = None,
    notes: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Keyword value texts for every required parameter of a FlashInfer entry point (none
    positional; ``self`` left out), and for each optional one the table names for this entry
    (``entry.param``); a parameter the table lacks from its docstring or scalar annotation
    (``rules``, said in ``notes``); SpecError naming the parameters none of these give."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{entry} has no signature to build inputs from: {exc}") from None
    kwargs, unknown = dict(overrides or {}), []
    for p in params:
        if p.name == "self" or p.name in kwargs or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is not p.empty:
            if f"{entry}.{p.name}" in PARAMETERS:
                kwargs[p.name] = PARAMETERS[f"{entry}.{p.name}"]
            continue
        for key in (f"{entry}.{p.name}", f"{kind}.{p.name}", p.name):
            if key in PARAMETERS:
                kwargs[p.name] = PARAMETERS[key]
                break
        else:
            if "Optional" in _annotation(p) or "None" in _annotation(p):
                kwargs[p.name] = "None"  # an optional input left out
                continue
            found, source = rules.spec_for(fn, p.name, _annotation(p))
            if found and _readable(found):
                kwargs[p.name] = found
                if notes is not None:
                    notes.append(f"{p.name}={found} from the {source}")
            else:
                unknown.append(f"{p.name}: {_annotation(p)}")
    if unknown:
        raise SpecError(f"no input spec for parameter(s) {'; '.join(unknown)}")
    return [], kwargs


def _annotation(p: inspect.Parameter) -> str:
    return "unannotated" if p.annotation is p.empty else str(p.annotation).replace("typing.", "")


def _sig(fn: Callable) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


@dataclass
class Call:
    """One audited call: ``fn(*args, **kwargs)`` with the values ``build()`` makes from the spec
    texts ``args`` and ``kwargs``, and notes on how they were chosen."""

    fn: Callable
    args: list[str]
    kwargs: dict[str, str]
    build: Callable[[], tuple]
    notes: list[str] = field(default_factory=list)

    def as_record(self) -> dict:
        return {"args": self.args, "kwargs": self.kwargs, "notes": self.notes}


@contextlib.contextmanager
def sized(entry: str) -> Iterator[None]:
    """SIZES with ``entry``'s own sizes (``parameters.SIZES_FOR``) for the block."""
    token = _sizes.set(SIZES | SIZES_FOR.get(entry, {}))
    try:
        yield
    finally:
        _sizes.reset(token)


def _sized(entry: str, build: Callable[[], tuple]) -> Callable[[], tuple]:
    def built() -> tuple:
        with sized(entry):
            return build()

    return built


def for_function(fn: Callable, entry: str, kind: str, sm: tuple[int, int]) -> Call:
    """The call of a public function: its inputs from the table, a backend valid on ``sm``."""
    backend, note = backends.backend_for(fn, entry, sm)
    notes = [note] if note else []
    args, kwargs = for_signature(fn, entry, kind, {"backend": backend} if backend else None, notes)
    with sized(entry):
        build = _sized(entry, bind(fn, args, kwargs))
    return Call(fn, args, kwargs, build, notes)


def for_method(owner: type, method: str, entry: str, kind: str, sm: tuple[int, int]) -> Call:
    """The call of a wrapper's run method: the wrapper built from its constructor's inputs (table
    keys ``Class.param``), passed as ``self``, and the method's own inputs."""
    cls = entry.rsplit(".", 1)[0]
    notes: list[str] = []
    ctor_args, ctor = for_signature(owner.__init__, cls, kind, notes=notes)
    args, kwargs = for_signature(getattr(owner, method), entry, kind, notes=notes)
    with sized(entry):
        build_ctor = bind(owner, ctor_args, ctor)
        build_run = bind(lambda *a, **k: None, args, kwargs)

    def build() -> tuple:
        c_args, c_kwargs = build_ctor()
        r_args, r_kwargs = build_run()
        return [owner(*c_args, **c_kwargs), *r_args], r_kwargs

    note = f"{cls} built with {', '.join(f'{k}={v}' for k, v in ctor.items()) or 'no arguments'}"
    return Call(getattr(owner, method), args, kwargs, _sized(entry, build), [note, *notes])


def for_schema(op: Any, entry: str, kind: str) -> Call:
    """The call of a registered operator: an input per schema argument from the table
    (``entry.arg``, ``kind.arg``, ``arg``), an optional one left out, a default kept."""
    schema = op.default._schema
    kwargs, unknown = {}, []
    for arg in schema.arguments:
        for key in (f"{entry}.{arg.name}", f"{kind}.{arg.name}", arg.name):
            if key in PARAMETERS:
                kwargs[arg.name] = PARAMETERS[key]
                break
        else:
            if arg.has_default_value() or str(arg.type).endswith("?"):
                continue
            unknown.append(f"{arg.name}: {arg.type}")
    if unknown:
        raise SpecError(f"no input spec for argument(s) {'; '.join(unknown)} of {schema}")
    with sized(entry):
        for text in kwargs.values():
            with torch._subclasses.fake_tensor.FakeTensorMode():
                value(text)
    build = _sized(entry, lambda: ([], {k: value(v) for k, v in kwargs.items()}))
    return Call(op, [], kwargs, build)
