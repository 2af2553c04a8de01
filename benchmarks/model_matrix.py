"""Seconds for notebook 14's model matrix, warm: every built-in model x SGLang release x SM.

Prints, and records in data/benchmark_model_matrix.jsonl:
  * ``matrix_s``: the replay as notebook 14 runs it (``matrix.measure``: each release's
    environment reused and its scan read back, one child per (release, SM) in one pool across
    releases, one per core at once; each child imports the release once and replays every model
    in a fork of itself), against 30 minutes for the whole set x every release x 3 SMs on this
    2-core machine;
  * ``children_s``: the children's own seconds, summed (what the pool spreads over the cores);
  * ``outcomes``: the cells per outcome, so a fast run that measured nothing shows as such;
  * ``cores`` and ``load_before``: the machine the figure holds for.

    build/venv/bin/python benchmarks/model_matrix.py [--models all] [--versions all] [--sms 9.0,10.0,12.0]
"""

from __future__ import annotations

import argparse
import os
import time

import fp4lab

fp4lab.setup()

GOAL_S = 1800.0
"""Every built-in model x every release x 3 SMs, warm, within 30 minutes."""


def main() -> None:
    from fp4lab.core import records
    from fp4lab.serving.replay import matrix, versions
    from fp4lab.serving.replay.shared import models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=models.ALL)
    parser.add_argument("--versions", default=versions.ALL)
    parser.add_argument("--sms", default=",".join(versions.SMS))
    args = parser.parse_args()
    names = models.check_names("models", args.models)
    chosen, sms = versions.check_versions(args.versions), versions.check_sms(args.sms)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    runs = matrix.measure([models.named(n) for n in names], chosen, sms, progress=print, fresh=True)
    seconds = time.perf_counter() - started
    rows = [matrix.row(models.named(name), run.version, sm, replay, run.calls)
            for run in runs for name, per_sm in run.by_model.items()
            for sm, replay in per_sm.items()]  # fmt: skip
    children = sum(run.replays.get(sm, {}).get("child_seconds") or 0 for run in runs for sm in sms)
    every = (names == models.built_in() and chosen == list(versions.VERSIONS)
             and len(sms) == len(versions.SMS))  # fmt: skip
    outcomes = matrix.counts(rows)
    records.append("benchmark_model_matrix", "timing",
                   {"matrix_s": seconds, "every_cell": every, "cells": len(rows),
                    "outcomes": outcomes, "children_s": children, "cores": os.cpu_count(),
                    "load_before": load, "goal_s": GOAL_S},
                   {"models": names, "versions": chosen, "sms": sms})  # fmt: skip
    print(f"{len(rows)} cells ({', '.join(f'{n} {o}' for o, n in outcomes.items())}) in "
          f"{seconds:.0f} s on {os.cpu_count()} cores (children {children:.0f} s summed; load "
          f"{load:.1f} before)")  # fmt: skip
    if every:
        ratio = seconds / GOAL_S
        print(f"the whole matrix, warm: {seconds:.0f} s, {ratio:.2f} x the goal of {GOAL_S:.0f} s: "
              f"{'met' if ratio < 1 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
