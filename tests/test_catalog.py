"""The catalog: selecting notebooks by name, planning by needs, and a reproduce run that survives a failure."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from fp4lab.core import catalog, paths, probe, records, runner


def test_select_by_name_or_number():
    available = catalog.notebooks()
    assert [nb.name for nb in catalog.select("01,00_environment", available)] == [
        "00_environment",
        "01_nvcc_subprocess_crash",
    ]
    assert catalog.select("", available) == available
    assert [nb.name for nb in catalog.select("10,12", available)] == [
        "12_fp4_api_audit",
        "10_decision_report",
    ], "the report, which reads the records, runs after the notebooks that write them"
    assert [nb.name for nb in available][-1] == "10_decision_report"
    with pytest.raises(ValueError, match="NOTEBOOKS is empty; allowed values"):
        catalog.select(",", available)


def test_unknown_notebook_names_the_variable_and_allowed_values():
    with pytest.raises(
        ValueError,
        match=r"NOTEBOOKS contains '99_nope', which is not a notebook; allowed values: 00_environment, ",
    ):
        catalog.select("01,99_nope", catalog.notebooks())


def _machine(gpus: int, sm: tuple[int, int] | None, torch_cuda: str | None = "12.8"):
    return probe.Machine(
        python="3.11", platform="linux", cpu_count=2, packages={}, torch_cuda=torch_cuda,
        cuda_available=gpus > 0, gpu_count=gpus, device_name="NVIDIA H200" if gpus else "cpu",
        sm=sm, nvcc_path=None, nvcc_version=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (_machine(0, None, torch_cuda=None),
         {"gpu": "no CUDA GPU visible to torch (torch is a CPU build)",
          "fp4-gpu": "needs SM100+ (Blackwell); this machine has no CUDA GPU",
          "multi-gpu": "needs 2 or more GPUs; this machine has 0"}),
        (_machine(1, (9, 0)),
         {"gpu": None, "fp4-gpu": "needs SM100+ (Blackwell); this machine has SM90 (NVIDIA H200)",
          "multi-gpu": "needs 2 or more GPUs; this machine has 1"}),
        (_machine(2, (10, 0)), {"gpu": None, "fp4-gpu": None, "multi-gpu": None}),
    ],
)  # fmt: skip
def test_plan_skips_each_need_the_machine_lacks_with_its_reason(machine, expected):
    chosen = [catalog.Notebook(n, None, n, n, 1, "", 120) for n in ("cpu", *expected)]
    planned = catalog.plan(chosen, machine)
    assert [nb for nb, _ in planned] == chosen
    assert dict((nb.needs, reason) for nb, reason in planned) == {"cpu": None, **expected}


def _notebook(folder, name, source, needs="cpu"):
    nb = new_notebook(cells=[new_code_cell(source)])
    nb.metadata["kernelspec"] = {
        "name": catalog.KERNEL,
        "display_name": "fp4lab",
        "language": "python",
    }
    nb.metadata["fp4lab"] = {"title": name, "needs": needs, "duration_s": 1}
    nbformat.write(nb, folder / f"{name}.ipynb")


def test_reproduce_runs_the_rest_after_a_failure_and_reports_it(
    isolated_outputs, monkeypatch, capsys
):
    folder = isolated_outputs / "nbs"
    folder.mkdir()
    _notebook(folder, "01_fails", "raise RuntimeError('deliberate')")
    _notebook(folder, "02_passes", "x = 1")
    _notebook(folder, "03_needs_gpus", "x = 1", needs="multi-gpu")
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(isolated_outputs / "build"))
    assert runner.reproduce("", folder=folder) == 1
    status = {r["values"]["notebook"]: r["values"] for r in records.read("reproduce")}
    assert status["01_fails"]["status"] == "failed" and "deliberate" in status["01_fails"]["reason"]
    assert status["02_passes"]["status"] == "ran"
    if probe.machine().gpu_count < 2:
        assert (
            status["03_needs_gpus"]["status"] == "skipped"
            and "GPUs" in status["03_needs_gpus"]["reason"]
        )
    html = (isolated_outputs / "build" / "html" / "02_passes.html").read_text()
    assert "x = 1" not in html, "code cells are hidden in the HTML export"
    out = capsys.readouterr()
    assert "[1/3] 01_fails" in out.out and "SKIPPED" in out.out and "01_fails" in out.err


def test_cli_rejects_unknown_notebooks_before_running(capsys):
    assert runner.main(["reproduce", "--notebooks", "nope"]) == 2
    assert "allowed values" in capsys.readouterr().err


def test_parameters_are_parsed_and_checked_before_running():
    assert catalog.parse_parameters(["versions=0.6.3,0.7.4", "layers=4", 'backends=["eager"]']) == {
        "versions": "0.6.3,0.7.4",
        "layers": 4,
        "backends": ["eager"],
    }
    with pytest.raises(ValueError, match="must look like NAME=VALUE"):
        catalog.parse_parameters(["versions"])
    with pytest.raises(
        ValueError,
        match=r"--param nope: no selected notebook has such a parameter; allowed values: .*versions",
    ):
        runner.reproduce("09", parameters={"nope": 1})


def test_each_notebooks_declared_duration_covers_its_last_committed_run():
    """No drift: the seconds the last `make reproduce` took stay within each notebook's cell
    timeout (three times its declared duration)."""
    path = paths.COMMITTED_DATA / "reproduce.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    last = {r["values"]["notebook"]: r["values"] for r in rows if r["values"]["status"] == "ran"}
    checked = 0
    for nb in catalog.notebooks():
        if nb.name in last:
            assert last[nb.name]["seconds"] <= nb.cell_timeout_s, (nb.name, last[nb.name])
            checked += 1
    assert checked == len(catalog.notebooks())
