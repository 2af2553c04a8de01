"""Shared fixtures: an isolated data/figures folder per test, and running a notebook through papermill."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

import fp4lab

WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""The pytest-xdist worker this process is, if any: each has a build folder of its own
(environments, logs, kept replays) under the shared one's test-workers/; all share the uv cache."""
if WORKER:
    SHARED = Path(os.environ.get("FP4LAB_BUILD_DIR", Path(__file__).parents[1] / "build"))
    os.environ["FP4LAB_BUILD_DIR"] = str(SHARED / "test-workers" / WORKER)
fp4lab.setup()  # caches into build/ before torch is imported by any test module

from fp4lab.core import catalog, paths, records, runner  # noqa: E402


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


HEAVY = ("notebook", "serving", "environments", "bundle")
"""Markers of the tests that run for minutes: the files with most of them go to the workers first
(``make test`` keeps this order: ``--no-loadscope-reorder``), so that no worker is left with a
long file at the end while the others wait."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with most heavy tests (``HEAVY``) first, each file's tests kept in order; GPU tests
    are skipped, visibly and with the reason, where torch sees no CUDA GPU."""
    import torch

    heavy = Counter(item.path for item in items if any(m in item.keywords for m in HEAVY))
    items.sort(key=lambda item: -heavy[item.path])
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


RELIABILITY: list[dict] = []
"""Rows of the reliability table: one per bad input tried and per kill survived."""


@pytest.fixture
def reliability(request: pytest.FixtureRequest):
    """Add a row to the reliability table ``make test`` prints at its end (and keeps in
    build/test/reliability.json): ``case``, ``kind`` (bad input, kill), ``clear_error``,
    ``traceback``, ``orphans``, ``seconds``. The row travels with the test's report, so that
    the session that prints the table gets it from any worker."""
    return lambda row: request.node.user_properties.append(("reliability", row))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each reliability row, from the report of the test that added it (``reliability``)."""
    if report.when == "call":
        RELIABILITY.extend(row for name, row in report.user_properties if name == "reliability")


def invalid_record_lines() -> int:
    """Lines of the committed data/ that are not one JSON record each."""
    bad = 0
    for path in paths.COMMITTED_DATA.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                bad += not isinstance(json.loads(line), dict)
            except json.JSONDecodeError:
                bad += 1
    return bad


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RELIABILITY:
        return
    bad = [r for r in RELIABILITY if r["kind"] == "bad input"]
    kills = [r for r in RELIABILITY if r["kind"] == "kill"]
    table = {
        "bad inputs tried": len(bad),
        "named errors (no traceback)": sum(r["clear_error"] and not r["traceback"] for r in bad),
        "slowest named error (s)": round(max((r["seconds"] for r in bad), default=0.0), 1),
        "kills tried": len(kills),
        "kills survived (nothing left)": sum(r["orphans"] == 0 for r in kills),
        "orphans": sum(r["orphans"] for r in kills),
        "invalid lines in data/": invalid_record_lines(),
    }
    terminalreporter.section("reliability")
    for name, value in table.items():
        terminalreporter.write_line(f"{name:32} {value}")
    out = paths.build_dir() / "test" / "reliability.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"table": table, "rows": RELIABILITY}, indent=1))
