"""The lock (requirements.lock) is what make installs: it pins every direct dependency at the
version pyproject.toml asks for, torch at the Makefile's one pin, everything with hashes, and
environment.yml installs from it; the caches stay in build/."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from fp4lab.core import paths, probe

LOCK = paths.REPO_ROOT / "requirements.lock"


def _locked() -> dict[str, tuple[str, int]]:
    """Each locked package: its version and how many hashes it carries."""
    text = LOCK.read_text()
    found = {}
    for match in re.finditer(
        r"^(\S+)==(\S+) \\\n((?:\s+--hash=sha256:\w+(?: \\)?\n)+)", text, re.M
    ):
        found[match.group(1)] = (match.group(2), match.group(3).count("--hash="))
    return found


def _makefile_torch() -> str:
    makefile = (paths.REPO_ROOT / "Makefile").read_text()
    return re.search(r"^TORCH\s*\?=\s*torch==(\S+)", makefile, flags=re.MULTILINE).group(1)


def test_the_lock_pins_every_dependency_as_pyproject_asks_with_hashes():
    project = tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]
    ]
    locked = _locked()
    assert len(locked) == LOCK.read_text().count("==") > 100, "every line parsed, with its hashes"
    for req in declared:
        assert req.name in locked, f"{req.name} is in pyproject.toml but not in the lock: make lock"
        version, hashes = locked[req.name]
        assert req.specifier.contains(version, prereleases=True), (req.name, version)
        assert hashes >= 1
    assert locked["torch"][0] == _makefile_torch(), "the lock is compiled with the Makefile's TORCH"


def test_make_installed_exactly_the_lock():
    """torch and Triton are left out: a GPU machine installs its own build (make TORCH=...)."""
    for name, (version, _) in _locked().items():
        if name in ("torch", "triton"):
            continue
        assert probe.package_version(name) == version, f"{name}: installed differs from the lock"


def test_environment_yml_installs_the_lock():
    text = (paths.REPO_ROOT / "environment.yml").read_text()
    assert re.findall(r"^\s+- (-r \S+|-e \S+)$", text, flags=re.M) == [
        "-r requirements.lock",
        "-e .",
    ]


def test_the_caches_stay_in_the_build_folder(tmp_path):
    """``fp4lab.setup()`` (every notebook) points the caches into build/, and make exports the
    same: tvm-ffi's (the sources of SGLang's JIT kernels, whose builds the replay refuses) too."""
    code = ("import fp4lab, os; fp4lab.setup(); "
            "print(os.environ['TVM_FFI_CACHE_DIR'], os.environ['TORCHINDUCTOR_CACHE_DIR'])")  # fmt: skip
    build = tmp_path / "build"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TVM_FFI_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
    }
    shown = subprocess.run([sys.executable, "-c", code], env={**env, "FP4LAB_BUILD_DIR": str(build)},
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert [Path(p).is_relative_to(build / "cache") for p in shown] == [True, True], shown
    made = subprocess.run(["make", "-s", "-n", "-p", "lint"], cwd=paths.REPO_ROOT,
                          capture_output=True, text=True).stdout  # fmt: skip
    assert re.search(r"^TVM_FFI_CACHE_DIR := .*/build/cache/tvm-ffi$", made, flags=re.MULTILINE)
