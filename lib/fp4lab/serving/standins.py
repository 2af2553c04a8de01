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
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fp4lab.serving import kernel_binaries


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


def _import_errors(python: str, modules: list[str], prelude: str = "") -> dict[str, str]:
    """Each of ``modules`` imported in turn in one process of ``python``'s environment (after
    ``prelude``): '' where it imports, else the last line of its error, as a traceback ends."""
    code = (f"{prelude}import importlib, json, traceback\nfound = {{}}\nfor name in {modules!r}:\n"
            "    try:\n        importlib.import_module(name)\n        found[name] = ''\n"
            "    except Exception as exc:\n"
            "        said = ''.join(traceback.format_exception_only(exc)).splitlines()\n"
            "        found[name] = [line for line in said if line.strip()][-1]\n"
            "print(json.dumps(found))")  # fmt: skip
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
    printed = done.stdout.strip().splitlines()
    if done.returncode == 0 and printed:
        return json.loads(printed[-1])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return dict.fromkeys(modules, lines[-1] if lines else f"exit code {done.returncode}")


def site_packages(python: str) -> Path:
    """The environment's site-packages folder."""
    done = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def _drop_kernel_binaries(site: Path) -> dict:
    """The kernel package's CUDA binaries removed from the environment at ``site``: the manifest
    entry saying what was removed."""
    package = site / KERNEL_BINARIES
    binaries = sorted(p for p in package.rglob("*.so*") if p.is_file())
    sizes = sum(p.stat().st_size for p in binaries)
    read = {f"{KERNEL_BINARIES}/{p.relative_to(package)}": kernel_binaries.installed(p)
            | {"read_from": "the installed file"}
            for p in binaries if p.name.startswith(kernel_binaries.OP_LIBRARIES)}  # fmt: skip
    for binary in binaries:
        binary.unlink()
    return {"name": BINARIES_REMOVED, "file": f"{KERNEL_BINARIES}/**/*.so",
            "removed": [str(p.relative_to(package)) for p in binaries], "bytes": sizes,
            "targets": read,
            "why": "CUDA-only binaries that cannot load without CUDA (the import uses the "
            "stand-in); removed to keep them out of build/, their op libraries' GPU targets "
            "read first"}  # fmt: skip


def _targets_read(entry: dict, site: Path) -> bool:
    """The removed op libraries' GPU targets added to ``entry`` (an environment built before
    fp4lab read them): from the published wheel, or the reason they could not be read (asked
    again at the next use)."""
    if "targets" in entry:
        return False
    members = [f"{KERNEL_BINARIES}/{r}" for r in entry["removed"]
               if Path(r).name.startswith(kernel_binaries.OP_LIBRARIES)]  # fmt: skip
    dist_info = next((p for name in KERNEL_PACKAGES
                      for p in site.glob(f"{name.replace('-', '_')}-*.dist-info")), None)  # fmt: skip
    try:
        if dist_info is None:
            raise LookupError(f"no dist-info of {' or '.join(KERNEL_PACKAGES)} in the environment")
        entry["targets"] = kernel_binaries.published(dist_info, members)
        entry.pop("targets_error", None)
    except (OSError, LookupError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        entry["targets_error"] = f"{type(exc).__name__}: {exc}"
    return True


def apply(python: str | Path, prelude: str = "") -> tuple[list[dict], str]:
    """Write the stand-ins the environment needs, their imports checked after ``prelude`` (code
    run first) in one process before and one after; where the kernel package needed one, remove
    its CUDA binaries (and its entries from uv's cache, which they were hardlinks of) before the
    second check; returns what it holds and '' (or why an import still fails)."""
    from fp4lab.core import venvs

    python = str(python)
    manifest = Path(python).parent.parent / MANIFEST
    applied = json.loads(manifest.read_text()) if manifest.exists() else []
    done = {entry["name"] for entry in applied}
    pending = [standin for standin in STANDINS if standin.name not in done]
    errors = _import_errors(python, [s.imports for s in pending], prelude) if pending else {}
    written = [standin for standin in pending if errors[standin.imports]]
    kernel = "sgl_kernel_ops" in done | {s.name for s in written} and BINARIES_REMOVED not in done
    removed_before = next((e for e in applied if e["name"] == BINARIES_REMOVED), None)
    if not (written or kernel):  # every import works, or its stand-in is in place already
        if removed_before and _targets_read(removed_before, site_packages(python)):
            manifest.write_text(json.dumps(applied, indent=1))
        return applied, ""
    site = site_packages(python)
    for standin in written:
        target = site / standin.path
        target.unlink(missing_ok=True)  # a hardlink into uv's cache: never write through it
        target.write_text(standin.text)
    removed = _drop_kernel_binaries(site) if kernel else None
    checked = [*dict.fromkeys([s.imports for s in written] + [KERNEL_BINARIES] * bool(removed))]
    still = {m: e for m, e in _import_errors(python, checked, prelude).items() if e}
    if still:
        module, error = next(iter(still.items()))
        without = " and without its CUDA binaries" if removed and module == KERNEL_BINARIES else ""
        return applied, f"import {module} fails even with fp4lab's stand-in{without}: {error}"
    applied += [{"name": s.name, "file": s.path, "fixes": f"import {s.imports}: "
                 f"{errors[s.imports]}", "why": s.why} for s in written]  # fmt: skip
    if removed:
        venvs.uncache(list(KERNEL_PACKAGES))
        applied.append(removed)
    manifest.write_text(json.dumps(applied, indent=1))
    return applied, ""
