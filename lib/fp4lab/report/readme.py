"""README.md's findings, timings and notebook durations, written from the committed records.

The README holds generated blocks between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``;
``python -m fp4lab.report.readme`` rewrites them from data/ (``make readme``), and a test fails
when a block differs from what the records say, so a number changed by hand is caught.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from fp4lab.core import catalog, paths, records
from fp4lab.report import findings, gpu

_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S
)


def notebooks_table() -> str:
    """Each notebook, what it needs, and its measured seconds in the last `make reproduce` that
    ran it (``NOTEBOOKS=06`` replaces 06's row only), with that run's commit."""
    runs = {r["values"]["notebook"]: r for r in records.read("reproduce")}  # the last one wins
    lines = [
        "| notebook | shows | needs | seconds (last make reproduce) | commit |",
        "|---|---|---|---|---|",
    ]
    for nb in catalog.notebooks():
        run = runs.get(nb.name)
        seconds, commit = (
            (
                f"{run['values']['seconds']:.0f} ({run['values']['status']})",
                run["provenance"]["git"]["commit"][:10],
            )
            if run
            else ("never run", "")
        )
        lines.append(f"| {nb.name} | {nb.title} | {nb.needs} | {seconds} | {commit} |")
    provenance = [r["provenance"] for r in runs.values()]
    where = (
        f"Seconds measured by `make reproduce` on"
        f" {', '.join(sorted({p['device'] for p in provenance}))}"
        f" ({min(p['time_utc'] for p in provenance)} to {max(p['time_utc'] for p in provenance)})."
        if provenance
        else "No `make reproduce` record yet."
    )
    return "\n".join(lines) + "\n\n" + where + "\n"


BLOCKS: dict[str, Callable[[], str]] = {
    "notebooks": notebooks_table,
    "findings": findings.findings,
    "timings": findings.timings,
    "gpu": gpu.gpu_findings,
}


def render(text: str) -> str:
    """``text`` with every generated block rewritten from the records; unknown names are errors."""

    def body(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(f"README block {name!r} is unknown; allowed: {', '.join(BLOCKS)}")
        return match.group(1) + BLOCKS[name]() + match.group(4)

    return _BLOCK.sub(body, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.report.readme", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    args = parser.parse_args(argv)
    path = paths.REPO_ROOT / "README.md"
    old = path.read_text()
    new = render(old)
    if args.check:
        print("README.md agrees with data/" if new == old else "README.md differs from data/")
        return int(new != old)
    path.write_text(new)
    print("README.md rewritten from data/" if new != old else "README.md already agrees")
    return 0


if __name__ == "__main__":
    sys.exit(main())
