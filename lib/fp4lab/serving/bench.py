"""SGLang's two benchmark clients against a running server, and their results as a table.

``bench_serving`` and ``bench_one_batch`` run ``sglang.bench_serving`` and
``sglang.bench_one_batch_server`` with the server's own SGLang interpreter against a
``fp4lab.serving.server.Server``, after checking their command lines against the clients' own
parsers (``fp4lab.serving.cli``), and load the JSON lines they append; with a recorder, each
row is recorded beside the server's configuration. Both use ``random-ids`` prompts (random
token ids): the clients' ``random`` default samples ShareGPT, which is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from fp4lab.core import params, process, records
from fp4lab.serving.cli import read_parser
from fp4lab.serving.server import Server, server_environment

OFFLINE_DATASET = "random-ids"
"""The clients' dataset that needs no download (random token ids of fixed lengths)."""

SERVING_METRICS = (
    "completed", "duration", "request_throughput", "input_throughput", "output_throughput",
    "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "concurrency", "max_concurrency", "request_rate",
)  # fmt: skip
"""bench_serving's per-run fields kept in records (those a release writes; output_throughput is required)."""

ONE_BATCH_METRICS = (
    "run_name", "batch_size", "input_len", "output_len", "latency", "input_throughput", "output_throughput",
    "overall_throughput", "last_ttft", "last_gen_throughput",
)  # fmt: skip
"""bench_one_batch_server's per-case fields kept in records (batch_size, latency, output_throughput required)."""


class BenchmarkError(RuntimeError):
    """A benchmark client failed, timed out, or wrote no result."""


def load_jsonl(path: Path, required: Sequence[str], keep: Sequence[str]) -> list[dict]:
    """The rows of a benchmark's JSON lines file, each reduced to ``keep``; every row must hold ``required``."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchmarkError(f"{path}:{number} is not JSON: {exc}") from None
        missing = [k for k in required if k not in row]
        if missing:
            raise BenchmarkError(
                f"{path}:{number} lacks {', '.join(missing)}; fields present: {', '.join(sorted(row))}"
            )
        rows.append({k: row[k] for k in keep if k in row})
    return rows


def _run_client(
    server: Server,
    cmd: list[str],
    out: Path,
    log_path: Path,
    timeout_s: float,
    required: Sequence[str],
    keep: Sequence[str],
) -> list[dict]:
    out = Path(out)
    read_parser(cmd[0], cmd[2]).check(cmd[3:])
    before = len(load_jsonl(out, required, keep)) if out.exists() else 0
    finished = process.run(cmd, log_path, timeout_s, env=server_environment(server.config))
    if not finished.ok:
        raise BenchmarkError(f"{finished.describe()}\n{process.tail(log_path)}")
    rows = load_jsonl(out, required, keep)[before:] if out.exists() else []
    if not rows:
        raise BenchmarkError(
            f"{cmd[2]} finished but appended no result to {out}\n{process.tail(log_path)}"
        )
    return rows


def _record(rows: list[dict], server: Server, kind: str, recorder: records.Recorder | None) -> None:
    """One record of ``kind`` per row, with the server's configuration beside its numbers."""
    if recorder:
        extra = {"ready_after_s": server.ready_after_s, "evidence": ["serving"]}
        recorder.add_all(kind, [{**server.config.as_record(), **extra, **row} for row in rows])


def bench_serving_command(
    server: Server,
    out: Path,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    max_concurrency: int | None,
    dataset: str,
    seed: int,
) -> list[str]:
    """``python -m sglang.bench_serving`` against ``server`` with fixed-length random prompts,
    results appended to ``out``."""
    model = str(server.config.model_path)
    cmd = [
        server.config.python, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.base_url,
        "--model", model, "--tokenizer", model, "--dataset-name", dataset, "--num-prompts", str(num_prompts),
        "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--random-range-ratio", "1.0",
        "--seed", str(seed), "--output-file", str(out),
    ]  # fmt: skip
    return cmd + (["--max-concurrency", str(max_concurrency)] if max_concurrency else [])


def bench_serving(
    server: Server,
    out: Path,
    *,
    num_prompts: int = 64,
    input_len: int = 256,
    output_len: int = 64,
    max_concurrency: int | None = None,
    dataset: str = OFFLINE_DATASET,
    seed: int = 1,
    timeout_s: float = 900.0,
    log_path: Path | None = None,
    recorder: records.Recorder | None = None,
) -> list[dict]:
    """Run bench_serving; returns (and with a ``recorder``, records) the rows it appended to ``out``."""
    for name, value in (
        ("num_prompts", num_prompts),
        ("input_len", input_len),
        ("output_len", output_len),
        ("seed", seed),
    ):
        params.positive(name, value)
    cmd = bench_serving_command(
        server,
        out,
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        max_concurrency=max_concurrency,
        dataset=dataset,
        seed=seed,
    )
    rows = _run_client(
        server,
        cmd,
        out,
        Path(log_path or Path(out).with_suffix(".log")),
        timeout_s,
        ("output_throughput",),
        SERVING_METRICS,
    )
    _record(rows, server, "bench_serving", recorder)
    return rows


def bench_one_batch_command(
    server: Server,
    out: Path,
    *,
    batch_sizes: Sequence[int],
    input_len: int,
    output_len: int,
    run_name: str,
    dataset: str = OFFLINE_DATASET,
) -> list[str]:
    """``python -m sglang.bench_one_batch_server`` against ``server``, results appended to ``out``."""
    return [
        server.config.python, "-m", "sglang.bench_one_batch_server", "--model-path", str(server.config.model_path),
        "--base-url", server.base_url, "--batch-size", *map(str, batch_sizes), "--input-len", str(input_len),
        "--output-len", str(output_len), "--run-name", run_name, "--result-filename", str(out),
        "--dataset-name", dataset,
    ]  # fmt: skip


def bench_one_batch(
    server: Server,
    out: Path,
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    input_len: int = 256,
    output_len: int = 32,
    run_name: str | None = None,
    timeout_s: float = 900.0,
    log_path: Path | None = None,
    recorder: records.Recorder | None = None,
) -> list[dict]:
    """Run bench_one_batch_server; returns (and with a ``recorder``, records) the rows it appended to ``out``."""
    if not batch_sizes:
        raise ValueError("batch_sizes is empty; allowed values: positive integers")
    for value in batch_sizes:
        params.positive("batch_sizes", value)
    params.positive("input_len", input_len)
    params.positive("output_len", output_len)
    cmd = bench_one_batch_command(
        server,
        out,
        batch_sizes=batch_sizes,
        input_len=input_len,
        output_len=output_len,
        run_name=run_name or server.config.label,
    )
    rows = _run_client(
        server,
        cmd,
        out,
        Path(log_path or Path(out).with_suffix(".log")),
        timeout_s,
        ("batch_size", "latency", "output_throughput"),
        ONE_BATCH_METRICS,
    )
    _record(rows, server, "bench_one_batch", recorder)
    return rows


def serving_table(rows: list[dict]) -> pd.DataFrame:
    """bench_serving results per server configuration, with throughput relative to the baseline;
    a configuration whose MSCCLPP fell back to NCCL is shown as such (``shown_as``)."""
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    name = "shown_as" if "shown_as" in table else "label"
    columns = [name] + [
        c
        for c in (
            "output_throughput",
            "median_ttft_ms",
            "median_itl_ms",
            "median_tpot_ms",
            "completed",
        )
        if c in table
    ]
    table = table[columns].set_index(name)
    if "baseline" in table.index:
        table["throughput_vs_baseline"] = (
            table["output_throughput"] / table.loc["baseline", "output_throughput"]
        )
    return table
