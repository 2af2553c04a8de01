"""Which notebooks exist, what each needs, and which of them this machine can run.

Each notebook declares in its metadata ``fp4lab: {title, needs, duration_s, story}``
(as pytorch/tutorials declares hardware and duration per tutorial), and may declare
``cell_timeout_s`` (else derived from ``duration_s``) and ``reads_records: true`` (a report,
run after every notebook that writes records); core.runner executes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd

from fp4lab.core import params, paths, probe, records

KERNEL = "fp4lab"


@dataclass(frozen=True)
class Notebook:
    name: str
    path: Path
    title: str
    needs: str
    duration_s: int
    story: str
    cell_timeout_s: int
    reads_records: bool = False

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]


def cell_timeout_for(duration_s: int) -> int:
    """The time one cell may take before it is stopped as hung: three times the notebook's
    declared duration (a cold cache, a busy machine), and never under two minutes."""
    return max(120, 3 * duration_s)


def notebooks(folder: Path = paths.NOTEBOOKS_DIR) -> list[Notebook]:
    """Every notebook in ``folder`` with its declared needs, in run order: by name, the ones that
    read records (reports) last."""
    found = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        meta = nbformat.read(path, as_version=4).metadata.get("fp4lab", {})
        duration_s = int(meta.get("duration_s", 60))
        found.append(
            Notebook(
                path.stem,
                path,
                meta.get("title", path.stem),
                meta.get("needs", "cpu"),
                duration_s,
                meta.get("story", ""),
                int(meta.get("cell_timeout_s", cell_timeout_for(duration_s))),
                bool(meta.get("reads_records", False)),
            )
        )
    return sorted(found, key=lambda nb: nb.reads_records)


def select(spec: str, available: list[Notebook], name: str = "NOTEBOOKS") -> list[Notebook]:
    """Notebooks named in a comma list (full names or their numbers); all when ``spec`` is empty."""
    if not isinstance(spec, str):
        raise ValueError(f"{name}={spec!r} must be text: a comma list of names or numbers")
    if not spec.strip():
        return available
    chosen = []
    for word in params.items(name, spec):
        match = [nb for nb in available if word in (nb.name, nb.number)]
        if not match:
            allowed = ", ".join(nb.name for nb in available)
            raise ValueError(
                f"{name} contains {word!r}, which is not a notebook; allowed values: {allowed}"
            )
        chosen.extend(nb for nb in match if nb not in chosen)
    return [nb for nb in available if nb in chosen]


def plan(
    chosen: list[Notebook], machine: probe.Machine | None = None
) -> list[tuple[Notebook, str | None]]:
    """Each notebook with the reason it must be skipped here, or None when it can run."""
    machine = machine or probe.machine()
    return [(nb, machine.missing(nb.needs)) for nb in chosen]


def declared_parameters(nb: Notebook) -> set[str]:
    """The names assigned in a notebook's ``parameters`` cell."""
    import papermill

    return set(papermill.inspect_notebook(str(nb.path)))


def parse_parameters(items: list[str]) -> dict:
    """``NAME=VALUE`` pairs; VALUE is read as JSON where it parses (numbers, lists, true), else kept as text."""
    parsed = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(
                f"--param {item!r} must look like NAME=VALUE, e.g. versions=0.6.3,0.7.4"
            )
        try:
            parsed[name] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[name] = raw
    return parsed


def machine_table(machine: probe.Machine) -> pd.DataFrame:
    """What this machine has, one row per fact."""
    m = machine.as_dict()
    rows = [(f"package {k}", v or "not installed") for k, v in m.pop("packages").items()]
    rows += [(k, v) for k, v in m.items()]
    rows.append(("meets needs", ", ".join(n for n in probe.NEEDS if n in machine.capabilities())))
    return pd.DataFrame(rows, columns=["fact", "value"]).set_index("fact")


def plan_table(steps: Iterable[tuple]) -> pd.DataFrame:
    """The reproduce plan: each notebook, what it needs, and whether it runs here or why not."""
    return pd.DataFrame(
        [
            {
                "notebook": nb.name,
                "title": nb.title,
                "needs": nb.needs,
                "about_s": nb.duration_s,
                "runs here": skip is None,
                "skipped because": skip or "",
            }
            for nb, skip in steps
        ]
    ).set_index("notebook")


def record_plan(
    chosen: list[Notebook], machine: probe.Machine, rec: records.Recorder
) -> pd.DataFrame:
    """The plan for ``chosen`` on ``machine`` as a table; the machine, each row and the summary
    (how many run here) are recorded."""
    table = plan_table(plan(chosen, machine))
    rec.add(
        "machine", {"machine": machine.as_dict(), "capabilities": sorted(machine.capabilities())}
    )
    rec.add_all("plan", table.reset_index().to_dict("records"))
    runs = int(table["runs here"].sum())
    rec.summary(
        f"{runs} of {len(table)} notebooks run on this machine",
        verdict="MEASURED",
        number=f"{runs} of {len(table)} notebooks run here",
        why="each notebook declares what it needs; what this machine lacks is skipped and said",
        needs="cpu",
    )
    return table
