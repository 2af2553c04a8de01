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


def test_levels_of_many_rows_are_their_union_in_order():
    rows = [{"evidence": ["cuda_graph_replay", "reference_kernel"]}, {"evidence": ["trace"]}, {}]
    assert evidence.of_values(rows) == ["trace", "reference_kernel", "cuda_graph_replay"]


def test_a_figure_carries_its_evidence_in_footer_and_sidecar(isolated_outputs):
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fp4lab.core import figures, records

    fig, _ = plt.subplots()
    prov = records.provenance()
    path = figures.save_figure(fig, "t", prov, "test", evidence=["reference_kernel", "trace"])
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["evidence"] == ["trace", "reference_kernel"]
    assert any("evidence: trace, reference_kernel" in t.get_text() for t in fig.texts)
    with pytest.raises(ValueError, match="allowed values"):
        figures.save_figure(fig, "u", prov, "test", evidence=["on_blackwell"])
    assert not (path.parent / "u.png").exists()


def test_every_committed_figure_of_make_reproduce_states_its_evidence():
    import json

    from fp4lab.core import paths

    for sidecar in sorted((paths.REPO_ROOT / "figures").glob("*.json")):
        assert "evidence" in json.loads(sidecar.read_text()), sidecar.name
