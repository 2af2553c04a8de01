"""A function run in a fork of this process: what the process imported is shared (a fork costs no
import), what the function changes is not kept. The fork dies with its parent, is killed at its
timeout, and passes its result back as JSON.

The parent's heap is frozen before each fork (``gc.freeze``, as Python's ``gc`` documentation
advises for a process that forks): a collection in the fork then walks only what the fork made,
not the whole inherited heap of torch and a release (SGLang's graph capture collects twice per
capture). Only the cycle collector skips the frozen objects; reference counting is unchanged.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from fp4lab.core import process


def forked(work: Callable[[], dict], out: Path, timeout_s: float) -> dict:
    """``work()`` in a fork of this process, its dict passed back through ``out`` (JSON); or
    ``{"error": ...}`` saying how the fork ended without one. The fork dies with this process
    and is killed after ``timeout_s``; it leaves by ``os._exit``, so nothing of this process's
    own runs twice. A thread pool of this process is not in the fork (torch's: call
    ``torch.set_num_threads(1)`` in ``work`` first)."""
    out.unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    pid = os.fork()
    if pid == 0:  # the fork
        code = 1
        try:
            process.exit_with_parent(signal.SIGKILL)
            out.write_text(json.dumps(work(), default=str))
            code = 0
        except BaseException:  # its traceback goes to the log; the parent says how it ended
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    ended = os.pidfd_open(pid)  # readable once the fork has ended
    try:
        if not select.select([ended], [], [], timeout_s)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"error": f"the fork timed out after {timeout_s:.0f} s and was killed"}
    finally:
        os.close(ended)
    status = os.waitpid(pid, 0)[1]
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and out.exists():
        return json.loads(out.read_text())
    how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
           else f"exited with code {os.WEXITSTATUS(status)}")  # fmt: skip
    return {"error": f"the fork {how} before writing its result"}
