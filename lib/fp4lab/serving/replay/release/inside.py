"""Inside one SGLang environment: the GPU SGLang is made to see, its runtime stand-ins, and how
a compile through SGLang's entry point (``install_torch_compiled`` with ``SGLangBackend``) is
recorded: the outcome in dynamo's words, SGLang's compilation counter, SGLang's frames.

Every patch and stand-in is returned as data, so the records list it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import traceback
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fp4lab.compile import frames, target, trace
from fp4lab.core import paths
from fp4lab.serving.replay.release import weak_refs

CUDA_VERSION = "12.9"
"""The CUDA build torch claims while SGLang is made to see a GPU (SGLang requires >= 12.8)."""

WEAK_REF_MODULES = (
    "sglang.srt.compilation.weak_ref_tensor",
    "sglang.srt.compilation.weak_ref_tensor_jit",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
)
"""Where releases keep ``weak_ref_tensor`` (it raises off CUDA/NPU, or JIT-builds a CUDA kernel)."""


@contextlib.contextmanager
def simulated_gpu(sm: tuple[int, int]) -> Iterator[list[str]]:
    """torch answering SGLang's device queries as a CUDA build on one GPU of ``sm``; yields what
    was patched. Enter before SGLang is imported: it reads the SM at import time."""
    props = types.SimpleNamespace(
        name=f"simulated SM{sm[0]}{sm[1]}", major=sm[0], minor=sm[1],
        multi_processor_count=132, total_memory=80 * 2**30,
    )  # fmt: skip
    patches = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "get_device_capability": lambda device=None: sm,
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: props.name,
    }
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(target.attribute_replaced(torch.cuda, name, value))
        done = [f"torch.cuda.{name}" for name in patches]
        if torch.version.cuda is None:
            stack.enter_context(target.attribute_replaced(torch.version, "cuda", CUDA_VERSION))
            done.append(f"torch.version.cuda = {CUDA_VERSION!r}")
        yield done


@contextlib.contextmanager
def absent_kernel_fakes_skipped() -> Iterator[list[str]]:
    """``torch.library.register_fake`` skipping ``sgl_kernel::`` ops that do not exist (their
    CUDA-only library is not loaded); yields the ops skipped. SGLang registers fakes for them
    at import when it believes it runs on CUDA."""
    skipped: list[str] = []
    original = torch.library.register_fake

    def register_fake(op: Any, fn: Any = None, /, *args: Any, **kwargs: Any) -> Any:
        name = op if isinstance(op, str) else ""
        if name.startswith("sgl_kernel::") and not hasattr(torch.ops.sgl_kernel, name[12:]):
            skipped.append(name)
            return fn if fn is not None else (lambda f: f)
        return (
            original(op, fn, *args, **kwargs) if fn is not None else original(op, *args, **kwargs)
        )

    with target.attribute_replaced(torch.library, "register_fake", register_fake):
        yield skipped


def _weak_ref_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "fp4lab stand-in: weak_ref_tensor (CPU), ``weak_refs``")

    def weak_ref_tensors(tensors: Any) -> Any:
        if isinstance(tensors, (list, tuple)):
            return type(tensors)(weak_refs.weak_ref(t) for t in tensors)
        return weak_refs.weak_ref(tensors)

    module.weak_ref_tensor = weak_refs.weak_ref
    module.weak_ref_tensors = weak_ref_tensors
    return module


def runtime_standins() -> list[dict]:
    """The runtime stand-ins SGLang's compile path needs on CPU, each listed: ``weak_ref_tensor``
    where the release's module exists (``weak_refs``), and a one-process gloo group."""
    import importlib.util

    listed = []
    for name in WEAK_REF_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if found and name not in sys.modules:
            sys.modules[name] = _weak_ref_module(name)
            listed.append(
                {"name": "weak_ref_tensor_view", "module": name, "why": "weak_ref_tensor "
                 "raises NotImplementedError off CUDA/XPU/NPU (or JIT-builds a CUDA kernel); the "
                 "stand-in gives the tensor itself, or in a captured prefill graph a view that "
                 "keeps its storage (a CPU cannot read freed memory), counted after the capture "
                 "to see whether the release still holds that memory"}
            )  # fmt: skip
    if not torch.distributed.is_initialized():
        store = torch.distributed.HashStore()
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
        listed.append(
            {"name": "gloo_one_process_group", "module": "torch.distributed", "why":
             "SGLangBackend.__call__ asks torch.distributed.get_rank(); one process answers 0"}
        )  # fmt: skip
    return listed


def counter() -> dict[str, int]:
    """SGLang's compilation counter (``compilation_counter``) as it stands."""
    from sglang.srt.compilation.compilation_counter import compilation_counter

    return dataclasses.asdict(compilation_counter)


def sglang_frames(tb: traceback.StackSummary) -> list[frames.Frame]:
    """The frames of SGLang's own code in a traceback."""
    return [f for f in frames.user_frames(tb) if "sglang/" in f.file]


@dataclasses.dataclass
class Compiled:
    """One compile through SGLang's entry point: the outcome, SGLang's counter, its split ops,
    the contexts entered, SGLang's frames around the failure."""

    outcome: trace.TraceOutcome
    counts: dict[str, int]
    split_ops: list[str]
    contexts: list[str]
    sglang_frames: list[str]
    cause: str = ""
    entry: str = "sglang.srt.compilation.compile.install_torch_compiled"

    def as_record(self) -> dict:
        keep = ("num_graphs_seen", "num_piecewise_graphs_seen", "num_piecewise_capturable_graphs_seen",
                "num_backend_compilations", "num_eager_compiles", "num_inductor_compiles")  # fmt: skip
        return {
            **self.outcome.as_record(),
            "sglang_counter": {k: v for k, v in self.counts.items() if k in keep},
            "split_ops": self.split_ops,
            "sglang_contexts": self.contexts,
            "sglang_frames": self.sglang_frames,
            "cause": self.cause,
            "entry": self.entry,
            "backend": "sglang.srt.compilation.backend.SGLangBackend",
        }


def failed(outcome: trace.TraceOutcome, exc: Exception) -> tuple[str, list[str]]:
    """``outcome`` filled from a compile failure (dynamo's words, SGLang's frames around the
    compile, then dynamo's real stack of the traced code); returns the cause line and SGLang's
    frames. A dynamo error SGLang re-raised as its own (0.5.2x: "Capture prefill CUDA graph
    failed") is read from the dynamo error, SGLang's frames from both."""
    outer = traceback.extract_tb(exc.__traceback__)
    while not isinstance(exc, torch._dynamo.exc.TorchDynamoException) and isinstance(
        exc.__cause__, Exception
    ):
        exc = exc.__cause__
    traced = isinstance(exc, torch._dynamo.exc.TorchDynamoException)  # raised while tracing
    outcome.status = "unsupported" if traced else "runtime_error"
    outcome.exception = f"{type(exc).__module__}.{type(exc).__qualname__}"
    said = paths.unrooted(str(exc))
    parsed = trace.parse_message(said)
    outcome.message, outcome.explanation, outcome.hints, outcome.debug_context = parsed
    outcome.gb_type = getattr(exc, "gb_type", None) or None
    cause = next((line.strip() for line in said.splitlines()[1:] if line.strip()), "")
    inner = traceback.extract_tb(exc.__traceback__)
    found = sglang_frames(outer if inner is outer else traceback.StackSummary([*outer, *inner]))
    real = getattr(exc, "real_stack", None) or inner
    outcome.frames = found + [f for f in frames.user_frames(real) if f not in found]
    return cause, [str(f) for f in found]


def _cpu(device: Any) -> Any:
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    return "cpu" if isinstance(device, int) and not isinstance(device, bool) else device


class CudaOnCpu(TorchFunctionMode):
    """Tensors SGLang creates or moves to ``cuda`` during set-up land on the CPU (its device
    checks say CUDA: they were answered by the simulated GPU and are cached)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func is torch.Tensor.to:
            args = tuple(_cpu(a) if i else a for i, a in enumerate(args))
        return func(*args, **kwargs)
