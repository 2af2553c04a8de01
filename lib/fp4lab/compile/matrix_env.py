"""One virtual environment per FlashInfer version under build/matrix/, and the trace run inside it.

Each environment has torch at the project's default pin; every version shares one pip
download cache. An environment is reused when its stamp names the same torch; a version that
fails to install or trace is returned as ``env="failed"`` with the reason, never raised.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fp4lab.compile.matrix_result import VersionResult
from fp4lab.core import paths

TORCH = "torch==2.13.0"
TRACE_TIMEOUT_S = 600


def env_dir(version: str) -> Path:
    return paths.build_dir() / "matrix" / f"flashinfer-{version}"


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _pip_env() -> dict:
    env = dict(os.environ)
    env.setdefault("PIP_CACHE_DIR", str(paths.build_dir() / "cache" / "pip"))  # shared
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def ensure_env(version: str, torch_spec: str = TORCH) -> VersionResult:
    """Build (or reuse) the environment for one version; never raises for an install failure."""
    env = env_dir(version)
    stamp = env / ".fp4lab-ready"
    wheels = paths.build_dir() / "matrix" / "wheels" / version
    if stamp.exists() and stamp.read_text().strip() == torch_spec:
        return VersionResult(
            version,
            "reused",
            env_bytes=paths.disk_bytes(env),
            wheel_bytes=paths.disk_bytes(wheels) if wheels.exists() else 0,
        )
    started = time.perf_counter()
    shutil.rmtree(env, ignore_errors=True)
    python, wheel = str(_python(env)), f"flashinfer-python=={version}"
    steps = [  # the FlashInfer wheel first, so a version that does not exist fails in seconds
        [sys.executable, "-m", "venv", str(env)],
        [python, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), wheel],
        [python, "-m", "pip", "install", "-q", torch_spec],
        [python, "-m", "pip", "install", "-q", wheel, torch_spec],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, env=_pip_env())
        if done.returncode != 0:
            tail = [
                line
                for line in done.stderr.splitlines()
                if line.strip() and not line.startswith("WARNING: Location")
            ][-3:]
            shutil.rmtree(env, ignore_errors=True)
            return VersionResult(
                version,
                "failed",
                time.perf_counter() - started,
                error=f"{' '.join(step[2:5])} failed: {' | '.join(tail)}",
            )
    stamp.write_text(torch_spec)
    return VersionResult(
        version,
        "built",
        time.perf_counter() - started,
        env_bytes=paths.disk_bytes(env),
        wheel_bytes=paths.disk_bytes(wheels),
    )


def trace_in_env(result: VersionResult) -> VersionResult:
    """Run ``matrix_child`` in the version's environment (a child process, killed on timeout)."""
    if result.env == "failed":
        return result
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    try:
        done = subprocess.run(
            [str(_python(env_dir(result.version))), "-m", "fp4lab.compile.matrix_child"],
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
