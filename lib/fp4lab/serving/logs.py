"""What a server log shows: dynamo's failures by ``fp4lab.compile.trace``'s names, CUDA
out-of-memory, NCCL errors, SGLang's piecewise-CUDA-graph banners, the server arguments it
resolved (``resolved_args``) and whether MSCCL++ really ran (``mscclpp_outcome``).

The SGLang lines matched here are the ones its source logs (tests/test_sglang_contract.py checks
each against the installed wheel)."""

from __future__ import annotations

import ast
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
        re.compile(r"Piecewise CUDA Graph is enabled|Using tc_piecewise CUDA graph", re.IGNORECASE),
    ),
)
MSCCLPP_DISABLED = re.compile(
    r"PyMscclpp is (?:unavailable|disabled)[^\n]*|PyMscclpp did not produce any usable tuned configurations"
)
"""SGLang's warnings when it turns MSCCL++ off (package missing, world size or group unsupported)."""
MSCCLPP_CREATED = re.compile(r"Created MSCCL\+\+ communicator[^\n]*")
"""SGLang's line when a rank created a usable MSCCL++ communicator."""
_RESOLVED = re.compile(r"server_args=(\{.*\}|ServerArgs\(.*\))\s*$")
_FIELD = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|True|False|None|-?\d+(?:\.\d+)?)")
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


def resolved_args(text: str) -> dict:
    """The server arguments SGLang logged at start-up: its resolved dict (newer releases) or the
    plain fields of its ``ServerArgs(...)`` repr (older ones); {} when it logged none."""
    for line in text.splitlines():
        match = _RESOLVED.search(line)
        if not match:
            continue
        logged = match.group(1)
        if logged.startswith("{"):
            try:
                return ast.literal_eval(logged)
            except (ValueError, SyntaxError):
                pass
        return {k: ast.literal_eval(v) for k, v in _FIELD.findall(logged)}
    return {}


def captures_cuda_graphs(resolved: dict) -> bool:
    """Whether a server with these resolved arguments captures any CUDA graph at all."""
    if resolved.get("device") not in (None, "cuda") or resolved.get("disable_cuda_graph"):
        return False
    phases = (resolved.get("cuda_graph_config") or {}).values()
    return not phases or any(p.get("backend") != "disabled" for p in phases if isinstance(p, dict))


def mscclpp_outcome(text: str) -> tuple[bool, str]:
    """Whether a server launched with --enable-mscclpp ran MSCCL++, and the proof or the reason.

    SGLang turns MSCCL++ off with only a warning (package missing, TP size unsupported), creates
    no communicator for one rank, and uses one only inside CUDA-graph capture.
    """
    resolved = resolved_args(text)
    if resolved and not resolved.get("enable_mscclpp"):
        return False, "fell back to nccl: SGLang resolved enable_mscclpp to False"
    disabled = MSCCLPP_DISABLED.search(text)
    if disabled:
        return False, f"fell back to nccl: {disabled.group(0).strip()}"
    created = MSCCLPP_CREATED.search(text)
    if not created:
        tp = resolved.get("tp_size")
        return False, (
            "fell back to nccl: SGLang logged no MSCCL++ communicator"
            + (" (it creates none for one rank: tp_size=1)" if tp == 1 else "")
        )
    if resolved and not captures_cuda_graphs(resolved):
        return False, (
            "fell back to nccl: SGLang uses MSCCL++ only inside CUDA-graph capture and this "
            "server captures no CUDA graph"
        )
    return True, created.group(0).strip()
