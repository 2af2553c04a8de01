"""Inside one SGLang environment: what the installed release says of NVFP4, read from its own
code: the lowest compute capability its ModelOpt NVFP4 config accepts."""

from __future__ import annotations

from fp4lab.serving.replay import kernels


def min_capability() -> int | None:
    """The lowest compute capability the release's NVFP4 ModelOpt config accepts (its own
    ``get_min_capability``: 100 means SM100), or None where it has none."""
    config = kernels.attribute("sglang.srt.layers.quantization.modelopt_quant", "ModelOptFp4Config")
    return config.get_min_capability() if config is not None else None


def release_rules() -> dict:
    """The release's own rules a decision reads besides its resolution: the lowest SM its NVFP4
    config accepts."""
    return {"min_capability": min_capability()}
