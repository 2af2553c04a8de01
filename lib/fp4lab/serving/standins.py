"""The small stand-ins an SGLang environment needs on a machine without CUDA, each listed here.

SGLang's kernel package and the torchvision wheel that matches SGLang's torch pin are CUDA
builds; on a CPU torch their binaries cannot load, and importing them fails although the CPU
server never calls into them. A stand-in is written only when the import it fixes fails in the
environment, the import is checked again afterwards, and what was written and why is kept in
the environment's manifest (``.fp4lab-standins.json``) so every record can list it.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StandIn:
    """A file written into site-packages so ``imports`` imports on a machine without CUDA."""

    name: str
    imports: str
    path: str  # relative to site-packages
    text: str
    why: str


STANDINS = (
    StandIn(
        "sgl_kernel_ops",
        "sgl_kernel",
        "common_ops.py",
        '"""fp4lab stand-in: sgl_kernel\'s CUDA op library cannot load without CUDA; sgl_kernel\'s\n'
        'loader falls back to importing a module of this name. No op is registered."""\n',
        "sgl_kernel's op library is a CUDA-only binary; sgl_kernel's own loader falls back to "
        "importing `common_ops`, so an empty module lets its Python files import",
    ),
    StandIn(
        "torchvision_meta_registrations",
        "torchvision",
        "torchvision/_meta_registrations.py",
        '"""fp4lab stand-in: this torchvision is a CUDA build whose ops cannot load on a CPU\n'
        'torch, so there are no ops to register fake kernels for."""\n',
        "the torchvision that matches SGLang's torch pin is a CUDA build; on the CPU torch its "
        "ops library does not load and registering fake kernels for them fails at import",
    ),
)
"""Every stand-in fp4lab may write, in the order it tries them."""

KERNEL_PACKAGES = ("sglang-kernel", "sgl-kernel")
"""SGLang's kernel package (renamed across releases): installed without its dependencies, for its
Python files; its binary loads only where CUDA does."""

KERNEL_BINARIES = "sgl_kernel"
"""The package whose CUDA binaries are removed once its stand-in is in place (they cannot load
here: ``import`` already fell back to the stand-in), about 1.2 GB per SGLang release."""

BINARIES_REMOVED = f"{KERNEL_BINARIES}_binaries_removed"
"""The manifest's entry for that removal."""

MANIFEST = ".fp4lab-standins.json"


def _import_error(python: str, module: str, prelude: str = "") -> str:
    """'' when ``module`` imports in ``python``'s environment (after ``prelude``), else the
    error's last line."""
    done = subprocess.run(
        [python, "-c", f"{prelude}import {module}"], capture_output=True, text=True, timeout=600
    )
    if done.returncode == 0:
        return ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {done.returncode}"


def site_packages(python: str) -> Path:
    """The environment's site-packages folder."""
    done = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def _drop_kernel_binaries(python: str, prelude: str) -> dict | str:
    """The kernel package's binaries removed from the environment (and its entries from uv's
    cache, which the environment's files were hardlinks of), the import checked again; what was
    removed, or why the import fails without them."""
    from fp4lab.core import venvs

    package = site_packages(python) / KERNEL_BINARIES
    binaries = sorted(p for p in package.rglob("*.so*") if p.is_file())
    sizes = sum(p.stat().st_size for p in binaries)
    for binary in binaries:
        binary.unlink()
    still = _import_error(python, KERNEL_BINARIES, prelude)
    if still:
        return f"import {KERNEL_BINARIES} fails without its CUDA binaries: {still}"
    venvs.uncache(list(KERNEL_PACKAGES))
    return {"name": BINARIES_REMOVED, "file": f"{KERNEL_BINARIES}/**/*.so",
            "removed": [str(p.relative_to(package)) for p in binaries], "bytes": sizes,
            "why": "CUDA-only binaries that cannot load without CUDA (the import uses the "
            "stand-in); removed to keep them out of build/"}  # fmt: skip


def apply(python: str | Path, prelude: str = "") -> tuple[list[dict], str]:
    """Write the stand-ins the environment needs, each import checked after ``prelude`` (code run
    first); where the kernel package needed one, remove its CUDA binaries; returns what it holds
    and '' (or why an import still fails)."""
    python = str(python)
    manifest = Path(python).parent.parent / MANIFEST
    applied = json.loads(manifest.read_text()) if manifest.exists() else []
    done = {entry["name"] for entry in applied}
    for standin in STANDINS:
        if standin.name in done:
            continue
        error = _import_error(python, standin.imports, prelude)
        if not error:
            continue
        target = site_packages(python) / standin.path
        target.unlink(missing_ok=True)  # a hardlink into uv's cache: never write through it
        target.write_text(standin.text)
        still = _import_error(python, standin.imports, prelude)
        if still:
            return applied, f"import {standin.imports} fails even with fp4lab's stand-in: {still}"
        applied.append(
            {"name": standin.name, "file": standin.path, "fixes": f"import {standin.imports}: "
             f"{error}", "why": standin.why}
        )  # fmt: skip
        manifest.write_text(json.dumps(applied, indent=1))
    done = {entry["name"] for entry in applied}
    if "sgl_kernel_ops" in done and BINARIES_REMOVED not in done:
        dropped = _drop_kernel_binaries(python, prelude)
        if isinstance(dropped, str):
            return applied, dropped
        applied.append(dropped)
        manifest.write_text(json.dumps(applied, indent=1))
    return applied, ""
