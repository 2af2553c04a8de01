"""Seconds for the whole FP4 API audit (notebook 12) per FlashInfer version, warm.

Warm: the version's environment already exists (notebook 09 or 12 built it) and one audit has
run before, so imports come from the page cache. Each version's audit runs in its own
environment as notebook 12 runs it (every FP4 entry point found x each SM). Prints, and records
in data/benchmark_fp4_api_audit.jsonl, the child's audit seconds and the wall time including
interpreter start and imports, against the goal (under 2 minutes per version on 2 cores).

    build/venv/bin/python benchmarks/fp4_api_audit.py [--versions 0.6.3,0.7.4] [--sms 12.0,10.0]
"""

from __future__ import annotations

import argparse
import time

import fp4lab

fp4lab.setup()  # caches into build/ before torch is imported

GOAL_S = 120.0


def main() -> None:
    from fp4lab.compile.audit import study
    from fp4lab.compile.matrix.versions import DEFAULT_VERSIONS, check_versions
    from fp4lab.core import records

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(DEFAULT_VERSIONS))
    parser.add_argument("--sms", default="12.0,10.0")
    parser.add_argument("--no-warmup", action="store_true", help="time the first run (cold)")
    args = parser.parse_args()
    versions, (sms, bad) = check_versions(args.versions), study.check_sms(args.sms)
    for message in bad:
        print(f"bad input: {message}")
    print(
        f"{'version':14} {'entry points':>12} {'audit s':>9} {'wall s':>8}  goal < {GOAL_S:.0f} s"
    )
    for version in versions:
        if not args.no_warmup:
            study.audit_version(version, sms, ["shuffle_matrix_a"])
        started = time.perf_counter()
        found = study.audit_version(version, sms, [])
        wall = time.perf_counter() - started
        names = {r["entry_point"] for r in found["rows"]}
        values = {
            "version": version,
            "sms": sms,
            "env": found["env"],
            "error": found.get("error"),
            "entry_points": len(names),
            "rows": len(found["rows"]),
            "audit_s": found.get("seconds"),
            "wall_s": wall,
            "goal_s": GOAL_S,
            "met": wall < GOAL_S,
            "warm": not args.no_warmup,
        }
        records.append(
            "benchmark_fp4_api_audit",
            "timing",
            values,
            {"versions": versions, "sms": sms},
            packages=found.get("packages") or {"flashinfer-python": version},
        )
        audit = f"{values['audit_s']:.1f}" if values["audit_s"] is not None else "-"
        verdict = "met" if values["met"] else "MISSED"
        print(
            f"{version:14} {len(names):>12} {audit:>9} {wall:>8.1f}  {verdict} {found.get('error') or ''}"
        )


if __name__ == "__main__":
    main()
