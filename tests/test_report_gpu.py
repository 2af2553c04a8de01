"""report.gpu: the committed GPU runs quoted at their evidence level; failures and slow kernels said."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fp4lab.report import gpu


def test_the_committed_h200_run_is_quoted_with_replay_evidence():
    table = gpu.gpu_table()
    if table.empty:
        pytest.skip("no GPU run is committed under data/gpu/")
    rows = {r.notebook: r for r in table.itertuples()}
    tradeoff = rows["04_fullgraph_false_tradeoff"]
    assert "cuda_graph_replay" in tradeoff.evidence and "not run on the target GPU" in (
        tradeoff.evidence
    )
    assert "launch overhead" in tradeoff.result and "capture failed" not in tradeoff.result
    kernels = rows["06_nvfp4_kernels"].result
    assert "equals the reference bit for bit" in kernels and "of device-to-device copy" in kernels


def _copy_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    [source] = [m for m in gpu.machines() if (m / "04_fullgraph_false_tradeoff.jsonl").exists()]
    folder = tmp_path / "gpu" / source.name
    shutil.copytree(source, folder)
    monkeypatch.setattr(gpu, "GPU_DATA", tmp_path / "gpu")
    return folder


def _rewrite(path: Path, change) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(r)) + "\n" for r in rows))


def test_a_failed_capture_and_a_slow_kernel_are_said(tmp_path, monkeypatch):
    if not gpu.machines():
        pytest.skip("no GPU run is committed under data/gpu/")
    folder = _copy_machine(tmp_path, monkeypatch)

    def failed_capture(r: dict) -> dict:
        if r["kind"] == "variant" and r["values"]["variant"] == "compiled_with_breaks":
            r["values"]["cuda_graph_capture"] = "error: RuntimeError: capture"
        return r

    def slow(r: dict) -> dict:
        if r["kind"] == "throughput":
            r["values"]["ratio_to_copy"] = 0.1
        return r

    _rewrite(folder / "04_fullgraph_false_tradeoff.jsonl", failed_capture)
    _rewrite(folder / "06_nvfp4_kernels.jsonl", slow)
    rows = {r.notebook: r.result for r in gpu.gpu_table().itertuples()}
    assert "capture failed or skipped: compiled_with_breaks" in rows["04_fullgraph_false_tradeoff"]
    assert "triton_approx_rcp at 10% (4096x4096) to 10%" in rows["06_nvfp4_kernels"]


def test_without_gpu_runs_the_readme_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "GPU_DATA", tmp_path / "none")
    assert gpu.gpu_findings() == "- No GPU run is committed at this commit (data/gpu/ is empty).\n"


def test_each_breakable_releases_cost_of_a_break_is_quoted_where_a_gpu_run_has_it(
    tmp_path, monkeypatch
):
    if not gpu.machines():
        pytest.skip("no GPU run is committed under data/gpu/")
    folder = _copy_machine(tmp_path, monkeypatch)
    path = folder / "04_fullgraph_false_tradeoff.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert "breakable_break_cost_fit" not in {r["kind"] for r in rows}, "none measured yet"
    before = {r.notebook: r.result for r in gpu.gpu_table().itertuples()}
    assert "per break" not in before["04_fullgraph_false_tradeoff"]
    shape = {"tokens": 1024, "hidden": 4096, "layers": 32}
    fits = [("0.5.16", 41.5, True), ("0.5.23", 38.25, False)]
    with path.open("a") as out:
        for version, cost, equal in fits:
            values = {"sglang_version": version, "us_per_break": cost, **shape,
                      "replays_equal_eager": equal, "evidence": ["cuda_graph_replay"]}  # fmt: skip
            out.write(json.dumps({**rows[-1], "kind": "breakable_break_cost_fit",
                                  "values": values}) + "\n")  # fmt: skip
    after = {r.notebook: r.result for r in gpu.gpu_table().itertuples()}
    assert after["04_fullgraph_false_tradeoff"].endswith(
        "; each release's own breakable capture on a 32-layer stack (1024 tokens, hidden 4096), "
        "µs per break: 0.5.16 41.5, 0.5.23 38.2; replays differing from eager in: 0.5.23"
    )
