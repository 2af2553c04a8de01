"""A notebook's record file keeps the runs its readers quote: the run ``records.latest`` chooses
and any newer one (``records.newer_runs`` names them). Older runs are dropped from the file, as
git keeps them; the committed data then stays small enough to travel with a GPU run (the working
tree and the offline bundle go to the GPU machine together, within a size limit).

    python -m fp4lab.core.history prune [NOTEBOOK ...]     (every notebook's file when none given)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys

from fp4lab.core import catalog, paths, records


def prune(notebook: str) -> int:
    """Drop ``notebook``'s runs older than the one ``records.latest`` quotes; returns how many
    records were dropped. The file is rewritten whole under the lock appends take."""
    path = paths.record_files().get(notebook)
    if path is None:
        return 0
    with path.open("r+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        lines = [line for line in file if line.strip()]
        grouped = records.runs([json.loads(line) for line in lines])
        quoted = {run[0]["run_id"] for run in grouped[records.chosen(grouped) :]}
        kept = [line for line in lines if json.loads(line)["run_id"] in quoted]
        if len(kept) < len(lines):
            file.seek(0)
            file.writelines(kept)  # as written: no record is re-encoded
            file.truncate()
            os.fsync(file.fileno())
    return len(lines) - len(kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.core.history", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prune", help="drop the runs no reader quotes")
    p.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    known = [nb.name for nb in catalog.notebooks()]
    unknown = sorted(set(args.notebooks) - set(known))
    if unknown:
        print(f"error: unknown notebooks {unknown}; allowed values: {', '.join(known)}",
              file=sys.stderr)  # fmt: skip
        return 2
    for name in args.notebooks or known:
        print(f"{name}: {prune(name)} records of older runs dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
