"""Notebooks 00-05 and the decision report executed through papermill with small parameters.

The story notebooks run once into one temporary data folder (as `make reproduce` runs them),
then each test checks the records its notebook wrote; the decision report is rendered from
those records, exported to HTML and opened in headless Chromium.
"""

from __future__ import annotations

import os
import shutil

import pytest
from papermill.exceptions import PapermillExecutionError

from fp4lab.core import catalog, paths, records, runner

pytestmark = pytest.mark.notebook
SMALL = dict(tokens=16, hidden=64, heads=2, ffn=128)
RUNS = {
    "00_environment": {},
    "01_nvcc_subprocess_crash": SMALL,
    "02_file_io_trace": SMALL,
    "03_compiler_disable_fullgraph": SMALL,
    "04_fullgraph_false_tradeoff": dict(
        scale=64, layers=2, tokens=16, backend="eager", warmup=1, iters=3
    ),
    "05_custom_op_fix": dict(backends=["eager"], layers=1, **SMALL),
    "10_decision_report": {},
}


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """Run the story notebooks and the report once; yields the folder holding data/, figures/, executed/, html/."""
    folder = tmp_path_factory.mktemp("story")
    patch = pytest.MonkeyPatch()
    patch.setenv("FP4LAB_DATA_DIR", str(folder / "data"))
    patch.setenv("FP4LAB_FIGURES_DIR", str(folder / "figures"))
    notebooks = {nb.name: nb for nb in catalog.notebooks()}
    for name, parameters in RUNS.items():
        executed = runner.execute(notebooks[name], folder / "executed", parameters)
    runner.export_html(executed, folder / "html")
    yield folder
    patch.undo()


def _values(name: str, kind: str | None = None) -> list[dict]:
    return [r["values"] for r in records.read(name) if kind in (None, r["kind"])]


def test_00_environment(story):
    assert len(_values("00_environment", "machine")) == 1
    plan = {v["notebook"]: v for v in _values("00_environment", "plan")}
    assert len(plan) >= 6 and plan["01_nvcc_subprocess_crash"]["runs here"] is True


def test_01_reproduces_the_nvcc_subprocess_crash(story):
    rows = records.read("01_nvcc_subprocess_crash")
    assert len(rows) == 2
    for r in rows:
        v = r["values"]
        assert (v["signature"], v["exception"], v["shows_nvcc_query"]) == (
            "subprocess",
            "torch._dynamo.exc.Unsupported",
            True,
        )
        assert v["blocker_frame"].startswith("flashinfer/jit/cpp_ext.py:")
        assert any(f.startswith("<stdlib>/subprocess.py:") for f in v["frames"])
        assert r["provenance"]["target_sm"] == "12.0"
    with_home = rows[1]["values"]
    assert with_home["cuda_home"] and ":get_cuda_version" in with_home["blocker_frame"]
    assert "check_output" in (story / "executed" / "01_nvcc_subprocess_crash.ipynb").read_text()


def test_02_walks_the_chain_to_file_io(story):
    steps = _values("02_file_io_trace", "chain_step")
    assert steps[-1]["signature"] == "file_io"
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert "patch_cuda_version" in [s["stage"] for s in steps]
    [verdict] = _values("02_file_io_trace", "verdict")
    assert verdict["signature"] == verdict["expected_signature"] == "file_io"


def test_03_reproduces_the_compiler_disable_rejection(story):
    [v] = _values("03_compiler_disable_fullgraph")
    assert v["signature"] == "compiler_disable_under_fullgraph"
    assert v["message"] == "Skip calling `torch.compiler.disable()`d function"


def test_04_measures_the_tradeoff(story):
    variants = {v["variant"]: v for v in _values("04_fullgraph_false_tradeoff", "variant")}
    assert set(variants) == {"eager", "compiled_with_breaks", "compiled_fullgraph_custom_op"}
    assert variants["compiled_fullgraph_custom_op"]["graph_calls"] == 1
    assert (
        variants["compiled_with_breaks"]["graph_calls"] >= 4
        and variants["compiled_with_breaks"]["graph_break_count"] >= 1
    )
    assert all(v["matches_eager"] for v in variants.values()), "the eager backend runs the same ops"
    assert all(v["step_median_ms"] > 0 for v in variants.values())
    assert (story / "figures" / "04_fullgraph_tradeoff.png").stat().st_size > 1000
    assert (story / "figures" / "04_fullgraph_tradeoff.json").exists()


def test_05_the_fix_compiles_to_one_graph(story):
    by_kind = {r["kind"]: r["values"] for r in records.read("05_custom_op_fix")}
    assert set(by_kind["opcheck"].values()) >= {"SUCCESS"}
    fix = by_kind["fix"]
    assert (
        fix["signature"],
        fix["graph_count"],
        fix["graph_break_count"],
        fix["bit_equal_to_eager"],
    ) == ("ok", 1, 0, True)
    assert "upstream_op" in by_kind


def test_10_report_decides_from_the_records(story):
    html = (story / "html" / "10_decision_report.html").read_text()
    assert (
        "UNBLOCKED with a custom op" in html
        and "BLOCKED (torch.compile incompatible with FP4 JIT)" in html
    )
    assert "3/3 story crashes reproduced" in html
    breaks = next(
        v
        for v in _values("04_fullgraph_false_tradeoff", "variant")
        if v["variant"] == "compiled_with_breaks"
    )
    assert f"fullgraph=False: {breaks['graph_calls']} graph runs/step for 2 layers" in html, (
        "the report quotes this run's records"
    )


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("CI"):
        pytest.fail("CI must install Debian's chromium (.ci/run does) to check the rendered report")
    return found


@pytest.mark.browser
def test_10_report_renders_in_headless_chromium(story):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("chromium is not installed on this machine (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    shot = paths.build_dir() / "test" / "10_decision_report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto((story / "html" / "10_decision_report.html").as_uri())
            page.screenshot(path=str(shot), full_page=True)
            tables = page.evaluate(
                "() => [...document.querySelectorAll('table')].map(t => t.rows.length)"
            )
            images = page.evaluate(
                "() => [...document.images].map(i => i.complete && i.naturalWidth)"
            )
            text = page.inner_text("body")
        finally:
            browser.close()
    assert len(tables) >= 4 and all(rows >= 2 for rows in tables), tables
    assert images and all(width and width > 100 for width in images), images
    assert "Piecewise CUDA graphs" in text and "Single Batch Overlap" in text
    assert shot.stat().st_size > 20_000


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("01_nvcc_subprocess_crash", {"backend": "tvm"}, "backend='tvm' is not allowed"),
        ("02_file_io_trace", {"target_sm": "12.5"}, "target_sm='12.5' is not a known SM"),
        ("03_compiler_disable_fullgraph", {"ffn": 100}, "ffn=100 must be a multiple of 16"),
        ("04_fullgraph_false_tradeoff", {"scale": 3}, "scale=3 is not allowed"),
        ("05_custom_op_fix", {"tokens": 0}, "tokens=0 must be a positive integer"),
        ("00_environment", {"notebooks": "42"}, "NOTEBOOKS contains '42'"),
        ("10_decision_report", {"show_provenance": "yes"}, "show_provenance='yes' is not allowed"),
    ],
)
def test_bad_parameters_fail_in_the_validation_cell(run_notebook, name, bad, message):
    with pytest.raises(PapermillExecutionError, match=message) as failure:
        run_notebook(name, **bad)
    assert failure.value.cell_index <= 3, (
        "the error comes from the validation cell, before heavy work"
    )
