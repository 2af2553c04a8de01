"""An SGLang server as a measured object: its command line, launch and teardown, crash names, benchmarks.

- ``ServerConfig`` renders the exact ``python -m sglang.launch_server`` command line for
  a model, a tensor-parallel size, a port and the switches of the story: piecewise CUDA
  graphs on or off in either flag generation (older releases: off by default,
  ``--enable-piecewise-cuda-graph``; newer: on by default, ``--disable-piecewise-cuda-graph``
  and ``--enforce-piecewise-cuda-graph``), ``--enable-mscclpp``,
  ``--enable-single-batch-overlap``, and extra arguments.
- ``launch`` starts it in its own process group with its output in a log file, waits
  until the health endpoint answers 200 (``/health_generate`` generates one token;
  SGLang answers 503 while it is starting), and stops the whole group on exit,
  timeout, crash or Ctrl-C (see ``fp4lab.core.process``).
- ``classify_log`` names what a server log shows: dynamo's failures by
  ``fp4lab.compile.trace``'s names, CUDA out-of-memory, NCCL errors, and SGLang's
  "Piecewise CUDA Graph is enabled by default" banner.
- ``bench_serving`` and ``bench_one_batch`` run SGLang's two benchmark clients
  against a running server and load the JSON lines they append.
- ``make_tiny_model`` saves a randomly initialised small model and an offline tokenizer,
  so a GPU machine without network access can start a real server.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from fp4lab.compile import trace
from fp4lab.core import params, paths, probe, process, records

PCG_FLAG_GENERATIONS = ("current", "legacy")
"""current: PCG on by default (--disable-/--enforce-piecewise-cuda-graph); legacy: off by default (--enable-piecewise-cuda-graph)."""

HEALTH_PATHS = ("/health_generate", "/health")

_OWNED_FLAGS = (
    "--model-path", "--model", "--tp-size", "--tp", "--tensor-parallel-size", "--host", "--port",
    "--enable-piecewise-cuda-graph", "--disable-piecewise-cuda-graph", "--enforce-piecewise-cuda-graph",
    "--enable-mscclpp", "--enable-single-batch-overlap",
)  # fmt: skip
"""Flags ServerConfig renders itself; giving them again in extra_args would be ambiguous."""


# ----------------------------------------------------------------------------- command lines


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
        if isinstance(self.extra_args, str) or not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(
                f"extra_args={self.extra_args!r} must be a sequence of strings, one argument each"
            )
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        owned = [a for a in self.extra_args if a.split("=", 1)[0] in _OWNED_FLAGS]
        if owned:
            raise ValueError(
                f"extra_args contains {owned[0]!r}, which ServerConfig sets itself; use its field instead"
            )

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
            self.python, "-m", "sglang.launch_server", "--model-path", str(self.model_path), "--tp-size", str(self.tp_size),
            "--host", self.host, "--port", str(self.port), *self.switch_args(), *self.extra_args,
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
            "model_path": str(self.model_path), "tp_size": self.tp_size, "piecewise_cuda_graph": self.piecewise_cuda_graph,
            "pcg_flags": self.pcg_flags, "enable_mscclpp": self.enable_mscclpp,
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
        f"sglang.launch_server --help names no piecewise CUDA graph flag; {finished.describe()}:\n{process.tail(log_path)}"
    )


# ----------------------------------------------------------------------------- log classification

LOG_SIGNATURES = (
    *(s for s in trace.SIGNATURES if s != "ok"),
    "cuda_out_of_memory",
    "nccl_error",
    "piecewise_cuda_graph_banner",
)
"""Every name ``classify_log`` can give: fp4lab.compile.trace's names for dynamo failures, then the server's own."""

_PATTERNS = (
    (
        "cuda_out_of_memory",
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    ),
    ("nccl_error", re.compile(r"NCCL error|\bnccl\w*Error\b|DistBackendError")),
    (
        "piecewise_cuda_graph_banner",
        re.compile(r"Piecewise CUDA Graph is enabled by default", re.IGNORECASE),
    ),
)
_DYNAMO_EXCEPTION = re.compile(r"torch\._dynamo\.exc\.(\w+): ?(.*)")
_DYNAMO_FOOTER = "Set TORCHDYNAMO_VERBOSE"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_STDLIB_PATH = re.compile(r"/lib/python3\.\d+/(?P<rel>.+)$")
_SOURCE_TREE = re.compile(r"/python/(?P<rel>sglang/.+)$")
_SEGMENT_END = re.compile(
    r"^(Traceback \(most recent call last\)|The above exception|During handling of the above)"
)


@dataclass(frozen=True)
class Finding:
    """One known failure seen in a log, with the line that shows it."""

    signature: str
    evidence: str
    line: int
    blocked_in: str = ""  # for dynamo failures: the innermost frame outside the standard library, as fp4lab.compile.trace names it

    @property
    def is_dynamo(self) -> bool:
        return self.signature in trace.SIGNATURES


def _package_path(path: str) -> str:
    """A path from another machine's traceback, relative to its package root as fp4lab.compile.trace writes frames."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for pattern, prefix in ((_SOURCE_TREE, ""), (_STDLIB_PATH, "<stdlib>/")):
        match = pattern.search(path)
        if match:
            return prefix + match.group("rel")
    return Path(path).name


def _frames(lines: list[str]) -> list[trace.Frame]:
    frames = []
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if not match:
            continue
        file = _package_path(match.group("file"))
        if file.startswith("torch/_dynamo/"):
            continue  # dynamo's own polyfills, not the traced program (as fp4lab.compile.trace drops them)
        source = (
            lines[index + 1].strip()
            if index + 1 < len(lines) and not _FRAME.match(lines[index + 1])
            else ""
        )
        frames.append(trace.Frame(file, int(match.group("line")), match.group("function"), source))
    return frames


def _user_code(lines: list[str], start: int) -> list[str]:
    """The 'from user code:' frames dynamo printed, found from ``start`` on (or just above its footer)."""
    footer = next((i for i in range(start, len(lines)) if _DYNAMO_FOOTER in lines[i]), None)
    if footer is None:
        return []
    header = next(
        (i for i in range(footer - 1, start - 1, -1) if lines[i].strip() == "from user code:"), None
    )
    if (
        header is None
    ):  # a quoted excerpt may start inside the block: take the indented lines above the footer
        header = footer - 1
        while header >= 0 and (not lines[header].strip() or lines[header][:1].isspace()):
            header -= 1
    return lines[header + 1 : footer]


def _dynamo_finding(lines: list[str]) -> Finding | None:
    """Dynamo's failure in a log, named by fp4lab.compile.trace.classify from its message and frames."""
    at = next((i for i, line in enumerate(lines) if _DYNAMO_EXCEPTION.search(line)), None)
    footer = next((i for i, line in enumerate(lines) if _DYNAMO_FOOTER in line), None)
    if at is None and footer is None:
        return None
    if at is None:
        outcome = trace.TraceOutcome(
            status="unsupported", fullgraph=True, backend="unknown", seconds=0.0
        )
        outcome.frames = _frames(_user_code(lines, 0))
        return Finding(
            trace.classify(outcome), lines[footer].strip(), footer, str(outcome.blocker_frame or "")
        )
    match = _DYNAMO_EXCEPTION.search(lines[at])
    end = next(
        (i for i in range(at + 1, len(lines)) if _SEGMENT_END.match(lines[i].strip())), len(lines)
    )
    segment = [match.group(2), *lines[at + 1 : end]]
    status = "unsupported" if match.group(1) == "Unsupported" else "runtime_error"
    outcome = trace.TraceOutcome(status=status, fullgraph=True, backend="unknown", seconds=0.0)
    outcome.message, outcome.explanation, outcome.hints, outcome.debug_context = (
        trace.parse_message("\n".join(segment))
    )
    outcome.frames = _frames(_user_code(lines, at))
    return Finding(trace.classify(outcome), lines[at].strip(), at, str(outcome.blocker_frame or ""))


def classify_log(text: str) -> list[Finding]:
    """Every known failure a server log shows, in the order they first appear."""
    lines = text.splitlines()
    findings = [f for f in [_dynamo_finding(lines)] if f]
    for signature, pattern in _PATTERNS:
        at = next((i for i, line in enumerate(lines) if pattern.search(line)), None)
        if at is not None:
            findings.append(Finding(signature, lines[at].strip(), at))
    return sorted(findings, key=lambda f: f.line)


# ----------------------------------------------------------------------------- launch and teardown


class ServerError(RuntimeError):
    """The server did not become ready; carries its process group id (``pid``), the log's tail and what the log shows."""

    def __init__(self, message: str, log_path: Path, pid: int) -> None:
        self.log_path, self.pid = Path(log_path), pid
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        self.findings = classify_log(text)
        self.log_tail = process.tail(self.log_path)
        names = ", ".join(f.signature for f in self.findings) or "no known signature"
        super().__init__(
            f"{message}\nlog shows: {names}\nlast lines of {self.log_path}:\n{self.log_tail}"
        )


class ServerCrashed(ServerError):
    """The server process exited before it was ready."""


class ServerNotReady(ServerError):
    """The server ran but never answered its health endpoint in time; it was stopped."""


@dataclass(frozen=True)
class Server:
    """A running server: its configuration, leader pid (= its process group) and log."""

    config: ServerConfig
    pid: int
    log_path: Path
    ready_after_s: float

    @property
    def base_url(self) -> str:
        return self.config.base_url


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_socket:
        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe_socket.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def healthy(url: str, timeout_s: float = 5.0) -> bool:
    """Whether ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@contextlib.contextmanager
def launch(
    config: ServerConfig,
    log_path: Path,
    ready_timeout_s: float = 900.0,
    *,
    health_path: str = "/health_generate",
    poll_s: float = 2.0,
) -> Iterator[Server]:
    """Start the server, wait until it is healthy, yield it; the whole process group is stopped on any exit.

    Raises ServerCrashed if it exits before it is ready and ServerNotReady if it is not
    ready within ``ready_timeout_s``; both carry the log's tail and ``classify_log``'s findings.
    """
    if not ready_timeout_s > 0:
        raise ValueError(
            f"ready_timeout_s={ready_timeout_s!r} must be a positive number of seconds"
        )
    params.choice("health_path", health_path, HEALTH_PATHS)
    if not _port_free(config.host, config.port):
        raise ValueError(
            f"port={config.port} on {config.host} is already in use; choose a free port (fp4lab.serving.server.free_port())"
        )
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    started = time.monotonic()
    with process.group(config.command(), log_path) as proc:
        while not healthy(config.base_url + health_path):
            returncode = proc.poll()
            if returncode is not None:
                raise ServerCrashed(
                    f"{config.label} server exited with code {returncode} before it was ready",
                    log_path,
                    proc.pid,
                )
            if time.monotonic() - started > ready_timeout_s:
                raise ServerNotReady(
                    f"{config.label} server not ready at {config.base_url}{health_path} after {ready_timeout_s:.0f} s; stopped it",
                    log_path,
                    proc.pid,
                )
            time.sleep(poll_s)
        yield Server(config, proc.pid, log_path, time.monotonic() - started)


# ----------------------------------------------------------------------------- benchmark clients

SERVING_METRICS = (
    "completed", "duration", "request_throughput", "input_throughput", "output_throughput", "total_input_tokens",
    "total_output_tokens", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "concurrency",
    "max_concurrency", "request_rate",
)  # fmt: skip
"""bench_serving's per-run fields kept in records (those a release writes; output_throughput is required)."""

ONE_BATCH_METRICS = (
    "run_name", "batch_size", "input_len", "output_len", "latency", "input_throughput", "output_throughput",
    "overall_throughput", "last_ttft", "last_gen_throughput",
)  # fmt: skip
"""bench_one_batch_server's per-case fields kept in records (batch_size, latency, output_throughput required)."""


class BenchmarkError(RuntimeError):
    """A benchmark client failed, timed out, or wrote no result."""


def load_jsonl(path: Path, required: Sequence[str], keep: Sequence[str]) -> list[dict]:
    """The rows of a benchmark's JSON lines file, each reduced to ``keep``; every row must hold ``required``."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchmarkError(f"{path}:{number} is not JSON: {exc}") from None
        missing = [k for k in required if k not in row]
        if missing:
            raise BenchmarkError(
                f"{path}:{number} lacks {', '.join(missing)}; fields present: {', '.join(sorted(row))}"
            )
        rows.append({k: row[k] for k in keep if k in row})
    return rows


def _run_client(
    cmd: list[str],
    out: Path,
    log_path: Path,
    timeout_s: float,
    required: Sequence[str],
    keep: Sequence[str],
) -> list[dict]:
    out = Path(out)
    before = len(load_jsonl(out, required, keep)) if out.exists() else 0
    finished = process.run(cmd, log_path, timeout_s)
    if not finished.ok:
        raise BenchmarkError(f"{finished.describe()}\n{process.tail(log_path)}")
    rows = load_jsonl(out, required, keep)[before:] if out.exists() else []
    if not rows:
        raise BenchmarkError(
            f"{cmd[2]} finished but appended no result to {out}\n{process.tail(log_path)}"
        )
    return rows


def _record(
    rows: list[dict], server: Server, notebook: str | None, kind: str, record_params: dict | None
) -> None:
    if notebook:
        for row in rows:
            records.append(notebook, kind, {**server.config.as_record(), **row}, record_params)


def bench_serving_command(
    server: Server,
    out: Path,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    max_concurrency: int | None,
    dataset: str,
    seed: int,
) -> list[str]:
    """``python -m sglang.bench_serving`` against ``server``, fixed-length random prompts, results appended to ``out``."""
    model = str(server.config.model_path)
    cmd = [
        server.config.python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.base_url,
        "--model", model, "--tokenizer", model, "--dataset-name", dataset, "--num-prompts", str(num_prompts),
        "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--random-range-ratio", "1.0",
        "--seed", str(seed), "--output-file", str(out),
    ]  # fmt: skip
    return cmd + (["--max-concurrency", str(max_concurrency)] if max_concurrency else [])


def bench_serving(
    server: Server,
    out: Path,
    *,
    num_prompts: int = 64,
    input_len: int = 256,
    output_len: int = 64,
    max_concurrency: int | None = None,
    dataset: str = "random-ids",
    seed: int = 1,
    timeout_s: float = 900.0,
    log_path: Path | None = None,
    notebook: str | None = None,
    record_params: dict | None = None,
) -> list[dict]:
    """Run bench_serving; returns (and with ``notebook``, records) the rows it appended to ``out``.

    ``random-ids`` draws random token ids, so no dataset is downloaded (``random`` samples ShareGPT).
    """
    for name, value in (
        ("num_prompts", num_prompts),
        ("input_len", input_len),
        ("output_len", output_len),
        ("seed", seed),
    ):
        params.positive(name, value)
    cmd = bench_serving_command(
        server,
        out,
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        max_concurrency=max_concurrency,
        dataset=dataset,
        seed=seed,
    )
    rows = _run_client(
        cmd,
        out,
        Path(log_path or Path(out).with_suffix(".log")),
        timeout_s,
        ("output_throughput",),
        SERVING_METRICS,
    )
    _record(rows, server, notebook, "bench_serving", record_params)
    return rows


def bench_one_batch_command(
    server: Server,
    out: Path,
    *,
    batch_sizes: Sequence[int],
    input_len: int,
    output_len: int,
    run_name: str,
) -> list[str]:
    """``python -m sglang.bench_one_batch_server`` against ``server``, results appended to ``out``."""
    return [
        server.config.python, "-m", "sglang.bench_one_batch_server", "--model-path", str(server.config.model_path),
        "--base-url", server.base_url, "--batch-size", *map(str, batch_sizes), "--input-len", str(input_len),
        "--output-len", str(output_len), "--run-name", run_name, "--result-filename", str(out),
    ]  # fmt: skip


def bench_one_batch(
    server: Server,
    out: Path,
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    input_len: int = 256,
    output_len: int = 32,
    run_name: str | None = None,
    timeout_s: float = 900.0,
    log_path: Path | None = None,
    notebook: str | None = None,
    record_params: dict | None = None,
) -> list[dict]:
    """Run bench_one_batch_server; returns (and with ``notebook``, records) the rows it appended to ``out``."""
    if not batch_sizes:
        raise ValueError("batch_sizes is empty; allowed values: positive integers")
    for value in batch_sizes:
        params.positive("batch_sizes", value)
    params.positive("input_len", input_len)
    params.positive("output_len", output_len)
    cmd = bench_one_batch_command(
        server,
        out,
        batch_sizes=batch_sizes,
        input_len=input_len,
        output_len=output_len,
        run_name=run_name or server.config.label,
    )
    rows = _run_client(
        cmd,
        out,
        Path(log_path or Path(out).with_suffix(".log")),
        timeout_s,
        ("batch_size", "latency", "output_throughput"),
        ONE_BATCH_METRICS,
    )
    _record(rows, server, notebook, "bench_one_batch", record_params)
    return rows


# ----------------------------------------------------------------------------- comparing switches


def unavailable(machine: probe.Machine | None = None) -> str | None:
    """Why this machine cannot run the story's server comparison (SGLang on several Blackwell GPUs), or None."""
    machine = machine or probe.machine()
    if not machine.packages.get("sglang"):
        return "sglang is not installed (it pins its own torch and CUDA packages: a GPU-machine install)"
    return machine.missing("multi-gpu") or machine.missing("fp4-gpu")


@dataclass
class Comparison:
    """One configuration's outcome: its serving rows, or why it has none."""

    config: ServerConfig
    status: str  # ran | failed
    rows: list[dict] = field(default_factory=list)
    reason: str = ""
    findings: list[str] = field(default_factory=list)
    ready_after_s: float | None = None


def switch_matrix(base: ServerConfig) -> list[ServerConfig]:
    """The base configuration, with SBO, with MSCCLPP, and with both."""
    return [
        replace(base, enable_single_batch_overlap=sbo, enable_mscclpp=mscclpp)
        for mscclpp, sbo in ((False, False), (False, True), (True, False), (True, True))
    ]


def compare(
    configs: Sequence[ServerConfig],
    folder: Path,
    *,
    ready_timeout_s: float = 900.0,
    notebook: str | None = None,
    record_params: dict | None = None,
    **bench: object,
) -> list[Comparison]:
    """Launch each configuration in turn, run bench_serving against it, stop it; a failed launch is kept, named."""
    outcomes = []
    for config in configs:
        log = Path(folder) / f"server_{config.label}.log"
        try:
            with launch(config, log, ready_timeout_s) as server:
                rows = bench_serving(
                    server,
                    Path(folder) / f"bench_serving_{config.label}.jsonl",
                    notebook=notebook,
                    record_params=record_params,
                    **bench,
                )
                outcomes.append(Comparison(config, "ran", rows, ready_after_s=server.ready_after_s))
        except (ServerError, BenchmarkError) as exc:
            findings = [f.signature for f in getattr(exc, "findings", [])]
            outcomes.append(
                Comparison(config, "failed", reason=str(exc).splitlines()[0], findings=findings)
            )
    return outcomes


# ----------------------------------------------------------------------------- a model to serve offline

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Piecewise CUDA graphs capture the pieces between attention layers. "
    "MSCCLPP allreduce and single batch overlap move communication off the critical path. 0123456789 +-*/=()[]{}<>"
)


def make_tiny_model(
    folder: Path,
    *,
    hidden: int = 512,
    layers: int = 2,
    heads: int = 8,
    kv_heads: int = 8,
    intermediate: int = 1024,
    vocab: int = 1024,
    max_position: int = 4096,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised small Llama-architecture model and a byte-level BPE tokenizer to ``folder``.

    Nothing is downloaded: the tokenizer is trained here on a fixed sentence. Defaults give head_dim 64 (an attention-kernel size every backend supports) and 8
    attention and KV heads, so any tensor-parallel size from 1 to 8 that divides 8 works.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    for name, value in (
        ("hidden", hidden),
        ("layers", layers),
        ("heads", heads),
        ("kv_heads", kv_heads),
        ("intermediate", intermediate),
        ("vocab", vocab),
        ("max_position", max_position),
    ):
        params.positive(name, value)
    if hidden % heads or heads % kv_heads:
        raise ValueError(
            f"hidden={hidden}, heads={heads}, kv_heads={kv_heads}: heads must divide hidden and kv_heads must divide heads"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [_CORPUS] * 8,
        trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=specials[0], bos_token=specials[1], eos_token=specials[2]
    )
    tokenizer.model_max_length = max_position
    tokenizer.save_pretrained(folder)

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_position,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder


def serving_table(rows: list[dict]) -> pd.DataFrame:
    """bench_serving results per server configuration, with throughput relative to the baseline."""
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    columns = [
        c
        for c in (
            "label",
            "output_throughput",
            "median_ttft_ms",
            "median_itl_ms",
            "median_tpot_ms",
            "completed",
        )
        if c in table
    ]
    table = table[columns].set_index("label")
    if "baseline" in table.index:
        table["throughput_vs_baseline"] = (
            table["output_throughput"] / table.loc["baseline", "output_throughput"]
        )
    return table
