"""Inside one SGLang environment: which stand-in kernels a replay ran, and how often.

Each stand-in kernel is installed ``counted``; a replay's fork starts counting afresh, and its
record lists the stand-ins whose kernels ran (``names``) apart from those merely installed.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

REACHED: collections.Counter[str] = collections.Counter()
"""Each stand-in kernel this process (a replay's fork) ran, by its name: how often."""


def counted(name: str, fn: Callable) -> Callable:
    """``fn``, each call counted in ``REACHED`` under ``name``; not while dynamo traces (dynamo
    folds ``is_compiling`` and sees ``fn`` alone)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            REACHED[name] += 1
        return fn(*args, **kwargs)

    call.__name__ = getattr(fn, "__name__", name)
    return call


def names(standins: list[dict]) -> list[str]:
    """The names of the stand-ins whose kernels ran (``REACHED``), in their order."""
    ran = [k for k, n in REACHED.items() if n]
    return [s["name"] for s in standins
            if any(k == want or (want.endswith("*") and k.startswith(want[:-1]))
                   for want in s.get("kernels", ()) for k in ran)]  # fmt: skip
