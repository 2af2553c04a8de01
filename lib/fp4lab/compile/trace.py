"""Run a callable under torch.compile and name what happened from dynamo's own words.

``attempt`` never raises for a compile failure: it returns a ``TraceOutcome`` holding
the exception class, dynamo's first message line, its Explanation / Hint / debug-context
lines, the user-code frames it reports (``exc.real_stack``, as ``frames.Frame``), the wall
time, how many compiled graphs one call ran, and for ``fullgraph=False`` the graph count
and break reasons from ``torch._dynamo.explain``.

``classify`` names the failure from those messages and frames alone. It knows nothing
of FlashInfer, so the same rules name a subprocess call in any library.
"""

from __future__ import annotations

import re
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch._dynamo

from fp4lab.compile.frames import Frame, user_frames

SIGNATURES = (
    "ok",
    "subprocess",
    "file_io",
    "compiler_disable_under_fullgraph",
    "device_check",
    "non_tensor_torch_op",
    "unsupported_other",
    "runtime_error",
)
"""Every name ``classify`` can give."""

_SUBPROCESS_MODULES = {"subprocess", "_posixsubprocess"}
_FILE_MODULES = {
    "pathlib",
    "genericpath",
    "posixpath",
    "os",
    "io",
    "_pyio",
    "shutil",
    "tempfile",
    "glob",
    "filelock",
}
_FILE_BUILTINS = {"posix", "nt", "io", "_io", "open"}
_DEVICE_WORDS = re.compile(r"\b(device|cuda|gpu|compute capability|sm_?\d+)\b", re.IGNORECASE)
_NVCC = re.compile(r"(?<!\w)nvcc(?!\w)")
_BUILTIN = re.compile(r"builtin (?:operator )?`([\w.]+?)\.?`")


@dataclass
class TraceOutcome:
    """What happened when a callable was compiled and called once."""

    status: str  # compiled | unsupported | runtime_error
    fullgraph: bool
    backend: str
    seconds: float
    exception: str | None = None
    message: str | None = None
    gb_type: str | None = None
    explanation: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    debug_context: str | None = None
    frames: list[Frame] = field(default_factory=list)
    graph_count: int | None = None
    graph_break_count: int | None = None
    graph_calls: int | None = None
    break_reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    output: Any = field(default=None, repr=False, compare=False)
    compiled: Callable | None = field(default=None, repr=False, compare=False)

    @property
    def signature(self) -> str:
        return classify(self)

    @property
    def skipped_builtin(self) -> str | None:
        """The builtin dynamo refused, as it names it (``posix.stat``), if it names one."""
        for line in [*self.explanation, self.message or ""]:
            match = _BUILTIN.search(line)
            if match:
                return match.group(1)
        return None

    @property
    def shows_nvcc_query(self) -> bool:
        """Whether the failing trace went through the CUDA toolkit version query (nvcc or get_cuda_version)."""
        return any(_NVCC.search(f.source) or "cuda_version" in f.function for f in self.frames)

    @property
    def blocker_frame(self) -> Frame | None:
        """The innermost frame outside the standard library: the code that made the call."""
        outside = [f for f in self.frames if not f.in_stdlib]
        return outside[-1] if outside else None

    def as_record(self) -> dict:
        """The outcome as plain JSON-able values, with its signature."""
        data = asdict(self)
        data.pop("output")
        data.pop("compiled")
        data["frames"] = [str(f) for f in self.frames]
        data["signature"] = self.signature
        data["skipped_builtin"] = self.skipped_builtin
        data["shows_nvcc_query"] = self.shows_nvcc_query
        data["blocker_frame"] = str(self.blocker_frame) if self.blocker_frame else None
        return data


def parse_message(text: str) -> tuple[str, list[str], list[str], str | None]:
    """Dynamo's message split into its first line, Explanation lines, Hint lines and debug context."""
    lines = text.splitlines()
    first = lines[0].strip() if lines else ""
    explanation, hints, debug = [], [], None
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("Explanation:"):
            explanation.append(stripped.removeprefix("Explanation:").strip())
        elif stripped.startswith("Hint:"):
            hints.append(stripped.removeprefix("Hint:").strip())
        elif stripped.startswith("Developer debug context:"):
            debug = stripped.removeprefix("Developer debug context:").strip()
    return first, explanation, hints, debug


def _counting(backend: str, counts: dict[str, int]) -> Callable:
    """Wrap a backend to count the graphs it compiles and how often compiled graphs run."""
    compile_graph = torch._dynamo.lookup_backend(backend)

    def counted(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        counts["compiled"] += 1
        compiled = compile_graph(gm, example_inputs)

        def run_graph(*args: Any) -> Any:
            counts["calls"] += 1
            return compiled(*args)

        return run_graph

    return counted


def attempt(
    fn: Callable, *args: Any, fullgraph: bool = True, backend: str = "eager", **kwargs: Any
) -> TraceOutcome:
    """Compile ``fn`` with torch.compile and call it once on ``args``; never raises for a compile failure.

    Dynamo's caches are reset first, so every attempt really traces. The compiled callable
    and its first result are kept in ``outcome.compiled`` and ``outcome.output``.
    """
    if backend not in torch._dynamo.list_backends(exclude_tags=()) and backend != "eager":
        allowed = ", ".join(sorted({*torch._dynamo.list_backends(), "eager"}))
        raise ValueError(
            f"backend={backend!r} is not a torch.compile backend; allowed values: {allowed}"
        )
    torch._dynamo.reset()
    outcome = TraceOutcome(status="compiled", fullgraph=fullgraph, backend=backend, seconds=0.0)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compile_and_call(outcome, fn, args, kwargs)
    outcome.seconds = time.perf_counter() - started
    # Dynamo's warnings (e.g. "ignores the cache wrapper"), first line each, once each.
    outcome.warnings = list(
        dict.fromkeys(
            str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()
        )
    )
    return outcome


def _compile_and_call(outcome: TraceOutcome, fn: Callable, args: tuple, kwargs: dict) -> None:
    fullgraph = outcome.fullgraph
    if not fullgraph:
        explained = torch._dynamo.explain(fn)(*args, **kwargs)
        outcome.graph_count = explained.graph_count
        outcome.graph_break_count = explained.graph_break_count
        outcome.break_reasons = [_break_reason(reason) for reason in explained.break_reasons]
        torch._dynamo.reset()
    counts = {"compiled": 0, "calls": 0}
    try:
        outcome.compiled = torch.compile(
            fn, fullgraph=fullgraph, backend=_counting(outcome.backend, counts)
        )
        outcome.output = outcome.compiled(*args, **kwargs)
        outcome.graph_calls = counts["calls"]
    except torch._dynamo.exc.Unsupported as exc:
        outcome.status = "unsupported"
        _fill_failure(outcome, exc, getattr(exc, "real_stack", None))
        outcome.gb_type = getattr(exc, "gb_type", None) or None
    except Exception as exc:  # a failure while running (or lowering) the compiled program
        outcome.status = "runtime_error"
        _fill_failure(
            outcome,
            exc,
            getattr(exc, "real_stack", None) or traceback.extract_tb(exc.__traceback__),
        )
    if fullgraph and outcome.status == "compiled":
        outcome.graph_count, outcome.graph_break_count = counts["compiled"], 0


def _break_reason(reason: Any) -> str:
    """Dynamo's first line for one graph break, with the frame where it happened."""
    frames = user_frames(getattr(reason, "user_stack", None))
    where = f" at {frames[-1]}" if frames else ""
    return reason.reason.strip().splitlines()[0] + where


def _fill_failure(
    outcome: TraceOutcome, exc: BaseException, stack: traceback.StackSummary | list | None
) -> None:
    outcome.exception = f"{type(exc).__module__}.{type(exc).__qualname__}"
    outcome.message, outcome.explanation, outcome.hints, outcome.debug_context = parse_message(
        str(exc)
    )
    outcome.frames = user_frames(stack)


def classify(outcome: TraceOutcome) -> str:
    """Name the outcome (one of SIGNATURES) from dynamo's messages and the frames it reported."""
    if outcome.status == "compiled":
        return "ok"
    if outcome.status == "runtime_error":
        return "runtime_error"
    words = " ".join(
        [outcome.gb_type or "", outcome.message or "", *outcome.explanation, *outcome.hints]
    )
    if "torch.compiler.disable" in words:
        return "compiler_disable_under_fullgraph"
    packages = {f.module.removeprefix("<stdlib>.").split(".")[0] for f in outcome.frames}
    builtin = (outcome.skipped_builtin or "").split(".")[0]
    if packages & _SUBPROCESS_MODULES or builtin in _SUBPROCESS_MODULES:
        return "subprocess"
    if packages & _FILE_MODULES or builtin in _FILE_BUILTINS:
        return "file_io"
    if "Observed exception" in words and _DEVICE_WORDS.search(outcome.debug_context or ""):
        return "device_check"
    if "returned non-Tensor" in words:
        return "non_tensor_torch_op"
    return "unsupported_other"
