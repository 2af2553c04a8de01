"""An SGLang release's environment (``serving.sglang_env``) seen from its compile path.

The replay runs in the same environment as the release's CPU server, build/sglang/<version>/
(one environment per release): the main environment's torch, the FlashInfer release SGLang
pins, ``sglang==<version>`` and its kernel package, and what its compile path imports. Where the
release pins another torch (2.8, 2.9.1, 2.11, 2.14.1: no CPU wheel at hand), SGLang runs on the
main environment's and the records say so. A version that fails to download or install is
returned with the reason, never raised.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fp4lab.core import paths
from fp4lab.serving import sglang_env, standins

PRELUDE = "import sys; sys.path.insert(0, {lib!r}); import fp4lab.compile.target; "
"""Run before each stand-in's import check: FlashInfer imported as the child imports it (some
releases query GPU 0 at import; ``compile.target`` stages that on CPU), before sgl_kernel."""


@dataclass
class CompileEnv:
    """One version's environment: how it was obtained, its pins and where they differ."""

    version: str
    status: str  # built | reused | failed
    seconds: float = 0.0
    env_bytes: int = 0
    error: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    installed: dict[str, str] = field(default_factory=dict)
    differs: list[str] = field(default_factory=list)
    standins: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    @property
    def python(self) -> Path:
        return env_dir(self.version) / "venv" / "bin" / "python"

    def as_record(self) -> dict:
        return asdict(self)


def env_dir(version: str) -> Path:
    return sglang_env.env_root(version)


PINNED = ("torch", "flashinfer-python", *sglang_env.KERNEL_PACKAGES, "transformers")
"""The pins every record shows."""


def _installed(python: Path) -> dict[str, str]:
    names = ["torch", "flashinfer-python", *sglang_env.KERNEL_PACKAGES, "transformers", "triton"]
    code = (
        "import importlib.metadata as m, json\n"
        f"out = {{}}\nfor n in {names!r}:\n"
        "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def ensure_env(version: str) -> CompileEnv:
    """Build or reuse build/sglang/<version>/venv; a failure is returned with its reason."""
    built = sglang_env.ensure_sglang(version)
    environment = built.environment
    result = CompileEnv(version, environment.status, environment.seconds)
    if environment.status == "failed":
        result.error = built.error
        return result
    wheel = sglang_env.download_wheel(version, env_dir(version) / "wheel")[0]
    requirements = sglang_env.release_requirements(wheel)
    result.pins = {n: str(requirements[n].specifier) for n in PINNED if n in requirements}
    result.env_bytes = environment.own_bytes
    result.installed = _installed(environment.python)
    result.differs = [
        f"{name}: release pins {pin}, installed {result.installed[name]}"
        for name, pin in result.pins.items()
        if name in result.installed
        and pin.startswith("==")
        and pin[2:] != result.installed[name].split("+")[0]
    ]
    prelude = PRELUDE.format(lib=str(paths.REPO_ROOT / "lib"))
    more, result.error = standins.apply(environment.python, prelude)
    result.standins = more
    result.status = "failed" if result.error or built.error else result.status
    result.error = result.error or built.error
    return result
