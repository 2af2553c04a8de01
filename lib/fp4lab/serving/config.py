"""An SGLang server launch as a value: model, parallelism, address and the story's switches.

``ServerConfig`` renders the exact ``python -m sglang.launch_server`` command line for a
model, a tensor-parallel size, a port and the switches of the story: piecewise CUDA graphs
on or off in either flag generation (older releases: off by default,
``--enable-piecewise-cuda-graph``; newer: on by default, ``--disable-piecewise-cuda-graph``
and ``--enforce-piecewise-cuda-graph``; ``detect_pcg_flags`` reads which one the installed
SGLang has), ``--enable-mscclpp``, ``--enable-single-batch-overlap``, and extra arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fp4lab.core import params, paths, process

PCG_FLAG_GENERATIONS = ("current", "legacy")
"""current: PCG on by default (--disable-/--enforce-piecewise-cuda-graph);
legacy: off by default (--enable-piecewise-cuda-graph)."""

_OWNED_FLAGS = (
    "--model-path", "--model", "--tp-size", "--tp", "--tensor-parallel-size", "--host", "--port",
    "--enable-piecewise-cuda-graph", "--disable-piecewise-cuda-graph", "--enforce-piecewise-cuda-graph",
    "--enable-mscclpp", "--enable-single-batch-overlap",
)  # fmt: skip
"""Flags ServerConfig renders itself; giving them again in extra_args would be ambiguous."""


def check_extra_args(name: str, args: Sequence[str]) -> None:
    """More launch_server arguments must be strings, one argument each, and none a flag ServerConfig sets."""
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{name}={args!r} must be a sequence of strings, one argument each")
    owned = [a for a in args if a.split("=", 1)[0] in _OWNED_FLAGS]
    if owned:
        raise ValueError(
            f"{name} contains {owned[0]!r}, which ServerConfig sets itself; use its field instead"
        )


@dataclass(frozen=True)
class ServerConfig:
    """What one server launch is: model, parallelism, address and the optimization switches."""

    model_path: str
    tp_size: int = 1
    port: int = 30000
    host: str = "127.0.0.1"
    piecewise_cuda_graph: bool | None = None
    pcg_flags: str = "current"
    enable_mscclpp: bool = False
    enable_single_batch_overlap: bool = False
    extra_args: tuple[str, ...] = ()
    python: str = sys.executable

    def __post_init__(self) -> None:
        if not str(self.model_path).strip():
            raise ValueError(
                "model_path is empty; allowed values: a local model folder or a Hugging Face id"
            )
        params.positive("tp_size", self.tp_size)
        params.positive("port", self.port)
        if self.port > 65535:
            raise ValueError(f"port={self.port} is not allowed; allowed values: 1..65535")
        params.choice("piecewise_cuda_graph", self.piecewise_cuda_graph, (None, True, False))
        params.choice("pcg_flags", self.pcg_flags, PCG_FLAG_GENERATIONS)
        params.choice("enable_mscclpp", self.enable_mscclpp, (True, False))
        params.choice(
            "enable_single_batch_overlap", self.enable_single_batch_overlap, (True, False)
        )
        check_extra_args("extra_args", self.extra_args)
        object.__setattr__(self, "extra_args", tuple(self.extra_args))

    def switch_args(self) -> list[str]:
        """The optimization switches as SGLang's flags."""
        args = []
        if self.piecewise_cuda_graph is True:
            args.append(
                "--enable-piecewise-cuda-graph"
                if self.pcg_flags == "legacy"
                else "--enforce-piecewise-cuda-graph"
            )
        elif self.piecewise_cuda_graph is False and self.pcg_flags == "current":
            args.append("--disable-piecewise-cuda-graph")
        if self.enable_mscclpp:
            args.append("--enable-mscclpp")
        if self.enable_single_batch_overlap:
            args.append("--enable-single-batch-overlap")
        return args

    def command(self) -> list[str]:
        """The exact ``python -m sglang.launch_server`` command line."""
        return [
            self.python, "-m", "sglang.launch_server", "--model-path", str(self.model_path),
            "--tp-size", str(self.tp_size), "--host", self.host, "--port", str(self.port),
            *self.switch_args(), *self.extra_args,
        ]  # fmt: skip

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def label(self) -> str:
        """A short name for tables: the switches that are on."""
        pcg = {None: [], True: ["pcg"], False: ["no-pcg"]}[self.piecewise_cuda_graph]
        on = [
            *pcg,
            *(["mscclpp"] if self.enable_mscclpp else []),
            *(["sbo"] if self.enable_single_batch_overlap else []),
        ]
        return "+".join(on) or "baseline"

    def as_record(self) -> dict:
        """The configuration as plain values, for records."""
        return {
            "model_path": str(self.model_path), "tp_size": self.tp_size,
            "piecewise_cuda_graph": self.piecewise_cuda_graph, "pcg_flags": self.pcg_flags,
            "enable_mscclpp": self.enable_mscclpp,
            "enable_single_batch_overlap": self.enable_single_batch_overlap, "extra_args": list(self.extra_args),
            "label": self.label, "command": " ".join(self.command()[1:]),
        }  # fmt: skip


def detect_pcg_flags(
    python: str = sys.executable, log_path: Path | None = None, timeout_s: float = 180.0
) -> str:
    """Which piecewise-CUDA-graph flag generation the installed SGLang has, from its own ``--help``."""
    log_path = Path(log_path or paths.build_dir() / "server" / "launch_server_help.log")
    log_path.unlink(missing_ok=True)
    finished = process.run([python, "-m", "sglang.launch_server", "--help"], log_path, timeout_s)
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    if "--disable-piecewise-cuda-graph" in text:
        return "current"
    if "--enable-piecewise-cuda-graph" in text:
        return "legacy"
    raise RuntimeError(
        "sglang.launch_server --help names no piecewise CUDA graph flag; "
        f"{finished.describe()}:\n{process.tail(log_path)}"
    )
