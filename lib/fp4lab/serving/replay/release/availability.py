"""Inside one SGLang environment: whether each kernel a replay reached exists for the simulated SM,
read from the installed packages' own evidence, never assumed.

A replay stands in kernels at their call; this module asks, for each kernel it reached, the
library that ships the real one:

- ``declared``: FlashInfer's own capability declaration on its API function
  (``@supported_compute_capability`` / ``@backend_requirement``: ``is_backend_supported``), for the
  backend the release passes;
- ``jit``: FlashInfer's own module getter for the SM, run up to its build (its arch gate raises
  "No supported CUDA architectures"; the spec it returns names the ``sm_`` targets it compiles);
- ``gate``: a ``FLASHINFER_CHECK`` on the SM in a header FlashInfer ships (trtllm-gen FMHA's
  ``TllmGenFmhaRunner``: "Unsupported architecture");
- an ``sgl_kernel::`` op: the GPU targets of the op library sgl_kernel's own loader picks for
  the SM (``op_library``);
- a DeepGEMM kernel: the kernel sources DeepGEMM ships per architecture (``deep_gemm_sources``).

Each answer is ``yes``, ``no`` or ``unknown`` (no evidence could be read: a Triton kernel, a
kernel SGLang builds at run time, a getter that fetches cubins first), with the evidence in words.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fp4lab.serving import deep_gemm_sources
from fp4lab.serving.replay.release import inside, op_library

YES, NO, UNKNOWN = "yes", "no", "unknown"

MOE_CUTLASS = ("flashinfer.fused_moe.core", "get_cutlass_fused_moe_module", "{major}{minor}")
MOE_TRTLLM = ("flashinfer.fused_moe.core", "get_trtllm_moe_sm100_module", None)
FP4_QUANTIZE = (("flashinfer.quantization.fp4_quantization", "flashinfer.fp4_quantization"),
                "get_fp4_quantization_module", "{major}{minor}")  # fmt: skip
FMHA_GATE = ("flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh",
             "Unsupported architecture")  # fmt: skip
SPARSE_MLA_SM120 = ("flashinfer.mla._sparse_mla_sm120", "sparse_mla_sm120_decode_dsv3_2")
NORM = ("flashinfer.norm", "get_norm_module", None)

REACHED_KERNELS: dict[str, tuple[str, str, tuple]] = {
    "sglang::fp4_gemm": ("FlashInfer mm_fp4", "declared", ("flashinfer.gemm", "mm_fp4")),
    "flashinfer.fused_moe.cutlass_fused_moe": ("FlashInfer CUTLASS fused MoE", "jit", MOE_CUTLASS),
    "sglang.srt.layers.quantization.modelopt_quant.flashinfer_cutlass_fused_moe": (
        "FlashInfer CUTLASS fused MoE", "jit", MOE_CUTLASS),
    "flashinfer.fused_moe.trtllm_fp4_block_scale_moe": (
        "FlashInfer trtllm-gen FP4 MoE", "jit", MOE_TRTLLM),
    "sglang.srt.layers.moe.fused_moe_triton.layer.trtllm_fp4_block_scale_moe": (
        "FlashInfer trtllm-gen FP4 MoE", "jit", MOE_TRTLLM),
    "sglang::flashinfer_fp4_quantize": ("FlashInfer FP4 quantize", "jit", FP4_QUANTIZE),
    "sglang.srt.layers.quantization.modelopt_quant.fp4_quantize": (
        "FlashInfer FP4 quantize", "jit", FP4_QUANTIZE),
    "sglang.srt.layers.moe.fused_moe_triton.layer.fp4_quantize": (
        "FlashInfer FP4 quantize", "jit", FP4_QUANTIZE),
    "sglang.srt.layers.moe.moe_runner.flashinfer_trtllm.fp4_quantize": (
        "FlashInfer FP4 quantize", "jit", FP4_QUANTIZE),
    "flashinfer.nvfp4_block_scale_interleave": ("FlashInfer FP4 quantize", "jit", FP4_QUANTIZE),
    "flashinfer.norm.rmsnorm": ("FlashInfer RMSNorm", "jit", NORM),
    "flashinfer.norm.fused_add_rmsnorm": ("FlashInfer fused add RMSNorm", "jit", NORM),
}  # fmt: skip
"""Each stand-in kernel name ``reached.REACHED`` counts whose real kernel has evidence to read:
the real kernel, the kind of evidence, and where to read it."""

SGL_KERNEL_OPS = "sgl_kernel::"
"""A reached op of sgl_kernel's op library (``torch.ops.sgl_kernel``): asked of the library its
own loader picks on the SM (``op_library``)."""

ATTENTION_KERNELS: dict[str, tuple[str, str, tuple]] = {
    "trtllm": ("FlashInfer trtllm-gen FMHA (TllmGenFmhaRunner)", "gate", FMHA_GATE),
    "trtllm_mla": ("FlashInfer trtllm-gen FMHA (TllmGenFmhaRunner)", "gate", FMHA_GATE),
    "trtllm_mha": ("FlashInfer trtllm-gen FMHA (TllmGenFmhaRunner)", "gate", FMHA_GATE),
    "flashinfer_sparse_mla": ("FlashInfer SM120 sparse MLA", "declared", SPARSE_MLA_SM120),
}
"""The prefill attention backends a release resolves whose kernel has evidence to read."""

ATTENTION_CHOICE = ("dsa_prefill_backend", "nsa_prefill_backend", "prefill_attention_backend",
                    "attention_backend")  # fmt: skip
"""Where a release's resolved server arguments name the prefill attention's backend, first
named first (a DSA model's prefill backend before its attention backend)."""


class _Built(Exception):
    """FlashInfer's getter reached its build: the spec it would build."""

    def __init__(self, spec: Any) -> None:
        super().__init__(getattr(spec, "name", "spec"))
        self.spec = spec


FETCHERS = ("get_artifact", "get_cubin")
"""FlashInfer's functions that fetch a cubin artifact from NVIDIA's servers (the newer name and
the older one); on this machine each would retry for 35 s before it fails."""


class _Fetch(Exception):
    """FlashInfer's getter asked for a cubin artifact (fetched from NVIDIA's servers)."""


@contextlib.contextmanager
def _stopped_at_build() -> Iterator[set]:
    """FlashInfer's JIT specs raise ``_Built`` where they would build, under a compilation
    context constructed as FlashInfer constructs it on the simulated GPU; its artifacts are not
    fetched (``_Fetch``: a getter that fetches cubins first)."""
    core = importlib.import_module("flashinfer.jit.core")
    made = importlib.import_module("flashinfer.compilation_context").CompilationContext()

    def fetch(*args: Any, **kwargs: Any) -> Any:
        raise _Fetch(args[0] if args else "")

    held = [(m, name, getattr(m, name)) for m in list(sys.modules.values())
            if getattr(m, "__name__", "").startswith("flashinfer")
            for name in ("current_compilation_context", *FETCHERS) if hasattr(m, name)]  # fmt: skip
    for m, name, _ in held:
        setattr(m, name, made if name == "current_compilation_context" else fetch)
    classes, todo = [], [core.JitSpec]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()

    def built(spec: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Built(spec)

    saved = [(cls, cls.__dict__["build_and_load"]) for cls in classes
             if "build_and_load" in cls.__dict__]  # fmt: skip
    for cls, _ in saved:
        cls.build_and_load = built
    try:
        yield made.TARGET_CUDA_ARCHS
    finally:
        for cls, method in saved:
            cls.build_and_load = method
        for m, name, value in held:
            setattr(m, name, value)


def _function(modules: str | tuple[str, ...], name: str) -> Any:
    for module in (modules,) if isinstance(modules, str) else modules:
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(module), name, None)
            if found is not None:
                return found
    return None


def _where(fn: Any) -> str:
    inner = inspect.unwrap(fn)
    try:
        path = Path(inspect.getsourcefile(inner) or "")
        line = inspect.getsourcelines(inner)[1]
    except (OSError, TypeError):
        return getattr(inner, "__qualname__", str(inner))
    parts = path.parts
    start = max((i for i, p in enumerate(parts) if p == "flashinfer"), default=len(parts) - 1)
    return f"{'/'.join(parts[start:])}:{line}"


def declared(where: tuple, sm: tuple[int, int], backend: str | None) -> tuple[str, str]:
    """FlashInfer's declaration on an API function: whether ``backend`` (or any backend) runs on
    compute capability ``sm``."""
    fn = _function(*where)
    if fn is None or not hasattr(fn, "is_compute_capability_supported"):
        return UNKNOWN, f"{where[1]} carries no capability declaration in this FlashInfer"
    cc = sm[0] * 10 + sm[1]
    named = backend not in (None, "auto") and getattr(fn, "has_backend", lambda b: False)(backend)
    ok = fn.is_backend_supported(backend, cc) if named else fn.is_compute_capability_supported(cc)
    asked = f"is_backend_supported({backend!r}, {cc})" if named else (
        f"is_compute_capability_supported({cc})")  # fmt: skip
    return (YES if ok else NO), f"{where[1]}.{asked} is {bool(ok)} ({_where(fn)})"


def jit(where: tuple, sm: tuple[int, int]) -> tuple[str, str]:
    """FlashInfer's module getter for ``sm`` run up to its build: the arch gate's refusal, or the
    ``sm_`` targets of the spec it would build."""
    modules, name, arch = where
    getter = _function(modules, name)
    if getter is None:
        return UNKNOWN, f"{name} not in this FlashInfer"
    args = () if arch is None else (arch.format(major=sm[0], minor=sm[1]),)
    call = f"{name}({', '.join(map(repr, args))})"
    try:
        with _stopped_at_build() as made_for:
            if not made_for:  # FlashInfer could not name this GPU's arch here: nothing to ask
                return UNKNOWN, "FlashInfer's compilation context found no target arch here"
            inspect.unwrap(getter)(*args)
    except _Built as built:
        flags = " ".join(str(f) for f in getattr(built.spec, "extra_cuda_cflags", None) or [])
        targets = sorted(set(re.findall(r"code=sm_(\d+[a-z]?)", flags)))
        if not targets:  # FlashInfer's build adds its compilation context's targets: this SM's
            archs = ", ".join(f"sm_{a[0]}{a[1]}" for a in sorted(made_for))
            return YES, (f"{call} builds {built.spec.name} with no arch restriction of its own, "
                         f"so FlashInfer compiles it for its compilation context's {archs} "
                         f"({_where(getter)})")  # fmt: skip
        ok = any(re.fullmatch(rf"{sm[0]}{sm[1]}[af]?", t) for t in targets)
        return (YES if ok else NO), (f"{call} builds {built.spec.name} for "
                                     f"{', '.join('sm_' + t for t in targets)} ({_where(getter)})")  # fmt: skip
    except _Fetch as fetched:
        return UNKNOWN, f"{call} fetches its cubins first ({fetched}): not read here"
    except RuntimeError as exc:
        if "No supported CUDA architectures" in str(exc):
            return NO, f"{call} raises '{exc}' ({_where(getter)})"
        return UNKNOWN, f"{call} stopped before its build: {type(exc).__name__}: {str(exc)[:120]}"
    except Exception as exc:  # a getter that fetches cubins, or one whose arch is not its own
        return UNKNOWN, f"{call} stopped before its build: {type(exc).__name__}: {str(exc)[:120]}"
    return UNKNOWN, f"{call} returned without building"


def gate(where: tuple, sm: tuple[int, int]) -> tuple[str, str]:
    """A ``FLASHINFER_CHECK`` on the SM in a header FlashInfer ships: the ``kSM_`` values it
    admits."""
    relative, words = where
    root = Path(importlib.import_module("flashinfer").__file__).parent.parent
    header = root / relative
    if not header.is_file():
        return UNKNOWN, f"{relative} not shipped by this FlashInfer"
    lines = header.read_text().splitlines()
    said = next((i for i, line in enumerate(lines) if words in line), None)
    if said is None:
        return UNKNOWN, f"no '{words}' check in {relative}"
    start = next(i for i in range(said, -1, -1) if "FLASHINFER_CHECK" in lines[i])
    check = " ".join(line.strip() for line in lines[start : said + 1])
    admitted = re.findall(r"kSM_(\d+)", check)
    ok = f"{sm[0]}{sm[1]}" in admitted
    return (YES if ok else NO), f"{relative}:{start + 1}: {check}"


def _ask(kind: str, where: tuple, sm: tuple[int, int], backend: str | None) -> tuple[str, str]:
    if kind == "read":  # answered already, by the library's own evidence
        return {True: YES, False: NO}.get(where[0], UNKNOWN), where[1]
    if kind == "declared":
        return declared(where, sm, backend)
    if kind == "jit":
        return jit(where, sm)
    return gate(where, sm)


def fp4_gemm_backend() -> str | None:
    """The backend the release's ``fp4_gemm`` passes to FlashInfer's ``mm_fp4`` (its own runner
    backend, mapped by its own ``get_flashinfer_backend``); None where it has none."""
    for module in ("sglang.srt.layers.quantization.fp4_utils",
                   "sglang.srt.layers.quantization.modelopt_quant"):  # fmt: skip
        get = _function(module, "get_fp4_gemm_runner_backend")
        if get is not None:
            return get().get_flashinfer_backend()
    return None


def attention_choice(server_args: Mapping[str, Any]) -> tuple[str, str] | None:
    """The prefill attention backend the release resolved, and the argument that names it."""
    for name in ATTENTION_CHOICE:
        if server_args.get(name) in ATTENTION_KERNELS:
            return name, server_args[name]
    return None


def check(reached: Mapping[str, int], server_args: Mapping[str, Any],
          sm: tuple[int, int]) -> list[dict]:  # fmt: skip
    """Each kernel the replay reached, with its availability on ``sm`` and the evidence: the
    stand-ins' FlashInfer kernels (``REACHED_KERNELS``), the prefill attention backend the release
    resolved where the attention stand-in ran, sgl_kernel's ops and DeepGEMM's kernels; every
    other reached kernel is ``unknown``. Asked on the simulated GPU, as FlashInfer asks its own
    device."""
    ops: list[tuple[bool | None, str]] = []  # sgl_kernel's op library, asked once
    with inside.simulated_gpu(sm):
        return [
            _row(name, server_args, sm, ops) for name in sorted(k for k, n in reached.items() if n)
        ]


def _row(name: str, server_args: Mapping[str, Any], sm: tuple[int, int], ops: list) -> dict:
    chosen, library = f"reached as {name}", "flashinfer"
    if name == "attention_backend.forward" and (pick := attention_choice(server_args)):
        argument, backend = pick
        kernel, kind, where = ATTENTION_KERNELS[backend]
        chosen = f"the release resolved {argument}={backend}"
    elif name in REACHED_KERNELS:
        kernel, kind, where = REACHED_KERNELS[name]
    elif name.startswith(SGL_KERNEL_OPS):
        ops[:] = ops or [op_library.available(sm)]
        library, kernel, kind, where = "sgl_kernel", name, "read", ops[0]
    elif found := deep_gemm_sources.reached(name, sm):
        library, kernel, where = found
        kind = "read"
    else:
        return {"kernel": name, "library": None, "available": UNKNOWN,
                "evidence": "no arch evidence read for this kernel", "chosen": chosen}  # fmt: skip
    backend = fp4_gemm_backend() if name == "sglang::fp4_gemm" else None
    available, said = _ask(kind, where, sm, backend)
    return {"kernel": kernel, "library": library, "available": available,
            "evidence": said, "chosen": chosen, "reached_as": name}  # fmt: skip
