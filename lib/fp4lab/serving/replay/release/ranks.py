"""Inside one SGLang environment: one rank of one GPU on one gloo process, the way each release
sets it up, and the release's functions called with one rank's values.

``parallel_groups`` runs the release's own set-up: ``distributed.bootstrap`` where the release
has it (0.5.16 on), else ``init_distributed_environment`` / ``initialize_model_parallel`` /
``initialize_dp_attention`` as ``ModelRunner`` calls them; then the release's MoE, FP8 and FP4
GEMM configuration.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from fp4lab.serving.replay.release import kernels
from fp4lab.serving.replay.release.layout import LayoutError

ONE_RANK = {"gpu_id": 0, "dist_port": 0, "local_rank": 0}
"""Values of one rank on one GPU for parameters named so; ``*_size`` is 1, ``*_rank`` is 0."""

CONFIGURE = (
    ("sglang.srt.layers.moe", "initialize_moe_config"),
    ("sglang.srt.layers.quantization.fp8_utils", "initialize_fp8_gemm_config"),
    ("sglang.srt.layers.quantization.fp4_utils", "initialize_fp4_gemm_config"),
)
"""The configuration steps after the groups, where the release has them."""


def call(function: Any, **given: Any) -> Any:
    """``function`` called with the ``given`` values its signature names, and one rank's values
    for the rest it requires (``ONE_RANK``); LayoutError naming a required parameter neither
    covers (a release whose set-up asks for something the replay does not know)."""
    arguments = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if name in given:
            arguments[name] = given[name]
        elif name in ONE_RANK:
            arguments[name] = ONE_RANK[name]
        elif name.endswith(("_size", "_rank")):
            arguments[name] = 1 if name.endswith("_size") else 0
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD
        ):  # fmt: skip
            raise LayoutError(f"{function.__module__}.{function.__qualname__} requires "
                              f"{name!r}, which the replay's one-rank set-up does not know")  # fmt: skip
    return function(**arguments)


def parallel_groups(server_args: Any, model_config: Any) -> None:
    """The release's parallel groups on one gloo process and its configuration (see the module
    docstring)."""
    try:
        bootstrap = importlib.import_module("sglang.srt.distributed.bootstrap")
    except ImportError:  # 0.5.15 and before
        bootstrap = None
    if bootstrap is not None:
        call(bootstrap._init_parallel_groups, backend="gloo",
             dist_init_method="tcp://127.0.0.1:0", server_args=server_args,
             model_config=model_config)  # fmt: skip
        if hasattr(bootstrap, "init_layer_runtime"):
            bootstrap.init_layer_runtime(model_config=model_config)
    else:
        from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
        from sglang.srt.layers.dp_attention import initialize_dp_attention

        init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                     distributed_init_method="tcp://127.0.0.1:0")  # fmt: skip
        initialize_model_parallel(1, 1)
        initialize_dp_attention(server_args=server_args, model_config=model_config)
    for module, name in CONFIGURE:
        configure = kernels.attribute(module, name)
        if configure is not None:
            call(configure, server_args=server_args)
