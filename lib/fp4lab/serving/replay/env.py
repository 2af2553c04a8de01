"""One environment per SGLang version for its compile path, under build/sglang-compile/<version>/.

What SGLang's piecewise compile path and its NVFP4 linear method import on a CPU machine, and
nothing of its server: torch at the project's CPU pin, the FlashInfer release SGLang pins (with
its own dependencies), ``sglang==<version>`` and its kernel package without dependencies, and
the import set of ``IMPORT_PACKAGES`` at the versions the release pins, Triton at the version the
release's torch pin requires (the triton_kernels its kernel package ships are built for it). Where the release pins
another torch (2.8, 2.9.1, 2.11, 2.14.1: no CPU wheel at hand), SGLang runs on torch 2.13.0 and
the records say so. Built and reused by ``core.venvs`` (one shared pip download cache); a
version that fails to download or install is returned with the reason, never raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from fp4lab.core import paths, venvs
from fp4lab.serving import deep_gemm_sources, sglang_env, standins

IMPORT_PACKAGES = (
    "numpy", "orjson", "psutil", "pybase64", "pillow", "fastapi", "msgspec", "transformers",
    "pydantic", "pyzmq", "uvicorn", "uvloop", "setproctitle", "xxhash", "partial_json_parser",
    "interegular", "python-multipart", "prometheus-client", "IPython", "aiohttp", "dill",
    "sentencepiece", "requests", "tqdm", "einops", "packaging", "regex", "triton", "scipy",
    "openai", "torchvision", "compressed-tensors", "gguf", "xgrammar", "accelerate",
)  # fmt: skip
"""What importing SGLang's compilation package, ``modelopt_quant`` and its model registry needs
(read from its imports: from 0.5.16 every model module imports ``xgrammar``; 0.5.4's ModelOpt
config refuses to load without ``accelerate``, which that release lists only for its tests); its
server, model loaders and CUDA kernels stay out."""

FLASHINFER_WHEEL_FOR = {"0.4.0": "0.5.0", "0.4.1": "0.5.0"}
"""FlashInfer releases before 0.5.0 ship no wheel (a source archive whose build needs CUDA):
the first release with one stands in, and the records say so."""

PRELUDE = "import sys; sys.path.insert(0, {lib!r}); import fp4lab.compile.target; "
"""Run before each stand-in's import check: FlashInfer imported as the child imports it (some
releases query GPU 0 at import; ``compile.target`` stages that on CPU), before sgl_kernel."""


@dataclass
class CompileEnv:
    """One version's environment: how it was obtained, its pins and where they differ."""

    version: str
    status: str  # built | reused | bundled | failed
    seconds: float = 0.0
    env_bytes: int = 0
    error: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    installed: dict[str, str] = field(default_factory=dict)
    differs: list[str] = field(default_factory=list)
    standins: list[dict] = field(default_factory=list)
    deep_gemm: dict = field(default_factory=dict)
    """DeepGEMM's kernel sources as the release ships or pins them (``deep_gemm_sources``)."""
    python_path: str = ""
    """The interpreter of a bundled release (``capture.bundled``); else the environment's own."""
    site: str = ""
    """The folder a bundled release is installed in, put on its children's path."""

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    @property
    def python(self) -> Path:
        return (
            Path(self.python_path)
            if self.python_path
            else env_dir(self.version) / "venv" / "bin" / "python"
        )

    @property
    def child_env(self) -> tuple[tuple[str, str], ...]:
        """What a child run in it adds to its environment: a bundled release's folder on the
        path, after fp4lab's source (``venvs.run_child`` puts that first) and before the rest."""
        if not self.site:
            return ()
        rest = os.environ.get("PYTHONPATH", "")
        return (
            (
                "PYTHONPATH",
                os.pathsep.join(p for p in (str(paths.REPO_ROOT / "lib"), self.site, rest) if p),
            ),
        )

    def as_record(self) -> dict:
        return asdict(self)


def env_dir(version: str) -> Path:
    return paths.build_dir() / "sglang-compile" / version


def has_backend(version: str, graph: str) -> bool:
    """Whether the release's installed files hold the backend of prefill graph ``graph``
    (``breakable``, ``full``, ``tc_piecewise``)."""
    found = env_dir(version).glob("venv/lib/python*/site-packages/sglang/srt/model_executor/"
                                  f"runner_backend/{graph}_cuda_graph_backend.py")  # fmt: skip
    return any(found)


PINNED = ("torch", "flashinfer-python", *standins.KERNEL_PACKAGES, "transformers")
"""The pins every record shows."""


def release_pins(wheel: Path) -> dict[str, str]:
    """Every unconditional requirement of the release, by normalised name: its specifier."""
    return {n: str(r.specifier) for n, r in sglang_env.release_requirements(wheel).items()}


def triton_required(torch_pin: str) -> str | None:
    """The Triton pin (``==X``) that torch at ``torch_pin`` requires on Linux x86-64, from its
    own metadata as uv resolves it; None where it cannot be resolved (no registry, no pin)."""
    if not torch_pin.startswith("=="):
        return None
    try:
        done = subprocess.run([venvs.uv_binary(), "pip", "compile", "-q", "--python-version",
                               "3.11", "--python-platform", "x86_64-manylinux_2_28", "-"],
                              input=f"torch{torch_pin}\n", capture_output=True, text=True,
                              timeout=120, env=venvs.uv_environment())  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    found = re.search(r"^triton==(\S+)", done.stdout, re.MULTILINE)
    return f"=={found.group(1)}" if done.returncode == 0 and found else None


def steps(version: str, pins: dict[str, str]) -> list[list[str]]:
    """FlashInfer (with its dependencies) on the CPU torch, sglang and its kernel package without
    theirs, then the import set at the release's pins; torch is the main environment's in every
    step."""
    torch = venvs.torch_requirement()
    flashinfer = f"flashinfer-python{pins.get('flashinfer-python', '')}"
    kernels = [f"{k}{pins[k]}" for k in standins.KERNEL_PACKAGES if k in pins]
    imports = [f"{name}{pins.get(canonicalize_name(name), '')}" for name in IMPORT_PACKAGES]
    return [
        ["install", torch, flashinfer],
        ["install", "--no-deps", f"sglang=={version}", *kernels],
        ["install", *imports, torch],
    ]


def _installed(python: Path) -> dict[str, str]:
    names = ["torch", "flashinfer-python", *standins.KERNEL_PACKAGES, "transformers", "triton"]
    code = (
        "import importlib.metadata as m, json\n"
        f"out = {{}}\nfor n in {names!r}:\n"
        "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def ensure_env(version: str) -> CompileEnv:
    """Build or reuse build/sglang-compile/<version>/venv; a failure is returned with its reason."""
    wheel, error = sglang_env.download_wheel(version, env_dir(version) / "wheel")
    if wheel is None:
        with contextlib.suppress(OSError):  # leave nothing behind for a missing release
            env_dir(version).rmdir()
        return CompileEnv(version, "failed", error=error)
    requirements = release_pins(wheel)
    pins = {n: requirements[n] for n in PINNED if n in requirements}
    triton = triton_required(requirements.get("torch", ""))
    if triton:  # the Triton of the torch the release pins (its triton_kernels were built for it)
        requirements["triton"] = triton
    pinned = requirements.get("flashinfer-python", "").removeprefix("==")
    if pinned in FLASHINFER_WHEEL_FOR:
        requirements["flashinfer-python"] = f"=={FLASHINFER_WHEEL_FOR[pinned]}"
    environment = venvs.ensure(env_dir(version) / "venv", steps(version, requirements))
    result = CompileEnv(version, environment.status, environment.seconds, pins=pins)
    if environment.status == "failed":
        result.error = environment.error
        return result
    result.env_bytes = environment.own_bytes
    result.installed = _installed(environment.python)
    result.differs = [
        f"{name}: release pins {pins[name]}, installed {have}"
        for name, have in result.installed.items()
        if name in pins and pins[name].startswith("==") and pins[name][2:] != have.split("+")[0]
    ]
    prelude = PRELUDE.format(lib=str(paths.REPO_ROOT / "lib"))
    result.standins, result.error = standins.apply(environment.python, prelude)
    site = standins.site_packages(str(environment.python))
    pin = requirements.get(canonicalize_name(deep_gemm_sources.PUBLISHED))
    result.deep_gemm = deep_gemm_sources.kept(environment.path, site, pin)
    result.status = "failed" if result.error else result.status
    return result
