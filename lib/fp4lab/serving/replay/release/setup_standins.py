"""Inside one SGLang environment: what building the release's model on a CPU needs beyond the
simulated GPU (``inside.simulated_gpu``), each returned as a record: the CUDA runtime library
loaded, set-up allocations on the CPU, an alternate stream, the GPU's memory and SM count, and
the loader for dummy weights where a release routes a checkpoint past it (``dummy_loader``).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib
import importlib.util
import logging
import sys
import sysconfig
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fp4lab.compile import target
from fp4lab.serving.replay.release import inside, kernels, layout


class _Stream(torch.cpu.Stream):
    """``torch.cuda.Stream`` during set-up: SGLang makes an alternate stream it uses only while
    capturing CUDA graphs (a CPU stream: in a capture its forks and joins are kept, ``streams``)."""

    stream_id = cuda_stream = property(id)  # what a breakable capture's stream hook reads

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


def libcudart() -> list[dict]:
    """The CUDA runtime library shipped in the environment, loaded (FlashInfer's ``comm`` module
    asserts at import that one is loaded; nothing calls into it)."""
    found = sorted(
        glob.glob(f"{sysconfig.get_paths()['purelib']}/**/libcudart*.so*", recursive=True)
    )
    if not found:
        return []
    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
    return [kernels.record("libcudart_loaded", f"site-packages/{Path(found[0]).name}",
                            "flashinfer/comm/cuda_ipc.py asserts at import that libcudart is "
                            "loaded; the library bundled in the environment is loaded, no CUDA "
                            "call is made")]  # fmt: skip


@contextlib.contextmanager
def building(sm: tuple[int, int]) -> Iterator[list[dict]]:
    """What building the model on a CPU needs beyond the simulated GPU, each listed."""
    listed = [
        kernels.record("cuda_on_cpu", "torch functions with device=cuda, Tensor.cuda/.to",
                        "SGLang's cached device checks say CUDA; set-up allocations go to the CPU"),
        kernels.record("alternate_stream", "torch.cuda.Stream",
                        "DeepSeek's model makes an alternate stream used only in graph capture"),
    ]  # fmt: skip
    with (
        target.attribute_replaced(torch.cuda, "Stream", _Stream),
        kernels.device_queries(sm),
        inside.CudaOnCpu(),
    ):
        yield listed


def gpu_memory_mib(sm: tuple[int, int]) -> int:
    """The memory the simulated GPU of ``sm`` reports (H100, B200, RTX PRO 6000), in MiB."""
    return {(9, 0): 80, (10, 0): 180, (12, 0): 96}.get(sm, 80) * 1024


def deep_gemm_sms(sm_count: int, found: layout.Layout) -> list[dict]:
    """The DSA indexer asks DeepGEMM for the GPU's SM count at construction; DeepGEMM cannot
    import without libnvrtc, so the simulated GPU's count answers."""
    if found.dsa_indexer is None:
        return []
    indexer = importlib.import_module(found.dsa_indexer)
    if not isinstance(getattr(indexer, "deep_gemm", None), Exception):
        return []
    indexer.deep_gemm = types.SimpleNamespace(get_num_sms=lambda: sm_count)
    return [kernels.record("deep_gemm_sm_count", f"{found.dsa_indexer}.deep_gemm.get_num_sms",
                            f"DeepGEMM needs libnvrtc to import; {sm_count} SMs answer")]  # fmt: skip


MEMORY_ASKED_IN = ("sglang.srt.arg_groups.memory_hook", "sglang.srt.arg_groups.pipeline")
"""Modules of reworked releases whose resolution asks the GPU's memory (imported first, so that
their binding is replaced too)."""


def gpu_memory_record(sm: tuple[int, int]) -> dict:
    """The stand-in record of ``gpu_memory_answered``."""
    return kernels.record("gpu_memory", "get_device_memory_capacity (as the release imports it)",
                          f"nvidia-smi is absent; the simulated GPU reports "
                          f"{gpu_memory_mib(sm)} MiB")  # fmt: skip


@contextlib.contextmanager
def gpu_memory_answered(sm: tuple[int, int]) -> Iterator[None]:
    """The simulated GPU's memory answering ``get_device_memory_capacity`` in every module of
    the release that binds it (nvidia-smi is absent; ``gpu_memory_record``)."""
    memory = gpu_memory_mib(sm)
    for hook in MEMORY_ASKED_IN:
        with contextlib.suppress(ImportError):  # a release without it
            importlib.import_module(hook)
    from sglang.srt import server_args as module

    asked = getattr(module, "get_device_memory_capacity", None) or kernels.attribute(
        "sglang.srt.utils.common", "get_device_memory_capacity"
    )
    owners = [m for name, m in list(sys.modules.items()) if asked is not None
              and name.startswith("sglang.") and getattr(m, "get_device_memory_capacity", None) is asked]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for owner in owners:
            stack.enter_context(target.attribute_replaced(
                owner, "get_device_memory_capacity", lambda *a: memory))  # fmt: skip
        yield


NO_DRIVER = "fp4lab-no-cuda-driver"
"""The Triton backend hash inductor is given where Triton's driver finds no libcuda."""


def triton_driver_probe() -> list[dict]:
    """Inductor's Triton backend hash (``torch.utils._triton.triton_hash_with_backend``, a cache
    key it asks for whenever torch says CUDA is there) answers ``NO_DRIVER`` where Triton's NVIDIA
    driver finds no libcuda: the release's ``torch.compile``'d helpers (MoE routing, ...) then
    compile for the CPU tensors they are given, as on a GPU they compile for its tensors."""
    import torch.utils._triton as triton_utils

    asked = triton_utils.triton_hash_with_backend
    if getattr(asked, "__wrapped_by_fp4lab__", False):
        return []

    def hashed() -> str:
        try:
            return asked()
        except AssertionError:  # Triton's "libcuda.so cannot found!"
            return NO_DRIVER

    hashed.__wrapped_by_fp4lab__ = True  # type: ignore[attr-defined]
    triton_utils.triton_hash_with_backend = hashed
    return [kernels.record("triton_driver_probe", "torch.utils._triton.triton_hash_with_backend",
                   "inductor asks Triton's NVIDIA driver for a cache key whenever torch says CUDA "
                   "is there (the simulated GPU); the driver finds no libcuda on this machine, so "
                   f"the key is {NO_DRIVER!r} and the release's torch.compile'd helpers compile "
                   "for the CPU tensors they are given")]  # fmt: skip


def inductor_patterns() -> list[dict]:
    """Inductor's joint-graph patterns built for the CPU where a compiled graph names no device:
    with none, inductor builds their example tensors on the GPU torch says is there (the
    simulated one), which a CPU build cannot allocate; on a GPU they are built there. The
    patterns are matched by shape, not device."""
    from torch._inductor.fx_passes import joint_graph

    initialized = joint_graph.lazy_init
    if getattr(initialized, "__wrapped_by_fp4lab__", False):
        return []

    def on_cpu(input_device: torch.device | None = None) -> Any:
        return initialized(input_device or torch.device("cpu"))

    on_cpu.__wrapped_by_fp4lab__ = True  # type: ignore[attr-defined]
    joint_graph.lazy_init = on_cpu
    return [kernels.record("inductor_patterns", "torch._inductor.fx_passes.joint_graph.lazy_init",
                           "inductor builds its joint-graph patterns' example tensors on the "
                           "device a compiled graph names, or with none on the GPU torch says is "
                           "there; for the simulated GPU they are built on the CPU")]  # fmt: skip


CUBIN_FETCHERS = ("flashinfer.jit.cubin_loader", "flashinfer.artifacts")
"""The FlashInfer modules that hold ``download_file``, which fetches a kernel's cubins from
NVIDIA's servers (retrying three times over 35 s before it gives up)."""


def cubin_downloads_refused() -> list[dict]:
    """FlashInfer's cubin downloads fail at once, as they fail here after their retries (this
    machine reaches no NVIDIA server): the caller sees the same ``False`` 35 s sooner."""
    logger = logging.getLogger("fp4lab.cubins")

    def refused(source: str, destination: str, *args: Any, **kwargs: Any) -> bool:
        logger.warning("no cubin is fetched on this machine: %s", source)
        return False

    held = []
    for name in CUBIN_FETCHERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "download_file"):
            module.download_file = refused
            held.append(f"{name}.download_file")
    return [kernels.record("cubin_downloads_refused", ", ".join(held),
                           "FlashInfer's cubin downloads fail at once, as they fail on this "
                           "machine after 35 s of retries (no NVIDIA server is reachable): the "
                           "kernel whose cubins they fetch is as absent either way")] if held else []  # fmt: skip


FA3_BINARY = "sgl_kernel.flash_ops"
"""sgl_kernel's FA3 library: a CUDA-only binary, which its Python wrapper (``sgl_kernel.flash_attn``)
imports first; 0.5.6-0.5.10's vision and multimodal model modules import that wrapper."""


def loadable(module: str, files: list[Path]) -> bool:
    """Whether a binary module's file is there and imports here (no CUDA driver: it does not)."""
    try:
        return bool(files) and importlib.import_module(module) is not None
    except ImportError:
        return False


def fa3_binary() -> list[dict]:
    """An empty module for ``FA3_BINARY`` where it is absent or does not load here: the release's
    model modules that import FA3's wrapper import as on a GPU (what the wrapper does next, such
    as its FA4 import, is the environment's own); an FA3 kernel called finds no op (not
    measured)."""
    package = importlib.util.find_spec("sgl_kernel")
    folders = package.submodule_search_locations if package else None
    if folders and not loadable(
        FA3_BINARY, [p for f in folders for p in Path(f).glob("flash_ops*.so")]
    ):
        sys.modules[FA3_BINARY] = types.ModuleType(FA3_BINARY)
        return [kernels.record("fa3_binary", FA3_BINARY,
                               "sgl_kernel's FA3 binary is CUDA-only; an empty module stands for "
                               "it, so the model modules importing FA3's Python wrapper (vision "
                               "towers of multimodal models, which the replay does not run) import "
                               "as on a GPU; an FA3 kernel called finds no op (not measured)",
                               [f"{FA3_BINARY}.*"])]  # fmt: skip
    return []


PREQUANTIZED_DUMMY = kernels.record(
    "dummy_loader_for_prequantized", "sglang.srt.model_loader.loader.ModelOptModelLoader",
    "0.5.4 sends a ModelOpt checkpoint to ModelOptModelLoader ahead of the dummy load format; "
    "for one it counts as quantized already, that loader's load_model is DefaultModelLoader's "
    "(weights read from files), so the release's DummyModelLoader builds the same model with "
    "dummy weights, as from 0.5.5 its get_model_loader does",
)  # fmt: skip


def dummy_loader(get_model_loader: Any, load_config: Any, model_config: Any
                 ) -> tuple[Any, list[dict]]:  # fmt: skip
    """The release's loader for dummy weights. From 0.5.5 ``get_model_loader`` answers the dummy
    load format first; 0.5.4 sends any ModelOpt checkpoint to ``ModelOptModelLoader`` ahead of
    it. For a checkpoint 0.5.4 counts as quantized already (``_is_already_quantized``: it has
    ``hf_quant_config.json``), that loader's ``load_model`` is ``DefaultModelLoader``'s, which
    reads weight files; 0.5.4's own ``DummyModelLoader`` builds the same model (the same
    ``_initialize_model``) with dummy weights, as later releases choose. A checkpoint it counts
    as unquantized goes to ModelOpt's quantize workflow, which needs real weights: left as is.
    Returns the loader and, where it stands in, its record."""
    loader = get_model_loader(load_config, model_config)
    quantized = getattr(model_config, "_is_already_quantized", None)
    if type(loader).__name__ != "ModelOptModelLoader" or quantized is None or not quantized():
        return loader, []
    from sglang.srt.model_loader.loader import DummyModelLoader

    return DummyModelLoader(load_config), [PREQUANTIZED_DUMMY]
