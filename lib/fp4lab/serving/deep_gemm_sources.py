"""Which GPU architectures DeepGEMM has kernels for, read from the kernel sources it ships.

DeepGEMM builds its kernels at run time from CUDA sources it ships, one per kernel and
architecture (``deep_gemm/include/deep_gemm/impls/sm90_fp8_mqa_logits.cuh``, ``sm100_...``,
``sm120_...``; ``smxx_`` for any), and picks one by the GPU's major version: where it ships none
for that major, its C++ stops at "Unsupported architecture". SGLang up to 0.5.11 ships DeepGEMM
inside its kernel package, so its sources are read from site-packages; later releases pin
``sgl-deep-gemm``, which fp4lab does not install (its binary needs CUDA's NVRTC to import): the
names of its sources are read from the wheel PyPI publishes, checked against the sha256 PyPI's
index lists. The reading is kept in the environment (``FILE``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import sys
import urllib.request
import zipfile
from pathlib import Path

from fp4lab.serving import kernel_binaries

SOURCES = "deep_gemm/include/deep_gemm/impls/"
PUBLISHED = "sgl-deep-gemm"
"""The distribution later releases pin DeepGEMM as."""
FILE = ".fp4lab-deep-gemm.json"
"""Where an environment keeps its reading (beside its stand-ins' manifest)."""
CALLS = {"sglang::k_cache_and_topk_result": "fp8_mqa_logits"}
"""Ops a replay reaches whose kernel is DeepGEMM's: the DSA indexer's split op (SGLang 0.5.13 and
0.5.14) calls ``deep_gemm.fp8_mqa_logits`` on CUDA. A reached ``deep_gemm.<name>`` is ``<name>``."""


def _owner(site: Path) -> str:
    for dist_info in sorted(site.glob("*.dist-info")):
        distribution = importlib.metadata.PathDistribution(dist_info)
        if any(str(f) == "deep_gemm/__init__.py" for f in distribution.files or []):
            return f"{distribution.metadata['Name']} {distribution.version}"
    return "an unrecorded distribution"


def installed(site: Path) -> dict | None:
    """DeepGEMM's sources installed in ``site``, with the distribution that ships them; None
    where none is installed."""
    folder = site / SOURCES
    if not folder.is_dir():
        return None
    return {"package": f"deep_gemm of {_owner(site)}", "read_from": "the installed files",
            "sources": sorted(p.stem for p in folder.glob("*.cuh"))}  # fmt: skip


def published(pin: str) -> dict:
    """DeepGEMM's sources in the ``sgl-deep-gemm`` wheel PyPI publishes at ``pin`` (``==X``)."""
    if not pin.startswith("==") or "*" in pin:
        raise ValueError(f"{PUBLISHED}{pin} names no single version")
    version = pin.removeprefix("==")
    wheel = kernel_binaries.wheel(PUBLISHED, version)
    with urllib.request.urlopen(wheel["url"], timeout=kernel_binaries.TIMEOUT_S) as answer:
        data = answer.read()
    if hashlib.sha256(data).hexdigest() != wheel["hashes"]["sha256"]:
        raise ValueError(f"{wheel['filename']} differs from the sha256 PyPI's index lists")
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    return {"package": f"{PUBLISHED} {version}",
            "read_from": f"{wheel['filename']}, its sha256 as PyPI's index lists it",
            "sources": sorted(Path(n).stem for n in names if n.startswith(SOURCES) and n.endswith(".cuh"))}  # fmt: skip


def read(site: Path, pin: str | None) -> dict:
    """DeepGEMM's sources as the environment at ``site`` has them: installed, else the wheel its
    release pins (``pin``); {} where it has neither; the reason where they could not be read."""
    found = installed(site)
    if found is not None or not pin:
        return found or {}
    try:
        return published(pin)
    except (OSError, LookupError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        return {"package": f"{PUBLISHED}{pin}", "error": f"{type(exc).__name__}: {exc}"}


def kept(venv: Path, site: Path, pin: str | None) -> dict:
    """``read`` once per environment and kept in its ``FILE``; read again where it failed."""
    path = venv / FILE
    if path.is_file() and "error" not in (found := json.loads(path.read_text())):
        return found
    found = read(site, pin)
    path.write_text(json.dumps(found, indent=1))
    return found


def in_environment() -> dict | None:
    """The reading the running environment keeps; None where it keeps none."""
    path = Path(sys.prefix) / FILE
    return json.loads(path.read_text()) if path.is_file() else None


def runs_on(found: dict | None, kernel: str | None, sm: tuple[int, int]) -> tuple[bool | None, str]:
    """Whether DeepGEMM as ``found`` has ``kernel`` (None: asks of no kernel) for ``sm``: False
    where it ships no source for the SM's major, True where it ships ``sm<major>0_<kernel>``,
    else None; with the evidence in words."""
    if found is None:
        return None, "DeepGEMM's sources were not read for this environment"
    if not found:
        return None, "the release neither ships nor pins DeepGEMM"
    if "error" in found:
        return None, f"{found['package']}: its sources could not be read ({found['error']})"
    arch, source = f"sm{sm[0]}0", f"(read from {found['read_from']})"
    archs = sorted({s.split("_")[0] for s in found["sources"]} - {"smxx"}, key=lambda a: int(a[2:]))
    mine = [s for s in found["sources"] if s.startswith(f"{arch}_")]
    said = f"{found['package']} ships"
    if kernel is not None and f"smxx_{kernel}" in found["sources"]:
        return None, f"{said} {SOURCES}smxx_{kernel}.cuh, for any architecture it builds {source}"
    if not mine:
        return False, (f"{said} kernel sources for {', '.join(archs)} only, none for SM{sm[0]}.x "
                       f"{source}; DeepGEMM picks its kernel by the GPU's major version")  # fmt: skip
    if kernel is not None and f"{arch}_{kernel}" in mine:
        return True, f"{said} {SOURCES}{arch}_{kernel}.cuh {source}"
    named = f", none named {arch}_{kernel}" if kernel else ""
    return None, f"{said} {len(mine)} kernel sources for {arch}{named} {source}"


def reached(name: str, sm: tuple[int, int]) -> tuple[str, str, tuple[bool | None, str]] | None:
    """For a reached kernel name that is DeepGEMM's, inside its environment: the library, the
    kernel and ``runs_on``'s answer on ``sm``; None for any other name."""
    call = CALLS.get(name) or (
        name.removeprefix("deep_gemm.") if name.startswith("deep_gemm.") else None
    )
    if call is None:
        return None
    return "deep_gemm", f"DeepGEMM {call}", runs_on(in_environment(), call, sm)


def on_sm(found: dict | None, sm: str) -> dict:
    """Whether DeepGEMM as ``found`` has any kernel for ``sm`` ("12.0"), as a record's field:
    "no" where it ships none for the SM's major, else "unknown"; with the evidence."""
    major, minor = (int(p) for p in sm.split("."))
    answer, said = runs_on(found, None, (major, minor))
    return {"available": "no" if answer is False else "unknown", "evidence": said}
