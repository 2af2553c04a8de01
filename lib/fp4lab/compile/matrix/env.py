"""One virtual environment per FlashInfer version under build/matrix/, and the child run inside it.

Each environment has the main environment's torch; every version is built by uv from one shared
cache. An environment is reused when it was built by the same steps; a version that
fails to install or trace is returned as ``env="failed"`` with the reason, never raised. The
child runs through ``core.venvs.run_children``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fp4lab.compile.matrix.result import VersionResult
from fp4lab.core import paths, probe, venvs

TRACE_TIMEOUT_S = 600


def env_dir(version: str) -> Path:
    return paths.build_dir() / "matrix" / f"flashinfer-{version}"


def _is_installed_here(version: str) -> bool:
    """Whether this (the main) environment already has FlashInfer ``version``."""
    return probe.package_version("flashinfer-python") == version


def python(version: str) -> Path:
    """The interpreter whose environment has FlashInfer ``version``: this one where it is the
    installed release, else the version's own environment."""
    if _is_installed_here(version):
        return Path(sys.executable)
    return env_dir(version) / "bin" / "python"


def ensure_env(version: str) -> VersionResult:
    """Build (or reuse) the environment for one version, with the main environment's torch
    (``env="main"``: the version this environment has); never raises for an install failure (a
    version that does not exist fails in seconds)."""
    if _is_installed_here(version):
        return VersionResult(version, "main")
    env = venvs.ensure(
        env_dir(version), [["install", venvs.torch_requirement(), f"flashinfer-python=={version}"]]
    )
    package = next(env_dir(version).glob("lib/python*/site-packages/flashinfer"), None)
    return VersionResult(
        version,
        env.status,
        env.seconds,
        env_bytes=env.own_bytes,
        wheel_bytes=paths.disk_bytes(package) if package else 0,
        error=env.error,
    )


def child(version: str) -> venvs.Child:
    """``python -m fp4lab.compile.matrix.child`` in the version's environment."""
    return venvs.Child(
        python(version), "fp4lab.compile.matrix.child", (), f"flashinfer-{version}", "trace"
    )


def read_child(result: VersionResult, found: dict) -> VersionResult:
    """``result`` completed from the child's JSON, or marked failed with its error."""
    if "error" in found:
        result.env, result.error = "failed", found["error"]
        return result
    result.chain, result.upstream_op, result.fp4lab_op = (
        found["chain"],
        found["upstream_op"],
        found["fp4lab_op"],
    )
    result.forwarding, result.python = found["forwarding"], found["python"]
    result.target, result.packages = found["target"], found["packages"]
    result.import_staging = found["import_staging"]
    return result
