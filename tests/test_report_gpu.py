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
