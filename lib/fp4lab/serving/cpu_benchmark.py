"""Benchmark (not a test): the real SGLang server on this machine's CPU with the tiny model.

    python -m fp4lab.serving.cpu_benchmark [--version 0.5.21] [--prompts 16]

Prints the SGLang environment's build or reuse time and size on disk, seconds until the server
was ready, per-request seconds, and bench_serving's output tokens/s, TTFT and ITL; the numbers
are recorded (notebook name "sglang_cpu_benchmark") with their provenance.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from fp4lab.core import paths, records
from fp4lab.serving import live
from fp4lab.serving.sglang_env import SGLANG_VERSION, ensure_sglang


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.serving.cpu_benchmark")
    parser.add_argument("--version", default=SGLANG_VERSION, help="the SGLang release")
    parser.add_argument("--prompts", type=int, default=16, help="bench_serving prompts")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    env = ensure_sglang(args.version)
    if not env.ok:
        print(f"SGLang {args.version}: the environment could not be built: {env.error}")
        return 1
    print(
        f"SGLang {env.version}: environment {env.environment.status} in "
        f"{time.perf_counter() - started:.1f} s, {env.environment.bytes / 1e9:.2f} GB on disk, "
        f"stand-ins: {', '.join(s['name'] for s in env.standins) or 'none'}"
    )
    rec = records.Recorder("sglang_cpu_benchmark", vars(args))
    with tempfile.TemporaryDirectory(dir=paths.build_dir()) as folder:
        result = live.smoke(
            Path(folder), version=args.version, num_prompts=args.prompts,
            input_len=args.input_len, output_len=args.output_len, recorder=rec,
        )  # fmt: skip
    print(f"ready after {result.ready_after_s:.1f} s")
    for request in result.requests:
        print(
            f"{request['endpoint']:16} {request['completion_tokens']} tokens in {request['seconds']:.2f} s"
        )
    row = result.serving[0]
    print(
        f"bench_serving ({args.prompts} prompts, {args.input_len} in / {args.output_len} out): "
        f"{row['output_throughput']:.1f} output tok/s, median TTFT {row['median_ttft_ms']:.0f} ms, "
        f"median ITL {row['median_itl_ms']:.1f} ms"
    )
    print(f"processes left behind: {result.left_behind or 'none'}")
    return 0 if not result.left_behind else 1


if __name__ == "__main__":
    sys.exit(main())
