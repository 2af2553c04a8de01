"""How long the story takes to replay here, against its three 4-minute server restarts.

Prints, and records in data/benchmark_story.jsonl:
  * the seconds to reproduce each of the story's three signatures in one warm process
    (goal: all three within 20 s together), and the ratio to 3 x 240 s restarts; with the
    stages each signature needed (``stages_needed``: the story's patches and the others);
  * with --reproduce, the wall time of `make reproduce` in this checkout (goal: < 15 min warm);
  * with --cold, the wall time of `make reproduce` in a fresh clone with no environment and an
    empty cache (goal: < 45 min; downloads every package again), each notebook's status and
    seconds in that run, and that clone's build/ with hardlinks counted once (goal: <= 25 GiB);
    then `make pages` there: every page it exported checked in headless Chromium (its exit
    status and the pages it checked);
  * with --pages DIR, the same `make pages` in DIR, a kept cold clone (whether Chromium was
    there to render the pages is recorded: without it `make pages` fails);
  * with --ci, the wall time and exit status of CI (`bash .ci/run`) in a fresh clone
    (goal: < 20 min), and whether Chromium was already installed (then .ci/run's apt install of
    it is not in the time);
  * the size on disk of the environment (build/venv).

The fresh clones go to a temporary folder, removed after; with --keep DIR, to DIR/cold and
DIR/ci, kept (a cold run's data/ and pages, to read or commit).

    build/venv/bin/python benchmarks/story_timing.py [--reproduce] [--cold] [--ci] [--keep DIR]
                                                     [--pages DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import fp4lab

fp4lab.setup()  # caches into build/ before torch is imported

from fp4lab.core import paths, process  # noqa: E402

RESTART_S = 240.0  # the story: each try cost a 4-minute server restart
GOALS = {
    "three_signatures_s": 20.0,
    "reproduce_warm_s": 900.0,
    "reproduce_cold_s": 2700.0,
    "build_cold_bytes": 25 * 2**30,
    "ci_s": 1200.0,
}


def signature_seconds() -> tuple[dict[str, float], dict[str, list[str]]]:
    """Seconds per story signature (building the segment and tracing it, in this process), and
    the stages each needed, ``name [origin]``."""
    started = time.perf_counter()
    from fp4lab.compile import segment, stages, target, trace

    import_s = time.perf_counter() - started
    shape = segment.LayerShape(hidden=192, heads=2, ffn=384)
    x = segment.tokens_input(shape, 64)
    model = segment.Stack(shape, 1, target.fp4_quantize)
    timed = {"imports_s": import_s}
    needed: dict[str, list[str]] = {}

    def timed_signature(name: str, run) -> None:
        t = time.perf_counter()
        observed, applied = run()
        timed[f"{name}_s"] = time.perf_counter() - t
        needed[name] = [f"{s['stage']} [{s['origin']}]" for s in applied]
        if observed != name:
            raise RuntimeError(f"upstream behaviour changed: expected {name}, observed {observed}")

    def traced(chosen: list) -> tuple[str, list[dict]]:
        with stages.applied(chosen) as applied:
            return trace.attempt(model, x).signature, applied

    def file_io() -> tuple[str, list[dict]]:
        last = stages.walk_blocker_chain(model, x)[-1]
        return last["signature"], last["stages_applied"]

    on_target = stages.target_stages(target.STORY_SM)
    timed_signature("subprocess", lambda: traced(on_target))
    timed_signature("file_io", file_io)
    timed_signature(
        "compiler_disable_under_fullgraph",
        lambda: traced([*on_target, stages.PATCH_CUDA_VERSION, stages.COMPILER_DISABLED]),
    )
    return timed, needed


def timed_run(
    command: list[str], checkout: Path, env: dict[str, str] | None = None
) -> tuple[float, int]:
    """Seconds and exit status of ``command`` in ``checkout`` (with ``env``, else this
    process's); its progress is shown as it runs."""
    print(f"$ {' '.join(command)}  (in {checkout})", flush=True)
    started = time.perf_counter()
    with process.sigterm_raises():  # stopped with this benchmark, its whole group
        proc = subprocess.Popen(command, cwd=checkout, env=env, start_new_session=True)
        try:
            returncode = proc.wait()
        finally:
            process.stop(proc)
    return time.perf_counter() - started, returncode


@contextlib.contextmanager
def fresh_clone(name: str, keep: Path | None) -> Iterator[tuple[Path, dict[str, str]]]:
    """A clone of this checkout's HEAD, in ``keep/name`` (kept) or a temporary folder (removed
    after), and this process's environment without the variables that would point the clone at
    this checkout's build/ and caches."""
    with contextlib.ExitStack() as stack:
        folder = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fp4lab-")))
        clone = folder / name
        if clone.exists():
            raise SystemExit(f"--keep: {clone} exists; name a folder without {name}/")
        subprocess.run(["git", "clone", "-q", str(paths.REPO_ROOT), str(clone)], check=True)
        yield clone, clone_environment()


def clone_environment() -> dict[str, str]:
    """This process's environment without the variables that would point a clone at this
    checkout's build/ and caches."""
    prefixes = ("FP4LAB_", "TORCHINDUCTOR_", "FLASHINFER_", "UV_", "TRITON_", "HF_",
                "XDG_CACHE", "TVM_FFI_")  # fmt: skip
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def chromium_installed() -> bool:
    """Whether Chromium is on PATH, under either of its Debian names, as the page check finds it."""
    return bool(shutil.which("chromium") or shutil.which("chromium-browser"))


def pages_checked(clone: Path, env: dict[str, str]) -> dict:
    """`make pages` in a checkout that ran `make reproduce`: the pages it exported, the exit
    status, whether Chromium was there to render them, and the checkout's commit."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    values = {
        "pages_cold_checked": sorted(p.stem for p in (clone / "build/html").glob("*.html")),
        "pages_cold_chromium": chromium_installed(),
        "pages_cold_commit": commit,
    }
    _, values["pages_cold_exit"] = timed_run(["make", "pages"], clone, env)
    return values


def notebook_seconds(data: Path) -> dict[str, list]:
    """Each notebook's status and seconds in the newest `make reproduce` run recorded in ``data``."""
    rows = [json.loads(line) for line in (data / "reproduce.jsonl").read_text().splitlines()]
    newest = rows[-1]["run_id"] if rows else None
    return {
        r["values"]["notebook"]: [r["values"]["status"], r["values"]["seconds"]]
        for r in rows
        if r["run_id"] == newest
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reproduce",
        action="store_true",
        help="also time `make reproduce` in this checkout (warm)",
    )
    parser.add_argument(
        "--cold", action="store_true", help="also time `make reproduce` in a fresh clone (cold)"
    )
    parser.add_argument("--ci", action="store_true", help="also time CI in a fresh clone")
    parser.add_argument("--keep", type=Path, help="keep the fresh clones in this folder")
    parser.add_argument("--pages", type=Path, metavar="DIR",
                        help="check the pages a kept cold clone exported (`make pages` in DIR)")  # fmt: skip
    args = parser.parse_args()
    if args.pages is not None and not (args.pages / "build/html").is_dir():
        parser.error(
            f"--pages: {args.pages} has no build/html (a checkout that ran `make reproduce`)"
        )
    if args.keep is not None and not args.keep.is_dir():
        parser.error(f"--keep: {args.keep} is not a folder")
    keep = args.keep and args.keep.resolve()
    from fp4lab.core import records

    records.git_state()  # the checkout as it was when the timing began
    load_before = os.getloadavg()[0]

    values, needed = signature_seconds()
    three = (
        values["subprocess_s"] + values["file_io_s"] + values["compiler_disable_under_fullgraph_s"]
    )
    values["three_signatures_s"] = three
    values["speedup_vs_restarts"] = 3 * RESTART_S / three
    if args.reproduce:
        values["reproduce_warm_s"], values["reproduce_warm_exit"] = timed_run(
            ["make", "reproduce"], paths.REPO_ROOT
        )
    if args.cold:
        with fresh_clone("cold", keep) as (clone, env):
            seconds, status = timed_run(["make", "reproduce"], clone, env)
            values |= {"reproduce_cold_s": seconds, "reproduce_cold_exit": status}
            values["reproduce_cold_notebooks"] = notebook_seconds(clone / "data")
            values["build_cold_bytes"] = paths.disk_bytes(clone / "build")
            values |= pages_checked(clone, env)
    if args.pages:
        values |= pages_checked(args.pages.resolve(), clone_environment())
    if args.ci:
        with fresh_clone("ci", keep) as (clone, env):
            values["ci_chromium_installed_before"] = chromium_installed()
            values["ci_s"], values["ci_exit"] = timed_run(["bash", ".ci/run"], clone, env)
    values["venv_bytes"] = paths.disk_bytes(paths.build_dir() / "venv")
    records.append(
        "benchmark_story",
        "timing",
        {
            **values,
            "stages_needed": needed,
            "load_1min_before_after": [load_before, os.getloadavg()[0]],
        },
        {"reproduce": args.reproduce, "cold": args.cold, "ci": args.ci},
    )
    print(f"{'measure':38} {'value':>10}  goal")
    for key, value in values.items():
        if isinstance(value, dict | list | str):
            continue
        goal = GOALS.get(key)
        shown = (
            ("yes" if value else "no")
            if isinstance(value, bool)
            else f"{value:.0f}"
            if key.endswith("_exit")
            else f"{value / 2**20:,.0f} MiB"
            if key.endswith("bytes")
            else (f"{value:.1f}x" if key.startswith("speedup") else f"{value:.2f} s")
        )
        if goal is None:
            verdict = ""
        elif key.endswith("bytes"):
            verdict = f"<= {goal / 2**30:.0f} GiB: {'met' if value <= goal else 'MISSED'}"
        else:
            verdict = f"< {goal:.0f} s: {'met' if value < goal else 'MISSED'}"
        print(f"{key:38} {shown:>10}  {verdict}")
    print(
        f"the story's three restarts: {3 * RESTART_S:.0f} s; here: {three:.1f} s "
        f"({values['speedup_vs_restarts']:.0f}x faster)"
    )
    for name, applied in needed.items():
        print(f"{name} needed: {', '.join(applied) or 'nothing'}")


if __name__ == "__main__":
    main()
