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
from typing import Any

import torch
from torch.overrides import _pop_mode_temporarily

from fp4lab.compile import target
from fp4lab.serving.replay.release import inside, kernels, ranks
from fp4lab.serving.replay.release.reached import REACHED

TOKENS_FIELD = "cuda_graph_max_bs_prefill"
"""The reworked parser's cap on prefill capture sizes (tokens, for ``tc_piecewise``)."""

REQUESTS = 4
"""Requests the stand-in request pool holds (the runner sizes its buffers from it)."""


class _Kernels(types.ModuleType):
    """A module of ``deep_gemm`` whose every function is a CUDA kernel (raises when called)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            REACHED[f"deep_gemm.{name}"] += 1
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
                               f"kernel of it runs here) and get_num_sms answers {sm_count}",
                               ["deep_gemm.*"])]  # fmt: skip
    return []


def fields(cls: Any) -> set[str]:
    """The fields a ``ServerArgs`` class takes (a dataclass or a ``msgspec.Struct``)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "__struct_fields__", ()))


def publish(server_args: Any) -> None:
    """The release's own resolution pipeline and config bags, as the scheduler publishes them;
    in a release whose ``ServerArgs`` is still a dataclass resolved by its ``__post_init__``
    (0.5.14 to 0.5.20), its own legacy publish shim."""
    from sglang.srt import runtime_context as context

    if hasattr(context, "SpawnRanks"):
        context.publish(server_args, role="scheduler", ranks=context.SpawnRanks(world_rank=0))
        return
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(server_args)


def chosen(server_args: Any) -> dict:
    """What the release's resolution chose for GLM-5 on the simulated GPU: its config bags, or
    where it has none (0.5.14 to 0.5.20) the resolved ``ServerArgs``."""
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
            found[name] = getattr(server_args, name, None)
            with contextlib.suppress(Exception):
                found[name] = getattr(bag(), name)
    with contextlib.suppress(Exception):
        prefill = context.get_exec().graph.cuda_graph_config.prefill
        found["prefill_graph"] = {"backend": str(prefill.backend), "capture_tokens": prefill.bs,
                                  "tc_compiler": prefill.tc_compiler}  # fmt: skip
    return found


HOST_STANDINS = [
    kernels.record("set_up_elsewhere", "init_torch_distributed's group set-up and GPU memory "
                   "queries (reworked.SET_UP_ELSEWHERE, where the release keeps them)",
                   "the groups are set up on one gloo process already (ranks.parallel_groups); "
                   "no GPU memory to measure, the runner host records a figure"),
    kernels.record("request_pool", "model_runner.req_to_token_pool",
                   f"a table of {REQUESTS} requests instead of the GPU request pool"),
]  # fmt: skip


def resolved_kv_dtype(named: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache dtype the release resolved, as the attention backend holds it."""
    return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}.get(named, model_dtype)


SET_UP_ELSEWHERE = {
    "measure_pre_model_load_memory": lambda **kwargs: 80.0,
    "get_available_gpu_memory": lambda *args, **kwargs: 80.0,
    "_init_parallel_groups": lambda **kwargs: None,
    "init_distributed_environment": lambda *args, **kwargs: None,
    "initialize_model_parallel": lambda *args, **kwargs: None,
    "initialize_dp_attention": lambda *args, **kwargs: None,
}
"""What ``init_torch_distributed`` calls that ``ranks.parallel_groups`` did already, or
that asks the GPU for its free memory (80 GB answer), wherever the release keeps it."""

ONE_GPU = {"tp_rank": 0, "pp_rank": 0, "dp_size": 1, "moe_ep_size": 1, "moe_ep_rank": 0,
           "attn_cp_size": 1, "attn_cp_rank": 0, "moe_dp_size": 1, "dcp_size": 1, "dcp_rank": 0,
           "dist_port": 0, "local_omp_cpuid": None}  # fmt: skip
"""The placement ``ModelRunner.__init__`` stores for one rank of one GPU (0.5.14, 0.5.15 keep it
on the runner; later releases in a ``ParallelState``)."""


def host(values: dict, kv_cache_dtype: str) -> Any:
    """A ``ModelRunner`` without ``__init__`` (it would allocate KV pools and profile GPU memory),
    holding ``values`` (``kv_cache_dtype`` as the release resolved it) and what the release's own
    set-up steps compute: whether it uses MLA backends, its parallel placement
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
    state = getattr(module, "ParallelState", None)  # 0.5.16 on: passed to __init__
    extra |= {"ps": state.trivial()} if state is not None else {}
    extra |= ONE_GPU
    for name, value in {**values, **extra}.items():
        setattr(runner, name, value)
    arch = getattr(module, "AttentionArch", None)  # ``__init__``'s own line, for its backends
    if arch is not None:
        runner.use_mla_backend = values["model_config"].attention_arch == arch.MLA
    runner.attn_backend.req_to_token_pool = runner.req_to_token_pool  # this runner's own pool
    runner.attn_backend.kv_cache_dtype = resolved_kv_dtype(kv_cache_dtype, values["dtype"])
    owner = getattr(module, "bootstrap", module)  # 0.5.14, 0.5.15 set up in ModelRunner itself
    with contextlib.ExitStack() as stack:
        for name, value in SET_UP_ELSEWHERE.items():
            if hasattr(owner, name):  # the groups are set up on gloo already
                stack.enter_context(target.attribute_replaced(owner, name, value))
        runner.init_torch_distributed()
    given = {**vars(runner), "draft_model_idx": None}  # the host's values, by parameter name
    if hasattr(module, "prepare_moe_topk"):
        ranks.call(module.prepare_moe_topk, **given)
    else:
        runner._prepare_moe_topk()
    if hasattr(module, "resolve_layer_indices"):
        runner.layer_info = ranks.call(module.resolve_layer_indices, **given)
    if hasattr(runner, "init_ngram_embedding_manager"):  # from 0.5.16
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
        stack.enter_context(inside.CudaOnCpu())
        yield lambda host: host.init_cuda_graphs(capture_decode_cuda_graph=False)


def compile_contexts() -> list:
    """The contexts the tc_piecewise backend's compile pass runs its warm-up forwards in, from
    the backend's own module, ready to enter."""
    owner = importlib.import_module(BACKEND)
    return [owner.enable_tc_piecewise_cuda_graph, owner.enable_torch_compile_warmup]


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
