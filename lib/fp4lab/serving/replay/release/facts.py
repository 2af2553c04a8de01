"""Inside one SGLang environment: what the installed release says of itself, read from its own
code and metadata: the lowest compute capability its ModelOpt NVFP4 config accepts, its version
and the torch it pins."""

from __future__ import annotations

from fp4lab.serving.replay.release import kernels


def min_capability() -> int | None:
    """The lowest compute capability the release's NVFP4 ModelOpt config accepts (its own
    ``get_min_capability``: 100 means SM100), or None where it has none."""
    config = kernels.attribute("sglang.srt.layers.quantization.modelopt_quant", "ModelOptFp4Config")
    return config.get_min_capability() if config is not None else None


def release_rules() -> dict:
    """The release's own rules a decision reads besides its resolution: the lowest SM its NVFP4
    config accepts."""
    return {"min_capability": min_capability()}


def pinned(name: str) -> str | None:
    """The release's own requirement of ``name`` (its wheel's ``Requires-Dist``), e.g. ``==2.11.0``."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    found = [Requirement(r) for r in requires("sglang") or []]
    return next((str(r.specifier) for r in found if r.name == name and r.marker is None), None)


def version() -> str:
    """The installed release's version."""
    import sglang

    return sglang.__version__
