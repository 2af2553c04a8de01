"""Where the installed SGLang release keeps what the replay drives, read from its files.

Release drift is handled here and nowhere else: one adapter per family of layouts (``FAMILIES``)
names the files a family must have; the probe reads the installed package's files (nothing of it
is imported) and answers the family, the home of the DSA indexer (``nsa`` until 0.5.12,
``dsa`` from 0.5.13) and which of the model classes the replay builds its source defines. A
layout no adapter knows raises ``LayoutError`` naming what is missing, before anything is built.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FAMILIES = {
    "runner": ("srt/model_executor/piecewise_cuda_graph_runner.py", "srt/server_args.py"),
    "reworked": (
        "srt/runtime_context.py",
        "srt/model_executor/runner_backend/tc_piecewise_cuda_graph_backend.py",
    ),
}
"""Each family and the files that make a release one of it: ``runner``, ``PiecewiseCudaGraphRunner``
built by ``ModelRunner`` (0.5.3 to 0.5.13); ``reworked``, ``runtime_context`` and the
``tc_piecewise`` prefill backend driven through ``init_cuda_graphs`` (0.5.14 on). The first
family whose files are all present is the release's."""

DSA_HOMES = (
    "srt/layers/attention/dsa/dsa_indexer.py",
    "srt/layers/attention/nsa/nsa_indexer.py",
)
"""Where a release keeps the DSA indexer, the newest home first (0.5.13 ships both ``nsa`` and
``dsa``; its models import ``dsa``)."""

MODEL_FILES = "srt/models/*.py"


class LayoutError(RuntimeError):
    """The installed release's layout is one no adapter knows; names what is missing."""


@dataclass(frozen=True)
class Layout:
    """The installed release's layout: its family, its DSA indexer module, and the model classes
    its source defines among those asked about."""

    family: str
    root: Path
    dsa_indexer: str | None
    model_classes: tuple[str, ...]

    @property
    def reworked(self) -> bool:
        return self.family == "reworked"

    def as_record(self) -> dict:
        return {"family": self.family, "dsa_indexer": self.dsa_indexer,
                "model_classes_in_source": list(self.model_classes)}  # fmt: skip


def package_root() -> Path:
    """The installed ``sglang`` package folder (found, not imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise LayoutError("no sglang package is installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def family(root: Path) -> str:
    """The first family of FAMILIES whose files ``root`` holds; LayoutError naming each family's
    missing files otherwise."""
    missing = {}
    for name, files in FAMILIES.items():
        absent = [f for f in files if not (root / f).exists()]
        if not absent:
            return name
        missing[name] = absent
    said = "; ".join(f"{name} lacks {', '.join(files)}" for name, files in missing.items())
    raise LayoutError(f"the installed SGLang's layout is none the replay knows: {said}")


def _defined_in(root: Path, names: tuple[str, ...]) -> dict[str, Path]:
    """Each of ``names`` that a ``class NAME`` statement in the release's model files defines,
    with the first such file."""
    pattern = re.compile(rf"^class ({'|'.join(map(re.escape, names))})\b", re.MULTILINE)
    found: dict[str, Path] = {}
    for path in sorted(root.glob(MODEL_FILES)):
        for name in pattern.findall(path.read_text(errors="replace")):
            found.setdefault(name, path)
    return found


def classes_in_source(root: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """Which of ``names`` a ``class NAME`` statement in the release's model files defines."""
    found = _defined_in(root, names)
    return tuple(n for n in names if n in found)


def module_defining(name: str) -> str | None:
    """The release's model module whose source has a ``class NAME`` statement (dotted)."""
    root = package_root()
    found = _defined_in(root, (name,)).get(name)
    return "sglang." + ".".join(found.relative_to(root).with_suffix("").parts) if found else None


@cache
def probe(architectures: tuple[str, ...]) -> Layout:
    """The installed release's layout (see the module docstring)."""
    root = package_root()
    home = next((f for f in DSA_HOMES if (root / f).exists()), None)
    indexer = "sglang." + home.removesuffix(".py").replace("/", ".") if home else None
    return Layout(family(root), root, indexer, classes_in_source(root, architectures))
