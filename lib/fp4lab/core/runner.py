"""Running the notebooks this machine can run, in order, through papermill.

``reproduce`` executes every selected notebook whose needs the machine meets, writes the
executed copy and an HTML export with code hidden to build/ (and ``index.html``, the front
page, by ``fp4lab.report.index``), records every notebook's status
(ran, failed, skipped and why) in data/reproduce.jsonl, and exits non-zero at the end if any
runnable notebook failed. It prints each notebook's start, each cell as it runs (with what the
cell prints) and the notebook's time; a cell that runs past the notebook's ``cell_timeout_s`` is
stopped, the notebook fails naming that cell, and the run goes on to the next notebook. Executed
copies and HTML are written beside their final name and renamed into place, so a reader never
sees half a file. A second run in the same checkout (build/) waits for the first, and says so.
SIGTERM, Ctrl-C, or the death of whatever started the runner (`make`, even
killed by SIGKILL) stops the run: the notebook in progress is recorded as interrupted, and its
kernel, which dies with the runner, takes its own children with it (``core.process``).

    python -m fp4lab.core.runner reproduce [--notebooks 01,05] [--param NAME=VALUE ...] [--no-html]
    python -m fp4lab.core.runner list
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import nbformat

import fp4lab
from fp4lab.core import history, page, paths, process, progress, records
from fp4lab.core.catalog import (
    KERNEL,
    Notebook,
    declared_parameters,
    notebooks,
    parse_parameters,
    plan,
    select,
)


class NotebookFailed(RuntimeError):
    """A notebook stopped: which one, in which cell, and why."""


def _failed_cell(partial: Path) -> str:
    """The first code cell (1-based) the executed copy shows as failed or unfinished, '' if none."""
    if not partial.exists():
        return ""
    code = [c for c in nbformat.read(partial, as_version=4).cells if c.cell_type == "code"]
    for number, cell in enumerate(code, 1):
        status = cell.get("metadata", {}).get("papermill", {}).get("status")
        if status in ("failed", "running") or any(
            o.get("output_type") == "error" for o in cell.outputs
        ):
            return f"cell {number} of {len(code)}"
    return ""


def execute(
    nb: Notebook, out_dir: Path, parameters: dict | None = None, log_output: bool = False
) -> Path:
    """Run one notebook through papermill into ``out_dir`` (each cell stopped after the
    notebook's ``cell_timeout_s``); raises NotebookFailed naming the notebook and the cell, and
    ValueError, before the kernel starts, for a parameter the notebook does not declare."""
    import papermill

    declared = declared_parameters(nb) if parameters else set()
    unknown = sorted(set(parameters or {}) - declared)
    if unknown:
        raise ValueError(
            f"{nb.name} has no parameter {', '.join(unknown)}; allowed values: "
            f"{', '.join(sorted(declared))}"
        )

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / nb.path.name
    partial = out_dir / f".{nb.path.stem}.{os.getpid()}.partial.ipynb"
    try:
        with progress.following():
            papermill.execute_notebook(
                str(nb.path),
                str(partial),
                parameters=parameters or {},
                kernel_name=KERNEL,
                progress_bar=False,
                log_output=log_output,
                execution_timeout=nb.cell_timeout_s,
                cwd=str(nb.path.parent),
            )
    except Exception as exc:
        where = _failed_cell(partial)
        if partial.exists():
            partial.replace(executed)  # the failed copy, to read what happened
        timed_out = "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower()
        why = (
            f"timed out after {nb.cell_timeout_s} s (its cell_timeout_s)"
            if timed_out
            else f"{type(exc).__name__}: {_last_line(exc)}"
        )
        raise NotebookFailed(f"{nb.name}, {where or 'before its first cell'}: {why}") from exc
    partial.replace(executed)
    return executed


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""


def answer_first(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` with its cells tagged ``page.ANSWER`` (in their order) right after its title
    cell: the page opens with the answer, the narrative follows as run."""
    cells = notebook.cells
    tagged = [c for c in cells if page.ANSWER in c.get("metadata", {}).get("tags", [])]
    rest = [c for c in cells[1:] if not any(c is t for t in tagged)]
    notebook.cells = [*cells[:1], *tagged, *rest]
    return notebook


def export_html(executed: Path, out_dir: Path) -> Path:
    """The executed notebook as HTML with code cells hidden, opening with its answer
    (``answer_first``): a report, not a program."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    )
    body, _ = exporter.from_notebook_node(answer_first(nbformat.read(executed, as_version=4)))
    out_dir.mkdir(parents=True, exist_ok=True)
    html = out_dir / executed.with_suffix(".html").name
    partial = out_dir / f".{html.stem}.{os.getpid()}.partial.html"
    partial.write_text(body)
    partial.replace(html)
    return html


INDEX_TIMEOUT_S = 300


def write_index(folder: Path, html_dir: Path) -> str:
    """``index.html`` beside the reports, written by the report package (``fp4lab.report.index``,
    run as a program: the report reads records, core never imports it); '' or why it failed."""
    log = paths.build_dir() / "logs" / "index.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    done = process.run([sys.executable, "-m", "fp4lab.report.index", str(html_dir), str(folder)],
                       log, INDEX_TIMEOUT_S)  # fmt: skip
    return "" if done.ok else f"index.html not written: {process.tail(log, 1).strip()}"


def _record(nb: Notebook, status: str, reason: str, started: float) -> None:
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


def reproduce(
    spec: str = "",
    html: bool = True,
    folder: Path = paths.NOTEBOOKS_DIR,
    parameters: dict | None = None,
    log_output: bool = True,
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
            f"--param {', '.join(sorted(unknown))}: no selected notebook has such a parameter; "
            f"allowed values: {', '.join(allowed)}"
        )
    steps = plan(chosen)
    executed_dir, html_dir = paths.build_dir() / "executed", paths.build_dir() / "html"
    failed = []
    for index, (nb, skip) in enumerate(steps, 1):
        head = (
            f"[{index}/{len(steps)}] {nb.name} (needs {nb.needs}, ~{nb.duration_s} s, "
            f"{nb.cell_timeout_s} s a cell at most)"
        )
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
                log_output=log_output,
            )
            if html:
                export_html(executed, html_dir)
        except NotebookFailed as exc:  # one failing notebook must not stop the others
            status, reason = "failed", str(exc)
            failed.append(nb.name)
        except Exception as exc:
            status, reason = "failed", f"{nb.name}: {type(exc).__name__}: {_last_line(exc)}"
            failed.append(nb.name)
        except (KeyboardInterrupt, SystemExit) as exc:  # recorded, then the run stops
            how = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
            _record(nb, "interrupted", f"{nb.name}: stopped by {how}", started)
            raise
        _record(nb, status, reason, started)
        history.prune(nb.name)  # the run quoted now and any newer stay; git keeps the rest
    index_error = write_index(folder, html_dir) if html else ""
    if index_error:
        print(index_error, file=sys.stderr)
    if failed:
        print(
            f"{len(failed)} runnable notebook(s) failed: {', '.join(failed)}; executed copies in {executed_dir}",
            file=sys.stderr,
        )
    if failed or index_error:
        return 1
    print(f"done: executed notebooks in {executed_dir}" + (f", HTML in {html_dir}" if html else ""))
    return 0


def main(argv: list[str] | None = None, folder: Path = paths.NOTEBOOKS_DIR) -> int:
    fp4lab.setup()  # caches into build/; `make` killed, even by SIGKILL: SIGTERM here
    logging.basicConfig(format="    %(message)s")  # papermill's cell-by-cell progress
    logging.getLogger("papermill").setLevel(logging.INFO)
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.core.runner", description=__doc__.splitlines()[0]
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
        for nb, skip in plan(notebooks(folder)):
            print(
                f"{nb.name:34} needs {nb.needs:9} ~{nb.duration_s:>4} s  {'skip: ' + skip if skip else 'runs here'}"
            )
        return 0
    try:
        with (
            process.sigterm_raises(),
            process.one_run_at_a_time(paths.build_dir() / "reproduce.lock"),
        ):
            return reproduce(
                args.notebooks,
                html=not args.no_html,
                folder=folder,
                parameters=parse_parameters(args.param),
            )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
