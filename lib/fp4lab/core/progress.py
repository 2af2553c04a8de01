"""Progress of long work: on the terminal and in the build log, never on a notebook's page.

A notebook's page shows its answer; what a run is doing meanwhile (each replay as it ends) goes to
``build/logs/progress.log``. Outside a notebook it is printed too; inside one (a Jupyter kernel
forwards even its process's own stdout and stderr to the page) it is not, and ``make
reproduce``'s runner, which runs the notebook, prints the log's new lines on its terminal as they
come (``following``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from fp4lab.core import paths


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (its stdout and stderr are a page's output)."""
    return "ipykernel" in sys.modules


def log() -> Path:
    """The build log of progress lines."""
    return paths.build_dir() / "logs" / "progress.log"


def say(line: str) -> None:
    """``line`` in the build log, and printed unless this process is a kernel."""
    path = log()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
    if not in_kernel():
        print(line, flush=True)


@contextlib.contextmanager
def following(prefix: str = "    ", every_s: float = 1.0) -> Iterator[None]:
    """While the block runs, the log's new lines printed here as they come (a notebook's
    progress on the terminal of the runner that runs it)."""
    path = log()
    start = path.stat().st_size if path.exists() else 0
    done = threading.Event()

    def follow() -> None:
        nonlocal start
        while True:
            stop = done.wait(every_s)
            if path.exists() and path.stat().st_size > start:
                with path.open() as found:
                    found.seek(start)
                    text = found.read()
                    start = found.tell()
                for line in text.splitlines():
                    print(f"{prefix}{line}", flush=True)
            if stop:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
