"""Seconds per SGLang release for its environment (cold, warm) and for the replay, and its disk.

Prints, and records in data/benchmark_sglang_replay.jsonl, per release:
  * ``install_cold_s``: building build/sglang-compile/<version>/venv from nothing (with --cold:
    the environment is removed first; the shared pip download cache is kept, so this is the
    install, not the download);
  * ``install_warm_s``: finding it built (reuse);
  * ``replay_s``: the replay child (the story's chain, fp4lab's op and SGLang's op through
    SGLang's compile path) in a warm environment (goal: < 60 s on this 2-core machine);
  * ``select_s``: one SM's quantize selection and its trace;
  * ``env_bytes``: the environment on disk; and the total for the releases given.

    build/venv/bin/python benchmarks/sglang_replay.py [--versions 0.5.9,0.5.21] [--cold]
"""

from __future__ import annotations

import argparse
import shutil
import time

import fp4lab

fp4lab.setup()

GOALS = {"replay_s": 60.0}


def measure(version: str, cold: bool) -> dict:
    """The timings and size of one release; a failed install says so."""
    from fp4lab.serving.replay import env, study, versions

    if cold:
        shutil.rmtree(env.env_dir(version) / "venv", ignore_errors=True)
    built = env.ensure_env(version)
    values: dict = {"version": version, "status": built.status, "error": built.error}
    if not built.ok:
        return values
    values["install_cold_s" if built.status == "built" else "install_first_s"] = built.seconds
    started = time.perf_counter()
    env.ensure_env(version)
    values["install_warm_s"] = time.perf_counter() - started
    for mode, sm, key in (
        ("replay", versions.STORY_SM, "replay_s"),
        ("select", "12.0", "select_s"),
    ):
        started = time.perf_counter()
        found = study.run_child(version, mode, sm)
        values[key] = time.perf_counter() - started
        values[f"{mode}_error"] = found.get("error")
    values["env_bytes"] = built.env_bytes
    return values


def main() -> None:
    from fp4lab.serving.replay import versions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(versions.DEFAULT_VERSIONS))
    parser.add_argument("--cold", action="store_true", help="remove each environment first")
    args = parser.parse_args()
    from fp4lab.core import records

    chosen = versions.check_versions(args.versions)
    rows = [measure(v, args.cold) for v in chosen]
    total = sum(r.get("env_bytes", 0) for r in rows)
    records.append("benchmark_sglang_replay", "timing", {"versions": rows, "total_env_bytes": total},
                   {"versions": chosen, "cold": args.cold})  # fmt: skip
    print(
        f"{'version':12} {'status':8} {'cold s':>8} {'warm s':>8} {'replay s':>9} {'select s':>9} {'GiB':>6}"
    )
    for r in rows:
        cells = [r.get(k) for k in ("install_cold_s", "install_warm_s", "replay_s", "select_s")]
        shown = [f"{c:.1f}" if c is not None else "-" for c in cells]
        size = r.get("env_bytes", 0) / 2**30
        print(f"{r['version']:12} {r['status']:8} {shown[0]:>8} {shown[1]:>8} {shown[2]:>9} "
              f"{shown[3]:>9} {size:6.2f}  {r['error'] or ''}")  # fmt: skip
        replay = r.get("replay_s")
        if replay is not None:
            print(
                f"  replay < {GOALS['replay_s']:.0f} s: {'met' if replay < GOALS['replay_s'] else 'MISSED'}"
            )
    print(f"total disk for these environments: {total / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
