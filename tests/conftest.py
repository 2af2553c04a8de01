"""Shared fixtures: an isolated data/figures folder per test, and running a notebook through papermill."""

from __future__ import annotations

from pathlib import Path

import pytest

import fp4lab

fp4lab.setup()  # caches into build/ before torch is imported by any test module

from fp4lab.core import catalog, records, runner  # noqa: E402


@pytest.fixture
def isolated_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point records and figures at a temporary folder; the repository's data/ is never touched."""
    monkeypatch.setenv("FP4LAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FP4LAB_FIGURES_DIR", str(tmp_path / "figures"))
    return tmp_path


@pytest.fixture
def run_notebook(isolated_outputs: Path):
    """Execute notebooks/<name>.ipynb with parameters; returns (records of that notebook, executed path)."""

    def run(name: str, **parameters: object) -> tuple[list[dict], Path]:
        (nb,) = [n for n in catalog.notebooks() if n.name == name]
        executed = runner.execute(nb, isolated_outputs / "executed", parameters)
        return records.read(name), executed

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests are skipped, visibly and with the reason, where torch sees no CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
