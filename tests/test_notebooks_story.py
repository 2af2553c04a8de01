"""Notebooks 00-05 executed through papermill with small parameters; their records checked."""

from __future__ import annotations

import pytest
from papermill.exceptions import PapermillExecutionError

pytestmark = pytest.mark.notebook
SMALL = dict(tokens=16, hidden=64, heads=2, ffn=128)


def test_00_environment(run_notebook):
    rows, _ = run_notebook("00_environment")
    kinds = [r["kind"] for r in rows]
    assert kinds.count("machine") == 1 and kinds.count("plan") >= 6
    plan = {r["values"]["notebook"]: r["values"] for r in rows if r["kind"] == "plan"}
    assert plan["01_nvcc_subprocess_crash"]["runs here"] is True


def test_01_reproduces_the_nvcc_subprocess_crash(run_notebook):
    rows, executed = run_notebook("01_nvcc_subprocess_crash", **SMALL)
    assert len(rows) == 2
    for r in rows:
        v = r["values"]
        assert (v["signature"], v["exception"], v["shows_nvcc_query"]) == ("subprocess", "torch._dynamo.exc.Unsupported", True)
        assert v["blocker_frame"].startswith("flashinfer/jit/cpp_ext.py:")
        assert any(f.startswith("<stdlib>/subprocess.py:") for f in v["frames"])
        assert r["provenance"]["target_sm"] == "12.0"
    with_home = rows[1]["values"]
    assert with_home["cuda_home"] and ":get_cuda_version" in with_home["blocker_frame"]
    assert "check_output" in executed.read_text()


def test_02_walks_the_chain_to_file_io(run_notebook):
    rows, _ = run_notebook("02_file_io_trace", **SMALL)
    steps = [r["values"] for r in rows]
    assert steps[-1]["signature"] == "file_io"
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert "patch_cuda_version" in [s["stage"] for s in steps]


def test_03_reproduces_the_compiler_disable_rejection(run_notebook):
    [row], _ = run_notebook("03_compiler_disable_fullgraph", **SMALL)
    assert row["values"]["signature"] == "compiler_disable_under_fullgraph"
    assert row["values"]["message"] == "Skip calling `torch.compiler.disable()`d function"


def test_04_measures_the_tradeoff(run_notebook, isolated_outputs):
    rows, _ = run_notebook("04_fullgraph_false_tradeoff", scale=64, layers=2, tokens=16, backend="eager", warmup=1, iters=3)
    variants = {r["values"]["variant"]: r["values"] for r in rows}
    assert set(variants) == {"eager", "compiled_with_breaks", "compiled_fullgraph_custom_op"}
    assert variants["compiled_fullgraph_custom_op"]["graph_calls"] == 1
    assert variants["compiled_with_breaks"]["graph_calls"] >= 4 and variants["compiled_with_breaks"]["graph_break_count"] >= 1
    assert all(v["matches_eager"] for v in variants.values()), "the eager backend runs the same ops"
    assert all(v["step_median_ms"] > 0 for v in variants.values())
    assert (isolated_outputs / "figures" / "04_fullgraph_tradeoff.png").stat().st_size > 1000
    assert (isolated_outputs / "figures" / "04_fullgraph_tradeoff.json").exists()


def test_05_the_fix_compiles_to_one_graph(run_notebook):
    rows, _ = run_notebook("05_custom_op_fix", backends=["eager"], layers=1, **SMALL)
    by_kind = {r["kind"]: r["values"] for r in rows}
    assert set(by_kind["opcheck"].values()) >= {"SUCCESS"}
    fix = by_kind["fix"]
    assert (fix["signature"], fix["graph_count"], fix["graph_break_count"], fix["bit_equal_to_eager"]) == ("ok", 1, 0, True)
    assert "upstream_op" in by_kind


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("01_nvcc_subprocess_crash", {"backend": "tvm"}, "backend='tvm' is not allowed"),
        ("02_file_io_trace", {"target_sm": "12.5"}, "target_sm='12.5' is not a known SM"),
        ("03_compiler_disable_fullgraph", {"ffn": 100}, "ffn=100 must be a multiple of 16"),
        ("04_fullgraph_false_tradeoff", {"scale": 3}, "scale=3 is not allowed"),
        ("05_custom_op_fix", {"tokens": 0}, "tokens=0 must be a positive integer"),
        ("00_environment", {"notebooks": "42"}, "NOTEBOOKS contains '42'"),
    ],
)
def test_bad_parameters_fail_in_the_validation_cell(run_notebook, name, bad, message):
    with pytest.raises(PapermillExecutionError, match=message) as failure:
        run_notebook(name, **bad)
    assert failure.value.cell_index <= 3, "the error comes from the validation cell, before heavy work"
