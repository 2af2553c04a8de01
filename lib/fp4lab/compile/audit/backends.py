"""The ``backend`` an audited call passes: one FlashInfer itself declares supported on the target
SM (its ``@backend_requirement``) where the signature's default is not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fp4lab.compile.audit.parameters import PARAMETERS


def _backend_checks(fn: Callable) -> dict | None:
    """The backends FlashInfer's ``@backend_requirement`` declares for ``fn`` (None: not declared)."""
    if not hasattr(fn, "is_backend_supported"):
        return None
    try:
        found = inspect.getclosurevars(fn.is_backend_supported).nonlocals.get("backend_checks")
    except (TypeError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def backend_for(fn: Callable, entry: str, sm: tuple[int, int]) -> tuple[str | None, str]:
    """A ``backend`` value FlashInfer itself declares supported on ``sm`` where the signature's
    default is not (None: keep the default), and why."""
    checks = _backend_checks(fn)
    default = _default(fn, "backend")
    if not checks or default is None or default == "auto" or f"{entry}.backend" in PARAMETERS:
        return None, ""
    cc = sm[0] * 10 + sm[1]
    if default in checks and fn.is_backend_supported(default, cc):
        return None, ""
    experimental = getattr(fn, "experimental_backends", ())
    for backend in checks:
        if backend not in experimental and fn.is_backend_supported(backend, cc):
            return repr(backend), (
                f"backend {backend!r}: the default {default!r} is not one FlashInfer declares for "
                f"SM{sm[0]}{sm[1]}"
            )
    return (
        None,
        f"no backend FlashInfer declares for SM{sm[0]}{sm[1]}; the default {default!r} kept",
    )


def _default(fn: Callable, name: str) -> Any:
    try:
        p = inspect.signature(fn).parameters.get(name)
    except (TypeError, ValueError):
        return None
    return None if p is None or p.default is p.empty else p.default
