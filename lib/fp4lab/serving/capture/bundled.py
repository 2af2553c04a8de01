"""SGLang's own piecewise backend in the offline GPU bundle: the story's release, for the drive of
notebook 04's stack (``sglang_backend``), with real CUDA-graph capture where a GPU is.

``add`` (where a registry is reachable) puts into the bundle's ``sglang/`` folder the release's
wheel and the wheels of what loading its backend imports (``IMPORT_PROBE``, run in the release's
CPU environment), less what the bundle or the GPU machine's own stack brings; and SGLang's kernel
package as Python files with fp4lab's stand-in for its op library (its CUDA binaries, 1.6 GB, do
not fit; the drive calls none of its ops). ``install`` (``run.sh``, offline) installs them into a
folder under build/. There ``environment`` answers ``capture.study`` for that release and refuses
every other with the reason, without trying the registry the GPU machine cannot reach.

    python -m fp4lab.serving.capture.bundled add BUNDLE [--python-versions 3.11,3.12]
    python -m fp4lab.serving.capture.bundled install BUNDLE/sglang
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fp4lab.core import bundle, paths
from fp4lab.serving import sglang_env, standins
from fp4lab.serving.capture import breakable_timing
from fp4lab.serving.replay import env, versions

RELEASE = versions.STORY_VERSION
FOLDER = "sglang"
"""The bundle's folder: ``wheels/``, ``requirements.txt`` (the release's pin first), ``site/``
and ``standins.json``."""
OFFLINE = "FP4LAB_OFFLINE_BUNDLE"
"""Set by ``run.sh``: no environment is built there; only the bundled release is answered."""
MARKER = "bundled.json"
BREAKABLE = "breakable"
"""The folder (in ``FOLDER`` and where it is installed) of each release's breakable-capture
files (``breakable_timing.FILES``), one folder per release whose wheel has them."""

IMPORT_PROBE = (
    "import sys; sys.modules['flashinfer'] = None\n"
    "import importlib.metadata as m, json, torch\n"
    "from fp4lab.serving.replay.release import inside\n"
    "from fp4lab.serving.capture import sglang_backend\n"
    "from fp4lab.serving.capture.release import Release\n"
    "before = set(sys.modules)\n"
    "with inside.simulated_gpu((10, 0)):\n"
    "    Release.load(False)\n"
    "owners = m.packages_distributions()\n"
    "tops = {n.split('.')[0] for n in set(sys.modules) - before}\n"
    "print(json.dumps({d: m.version(d) for t in sorted(tops) for d in owners.get(t, [])}))\n"
)
"""The distributions loading the release's backend imports beyond fp4lab's drive, with FlashInfer
kept out (the GPU machine may lack it; the backend does not need it)."""

KEPT_OUT = {"sglang", "sgl-kernel", "sglang-kernel", "fp4lab"}
"""Bundled otherwise (the release's wheel, the kernel package's Python files) or in ``src/``."""

NO_KERNEL_BINARIES = {
    "name": "sgl_kernel_binaries_not_bundled",
    "file": "sgl_kernel/**/*.so",
    "why": "sgl_kernel's CUDA binaries (1.6 GB) do not fit the offline bundle; the drive calls "
    "none of its ops (the stack's kernels are torch's), and sgl_kernel's loader falls back to "
    "the `common_ops` stand-in",
}
"""The bundle's own stand-in entry, beside those of the release's CPU environment."""

OPS_STANDIN = next(s.path for s in standins.STANDINS if s.name == "sgl_kernel_ops")


def provided() -> set[str]:
    """The distributions the GPU machine brings (``bundle.PROVIDED``) and all they require, read
    from this interpreter's metadata."""
    todo, seen = list(bundle.PROVIDED), set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            needs = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [Requirement(r).name for r in needs if "extra ==" not in r]
    return seen


def imported(python: Path) -> dict[str, str]:
    """What loading the release's backend imports (``IMPORT_PROBE``): each distribution and its
    version in the environment of ``python``."""
    lib = str(paths.REPO_ROOT / "lib")
    done = subprocess.run([python, "-c", IMPORT_PROBE], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": lib})  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the import probe failed in {python}: {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def add(out: Path, python_versions: tuple[str, ...]) -> int:
    """Write ``out/sglang`` into the bundle at ``out`` (``bundle.build``'s); returns the whole
    bundle's size in bytes (ValueError when over ``bundle.LIMIT_BYTES``)."""
    built = env.ensure_env(RELEASE)
    if not built.ok:
        raise RuntimeError(f"SGLang {RELEASE}'s environment: {built.error}")
    already = {pin.split("==")[0] for pin in (out / "requirements.txt").read_text().split()}
    skip = provided() | already | KEPT_OUT
    needed = {n: v for n, v in imported(built.python).items() if canonicalize_name(n) not in skip}
    folder = out / FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    pins = [f"sglang=={RELEASE}", *(f"{n}=={v}" for n, v in sorted(needed.items()))]
    for version in python_versions:
        print(f"downloading SGLang {RELEASE}'s drive for Python {version}: {', '.join(pins)}")
        bundle.download(pins, version, folder / "wheels", deps=False)
    (folder / "requirements.txt").write_text("\n".join(pins) + "\n")
    site, copied = standins.site_packages(str(built.python)), folder / "site"
    kernel = standins.KERNEL_BINARIES
    shutil.copytree(site / kernel, copied / kernel,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so*"))  # fmt: skip
    for info in site.glob(f"{kernel}-*.dist-info"):
        shutil.copytree(info, copied / info.name)
    shutil.copy2(site / OPS_STANDIN, copied / OPS_STANDIN)
    manifest = [*built.standins, NO_KERNEL_BINARIES]
    (folder / "standins.json").write_text(json.dumps(manifest, indent=1) + "\n")
    add_breakable(folder / BREAKABLE)
    return bundle.checked_size(out)


def add_breakable(folder: Path) -> list[str]:
    """Into ``folder/VERSION``, from each release's wheel that has them, the files of its
    breakable capture (``breakable_timing.FILES``); returns the releases carried."""
    inside = breakable_timing.MODULE.rsplit(".", 1)[0].replace(".", "/")
    carried = []
    for version in versions.VERSIONS:
        wheel, error = sglang_env.download_wheel(version, env.env_dir(version) / "wheel")
        if wheel is None:
            raise RuntimeError(error)
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            if not all(f"{inside}/{name}" in names for name in breakable_timing.FILES):
                continue
            (folder / version).mkdir(parents=True)
            for name in breakable_timing.FILES:
                (folder / version / name).write_bytes(archive.read(f"{inside}/{name}"))
        carried.append(version)
    print(f"breakable capture files of SGLang {versions.ranges(carried)} carried")
    return carried


def install(folder: Path) -> Path:
    """Install the bundled release (``folder``: the bundle's ``sglang/``) offline into its folder
    under build/, for the interpreter running this; returns the folder's marker."""
    pins = (folder / "requirements.txt").read_text().split()
    installed = dict(pin.split("==") for pin in pins)
    home = env.env_dir(installed["sglang"]) / "bundled"
    shutil.rmtree(home, ignore_errors=True)
    site = home / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--find-links", str(folder / "wheels"), "--target", str(site), *pins],
                   check=True)  # fmt: skip
    shutil.copytree(folder / "site", site, dirs_exist_ok=True)
    shutil.copytree(folder / BREAKABLE, home / BREAKABLE)
    for info in site.glob(f"{standins.KERNEL_BINARIES}-*.dist-info"):  # name-version.dist-info
        installed["sgl-kernel"] = info.name.removesuffix(".dist-info").split("-")[-1]
    marker = home / MARKER
    marker.write_text(json.dumps({"python": sys.executable, "site": str(site), "installed": installed,
                                  "standins": json.loads((folder / "standins.json").read_text())}))  # fmt: skip
    return marker


def _home() -> Path:
    return env.env_dir(RELEASE) / "bundled"


def breakable_files(version: str) -> Path | None:
    """Inside the offline bundle: the folder of ``version``'s breakable-capture files, or None
    where the bundle carries none (its wheel has none)."""
    found = _home() / BREAKABLE / version
    return found if found.is_dir() else None


def breakable_releases() -> list[str]:
    """Inside the offline bundle: the releases whose breakable capture it carries, oldest first."""
    folder = _home() / BREAKABLE
    carried = [p.name for p in folder.iterdir()] if offline() and folder.is_dir() else []
    return sorted(carried, key=versions.order)


def offline() -> bool:
    """Whether this runs inside the offline bundle (``OFFLINE`` set by ``run.sh``)."""
    return bool(os.environ.get(OFFLINE))


def environment(version: str) -> env.CompileEnv | None:
    """Inside the offline bundle: the bundled release's environment, or a failed one saying the
    bundle carries another release; elsewhere None (environments are built)."""
    if not offline():
        return None
    marker = env.env_dir(version) / "bundled" / MARKER
    if not marker.exists():
        return env.CompileEnv(version, "failed", error=(
            f"the offline GPU bundle carries SGLang {RELEASE} only; {version} needs a package "
            f"registry to build its environment"))  # fmt: skip
    found = json.loads(marker.read_text())
    return env.CompileEnv(version, "bundled", python_path=found["python"], site=found["site"],
                          standins=found["standins"], installed=found["installed"])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.serving.capture.bundled",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="add SGLang's backend to a bundle built by core.bundle")
    a.add_argument("out", type=Path)
    a.add_argument("--python-versions", default=",".join(bundle.PYTHON_VERSIONS))
    i = sub.add_parser("install", help="install it offline, for this interpreter")
    i.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "add":
        chosen = tuple(v.strip() for v in args.python_versions.split(",") if v.strip())
        try:
            size = add(args.out, chosen)
        except ValueError as exc:  # over the limit
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except RuntimeError as exc:  # the release's environment or the import probe failed
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"bundle: {args.out} ({size / 2**20:.1f} MiB) with SGLang {RELEASE}'s backend")
    else:
        print(f"SGLang's backend installed offline: {install(args.folder).parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
