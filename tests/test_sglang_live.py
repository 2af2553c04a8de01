"""The real SGLang: its CPU server end to end, and the contract the fault-injecting fake keeps.

The environment is fp4lab.serving.sglang_env's (built on first use, reused after); nothing is
downloaded at test time but the packages themselves, and no GPU is needed.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from browser import environment_lines, exported
from fp4lab.comm.allreduce import mscclpp_api
from fp4lab.comm.allreduce import params as allreduce_params
from fp4lab.core import paths, probe, process
from fp4lab.serving import bench, cli, config, live, logs, sglang_env

pytestmark = [pytest.mark.serving, pytest.mark.environments]
FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import fake_sglang  # noqa: E402

MODULES = ("sglang.launch_server", "sglang.bench_serving", "sglang.bench_one_batch_server")


@pytest.fixture(scope="module")
def env() -> sglang_env.SGLangEnv:
    built = sglang_env.ensure_sglang()
    assert built.ok, f"the SGLang environment could not be built: {built.error}"
    return built


@pytest.fixture(scope="module")
def site(env: sglang_env.SGLangEnv) -> Path:
    from fp4lab.serving.standins import site_packages

    return site_packages(env.python) / "sglang"


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    launcher = tmp_path / "bin" / "python"
    launcher.parent.mkdir()
    launcher.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_sglang.py"}" "$@"\n'
    )
    launcher.chmod(0o755)
    return str(launcher)


@pytest.mark.parametrize("module", MODULES)
def test_the_fake_accepts_only_options_the_real_parsers_have(env, fake_python, module):
    real = cli.read_parser(env.python, module)
    fake = cli.read_parser(fake_python, module)
    assert real.sglang == env.version and fake.sglang == "fake"
    for option in fake.options:
        for spelling in option.options:
            theirs = real.find(spelling)
            assert theirs is not None, f"the fake's {module} accepts {spelling}; SGLang's does not"
            assert theirs.takes_value == option.takes_value, spelling
            if theirs.choices:  # the fake may refuse more than SGLang, never accept more
                assert option.choices and set(option.choices) <= set(theirs.choices), spelling


def test_the_real_parser_refuses_the_removed_pcg_flags_before_launch(env, tmp_path):
    real = cli.read_parser(env.python, "sglang.launch_server")
    for flag in ("--enforce-piecewise-cuda-graph", "--disable-piecewise-cuda-graph",
                 "--enable-piecewise-cuda-graph"):  # fmt: skip
        with pytest.raises(cli.UnknownOption) as caught:
            real.check([flag])
        message = str(caught.value)
        assert message.startswith(
            f"this SGLang ({env.version}, sglang.launch_server) has no option {flag}"
        )
        assert "--cuda-graph-backend-prefill {" in message
    on = config.ServerConfig("m", python=env.python, piecewise_cuda_graph=True, cli=real)
    off = dataclasses.replace(on, piecewise_cuda_graph=False)
    assert on.switch_args() == ["--cuda-graph-backend-prefill", "tc_piecewise"]
    assert off.switch_args() == ["--cuda-graph-backend-prefill", "disabled"]
    on.check()
    bench_parser = cli.read_parser(env.python, "sglang.bench_one_batch_server")
    assert bench.OFFLINE_DATASET in bench_parser.find("--dataset-name").choices


def test_the_log_lines_fp4lab_reads_are_the_ones_sglang_logs(site):
    """Each pattern must match what the installed source would print (format fields filled in)."""
    pymscclpp = (site / "srt/distributed/device_communicators/pymscclpp.py").read_text()

    def printed(fragment: str, source: str) -> str:
        found = re.search(r'"(' + re.escape(fragment) + r'[^"]*)"(?:\s*"([^"]*)")*', source)
        assert found, f"SGLang no longer logs {fragment!r}"
        return (
            found.group(0).replace('"', "").replace("\n", "").replace("%s", "x").replace("%d", "4")
        )

    for fragment in ("PyMscclpp is unavailable because", "PyMscclpp is disabled due to an unsupported world",
                     "PyMscclpp did not produce any usable"):  # fmt: skip
        assert logs.MSCCLPP_DISABLED.search(printed(fragment, pymscclpp))
    assert logs.MSCCLPP_CREATED.search(printed("Created MSCCL++ communicator", pymscclpp))
    engine = (site / "srt/entrypoints/engine.py").read_text()
    assert 'logger.info(f"server_args={server_args.resolved_dict()}")' in engine
    banner = dict(logs._PATTERNS)["piecewise_cuda_graph_banner"]
    sources = "\n".join(p.read_text() for p in (site / "srt/arg_groups").glob("*.py"))
    assert banner.search(sources), "no PCG banner fp4lab matches is logged by this SGLang"


def test_mscclpp_is_checked_against_the_installed_api_up_front(env, monkeypatch):
    api = allreduce_params.read_mscclpp_api(env.python)
    assert api == {
        "importable": True, "world_sizes": [4, 8, 16, 32, 64], "world_sizes_from": "pymscclpp._SUPPORTED_WORLD_SIZES",
        "set_mscclpp": "set_mscclpp", "tp_keyword": False, "topology_helper": "publish_build_topology",
        "best_configs": "_best_configs", "mscclpp_importable": False,
    }  # fmt: skip
    gpus = dataclasses.replace(probe.machine(), cuda_available=True, gpu_count=8)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    two = allreduce_params.unavailable("mscclpp", 2, gpus, sglang_python=lambda: env.python)
    assert two == "SGLang's MSCCL++ communicator supports world sizes 4, 8, 16, 32, 64, not 2"
    four = allreduce_params.unavailable("mscclpp", 4, gpus, sglang_python=lambda: env.python)
    assert four == mscclpp_api.MSCCLPP_NOT_ON_REGISTRY and "not on the package registry" in four
    # an interpreter without SGLang: a reason, never an exception (notebook 07 skips, not crashes)
    assert allreduce_params.unavailable("mscclpp", 4, gpus).startswith(
        "sglang's MSCCL++ communicator cannot be imported here"
    )

    def unbuildable() -> str:
        raise RuntimeError("the SGLang 0.0 environment could not be built: no such release")

    assert allreduce_params.unavailable("mscclpp", 4, gpus, sglang_python=unbuildable) == (
        "no SGLang interpreter for MSCCL++: the SGLang 0.0 environment could not be built: "
        "no such release"
    )


@pytest.mark.notebook
@pytest.mark.browser
def test_13_serves_on_this_cpu_records_a_serving_verdict_and_leaves_nothing(env, run_notebook):
    """The real SGLang server end to end through notebook 13 (one server start for the suite):
    requests, SGLang's own benchmark clients, teardown of every process, the fake's contract;
    the exported page fits the window and shows the environment (reused: the ``env`` fixture
    built it) in one line, no install lines."""
    rows, executed = run_notebook("13_sglang_cpu_server", num_prompts=4, input_len=16, output_len=8)
    by_kind: dict[str, list[dict]] = {}
    for r in rows:
        assert r["provenance"]["git"]["commit"]
        by_kind.setdefault(r["kind"], []).append(r["values"])
    [server] = by_kind["server"]
    assert 1 < server["ready_after_s"] < 600
    assert len(server["pids"]) >= 3, "SGLang starts a scheduler and a detokenizer beside the server"
    assert server["left_behind"] == [] and process.members(server["pids"][0]) == []
    assert server["resolved"] == {"device": "cpu", "max_total_tokens": live.MAX_TOTAL_TOKENS}
    generated, completed = by_kind["request"]
    assert generated["text"] and generated["completion_tokens"] == 8 and generated["seconds"] > 0
    assert completed["text"] and completed["completion_tokens"] == 8
    [serving] = by_kind["bench_serving"]
    assert serving["completed"] == 4 and serving["output_throughput"] > 0
    assert serving["median_ttft_ms"] > 0 and serving["median_itl_ms"] > 0
    [one_batch] = by_kind["bench_one_batch"]
    assert one_batch["batch_size"] == 1 and one_batch["latency"] > 0
    for v in (serving, one_batch, generated, completed):
        assert v["evidence"] == ["serving"] and v["ready_after_s"] == server["ready_after_s"]
    assert generated["sglang_version"] == serving["sglang_version"] == env.version
    assert {s["name"] for s in generated["standins"]} <= {
        *(s.name for s in sglang_env.standins.STANDINS),
        sglang_env.standins.BINARIES_REMOVED,
    }
    # the fake's rows may only hold fields the real clients wrote
    written = server["written_fields"]
    assert set(fake_sglang.SERVING_ROW_FIELDS) <= set(written["bench_serving"])
    fake_one_batch = {"run_name", "batch_size", "input_len", "output_len", "latency", "input_throughput",
                      "output_throughput", "overall_throughput", "last_ttft", "last_gen_throughput",
                      "acc_length", "cache_hit_rate"}  # fmt: skip
    assert fake_one_batch <= set(written["bench_one_batch"])
    assert set(bench.ONE_BATCH_METRICS) <= set(written["bench_one_batch"])
    [summary] = by_kind["summary"]
    assert (summary["verdict"], summary["evidence"]) == ("WORKS", ["serving"])
    assert summary["number"].startswith(f"{serving['output_throughput']:.1f} output tok/s")
    assert "processes left behind: 0" in summary["headline"]
    assert "bench_serving" in executed.read_text()
    page = exported(executed)
    said = environment_lines(page, paths.shown(env.environment.path))
    assert said == ["reused"], "one line for the environment the env fixture built"
