"""Inside one SGLang environment: what the installed release says about a model architecture and
piecewise CUDA graphs, read from its own code: the NVFP4 minimum capability, the piecewise
options of its own parser, its auto-disable rule, and from those the flags the model's user
passes.
"""

from __future__ import annotations

import importlib
from typing import Any

from fp4lab.serving import read_parser
from fp4lab.serving.replay import kernels
from fp4lab.serving.replay.flags import user_flags


def min_capability() -> int | None:
    """The lowest compute capability the release's NVFP4 ModelOpt config accepts (its own
    ``get_min_capability``: 100 means SM100), or None where it has none."""
    config = kernels.attribute("sglang.srt.layers.quantization.modelopt_quant", "ModelOptFp4Config")
    return config.get_min_capability() if config is not None else None


def piecewise_options() -> list[dict]:
    """The piecewise / prefill CUDA-graph options of the release's own ``ServerArgs`` parser."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    wanted = ("piecewise-cuda-graph", "cuda-graph-backend")
    return [
        o for o in read_parser.describe(parser) if any(w in " ".join(o["options"]) for w in wanted)
    ]


AUTO_DISABLE = (
    ("sglang.srt.configs.model_config", "is_piecewise_cuda_graph_disabled_model"),
    ("sglang.srt.configs.model_config", "piecewise_cuda_graph_disabled_model_archs"),
)
"""Where a release decides that a model architecture gets no piecewise CUDA graphs unless
enforced: its function, else its list (releases before 0.5.1x have neither)."""


def auto_disabled(architecture: str) -> dict:
    """Whether the release's own auto-disable rule turns piecewise graphs off for
    ``architecture``, and which of its names said so (``None``: the release has no such rule)."""
    for module, name in AUTO_DISABLE:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if callable(found):
            return {"architecture": architecture, "disabled": bool(found([architecture])),
                    "from": f"{module}.{name}"}  # fmt: skip
        if found is not None:
            return {"architecture": architecture, "disabled": architecture in found,
                    "from": f"{module}.{name}"}  # fmt: skip
    return {"architecture": architecture, "disabled": False, "from": None}


def server_flags(architecture: str) -> dict:
    """The piecewise options the user of ``architecture`` passes to this release
    (``flags.user_flags`` on its own parser and auto-disable rule) as ``ServerArgs`` fields."""
    flags, _ = user_flags(piecewise_options(), auto_disabled(architecture)["disabled"])
    fields: dict = {}
    for i, flag in enumerate(flags or []):
        if flag.startswith("--"):
            value = (flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--")
                     else True)  # fmt: skip
            fields[flag[2:].replace("-", "_")] = value
    return fields


def release_rules(architecture: str) -> dict:
    """The release's own rules for ``architecture``: its piecewise options, its auto-disable
    rule, the lowest SM its NVFP4 config accepts."""
    found: dict[str, Any] = {"min_capability": min_capability()}
    try:
        found["piecewise_options"] = piecewise_options()
        found["auto_disabled"] = auto_disabled(architecture)
    except Exception as exc:  # recorded: the parser could not be built here
        found["piecewise_options_error"] = f"{type(exc).__name__}: {exc}"
    return found
