"""Results as JSON lines with provenance: the only hand-off between notebooks.

One line per result in ``data/<notebook>.jsonl``::

    {"notebook", "kind", "run_id", "values": {...}, "params": {...}, "provenance": {...}}

Provenance holds package versions, device and SM, the target SM and whether it was
simulated, the git commit (and whether the tree was dirty), and the UTC time. Appends
are one ``write`` on an ``O_APPEND`` descriptor under an exclusive lock, so concurrent
writers never interleave and a crash never leaves half a line behind.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import functools
import json
import math
import os
import re
import subprocess
import uuid
from pathlib import Path

import pandas as pd

from fp4lab import __version__
from fp4lab.core import evidence, paths, probe

RUN_ID = os.environ.get("FP4LAB_RUN_ID") or uuid.uuid4().hex[:12]
"""Identifies one execution (one notebook kernel, one benchmark process)."""


BUNDLE_GIT_FILE = "GIT_STATE.json"
"""Written into an offline bundle's source folder: the commit it was built from (no .git there)."""


@functools.cache
def git_state() -> dict:
    """The commit of the checkout and whether it had uncommitted changes outside data/; in an
    offline bundle, the state of the checkout it was built from (``"from": "bundle"``)."""
    stamped = paths.REPO_ROOT / BUNDLE_GIT_FILE
    if stamped.exists():
        return {**json.loads(stamped.read_text()), "from": "bundle"}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--", ".", ":(exclude)data", ":(exclude)figures")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def provenance(target: dict | None = None, packages: dict | None = None) -> dict:
    """Everything a number depends on besides its parameters.

    ``target`` ({"sm", "simulated"}) and ``packages`` override what this process sees, for
    numbers made elsewhere (a child process in another environment) or earlier (inside a
    simulation that has ended).
    """
    m = probe.machine()
    target = target or probe.target()
    return {
        "fp4lab": __version__,
        "python": m.python,
        "packages": {**m.packages, **(packages or {})},
        "torch_cuda": m.torch_cuda,
        "device": m.device_name,
        "gpu_count": m.gpu_count,
        "sm": f"{m.sm[0]}.{m.sm[1]}" if m.sm else None,
        "target_sm": target["sm"],
        "simulated": target["simulated"],
        "git": git_state(),
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "run_id": RUN_ID,
    }


def _jsonable(value: object) -> object:
    if hasattr(value, "tolist"):  # numpy and torch scalars/arrays
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot record a value of type {type(value).__name__}")


SITE_PACKAGES = re.compile(r"(?:/[^\s'\"():]+)*/(?:site|dist)-packages/")
"""An installed package's folder, up to and including ``site-packages/``."""

CHECKOUT = re.compile(r"(?:/[^\s'\"():/]+)+/(?=(?:lib/fp4lab|build)/)")
"""The folder of a checkout of this project (any machine's), before its ``lib/fp4lab/`` or
``build/``."""


def portable(value: object, where: str = "", non_finite: dict | None = None) -> object:
    """``value`` as strict JSON that names no folder of this machine: NaN and infinities become
    null (each noted in ``non_finite``, by its place, as ``NaN``, ``Infinity`` or
    ``-Infinity``); in strings, an installed package's path is written from its package root,
    and paths in the build folder or the repository relative to the repository."""
    if isinstance(value, float) and not math.isfinite(value):
        if non_finite is not None:
            non_finite[where] = (
                "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            )
        return None
    if isinstance(value, str):  # the build folder in use first: it may lie deeper (a test worker's)
        build, repo = str(paths.build_dir()), str(paths.REPO_ROOT)
        value = SITE_PACKAGES.sub("", value).replace(f"{build}/", "build/").replace(build, "build")
        return CHECKOUT.sub("", value).replace(f"{repo}/", "./").replace(repo, ".")
    if isinstance(value, dict):
        return {k: portable(v, f"{where}.{k}".lstrip("."), non_finite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, f"{where}[{i}]", non_finite) for i, v in enumerate(value)]
    return value


def append(
    notebook: str,
    kind: str,
    values: dict,
    params: dict | None = None,
    *,
    target: dict | None = None,
    packages: dict | None = None,
) -> dict:
    """Append one result to ``data/<notebook>.jsonl`` atomically; returns the record written."""
    record = {
        "notebook": notebook,
        "kind": kind,
        "run_id": RUN_ID,
        "values": values,
        "params": params or {},
        "provenance": provenance(target, packages),
    }
    non_finite: dict[str, str] = {}
    record = portable(json.loads(json.dumps(record, default=_jsonable)), "", non_finite)
    if non_finite:  # null written in their place; the record says what they were
        record["non_finite"] = non_finite
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
    path = paths.data_dir() / f"{notebook}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
    finally:
        os.close(fd)
    return record


def read(notebook: str) -> list[dict]:
    """Every record of one notebook, oldest first; [] when it has none (see paths.record_files)."""
    path = paths.record_files().get(notebook)
    if path is None:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs(rows: list[dict]) -> list[list[dict]]:
    """Records grouped by run, oldest run first (a run's records in the order written)."""
    grouped: dict[str, list[dict]] = {}
    for r in rows:
        grouped.setdefault(r["run_id"], []).append(r)
    return list(grouped.values())


def _summary(run: list[dict]) -> dict | None:
    return next((r["values"] for r in reversed(run) if r["kind"] == "summary"), None)


def _measured(run: list[dict]) -> bool:
    summary = _summary(run)
    return summary is not None and not str(summary.get("status", "")).startswith("not measured")


def chosen(grouped: list[list[dict]]) -> int:
    """Which run ``latest`` quotes: the newest that measured something, else the newest that
    finished (wrote its summary), else the newest; -1 when there is none."""
    for good in (_measured, lambda run: _summary(run) is not None, lambda run: True):
        found = [i for i, run in enumerate(grouped) if good(run)]
        if found:
            return found[-1]
    return -1


def latest(notebook: str) -> list[dict]:
    """The records of one notebook's newest good run, oldest first: the newest run whose summary
    says it measured something (else the newest with a summary, else the newest: a benchmark or
    the runner's log write none); [] when there are none. A failed, killed, refused or empty run
    never hides the last good one: ``newer_runs`` names it."""
    grouped = runs(read(notebook))
    return grouped[chosen(grouped)] if grouped else []


def newer_runs(notebook: str) -> list[dict]:
    """The runs newer than the one ``latest`` quotes, each with its ``run_id``, the ``time_utc``
    of its first record, its ``records`` count and ``why`` it was passed over."""
    grouped = runs(read(notebook))
    if not grouped:
        return []
    newer = []
    for run in grouped[chosen(grouped) + 1 :]:
        summary = _summary(run)
        why = (
            f"{summary.get('status')}: {summary.get('headline', '')}".rstrip(": ")
            if summary
            else "it wrote no summary: it failed or was cut short"
        )
        newer.append({"run_id": run[0]["run_id"], "records": len(run), "why": why,
                      "time_utc": run[0]["provenance"]["time_utc"]})  # fmt: skip
    return newer


def load(notebook: str | None = None, *, latest_run: bool = True) -> pd.DataFrame:
    """Records as a flat DataFrame (``values.*``, ``params.*``, ``provenance.*`` columns).

    With ``latest_run`` only the newest run of each notebook is kept, so a table never
    mixes an old run's numbers with a new one's.
    """
    names = [notebook] if notebook else sorted(paths.record_files())
    rows = [r for name in names for r in (latest(name) if latest_run else read(name))]
    return pd.json_normalize(rows, max_level=1) if rows else pd.DataFrame()


class Recorder:
    """One notebook run's writer: every record it appends carries the same notebook name and
    parameters; ``written`` keeps them, and ``summary`` ends the run."""

    def __init__(self, notebook: str, params: dict) -> None:
        self.notebook = notebook
        self.params = params
        self.written: list[dict] = []

    def add(self, kind: str, values: dict, **provenance_overrides: dict) -> dict:
        """Append one record of ``kind`` (``target=`` / ``packages=`` override the provenance)."""
        record = append(self.notebook, kind, values, self.params, **provenance_overrides)
        self.written.append(record)
        return record

    def summary(
        self,
        headline: str,
        *,
        verdict: str,
        number: str,
        why: str,
        provenance: dict | None = None,
        **values: object,
    ) -> dict:
        """The run's last record, which marks it finished (``latest``): ``status`` "measured", the
        headline, the decision (``verdict``, one of ``evidence.VERDICTS``; the one ``number``
        that decides it; ``why``, one sentence) and the evidence levels of the records this run
        wrote (unless given); ``provenance`` overrides as in ``add``."""
        levels = values.pop("evidence", None) or evidence.of_values(
            [r["values"] for r in self.written]
        )
        decision = {"verdict": evidence.check_verdict(verdict), "number": number, "why": why}
        return self.add(
            "summary",
            {"status": "measured", "headline": headline, "evidence": levels, **decision, **values},
            **(provenance or {}),
        )

    def add_all(self, kind: str, rows: list[dict]) -> list[dict]:
        """Append one record of ``kind`` per row; returns the rows."""
        for row in rows:
            self.add(kind, row)
        return rows

    def skip(self, check: str, reason: str) -> None:
        """Say plainly that a check did not run here, and record it as skipped with the reason."""
        print(f"SKIPPED {check}: {reason}")
        self.add("skipped", {"check": check, "status": "skipped", "reason": reason})
