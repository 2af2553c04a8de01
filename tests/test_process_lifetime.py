"""Nothing fp4lab starts outlives its harness: a descendant in another session or frozen is
stopped at the timeout; a harness, or the runner's parent, killed by SIGKILL takes its children
(servers, kernels, ranks) with it; the runner records the notebook it was running as interrupted."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest

from fp4lab.core import forks, process, records

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals are Linux's")


def _gone(pids: list[int], within_s: float = 15.0) -> list[int]:
    """The pids still alive after ``within_s`` (zombies count as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [p for p in pids if process._alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return left


def _wait_for(path, within_s: float = 120.0) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.1)
    raise AssertionError(f"{path.name} never appeared")


def _kill_row(case: str, left: list[int]) -> dict:
    return {"case": case, "kind": "kill", "clear_error": True, "traceback": False,
            "orphans": len(left), "seconds": 0.0}  # fmt: skip


def test_a_frozen_descendant_in_its_own_session_is_killed_at_the_timeout(tmp_path, reliability):
    """As torchrun does with its ranks: a grandchild in a new session, here frozen by SIGSTOP."""
    pid_file = tmp_path / "rank.pid"
    driver = textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                start_new_session=True)
        os.kill(rank.pid, signal.SIGSTOP)
        open({str(pid_file)!r}, "w").write(str(rank.pid))
        time.sleep(600)
    """)
    finished = process.run([sys.executable, "-c", driver], tmp_path / "driver.log", timeout_s=5)
    rank = int(pid_file.read_text())
    left = _gone([rank], within_s=1)
    reliability(_kill_row("a frozen rank in its own session, at the driver's timeout", left))
    assert finished.timed_out
    assert left == [], "stopped with its driver, although frozen and elsewhere"


def test_children_die_with_a_harness_killed_by_sigkill(tmp_path, reliability):
    pid_file = tmp_path / "server.pid"
    harness = textwrap.dedent(f"""
        import sys, time
        from fp4lab.core import process
        with process.group([sys.executable, "-c", "import time; time.sleep(600)"],
                           {str(tmp_path / "server.log")!r}) as server:
            open({str(pid_file)!r}, "w").write(str(server.pid))
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", harness], start_new_session=True)
    server = int(_wait_for(pid_file))
    proc.kill()
    proc.wait()
    left = _gone([server])
    reliability(_kill_row("SIGKILL to a server's harness", left))
    assert left == [], "the server outlived its harness"


def _notebook(folder, name: str, source: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["fp4lab"] = {"title": name, "needs": "cpu", "duration_s": 60}
    nb.metadata["kernelspec"] = {"name": "fp4lab", "display_name": "fp4lab", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, folder / f"{name}.ipynb")


@pytest.mark.notebook
def test_the_runner_and_its_kernel_stop_when_make_is_killed(
    tmp_path, isolated_outputs, reliability
):
    """`make` killed by SIGKILL (a closed terminal, a CI system): the runner it exec'd stops,
    records the notebook as interrupted, and the kernel and the kernel's child go with it."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    pid_file = tmp_path / "kernel.pid"
    _notebook(folder, "01_long", textwrap.dedent(f"""
        import fp4lab, os, sys, time
        fp4lab.setup()
        from fp4lab.core import process
        child = process.spawn([sys.executable, "-c", "import time; time.sleep(600)"],
                              {str(tmp_path / "child.log")!r})
        open({str(pid_file)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
    """))  # fmt: skip
    run = (
        "from pathlib import Path; from fp4lab.core import runner; "
        f"runner.main(['reproduce'], folder=Path({str(folder)!r}))"
    )
    make = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {run!r}])"],
        start_new_session=True,
        env={**os.environ, "FP4LAB_BUILD_DIR": str(tmp_path / "build")},
    )  # fmt: skip
    kernel, child = (int(p) for p in _wait_for(pid_file).split())
    [runner_pid] = [p for p in process.descendants(make.pid) if p not in (kernel, child)][:1]
    make.kill()
    make.wait()
    left = _gone([runner_pid, kernel, child])
    reliability(_kill_row("SIGKILL to make during a notebook", left))
    assert left == [], "nothing outlives make"
    [row] = [r["values"] for r in records.read("reproduce")]
    assert (row["notebook"], row["status"]) == ("01_long", "interrupted")
    assert row["reason"] == "01_long: stopped by SIGTERM"


def test_torchrun_and_its_ranks_die_with_a_harness_killed_by_sigkill(tmp_path, reliability):
    """torchrun puts each rank in a session of its own: a SIGKILL of the harness (a notebook's
    kernel) still takes torchrun and both ranks with it."""
    rank = tmp_path / "rank.py"
    rank.write_text(
        textwrap.dedent(f"""
        import os, time
        from fp4lab.comm import ranks
        env, _ = ranks.init("gloo")
        open({str(tmp_path)!r} + f"/rank{{env.rank}}.pid", "w").write(str(os.getpid()))
        time.sleep(600)
    """)
    )
    harness = textwrap.dedent(f"""
        from fp4lab.comm import torchrun
        torchrun.run_ranks([{str(rank)!r}], [], 2, 600, {str(tmp_path / "torchrun.log")!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", harness], start_new_session=True)
    ranks = [int(_wait_for(tmp_path / f"rank{r}.pid")) for r in (0, 1)]
    tree = process.descendants(proc.pid)
    assert set(ranks) <= set(tree), "the ranks run under the harness's torchrun"
    proc.kill()
    proc.wait()
    left = _gone(tree)
    reliability(_kill_row("SIGKILL to the harness of torchrun and 2 ranks", left))
    assert left == [], "torchrun or a rank outlived the harness"


def test_a_fork_passes_its_result_back_and_keeps_its_changes_to_itself(tmp_path):
    """``forks.forked``: the fork's dict comes back, what it changed stays in the fork; a fork
    that raises, or outlives its timeout (then killed), says how it ended instead."""
    state = {"patched": False}

    def work() -> dict:
        state["patched"] = True
        return {"pid": os.getpid(), "patched": state["patched"], "frozen": gc.get_freeze_count()}

    gc.unfreeze()
    got = forks.forked(work, tmp_path / "one.json", 30)
    assert got["patched"] is True and got["pid"] != os.getpid()
    assert got["frozen"] > 1000, "the fork's collections skip the heap it inherited"
    gc.unfreeze()
    assert state["patched"] is False, "the fork's change never reached this process"

    def fails() -> dict:
        raise RuntimeError("harness bug")

    assert forks.forked(fails, tmp_path / "two.json", 30) == {
        "error": "the fork exited with code 1 before writing its result"
    }
    started = time.monotonic()
    hung = forks.forked(lambda: time.sleep(60) or {}, tmp_path / "three.json", 1)
    assert hung == {"error": "the fork timed out after 1 s and was killed"}
    assert time.monotonic() - started < 10
