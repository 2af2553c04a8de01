"""SGLang in its own environment under build/sglang/<version>/, never the notebooks' interpreter.

SGLang pins its own torch, transformers and CUDA packages, which cannot live beside fp4lab's.
``ensure_sglang`` builds (or reuses) a side environment with ``fp4lab.core.venvs`` (uv, one
shared cache): the main environment's torch and a torchvision that matches it, the sglang wheel
itself and its kernel package without their dependencies, and the packages its server, its
benchmark clients and its argument parser import, each at the version the release pins (read
from the wheel's own metadata). Where a CUDA-only binary cannot load on this machine,
``fp4lab.serving.standins`` puts a small, listed stand-in in its place and the environment says
which. The replay of a release's compile path has its own environment (``serving.replay.env``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fp4lab.core import paths, venvs
from fp4lab.serving import standins

SGLANG_VERSION = "0.5.21"
"""The SGLang release the serving harness uses by default: the newest that pins torch 2.13.0,
whose CPU wheel this project installs, and that serves on CPU (0.5.22+ pin torch 2.14.1)."""

PACKAGES = (
    # what SGLang's server, tokenizer and scheduler processes import
    "numpy", "orjson", "psutil", "pybase64", "pillow", "fastapi", "msgspec", "transformers", "tokenizers",
    "pydantic", "pyzmq", "uvicorn", "uvloop", "setproctitle", "xxhash", "partial_json_parser", "interegular",
    "python-multipart", "prometheus-client", "IPython", "aiohttp", "dill", "sentencepiece", "compressed-tensors",
    "gguf", "openai", "jsonschema", "xgrammar", "soundfile", "requests", "tqdm", "einops", "packaging", "regex",
    # what its benchmark clients import
    "datasets", "tabulate",
)  # fmt: skip
"""SGLang's dependencies its CPU server and benchmark clients need; the rest of its list is CUDA
kernels, model-specific extras and tooling this harness never imports."""


@dataclass
class SGLangEnv:
    """One SGLang environment: its version, the venv, the stand-ins it needed, or why it failed."""

    version: str
    environment: venvs.Environment
    standins: list[dict] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def python(self) -> str:
        return str(self.environment.python)

    def as_record(self) -> dict:
        """Where it is, how it was obtained, its size and its stand-ins, for records."""
        return {
            "sglang_version": self.version, "sglang_env": str(self.environment.path),
            "env_status": self.environment.status, "env_seconds": round(self.environment.seconds, 1),
            "env_bytes": self.environment.bytes, "standins": self.standins, "env_error": self.error,
        }  # fmt: skip


def env_root(version: str = SGLANG_VERSION) -> Path:
    """build/sglang/<version>: the environment (venv/) and the downloaded wheel (wheel/)."""
    return paths.build_dir() / "sglang" / version


def download_wheel(version: str, folder: Path) -> tuple[Path | None, str]:
    """The sglang wheel of ``version`` in ``folder`` (downloaded once), or None and why; a
    release that cannot be downloaded leaves no empty folder behind."""
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0], ""
    folder.mkdir(parents=True, exist_ok=True)
    command = ["-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(folder)]
    env = dict(os.environ, PIP_CACHE_DIR=str(paths.build_dir() / "cache" / "pip"))
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env)
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if done.returncode or not found:
        with contextlib.suppress(OSError):
            folder.rmdir()
        tail = " | ".join(line for line in done.stderr.splitlines()[-3:] if line.strip())
        return None, f"pip could not download sglang=={version}: {tail}"
    return found[0], ""


def release_requirements(wheel: Path) -> dict[str, Requirement]:
    """The unconditional dependencies a wheel's metadata lists, by normalised name."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    requirements = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or "extra" not in str(requirement.marker):
                requirements[canonicalize_name(requirement.name)] = requirement
    return requirements


def pinned(names: tuple[str, ...], requirements: dict[str, Requirement]) -> list[str]:
    """Each name with the version the release requires (bare where it requires none)."""
    out = []
    for name in names:
        requirement = requirements.get(canonicalize_name(name))
        out.append(f"{name}{requirement.specifier}" if requirement else name)
    return out


def steps(version: str, requirements: dict[str, Requirement]) -> list[list[str]]:
    """The uv steps that build the environment for ``version`` from its wheel's requirements:
    torch is the main environment's in every step."""
    if "torch" not in requirements:
        raise ValueError(f"sglang=={version} pins no torch; its requirements cannot be read")
    torch = venvs.torch_requirement()
    kernel = [k for k in standins.KERNEL_PACKAGES if canonicalize_name(k) in requirements]
    return [
        ["install", torch, "torchvision"],
        ["install", "--no-deps", f"sglang=={version}", *pinned(tuple(kernel), requirements)],
        ["install", *pinned(PACKAGES, requirements), torch],
    ]


def ensure_sglang(version: str = SGLANG_VERSION) -> SGLangEnv:
    """Build or reuse build/sglang/<version>/venv; a failed install is returned with its reason."""
    wheel, error = download_wheel(version, env_root(version) / "wheel")
    path = env_root(version) / "venv"
    if wheel is None:
        with contextlib.suppress(OSError):  # leave nothing behind for a missing release
            env_root(version).rmdir()
        return SGLangEnv(version, venvs.Environment(path, "failed", error=error), error=error)
    environment = venvs.ensure(path, steps(version, release_requirements(wheel)))
    if environment.status == "failed":
        return SGLangEnv(version, environment, error=environment.error)
    applied, error = standins.apply(environment.python)
    return SGLangEnv(version, environment, applied, error)


def python(version: str = SGLANG_VERSION) -> str:
    """The interpreter of the SGLang ``version`` environment, built on first use; RuntimeError
    saying why when it cannot be built."""
    env = ensure_sglang(version)
    if not env.ok:
        raise RuntimeError(f"the SGLang {version} environment could not be built: {env.error}")
    return env.python
