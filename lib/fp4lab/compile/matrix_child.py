"""Inside one version's environment: the story's trace on the installed FlashInfer, as JSON.

    python -m fp4lab.compile.matrix_child      # one JSON line on stdout

``matrix_env.trace_in_env`` runs this in each version's environment; it imports nothing that
environment lacks (torch, FlashInfer and fp4lab's lib/ only).
"""

from __future__ import annotations

import json
import warnings

import torch

from fp4lab.compile import fix, segment, stages, target, trace
from fp4lab.core import probe

CHAIN_KEYS = (
    "step",
    "stage",
    "origin",
    "story",
    "signature",
    "message",
    "skipped_builtin",
    "blocker_frame",
    "seconds",
)
"""What the parent keeps of each blocker-chain row."""


def _compiled(outcome: trace.TraceOutcome) -> dict:
    return {
        "signature": outcome.signature,
        "graph_count": outcome.graph_count,
        "message": outcome.message,
    }


def trace_installed_flashinfer() -> dict:
    """The public path's blocker chain, the upstream op (if any) and fp4lab's op, each traced
    under fullgraph=True on the simulated Blackwell target; plain data."""
    shape = segment.LayerShape(hidden=64, heads=2, ffn=128)
    x = segment.tokens_input(shape, 16)
    chain = stages.walk_blocker_chain(segment.Stack(shape, 1, target.fp4_quantize), x)
    with torch.no_grad(), target.simulated_target() as seen, fix.upstream_op_cpu_kernel() as op:
        if op is None:
            upstream = {"present": False}
        else:
            outcome = trace.attempt(segment.Stack(shape, 1, lambda h, gs: op(h, gs)), x)
            upstream = {"present": True, "schema": str(op._schema), **_compiled(outcome)}
    with torch.no_grad(), target.simulated_target(), fix.custom_op_fp4_quantize():
        ours = _compiled(trace.attempt(segment.Stack(shape, 1, target.fp4_quantize), x))
    return {
        "packages": {name: probe.package_version(name) for name in ("torch", "flashinfer-python")},
        "target": seen,
        "import_staging": target.IMPORT_STAGING,
        "chain": [{k: row[k] for k in CHAIN_KEYS} for row in chain],
        "upstream_op": upstream,
        "fp4lab_op": ours,
    }


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    print(json.dumps(trace_installed_flashinfer()))
