"""core.venvs: side environments built by uv from one shared cache, reused by recipe, failures
returned and cleaned, files hardlinked from the cache and counted once; children run inside them,
several at once, their JSON read or their failure named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from importlib import metadata

import pytest

from fp4lab.core import paths, venvs


@pytest.mark.environments
def test_built_then_reused_while_the_recipe_is_the_same(tmp_path):
    path = tmp_path / "env"
    first = venvs.ensure(path, [["list"]])
    assert first.status == "built" and first.python.exists() and first.bytes > 0
    assert venvs.ensure(path, [["list"]]).status == "reused"
    assert venvs.ensure(path, [["list"], ["freeze"]]).status == "built", "a new recipe rebuilds"
    assert "$ " in (tmp_path / "env.build.log").read_text(), "uv's commands and output are logged"


@pytest.mark.environments
def test_a_failing_step_is_returned_with_uvs_words_and_leaves_nothing(tmp_path):
    path = tmp_path / "env"
    env = venvs.ensure(path, [["install", "--no-index", "no-such-package-fp4lab"]])
    assert env.status == "failed" and env.bytes == 0
    assert env.error.startswith("uv pip install --no-index no-such-package-fp4lab failed: ")
    assert "no-such-package-fp4lab" in env.error.split("failed: ", 1)[1]
    assert not path.exists()


@pytest.mark.environments
def test_environments_share_the_caches_bytes_and_are_counted_once(tmp_path):
    first = venvs.ensure(tmp_path / "a", [["install", "six==1.17.0"]])
    second = venvs.ensure(tmp_path / "b", [["install", "six==1.17.0"]])
    assert first.status == second.status == "built", first.error or second.error
    (six,) = (tmp_path / "b").glob("lib/python*/site-packages/six.py")
    assert six.stat().st_nlink >= 2, "installed as a hardlink into uv's cache, not a copy"
    assert second.own_bytes < second.bytes
    both = paths.disk_bytes(tmp_path)
    assert both < first.bytes + second.bytes, "a file linked twice is counted once"


@pytest.mark.environments
def test_an_environment_compiles_what_it_imports_once_whatever_pythondontwritebytecode_says(
    tmp_path,
):
    env = venvs.ensure(tmp_path / "env", [["install", "six==1.17.0"]])
    assert env.status == "built", env.error
    (site,) = (tmp_path / "env").glob("lib/python*/site-packages")
    assert not list(site.rglob("*.pyc")), "nothing is compiled at install"
    quiet = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([env.python, "-c", "import six"], env=quiet, check=True)
    assert [p.name.split(".")[0] for p in site.glob("__pycache__/*.pyc")] == ["six"]
    (site / venvs.BYTECODE[0]).unlink()  # the same environment without the file writes nothing
    shutil.rmtree(site / "__pycache__")
    subprocess.run([env.python, "-c", "import six"], env=quiet, check=True)
    assert not list(site.rglob("*.pyc"))


def test_side_environments_get_the_main_environments_torch():
    assert venvs.torch_requirement() == f"torch=={metadata.version('torch')}"


FAKE_PYTHON = """#!/bin/sh
# python -m MODULE OUT MODE: a stand-in interpreter to inject each way a child can end
out=$3
case "$4" in
  fail) echo "the child's last words"; exit 3 ;;
  hang) sleep 60 ;;
  silent) exit 0 ;;
esac
start=$(date +%s.%N); sleep 0.5
printf '{"mode": "%s", "start": %s, "end": %s}' "$4" "$start" "$(date +%s.%N)" > "$out"
"""


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(tmp_path))
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return python


def _child(python, mode):
    return venvs.Child(python, "some.module", (mode,), f"child-{mode}", f"run {mode}")


def test_children_give_their_json_in_order_or_a_named_failure(fake_python, tmp_path):
    logs = tmp_path / "logs"
    seen = []
    found = venvs.run_children(
        [_child(fake_python, m) for m in ("a", "fail", "silent", "hang", "b")],
        logs,
        timeout_s=3,
        done=lambda child, result: seen.append(child.args[0]),
    )
    assert [f.get("mode") for f in found] == ["a", None, None, None, "b"]
    assert found[0]["child_seconds"] >= 0.5
    assert found[1] == {
        "error": "run fail exited with code 3: the child's last words (log: build/logs/child-fail.log)"
    }
    assert found[2]["error"].startswith("run silent exited with code 0: no output")
    assert found[3]["error"].startswith("run hang timed out after 3 s: no output")
    assert sorted(seen) == ["a", "b", "fail", "hang", "silent"], "progress for every child"
    assert json.loads((logs / "child-a.json").read_text())["mode"] == "a"


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: children run one at a time")
def test_children_run_side_by_side_where_there_are_cores(fake_python, tmp_path):
    assert venvs.child_workers(5) == min(5, os.cpu_count())
    a, b = venvs.run_children([_child(fake_python, m) for m in "ab"], tmp_path / "logs", 30)
    assert a["start"] < b["end"] and b["start"] < a["end"], "their run times overlap"


@pytest.mark.environments
@pytest.mark.parametrize("notebook", [False, True])
def test_uvs_output_stays_out_of_a_notebook_which_gets_one_line(tmp_path, capsys, monkeypatch,
                                                                  notebook):  # fmt: skip
    """uv's lines go to the build log only, so no terminal or exported report holds a package
    list; outside a notebook one stderr line names each step. One line says what came of it."""
    monkeypatch.setattr(venvs.progress, "in_kernel", lambda: notebook)
    built = venvs.ensure(tmp_path / "env", [["list"]])
    said = capsys.readouterr()
    assert said.out == (
        f"[env] {tmp_path / 'env'}: built in {built.seconds:.0f} s, "
        f"{built.own_bytes / 2**20:.0f} MiB of its own (log: {tmp_path / 'env.build.log'})\n"
    )
    steps = [] if notebook else ["[env] uv venv", "[env] uv pip list"]
    assert said.err.splitlines() == steps, "one line per step outside notebooks, no uv lines"
    assert "$ " in (tmp_path / "env.build.log").read_text(), "and in the log either way"
    venvs.ensure(tmp_path / "env", [["list"]])
    assert capsys.readouterr().out.startswith(f"[env] {tmp_path / 'env'}: reused in 0 s, ")
    install = ["install", "--no-deps", "numpy==2.3.1", "orjson", "psutil", "pyzmq>=25.1.2"]
    assert (
        venvs.step_label(install)
        == "uv pip install --no-deps numpy==2.3.1 orjson psutil and 1 more"
    )


def test_progress_goes_to_the_terminal_and_the_build_log_never_a_page(monkeypatch, capsys):
    """Outside a kernel a progress line is printed; inside one (whose stdout and stderr, even
    its process's own, are its page) it is only in the build log, which the runner of the
    notebook follows onto its terminal."""
    from fp4lab.core import progress

    progress.say("replay 1 of 2")
    assert capsys.readouterr().out == "replay 1 of 2\n"
    with progress.following(prefix="> ", every_s=0.05):
        monkeypatch.setattr(progress, "in_kernel", lambda: True)
        progress.say("replay 2 of 2")
        time.sleep(0.3)
        monkeypatch.setattr(progress, "in_kernel", lambda: False)
    followed = capsys.readouterr().out
    assert followed.startswith("> ") and followed.rstrip().endswith(" replay 2 of 2")
    assert followed.count("replay 2 of 2") == 1, "printed by the follower alone"
    assert progress.log().read_text().splitlines()[-1].endswith(" replay 2 of 2")
