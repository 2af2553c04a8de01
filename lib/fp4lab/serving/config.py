"""An SGLang server launch as a value: model, parallelism, address, device and the story's switches.

``ServerConfig`` renders the exact ``python -m sglang.launch_server`` command line, where
``python`` is an SGLang environment's interpreter (``fp4lab.serving.sglang_env``), never the
notebooks'. The piecewise-CUDA-graph switch is spelt the way the installed version's own
parser spells it (``pcg_args``): ``--cuda-graph-backend-prefill tc_piecewise|disabled`` (its
newest form), ``--enforce-/--disable-piecewise-cuda-graph``, or ``--enable-piecewise-cuda-graph``
(PCG off by default); a version with none of them is refused before launch.
``check_model_dir`` refuses a local model folder without a config or a tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fp4lab.core import params
from fp4lab.serving.cli import CliSpec, UnknownOption

DEVICES = (None, "cuda", "cpu")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
"""A model folder holds at least one of these (a fast, sentencepiece, BPE or tiktoken tokenizer)."""

_OWNED_FLAGS = (
    "--model-path", "--model", "--tp-size", "--tp", "--tensor-parallel-size", "--host", "--port", "--device",
    "--max-total-tokens", "--enable-piecewise-cuda-graph", "--disable-piecewise-cuda-graph",
    "--enforce-piecewise-cuda-graph", "--cuda-graph-backend-prefill", "--enable-mscclpp",
    "--enable-single-batch-overlap",
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


def check_model_dir(model_path: str) -> None:
    """A local model folder must exist and hold config.json and a tokenizer; anything written as
    a path (absolute, relative, ``~``, or with more than one ``/``) must be such a folder; a
    Hugging Face id (``org/name``) is not checked here."""
    folder = Path(model_path).expanduser()
    looks_like_a_path = model_path.startswith(("/", ".", "~")) or model_path.count("/") > 1
    if not folder.is_dir():
        if looks_like_a_path:
            raise ValueError(
                f"model_path={model_path!r} is not a folder here; allowed values: a model folder "
                "with config.json and a tokenizer, or a Hugging Face id such as org/name"
            )
        return
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        missing.append(f"a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    if missing:
        raise ValueError(
            f"model_path={model_path!r} is a folder without {' and '.join(missing)}; "
            "allowed values: a model folder with both, or a Hugging Face id"
        )


def pcg_args(cli: CliSpec, on: bool) -> list[str]:
    """The flags that turn piecewise CUDA graphs on or off, as ``cli``'s parser spells them."""
    backend = cli.find("--cuda-graph-backend-prefill")
    if backend is not None:
        wanted = "tc_piecewise" if on else "disabled"
        if backend.choices and wanted not in backend.choices:
            raise UnknownOption(
                f"{cli.who} has no piecewise CUDA graph: --cuda-graph-backend-prefill takes "
                f"{', '.join(backend.choices)}; {cli.no_such_option('--piecewise-cuda-graph')}"
            )
        return ["--cuda-graph-backend-prefill", wanted]
    if on:
        for flag in ("--enforce-piecewise-cuda-graph", "--enable-piecewise-cuda-graph"):
            if cli.find(flag):
                return [flag]
    elif cli.find("--disable-piecewise-cuda-graph"):
        return ["--disable-piecewise-cuda-graph"]
    elif cli.find("--enable-piecewise-cuda-graph"):
        return []  # a version with only an enable flag has PCG off by default
    raise cli.no_such_option(
        "--enforce-piecewise-cuda-graph" if on else "--disable-piecewise-cuda-graph"
    )


@dataclass(frozen=True)
class ServerConfig:
    """What one server launch is: interpreter, model, parallelism, address, device and switches.

    ``cli`` is the installed version's launch_server parser (``fp4lab.serving.cli``); it is
    needed to spell the PCG switch and is what ``server.launch`` checks the command against.
    """

    model_path: str
    tp_size: int = 1
    port: int = 30000
    host: str = "127.0.0.1"
    piecewise_cuda_graph: bool | None = None
    enable_mscclpp: bool = False
    enable_single_batch_overlap: bool = False
    extra_args: tuple[str, ...] = ()
    python: str = ""
    device: str | None = None
    max_total_tokens: int | None = None
    cli: CliSpec | None = field(default=None, compare=False, repr=False)

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
        params.choice("enable_mscclpp", self.enable_mscclpp, (True, False))
        params.choice(
            "enable_single_batch_overlap", self.enable_single_batch_overlap, (True, False)
        )
        params.choice("device", self.device, DEVICES)
        if self.max_total_tokens is not None:
            params.positive("max_total_tokens", self.max_total_tokens)
        check_extra_args("extra_args", self.extra_args)
        object.__setattr__(self, "extra_args", tuple(self.extra_args))

    def switch_args(self) -> list[str]:
        """The optimization switches as the installed SGLang spells them."""
        args = []
        if self.piecewise_cuda_graph is not None:
            if self.cli is None:
                raise ValueError(
                    "piecewise_cuda_graph needs the installed SGLang's parser to be spelt: "
                    "pass cli=fp4lab.serving.cli.read_parser(python, 'sglang.launch_server')"
                )
            args += pcg_args(self.cli, self.piecewise_cuda_graph)
        if self.enable_mscclpp:
            args.append("--enable-mscclpp")
        if self.enable_single_batch_overlap:
            args.append("--enable-single-batch-overlap")
        return args

    def arguments(self) -> list[str]:
        """launch_server's arguments (the command line after ``python -m sglang.launch_server``)."""
        return [
            "--model-path", str(self.model_path), "--tp-size", str(self.tp_size), "--host", self.host,
            "--port", str(self.port), *(["--device", self.device] if self.device else []),
            *(["--max-total-tokens", str(self.max_total_tokens)] if self.max_total_tokens else []),
            *self.switch_args(), *self.extra_args,
        ]  # fmt: skip

    def command(self) -> list[str]:
        """The exact ``python -m sglang.launch_server`` command line."""
        return [self.python or "python", "-m", "sglang.launch_server", *self.arguments()]

    def check(self) -> None:
        """Refuse, before launch, a missing interpreter, a model folder without config or
        tokenizer, and any option or value the installed parser would refuse."""
        if not self.python:
            raise ValueError(
                "python is empty; allowed values: an SGLang environment's interpreter "
                "(fp4lab.serving.sglang_env.ensure_sglang().python)"
            )
        check_model_dir(str(self.model_path))
        if self.cli is not None:
            self.cli.check(self.arguments())

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
            "model_path": str(self.model_path), "tp_size": self.tp_size, "device": self.device,
            "piecewise_cuda_graph": self.piecewise_cuda_graph, "enable_mscclpp": self.enable_mscclpp,
            "enable_single_batch_overlap": self.enable_single_batch_overlap, "extra_args": list(self.extra_args),
            "max_total_tokens": self.max_total_tokens, "label": self.label,
            "sglang_version": self.cli.sglang if self.cli else None,
            "command": " ".join(self.command()[1:]),
        }  # fmt: skip
