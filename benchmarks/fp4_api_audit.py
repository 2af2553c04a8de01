"""Seconds for a warm FP4 API audit (notebook 12) of one FlashInfer version on two SMs.

Warm: the version's environment already exists and one audit has run before, so imports come
from the page cache. The audit runs as notebook 12 runs it: one child per SM in the version's
environment, side by side (every FP4 entry point and registered op: eager call, trace, chain,
install modes). Prints, and records in data/benchmark_fp4_api_audit.jsonl, the wall time per
version against the goal (under 60 s for one version x 2 SMs on 2 cores) and its ratio.

    build/venv/bin/python benchmarks/fp4_api_audit.py [--versions 0.6.3,0.7.4] [--sms 12.0,10.0]
"""

from __future__ import annotations

import argparse
import time

import fp4lab

fp4lab.setup()  # caches into build/ before torch is imported

GOAL_S = 60.0


def main() -> None:
    from fp4lab.compile.audit import study
    from fp4lab.compile.matrix.versions import check_released
    from fp4lab.core import params, records

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="0.7.4")
    parser.add_argument("--sms", default="12.0,10.0")
    parser.add_argument("--no-warmup", action="store_true", help="time the first run (cold)")
    args = parser.parse_args()
    try:
        versions, sms = check_released(args.versions), params.sms("sms", args.sms)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    quiet = lambda line: None  # noqa: E731 - progress is the table below
    print(f"{'version':14} {'rows':>6} {'wall s':>8} {'of goal':>8}  goal < {GOAL_S:.0f} s")
    for version in versions:
        if not args.no_warmup:
            study.run_audits([version], sms, ["fp4_quantize"], quiet)
        started = time.perf_counter()
        found = study.run_audits([version], sms, [], quiet)[version]
        wall = time.perf_counter() - started
        child = next(iter(found["children"]), {})
        values = {
            "version": version,
            "sms": sms,
            "env": found["env"],
            "error": found["error"],
            "entry_points": len({r["entry_point"] for r in found["rows"]}),
            "rows": len(found["rows"]),
            "audit_s": {c["sm"]: c.get("seconds") for c in found["children"]},
            "wall_s": wall,
            "goal_s": GOAL_S,
            "ratio_to_goal": wall / GOAL_S,
            "met": wall < GOAL_S and not found["error"],
            "warm": not args.no_warmup,
        }
        records.append(
            "benchmark_fp4_api_audit",
            "timing",
            values,
            {"versions": versions, "sms": sms},
            packages=child.get("packages") or {"flashinfer-python": version},
        )
        verdict = "met" if values["met"] else "MISSED"
        print(f"{version:14} {len(found['rows']):>6} {wall:>8.1f} {wall / GOAL_S:>8.2f}  "
              f"{verdict} {found['error'] or ''}")  # fmt: skip


if __name__ == "__main__":
    main()
