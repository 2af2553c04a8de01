"""A CUDA toolkit for the audit's simulated machine: one program, ``bin/nvcc``, answering
``--version``, found as each way of installing FlashInfer finds it (``INSTALL_MODES``): on PATH
with CUDA_HOME unset (FlashInfer's ``get_cuda_path`` runs ``which nvcc``), or as CUDA_HOME (it
returns the variable; the first subprocess is ``nvcc --version``). ``installed`` restores what
it changed on exit, even when the block raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from fp4lab.compile.audit import simulation
from fp4lab.core import paths

INSTALL_MODES = {
    "jit": "JIT kernels, nvcc on PATH and CUDA_HOME unset: FlashInfer's get_cuda_path runs "
    "`which nvcc` before `nvcc --version`",
    "jit_cuda_home": "JIT kernels with CUDA_HOME set: get_cuda_path returns it, the first "
    "subprocess is `nvcc --version`",
    "prebuilt": "prebuilt kernels (flashinfer-jit-cache / AOT modules, flashinfer-cubin): decided "
    "from the trace's frames (the registry has no flashinfer-jit-cache): a blocker met while a "
    "JitSpec is generated (before JitSpec.build_and_load looks for a prebuilt module), or in the "
    "cubin loader (which reads flashinfer-cubin's files the same way), holds; one inside "
    "build_and_load may not",
}
"""How FlashInfer finds its kernels; the first two are run, the third is read from the frames."""

RUN_MODES = ("jit", "jit_cuda_home")
"""The install modes an audit runs (``prebuilt`` is decided from their frames)."""


def folder() -> Path:
    """A CUDA toolkit with one program, ``bin/nvcc``, answering ``--version`` (made once)."""
    root = paths.build_dir() / "cache" / "audit" / f"cuda-{simulation.CUDA_VERSION}"
    nvcc = root / "bin" / "nvcc"
    if not nvcc.exists():
        nvcc.parent.mkdir(parents=True, exist_ok=True)
        text = f"Cuda compilation tools, release {simulation.CUDA_VERSION}, V{simulation.CUDA_VERSION}.86"
        nvcc.write_text(f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho '{text}'\n")
        nvcc.chmod(0o755)
    return root


def _clear_toolkit_caches() -> None:
    """FlashInfer's cached toolkit answers (``get_cuda_path``, ``get_cuda_version``) forgotten."""
    cpp_ext = sys.modules.get("flashinfer.jit.cpp_ext")
    for name in ("get_cuda_path", "get_cuda_version"):
        getattr(getattr(cpp_ext, name, None), "cache_clear", lambda: None)()


@contextlib.contextmanager
def installed(mode: str) -> Iterator[None]:
    """The CUDA toolkit found as install ``mode`` (one of RUN_MODES) finds it."""
    if mode not in RUN_MODES:
        raise ValueError(f"mode={mode!r} is not an install mode that runs; allowed: {RUN_MODES}")
    root = folder()
    saved = {k: os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH", "PATH")}
    for name in ("CUDA_HOME", "CUDA_PATH"):
        os.environ.pop(name, None)
    if mode == "jit_cuda_home":
        os.environ["CUDA_HOME"] = str(root)
    else:
        os.environ["PATH"] = f"{root / 'bin'}{os.pathsep}{saved['PATH'] or ''}"
    _clear_toolkit_caches()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _clear_toolkit_caches()
