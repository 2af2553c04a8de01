"""Progress of long work: on the terminal and in the build log, never on a notebook's page.

A notebook's page shows its answer; what a run is doing meanwhile (each replay as it ends, each
environment step) goes to the terminal that runs it (a kernel's own stderr, which ``make
reproduce`` shows) and to ``build/logs/progress.log``.
"""

from __future__ import annotations

import sys
import time

from fp4lab.core import paths


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (its stdout and stderr are a page's output)."""
    return "ipykernel" in sys.modules


def say(line: str) -> None:
    """``line`` on the terminal (a kernel's own stderr, never its page) and in the build log."""
    log = paths.build_dir() / "logs" / "progress.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
    print(line, file=sys.__stderr__ if in_kernel() else sys.stdout, flush=True)
