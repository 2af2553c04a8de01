"""What a server log shows: dynamo's failures by ``fp4lab.compile.trace``'s names, CUDA
out-of-memory, NCCL errors, and SGLang's "Piecewise CUDA Graph is enabled by default" banner."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fp4lab.compile import trace
from fp4lab.compile.frames import Frame

LOG_SIGNATURES = (
    *(s for s in trace.SIGNATURES if s != "ok"),
    "cuda_out_of_memory",
    "nccl_error",
    "piecewise_cuda_graph_banner",
)
"""Every name ``classify_log`` can give: fp4lab.compile.trace's names for dynamo failures, then the server's own."""

_PATTERNS = (
    (
        "cuda_out_of_memory",
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    ),
    ("nccl_error", re.compile(r"NCCL error|\bnccl\w*Error\b|DistBackendError")),
    (
        "piecewise_cuda_graph_banner",
        re.compile(r"Piecewise CUDA Graph is enabled by default", re.IGNORECASE),
    ),
)
_DYNAMO_EXCEPTION = re.compile(r"torch\._dynamo\.exc\.(\w+): ?(.*)")
_DYNAMO_FOOTER = "Set TORCHDYNAMO_VERBOSE"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_STDLIB_PATH = re.compile(r"/lib/python3\.\d+/(?P<rel>.+)$")
_SOURCE_TREE = re.compile(r"/python/(?P<rel>sglang/.+)$")
_SEGMENT_END = re.compile(
    r"^(Traceback \(most recent call last\)|The above exception|During handling of the above)"
)


@dataclass(frozen=True)
class Finding:
    """One known failure seen in a log, with the line that shows it."""

    signature: str
    evidence: str
    line: int
    blocked_in: str = ""
    """For dynamo failures: the innermost frame outside the standard library, as trace names it."""

    @property
    def is_dynamo(self) -> bool:
        return self.signature in trace.SIGNATURES


def _package_path(path: str) -> str:
    """A path from another machine's traceback, relative to its package root as fp4lab.compile.trace writes frames."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for pattern, prefix in ((_SOURCE_TREE, ""), (_STDLIB_PATH, "<stdlib>/")):
        match = pattern.search(path)
        if match:
            return prefix + match.group("rel")
    return Path(path).name


def _frames(lines: list[str]) -> list[Frame]:
    frames = []
    for index, line in enumerate(lines):
        match = _FRAME.match(line)
        if not match:
            continue
        file = _package_path(match.group("file"))
        if file.startswith("torch/_dynamo/"):
            continue  # dynamo's own polyfills, not the traced program (as fp4lab.compile.trace drops them)
        source = (
            lines[index + 1].strip()
            if index + 1 < len(lines) and not _FRAME.match(lines[index + 1])
            else ""
        )
        frames.append(Frame(file, int(match.group("line")), match.group("function"), source))
    return frames


def _user_code(lines: list[str], start: int) -> list[str]:
    """The 'from user code:' frames dynamo printed, found from ``start`` on (or just above its footer)."""
    footer = next((i for i in range(start, len(lines)) if _DYNAMO_FOOTER in lines[i]), None)
    if footer is None:
        return []
    header = next(
        (i for i in range(footer - 1, start - 1, -1) if lines[i].strip() == "from user code:"), None
    )
    if (
        header is None
    ):  # a quoted excerpt may start inside the block: take the indented lines above the footer
        header = footer - 1
        while header >= 0 and (not lines[header].strip() or lines[header][:1].isspace()):
            header -= 1
    return lines[header + 1 : footer]


def _dynamo_finding(lines: list[str]) -> Finding | None:
    """Dynamo's failure in a log, named by fp4lab.compile.trace.classify from its message and frames."""
    at = next((i for i, line in enumerate(lines) if _DYNAMO_EXCEPTION.search(line)), None)
    footer = next((i for i, line in enumerate(lines) if _DYNAMO_FOOTER in line), None)
    if at is None and footer is None:
        return None
    if at is None:
        outcome = trace.TraceOutcome(
            status="unsupported", fullgraph=True, backend="unknown", seconds=0.0
        )
        outcome.frames = _frames(_user_code(lines, 0))
        return Finding(
            trace.classify(outcome), lines[footer].strip(), footer, str(outcome.blocker_frame or "")
        )
    match = _DYNAMO_EXCEPTION.search(lines[at])
    end = next(
        (i for i in range(at + 1, len(lines)) if _SEGMENT_END.match(lines[i].strip())), len(lines)
    )
    segment = [match.group(2), *lines[at + 1 : end]]
    status = "unsupported" if match.group(1) == "Unsupported" else "runtime_error"
    outcome = trace.TraceOutcome(status=status, fullgraph=True, backend="unknown", seconds=0.0)
    outcome.message, outcome.explanation, outcome.hints, outcome.debug_context = (
        trace.parse_message("\n".join(segment))
    )
    outcome.frames = _frames(_user_code(lines, at))
    return Finding(trace.classify(outcome), lines[at].strip(), at, str(outcome.blocker_frame or ""))


def classify_log(text: str) -> list[Finding]:
    """Every known failure a server log shows, in the order they first appear."""
    lines = text.splitlines()
    findings = [f for f in [_dynamo_finding(lines)] if f]
    for signature, pattern in _PATTERNS:
        at = next((i for i, line in enumerate(lines) if pattern.search(line)), None)
        if at is not None:
            findings.append(Finding(signature, lines[at].strip(), at))
    return sorted(findings, key=lambda f: f.line)
