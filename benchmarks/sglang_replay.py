"""Seconds per SGLang release for its environment (cold, warm), the replay of the releases, and disk.

Prints, and records in data/benchmark_sglang_replay.jsonl:
  * per release, ``install_cold_s``: building build/sglang-compile/<version>/venv from nothing
    (with --cold: the environment is removed first; uv's shared cache is kept, so this is the
    install, not the download); ``install_warm_s``: finding it built (reuse); ``env_bytes``:
    what the environment adds beside uv's cache; ``child_s``: each SM's replay child;
  * ``replay_s``: a warm replay of the chosen releases on every SM given, as notebook 11 runs it
    (``pool.measure_versions``: each release's scan, then one child per (release, SM), one per
    core at once across releases: each builds the release's own GLM-5 and drives its piecewise
    runner; the story's SM also walks the story's patch and each CUDA_HOME) (goal: < 90 s for one
    release x 3 SMs on this 2-core machine);
  * ``all_replay_s``: the same with ``--versions all``, against 15 minutes (every release x 3
    SMs, warm);
  * ``build_bytes``: the whole build folder, hardlinks counted once.

    build/venv/bin/python benchmarks/sglang_replay.py [--versions 0.5.9|all] [--sms 9.0,10.0,12.0] [--cold]
"""

from __future__ import annotations

import argparse
import shutil
import time

import fp4lab

fp4lab.setup()

GOALS = {"replay_s": 90.0, "all_replay_s": 900.0}
"""One release x 3 SMs within 90 s; every release of VERSIONS x 3 SMs within 15 minutes."""


def install(version: str, cold: bool) -> dict:
    """The environment's timings and size; a failed install says so."""
    from fp4lab.serving.replay import env

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
    values["env_bytes"] = built.env_bytes
    return values


def main() -> None:
    from fp4lab.core import paths, records
    from fp4lab.serving.replay import pool, versions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=versions.STORY_VERSION)
    parser.add_argument("--sms", default=",".join(versions.SMS))
    parser.add_argument("--cold", action="store_true", help="remove each environment first")
    args = parser.parse_args()
    chosen, sms = versions.check_versions(args.versions), versions.check_sms(args.sms)
    rows = [install(version, args.cold) for version in chosen]
    started = time.perf_counter()
    runs = pool.measure_versions(
        chosen, sms, list(pool.CUDA_HOME_CASES), progress=print, fresh=True
    )
    replays = time.perf_counter() - started
    for row, run in zip(rows, runs, strict=True):
        row["child_s"] = {sm: found.get("child_seconds") for sm, found in run.replays.items()}
        row["errors"] = {
            sm: found["error"] for sm, found in run.replays.items() if "error" in found
        }
    total = sum(r.get("env_bytes", 0) for r in rows)
    every = chosen == list(versions.VERSIONS) and len(sms) == len(versions.SMS)
    build = paths.disk_bytes(paths.build_dir())
    records.append("benchmark_sglang_replay", "timing", {"versions": rows, "total_env_bytes": total,
                   "replay_s": replays, "all_replay_s": replays if every else None,
                   "build_bytes": build, "goals": GOALS},
                   {"versions": chosen, "sms": sms, "cold": args.cold})  # fmt: skip
    print(
        f"{'version':12} {'status':8} {'cold s':>8} {'warm s':>8} {'GiB':>6}  replay child s per SM"
    )
    for r in rows:
        shown = [
            f"{r[k]:.1f}" if r.get(k) is not None else "-"
            for k in ("install_cold_s", "install_warm_s")
        ]
        per_sm = ", ".join(f"SM{sm} {s}" for sm, s in r.get("child_s", {}).items())
        print(f"{r['version']:12} {r['status']:8} {shown[0]:>8} {shown[1]:>8} "
              f"{r.get('env_bytes', 0) / 2**30:6.2f}  {per_sm} {r['error'] or ''}")  # fmt: skip
    if len(chosen) == 1:
        ratio = replays / GOALS["replay_s"]
        print(f"warm replay of {len(sms)} SMs: {replays:.1f} s, {ratio:.2f} x the goal of "
              f"{GOALS['replay_s']:.0f} s: {'met' if ratio < 1 else 'MISSED'}")  # fmt: skip
    print(f"disk these environments add beside uv's cache: {total / 2**30:.1f} GiB; the build "
          f"folder: {build / 2**30:.1f} GiB (hardlinks counted once)")  # fmt: skip
    if every:
        ratio = replays / GOALS["all_replay_s"]
        print(f"every release x {len(sms)} SMs, warm: {replays:.0f} s, {ratio:.2f} x the goal of "
              f"{GOALS['all_replay_s']:.0f} s: {'met' if ratio < 1 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
