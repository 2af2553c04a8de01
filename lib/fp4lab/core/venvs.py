"""Side environments under build/ (one per FlashInfer version or SGLang release), built by uv.

Every environment is made by ``uv venv`` from this interpreter, then filled by ``uv pip``
steps from one shared cache (build/cache/uv, on the same filesystem, so installed files are
hardlinks into the cache: environments that share torch share its bytes on disk). A stamp
holding the steps marks an environment complete, so it is reused only when it was built by the
same steps. uv's progress is shown as it builds; an install that fails is returned with the tail
of uv's error, never raised, and leaves no half-built environment behind.

Bytecode is compiled on import, not at install (``BYTECODE``), here and in build/venv: an
environment holds 15,000 or more Python files, of which a process imports a fifth, and compiling
them all took most of a side environment's build. Each environment writes what it imports to
its own ``__pycache__`` folders, even where ``PYTHONDONTWRITEBYTECODE`` is set, so only its
first import compiles.

uv reads none of pip's configuration: where pip is configured with find-links (a local wheel
folder, such as the one holding this project's CPU build of torch), they are passed to uv.

``run_children`` runs fp4lab modules inside such environments (``python -m MODULE OUT ...``),
several at once where the machine has the cores, and reads the JSON each writes to OUT.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from fp4lab.core import paths, process, progress

STAMP = ".fp4lab-ready"
BYTECODE = ("fp4lab-bytecode.pth", "import sys; sys.dont_write_bytecode = False\n")
"""A ``.pth`` file (its ``import`` line runs at every start of the environment's interpreter) that
lets the environment write the bytecode of what it imports, whatever ``PYTHONDONTWRITEBYTECODE``
says: one place, whichever process (child, server, rank) runs in it."""


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
        """Bytes of its files, each counted once (hardlinks into the shared cache included)."""
        return paths.disk_bytes(self.path) if self.status != "failed" else 0

    @functools.cached_property
    def own_bytes(self) -> int:
        """Bytes only this environment holds: its files that are not hardlinks into the cache."""
        return paths.unshared_bytes(self.path) if self.status != "failed" else 0


def torch_requirement() -> str:
    """The torch every side environment gets: exactly the main environment's build (the one pin,
    set by the Makefile's ``TORCH`` and the lock)."""
    return f"torch=={metadata.version('torch')}"


def uv_binary() -> str:
    """The uv executable installed in this environment (a pinned dependency of fp4lab)."""
    from uv import find_uv_bin

    return find_uv_bin()


@cache
def pip_find_links() -> str:
    """pip's configured find-links ('' when none), which uv does not read by itself."""
    if os.environ.get("PIP_FIND_LINKS"):
        return os.environ["PIP_FIND_LINKS"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else ""


@cache
def registry_versions(package: str) -> tuple[str, ...] | None:
    """The releases of ``package`` the configured package index offers this interpreter, newest
    first (``pip index versions``: one cheap lookup); () when it has none, None when the index
    could not be asked."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for line in done.stdout.splitlines():
        if line.startswith("Available versions:"):
            return tuple(v.strip() for v in line.split(":", 1)[1].split(","))
    return () if "No matching distribution" in done.stderr else None


def check_released(name: str, package: str, versions: list[str]) -> list[str]:
    """``versions`` when the package index has each (or cannot be asked); else an error naming
    the parameter, the version and the newest releases it has, before anything is built."""
    released = registry_versions(package)
    missing = [v for v in versions if released is not None and v not in released]
    if missing:
        newest = ", ".join(released[:8]) if released else "none"
        raise ValueError(
            f"{name} contains {missing[0]!r}: {package} has no such release on the package "
            f"index; allowed values: its releases, newest first: {newest}, ..."
        )
    return versions


def compile_on_import(site_packages: Path | None = None) -> None:
    """Write ``BYTECODE`` into ``site_packages`` (this interpreter's by default: ``make`` calls it
    for build/venv)."""
    site = site_packages or Path(sysconfig.get_paths()["purelib"])
    (site / BYTECODE[0]).write_text(BYTECODE[1])


def uv_environment() -> dict[str, str]:
    """The process environment for uv: the shared cache, no Python downloads, pip's find-links."""
    env = dict(os.environ)
    env.setdefault("UV_CACHE_DIR", str(paths.build_dir() / "cache" / "uv"))
    env.setdefault("UV_LINK_MODE", "hardlink")
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["UV_COMPILE_BYTECODE"] = "0"  # compiled on import instead (``BYTECODE``)
    if pip_find_links() and "UV_FIND_LINKS" not in env:
        env["UV_FIND_LINKS"] = pip_find_links()
    return env


def uncache(packages: list[str]) -> None:
    """Drop ``packages`` from uv's shared cache (files of theirs an environment holds stay there,
    hardlinks keep them); a later build downloads them again."""
    subprocess.run(
        [uv_binary(), "cache", "clean", *packages],
        env=uv_environment(),
        capture_output=True,
        check=True,
    )


def _failure(label: str, output: str) -> str:
    tail = [line.strip() for line in output.splitlines() if line.strip()][-3:]
    return f"{label} failed: {' | '.join(tail)}"


def step_label(step: list[str]) -> str:
    """A ``uv pip`` step as one short progress line: its verb and options, the first three
    requirements and how many more (the whole command goes to the build log)."""
    options = [a for a in step[1:] if a.startswith("-")]
    wanted = [a for a in step[1:] if not a.startswith("-")]
    more = f" and {len(wanted) - 3} more" if len(wanted) > 3 else ""
    return " ".join(["uv pip", *step[:1], *options, *wanted[:3]]) + more


def _run(label: str, command: list[str], log: Path) -> str:
    """Run one uv command, its output kept in ``log`` only; one line on stderr names the step,
    except in a notebook (its page shows the environment's one line, ``_said``); '' when it
    succeeded, else why it failed."""
    if not progress.in_kernel():
        print(f"[env] {label}", file=sys.stderr, flush=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=uv_environment(),
        )
        lines = []
        for line in child.stdout:
            out.write(line)
            lines.append(line)
        child.wait()
    return _failure(label, "".join(lines[-20:])) if child.returncode else ""


def _said(environment: Environment, log: Path) -> Environment:
    """``environment``, after one line on stdout: built or reused, seconds, bytes of its own."""
    where = paths.shown(environment.path)
    if environment.status == "failed":
        print(f"[env] {where}: failed after {environment.seconds:.0f} s (log: {paths.shown(log)})")
    else:
        print(f"[env] {where}: {environment.status} in {environment.seconds:.0f} s, "
              f"{environment.own_bytes / 2**20:.0f} MiB of its own (log: {paths.shown(log)})")  # fmt: skip
    return environment


def ensure(path: Path, steps: list[list[str]]) -> Environment:
    """Build (or reuse) the environment at ``path``: ``uv venv``, then ``uv pip <step>`` for each
    step (arguments as for ``uv pip``; the environment's interpreter is added); one line says
    what came of it (``_said``), uv's own output goes to its log (and stderr outside notebooks)."""
    started = time.perf_counter()
    stamp = path / STAMP
    recipe = "\n".join([*(" ".join(step) for step in steps), f"bytecode: {BYTECODE[0]}"])
    log = path.parent / f"{path.name}.build.log"
    if stamp.exists() and stamp.read_text() == recipe:
        return _said(Environment(path, "reused", time.perf_counter() - started), log)
    shutil.rmtree(path, ignore_errors=True)
    uv, python = uv_binary(), str(path / "bin" / "python")
    path.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    commands = [("uv venv", [uv, "venv", "-q", "--python", sys.executable, str(path)])]
    commands += [(step_label(step), [uv, "pip", *step[:1], "--python", python, *step[1:]])
                 for step in steps]  # fmt: skip
    for label, command in commands:
        error = _run(label, command, log)
        if error:
            shutil.rmtree(path, ignore_errors=True)
            return _said(Environment(path, "failed", time.perf_counter() - started, error), log)
    compile_on_import(path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" /
                      "site-packages")  # fmt: skip
    stamp.write_text(recipe)
    return _said(Environment(path, "built", time.perf_counter() - started), log)


@dataclass(frozen=True)
class Child:
    """``PYTHON -m MODULE OUT *args`` inside a side environment; ``stem`` names its log and JSON
    (under the caller's log folder), ``label`` says what it does in an error; ``env`` adds to
    its environment."""

    python: Path
    module: str
    args: tuple[str, ...]
    stem: str
    label: str
    env: tuple[tuple[str, str], ...] = ()


def run_child(child: Child, logs: Path, timeout_s: float) -> dict:
    """The child's JSON with ``child_seconds``, or ``{"error": ...}`` naming how it failed, its
    last log line and the log (kept in ``logs``, a folder under build/); it runs as a process
    group (``core.process``)."""
    log, out = logs / f"{child.stem}.log", logs / f"{child.stem}.json"
    for stale in (log, out):
        stale.unlink(missing_ok=True)
    finished = process.run(
        [child.python, "-m", child.module, out, *child.args],
        log,
        timeout_s,
        env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT / "lib"), **dict(child.env)},
    )
    if not finished.ok or not out.exists():
        last = (process.tail(log, 1).strip() or "no output").splitlines()[-1]
        how = (
            f"timed out after {timeout_s:.0f} s"
            if finished.timed_out
            else f"exited with code {finished.returncode}"
        )
        where = log.relative_to(paths.build_dir())
        return {"error": f"{child.label} {how}: {last} (log: build/{where})"}
    return {**json.loads(out.read_text()), "child_seconds": round(finished.seconds, 1)}


def child_workers(count: int) -> int:
    """How many children run at once: one per core, at most ``count``."""
    return max(1, min(count, os.cpu_count() or 1))


def run_children(
    children: Iterable[Child],
    logs: Path,
    timeout_s: float,
    done: Callable[[Child, dict], object] = lambda child, found: None,
) -> list[dict]:
    """Every child run (``child_workers`` at once), each result in the order given; ``done`` is
    called as each one finishes, to show progress. ``children`` may be a generator: each child
    starts as soon as it is given, while the generator prepares the next."""

    def one(child: Child) -> dict:
        found = run_child(child, logs, timeout_s)
        done(child, found)
        return found

    count = len(children) if isinstance(children, Sized) else os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(child_workers(count)) as pool:
        return list(pool.map(one, children))
