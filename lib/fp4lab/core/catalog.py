"""Which notebooks exist, what each needs, and running those this machine can run.

Each notebook declares in its metadata ``fp4lab: {title, needs, duration_s, story}``
(as pytorch/tutorials declares hardware and duration per tutorial). ``reproduce``
executes, in order, every notebook whose needs the machine meets, through papermill,
writes the executed copy and an HTML export with code hidden to build/, records every
notebook's status (ran, failed, skipped and why) in data/reproduce.jsonl, and exits
non-zero at the end if any runnable notebook failed.

    python -m fp4lab.core.catalog reproduce [--notebooks 01,05] [--param NAME=VALUE ...] [--no-html]
    python -m fp4lab.core.catalog list
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd

from fp4lab.core import paths, probe, records

KERNEL = "fp4lab"


@dataclass(frozen=True)
class Notebook:
    name: str
    path: Path
    title: str
    needs: str
    duration_s: int
    story: str

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]


def notebooks(folder: Path = paths.NOTEBOOKS_DIR) -> list[Notebook]:
    """Every notebook in ``folder`` with its declared needs, in run order."""
    found = []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        meta = nbformat.read(path, as_version=4).metadata.get("fp4lab", {})
        found.append(
            Notebook(
                path.stem,
                path,
                meta.get("title", path.stem),
                meta.get("needs", "cpu"),
                int(meta.get("duration_s", 60)),
                meta.get("story", ""),
            )
        )
    return found


def select(spec: str, available: list[Notebook]) -> list[Notebook]:
    """Notebooks named in a comma list (full names or their numbers); all when ``spec`` is empty."""
    if not spec.strip():
        return available
    chosen = []
    for word in (w.strip() for w in spec.split(",") if w.strip()):
        match = [nb for nb in available if word in (nb.name, nb.number)]
        if not match:
            allowed = ", ".join(nb.name for nb in available)
            raise ValueError(
                f"NOTEBOOKS contains {word!r}, which is not a notebook; allowed values: {allowed}"
            )
        chosen.extend(nb for nb in match if nb not in chosen)
    return sorted(chosen, key=lambda nb: nb.name)


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


def execute(nb: Notebook, out_dir: Path, parameters: dict | None = None) -> Path:
    """Run one notebook through papermill into ``out_dir``; raises on a failing cell."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / nb.path.name
    papermill.execute_notebook(
        str(nb.path),
        str(executed),
        parameters=parameters or {},
        kernel_name=KERNEL,
        progress_bar=False,
        cwd=str(nb.path.parent),
    )
    return executed


def export_html(executed: Path, out_dir: Path) -> Path:
    """The executed notebook as HTML with code cells hidden: a report, not a program."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    )
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    out_dir.mkdir(parents=True, exist_ok=True)
    html = out_dir / executed.with_suffix(".html").name
    html.write_text(body)
    return html


def reproduce(
    spec: str = "",
    html: bool = True,
    folder: Path = paths.NOTEBOOKS_DIR,
    parameters: dict | None = None,
) -> int:
    """Run every selected notebook the machine can run; 0 when none of them failed.

    ``parameters`` go to each selected notebook that declares them; one that no selected
    notebook declares is an error, raised before anything runs.
    """
    chosen = select(spec, notebooks(folder))
    parameters = parameters or {}
    declared = {nb.name: declared_parameters(nb) for nb in chosen} if parameters else {}
    unknown = set(parameters) - set().union(*declared.values()) if parameters else set()
    if unknown:
        allowed = sorted(set().union(*declared.values()))
        raise ValueError(
            f"--param {', '.join(sorted(unknown))}: no selected notebook has such a parameter; allowed values: {', '.join(allowed)}"
        )
    steps = plan(chosen)
    executed_dir, html_dir = paths.build_dir() / "executed", paths.build_dir() / "html"
    failed = []
    for index, (nb, skip) in enumerate(steps, 1):
        head = f"[{index}/{len(steps)}] {nb.name} (needs {nb.needs}, ~{nb.duration_s} s)"
        if skip:
            print(f"{head}: SKIPPED: {skip}", flush=True)
            records.append(
                "reproduce",
                "notebook",
                {
                    "notebook": nb.name,
                    "needs": nb.needs,
                    "status": "skipped",
                    "reason": skip,
                    "seconds": 0.0,
                },
            )
            continue
        print(f"{head} ...", flush=True)
        started = time.perf_counter()
        status, reason = "ran", ""
        try:
            executed = execute(
                nb,
                executed_dir,
                {k: v for k, v in parameters.items() if k in declared.get(nb.name, ())},
            )
            if html:
                export_html(executed, html_dir)
        except Exception as exc:  # one failing notebook must not stop the others
            status, reason = (
                "failed",
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}",
            )
            failed.append(nb.name)
        seconds = time.perf_counter() - started
        print(f"    {status.upper()} in {seconds:.1f} s {reason}", flush=True)
        records.append(
            "reproduce",
            "notebook",
            {
                "notebook": nb.name,
                "needs": nb.needs,
                "status": status,
                "reason": reason,
                "seconds": round(seconds, 2),
            },
        )
    if failed:
        print(
            f"{len(failed)} runnable notebook(s) failed: {', '.join(failed)}; executed copies in {executed_dir}",
            file=sys.stderr,
        )
        return 1
    print(f"done: executed notebooks in {executed_dir}" + (f", HTML in {html_dir}" if html else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    paths.use_build_caches()
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.core.catalog", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("reproduce", help="run every notebook this machine can run")
    run.add_argument(
        "--notebooks", default="", help="comma list of notebook names or numbers (default: all)"
    )
    run.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a notebook parameter (repeatable)",
    )
    run.add_argument("--no-html", action="store_true", help="skip the HTML export")
    sub.add_parser("list", help="list the notebooks, their needs and whether they run here")
    args = parser.parse_args(argv)
    if args.command == "list":
        for nb, skip in plan(notebooks()):
            print(
                f"{nb.name:34} needs {nb.needs:9} ~{nb.duration_s:>4} s  {'skip: ' + skip if skip else 'runs here'}"
            )
        return 0
    try:
        return reproduce(
            args.notebooks, html=not args.no_html, parameters=parse_parameters(args.param)
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


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


if __name__ == "__main__":
    sys.exit(main())
