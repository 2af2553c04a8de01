"""Inside one version's environment: every FP4 entry point of the installed FlashInfer audited on
one or more simulated SMs, as JSON.

    python -m fp4lab.compile.audit.child OUT.json --sms 12.0,10.0 [--entry-points a,b]

Imports nothing that environment lacks (torch, FlashInfer and fp4lab's lib/). One row per
(entry point, SM): an audited row carries ``run.audit``'s answer; an entry point whose inputs
cannot be built from the table, one this version does not have, or one whose audit raised gets
a row saying so, and the others go on.
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
from fp4lab.compile.audit import inputs, mega_moe, moe_runners, run, simulation, surface
from fp4lab.compile.matrix.child import installed_packages


def _row(entry: surface.EntryPoint | dict, sm: str, status: str, **values: object) -> dict:
    about = entry.as_record() if isinstance(entry, surface.EntryPoint) else entry
    return {**about, **values, "sm": sm, "status": status}


def call_for(entry: surface.EntryPoint, sm: tuple[int, int]) -> inputs.Call:
    """The call an entry point is audited with on ``sm`` (SpecError: no inputs for it)."""
    if entry.form == "op":
        return inputs.for_schema(entry.fn, entry.name, entry.kind)
    if entry.form == "method" and mega_moe.is_mega_layer(entry.owner):
        return mega_moe.for_layer(entry.owner, entry.name.rsplit(".", 1)[1], entry.name)
    if entry.form == "method" and moe_runners.is_runner(entry.owner):
        return moe_runners.for_runner(entry.owner, entry.name.rsplit(".", 1)[1], entry.name)
    if entry.form == "method":
        return inputs.for_method(entry.owner, entry.name.rsplit(".", 1)[1], entry.name,
                                 entry.kind, sm)  # fmt: skip
    return inputs.for_function(entry.fn, entry.name, entry.kind, sm)


def audit_entry(entry: surface.EntryPoint, sm: tuple[int, int]) -> dict:
    """One row for one entry point on one SM (``status``: audited | no input spec | error)."""
    name = f"{sm[0]}.{sm[1]}"
    op = entry.name.removeprefix("torch.ops.").replace(".", "::", 1) if entry.form == "op" else None
    try:
        call = call_for(entry, sm)
        found = run.audit(call.fn, call.build, sm, op=op or f"flashinfer::{entry.name}")
    except inputs.SpecError as exc:
        return _row(entry, name, "no input spec", verdict="no input spec", reason=str(exc))
    except Exception as exc:  # fp4lab's own failure on one entry point must not stop the others
        return _row(entry, name, "error", verdict="error", reason=f"{type(exc).__name__}: {exc}")
    found.pop("sm")
    return _row(entry, name, "audited", inputs=call.as_record(), **found)


def audit_installed(sms: list[tuple[int, int]], names: list[str] | None = None) -> dict:
    """Every FP4 entry point (or the ``names`` given) of the installed FlashInfer on each SM."""
    started = time.perf_counter()
    errors: dict[str, str] = {}
    found = surface.discover(target.flashinfer, errors)
    version = getattr(target.flashinfer, "__version__", "?")
    chosen, missing = surface.find(found, names, version) if names else (found, [])
    rows = [
        _row(m, f"{a}.{b}", m["status"], verdict=m["status"], reason=m["reason"])
        for m in missing
        for a, b in sms
    ]
    for entry in chosen:
        rows += [audit_entry(entry, sm) for sm in sms]
    return {
        "flashinfer": getattr(target.flashinfer, "__version__", None),
        "packages": installed_packages(),
        "python": platform.python_version(),
        "import_staging": target.IMPORT_STAGING,
        "standins": list(simulation.STANDINS),
        "discovered": [{**e.as_record(), "reason": e.reason} for e in found],
        "surface_errors": errors,
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
