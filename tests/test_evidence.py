"""core.evidence: the fixed vocabulary, its order, and the words a verdict carries."""

from __future__ import annotations

import pytest

from fp4lab.core import evidence


def test_levels_are_ordered_and_unknown_ones_refused():
    assert evidence.check(["serving", "trace"]) == ["trace", "serving"]
    with pytest.raises(ValueError, match="allowed values: trace, simulated_target"):
        evidence.check(["compiled"])


def test_a_cpu_trace_on_a_simulated_target_claims_no_kernel_run():
    levels = evidence.of_run(traced=True, simulated=True, kernel="fp4lab_reference")
    assert levels == ["trace", "simulated_target", "reference_kernel"]
    text = evidence.describe(levels, "cpu", "12.0", True)
    assert text == (
        "trace, simulated_target, reference_kernel on cpu, SM12.0 simulated; "
        "not run on the target GPU"
    )


def test_a_real_fp4_kernel_replayed_on_the_real_target_says_so():
    levels = evidence.of_run(traced=True, simulated=False, kernel="flashinfer", replayed=True)
    assert levels == ["trace", "real_fp4_kernel", "cuda_graph_replay"]
    assert evidence.describe(levels, "NVIDIA RTX PRO 6000", "12.0", False).endswith("SM12.0 real")
