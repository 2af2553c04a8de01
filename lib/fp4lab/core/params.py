"""Checks for notebook parameters: each failure names the parameter and what is allowed.

Notebooks call these in the cell right after their ``parameters`` cell, so a wrong
value stops the run before any heavy work starts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path

import torch

KNOWN_SMS = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
"""Compute capabilities FlashInfer builds kernels for (Turing to Blackwell)."""

BACKENDS = ("eager", "aot_eager", "inductor")


def choice(name: str, value: object, allowed: Collection) -> None:
    """``value`` must be one of ``allowed``."""
    if value not in allowed:
        raise ValueError(
            f"{name}={value!r} is not allowed; allowed values: {', '.join(map(str, allowed))}"
        )


def choices(name: str, values: Iterable, allowed: Collection) -> None:
    """``values`` is a list; every item must be one of ``allowed``, and there must be at least one."""
    if not isinstance(values, (list, tuple)):
        raise ValueError(
            f"{name}={values!r} must be a list; allowed items: {', '.join(map(str, allowed))}"
        )
    if not values:
        raise ValueError(f"{name} is empty; allowed values: {', '.join(map(str, allowed))}")
    for value in values:
        if value not in allowed:
            raise ValueError(
                f"{name} contains {value!r}; allowed values: {', '.join(map(str, allowed))}"
            )


def items(name: str, value: object, allowed: str = "") -> list[str]:
    """A list given as a list of strings or as one comma-separated string, blanks and duplicates
    dropped; an error naming ``name`` (and ``allowed``, what it may hold) for any other type, or
    when nothing is left."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(
            f"{name}={value!r} must be a comma-separated string or a list of strings"
            + (f"; allowed values: {allowed}" if allowed else "")
        )
    found = list(dict.fromkeys(v.strip() for v in value if v.strip()))
    if not found:
        raise ValueError(
            f"{name} is empty; allowed values: {allowed or 'one or more, comma-separated'}"
        )
    return found


def sms(name: str, value: object, allowed: Collection[str] | None = None) -> list[str]:
    """SMs as "12.0" strings (a list, or one comma-separated string), each a known SM (``sm``) and,
    when ``allowed`` is given, one of those; the first bad one is an error naming ``name``."""
    found = [".".join(map(str, sm(name, v))) for v in items(name, value, "SMs such as 12.0,10.0")]
    if allowed is not None:
        choices(name, found, allowed)
    return list(dict.fromkeys(found))


def positive(name: str, value: object) -> None:
    """``value`` must be an int greater than zero."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def positive_list(name: str, value: object) -> None:
    """``value`` must be a non-empty list of distinct positive integers."""
    if (
        not isinstance(value, (list, tuple))
        or not value
        or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(
            f"{name}={value!r} is not allowed; allowed values: a list of distinct positive integers"
        )


def multiple_of(name: str, value: int, base: int) -> None:
    """``value`` must be a positive multiple of ``base``."""
    positive(name, value)
    if value % base:
        raise ValueError(f"{name}={value} must be a multiple of {base}")


def sm(name: str, value: object) -> tuple[int, int]:
    """A compute capability given as [major, minor] or "12.0"; returns it as a tuple."""
    allowed = ", ".join(f"{a}.{b}" for a, b in KNOWN_SMS)
    try:
        pair = tuple(int(p) for p in (value.split(".") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        pair = None
    if pair not in KNOWN_SMS:
        raise ValueError(f"{name}={value!r} is not a known SM; allowed values: {allowed}")
    return pair


DEVICES = ("auto", "cpu", "cuda")


def device(name: str, value: str) -> torch.device:
    """auto -> cuda when torch sees a GPU, else cpu; cuda without a GPU is an error naming the parameter."""
    choice(name, value, DEVICES)
    if value == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{name}='cuda' is not allowed here: torch sees no CUDA GPU; allowed values: auto, cpu"
        )
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(value)


def folder(name: str, value: str) -> Path:
    """A folder fp4lab writes into, given as option ``name``: absent or a folder, never a file."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name}={value!r} is a file; allowed values: a folder path")
    return path
