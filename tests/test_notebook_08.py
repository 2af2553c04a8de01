"""Notebook 08 (Single Batch Overlap) through papermill with small parameters; its records checked."""

from __future__ import annotations

import pytest

from browser import exported
from fp4lab.serving import compare

pytestmark = pytest.mark.notebook
NAME = "08_single_batch_overlap"
SMALL = dict(scale=64, tokens=256, chunks=[1, 4], iters=15, warmup=3, timeout_s=120)


@pytest.mark.browser
def test_08_runs_the_microbenchmark_and_records_the_serving_skip(run_notebook, isolated_outputs):
    rows, executed = run_notebook(NAME, **SMALL)
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r["values"])
        assert r["provenance"]["git"]["commit"] and r["params"]["chunks"] == [1, 4]
    overlap_rows = by_kind["overlap"]
    assert [r["chunks"] for r in overlap_rows] == [1, 4]
    for r in overlap_rows:
        assert (
            r["max_abs_diff_vs_blocking"] == 0.0
            and r["hidden"] == 96
            and r["world_size"] == 2
            and r["backend"] == "gloo"
        )
        expected = (r["t_compute_ms"] + r["t_comm_ms"] - r["t_overlapped_ms"]) / min(
            r["t_compute_ms"], r["t_comm_ms"]
        )
        assert r["efficiency"] == pytest.approx(expected)
    [summary] = by_kind["summary"]
    assert "overlap efficiency" in summary["headline"] and "1-chunk control" in summary["headline"]
    skip = compare.unavailable()
    if skip:
        assert by_kind["server"] == [{"status": "skipped", "reason": skip}]
        assert summary["status"] == f"microbenchmark only; serving comparison not run: {skip}"
        assert summary["verdict"] == "UNMEASURED" and skip in summary["why"]
        assert "serving comparison: SKIPPED" in executed.read_text()
    assert (isolated_outputs / "figures" / "08_overlap_microbenchmark.png").stat().st_size > 1000
    exported(executed)  # its tables fit the window, no warnings on the page
