"""Notebook 05's checks of the fix: opcheck, the story's segment compiled through the op on each
backend and compared with eager, and FlashInfer's own op where the installed version ships it."""

from __future__ import annotations

import torch

from fp4lab.compile import fix, segment, target, trace
from fp4lab.compile.story import Story
from fp4lab.core import probe


def opcheck(run: Story) -> dict:
    """``torch.library.opcheck`` of the op (schema, fake, autograd registration, dynamic shapes); records "opcheck"."""
    probe_x = torch.randn(run.params["tokens"], run.params["ffn"]).to(torch.bfloat16)
    result = torch.library.opcheck(fix.custom_op(), (probe_x, torch.tensor([100.0])))
    run.rec.add("opcheck", {"op": fix.OP_NAME, **result})
    return result


def _eager_reference(run: Story) -> torch.Tensor:
    """The segment's output with the nvfp4 reference called eagerly (same weights: same seed)."""
    with torch.no_grad():
        return segment.Stack(run.shape, run.layers, quantize=fix.reference_fp4_quantize)(run.x)


def _matches(outcome: trace.TraceOutcome, reference: torch.Tensor) -> bool:
    return outcome.output is not None and bool(torch.equal(outcome.output, reference))


def compile_fix(run: Story) -> list[dict]:
    """The segment with ``flashinfer.fp4_quantize`` routed through the op, under fullgraph=True on
    each backend; one "fix" record per backend, with the output compared with eager."""
    reference = _eager_reference(run)
    rows = []
    with target.simulated_target(run.sm), fix.custom_op_fp4_quantize():
        for backend in run.params["backends"]:
            with torch.no_grad():
                outcome = trace.attempt(run.model, run.x, fullgraph=True, backend=backend)
            diff = (
                float((outcome.output.float() - reference.float()).abs().max())
                if outcome.output is not None
                else None
            )
            row = {
                **outcome.as_record(),
                "op": fix.OP_NAME,
                "bit_equal_to_eager": _matches(outcome, reference),
                "max_abs_diff_vs_eager": diff,
                "output_rms": float(reference.float().pow(2).mean().sqrt()),
            }
            run.rec.add("fix", row)
            rows.append(row)
    return rows


def compile_upstream_op(run: Story) -> dict | None:
    """FlashInfer's own op in the segment under fullgraph=True (eager backend, the reference as
    its CPU kernel); records "upstream_op" ({"present": False} where there is none)."""
    with target.simulated_target(run.sm), fix.upstream_op_cpu_kernel() as op:
        if op is None:
            print(
                f"flashinfer-python {probe.package_version('flashinfer-python')} has no "
                "torch.ops.flashinfer.fp4_quantize (added in 0.6.12)"
            )
            run.rec.add("upstream_op", {"present": False})
            return None
        model = segment.Stack(run.shape, run.layers, quantize=lambda h, gs: op(h, gs))
        with torch.no_grad():
            outcome = trace.attempt(model, run.x, fullgraph=True, backend="eager")
        row = {
            **outcome.as_record(),
            "present": True,
            "op": str(op),
            "schema": str(op._schema),
            "bit_equal_to_eager": _matches(outcome, _eager_reference(run)),
        }
        run.rec.add("upstream_op", row)
    print(
        f"{op}: {outcome.signature}, {outcome.graph_count} graph(s), "
        f"{outcome.graph_break_count} breaks; bit-equal to eager: {row['bit_equal_to_eager']}"
    )
    return row


def fix_verdict(rows: list[dict], opcheck_result: dict, upstream: dict | None) -> str:
    """One graph, no breaks on every backend (bit-equal with the eager backend) and opcheck
    passed, or AssertionError."""
    for row in rows:
        assert (
            row["signature"] == "ok" and row["graph_count"] == 1 and row["graph_break_count"] == 0
        ), (
            f"the fix did not compile to one graph with {row['backend']}: "
            f"{row['signature']}: {row['message']}"
        )
        if row["backend"] == "eager":
            assert row["bit_equal_to_eager"], (
                "compiled output differs from eager with the eager backend"
            )
    assert all(v == "SUCCESS" for v in opcheck_result.values()), opcheck_result
    shipped = (
        f"upstream op: {upstream['signature']}" if upstream else "no upstream op in this FlashInfer"
    )
    backends = ", ".join(r["backend"] for r in rows)
    return f"fixed: fullgraph=True compiles to 1 graph with 0 breaks on {backends}; {shipped}"
