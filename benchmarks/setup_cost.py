"""What fp4lab's environments cost to build here: seconds cold and warm, and bytes on disk.

For each kind of environment (the main one from requirements.lock, one FlashInfer version of the
matrix, one SGLang release's server environment), builds it twice with uv in a scratch
folder inside build/ (same filesystem, so files are hardlinked from the cache): cold, with an
empty uv cache (everything downloaded), then warm (the environment removed, the cache kept).
Prints, and records in data/benchmark_setup.jsonl, the seconds of each, each environment's bytes
(its files counted once) and the bytes it adds beside the cache, the cache's bytes, and the
whole build/ folder counted with hardlinks once. The scratch folder is removed at the end.

    build/venv/bin/python benchmarks/setup_cost.py [--flashinfer 0.6.3] [--sglang 0.5.9]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import fp4lab

fp4lab.setup()

from fp4lab.compile.matrix import env as matrix_env  # noqa: E402
from fp4lab.compile.matrix import versions as matrix_versions  # noqa: E402
from fp4lab.core import paths, records, venvs  # noqa: E402
from fp4lab.serving import sglang_env  # noqa: E402
from fp4lab.serving.replay import versions as replay_versions  # noqa: E402

GOALS = {"build_bytes": 15 * 2**30}
"""The whole build/ after a full `make reproduce`, hardlinks counted once (issue goal: 15 GiB)."""


def _main_env(scratch: Path) -> venvs.Environment:
    return venvs.ensure(scratch / "venv", [["sync", str(paths.REPO_ROOT / "requirements.lock")]])


def _flashinfer_env(version: str) -> Callable[[Path], venvs.Environment]:
    def build(scratch: Path) -> venvs.Environment:
        steps = [["install", venvs.torch_requirement(), f"flashinfer-python=={version}"]]
        return venvs.ensure(matrix_env.env_dir(version), steps)

    return build


def _sglang_env(version: str) -> Callable[[Path], venvs.Environment]:
    def build(scratch: Path) -> venvs.Environment:
        built = sglang_env.ensure_sglang(version)
        if built.error:
            return venvs.Environment(built.environment.path, "failed", error=built.error)
        return built.environment

    return build


def measure(kind: str, build: Callable[[Path], venvs.Environment], scratch: Path) -> dict:
    """Cold (empty cache) then warm (cache kept, environment rebuilt) builds of one kind."""
    cache = scratch / "cache"
    os.environ["UV_CACHE_DIR"] = str(cache)
    row: dict = {"kind": kind}
    for temperature in ("cold", "warm"):
        shutil.rmtree(scratch / "build", ignore_errors=True)
        if temperature == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        print(f"[{kind}] {temperature} build ...", flush=True)
        started = time.perf_counter()
        built = build(scratch / "build")
        row[f"{temperature}_s"] = round(time.perf_counter() - started, 1)
        if built.status == "failed":
            raise RuntimeError(f"{kind}: {built.error}")
        row["env_bytes"], row["env_own_bytes"] = built.bytes, built.own_bytes
    row["cache_bytes"] = paths.disk_bytes(cache)
    shutil.rmtree(scratch / "build", ignore_errors=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flashinfer", default="0.6.3", help="a FlashInfer version of the matrix")
    parser.add_argument("--sglang", default="0.5.9", help="an SGLang release of the replay")
    args = parser.parse_args()
    try:  # checked before anything is built
        (flashinfer,) = matrix_versions.check_versions(args.flashinfer)
        (sglang,) = replay_versions.check_versions(args.sglang)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    real_build = paths.build_dir()
    scratch = real_build / "setup-cost"
    shutil.rmtree(scratch, ignore_errors=True)
    os.environ["FP4LAB_BUILD_DIR"] = str(scratch / "build")  # side environments land in scratch
    try:
        rows = [
            measure("main (requirements.lock)", _main_env, scratch),
            measure(f"flashinfer {flashinfer}", _flashinfer_env(flashinfer), scratch),
            measure(f"sglang {sglang} server", _sglang_env(sglang), scratch),
        ]
    finally:
        os.environ["FP4LAB_BUILD_DIR"] = str(real_build)
        shutil.rmtree(scratch, ignore_errors=True)
    build_bytes = paths.disk_bytes(real_build)
    records.append("benchmark_setup", "timing", {"environments": rows, "build_bytes": build_bytes},
                   {"flashinfer": flashinfer, "sglang": sglang})  # fmt: skip
    print(f"{'environment':28} {'cold':>8} {'warm':>8} {'files':>10} {'adds':>10} {'cache':>10}")
    for r in rows:
        print(f"{r['kind']:28} {r['cold_s']:>7.1f}s {r['warm_s']:>7.1f}s "
              f"{r['env_bytes'] / 2**30:>8.2f}GiB {r['env_own_bytes'] / 2**30:>8.2f}GiB "
              f"{r['cache_bytes'] / 2**30:>8.2f}GiB")  # fmt: skip
    goal = GOALS["build_bytes"]
    print(f"build/ as it is now, hardlinks counted once: {build_bytes / 2**30:.2f} GiB (the goal, "
          f"< {goal / 2**30:.0f} GiB, is for build/ after a full make reproduce)")  # fmt: skip


if __name__ == "__main__":
    main()
