"""Notebook 07 (MSCCLPP allreduce sweep) through papermill with small parameters; its records checked."""

from __future__ import annotations

import pytest

from browser import exported
from fp4lab.core import probe

pytestmark = pytest.mark.notebook
NAME = "07_mscclpp_allreduce"
SMALL = dict(sizes="1KiB:16KiB", iters=3, warmup=1, timeout_s=120)


@pytest.mark.browser
def test_07_sweeps_gloo_and_records_what_it_skipped(run_notebook, isolated_outputs):
    rows, executed = run_notebook(NAME, backends=["gloo", "mscclpp"], **SMALL)
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r["values"])
        assert (
            r["provenance"]["git"]["commit"]
            and r["provenance"]["packages"]["torch"]
            and r["params"]["sizes"] == "1KiB:16KiB"
        )
    sizes = by_kind["size"]
    assert [s["size"] for s in sizes] == ["1KiB", "2KiB", "4KiB", "8KiB", "16KiB"]
    assert all(
        s["backend"] == "gloo" and s["correct"] and s["max_abs_err"] == 0.0 and s["world_size"] == 2
        for s in sizes
    )
    assert all(
        s["busbw_GBps"] == pytest.approx(s["algbw_GBps"]) and s["median_us"] > 0 for s in sizes
    )
    backends = {b["backend"]: b for b in by_kind["backend"]}
    assert backends["gloo"]["status"] == "ran" and backends["gloo"]["sizes_finished"] == 5
    if not probe.machine().cuda_available:
        assert backends["mscclpp"]["status"] == "skipped" and backends["mscclpp"][
            "reason"
        ].startswith("no CUDA GPU")
        [crossover] = by_kind["crossover"]
        assert crossover["status"] == "skipped" and "mscclpp: no CUDA GPU" in crossover["reason"]
        [summary] = by_kind["summary"]
        assert summary["status"].startswith("not measured here: no CUDA GPU visible to torch")
        assert summary["backends_skipped"][0].startswith("mscclpp (no CUDA GPU")
        assert summary["headline"].startswith("gloo only:") and summary["backends_run"] == ["gloo"]
        assert "SKIPPED: no CUDA GPU" in executed.read_text()
    assert (isolated_outputs / "figures" / "07_allreduce_sweep.png").stat().st_size > 1000
    exported(executed)  # its tables fit the window, no warnings on the page
