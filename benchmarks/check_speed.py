"""Seconds for one ``check`` (one model x release x SM), as a user runs it, and its progress lines.

Prints, and records in data/benchmark_check.jsonl:
  * ``first_s`` and ``progress``: the first ``check`` for the release (with --cold its
    environment is removed first, uv's shared cache kept), and the lines it printed on stderr
    before its answer: one per environment step (``[env] ...``), each at most ``LINE_MAX``
    characters, never uv's install list;
  * ``warm_s``: the same ``check`` again, its environment reused (goal: within 60 s);
  * ``outcome``: the answer's first line, so a fast run that measured nothing shows as such.

    build/venv/bin/python benchmarks/check_speed.py [--config models/glm-5-nvfp4] [--sglang 0.5.23] [--sm 12.0] [--cold]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import fp4lab

fp4lab.setup()

GOAL_S = 60.0
"""One cell answered within 60 s, warm."""
LINE_MAX = 120
"""The longest progress line the first check may print (uv's install list would be longer)."""


def timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    return time.perf_counter() - started, done


def main() -> None:
    from fp4lab.core import records
    from fp4lab.serving.replay import env, versions
    from fp4lab.serving.replay.shared import models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="models/glm-5-nvfp4")
    parser.add_argument("--sglang", default=versions.VERSIONS[-1])
    parser.add_argument("--sm", default="12.0")
    parser.add_argument("--cold", action="store_true", help="remove the environment first")
    args = parser.parse_args()
    models.read(args.config)  # a bad config is refused by name before anything is built
    version = versions.check_versions(args.sglang)[0]
    sm = versions.check_sms(args.sm)[0]
    if args.cold:
        shutil.rmtree(env.env_dir(version) / "venv", ignore_errors=True)
    command = [sys.executable, "-m", "fp4lab.serving.replay", "check", "--config", args.config,
               "--sglang", version, "--sm", sm]  # fmt: skip
    first_s, first = timed(command)
    warm_s, warm = timed(command)
    progress = [line for line in first.stderr.splitlines() if line.startswith("[env] ")]
    answer = next((line for line in warm.stdout.splitlines() if " through " in line), "")
    records.append("benchmark_check", "timing",
                   {"first_s": first_s, "warm_s": warm_s, "goal_s": GOAL_S,
                    "progress": progress, "longest_line": max(map(len, progress), default=0),
                    "line_max": LINE_MAX, "returncodes": [first.returncode, warm.returncode],
                    "outcome": answer, "cores": os.cpu_count()},
                   {"config": args.config, "sglang": version, "sm": sm, "cold": args.cold})  # fmt: skip
    print("\n".join(progress))
    print(answer or f"no answer (exit {warm.returncode}): {warm.stderr[-400:]}")
    longest = max(map(len, progress), default=0)
    print(f"first check: {first_s:.0f} s, {len(progress)} progress lines, the longest "
          f"{longest} characters (at most {LINE_MAX}: {'met' if longest <= LINE_MAX else 'MISSED'})")  # fmt: skip
    print(f"warm check: {warm_s:.0f} s, {warm_s / GOAL_S:.2f} x the goal of {GOAL_S:.0f} s: "
          f"{'met' if warm_s < GOAL_S and warm.returncode == 0 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    main()
