"""Child processes that never outlive their harness: servers, torchrun, benchmark clients.

Every child starts in its own process group (its own session), writes stdout and
stderr to a log file, and is stopped as a whole group together with every descendant it
started in another session (torchrun puts each rank in its own): SIGTERM to all of them, a
grace period, then SIGKILL to whatever is left (a frozen process included), then a check that
none is still alive. ``group`` does that on normal exit, on an exception, on Ctrl-C, and (in
the main thread) on SIGTERM to the harness, which it turns into ``SystemExit`` so cleanup runs.
A SIGKILL of the harness cannot be caught: on Linux every child is started with a parent-death
signal (SIGTERM when the harness dies), and ``exit_with_parent`` gives fp4lab's own processes
(the runner, notebook kernels, ranks) the same. ``one_run_at_a_time`` keeps a second run of a
checkout waiting for the first.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 10.0
"""How long a group gets between SIGTERM and SIGKILL."""

_PROC = Path("/proc")

_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
"""Resolved once here: a child between fork and exec must not load anything."""


def exit_with_parent(sig: signal.Signals = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux: True;
    elsewhere nothing is armed: False)."""
    if _PRCTL is None:
        return False
    _PRCTL(_PR_SET_PDEATHSIG, int(sig))
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _state(pid) not in (None, "Z", "X")


def _stat_fields(pid: int | str) -> list[str] | None:
    """``state ppid pgrp ...`` of a live process, None once it is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:  # the process ended while we looked
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    return stat[stat.rindex(")") + 2 :].split()


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid) if _PROC.is_dir() else None
    return fields[0] if fields else None


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, whatever session it moved to (via /proc; [] without)."""
    if not _PROC.is_dir():
        return []
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        fields = _stat_fields(entry.name) if entry.name.isdigit() else None
        if fields and fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    if not _PROC.is_dir():  # no procfs: ask the kernel whether the group exists at all
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    alive = []
    for entry in _PROC.iterdir():
        fields = _stat_fields(entry.name) if entry.name.isdigit() else None
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(entry.name))
    return sorted(alive)


def _signal_all(pgid: int, others: list[int], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    for pid in others:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _left(pgid: int, others: list[int]) -> list[int]:
    return sorted({*members(pgid), *(pid for pid in others if _alive(pid))})


def _wait_empty(proc: subprocess.Popen, others: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        proc.poll()  # reap the leader as soon as it exits
        if not _left(proc.pid, others):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """Stop the process group led by ``proc`` and every descendant it started in another session
    (SIGTERM, then SIGKILL after ``grace_s``, default GRACE_S; a frozen process is killed then).

    Raises RuntimeError if any of them survives SIGKILL.
    """
    pgid = proc.pid
    others = descendants(pgid)  # before the signal: an orphan no longer shows whose it was
    _signal_all(pgid, others, signal.SIGTERM)
    if not _wait_empty(proc, others, GRACE_S if grace_s is None else grace_s):
        others = sorted({*others, *descendants(pgid)})
        _signal_all(pgid, others, signal.SIGKILL)
        _wait_empty(proc, others, 5.0)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    left = _left(pgid, others)
    if left:
        raise RuntimeError(f"process group {pgid} survived SIGKILL: pids {left}")


def spawn(
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Start ``cmd`` in a new session (its own process group), stdout and stderr appended to ``log_path``."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [str(c) for c in cmd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cwd,
            preexec_fn=_die_with_parent(os.getpid()) if _PRCTL is not None else None,
        )


def _die_with_parent(parent: int):
    """For a child between fork and exec: SIGTERM when the harness dies (even by SIGKILL)."""

    def arm() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the harness died before the signal was armed
            os._exit(1)

    return arm


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While active (main thread only), SIGTERM raises SystemExit so ``finally`` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def group(
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` as a process group for the duration of the block; the group is stopped on any exit."""
    with sigterm_raises():
        proc = spawn(cmd, log_path, env=env, cwd=cwd)
        try:
            yield proc
        finally:
            stop(proc)


@dataclass(frozen=True)
class Finished:
    """How a child process group ended."""

    command: tuple[str, ...]
    pid: int  # also the process group id: every process the command started was in it
    returncode: int | None
    timed_out: bool
    seconds: float
    log_path: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        how = (
            f"timed out after {self.seconds:.0f} s and was stopped"
            if self.timed_out
            else f"exited with code {self.returncode}"
        )
        return f"{Path(self.command[0]).name} {' '.join(self.command[1:3])} ... {how} (log: {self.log_path})"


def run(
    cmd: Sequence[str],
    log_path: Path,
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Finished:
    """Run ``cmd`` to completion or until ``timeout_s``; the group is stopped either way."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds")
    started = time.monotonic()
    with group(cmd, log_path, env=env, cwd=cwd) as proc:
        try:
            returncode, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            returncode, timed_out = None, True
    return Finished(
        tuple(str(c) for c in cmd),
        proc.pid,
        returncode,
        timed_out,
        time.monotonic() - started,
        Path(log_path),
    )


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 256 * 1024))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def one_run_at_a_time(lock: Path) -> Iterator[None]:
    """Hold ``lock`` (an exclusive flock) for the run; a run that finds it held says which pid
    holds it and waits for it to be released."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            print(f"another run in this checkout (pid {held.read().strip() or '?'}) holds {lock}: "
                  "waiting for it to finish", flush=True)  # fmt: skip
            fcntl.flock(held, fcntl.LOCK_EX)
        held.truncate(0)
        held.write(str(os.getpid()))
        held.flush()
        yield
