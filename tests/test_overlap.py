"""fp4lab.comm's overlap modules: shapes, checks, the chunked pipeline on gloo, bad input, a hung rank."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fp4lab.comm import torchrun
from fp4lab.comm.overlap import benchmark as overlap_benchmark
from fp4lab.comm.overlap import params as overlap_params
from fp4lab.core import probe, process

FAULTY = Path(__file__).parent / "fixtures" / "faulty_rank.py"


def test_glm5_shape_scales_widths_and_keeps_routing():
    assert overlap_params.MoeShape.glm5(1) == overlap_params.MoeShape(
        hidden=6144, moe_ffn=2048, topk=8, experts=256
    )
    assert overlap_params.MoeShape.glm5(16) == overlap_params.MoeShape(
        hidden=384, moe_ffn=128, topk=8, experts=256
    )
    with pytest.raises(ValueError, match="scale=3 is not allowed; allowed values: 1, 2, 4"):
        overlap_params.MoeShape.glm5(3)


SHAPE = overlap_params.MoeShape.glm5(64)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "mpi"}, "backend='mpi' is not allowed; allowed values: gloo, nccl"),
        (
            {"collective": "broadcast"},
            "collective='broadcast' is not allowed; allowed values: all_to_all, all_reduce",
        ),
        ({"world_size": 1}, "world size 1 is too small"),
        ({"world_size": 3}, "world size 3 must divide the 256 experts"),
        (
            {"tokens": 3},
            "tokens=3: tokens x top-8 = 24 rows must split evenly over 128 local experts",
        ),
        ({"chunks": [3]}, "chunks contains 3, which does not divide the 128 local experts"),
        ({"chunks": []}, "chunks is empty"),
        ({"iters": 0}, "iters=0 must be a positive integer"),
    ],
)
def test_validate_names_the_parameter(kwargs, message):
    args = {
        "shape": SHAPE,
        "tokens": 16,
        "chunks": [1, 2],
        "world_size": 2,
        "backend": "gloo",
        "collective": "all_to_all",
        "iters": 2,
        "warmup": 0,
    }
    with pytest.raises(ValueError, match=message):
        overlap_params.validate(**{**args, **kwargs})


def test_nccl_needs_a_gpu_per_rank():
    cpu = dataclasses.replace(probe.machine(), cuda_available=False, gpu_count=0)
    assert overlap_params.backend_for(cpu, 2) == "gloo"
    assert (
        overlap_params.unavailable("nccl", 2, cpu)
        == "nccl needs a CUDA GPU per rank (2); this machine has 0"
    )
    assert overlap_params.unavailable("gloo", 2, cpu) is None


def test_benchmark_refuses_bad_input_before_launching(tmp_path):
    log = tmp_path / "never.log"
    for kwargs, message in (
        ({"scale": 5}, "scale=5"),
        ({"nproc": 1}, "world size 1 is too small"),
        ({"dtype": "int8"}, "dtype='int8' is not allowed"),
        ({"chunks": (7,)}, "chunks contains 7"),
    ):
        with pytest.raises(ValueError, match=message):
            overlap_benchmark.benchmark(out=tmp_path / "o.jsonl", log_path=log, **kwargs)
    (tmp_path / "used.jsonl").write_text('{"chunks": 1}\n')
    with pytest.raises(ValueError, match="already holds results"):
        overlap_benchmark.benchmark(out=tmp_path / "used.jsonl", log_path=log)
    assert not log.exists()


@pytest.mark.parametrize("collective", ["all_to_all", "all_reduce"])
def test_pipeline_under_torchrun_times_and_checks_each_chunk_count(collective, tmp_path):
    result = overlap_benchmark.benchmark(
        out=tmp_path / "o.jsonl",
        log_path=tmp_path / "o.log",
        scale=64,
        tokens=32,
        chunks=(1, 4),
        collective=collective,
        iters=3,
        warmup=1,
        timeout_s=120,
    )
    assert result.run.ok, result.run.message
    assert process.members(result.run.finished.pid) == []
    assert [r["chunks"] for r in result.rows] == [1, 4]
    for r in result.rows:
        assert r["max_abs_diff_vs_blocking"] == 0.0, (
            "async combines must deliver what blocking ones do"
        )
        assert (
            min(r["t_compute_ms"], r["t_comm_ms"], r["t_overlapped_ms"], r["t_sequential_ms"]) > 0
        )
        expected = (r["t_compute_ms"] + r["t_comm_ms"] - r["t_overlapped_ms"]) / min(
            r["t_compute_ms"], r["t_comm_ms"]
        )
        assert r["efficiency"] == pytest.approx(expected)
        assert r["speedup_vs_sequential"] == pytest.approx(
            r["t_sequential_ms"] / r["t_overlapped_ms"]
        )
        assert (
            r["hidden"],
            r["moe_ffn"],
            r["experts"],
            r["world_size"],
            r["collective"],
            r["dtype"],
        ) == (96, 32, 256, 2, collective, "float32")


def test_a_hung_rank_is_named_and_finished_chunk_counts_are_kept(tmp_path):
    out = tmp_path / "o.jsonl"
    args = ["--module", "fp4lab.comm.overlap", "--fault", "hang", "--rank", "0", "--at", "2", "--",
            "--scale", "64", "--tokens", "32", "--chunks", "1,2,4", "--iters", "2", "--warmup", "0",
            "--out", str(out)]  # fmt: skip
    run = torchrun.run_ranks([str(FAULTY)], args, 2, 20, tmp_path / "hang.log")
    assert run.finished.timed_out and process.members(run.finished.pid) == []
    assert (
        "rank 0 (pid " in run.message
        and "hung at 'chunks 2'" in run.message
        and "rank 1 had reached 'chunks 2: timing'" in run.message
    ), run.message
    assert [r["chunks"] for r in torchrun.read_rows(out)] == [1]
