"""fp4lab.serving: command lines, launch/readiness/teardown with real child processes, log names, bench drivers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from fp4lab.compile import trace
from fp4lab.core import probe, process, records, venvs
from fp4lab.serving import bench, cli, compare, config, logs, server, sglang_env, tiny_model

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "server_logs"


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A `python` whose `-m sglang.*` runs tests/fixtures/fake_sglang.py: a real server process and real clients."""
    launcher = tmp_path / "bin" / "python"
    launcher.parent.mkdir()
    launcher.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_sglang.py"}" "$@"\n'
    )
    launcher.chmod(0o755)
    monkeypatch.setenv("FAKE_SGLANG_WARMUP_S", "1")
    monkeypatch.setattr(process, "GRACE_S", 2.0)
    return str(launcher)


def make_config(python: str, **kw: object) -> config.ServerConfig:
    return config.ServerConfig(
        **{"model_path": "tiny-model", "port": server.free_port(), "python": python, **kw}
    )


def assert_group_gone(pgid: int) -> None:
    assert process.members(pgid) == [], f"processes of group {pgid} outlived the harness"


# ----------------------------------------------------------------------------- command lines


def spec(*options: tuple[str, ...] | str, choices: dict | None = None) -> cli.CliSpec:
    """A launch_server parser with these options (tuples are one option's spellings)."""
    choices = choices or {}
    return cli.CliSpec(
        "sglang.launch_server",
        "test",
        tuple(
            cli.Option(
                (o,) if isinstance(o, str) else o,
                (o if isinstance(o, str) else o[0]).lstrip("-").replace("-", "_"),
                not (o if isinstance(o, str) else o[0]).startswith(
                    ("--enable", "--disable", "--enforce")
                ),
                None,
                choices.get(o),
                "Deprecated. Use something else." if o == "--disable-cuda-graph" else "help",
            )
            for o in options
        ),
    )


BASE_OPTIONS = ("--model-path", "--tp-size", "--host", "--port", "--enable-mscclpp",
                "--enable-single-batch-overlap", "--mem-fraction-static")  # fmt: skip
GENERATIONS = {
    # 0.5.12: PCG on by default, all three flags
    "0.5.12": spec(*BASE_OPTIONS, "--enable-piecewise-cuda-graph", "--disable-piecewise-cuda-graph",
                   "--enforce-piecewise-cuda-graph"),
    # story era: off by default, an enable flag only
    "0.5.5": spec(*BASE_OPTIONS, "--enable-piecewise-cuda-graph"),
    # 0.5.21+: a prefill CUDA-graph backend with choices
    "0.5.21": spec(*BASE_OPTIONS, "--cuda-graph-backend-prefill", "--disable-cuda-graph",
                   choices={"--cuda-graph-backend-prefill": ("full", "breakable", "tc_piecewise", "disabled")}),
    # 0.5.23: tc_piecewise is no longer a choice
    "0.5.23": spec(*BASE_OPTIONS, "--cuda-graph-backend-prefill", "--cuda-graph-backend-decode",
                   choices={"--cuda-graph-backend-prefill": ("full", "breakable", "disabled")}),
}  # fmt: skip
PCG_FLAGS = {
    ("0.5.12", True): ["--enforce-piecewise-cuda-graph"],
    ("0.5.12", False): ["--disable-piecewise-cuda-graph"],
    ("0.5.5", True): ["--enable-piecewise-cuda-graph"],
    ("0.5.5", False): [],
    ("0.5.21", True): ["--cuda-graph-backend-prefill", "tc_piecewise"],
    ("0.5.21", False): ["--cuda-graph-backend-prefill", "disabled"],
    ("0.5.23", False): ["--cuda-graph-backend-prefill", "disabled"],
}


@pytest.mark.parametrize(
    ("pcg", "version", "mscclpp", "sbo"),
    list(itertools.product([None, True, False], GENERATIONS, [False, True], [False, True])),
)
def test_every_switch_combination_renders_the_exact_command_for_its_parser(
    pcg, version, mscclpp, sbo
):
    cfg = config.ServerConfig(
        "org/model",
        tp_size=4,
        port=31000,
        piecewise_cuda_graph=pcg,
        enable_mscclpp=mscclpp,
        enable_single_batch_overlap=sbo,
        extra_args=("--mem-fraction-static", "0.8"),
        python="python3",
        cli=GENERATIONS[version],
    )
    if (version, pcg) == ("0.5.23", True):
        with pytest.raises(
            cli.UnknownOption,
            match=r"no piecewise CUDA graph: --cuda-graph-backend-prefill takes full, breakable, "
            r"disabled; .*its cuda-graph options are: --cuda-graph-backend-prefill "
            r"\{full,breakable,disabled\}; --cuda-graph-backend-decode",
        ):
            cfg.command()
        return
    pcg_flag = [] if pcg is None else PCG_FLAGS[(version, pcg)]
    expected = ["python3", "-m", "sglang.launch_server", "--model-path", "org/model", "--tp-size", "4",
                "--host", "127.0.0.1", "--port", "31000", *pcg_flag, *(["--enable-mscclpp"] if mscclpp else []),
                *(["--enable-single-batch-overlap"] if sbo else []), "--mem-fraction-static", "0.8"]  # fmt: skip
    assert cfg.command() == expected
    cfg.check()  # the parser accepts every option it rendered
    assert cfg.as_record()["command"] == " ".join(expected[1:])


def test_an_option_the_installed_parser_lacks_is_refused_naming_its_topic():
    parser = GENERATIONS["0.5.21"]
    with pytest.raises(cli.UnknownOption) as caught:
        parser.check(["--enforce-piecewise-cuda-graph"])
    assert str(caught.value).startswith("this SGLang (test, sglang.launch_server) has no option "
                                        "--enforce-piecewise-cuda-graph; its cuda-graph options are: "
                                        "--cuda-graph-backend-prefill {full,breakable,tc_piecewise,disabled}; "
                                        "--disable-cuda-graph")  # fmt: skip
    with pytest.raises(
        cli.UnknownOption, match="takes one of full, breakable, tc_piecewise, disabled; not 'eager'"
    ):
        parser.check(["--cuda-graph-backend-prefill", "eager"])
    with pytest.raises(cli.UnknownOption, match="--enable-mscclpp takes no value"):
        parser.check(["--enable-mscclpp=1"])
    with pytest.raises(cli.UnknownOption, match="stray argument 'x'"):
        parser.check(["--enable-mscclpp", "x"])
    with pytest.raises(cli.UnknownOption, match="--port needs a value"):
        parser.check(["--port"])
    parser.check(["--port=3", "--cuda-graph-backend-prefill=full", "--enable-mscclpp"])
    assert [parser.status(f) for f in ("--port", "--disable-cuda-graph", "--enable-piecewise-cuda-graph")] == [
        "accepted", "deprecated", "rejected"]  # fmt: skip


def test_labels_name_the_switches_that_are_on():
    base = config.ServerConfig("m", python="python3")
    assert [c.label for c in compare.switch_matrix(base)] == [
        "baseline",
        "sbo",
        "mscclpp",
        "mscclpp+sbo",
    ]
    assert config.ServerConfig("m", piecewise_cuda_graph=False).label == "no-pcg"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_path": " "}, "model_path is empty"),
        ({"tp_size": 0}, "tp_size=0 must be a positive integer"),
        ({"port": 70000}, "port=70000 is not allowed"),
        ({"device": "tpu"}, "device='tpu' is not allowed"),
        ({"max_total_tokens": 0}, "max_total_tokens=0 must be a positive integer"),
        ({"extra_args": "--enable-mscclpp"}, "must be a sequence of strings"),
        (
            {"extra_args": ("--enable-mscclpp",)},
            "extra_args contains '--enable-mscclpp', which ServerConfig sets itself",
        ),
        ({"extra_args": ("--tp=2",)}, "extra_args contains '--tp=2'"),
        (
            {"extra_args": ("--cuda-graph-backend-prefill", "full")},
            "contains '--cuda-graph-backend-prefill'",
        ),
    ],
)
def test_bad_configurations_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.ServerConfig(**{"model_path": "m", **kwargs})


def test_a_model_folder_without_config_or_tokenizer_is_refused_before_launch(fake_python, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    log = tmp_path / "never.log"
    with (
        pytest.raises(
            ValueError, match=r"is a folder without config.json and a tokenizer \(tokenizer.json or"
        ),
        server.launch(make_config(fake_python, model_path=str(folder)), log, 60),
    ):
        pytest.fail("launched")
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is a folder without a tokenizer"):
        config.ServerConfig(str(folder), python=fake_python).check()
    (folder / "tokenizer.json").write_text("{}")
    config.ServerConfig(str(folder), python=fake_python).check()
    for missing in (str(tmp_path / "no-such-model"), "./gone", "~/gone", "a/b/c"):
        with pytest.raises(
            ValueError, match=rf"model_path='{missing}' is not a folder here; allowed"
        ):
            config.ServerConfig(missing, python=fake_python).check()
    config.ServerConfig("zai-org/GLM-5", python=fake_python).check()  # a hub id: not checked here
    assert not log.exists(), "nothing may start before the checks pass"
    with pytest.raises(ValueError, match="python is empty; allowed values: an SGLang environment"):
        config.ServerConfig("m").check()


def test_an_unknown_flag_is_refused_by_the_parser_before_anything_starts(fake_python, tmp_path):
    """The fake's parser, read through fp4lab's reader exactly as the real one is."""
    cfg = make_config(fake_python, extra_args=("--disable-cuda-graph",))
    log = tmp_path / "never.log"
    started = time.monotonic()
    with (
        pytest.raises(
            cli.UnknownOption,
            match=r"this SGLang \(fake, sglang.launch_server\) has no option "
            r"--disable-cuda-graph; its cuda-graph options are: --cuda-graph-backend-prefill",
        ),
        server.launch(cfg, log, 60),
    ):
        pytest.fail("launched")
    assert time.monotonic() - started < 30 and not log.exists()
    parser = cli.read_parser(fake_python, "sglang.launch_server")
    assert parser.sglang == "fake" and parser.find("--enable-mscclpp").takes_value is False


# ----------------------------------------------------------------------------- launch, readiness, teardown


def test_launch_waits_for_health_then_stops_the_whole_group(fake_python, tmp_path):
    cfg = make_config(
        fake_python,
        enable_mscclpp=True,
        enable_single_batch_overlap=True,
        piecewise_cuda_graph=False,
    )
    log = tmp_path / "server.log"
    with server.launch(cfg, log, ready_timeout_s=60, poll_s=0.2) as running:
        assert server.healthy(cfg.base_url + "/health_generate")
        assert running.ready_after_s >= 1.0, (
            "ready before the warm-up ended: the 503 phase was not waited out"
        )
        members = process.members(running.pid)
        assert running.pid in members and len(members) >= 2, (
            "the server's child should share its process group"
        )
        with server.urllib.request.urlopen(cfg.base_url + "/argv") as response:
            assert json.load(response) == running.config.command()[3:]
        argv = running.config.command()
        assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
        assert running.resolved()["enable_mscclpp"] is True, (
            "the server_args line the server logged"
        )
    assert_group_gone(running.pid)
    assert not server.healthy(cfg.base_url + "/health")
    assert "fake sglang.launch_server mode=serve" in log.read_text()


def test_a_server_that_never_becomes_ready_is_stopped_and_its_log_shown(
    fake_python, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_SGLANG_MODE", "hang")
    cfg = make_config(fake_python)
    started = time.monotonic()
    with (
        pytest.raises(server.ServerNotReady) as caught,
        server.launch(cfg, tmp_path / "hang.log", ready_timeout_s=2, poll_s=0.2),
    ):
        pytest.fail("the body must not run for a server that is not ready")
    assert time.monotonic() - started < 30
    assert "not ready at" in str(caught.value) and "after 2 s; stopped it" in str(caught.value)
    assert "fake sglang.launch_server mode=hang" in caught.value.log_tail
    assert_group_gone(caught.value.pid)


def test_a_crashing_server_raises_with_the_crash_named(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_MODE", "crash")
    monkeypatch.setenv("FAKE_SGLANG_CRASH_LOG", str(LOGS / "sglang_23386_pcg_nvcc_subprocess.log"))
    with (
        pytest.raises(server.ServerCrashed) as caught,
        server.launch(
            make_config(fake_python, piecewise_cuda_graph=True),
            tmp_path / "crash.log",
            ready_timeout_s=60,
            poll_s=0.2,
        ),
    ):
        pytest.fail("the body must not run for a crashed server")
    error = caught.value
    assert "exited with code 1 before it was ready" in str(error)
    assert [f.signature for f in error.findings] == ["subprocess", "piecewise_cuda_graph_banner"]
    assert "log shows: subprocess, piecewise_cuda_graph_banner" in str(error)
    assert_group_gone(error.pid)


def test_teardown_escalates_to_sigkill_for_a_server_ignoring_sigterm(
    fake_python, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_SGLANG_MODE", "stubborn")
    log = tmp_path / "stubborn.log"
    with server.launch(make_config(fake_python), log, ready_timeout_s=60, poll_s=0.2) as running:
        pass
    assert_group_gone(running.pid)
    assert "ignoring SIGTERM" in log.read_text()


def test_an_exception_in_the_body_stops_the_group(fake_python, tmp_path):
    with (
        pytest.raises(KeyboardInterrupt),
        server.launch(
            make_config(fake_python), tmp_path / "ctrl_c.log", ready_timeout_s=60, poll_s=0.2
        ) as running,
    ):
        raise KeyboardInterrupt  # what Ctrl-C raises in the harness
    assert_group_gone(running.pid)


def test_ctrl_c_from_outside_stops_the_group(fake_python, tmp_path):
    """A real SIGINT to the harness process while it waits with a running server."""
    script = tmp_path / "harness.py"
    script.write_text(
        # a harness started from a background job inherits SIGINT ignored: restore Ctrl-C's default
        "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from fp4lab.serving import config, server\n"
        f"cfg = config.ServerConfig('m', port=server.free_port(), python={fake_python!r})\n"
        f"with server.launch(cfg, {str(tmp_path / 'harness_server.log')!r}, 60, poll_s=0.2) as s:\n"
        "    print('PGID', s.pid, flush=True)\n    time.sleep(120)\n"
    )
    harness = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_SGLANG_WARMUP_S": "0"},
    )
    line = harness.stdout.readline()
    assert line.startswith("PGID"), line
    pgid = int(line.split()[1])
    assert process.members(pgid)
    harness.send_signal(signal.SIGINT)
    assert harness.wait(timeout=60) != 0
    assert_group_gone(pgid)


def test_sigterm_to_the_harness_stops_the_group(fake_python, tmp_path):
    script = tmp_path / "harness_term.py"
    script.write_text(
        "import time\nfrom fp4lab.serving import config, server\n"
        f"cfg = config.ServerConfig('m', port=server.free_port(), python={fake_python!r})\n"
        f"with server.launch(cfg, {str(tmp_path / 'term_server.log')!r}, 60, poll_s=0.2) as s:\n"
        "    print('PGID', s.pid, flush=True)\n    time.sleep(120)\n"
    )
    harness = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_SGLANG_WARMUP_S": "0"},
    )
    pgid = int(harness.stdout.readline().split()[1])
    harness.terminate()
    assert harness.wait(timeout=60) == 128 + signal.SIGTERM
    assert_group_gone(pgid)


def test_launch_refuses_a_busy_port_before_starting_anything(fake_python, tmp_path):
    cfg = make_config(fake_python)
    busy = f"port={cfg.port} on 127.0.0.1 is already in use"
    with (
        server.launch(cfg, tmp_path / "first.log", ready_timeout_s=60, poll_s=0.2),
        pytest.raises(ValueError, match=busy),
        server.launch(cfg, tmp_path / "second.log", ready_timeout_s=60),
    ):
        pass
    assert not (tmp_path / "second.log").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ready_timeout_s": 0}, "ready_timeout_s=0"),
        ({"health_path": "/ready"}, "health_path='/ready'"),
    ],
)
def test_launch_rejects_bad_arguments(kwargs, message, tmp_path):
    with (
        pytest.raises(ValueError, match=message),
        server.launch(
            config.ServerConfig("m"), tmp_path / "x.log", **{"ready_timeout_s": 10, **kwargs}
        ),
    ):
        pass


def test_the_process_group_helpers_never_leave_a_child(tmp_path):
    orphan = (
        "import subprocess,sys,time; "
        "subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); time.sleep(60)"
    )
    finished = process.run([sys.executable, "-c", orphan], tmp_path / "run.log", timeout_s=1.0)
    assert finished.timed_out and not finished.ok and "timed out after 1 s" in finished.describe()
    assert process.run(["sh", "-c", "echo hi; exit 3"], tmp_path / "rc.log", 10).returncode == 3
    assert process.tail(tmp_path / "rc.log") == "hi"
    with pytest.raises(ValueError, match="timeout_s=0"):
        process.run(["true"], tmp_path / "x.log", 0)


def test_group_survives_threads_without_installing_signal_handlers(tmp_path):
    """Off the main thread SIGTERM cannot be trapped; the group is still stopped on exit."""
    seen = {}

    def body() -> None:
        with process.group(
            [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "t.log"
        ) as proc:
            seen["pid"] = proc.pid

    worker = threading.Thread(target=body)
    worker.start()
    worker.join(timeout=30)
    assert_group_gone(seen["pid"])


# ----------------------------------------------------------------------------- logs


EXPECTED = {
    "sglang_23386_pcg_nvcc_subprocess.log": ["subprocess", "piecewise_cuda_graph_banner"],
    "sglang_10062_non_tensor_torch_op.log": ["non_tensor_torch_op"],
    "sglang_19573_logger_unsupported.log": ["unsupported_other"],
    "pytorch_167927_compiler_disable.log": ["compiler_disable_under_fullgraph"],
    "sglang_5285_cuda_graph_oom.log": ["cuda_out_of_memory"],
    "sglang_4289_nccl_error.log": ["nccl_error"],
    "sglang_27811_pcg_banner.log": ["piecewise_cuda_graph_banner"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_upstream_log_excerpts_are_named(name):
    text = (LOGS / name).read_text()
    assert text.startswith("# Quoted from https://github.com/")
    findings = logs.classify_log(text)
    assert [f.signature for f in findings] == EXPECTED[name]
    assert all(f.signature in logs.LOG_SIGNATURES for f in findings)


def test_the_story_log_names_the_nvcc_query_as_the_blocker():
    [dynamo, banner] = logs.classify_log(
        (LOGS / "sglang_23386_pcg_nvcc_subprocess.log").read_text()
    )
    assert dynamo.is_dynamo and dynamo.blocked_in == "flashinfer/jit/cpp_ext.py:73:get_cuda_version"
    assert not banner.is_dynamo and "enabled by default" in banner.evidence


def test_a_clean_log_shows_nothing():
    assert (
        logs.classify_log(
            "[2026-01-01 10:00:00] The server is fired up and ready to roll!\nINFO: 200 OK"
        )
        == []
    )


def _subprocess_call(x):
    subprocess.run(["true"], check=False)
    return x + 1


def _file_io(x):
    os.path.exists("/nonexistent")
    return x + 1


@torch.compiler.disable
def _disabled(x):
    return x * 2


def _calls_disabled(x):
    return _disabled(x + 1)


@pytest.mark.parametrize(
    ("fn", "signature"),
    [(_subprocess_call, "subprocess"), (_file_io, "file_io"),
     (_calls_disabled, "compiler_disable_under_fullgraph")],
)  # fmt: skip
def test_log_names_agree_with_fp4lab_trace_on_real_dynamo_errors(fn, signature):
    """The server-log classifier and fp4lab.compile.trace give the same name to the same dynamo failure."""
    import traceback

    x = torch.ones(4)
    torch._dynamo.reset()
    try:
        torch.compile(fn, fullgraph=True, backend="eager")(x)
    except torch._dynamo.exc.Unsupported as exc:
        log = "[TP0] Scheduler hit an exception: " + "".join(traceback.format_exception(exc))
    else:
        pytest.fail("dynamo traced a call it should refuse")
    assert trace.attempt(fn, x, fullgraph=True, backend="eager").signature == signature
    assert [f.signature for f in logs.classify_log(log)] == [signature]


# ----------------------------------------------------------------------------- benchmark clients


def test_bench_drivers_run_the_clients_and_record_their_rows(
    fake_python, tmp_path, isolated_outputs
):
    cfg = make_config(fake_python, enable_single_batch_overlap=True)
    with server.launch(
        cfg, tmp_path / "bench_server.log", ready_timeout_s=60, poll_s=0.2
    ) as running:
        out = tmp_path / "serving.jsonl"
        out.write_text(json.dumps({"output_throughput": 1.0, "note": "an earlier run"}) + "\n")
        rows = bench.bench_serving(
            running,
            out,
            num_prompts=8,
            input_len=32,
            output_len=16,
            max_concurrency=4,
            recorder=records.Recorder("nb", {"p": 1}),
        )
        one = bench.bench_one_batch(
            running,
            tmp_path / "one.jsonl",
            batch_sizes=(1, 4),
            input_len=32,
            output_len=8,
            recorder=records.Recorder("nb", {}),
        )
        cmd = bench.bench_serving_command(
            running,
            out,
            num_prompts=8,
            input_len=32,
            output_len=16,
            max_concurrency=4,
            dataset="random-ids",
            seed=1,
        )
    assert_group_gone(running.pid)
    assert (
        cmd[:3] == [fake_python, "-m", "sglang.bench_serving"]
        and cmd[cmd.index("--base-url") + 1] == cfg.base_url
    )
    assert len(rows) == 1, "only the row this run appended"
    assert (
        rows[0]["output_throughput"] == 8 * 16 / 2.0
        and rows[0]["completed"] == 8
        and rows[0]["max_concurrency"] == 4
    )
    assert set(rows[0]) <= set(bench.SERVING_METRICS)
    assert [r["batch_size"] for r in one] == [1, 4] and one[0]["run_name"] == "sbo"
    saved = records.read("nb")
    assert [r["kind"] for r in saved] == ["bench_serving", "bench_one_batch", "bench_one_batch"]
    assert saved[0]["values"]["enable_single_batch_overlap"] is True and saved[0]["params"] == {
        "p": 1
    }
    assert saved[0]["provenance"]["git"]["commit"]


def test_a_failing_client_raises_with_its_log(fake_python, tmp_path):
    cfg = make_config(fake_python)
    running = server.Server(
        cfg, pid=0, log_path=tmp_path / "none.log", ready_after_s=0.0
    )  # nothing listens: the client fails
    with pytest.raises(bench.BenchmarkError, match="exited with code 1"):
        bench.bench_serving(running, tmp_path / "s.jsonl", num_prompts=1, timeout_s=60)
    with pytest.raises(ValueError, match="num_prompts=0 must be a positive integer"):
        bench.bench_serving(running, tmp_path / "s.jsonl", num_prompts=0)
    with pytest.raises(ValueError, match="batch_sizes is empty"):
        bench.bench_one_batch(running, tmp_path / "o.jsonl", batch_sizes=())


def test_jsonl_loading_names_the_bad_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"output_throughput": 1}\n{"median_ttft_ms": 2}\n')
    with pytest.raises(bench.BenchmarkError, match=r"bad.jsonl:2 lacks output_throughput"):
        bench.load_jsonl(bad, ("output_throughput",), bench.SERVING_METRICS)
    bad.write_text("not json\n")
    with pytest.raises(bench.BenchmarkError, match=r"bad.jsonl:1 is not JSON"):
        bench.load_jsonl(bad, ("output_throughput",), bench.SERVING_METRICS)


def test_compare_keeps_failed_and_rejected_runs_named_and_goes_on(
    fake_python, tmp_path, monkeypatch, isolated_outputs
):
    """A crash, a server that never becomes ready and an option the parser lacks: each is
    recorded with its reason (and its log's tail), and the run after them still happens."""
    monkeypatch.setenv("FAKE_SGLANG_CRASH_LOG", str(LOGS / "sglang_5285_cuda_graph_oom.log"))
    configs = [
        make_config(fake_python, model_path="m@crash", enable_mscclpp=True),
        make_config(fake_python, model_path="m@hang", enable_single_batch_overlap=True),
        make_config(fake_python, extra_args=("--enable-two-batch-overlap",)),
        make_config(fake_python, enable_mscclpp=True, enable_single_batch_overlap=True),
    ]
    crashed, hung, rejected, ran = compare.compare(
        configs, tmp_path, ready_timeout_s=3, num_prompts=2, input_len=4, output_len=2
    )
    assert (crashed.status, crashed.findings, crashed.rows) == (
        "failed",
        ["cuda_out_of_memory"],
        [],
    )
    assert "mscclpp server exited with code 1" in crashed.reason
    assert "CUDA out of memory" in crashed.log_tail and crashed.as_record()["log_tail"]
    assert hung.status == "failed" and "not ready" in hung.reason
    assert "fake sglang.launch_server mode=hang" in hung.log_tail
    assert (
        rejected.status == "rejected"
        and "has no option --enable-two-batch-overlap" in rejected.reason
    )
    assert ran.status == "ran" and ran.rows[0]["completed"] == 2
    assert ran.options == {
        "--enable-mscclpp": "accepted",
        "--enable-single-batch-overlap": "accepted",
    }
    assert (
        ran.mscclpp
        == "fell back to nccl: SGLang logged no MSCCL++ communicator (it creates none for one rank: tp_size=1)"
    )
    assert ran.shown_as == "mscclpp+sbo (fell back to nccl)"
    table = bench.serving_table([o.as_record() for o in (crashed, ran) if o.status == "ran"])
    assert list(table.index) == ["mscclpp+sbo (fell back to nccl)"]


RESOLVED_DICT = (
    "[2026-11-29 18:55:19] server_args={'model_path': 'm', 'tp_size': 4, 'device': 'cuda', "
    "'enable_mscclpp': True, 'cuda_graph_config': {'decode': {'backend': 'full'}, "
    "'prefill': {'backend': 'disabled'}}}"
)
RESOLVED_REPR = (
    "[2026-01-01 10:00:00] server_args=ServerArgs(model_path='m', tp_size=8, enable_mscclpp=True, "
    "disable_cuda_graph=False, mem_fraction_static=0.8, device='cuda')"
)
NO_PACKAGE = (
    "PyMscclpp is unavailable because its dependencies failed to import: No module named 'mscclpp'"
)
WORLD_SIZE = (
    "PyMscclpp is disabled due to an unsupported world size: 2. Supported world sizes: (4, 8)."
)
CREATED = "Created MSCCL++ communicator: group=tp world_size=8 device=cuda:0 allreduce_configs=3"
NO_GRAPH = (
    "SGLang uses MSCCL++ only inside CUDA-graph capture and this server captures no CUDA graph"
)


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (RESOLVED_DICT.replace("'enable_mscclpp': True", "'enable_mscclpp': False"),
         (False, "fell back to nccl: SGLang resolved enable_mscclpp to False")),
        (RESOLVED_DICT + "\n[x] " + NO_PACKAGE, (False, "fell back to nccl: " + NO_PACKAGE)),
        (RESOLVED_DICT + "\n[x] " + WORLD_SIZE, (False, "fell back to nccl: " + WORLD_SIZE)),
        (RESOLVED_DICT, (False, "fell back to nccl: SGLang logged no MSCCL++ communicator")),
        (RESOLVED_DICT.replace("'cuda'", "'cpu'") + "\n[x] " + CREATED, (False, "fell back to nccl: " + NO_GRAPH)),
        (RESOLVED_REPR + "\n[x] " + CREATED, (True, CREATED)),
    ],
)  # fmt: skip
def test_mscclpp_outcome_needs_sglangs_own_proof(log, expected):
    assert logs.mscclpp_outcome(log) == expected


def test_resolved_args_read_both_forms_sglang_logs():
    assert (
        logs.resolved_args(RESOLVED_DICT)["cuda_graph_config"]["prefill"]["backend"] == "disabled"
    )
    assert logs.resolved_args(RESOLVED_REPR) == {
        "model_path": "m", "tp_size": 8, "enable_mscclpp": True, "disable_cuda_graph": False,
        "mem_fraction_static": 0.8, "device": "cuda",
    }  # fmt: skip
    assert logs.resolved_args("no such line") == {}
    assert compare.option_outcomes(GENERATIONS["0.5.21"], ["--enable-mscclpp", "--enable-single-batch-overlap",
                                   "--enforce-piecewise-cuda-graph"], logs.resolved_args(RESOLVED_DICT)) == {
        "--enable-mscclpp": "accepted",
        "--enable-single-batch-overlap": "ignored: SGLang resolved enable_single_batch_overlap=None",
        "--enforce-piecewise-cuda-graph": "rejected",
    }  # fmt: skip


# ----------------------------------------------------------------------------- the tiny model


def test_make_tiny_model_saves_a_model_and_tokenizer_that_load_offline(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tiny_model.make_tiny_model(
        tmp_path / "tiny", hidden=128, heads=2, kv_heads=1, intermediate=256, vocab=400
    )
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()
    }
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = "MSCCLPP overlaps 42 tokens, résumé."
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text, "byte-level BPE must round-trip any text"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "llama" and model.config.head_dim == 64
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    assert out.shape == (1, len(ids) + 4)
    assert (
        model.config.vocab_size == len(tokenizer) and model.config.max_position_embeddings == 4096
    )


def test_make_tiny_model_refuses_bad_shapes(tmp_path):
    with pytest.raises(ValueError, match="layers=0 must be a positive integer"):
        tiny_model.make_tiny_model(tmp_path, layers=0)
    with pytest.raises(ValueError, match="heads must divide hidden"):
        tiny_model.make_tiny_model(tmp_path, hidden=100, heads=8)


# ----------------------------------------------------------------------------- notebook 08's serving section

SETTINGS = dict(model_path="", tp_size=0, server_extra_args=[], num_prompts=4, input_len=8,
                output_len=4, ready_timeout_s=60)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_path": "/no/such/folder"}, "model_path='/no/such/folder' is not allowed; allowed values: \"\""),
        ({"model_path": 3}, "model_path=3 is not allowed"),
        ({"tp_size": -1}, "tp_size=-1 is not allowed; allowed values: 0 (every GPU)"),
        ({"server_extra_args": "--x"}, "server_extra_args='--x' must be a sequence of strings"),
        ({"server_extra_args": ["--tp-size", "2"]}, "server_extra_args contains '--tp-size'"),
        ({"ready_timeout_s": 0}, "ready_timeout_s=0 must be a positive integer"),
    ],
)  # fmt: skip
def test_serving_settings_name_the_bad_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compare.serving_settings(**{**SETTINGS, **kwargs})


def test_model_path_is_empty_a_folder_or_a_hub_id(tmp_path):
    for allowed in ("", str(tmp_path), "zai-org/GLM-4.5-Air", "gpt2"):
        assert compare.serving_settings(**{**SETTINGS, "model_path": allowed}).model_path == allowed


def test_switch_comparison_without_gpus_is_recorded_as_skipped(tmp_path, isolated_outputs):
    machine = dataclasses.replace(probe.machine(), gpu_count=0, cuda_available=False, sm=None)
    settings = compare.serving_settings(**SETTINGS)
    result = compare.switch_comparison(settings, records.Recorder("nb", {}), tmp_path, machine)
    assert result.skip == "needs 2 or more GPUs; this machine has 0" and result.rows == []
    assert [r["values"] for r in records.read("nb")] == [
        {"status": "skipped", "reason": result.skip}
    ]
    assert result.table().empty


def test_switch_comparison_records_an_environment_that_cannot_be_built(
    tmp_path, isolated_outputs, monkeypatch
):
    machine = dataclasses.replace(probe.machine(), gpu_count=8, cuda_available=True, sm=(10, 0))
    monkeypatch.setattr(compare, "unavailable", lambda m: None)
    failed = sglang_env.SGLangEnv(
        "0.5.21", venvs.Environment(tmp_path, "failed", error="pip install failed: no network"),
        error="pip install failed: no network",
    )  # fmt: skip
    monkeypatch.setattr(compare, "ensure_sglang", lambda: failed)
    result = compare.switch_comparison(
        compare.serving_settings(**SETTINGS), records.Recorder("nb", {}), tmp_path, machine
    )
    assert (
        result.skip
        == "the SGLang 0.5.21 environment could not be built: pip install failed: no network"
    )
