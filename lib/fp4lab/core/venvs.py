"""Side environments under build/ (one per FlashInfer or SGLang version) sharing one pip cache.

An environment is a virtual environment built by a list of pip steps; a stamp holding those
steps marks it complete, so it is reused only when it was built by the same steps. An install
that fails is returned with the tail of pip's error, never raised, and leaves no half-built
environment behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fp4lab.core import paths

STAMP = ".fp4lab-ready"


@dataclass
class Environment:
    """One side environment: where it is, whether it was built, reused or failed, and its size."""

    path: Path
    status: str  # built | reused | failed
    seconds: float = 0.0
    error: str = ""

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def bytes(self) -> int:
        return paths.disk_bytes(self.path) if self.status != "failed" else 0


def pip_environment() -> dict[str, str]:
    """The process environment for pip: the shared download cache under build/cache/pip."""
    env = dict(os.environ)
    env.setdefault("PIP_CACHE_DIR", str(paths.build_dir() / "cache" / "pip"))
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _failure(label: str, stderr: str) -> str:
    tail = [
        line
        for line in stderr.splitlines()
        if line.strip() and not line.startswith("WARNING: Location")
    ][-3:]
    return f"{label} failed: {' | '.join(tail)}"


def ensure(path: Path, pip_steps: list[list[str]]) -> Environment:
    """Build (or reuse) the environment at ``path``: a venv, then ``pip <step>`` for each step."""
    stamp = path / STAMP
    recipe = "\n".join(" ".join(step) for step in pip_steps)
    if stamp.exists() and stamp.read_text() == recipe:
        return Environment(path, "reused")
    started = time.perf_counter()
    shutil.rmtree(path, ignore_errors=True)
    python = str(path / "bin" / "python")
    commands = [("python -m venv", [sys.executable, "-m", "venv", str(path)])]
    commands += [(f"pip {' '.join(step)}", [python, "-m", "pip", *step]) for step in pip_steps]
    for label, command in commands:
        done = subprocess.run(command, capture_output=True, text=True, env=pip_environment())
        if done.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            error = _failure(label, done.stderr)
            return Environment(path, "failed", time.perf_counter() - started, error)
    stamp.write_text(recipe)
    return Environment(path, "built", time.perf_counter() - started)
