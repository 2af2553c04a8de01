"""A real SGLang server on this machine's CPU: the tiny local model served by the installed
``sglang.launch_server --device cpu`` on 127.0.0.1, for notebook 13, the test suite and the CPU
benchmark.

``serve_tiny_on_cpu`` builds or reuses the SGLang environment, makes the tiny model (random
weights, a tokenizer trained here, nothing downloaded), launches the server with a bounded KV
cache, yields it and stops its whole process group; ``smoke`` drives it end to end and lists
any process that outlived it. ``plan``, ``measure`` and ``verdict`` are notebook 13.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fp4lab.core import evidence, params, paths, process, records
from fp4lab.serving import bench, client
from fp4lab.serving.config import ServerConfig
from fp4lab.serving.server import Server, free_port, launch
from fp4lab.serving.sglang_env import SGLANG_VERSION, SGLangEnv, ensure_sglang
from fp4lab.serving.tiny_model import make_tiny_model

MAX_TOTAL_TOKENS = 4096
"""The KV cache the CPU server reserves, in tokens (SGLang would otherwise reserve gigabytes)."""


class EnvironmentUnavailable(RuntimeError):
    """The SGLang environment could not be built; the message says why."""


@dataclass
class LiveServer:
    """A running CPU server with the environment it runs from and the model it serves."""

    env: SGLangEnv
    server: Server
    model: Path


def tiny_model(folder: Path) -> Path:
    """The tiny model under ``folder``, made once (its config is written last)."""
    model = Path(folder) / "tiny_model"
    if not (model / "config.json").exists():
        make_tiny_model(model)
    return model


@contextlib.contextmanager
def serve_tiny_on_cpu(
    folder: Path,
    *,
    version: str = SGLANG_VERSION,
    ready_timeout_s: float = 600.0,
    max_total_tokens: int = MAX_TOTAL_TOKENS,
) -> Iterator[LiveServer]:
    """The tiny model served on CPU by the real SGLang ``version``; stopped, group and all, on exit."""
    env = ensure_sglang(version)
    if not env.ok:
        raise EnvironmentUnavailable(f"the SGLang {version} environment: {env.error}")
    model = tiny_model(folder)
    config = ServerConfig(
        str(model),
        port=free_port(),
        python=env.python,
        device="cpu",
        max_total_tokens=max_total_tokens,
    )
    with launch(config, Path(folder) / "server_cpu.log", ready_timeout_s) as server:
        yield LiveServer(env, server, model)


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (after a server's teardown: none)."""
    running = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X"):
            running.append(pid)
    return running


@dataclass
class Smoke:
    """What one run against the CPU server gave: readiness, single requests, benchmark rows,
    the fields SGLang's clients wrote, the server's processes and any that outlived it."""

    env: dict
    ready_after_s: float
    requests: list[dict]
    serving: list[dict]
    one_batch: list[dict]
    written_fields: dict[str, list[str]] = field(default_factory=dict)
    resolved: dict = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    left_behind: list[int] = field(default_factory=list)


def _fields(path: Path) -> list[str]:
    return sorted(json.loads(path.read_text().splitlines()[-1]))


def smoke(
    folder: Path,
    *,
    version: str = SGLANG_VERSION,
    num_prompts: int = 4,
    input_len: int = 16,
    output_len: int = 8,
    recorder: records.Recorder | None = None,
) -> Smoke:
    """Serve the tiny model on CPU, send /generate and /v1/completions, run bench_serving and
    bench_one_batch_server on random token ids, stop the server, and list what outlived it.

    With a ``recorder``: one "request" record per request, the benchmarks' own records, all
    carrying the environment (version, stand-ins, size) and the seconds to ready."""
    folder = Path(folder)
    with serve_tiny_on_cpu(folder, version=version) as running:
        server = running.server
        pids = [server.pid, *process.descendants(server.pid)]
        requests = [
            client.generate(server, "The quick brown fox", max_new_tokens=output_len),
            client.complete(server, "Piecewise CUDA graphs", max_tokens=output_len),
        ]
        serving = bench.bench_serving(
            server, folder / "bench_serving.jsonl", num_prompts=num_prompts, input_len=input_len,
            output_len=output_len, max_concurrency=2, recorder=recorder, timeout_s=600,
        )  # fmt: skip
        one_batch = bench.bench_one_batch(
            server, folder / "bench_one_batch.jsonl", batch_sizes=(1,), input_len=input_len,
            output_len=output_len, recorder=recorder, timeout_s=600,
        )  # fmt: skip
        resolved = server.resolved()
    env = running.env.as_record()
    result = Smoke(
        env, server.ready_after_s, requests, serving, one_batch,
        {"bench_serving": _fields(folder / "bench_serving.jsonl"),
         "bench_one_batch": _fields(folder / "bench_one_batch.jsonl")},
        resolved, pids, alive(pids),
    )  # fmt: skip
    if recorder:
        common = {**server.config.as_record(), **env, "ready_after_s": server.ready_after_s}
        recorder.add_all("request", [{**common, **r, "evidence": ["serving"]} for r in requests])
    return result


@dataclass(frozen=True)
class Plan:
    """Notebook 13's checked parameters and the folder its server and clients write to."""

    num_prompts: int
    input_len: int
    output_len: int
    params: dict
    folder: Path


def plan(*, num_prompts: int, input_len: int, output_len: int) -> Plan:
    """Check every parameter (ValueError naming it and its allowed values)."""
    for name, value in (
        ("num_prompts", num_prompts),
        ("input_len", input_len),
        ("output_len", output_len),
    ):
        params.positive(name, value)
    chosen = {"num_prompts": num_prompts, "input_len": input_len, "output_len": output_len}
    return Plan(
        num_prompts, input_len, output_len, chosen, paths.build_dir() / "live" / records.RUN_ID
    )


def measure(plan: Plan, rec: records.Recorder) -> Smoke | None:
    """Serve the tiny model on this CPU and run the clients (``smoke``), recorded with evidence
    "serving", then one "server" record: its processes, any left behind, the fields SGLang's
    clients wrote, the arguments it resolved; None, recorded as skipped with the reason, when the
    environment cannot be built."""
    print(f"SGLang {SGLANG_VERSION}: building or reusing its environment, then serving ...")
    try:
        result = smoke(
            plan.folder, num_prompts=plan.num_prompts, input_len=plan.input_len,
            output_len=plan.output_len, recorder=rec,
        )  # fmt: skip
    except EnvironmentUnavailable as exc:
        rec.skip("cpu_server", str(exc))
        return None
    rec.add("server", {
        "ready_after_s": result.ready_after_s, "pids": result.pids, "left_behind": result.left_behind,
        "written_fields": result.written_fields,
        "resolved": {k: result.resolved.get(k) for k in ("device", "max_total_tokens")},
    })  # fmt: skip
    return result


def table(result: Smoke | None) -> pd.DataFrame:
    """bench_serving's and bench_one_batch_server's numbers: one row per client and metric."""
    rows = [
        ("bench_serving", metric, r[key])
        for r in result.serving
        for metric, key in (("prompts completed", "completed"), ("output tok/s", "output_throughput"),
                            ("median TTFT ms", "median_ttft_ms"), ("median ITL ms", "median_itl_ms"))
    ] + [
        (f"bench_one_batch_server (batch {r['batch_size']})", "latency s", r["latency"])
        for r in result.one_batch
    ] if result else []  # fmt: skip
    return pd.DataFrame(rows, columns=["client", "metric", "value"]).round(2)


def verdict(plan: Plan, result: Smoke | None, rec: records.Recorder) -> str:
    """Record the summary, then check every prompt completed, every request returned text and no
    process outlived the server (AssertionError otherwise)."""
    if result is None:
        reason = rec.written[-1]["values"]["reason"]
        rec.summary(
            f"not measured: {reason}", verdict="UNMEASURED", number="no server ran",
            why=reason, needs="cpu and the package registry (the SGLang environment)",
        )  # fmt: skip
        return f"SKIPPED: {reason}"
    row = result.serving[0]
    served = all(r["text"] for r in result.requests) and row["completed"] == plan.num_prompts
    ok = served and not result.left_behind
    number = (
        f"{row['output_throughput']:.1f} output tok/s, median TTFT {row['median_ttft_ms']:.0f} ms "
        f"({plan.num_prompts} prompts of {plan.input_len} in / {plan.output_len} out)"
    )
    rec.summary(
        f"SGLang {result.env['sglang_version']} on this CPU, ready after "
        f"{result.ready_after_s:.0f} s: {number}; one batch of 1: "
        f"{result.one_batch[0]['latency']:.2f} s; processes left behind: "
        f"{len(result.left_behind)}",
        verdict="WORKS" if ok else "FAILED",
        number=number
        if ok
        else f"{row['completed']}/{plan.num_prompts} completed, "
        f"{len(result.left_behind)} processes left behind",
        why=f"the real SGLang {result.env['sglang_version']} server answered SGLang's own "
        "benchmark clients on this CPU; a tiny random model measures the serving harness, not "
        "GLM-5 or any optimization",
        needs="cpu",
    )
    evidence.guard(served, f"{row['completed']} of {plan.num_prompts} prompts completed")
    evidence.guard(not result.left_behind, f"processes outlived the server: {result.left_behind}")
    return rec.written[-1]["values"]["headline"]
