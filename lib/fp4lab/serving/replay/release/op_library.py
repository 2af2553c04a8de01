"""Inside one SGLang environment: whether sgl_kernel's op library has code for the simulated SM.

sgl_kernel ships one op library per build (``sm90/common_ops``, ``sm100/common_ops``) and its own
loader (``_load_architecture_specific_ops``) picks one by the GPU's compute capability. Here it
runs on the simulated GPU, its ``glob`` answered from the files fp4lab removed (the environment's
manifest, ``standins``) and stopped where it would load the one it picked; that library's GPU
targets, read before its removal (``kernel_binaries``), say whether it carries code for the SM.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fp4lab.serving import kernel_binaries, standins

LOADERS = ("sgl_kernel.load_utils", "sgl_kernel")
"""Where sgl_kernel defines its loader: its own module from 0.3.16, its package before."""


class _Picked(BaseException):
    """The loader reached the library it picked (a BaseException: it catches ``Exception``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def removed_binaries() -> dict | None:
    """The manifest's entry for the kernel package's removed binaries, or None."""
    manifest = Path(sys.prefix) / standins.MANIFEST
    entries = json.loads(manifest.read_text()) if manifest.is_file() else []
    return next((e for e in entries if e["name"] == standins.BINARIES_REMOVED), None)


@contextlib.contextmanager
def _removed_files_answered(package: Path, removed: list[str]) -> Iterator[None]:
    files = [str(package / r) for r in removed]

    def found(pattern: str, *args: Any, **kwargs: Any) -> list[str]:
        return [f for f in files if fnmatch.fnmatchcase(f, pattern)]

    def picked(name: str, location: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Picked(str(location))

    with contextlib.ExitStack() as stack:
        for owner, name, value in ((glob, "glob", found),
                                   (importlib.util, "spec_from_file_location", picked)):  # fmt: skip
            stack.callback(setattr, owner, name, getattr(owner, name))
            setattr(owner, name, value)
        yield


def _loader(module: str) -> Any:
    with contextlib.suppress(ImportError):
        return getattr(importlib.import_module(module), "_load_architecture_specific_ops", None)
    return None


def picked_library(entry: dict) -> tuple[str | None, str]:
    """The op library (its path in site-packages) sgl_kernel's own loader picks on this
    (simulated) GPU, the files it finds answered from ``entry`` (``removed_binaries``), and
    where the loader is; None and why where it picks none."""
    loader = next(filter(None, map(_loader, LOADERS)), None)
    if loader is None:
        return None, "this sgl_kernel has no _load_architecture_specific_ops"
    package = Path(importlib.import_module("sgl_kernel").__file__).parent
    where = f"sgl_kernel/{Path(inspect.getsourcefile(loader) or '').name}:{loader.__name__}"
    try:
        with _removed_files_answered(package, entry["removed"]):
            loader()
    except _Picked as picked:
        return f"sgl_kernel/{Path(picked.path).relative_to(package)}", where
    except Exception as exc:  # the loader refused every file: it loads no op library here
        return None, f"{where} picks no op library: {type(exc).__name__}: {str(exc)[:120]}"
    return None, f"{where} returned without loading a file"


def available(sm: tuple[int, int]) -> tuple[str | None, str]:
    """Whether the op library sgl_kernel loads on ``sm`` carries code for it (True, False or
    None for unknown), with the evidence in words. Asked on the simulated GPU."""
    entry = removed_binaries()
    if entry is None:
        return None, "no removed sgl_kernel binaries in the environment's manifest"
    library, where = picked_library(entry)
    if library is None:
        return None, where
    read = entry.get("targets", {}).get(library)
    picks = f"{where} picks {library} on SM{sm[0]}.{sm[1]}"
    if read is None:
        why = entry.get("targets_error", "its GPU targets were not read")
        return None, f"{picks}; {why}"
    answer, said = kernel_binaries.runs_on(read, sm)
    return answer, f"{picks}: {said} (read from {read['read_from']})"
