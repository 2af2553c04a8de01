"""The story's three crashes replayed, recorded and checked (notebooks 01, 02 and 03).

* msg 988 (01): the segment under fullgraph=True stops at FlashInfer's nvcc subprocess.
* msg 992 (02): with the CUDA-version patch (and the CPU-only stages), at the JIT's file I/O.
* msgs 1002/1009 (03): with ``fp4_quantize`` behind ``torch.compiler.disable``, at the
  decoration itself, which fullgraph=True forbids.

Each verdict raises AssertionError ("upstream behaviour changed: ...") when the installed
versions no longer crash the story's way.
"""

from __future__ import annotations

import os
from unittest import mock

from fp4lab.compile import stages, target, trace
from fp4lab.compile.story import Story
from fp4lab.core import probe

NVCC = "subprocess"
FILE_IO = "file_io"
COMPILER_DISABLE = "compiler_disable_under_fullgraph"


def nvcc_attempt(run: Story, *, with_cuda_home: bool = False) -> trace.TraceOutcome:
    """The segment under fullgraph=True on the target; records kind "attempt".

    ``with_cuda_home`` sets CUDA_HOME to the ``cuda_home`` parameter, so the trace reaches the
    ``nvcc --version`` call itself rather than ``which nvcc`` (the path need not exist).
    """
    cuda_home = run.params["cuda_home"] if with_cuda_home else None
    environment = {"CUDA_HOME": cuda_home} if cuda_home else {}
    with target.simulated_target(run.sm) as seen, mock.patch.dict(os.environ, environment):
        outcome = trace.attempt(run.model, run.x, fullgraph=True, backend=run.params["backend"])
        run.rec.add(
            "attempt", {**outcome.as_record(), "expected_signature": NVCC, "cuda_home": cuda_home}
        )
    print(f"target: SM{seen['sm']} ({'simulated' if seen['simulated'] else 'real'})")
    return outcome


def cache_warnings(outcome: trace.TraceOutcome, limit: int = 3) -> list[str]:
    """Dynamo's warnings about the ``functools.cache`` wrappers it traced through."""
    return [w for w in outcome.warnings if "cache" in w][:limit]


def nvcc_verdict(outcome: trace.TraceOutcome, with_home: trace.TraceOutcome) -> str:
    """Both attempts stopped at the nvcc query as a subprocess, or AssertionError."""
    for attempt in (outcome, with_home):
        assert attempt.signature == NVCC and attempt.shows_nvcc_query, (
            f"upstream behaviour changed: expected the {NVCC} blocker in the nvcc query, "
            f"observed {attempt.signature} at {attempt.blocker_frame}"
        )
    return (
        f"reproduced: {outcome.exception}: {outcome.message!r} at {outcome.blocker_frame}, "
        f"in {outcome.seconds:.1f} s\n"
        f"with CUDA_HOME: blocked at {with_home.blocker_frame}: {with_home.blocker_frame.source}"
    )


def file_io_chain(run: Story) -> list[dict]:
    """Walk the blocker chain to the JIT's file I/O; records one "chain_step" per attempt."""
    print("flashinfer-python", probe.package_version("flashinfer-python"))
    rows = stages.walk_blocker_chain(
        run.model, run.x, sm=run.sm, backend=run.params["backend"], until=FILE_IO
    )
    for row in rows:
        run.rec.add("chain_step", row, target=row["target"])
    return rows


def file_io_verdict(run: Story, rows: list[dict]) -> str:
    """Records the walk's "verdict"; the walk ended at the JIT's file I/O, or AssertionError."""
    last = rows[-1]
    applied = [r["stage"] for r in rows[1:]]
    seconds = sum(r["seconds"] for r in rows)
    run.rec.add(
        "verdict",
        {
            "signature": last["signature"],
            "expected_signature": FILE_IO,
            "message": last["message"],
            "blocker_frame": last["blocker_frame"],
            "stages": applied,
            "seconds": seconds,
        },
        target=last["target"],
    )
    assert last["signature"] == FILE_IO, (
        f"upstream behaviour changed: the walk ended at {last['signature']} "
        f"({last.get('note', '')}) at {last['blocker_frame']}, not at the JIT's file I/O"
    )
    from_story = [r["stage"] for r in rows if r["origin"] == "story"]
    return (
        f"reached the JIT's file I/O after {len(applied)} patches ({', '.join(applied)}); "
        f"from the story: {', '.join(from_story)}; total trace time {seconds:.1f} s"
    )


def compiler_disabled_attempt(run: Story) -> trace.TraceOutcome:
    """The story's state plus the msg 1002 decoration, under fullgraph=True; records "attempt"."""
    with (
        target.simulated_target(run.sm),
        stages.patch_cuda_version(),
        stages.compiler_disabled_fp4_quantize(),
    ):
        outcome = trace.attempt(run.model, run.x, fullgraph=True, backend=run.params["backend"])
        run.rec.add("attempt", {**outcome.as_record(), "expected_signature": COMPILER_DISABLE})
    return outcome


def compiler_disable_verdict(outcome: trace.TraceOutcome) -> str:
    """Dynamo rejected the decoration under fullgraph=True, or AssertionError."""
    assert outcome.signature == COMPILER_DISABLE, (
        f"upstream behaviour changed: observed {outcome.signature}: {outcome.message}"
    )
    hint = outcome.hints[0] if outcome.hints else None
    return (
        f"reproduced: {outcome.exception}: {outcome.message!r} in {outcome.seconds:.2f} s; "
        f"hint: {hint}"
    )
