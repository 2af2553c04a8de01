"""Inside one SGLang environment: the set-up of releases whose engine was reworked (0.5.2x).

There ``ServerArgs`` is a ``msgspec.Struct`` resolved by a pipeline when the process entry
publishes it (``runtime_context.publish``; flags live in the published config bags), the parallel
groups come from ``distributed.bootstrap``, and prefill graphs are built by
``ModelRunner.init_cuda_graphs`` through ``capture_prefill_graph`` into ``PrefillCudaGraphRunner``,
whose ``tc_piecewise`` backend (``TcPiecewiseCudaGraphBackend``) runs one eager forward, installs
``install_torch_compiled(fullgraph=True)`` and warms every capture size up under torch.compile.
Everything here calls the release's own functions; what stands in is returned as a record.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import _pop_mode_temporarily

from fp4lab.compile import target
from fp4lab.serving.replay import kernels

TOKENS_FIELD = "cuda_graph_max_bs_prefill"
"""The reworked parser's cap on prefill capture sizes (tokens, for ``tc_piecewise``)."""

REQUESTS = 4
"""Requests the stand-in request pool holds (the runner sizes its buffers from it)."""


def is_reworked() -> bool:
    """Whether the installed SGLang has the reworked set-up (its ``runtime_context`` module),
    read from its files before anything of it is imported."""
    spec = importlib.util.find_spec("sglang")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return any((Path(root) / "srt" / "runtime_context.py").exists() for root in roots)


class _Kernels(types.ModuleType):
    """A module of ``deep_gemm`` whose every function is a CUDA kernel (raises when called)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{self.__name__}.{name} is a DeepGEMM CUDA kernel (not on a CPU)")

        return kernel


class _DeepGemmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, sm_count: int) -> None:
        self.sm_count = sm_count

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "deep_gemm" or fullname.startswith("deep_gemm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Kernels(spec.name)
        module.__path__ = []
        if spec.name == "deep_gemm":
            module.get_num_sms = lambda: self.sm_count
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def deep_gemm_standin(sm_count: int) -> list[dict]:
    """``deep_gemm`` as kernel stubs where it cannot import (the release imports it at module
    level on CUDA; its binary needs libnvrtc); ``get_num_sms`` answers the simulated GPU's count."""
    try:
        import deep_gemm  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        sys.modules.pop("deep_gemm", None)
        sys.meta_path.insert(0, _DeepGemmFinder(sm_count))
        return [kernels.record("deep_gemm_kernels", "deep_gemm (every module)",
                               "DeepGEMM's binary needs libnvrtc; the release imports it at module "
                               f"level, so its functions are stubs that raise when called (no "
                               f"kernel of it runs here) and get_num_sms answers {sm_count}")]  # fmt: skip
    return []


def fields(cls: Any) -> set[str]:
    """The fields a ``ServerArgs`` class takes (a dataclass or a ``msgspec.Struct``)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__struct_fields__", ()))


def publish(server_args: Any) -> None:
    """The release's own resolution pipeline and config bags, as the scheduler publishes them."""
    from sglang.srt.runtime_context import SpawnRanks, publish

    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))


def chosen() -> dict:
    """What the release's resolution chose for GLM-5 on the simulated GPU (its config bags)."""
    from sglang.srt import runtime_context as context

    found: dict[str, Any] = {}
    for getter, names in (
        ("get_model", ("kv_cache_dtype", "quantization")),
        ("get_schedule", ("page_size",)),
        ("get_attention", ("attention_backend", "prefill_attention_backend",
                           "decode_attention_backend", "dsa_prefill_backend", "dsa_decode_backend")),
    ):  # fmt: skip
        bag = getattr(context, getter, None)
        for name in names:
            with contextlib.suppress(Exception):
                found[name] = getattr(bag(), name)
    with contextlib.suppress(Exception):
        prefill = context.get_exec().graph.cuda_graph_config.prefill
        found["prefill_graph"] = {"backend": str(prefill.backend), "capture_tokens": prefill.bs,
                                  "tc_compiler": prefill.tc_compiler}  # fmt: skip
    return found


def distributed(server_args: Any, model_config: Any) -> None:
    """The release's parallel groups on one gloo process, its layer runtime, and its MoE / FP8 /
    FP4 GEMM configuration, in the scheduler's order."""
    from sglang.srt.distributed import bootstrap

    bootstrap._init_parallel_groups(backend="gloo", dist_init_method="tcp://127.0.0.1:0",
                                    server_args=server_args, gpu_id=0)  # fmt: skip
    bootstrap.init_layer_runtime(model_config=model_config)
    for module, name in (("sglang.srt.layers.moe", "initialize_moe_config"),
                         ("sglang.srt.layers.quantization.fp8_utils", "initialize_fp8_gemm_config"),
                         ("sglang.srt.layers.quantization.fp4_utils", "initialize_fp4_gemm_config")):  # fmt: skip
        configure = kernels.attribute(module, name)
        if configure is not None:
            configure()


HOST_STANDINS = [
    kernels.record("pre_model_load_memory", "bootstrap.measure_pre_model_load_memory",
                   "no GPU memory to measure; the runner host records a figure"),
    kernels.record("request_pool", "model_runner.req_to_token_pool",
                   f"a table of {REQUESTS} requests instead of the GPU request pool"),
]  # fmt: skip


def _kv_cache_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache dtype the release resolved (its model bag), as the attention backend holds it."""
    from sglang.srt.runtime_context import get_model

    named = str(get_model().kv_cache_dtype)
    return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(named, model_dtype)


def host(values: dict) -> Any:
    """A ``ModelRunner`` without ``__init__`` (it would allocate KV pools and profile GPU memory),
    holding ``values`` and what the release's own set-up steps compute: its parallel placement
    (``init_torch_distributed``), MoE top-k, layer indices, n-gram embedding manager."""
    from sglang.srt.model_executor import model_runner as module

    runner = module.ModelRunner.__new__(module.ModelRunner)
    pool = types.SimpleNamespace(
        size=REQUESTS, req_to_token=torch.zeros(REQUESTS, values["model_config"].context_len,
                                                dtype=torch.int32),
    )  # fmt: skip
    extra = {"lora_manager": None, "canary_manager": None, "forward_stream": None,
             "max_running_requests": REQUESTS,
             "max_total_num_tokens": REQUESTS * 64, "req_to_token_pool": pool}  # fmt: skip
    for name, value in {**values, **extra}.items():
        setattr(runner, name, value)
    runner.attn_backend.token_to_kv_pool = runner.token_to_kv_pool
    runner.attn_backend.kv_cache_dtype = _kv_cache_dtype(values["dtype"])
    with target.attribute_replaced(module.bootstrap, "measure_pre_model_load_memory",
                                   lambda **kwargs: 80.0):  # fmt: skip
        runner.init_torch_distributed()
    module.prepare_moe_topk(model=runner.model, model_config=runner.model_config)
    runner.layer_info = module.resolve_layer_indices(
        model=runner.model, model_config=runner.model_config, is_draft_worker=False,
        draft_model_idx=None,
    )  # fmt: skip
    runner.init_ngram_embedding_manager()
    runner.support_pp = "pp_proxy_tensors" in inspect.signature(runner.model.forward).parameters
    return runner


RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
BACKEND = "sglang.srt.model_executor.runner_backend.tc_piecewise_cuda_graph_backend"
ENTRY = "sglang.srt.model_executor.model_runner.ModelRunner.init_cuda_graphs"


@contextlib.contextmanager
def driven(eager: bool) -> Iterator[Any]:
    """While ``ModelRunner.init_cuda_graphs(capture_decode_cuda_graph=False)`` runs: capture left
    out, the compile pass run outside the set-up's CUDA-on-CPU mode (a GPU has none), and with
    ``eager`` no ``install_torch_compiled``. Yields the entry."""
    from fp4lab.serving.replay import model

    runner = importlib.import_module(RUNNER)
    owner = importlib.import_module(BACKEND)
    backend = owner.TcPiecewiseCudaGraphBackend
    compile_pass = backend._run_compile_pass

    def run_compile_pass(self: Any, graph_runner: Any) -> Any:
        with _pop_mode_temporarily():
            return compile_pass(self, graph_runner)

    with contextlib.ExitStack() as stack:
        stack.enter_context(target.attribute_replaced(runner.PrefillCudaGraphRunner, "capture",
                                                      lambda self: None))  # fmt: skip
        stack.enter_context(target.attribute_replaced(backend, "_run_compile_pass",
                                                      run_compile_pass))  # fmt: skip
        if eager:
            stack.enter_context(target.attribute_replaced(owner, "install_torch_compiled",
                                                          lambda module, **kwargs: None))  # fmt: skip
        stack.enter_context(model.CudaOnCpu())
        yield lambda host: host.init_cuda_graphs(capture_decode_cuda_graph=False)


CAPTURE = kernels.record(
    "cuda_graph_capture_not_run", f"{RUNNER}.PrefillCudaGraphRunner.capture",
    "capturing CUDA graphs needs a CUDA GPU; the tc_piecewise backend's compile pass before it "
    "runs whole (one eager forward, install_torch_compiled, a forward per capture size)",
)  # fmt: skip
EAGER = kernels.record("eager_pass", f"{BACKEND}.install_torch_compiled",
                        "the eager pass is the same compile pass with install_torch_compiled left out")  # fmt: skip
DEVICE = kernels.record("simulated_cuda_while_traced", "torch._C CUDA bindings (fp4lab.compile.audit.simulation)",
                         "the reworked release asks torch.cuda.is_available / current_device inside "
                         "the traced forward; torch answers as a CUDA build, so dynamo folds them "
                         "as it does on a GPU")  # fmt: skip
