"""A running SGLang server: launch it, wait until it is healthy, stop its whole process group.

``launch`` first checks the configuration (the interpreter, the model folder, and every option
against the installed version's own parser, ``fp4lab.serving.cli``), then starts
``ServerConfig.command()`` in its own process group with its output in a log file, waits until
the health endpoint answers 200 (``/health_generate`` generates one token; SGLang answers 503
while it is starting), and stops the whole group on exit, timeout, crash or Ctrl-C (see
``fp4lab.core.process``). A server that does not become ready raises with its log's tail and
what ``fp4lab.serving.logs.classify_log`` finds in it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from fp4lab.core import params, paths, process
from fp4lab.serving.cli import read_parser
from fp4lab.serving.config import ServerConfig
from fp4lab.serving.logs import classify_log, resolved_args

HEALTH_PATHS = ("/health_generate", "/health")


class ServerError(RuntimeError):
    """The server did not become ready; carries its process group id (``pid``), the log's tail
    and what the log shows."""

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

    def resolved(self) -> dict:
        """The server arguments SGLang resolved and logged at start-up ({} when it logged none)."""
        return resolved_args(self.log_path.read_text(errors="replace"))


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


def server_environment(config: ServerConfig) -> dict[str, str]:
    """The server's process environment: this one without the notebooks' interpreter settings,
    SGLang's caches in build/cache/sglang, its CPU engine on ``device="cpu"``, and no hub access
    for a local model folder."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.setdefault("SGLANG_CACHE_DIR", str(paths.build_dir() / "cache" / "sglang"))
    if config.device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    if Path(config.model_path).is_dir():
        env["HF_HUB_OFFLINE"] = "1"
    return env


def checked(config: ServerConfig) -> ServerConfig:
    """``config`` with the installed launch_server parser attached, checked before any launch."""
    config.check()  # the interpreter and the model folder, before reading the parser
    if config.cli is None:
        config = replace(config, cli=read_parser(config.python, "sglang.launch_server"))
    config.check()
    return config


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

    Raises ValueError (``UnknownOption`` for an option the installed parser lacks) before
    anything starts, ServerCrashed if it exits before it is ready and ServerNotReady if it is
    not ready within ``ready_timeout_s``; both carry the log's tail and ``classify_log``'s findings.
    """
    if not ready_timeout_s > 0:
        raise ValueError(
            f"ready_timeout_s={ready_timeout_s!r} must be a positive number of seconds"
        )
    params.choice("health_path", health_path, HEALTH_PATHS)
    config = checked(config)
    if not _port_free(config.host, config.port):
        raise ValueError(
            f"port={config.port} on {config.host} is already in use; "
            "choose a free port (fp4lab.serving.server.free_port())"
        )
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    started = time.monotonic()
    with process.group(config.command(), log_path, env=server_environment(config)) as proc:
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
                    f"{config.label} server not ready at {config.base_url}{health_path} "
                    f"after {ready_timeout_s:.0f} s; stopped it",
                    log_path,
                    proc.pid,
                )
            time.sleep(poll_s)
        yield Server(config, proc.pid, log_path, time.monotonic() - started)
