"""fp4lab.comm's allreduce modules and torchrun driver: sizes, checks, real gloo sweeps, hangs, crashes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from fp4lab.comm import torchrun
from fp4lab.comm.allreduce import measure as allreduce
from fp4lab.comm.allreduce import params as allreduce_params
from fp4lab.comm.allreduce import sizes as message_sizes
from fp4lab.comm.allreduce import sweep as allreduce_sweep
from fp4lab.core import probe, process

FAULTY = Path(__file__).parent / "fixtures" / "faulty_rank.py"


def test_sizes_are_parsed_as_powers_of_two():
    assert message_sizes.parse_size("64MiB") == 64 << 20 and message_sizes.parse_size("512") == 512
    assert message_sizes.parse_sizes("1KiB:8KiB") == [1024, 2048, 4096, 8192]
    assert message_sizes.parse_sizes("1MiB, 4KiB,4KiB") == [4096, 1 << 20]
    assert len(message_sizes.parse_sizes("1KiB:64MiB")) == 17
    assert [message_sizes.format_size(n) for n in (512, 1024, 3 << 20, 1 << 30)] == [
        "512B",
        "1KiB",
        "3MiB",
        "1GiB",
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("3KiB", "not a power of two"),
        ("1KB", "sizes contains '1KB'"),
        ("64MiB:1KiB", "runs from 67108864 down to 1024"),
        (",", "is empty"),
        ("0", "not a power of two"),
    ],
)
def test_bad_sizes_name_the_parameter_and_the_allowed_form(spec, message):
    with pytest.raises(ValueError, match=message) as caught:
        message_sizes.parse_sizes(spec)
    assert "allowed values: powers of two" in str(caught.value)


def test_bus_bandwidth_follows_nccl_tests():
    assert allreduce.bus_bandwidth(10.0, 2) == 10.0
    assert allreduce.bus_bandwidth(10.0, 8) == pytest.approx(17.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("mpi", [1024], 2, 3, 1, "float32", ("eager",)),
            "backend='mpi' is not allowed; allowed values: gloo, nccl, mscclpp",
        ),
        (("gloo", [1024], 1, 3, 1, "float32", ("eager",)), "world size 1 is too small"),
        (("gloo", [1024], 2, 0, 1, "float32", ("eager",)), "iters=0 must be an integer >= 1"),
        (("gloo", [1024], 2, 3, 1, "int8", ("eager",)), "dtype='int8' is not allowed"),
        (("gloo", [2], 2, 3, 1, "float32", ("eager",)), "less than one float32 element"),
        (
            ("nccl", [1024], 16, 3, 1, "bfloat16", ("eager",)),
            "dtype='bfloat16' cannot hold the exact sums of 16 ranks",
        ),
        (
            ("gloo", [1024], 2, 3, 1, "float32", ("graph",)),
            "modes='graph' is not allowed for backend 'gloo'; allowed values: eager",
        ),
    ],
)
def test_validate_names_what_is_wrong(args, message):
    with pytest.raises(ValueError, match=message):
        allreduce_params.validate(*args)


def _machine(**kw) -> probe.Machine:
    return dataclasses.replace(probe.machine(), **kw)


def test_unavailable_backends_say_why():
    cpu = _machine(cuda_available=False, gpu_count=0, torch_cuda=None)
    assert allreduce_params.unavailable("gloo", 2, cpu) is None
    assert (
        allreduce_params.unavailable("nccl", 2, cpu)
        == "no CUDA GPU visible to torch (torch is a CPU build)"
    )


@pytest.mark.gpu
def test_nccl_says_how_many_gpus_it_lacks():
    """The GPU branches need a torch with NCCL: on a CPU build only the wording above is checked."""
    one = _machine(cuda_available=True, gpu_count=1)
    assert (
        allreduce_params.unavailable("nccl", 2, one) == "needs 2 or more GPUs; this machine has 1"
    )
    eight = _machine(cuda_available=True, gpu_count=8)
    assert allreduce_params.unavailable("mscclpp", 8, eight, python=sys.executable).startswith(
        "sglang's MSCCL++ communicator cannot be imported here"
    )


def test_sweep_refuses_bad_input_before_launching(tmp_path):
    log = tmp_path / "never.log"
    for kwargs, message in (
        ({"backend": "gloo", "sizes": "3KiB"}, "not a power of two"),
        ({"backend": "nvlink"}, "backend='nvlink' is not allowed"),
        ({"backend": "gloo", "nproc": 1}, "world size 1 is too small"),
        ({"backend": "gloo", "nproc": 0}, "nproc=0 must be a positive integer"),
    ):
        with pytest.raises(ValueError, match=message):
            allreduce_sweep.sweep(out=tmp_path / "x.jsonl", log_path=log, **kwargs)
    if not probe.machine().cuda_available:
        with pytest.raises(ValueError, match="backend='nccl' cannot run here: no CUDA GPU"):
            allreduce_sweep.sweep("nccl", out=tmp_path / "x.jsonl", log_path=log)
    assert not log.exists(), "nothing may launch for bad input"


def test_gloo_sweep_under_torchrun_checks_every_size(tmp_path):
    result = allreduce_sweep.sweep(
        "gloo",
        "1KiB:8KiB",
        out=tmp_path / "ar.jsonl",
        log_path=tmp_path / "ar.log",
        iters=3,
        warmup=1,
        timeout_s=120,
    )
    assert result.run.ok, result.run.message
    assert process.members(result.run.finished.pid) == []
    rows = result.rows
    assert [r["bytes"] for r in rows] == [1024, 2048, 4096, 8192]
    for r in rows:
        assert (r["status"], r["correct"], r["max_abs_err"], r["world_size"], r["mode"]) == (
            "ok",
            True,
            0.0,
            2,
            "eager",
        )
        assert r["elements"] == r["bytes"] // 4 and r["iters"] == 3
        assert r["p10_us"] <= r["median_us"] <= r["p90_us"]
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["median_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 (n-1) / n = 1 for two ranks
    assert all(rank.finished for rank in result.run.ranks)
    with pytest.raises(ValueError, match="already holds results"):
        allreduce_sweep.sweep(
            "gloo", "1KiB", out=tmp_path / "ar.jsonl", log_path=tmp_path / "again.log"
        )


def _faulty_run(tmp_path: Path, fault: str, timeout_s: float) -> tuple[torchrun.Run, list[dict]]:
    out = tmp_path / f"{fault}.jsonl"
    args = [
        "--module",
        "fp4lab.comm.allreduce",
        "--fault",
        fault,
        "--rank",
        "1",
        "--at",
        "4KiB",
        "--",
    ]
    args += allreduce_sweep.cli_args("gloo", "1KiB:16KiB", 2, 1, "float32", "auto", out)
    run = torchrun.run_ranks([str(FAULTY)], args, 2, timeout_s, tmp_path / f"{fault}.log")
    return run, torchrun.read_rows(out)


def test_a_hanging_rank_is_killed_and_named_and_finished_sizes_are_kept(tmp_path):
    run, rows = _faulty_run(tmp_path, "hang", timeout_s=20)
    assert run.finished.timed_out and not run.ok
    assert process.members(run.finished.pid) == [], "torchrun and its ranks must be gone"
    assert "killed after the timeout" in run.message
    assert "rank 1 (pid " in run.message and "hung at 'gloo eager 4KiB'" in run.message, run.message
    assert [r["size"] for r in rows] == ["1KiB", "2KiB"]


def test_a_crashing_rank_is_named_and_finished_sizes_are_kept(tmp_path):
    run, rows = _faulty_run(tmp_path, "crash", timeout_s=120)
    assert not run.finished.timed_out and run.finished.returncode not in (0, None)
    assert process.members(run.finished.pid) == []
    assert "torchrun saw rank 1 fail first" in run.message, run.message
    assert "injected crash on rank 1 at 4KiB" in run.finished.log_path.read_text()
    assert [r["size"] for r in rows] == ["1KiB", "2KiB"]


def test_the_module_refuses_to_run_outside_torchrun(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fp4lab.comm.allreduce", "--out", str(tmp_path / "x.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "not started by torchrun" in done.stderr


def test_the_module_under_torchrun_rejects_bad_sizes_on_every_rank(tmp_path):
    run = torchrun.run_ranks(
        ["-m", "fp4lab.comm.allreduce"],
        allreduce_sweep.cli_args("gloo", "3KiB", 1, 0, "float32", "auto", tmp_path / "x.jsonl"),
        2,
        60,
        tmp_path / "bad.log",
    )
    assert run.finished.returncode not in (0, None)
    assert "error: sizes contains '3KiB'" in run.finished.log_path.read_text()
    assert not (tmp_path / "x.jsonl").exists()


def test_torchrun_command_for_one_node_and_several():
    one = torchrun.torchrun_command(["-m", "fp4lab.comm.allreduce"], ["--iters", 3], 4)
    assert one[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=4",
        "--standalone",
        "--module",
        "fp4lab.comm.allreduce",
        "--iters",
        "3",
    ]
    two = torchrun.torchrun_command(
        ["bench.py"], [], 8, nnodes=2, node_rank=1, rdzv_endpoint="node0:29400"
    )
    assert two[4:] == [
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29400",
        "bench.py",
    ]
    with pytest.raises(ValueError, match="rdzv_endpoint is required when nnodes=2"):
        torchrun.torchrun_command(["bench.py"], [], 8, nnodes=2)


def test_blame_reads_torchruns_root_cause_block():
    log = """
[1]:
  time      : 2024-03-05_07:01:51
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 69812)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-03-05_07:01:51
  host      : node.internal
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 69811)
  error_file: <N/A>
"""
    assert torchrun.first_failure(log) == (3, -9)
    assert torchrun.first_failure("all good") is None


def test_crossover_finds_where_the_candidate_stops_winning():
    def rows(backend, times):
        return [
            {
                "backend": backend,
                "mode": "graph",
                "status": "ok",
                "bytes": 1024 << i,
                "median_us": t,
            }
            for i, t in enumerate(times)
        ]

    nccl = rows("nccl", [10, 10, 12, 20, 40])
    found = allreduce_sweep.crossover(rows("mscclpp", [5, 6, 11, 25, 60]), nccl, "graph")
    assert {
        "last_win_bytes": 4096,
        "crossover_bytes": 8192,
        "sizes_won": 3,
    }.items() <= found.items()
    assert found["summary"] == "faster up to 4KiB, not from 8KiB on"
    assert (
        allreduce_sweep.crossover(rows("mscclpp", [5, 5, 5, 5, 5]), nccl, "graph")[
            "crossover_bytes"
        ]
        is None
    )
    assert allreduce_sweep.crossover(rows("mscclpp", [50, 5, 5, 5, 5]), nccl, "graph")[
        "summary"
    ].startswith("not faster at the smallest")
    assert (
        allreduce_sweep.crossover(rows("mscclpp", [5]), nccl, "eager")["summary"]
        == "no size was measured by both"
    )
