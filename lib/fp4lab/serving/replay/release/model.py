"""Inside one SGLang environment: the release's own model of a tiny checkpoint, built on a CPU.

The tiny checkpoint folder (``models.shrink``: e.g. GLM-5's 2 layers, the first dense, the second
MoE with 8 routed experts and a shared one, hidden 256, DSA indexer fields) with its FP4
quantization config goes through the release's own path: ``ServerArgs`` (its ``__post_init__``
picks the attention, MoE and FP4 GEMM backends for the simulated GPU), ``ModelConfig``,
distributed set-up on a one-process gloo group, the MoE / FP8 / FP4 GEMM configuration, and
``get_model_loader(LoadConfig(load_format="dummy"))`` (``DummyModelLoader``: the model class,
``process_weights_after_loading`` per module, then SGLang's dummy weights). SGLang is made to
see one GPU of the chosen SM while it is imported and the model is built (its device checks
are cached then); allocations it sends to ``cuda`` land on the CPU. Everything that stands in
is returned as a record (``Built.standins``).
"""

from __future__ import annotations

import collections
import contextlib
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4lab.core import glm5
from fp4lab.serving.replay.release import (
    attention,
    inside,
    kernels,
    layout,
    quantize,
    ranks,
    resolution,
    reworked,
    setup_standins,
)
from fp4lab.serving.replay.shared import models

FALLBACKS = {glm5.ARCHITECTURE: ("DeepseekV32ForCausalLM",)}
"""The class built where a release lacks the config's own: GLM-5's falls back to DeepSeek-V3.2's,
the DSA architecture GLM-5 builds on (``GlmMoeDsaForCausalLM`` subclasses
``DeepseekV2ForCausalLM`` with the same DSA fields); the records say which."""

TOKENS = 16
"""Prefill tokens of the runner's largest warm-up (``--piecewise-cuda-graph-max-tokens``);
at most ``index_topk``, so the stand-in dense attention equals DSA's sparse attention."""

SERVER_ARGS = {"load_format": "dummy", "device": "cuda", "skip_tokenizer_init": True,
               "piecewise_cuda_graph_max_tokens": TOKENS, reworked.TOKENS_FIELD: TOKENS}  # fmt: skip
"""What every replay sets over the user's command line (``command_line``): the dummy loader and
the token cap as the release spells it. Those the release's ``ServerArgs`` lacks are left out
and listed."""


def command_line(model: models.Model, flags: list[str]) -> list[str]:
    """A user's command line for ``model`` after its path: its quantization as SGLang names it
    (``Model.method``), then ``flags``."""
    return ["--quantization", model.method, *flags]


@dataclass
class Built:
    """The release's model and everything around it that the piecewise runner needs."""

    model: Any
    server_args: Any
    model_config: Any
    host: Any = None
    reworked: bool = False
    standins: list[dict] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    seconds: float = 0.0


class ModelAbsent(LookupError):
    """The release's source defines none of the model's classes: it cannot serve the model."""


class NotTheReleasesModel(LookupError):
    """SGLang built another class than the one its model files define (its Transformers
    fallback): its registry, as imported here, lacks that class. fp4lab's harness, not the
    release: a user's server imports its model modules where they import."""


def own_class(model: Any, architecture: str) -> None:
    """NotTheReleasesModel unless ``model`` is of the class ``architecture`` names."""
    built = type(model).__name__
    if built != architecture:
        raise NotTheReleasesModel(
            f"SGLang built {built}, not {architecture}, which the release's model files define: "
            f"its model registry, as imported here, lacks it (one of its model modules failed "
            f"to import on this machine)"
        )


def architectures(config: dict) -> tuple[str, ...]:
    """The config's architecture and the classes it falls back to (``FALLBACKS``)."""
    first = config["architectures"][0]
    return (first, *FALLBACKS.get(first, ()))


def _architecture(found: layout.Layout, asked: tuple[str, ...]) -> str:
    """The first of ``asked`` the release's source defines (its registry is asked by the
    release's own loader, once the parallel groups its model modules need at import exist)."""
    if not found.model_classes:
        raise ModelAbsent(f"the release's model files define none of {', '.join(asked)}")
    return found.model_classes[0]


def _server_args(checkpoint: Path, sm: tuple[int, int], rework: bool,
                 flags: list[str]) -> tuple[Any, dict]:  # fmt: skip
    """The release's ``ServerArgs`` for the simulated GPU of the user's command line ``flags``,
    resolved by the release itself (``resolution.server_args``), with fp4lab's own choices
    (``SERVER_ARGS``) over the parsed values; and the backends it chose."""
    args, resolved = resolution.server_args(checkpoint, sm, rework, flags, SERVER_ARGS)
    if rework:
        chosen = reworked.chosen(args)
    else:
        chosen = {k: getattr(args, k, None) for k in (
            "attention_backend", "prefill_attention_backend", "nsa_prefill_backend",
            "moe_runner_backend", "fp4_gemm_runner_backend", "kv_cache_dtype", "page_size",
            "disable_shared_experts_fusion", "piecewise_cuda_graph_tokens",
            "piecewise_cuda_graph_compiler", "enable_piecewise_cuda_graph")}  # fmt: skip
    fields = reworked.fields(type(args))
    chosen["options_not_in_release"] = sorted(set(SERVER_ARGS) - fields)
    chosen["user_flags"] = flags
    chosen["prefill_graph"] = resolved["prefill_graph"]
    return args, chosen


def _facts(model: Any) -> dict:
    """The model class, and each layer kind with the quantization method the release gave it."""
    methods = collections.Counter(
        f"{type(m).__name__}: {type(m.quant_method).__name__}"
        for m in model.modules()
        if getattr(m, "quant_method", None) is not None
    )
    cls = type(model)
    return {"model_class": f"{cls.__module__}.{cls.__qualname__}",
            "model_bases": [f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:3]],
            "quant_methods": dict(sorted(methods.items()))}  # fmt: skip


def host_values(built: Built) -> dict:
    """What the runner host holds: what the piecewise set-up reads, stand-ins for the KV pools
    and the attention backend among it."""
    from sglang.srt.distributed import get_tp_group

    spec = kernels.attribute("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm")
    config = built.model_config
    kv_dtype = reworked.resolved_kv_dtype(
        str(built.facts["server_args"]["kv_cache_dtype"]), config.dtype
    )
    kv_pool = attention.KVPool(built.facts["server_args"]["page_size"], kv_dtype,
                               config.get_num_kv_heads(1), config.head_dim)  # fmt: skip
    backend = attention.AttentionBackend()  # holding the pools, as a release's backend does
    backend.token_to_kv_pool, backend.req_to_token_pool = kv_pool, types.SimpleNamespace(size=4)
    return {
        "server_args": built.server_args, "model": built.model, "model_config": built.model_config,
        "device": "cpu", "gpu_id": 0, "is_draft_worker": False, "pp_size": 1, "tp_size": 1,
        "is_multimodal": False, "is_hybrid_swa": False, "tp_group": get_tp_group(),
        "is_generation": True, "dtype": built.model_config.dtype,
        "spec_algorithm": spec.from_string(built.server_args.speculative_algorithm) if spec else None,
        "req_to_token_pool": backend.req_to_token_pool, "token_to_kv_pool": kv_pool,
        "attn_backend": backend,
    }  # fmt: skip


def host(built: Built) -> Any:
    """A ``ModelRunner`` holding ``host_values``, made without ``__init__`` (it would build KV
    pools, the real attention backend and profile GPU memory; ``runner.drive`` runs it, those
    steps stood in for, where the release builds its piecewise runner there); in a reworked
    release with what its own set-up steps compute (``reworked.host``)."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    if built.reworked:
        return reworked.host(host_values(built), str(built.facts["server_args"]["kv_cache_dtype"]))
    runner = ModelRunner.__new__(ModelRunner)
    for name, value in host_values(built).items():
        setattr(runner, name, value)
    return runner


def resolved(release: Release, checkpoint: Path) -> tuple[dict, list[str] | None]:
    """The release's resolution of the model's command line (``resolution.reach``) and the
    flags that reach tc_piecewise prefill graphs in it (None: none does)."""
    given = models.read(checkpoint)
    found = resolution.reach(checkpoint, release.sm, release.rework, command_line(given, []))
    return found, found["graphs"]["tc_piecewise"]["flags"]


@dataclass
class Release:
    """The release's modules imported for a GPU of ``sm`` (``imported``), shared by each model
    built from them (``build``), with the stand-ins and patches in place while they were."""

    sm: tuple[int, int]
    rework: bool
    stack: contextlib.ExitStack
    standins: list[dict]
    patched: list[str]
    chosen: dict
    seconds: float


@contextlib.contextmanager
def imported(sm: tuple[int, int]) -> Iterator[Release]:
    """The release imported on a simulated GPU of ``sm``, with what it needs at import (the
    CUDA runtime, kernel stand-ins, the FP4 quantize its NVFP4 method takes); its model registry
    is left to the loader in ``build``, where the release's parallel groups exist (0.5.3.post3's
    and 0.5.5's ``deepseek_v2`` ask for them when imported); the simulated GPU lasts until the
    block ends or ``build`` ends it."""
    started = time.perf_counter()
    standins = setup_standins.libcudart() + kernels.ninja_refused()
    rework = layout.family(layout.package_root()) == "reworked"
    with contextlib.ExitStack() as stack:
        patched = stack.enter_context(inside.simulated_gpu(sm))
        stack.enter_context(inside.absent_kernel_fakes_skipped())
        standins += inside.runtime_standins() + kernels.sgl_kernel_ops()
        standins += setup_standins.triton_driver_probe() + setup_standins.fa3_binary()
        standins += setup_standins.cubin_downloads_refused() + setup_standins.inductor_patterns()
        standins += reworked.deep_gemm_standin(132) if rework else []
        standins += kernels.sglang_ops_on_cpu()
        chosen = quantize.chosen()
        yield Release(sm, rework, stack, standins, patched, chosen, time.perf_counter() - started)


def build(release: Release, checkpoint: Path, flags: list[str]) -> Built:
    """The release's model of the tiny ``checkpoint`` folder, with its runner host; see the module
        docstring. It ends the release's simulated GPU once the model is built, so a process builds
        one model (a fork of the one that imported the release builds each of several). ``flags`` is
    the user's command line after the model path (``command_line``)."""
    started = time.perf_counter()
    sm, standins, chosen = release.sm, list(release.standins), release.chosen
    given = models.read(checkpoint)
    asked = architectures(given.config)
    found = layout.probe(asked)
    rework = found.reworked
    with release.stack:
        architecture = _architecture(found, asked)
        if architecture != asked[0]:  # the release's class it falls back to, in a copy: the
            config = {**given.config, "architectures": [architecture]}  # next walk reads the given
            checkpoint = models.write_tiny(config, given.hf_quant_config,
                                           checkpoint.with_name(f"{checkpoint.name}-{architecture}"))  # fmt: skip
        server_args, backends = _server_args(checkpoint, sm, rework, flags)
        standins.append(setup_standins.gpu_memory_record(sm))
        with setup_standins.building(sm) as listed:
            from sglang.srt.configs.device_config import DeviceConfig
            from sglang.srt.configs.load_config import LoadConfig
            from sglang.srt.configs.model_config import ModelConfig
            from sglang.srt.model_loader import get_model_loader

            standins += listed + kernels.load_time_kernels()
            standins += [] if rework else setup_standins.deep_gemm_sms(132, found)
            model_config = ModelConfig.from_server_args(server_args)
            if not rework:
                from sglang.srt.server_args import set_global_server_args_for_scheduler

                set_global_server_args_for_scheduler(server_args)
            ranks.parallel_groups(server_args, model_config)
            dummy = LoadConfig(load_format="dummy")
            loader, listed = setup_standins.dummy_loader(get_model_loader, dummy, model_config)
            standins += listed
            model = loader.load_model(
                model_config=model_config, device_config=DeviceConfig("cpu", 0)
            )
            own_class(model, architecture)
    # dynamo's table of torch functions (cleared by init_process_group, then built by name on the
    # next trace) is rebuilt now, from torch's own functions, not from stand-ins active then
    torch._dynamo.trace_rules.clear_lru_cache()
    torch._dynamo.trace_rules.get_torch_obj_rule_map()
    kernels.fakes_where_missing()
    standins += (
        kernels.sglang_op_kernels() + kernels.aten_cpu_kernels() + kernels.eager_only_kernels()
    )
    standins += [*kernels.replaced_kernels(), attention.ATTENTION, attention.KV_POOL]
    facts = {**_facts(model), "architecture": architecture,
             "layers": getattr(model_config, "num_hidden_layers", None),
             "quantization": given.method, "layout": found.as_record(),
             "loader": type(loader).__name__, "server_args": backends,
             "simulated_gpu": release.patched,
             "quantize": {k: v for k, v in chosen.items() if k != "callable"}}  # fmt: skip
    built = Built(model, server_args, model_config, reworked=rework, standins=standins, facts=facts)
    built.host = host(built)
    built.seconds = release.seconds + time.perf_counter() - started
    return built
