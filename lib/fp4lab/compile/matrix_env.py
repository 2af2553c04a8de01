"""One virtual environment per FlashInfer version under build/matrix/, and the trace run inside it.

Each environment has torch at the project's default pin; every version shares one pip
download cache. An environment is reused when its stamp names the same torch; a version that
fails to install or trace is returned as ``env="failed"`` with the reason, never raised.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fp4lab.compile.matrix_result import VersionResult
from fp4lab.core import paths, venvs

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
    """Run ``matrix_child`` in the version's environment (a child process, killed on timeout)."""
    if result.env == "failed":
        return result
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    try:
        done = subprocess.run(
            [str(env_dir(result.version) / "bin" / "python"), "-m", "fp4lab.compile.matrix_child"],
            capture_output=True,
            text=True,
            env=env,
            timeout=TRACE_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        result.env, result.error = "failed", f"trace did not finish within {TRACE_TIMEOUT_S} s"
        return result
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        result.env, result.error = "failed", f"trace failed: {last}"
        return result
    found = json.loads(done.stdout.strip().splitlines()[-1])
    result.chain, result.upstream_op, result.fp4lab_op = (
        found["chain"],
        found["upstream_op"],
        found["fp4lab_op"],
    )
    result.target, result.packages = found["target"], found["packages"]
    result.import_staging = found["import_staging"]
    return result
