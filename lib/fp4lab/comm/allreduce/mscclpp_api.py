"""What the installed SGLang exposes for MSCCL++, read from the package itself.

SGLang's MSCCL++ API moved between releases: the supported world sizes became a module
constant of ``pymscclpp`` (once a class attribute of ``PyMscclppCommunicator``), the switch
``parallel_state.set_mscclpp_all_reduce`` became ``set_mscclpp``, ``initialize_model_parallel``
lost its ``tensor_model_parallel_size`` keyword (widths now come from the runtime context), and
the tuned configurations became ``_best_configs`` (keyed by collective). ``describe`` reports
which of these the installed package has; ``fp4lab.comm.allreduce`` decides by it. Runnable as
a script with SGLang's interpreter (it imports nothing from fp4lab):
``python mscclpp_api.py`` prints the description as JSON.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys

MSCCLPP_NOT_ON_REGISTRY = (
    "the mscclpp Python package is not importable (it is not a dependency of sglang and is not "
    "on the package registry: it is built from source, github.com/microsoft/mscclpp)"
)


def _first(owner: object, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if hasattr(owner, n)), None)


def describe() -> dict:
    """The MSCCL++ API of the installed SGLang: names, signatures, world sizes, the package."""
    try:
        from sglang.srt.distributed import parallel_state
        from sglang.srt.distributed.device_communicators import pymscclpp
    except Exception as exc:  # absent, or broken on this machine: either way not usable
        return {"importable": False, "error": f"{type(exc).__name__}: {exc}"}
    communicator = pymscclpp.PyMscclppCommunicator
    sizes = getattr(pymscclpp, "_SUPPORTED_WORLD_SIZES", None)
    where = "pymscclpp._SUPPORTED_WORLD_SIZES"
    if sizes is None:
        sizes = getattr(communicator, "_SUPPORTED_WORLD_SIZES", None)
        where = "PyMscclppCommunicator._SUPPORTED_WORLD_SIZES" if sizes is not None else None
    source = inspect.getsource(communicator)
    configs = next((n for n in ("_best_configs", "best_configs") if f"self.{n} =" in source), None)
    try:
        from sglang.test import test_utils

        topology = (
            "publish_build_topology" if hasattr(test_utils, "publish_build_topology") else None
        )
    except Exception:
        topology = None
    parameters = list(inspect.signature(parallel_state.initialize_model_parallel).parameters)
    return {
        "importable": True,
        "world_sizes": list(sizes) if sizes is not None else None,
        "world_sizes_from": where,
        "set_mscclpp": _first(parallel_state, ("set_mscclpp", "set_mscclpp_all_reduce")),
        "tp_keyword": "tensor_model_parallel_size" in parameters,
        "topology_helper": topology,
        "best_configs": configs,
        "mscclpp_importable": importlib.util.find_spec("mscclpp") is not None,
    }


def unsupported(api: dict, world_size: int) -> str | None:
    """Why SGLang's MSCCL++ cannot run ``world_size`` ranks with this API, or None when it can."""
    if not api.get("importable"):
        return f"sglang's MSCCL++ communicator cannot be imported here ({api.get('error')})"
    missing = [k for k in ("world_sizes", "set_mscclpp", "best_configs") if not api.get(k)]
    if not api.get("tp_keyword") and not api.get("topology_helper"):
        missing.append("a way to set the tensor-parallel width")
    if missing:
        return f"this SGLang's MSCCL++ API lacks what fp4lab needs: {', '.join(missing)}"
    if world_size not in api["world_sizes"]:
        sizes = ", ".join(map(str, api["world_sizes"]))
        return f"SGLang's MSCCL++ communicator supports world sizes {sizes}, not {world_size}"
    if not api.get("mscclpp_importable"):
        return MSCCLPP_NOT_ON_REGISTRY
    return None


if __name__ == "__main__":
    print(json.dumps(describe()))
    sys.exit(0)
