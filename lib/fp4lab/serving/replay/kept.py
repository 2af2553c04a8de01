"""Replays kept between runs, and taken again only where nothing they were measured from changed.

One file per (model, release, SM, walk) under build/sglang-compile/kept/, holding the replay, the
time it was measured and its key: a digest of fp4lab's own source, the release's environment
(the steps it was built by, its installed pins and stand-ins, its interpreter), the model's tiny
checkpoint, the walk (``child.MODES``) and, for the story's walk, its CUDA_HOME values. A replay
that ended in a child's or fork's failure (a timeout, a crash) is not kept. A replay taken again
says so (``"kept": {"replayed_utc": ...}``); deleting the folder makes every replay run again.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
from pathlib import Path

from fp4lab.core import paths, venvs
from fp4lab.serving.replay import env
from fp4lab.serving.replay.shared import models

FOLDER = "sglang-compile/kept"
"""Under the build folder."""


@functools.cache
def source_digest() -> str:
    """A digest of fp4lab's own Python source, every file by its path and bytes."""
    root = paths.REPO_ROOT / "lib" / "fp4lab"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def key(environment: env.CompileEnv, model: models.Model, walk: str, cuda_home: list[str]) -> str:
    """The digest of everything a replay of ``model``'s ``walk`` in ``environment`` depends on."""
    stamp = environment.python.parent.parent / venvs.STAMP
    built = {k: getattr(environment, k) for k in ("version", "pins", "installed", "standins",
                                                   "deep_gemm", "site")}  # fmt: skip
    parts = {"fp4lab": source_digest(), "environment": built, "python": str(environment.python),
             "steps": stamp.read_text() if stamp.exists() else None, "model": model.tiny()[:2],
             "walk": walk, "cuda_home": cuda_home if walk == "story" else None}  # fmt: skip
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _path(version: str, sm: str, model: models.Model, walk: str) -> Path:
    return paths.build_dir() / FOLDER / f"{model.name}-{version}-sm{sm}-{walk}.json"


def taken(version: str, sm: str, model: models.Model, walk: str, digest: str) -> dict | None:
    """The kept replay of this slot if its key is ``digest``, marked as kept; else None."""
    path = _path(version, sm, model, walk)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if found.get("key") != digest:
        return None
    return {**found["replay"], "kept": {"replayed_utc": found["replayed_utc"]}}


def keep(version: str, sm: str, model: models.Model, walk: str, digest: str, replay: dict) -> None:
    """Keep a replay just measured, unless its child or fork failed (``"error"``)."""
    if "error" in replay:
        return
    path = _path(version, sm, model, walk)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"key": digest, "replayed_utc": now, "replay": replay},
                                  default=str))  # fmt: skip
    partial.replace(path)
