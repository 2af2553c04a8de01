"""Where fp4lab reads and writes: the repository's data/, figures/ and ignored build/ folders.

``use_build_caches()`` points every cache a dependency would put in the home directory into build/cache
(call it before torch or FlashInfer is imported), so a run leaves nothing outside the checkout.
Records and figures go to build/ unless FP4LAB_DATA_DIR / FP4LAB_FIGURES_DIR say otherwise:
the make targets point them at the committed data/ and figures/, tests at temporary folders.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
COMMITTED_DATA = REPO_ROOT / "data"

_CACHE_VARIABLES = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "MPLCONFIGDIR": "matplotlib",
    "TRITON_CACHE_DIR": "triton",
    "XDG_CACHE_HOME": "xdg",
    "HF_HOME": "huggingface",
    "IPYTHONDIR": "ipython",
    "TVM_FFI_CACHE_DIR": "tvm-ffi",  # SGLang's JIT kernels' sources (their builds are refused)
}


def build_dir() -> Path:
    """The ignored folder for executed notebooks, HTML, environments and caches."""
    return Path(os.environ.get("FP4LAB_BUILD_DIR", REPO_ROOT / "build"))


def shown(path: Path) -> str:
    """``path`` as output shows it: from the build folder (``build/...``) or the repository
    (``./...``) where it lies in one, else as it is."""
    for root, said in ((build_dir(), "build"), (REPO_ROOT, ".")):
        if Path(path).is_relative_to(root):
            return f"{said}/{Path(path).relative_to(root)}"
    return str(path)


def unrooted(text: str) -> str:
    """``text`` (an exception's message) with this machine's build folder and repository written
    as ``build`` and ``.``, as ``shown`` writes a path."""
    for root, said in ((build_dir(), "build"), (REPO_ROOT, ".")):
        text = text.replace(str(root), said)
    return text


def data_dir() -> Path:
    """Where result records (JSON lines) are written: build/data unless FP4LAB_DATA_DIR says.

    The make targets point it at the committed data/; an interactive session writes to the
    ignored build/ folder, so exploring never changes the committed results.
    """
    return Path(os.environ.get("FP4LAB_DATA_DIR", build_dir() / "data"))


def figures_dir() -> Path:
    """Where measured figures are written: build/figures unless FP4LAB_FIGURES_DIR says."""
    return Path(os.environ.get("FP4LAB_FIGURES_DIR", build_dir() / "figures"))


def record_files() -> dict[str, Path]:
    """Each notebook's record file by name: data_dir()'s, else (interactively) the committed one."""
    folders = [data_dir()] if "FP4LAB_DATA_DIR" in os.environ else [COMMITTED_DATA, data_dir()]
    return {p.stem: p for folder in folders for p in sorted(folder.glob("*.jsonl"))}


def _files(path: Path) -> dict[tuple[int, int], os.stat_result]:
    """Every regular file below ``path`` (symbolic links not followed), once per inode."""
    found = {}
    for folder, _, names in os.walk(path):
        for name in names:
            status = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(status.st_mode):
                found[(status.st_dev, status.st_ino)] = status
    return found


def disk_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path``, a file hardlinked several times counted once."""
    return sum(status.st_size for status in _files(path).values())


def unshared_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path`` that no other path links to: what it adds to
    the disk beside a cache it was hardlinked from."""
    return sum(s.st_size for s in _files(path).values() if s.st_nlink == 1)


def use_build_caches() -> None:
    """Point every known cache into build/cache unless the caller chose a place already."""
    cache = build_dir() / "cache"
    for variable, sub in _CACHE_VARIABLES.items():
        if variable not in os.environ:
            os.environ[variable] = str(cache / sub)
            Path(os.environ[variable]).mkdir(parents=True, exist_ok=True)
