"""Inside one version's environment: every FP4 entry point of the installed FlashInfer audited, as JSON.

    python -m fp4lab.compile.audit.child OUT.json --sms 12.0,10.0 [--entry-points a,b]

Imports nothing that environment lacks (torch, FlashInfer and fp4lab's lib/). One row per
(entry point, SM): an audited row carries ``run.audit``'s answers; an entry point whose inputs
cannot be built, one this version does not have, or one whose audit raised gets a row saying
so, and the others go on.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

from fp4lab.compile import target
from fp4lab.compile.audit import inputs, run, surface
from fp4lab.compile.matrix.child import installed_packages


def _row(entry: surface.EntryPoint | dict, sm: str, status: str, **values: object) -> dict:
    about = entry.as_record() if isinstance(entry, surface.EntryPoint) else entry
    return {**about, **values, "sm": sm, "status": status}


def audit_entry(entry: surface.EntryPoint, sms: list[tuple[int, int]]) -> list[dict]:
    """One row per SM for one entry point (``status``: audited | no input spec | error)."""
    names = [f"{a}.{b}" for a, b in sms]
    try:
        args, kwargs = inputs.for_signature(entry.fn, entry.name, entry.kind)
        build = inputs.bind(entry.fn, args, kwargs)
    except inputs.SpecError as exc:
        return [
            _row(entry, sm, "no input spec", verdict="no input spec", reason=str(exc))
            for sm in names
        ]
    rows = []
    for sm, name in zip(sms, names, strict=True):
        try:
            found = run.audit(entry.fn, build, sm, op=f"flashinfer::{entry.name}")
            found.pop("sm")
            found["simulated"] = not target.real_fp4_gpu()  # the SM was staged, needed or not
        except Exception as exc:  # one entry point's failure must not stop the others
            rows.append(
                _row(entry, name, "error", verdict="error", reason=f"{type(exc).__name__}: {exc}")
            )
            continue
        rows.append(
            _row(entry, name, "audited", verdict=found["target"]["verdict"], inputs=kwargs, **found)
        )
    return rows


def audit_installed(sms: list[tuple[int, int]], names: list[str] | None = None) -> dict:
    """Every FP4 entry point (or the ``names`` given) of the installed FlashInfer on each SM."""
    started = time.perf_counter()
    found = surface.discover(target.flashinfer)
    if names:
        chosen, missing = surface.find(target.flashinfer, names)
    else:
        chosen, missing = found, []
    rows = [
        _row(m, f"{a}.{b}", m["status"], verdict=m["status"], reason=m["reason"])
        for m in missing
        for a, b in sms
    ]
    for entry in chosen:
        rows += audit_entry(entry, sms)
    return {
        "flashinfer": getattr(target.flashinfer, "__version__", None),
        "packages": installed_packages(),
        "python": platform.python_version(),
        "import_staging": target.IMPORT_STAGING,
        "discovered": [{**e.as_record(), "reason": e.reason} for e in found],
        "rows": rows,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.compile.audit.child")
    parser.add_argument("out")
    parser.add_argument("--sms", required=True, help="comma list of SMs, e.g. 12.0,10.0")
    parser.add_argument("--entry-points", default="", help="comma list; empty: every one found")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    sms = [tuple(int(p) for p in s.split(".")) for s in args.sms.split(",")]
    names = [n for n in args.entry_points.split(",") if n]
    Path(args.out).write_text(json.dumps(audit_installed(sms, names or None), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
