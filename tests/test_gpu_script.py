"""scripts/gpu.sh (make gpu): its plan names only parameters the notebooks declare; without a GPU it refuses clearly."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from fp4lab.core import catalog, paths

SCRIPT = paths.REPO_ROOT / "scripts" / "gpu.sh"


def _run(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PY": sys.executable, **env},
    )


def test_the_plan_covers_04_to_08_with_declared_parameters():
    done = _run(DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    notebooks = {nb.number: nb for nb in catalog.notebooks()}
    planned = []
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        assert words[1:5] == ["-m", "fp4lab.core.runner", "reproduce", "--notebooks"]
        number, rest = words[5], words[6:]
        names = {
            rest[i + 1].split("=", 1)[0] for i in range(0, len(rest), 2) if rest[i] == "--param"
        }
        assert names <= catalog.declared_parameters(notebooks[number]), (
            f"notebook {number} declares no {names - catalog.declared_parameters(notebooks[number])}"
        )
        catalog.parse_parameters([rest[i + 1] for i in range(0, len(rest), 2)])
        planned.append(number)
    assert planned == ["04", "05", "06", "07", "08"]


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a GPU"
)
def test_without_a_gpu_it_refuses_before_running_anything():
    done = _run()
    assert done.returncode == 2
    assert "make gpu needs a CUDA GPU visible to torch" in done.stderr and done.stdout == ""
