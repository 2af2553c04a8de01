"""One virtual environment per FlashInfer version under build/matrix/, and the child run inside it.

Each environment has torch at the project's default pin; every version shares one pip
download cache. An environment is reused when it was built by the same steps; a version that
fails to install or trace is returned as ``env="failed"`` with the reason, never raised. The
child runs as its own process group (``core.process``), stopped on timeout or on any exit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fp4lab.compile.matrix.result import VersionResult
from fp4lab.core import paths, process, venvs

TORCH = "torch==2.13.0"
TRACE_TIMEOUT_S = 600


def env_dir(version: str) -> Path:
    return paths.build_dir() / "matrix" / f"flashinfer-{version}"


def ensure_env(version: str, torch_spec: str = TORCH) -> VersionResult:
    """Build (or reuse) the environment for one version; never raises for an install failure."""
    wheels = paths.build_dir() / "matrix" / "wheels" / version
    wheel = f"flashinfer-python=={version}"
    env = venvs.ensure(
        env_dir(version),
        [  # the FlashInfer wheel first, so a version that does not exist fails in seconds
            ["download", "-q", "--no-deps", "-d", str(wheels), wheel],
            ["install", "-q", torch_spec],
            ["install", "-q", wheel, torch_spec],
        ],
    )
    return VersionResult(
        version,
        env.status,
        env.seconds,
        env_bytes=env.bytes,
        wheel_bytes=paths.disk_bytes(wheels) if wheels.exists() else 0,
        error=env.error,
    )


def trace_in_env(result: VersionResult) -> VersionResult:
    """Run ``python -m fp4lab.compile.matrix.child`` in the version's environment and read its
    JSON; the log stays in build/matrix/logs/."""
    if result.env == "failed":
        return result
    logs = paths.build_dir() / "matrix" / "logs"
    log, out = logs / f"flashinfer-{result.version}.log", logs / f"flashinfer-{result.version}.json"
    for stale in (log, out):
        stale.unlink(missing_ok=True)
    python = env_dir(result.version) / "bin" / "python"
    finished = process.run(
        [python, "-m", "fp4lab.compile.matrix.child", out],
        log,
        TRACE_TIMEOUT_S,
        env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib")),
    )
    if not finished.ok or not out.exists():
        how = (
            f"timed out after {TRACE_TIMEOUT_S} s"
            if finished.timed_out
            else f"exited with code {finished.returncode}"
        )
        last = (process.tail(log, 1).strip() or "no output").splitlines()[-1]
        where = log.relative_to(paths.build_dir())
        result.env, result.error = "failed", f"trace {how}: {last} (log: build/{where})"
        return result
    found = json.loads(out.read_text())
    result.chain, result.upstream_op, result.fp4lab_op = (
        found["chain"],
        found["upstream_op"],
        found["fp4lab_op"],
    )
    result.forwarding, result.python = found["forwarding"], found["python"]
    result.target, result.packages = found["target"], found["packages"]
    result.import_staging = found["import_staging"]
    return result
