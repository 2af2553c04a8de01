"""core.runner: a hung cell stops at the notebook's cell timeout with the notebook and the cell
named, the run goes on to the next notebook, and nothing half-written is left in place."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import nbformat
import pytest

from fp4lab.core import page, paths, process, records, runner


def _notebook(folder, name: str, source: str, **meta) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["fp4lab"] = {"title": name, "needs": "cpu", "duration_s": 1, **meta}
    nb.metadata["kernelspec"] = {"name": "fp4lab", "display_name": "fp4lab", "language": "python"}
    parameters = nbformat.v4.new_code_cell("x = 1")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, folder / f"{name}.ipynb")


def test_a_hung_cell_stops_at_its_timeout_and_the_run_goes_on(
    tmp_path, isolated_outputs, monkeypatch
):
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(tmp_path / "build"))
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder, "01_hangs", "import time\ntime.sleep(600)", cell_timeout_s=5)
    _notebook(folder, "02_runs", "print('after the hung one')")
    started = time.monotonic()
    assert runner.reproduce(folder=folder, html=True) == 1
    assert time.monotonic() - started < 120, "the hung cell was not stopped at its timeout"
    rows = {r["values"]["notebook"]: r["values"] for r in records.read("reproduce")}
    assert rows["01_hangs"]["status"] == "failed"
    assert rows["01_hangs"]["reason"] == (
        "01_hangs, cell 2 of 2: timed out after 5 s (its cell_timeout_s)"
    )
    assert rows["02_runs"]["status"] == "ran"
    executed = tmp_path / "build" / "executed"
    assert sorted(p.name for p in executed.iterdir()) == ["01_hangs.ipynb", "02_runs.ipynb"]
    html = tmp_path / "build" / "html"
    assert sorted(p.name for p in html.iterdir()) == ["02_runs.html", "index.html"], (
        "no partial file is left"
    )
    index = (html / "index.html").read_text()
    no_verdict = "<td><strong></strong></td><td></td><td></td>"
    assert (
        f'<td><a href="02_runs.html">02_runs</a></td><td>02_runs</td>{no_verdict}<td>ran</td>'
        in index
    )
    assert f"<td>01_hangs</td><td>01_hangs</td>{no_verdict}<td>failed</td>" in index, "not linked"
    assert "timed out after 5 s (its cell_timeout_s)" in index


def test_a_second_run_in_the_same_checkout_waits_for_the_first_and_says_so(
    tmp_path, isolated_outputs
):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder, "01_quick", "print('ran')")
    build = tmp_path / "build"
    code = (
        "from pathlib import Path; from fp4lab.core import runner; "
        f"raise SystemExit(runner.main(['reproduce', '--no-html'], folder=Path({str(folder)!r})))"
    )
    with process.one_run_at_a_time(build / "reproduce.lock"):
        second = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "FP4LAB_BUILD_DIR": str(build)},
        )
        first_line = second.stdout.readline()
        assert first_line == (
            f"another run in this checkout (pid {os.getpid()}) holds {build / 'reproduce.lock'}: "
            "waiting for it to finish\n"
        )
        assert second.poll() is None, "it waits while the first run holds the lock"
    assert second.wait(timeout=120) == 0
    assert "[1/1] 01_quick" in second.stdout.read()


def test_a_parameter_the_notebook_does_not_declare_is_refused_before_its_kernel_starts(
    tmp_path, isolated_outputs
):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder, "01_one", "print(x)")
    (nb,) = runner.notebooks(folder)
    with pytest.raises(ValueError, match=r"^01_one has no parameter tokenz; allowed values: x$"):
        runner.execute(nb, tmp_path / "executed", {"tokenz": 3})
    assert not (tmp_path / "executed").exists()


def test_papermill_by_hand_refuses_a_parameter_the_notebook_does_not_declare(tmp_path):
    """The README's route (papermill run by hand) on notebook 01: fp4lab.setup() in the cell
    after the parameters names the undeclared one and the declared ones, and the run fails."""
    notebook = paths.NOTEBOOKS_DIR / "01_nvcc_subprocess_crash.ipynb"
    out = tmp_path / "01.ipynb"
    done = subprocess.run(
        [sys.executable, "-m", "papermill", str(notebook), str(out), "-k", "fp4lab",
         "-p", "tokenz", "64", "--cwd", str(notebook.parent)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout[-2000:]
    error = [o for c in nbformat.read(out, 4).cells for o in c.get("outputs", [])
             if o.get("output_type") == "error"]  # fmt: skip
    assert error and error[0]["ename"] == "ValueError", error
    assert error[0]["evalue"].startswith("this notebook has no parameter tokenz; allowed values: ")


def test_the_injected_cell_is_read_against_the_parameters_cell_before_it():
    from fp4lab.core import injected

    history = [
        "",
        "tokens = 16  # one\nsms = ['12.0']",
        "# Parameters\ntokenz = 64\nsms = ['9.0']\n",
    ]
    assert injected.undeclared(history) == (["tokenz"], ["sms", "tokens"])
    assert injected.undeclared([*history[:2], "# Parameters\ntokens = 8\n"]) == (
        [],
        ["sms", "tokens"],
    )
    assert injected.undeclared(history[:2]) == ([], []), "no papermill: nothing to check"


def test_the_page_opens_with_the_cells_tagged_answer_and_the_notebook_keeps_its_order():
    cells = [nbformat.v4.new_markdown_cell("# title"), nbformat.v4.new_code_cell("measure()"),
             nbformat.v4.new_markdown_cell("## Verdict"), nbformat.v4.new_code_cell("verdict()"),
             nbformat.v4.new_code_cell("figure()")]  # fmt: skip
    for cell in cells[2:4]:
        cell.metadata["tags"] = [page.ANSWER]
    notebook = nbformat.v4.new_notebook(cells=cells)
    shown = runner.answer_first(nbformat.from_dict(notebook))
    assert [c.source for c in shown.cells] == ["# title", "## Verdict", "verdict()", "measure()",
                                               "figure()"]  # fmt: skip
    untagged = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"),
                                               nbformat.v4.new_code_cell("x")])  # fmt: skip
    assert [c.source for c in runner.answer_first(untagged).cells] == ["# t", "x"]
