"""The offline GPU bundle: fp4lab's source, its notebooks and the wheels they need, in one folder.

GPU machines often reach no package registry and bring their own CUDA build of torch (and
Triton). ``build`` writes, on a machine that reaches the registry, a folder of at most
``LIMIT_BYTES``: ``src/`` (lib/, notebooks/, scripts/, pyproject.toml, and the commit it was
built from, which the records there carry), ``wheels/`` (every
dependency of the GPU notebooks except torch, Triton, FlashInfer and, unless asked, numpy,
pandas and matplotlib, for each Python version given), ``requirements.txt`` and ``run.sh``.
There, ``run.sh OUT`` installs what the interpreter lacks from ``wheels/`` into a private
folder (pip, offline), runs the GPU notebooks and writes records, figures and one summary line
per notebook to OUT. ``install`` and ``summary`` use the standard library only.

    python -m fp4lab.core.bundle build build/gpu-bundle [--python-versions 3.11,3.12] [--with numpy,pandas,matplotlib]
    python -m fp4lab.core.bundle install WHEELS SITE      (run.sh calls these two)
    python -m fp4lab.core.bundle summary OUT/data
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

LIMIT_BYTES = 48 * 2**20
PYTHON_VERSIONS = ("3.11", "3.12")  # this machine's and the GPU machine's
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
PROVIDED = {"torch", "triton", "flashinfer-python", "numpy", "pandas", "matplotlib"}
"""Brought by the GPU machine (FlashInfer optional: its checks are skipped where absent)."""
NOT_NEEDED = {"jupyterlab", "nbconvert", "transformers", "uv", "pip"}
"""Interactive use, HTML export, the serving notebook's tiny model, and the tools that build
environments (run.sh installs with the interpreter's own pip and builds none): not on the GPU
path."""
SOURCES = ("lib", "notebooks", "scripts", "pyproject.toml", "README.md")
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def _root() -> Path:
    from fp4lab.core import paths

    return paths.REPO_ROOT


def requirements(include: set[str]) -> list[str]:
    """The pinned project dependencies the GPU notebooks need (pyproject.toml's, filtered)."""
    import tomllib

    project = tomllib.loads((_root() / "pyproject.toml").read_text())["project"]
    skip = (PROVIDED - include) | NOT_NEEDED
    wanted = [r for r in project["dependencies"] if re.split(r"[=<>]", r)[0] not in skip]
    return wanted + sorted(f"{name}" for name in include & PROVIDED)


def _copy_sources(dest: Path) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", *SOURCES], cwd=_root(), capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_root() / name, target)


def download(reqs: list[str], python_version: str, dest: Path, deps: bool = True) -> None:
    """The wheels of ``reqs`` (with their dependencies, unless ``deps`` is False) for
    ``python_version`` on the GPU machine's platforms, into ``dest``."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    command += [*([] if deps else ["--no-deps"]), "--python-version", python_version]
    command += [*platforms, "-d", str(dest), *reqs]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip download for Python {python_version} failed: {done.stderr[-800:]}")


def build(out: Path, python_versions: tuple[str, ...], include: set[str]) -> int:
    """Write the bundle folder; returns its size in bytes (ValueError when over LIMIT_BYTES)."""
    unknown = include - PROVIDED
    if unknown:
        raise ValueError(f"--with {sorted(unknown)}: allowed values: numpy, pandas, matplotlib")
    shutil.rmtree(out, ignore_errors=True)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    _copy_sources(out / "src")
    from fp4lab.core import records  # pandas: the build side only

    state = {k: v for k, v in records.git_state().items() if k in ("commit", "dirty")}
    (out / "src" / records.BUNDLE_GIT_FILE).write_text(json.dumps(state) + "\n")
    reqs = requirements(include)
    for version in python_versions:
        print(f"downloading wheels for Python {version}: {', '.join(reqs)}", flush=True)
        download(reqs, version, wheels)
    provided = {_normal(name) for name in PROVIDED - include}
    pins = sorted({_pin(p.name) for p in wheels.glob("*.whl")})
    kept = [pin for pin in pins if pin.split("==")[0] not in provided]
    (out / "requirements.txt").write_text("\n".join(kept) + "\n")
    expected = sorted(PROVIDED - include - {"torch", "triton", "flashinfer-python"})
    (out / "expects.txt").write_text("\n".join(expected) + "\n")  # run.sh checks them first
    shutil.copy2(_root() / "scripts" / "gpu_bundle_run.sh", out / "run.sh")
    (out / "run.sh").chmod(0o755)
    return checked_size(out)


def checked_size(out: Path) -> int:
    """The bundle's size in bytes; ValueError when over ``LIMIT_BYTES``."""
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if size > LIMIT_BYTES:
        raise ValueError(
            f"the bundle is {size / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB"
        )
    return size


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pin(filename: str) -> str:
    m = _WHEEL.match(filename)
    return f"{_normal(m['name'])}=={m['version']}"


def missing(pins: list[str]) -> list[str]:
    """The pins whose distribution this interpreter does not have (any version counts)."""
    absent = []
    for pin in pins:
        try:
            importlib.metadata.version(pin.split("==")[0])
        except importlib.metadata.PackageNotFoundError:
            absent.append(pin)
    return absent


def install(wheels: Path, site: Path) -> list[str]:
    """Install, offline and without dependencies, every bundled pin this interpreter lacks."""
    pins = (wheels.parent / "requirements.txt").read_text().split()
    needed = missing(pins)
    if needed:
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        command += ["--find-links", str(wheels), "--target", str(site), *needed]
        subprocess.run(command, check=True)
    return needed


def summary(data: Path) -> list[str]:
    """One line per notebook of the last run: status, seconds, and its skipped and error checks."""
    rows = [json.loads(line) for line in (data / "reproduce.jsonl").read_text().splitlines()]
    lines = []
    for row in rows:
        v = row["values"]
        path = data / f"{v['notebook']}.jsonl"
        records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        own = [r for r in records if r["run_id"] == (records[-1]["run_id"] if records else None)]
        skipped = [r["values"].get("check", "?") for r in own if r["kind"] == "skipped"]
        errors = [r["values"].get("check", "?") for r in own if r["kind"] == "error"]
        unmeasured = [f"{r['kind'].removesuffix('_not_measured')} {r['values'].get('sglang_version', '')}".strip()
                      for r in own if r["kind"].endswith("_not_measured")]  # fmt: skip
        lines.append(
            f"{v['notebook']}: {v['status']} in {v['seconds']:.0f} s; {len(own)} records; "
            f"skipped: {', '.join(skipped) or 'none'}; errors: {', '.join(errors) or 'none'}; "
            f"not measured: {', '.join(unmeasured) or 'none'}"
            + (f"; {v['reason']}" if v["reason"] else "")
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.core.bundle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the bundle folder")
    b.add_argument("out", type=Path)
    b.add_argument("--python-versions", default=",".join(PYTHON_VERSIONS))
    b.add_argument("--with", dest="include", default="", help="numpy,pandas,matplotlib")
    i = sub.add_parser("install", help="install what this interpreter lacks, offline")
    i.add_argument("wheels", type=Path)
    i.add_argument("site", type=Path)
    s = sub.add_parser("summary", help="one line per notebook of the last run")
    s.add_argument("data", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        include = {w.strip() for w in args.include.split(",") if w.strip()}
        versions = tuple(v.strip() for v in args.python_versions.split(",") if v.strip())
        try:
            size = build(args.out, versions, include)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"bundle: {args.out} ({size / 2**20:.1f} MiB); run it with: {args.out}/run.sh OUT")
    elif args.command == "install":
        needed = install(args.wheels, args.site)
        print(f"installed {len(needed)} packages offline: {' '.join(needed) or 'none needed'}")
    else:
        print("\n".join(summary(args.data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
