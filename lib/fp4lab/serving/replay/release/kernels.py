"""Inside one SGLang environment: the stand-ins of ``kernel_tables`` installed and recorded.

Every replacement sits at a kernel or split-op boundary and is returned as a record (``name``,
``boundary``, ``why``), so each run lists what stood in. The kinds:

* **opaque ops** (``sgl_kernel::*``): on a GPU these are C++ ops with a schema, which dynamo
  records as one node; here the schema is defined with a CPU kernel and a fake, before SGLang
  is imported, so SGLang's own fakes register on them as they do on a GPU;
* **CPU kernels lent to SGLang's custom ops** (``sglang::*``): SGLang registers its ops for the
  CUDA dispatch key only; the op's own Python code is registered for CPU too, and the ops whose
  body is a CUDA or JIT kernel (FP4 GEMM and quantize, rotary, activation, layernorm, Hadamard,
  the DSA indexer's top-k) get a reference CPU kernel instead; so do torch ops with no CPU
  kernel (``aten::mm.dtype``);
* **Triton launches** (the DSA indexer's FP8 quantize, the MoE router): one opaque
  ``fp4lab_triton`` op, traced and run, as dynamo takes a launch on a GPU;
* **eager-only kernels** (FlashInfer's quantize and norms, the FP4 MoEs): run only eagerly (the
  runner's eager forward, split ops, SGLang's MoE op); while dynamo traces, the release's own
  function is called, so a stand-in can never hide a trace blocker. The TRT-LLM and CUTLASS FP4
  MoEs have no CPU reference: their routed experts contribute zero, compiled and eager alike;
* **load-time kernels** (FlashInfer's block-scale interleave for the TRT-LLM MoE's weights).

The attention backend (``attention``) stands in for ``NativeSparseAttnBackend`` at SGLang's
attention split op.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from fp4lab.core import paths
from fp4lab.serving.replay.release import (
    cpu_graph_kernels,
    cpu_kernels,
    cpu_moe_kernels,
    op_schemas,
)
from fp4lab.serving.replay.release import kernel_tables as tables
from fp4lab.serving.replay.release.reached import counted


def record(name: str, boundary: str, why: str, kernels: list[str] | None = None) -> dict:
    """A stand-in as records list it; ``kernels``: the names ``REACHED`` counts its kernels
    under (a trailing ``*`` for any name with that start), none for a set-up stand-in."""
    found = {"name": name, "boundary": boundary, "why": why}
    return found | ({"kernels": kernels} if kernels is not None else {})


def attribute(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def sgl_kernel_ops() -> list[dict]:
    """Define every op of ``kernel_tables.SGL_KERNEL_OPS`` that is absent (sgl_kernel's binary is not loaded);
    call before SGLang is imported, so that SGLang's own fakes register on them."""
    library = tables.LIBRARIES.setdefault(
        "sgl_kernel", torch.library.Library("sgl_kernel", "FRAGMENT")
    )
    defined = []
    for name, (schema, kernel, _) in tables.SGL_KERNEL_OPS.items():
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        library.define(op_schemas.as_called(name, schema))
        library.impl(name, counted(f"sgl_kernel::{name}", kernel), "CPU")
        defined.append(name)
    return [record("sgl_kernel_ops", f"sgl_kernel::{{{','.join(defined)}}}",
                    "sgl_kernel's C++ op library is a CUDA-only binary; each op GLM-5 calls is "
                    "defined with the schema its Python wrapper calls (op_schemas), a torch "
                    "CPU kernel and a fake, so dynamo sees one opaque node as on a GPU",
                    [f"sgl_kernel::{n}" for n in defined])] if defined else []  # fmt: skip


def _no_outputs(*args: Any, **kwargs: Any) -> None:
    return None


def fakes_where_missing() -> None:
    """Fakes for the stood-in sgl_kernel ops SGLang registered none for (after its import; an
    in-place op's fake returns nothing)."""
    for name, (_, _, fake) in tables.SGL_KERNEL_OPS.items():
        entry = torch._library.simple_registry.singleton.find(f"sgl_kernel::{name}")
        if (
            "sgl_kernel" in tables.LIBRARIES
            and hasattr(torch.ops.sgl_kernel, name)
            and entry.fake_impl.kernel is None
        ):
            tables.LIBRARIES["sgl_kernel"]._register_fake(name, fake or _no_outputs)


def sglang_ops_on_cpu() -> list[dict]:
    """SGLang's ``direct_register_custom_op`` registers each op's Python code for CUDA only; the
    same code is registered for CPU too. Call before SGLang's layers are imported."""
    common = importlib.import_module("sglang.srt.utils.common")
    library = getattr(common, "sglang_lib", None)
    if library is None:
        return []
    register = library.impl

    def impl(name: str, fn: Callable, key: str = "", *args: Any, **kwargs: Any) -> Any:
        done = register(name, fn, key, *args, **kwargs)
        if key == "CUDA":
            register(name, fn, "CPU", *args, **kwargs)
        return done

    library.impl = impl
    return [record("sglang_ops_own_code_on_cpu", "sglang.srt.utils.common.sglang_lib",
                    "SGLang registers its custom ops' Python code for the CUDA dispatch key "
                    "only; the same code is registered for CPU (the ops' own code runs)")]  # fmt: skip


def sglang_op_kernels() -> list[dict]:
    """``kernel_tables.SGLANG_OP_KERNELS`` registered for CPU on the ops the release has (after
    SGLang's import)."""
    for module in tables.SGLANG_OP_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    library = tables.LIBRARIES.setdefault("sglang", torch.library.Library("sglang", "IMPL"))
    lent = []
    for name, (kernel, why) in tables.SGLANG_OP_KERNELS.items():
        if hasattr(torch.ops.sglang, name):
            library.impl(name, counted(f"sglang::{name}", kernel), "CPU", allow_override=True)
            lent.append(record(f"sglang::{name}_cpu_kernel", f"sglang::{name}", why,
                               [f"sglang::{name}"]))  # fmt: skip
    return lent


def aten_cpu_kernels() -> list[dict]:
    """``kernel_tables.ATEN_CPU_KERNELS`` registered for CPU where torch has no CPU kernel for them."""
    library = tables.LIBRARIES.setdefault("aten", torch.library.Library("aten", "IMPL"))
    lent = []
    for name, (kernel, why) in tables.ATEN_CPU_KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"):
            library.impl(name, counted(f"aten::{name}", kernel), "CPU")
            lent.append(record(f"aten::{name}_cpu_kernel", f"aten::{name}", why, [f"aten::{name}"]))
    return lent


def eager_only(real: Callable, cpu: Callable, name: str) -> Callable:
    """``real`` while dynamo traces (the release's code is what gets traced), ``cpu`` when run
    (counted under ``name``): also where a graph break (``fullgraph=False``) makes dynamo run the
    call itself, whose frame dynamo then never compiles (``skip_code``), and ``cpu`` runs with
    dynamo off."""
    run = torch._dynamo.disable(counted(name, cpu))

    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return real(*args, **kwargs)
        return run(*args, **kwargs)

    torch._dynamo.eval_frame.skip_code(call.__code__)
    call.__wrapped__ = real
    return call


def release_bound(cpu: Any, real: Any) -> Any:
    """``cpu``, bound to ``real``'s own signature where its parameters differ by release."""
    return cpu.bound_to(real) if isinstance(cpu, cpu_moe_kernels.ByReleaseSignature) else cpu


ORIGINALS: dict[str, Any] = {}
"""Each release function a table replaced, as the release had it (installed again, a stand-in is
bound to the release's own signature, never to the stand-in before it)."""


def installed(table: tuple, suffix: str) -> list[dict]:
    """Each (module, name, CPU kernel, why) of ``table`` set where the release has the module and
    name; the records, named ``<name>_<suffix>``."""
    done = []
    for module, name, cpu, why in table:
        real = ORIGINALS.setdefault(f"{module}.{name}", attribute(module, name))
        if real is not None:
            launch = isinstance(cpu, cpu_graph_kernels.Launch)  # a Triton kernel[grid] launch
            cpu = release_bound(cpu, real)
            setattr(importlib.import_module(module), name, cpu.counted(f"{module}.{name}")
                    if launch else counted(f"{module}.{name}", cpu))  # fmt: skip
            done.append(record(f"{name}_{suffix}", f"{module}.{name}", why, [f"{module}.{name}"]))
    return done


NINJA = """#!/bin/sh
# fp4lab's kernel boundary: the ninja of JIT builds (tvm-ffi's, SGLang's own) builds nothing here
[ -n "$FP4LAB_REFUSED_BUILDS" ] && pwd >> "$FP4LAB_REFUSED_BUILDS"
echo "no CUDA module is built on this machine (fp4lab's kernel boundary stands in for ninja)" >&2
exit 1
"""
"""The ``ninja`` first on a replay's PATH (``ninja_refused``)."""


def ninja_refused() -> list[dict]:
    """A ``ninja`` that builds nothing, first on PATH: each JIT build of a CUDA module (tvm-ffi's,
    SGLang's own: 0.5.6 on) fails at once, as on a machine without nvcc, with the release's own
    words for a failed build; the folder of each is written to ``$FP4LAB_REFUSED_BUILDS``."""
    folder = paths.build_dir() / "sglang-compile" / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    written = folder / f".ninja.{os.getpid()}"
    written.write_text(NINJA)
    written.chmod(0o755)
    written.replace(folder / "ninja")  # at once: children of other releases may be running it
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
    return [record("ninja_refused", "ninja (first on PATH)",
                   "the JIT builds of SGLang's CUDA kernels (its QK norm, the DSA indexer's fused "
                   "K-cache store, ...) fail at once, as on a machine without nvcc (with one, each "
                   "took 12 s of nvcc and still failed to link): SGLang's capability probes answer "
                   "no, so the release's fallback is traced where a GPU would take the JIT "
                   "kernel; each replay lists them (jit_builds_refused)")]  # fmt: skip


def build_names(log: Path) -> list[str]:
    """The CUDA modules ``ninja_refused`` was asked to build so far, in order, from the folders
    in ``log``: each module's name (tvm-ffi's hash, SGLang's build and staging folders left out)."""
    names = []
    for line in log.read_text().splitlines() if log.exists() else []:
        folder = next(
            p for p in reversed(Path(line).parts) if not p.startswith((".staging-", "build-"))
        )
        names.append(re.split(r"_[0-9a-f]{16}(?:_|$)", folder)[0])
    return names


def refused_builds(log: Path) -> list[str]:
    """The CUDA modules whose builds ``ninja_refused`` refused (``build_names``); ``log`` then
    removed."""
    names = sorted(set(build_names(log)))
    log.unlink(missing_ok=True)
    return names


def load_time_kernels() -> list[dict]:
    """``kernel_tables.LOAD_TIME`` installed where the release has the module and name (before the
    model loads)."""
    return installed(tables.LOAD_TIME, "load_time")


def replaced_kernels() -> list[dict]:
    """``kernel_tables.REPLACED`` installed where the release has the module and name."""
    return installed(tables.REPLACED, "replaced")


def eager_only_kernels() -> list[dict]:
    """``kernel_tables.EAGER_ONLY`` installed where the release has the module and name; and
    FlashInfer's
    ``fp4_quantize`` wherever a module binds it by name (the runner of 0.5.10+ runs one eager
    forward before it compiles; the MoE runs it eagerly inside SGLang's MoE op)."""
    done = []
    for module in tables.BINDS_FLASHINFER_QUANTIZE:
        bound = attribute(module, "fp4_quantize")
        if getattr(bound, "__module__", "").startswith("flashinfer"):
            importlib.import_module(module).fp4_quantize = eager_only(
                bound, cpu_kernels.flashinfer_fp4_quantize, f"{module}.fp4_quantize"
            )
            done.append(record("fp4_quantize_eager_only", f"{module}.fp4_quantize",
                               "FlashInfer's fp4_quantize as the release binds it: fp4lab's "
                               "reference when run eagerly; while dynamo traces, FlashInfer's "
                               "own function (the story's path)", [f"{module}.fp4_quantize"]))  # fmt: skip
    for module, name, cpu, why in tables.EAGER_ONLY:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(owner, name):  # where the import it binds failed, the name is None: still called
            real = getattr(owner, name)
            setattr(owner, name, eager_only(real, release_bound(cpu, real), f"{module}.{name}"))
            done.append(record(f"{name}_eager_only", f"{module}.{name}", why, [f"{module}.{name}"]))
    return done


@contextlib.contextmanager
def device_queries(sm: tuple[int, int]) -> Iterator[list[dict]]:
    """``torch.cuda``'s device queries answering as one GPU of ``sm``, with which sgl_kernel's
    ``is_arch_support_pdl`` memo is filled as a GPU's eager forwards fill it before any compile;
    ``torch.cuda.is_available`` stays False, so dynamo saves no CUDA RNG state."""
    from fp4lab.compile import target

    props = types.SimpleNamespace(name=f"simulated SM{sm[0]}{sm[1]}", major=sm[0], minor=sm[1],
                                  multi_processor_count=132, total_memory=80 * 2**30)  # fmt: skip
    with (
        target.attribute_replaced(torch.cuda, "current_device", lambda: 0),
        target.attribute_replaced(torch.cuda, "get_device_capability", lambda device=None: sm),
        target.attribute_replaced(torch.cuda, "get_device_properties", lambda device=None: props),
    ):
        if pdl := getattr(sys.modules.get("sgl_kernel.utils"), "is_arch_support_pdl", None):
            pdl()  # its memo filled, as a GPU's eager forwards fill it (the record below)
        yield [record("device_queries", "torch.cuda.current_device, get_device_capability, get_device_properties",
                       "a CPU build of torch raises on them; sgl_kernel's wrappers ask them for PDL support, which "
                       "dynamo folds to a constant on a GPU. sgl_kernel's memoised is_arch_support_pdl is asked "
                       "once here, as the release's eager forwards before its compile ask it on a GPU (fp4lab's "
                       "eager CPU kernels stand in above the wrappers that ask it); left empty, dynamo's guard "
                       "on the memo recompiles the model once the first compiled forward fills it")]  # fmt: skip
