"""Is it still blocked? The FP4 trace against a list of FlashInfer versions, each in its own environment.

For every version: an isolated virtual environment (``matrix_env``), reused when present; in
it, a child process (``matrix_child``) traces the public ``flashinfer.fp4_quantize`` under
fullgraph=True with the simulated Blackwell target and walks its blocker chain, checks
whether ``torch.ops.flashinfer.fp4_quantize`` exists and compiles to one graph, and whether
fp4lab's own custom op does. Each version gets a verdict (``matrix_result``). A version that
fails to install or trace is recorded as such and the others go on.

    python -m fp4lab.compile.matrix run --versions 0.6.3,0.7.4    # build/reuse envs, trace, print a table

Notebook 09 calls ``prepare``, ``measure_and_record`` and ``matrix_verdict``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
from collections.abc import Callable

from fp4lab.compile.matrix_env import ensure_env, trace_in_env
from fp4lab.compile.matrix_result import VersionResult, summarize_versions
from fp4lab.core import records

DEFAULT_VERSIONS = ("0.6.3", "0.6.11.post3", "0.6.12", "0.7.4")
"""The story's era (early 2026), the last release before the upstream op, the first with it (PR #3081), the newest."""


def check_versions(versions: list[str] | str) -> list[str]:
    """Versions as written ("0.6.12"; a list or one comma-separated string), duplicates dropped;
    a clear error naming ``versions`` for anything that is not a version."""
    from packaging.version import InvalidVersion, Version

    if isinstance(versions, str):
        versions = [v.strip() for v in versions.split(",") if v.strip()]
    if not isinstance(versions, (list, tuple)) or not all(isinstance(v, str) for v in versions):
        raise ValueError(
            f"versions={versions!r} must be a comma-separated string or a list of version strings"
        )
    if not versions:
        raise ValueError(
            "versions is empty; give one or more flashinfer-python versions, e.g. 0.6.12,0.7.4"
        )
    for v in versions:
        try:
            Version(v)
        except InvalidVersion:
            raise ValueError(
                f"versions contains {v!r}, which is not a version; e.g. 0.6.12 or 0.7.4"
            ) from None
    return list(dict.fromkeys(versions))


def measure_versions(
    versions: list[str], workers: int | None = None, progress: Callable[[str], object] = print
) -> list[VersionResult]:
    """Build or reuse every environment (in parallel where the machine allows), then trace in each."""
    versions = check_versions(versions)
    workers = workers or max(1, min(len(versions), (os.cpu_count() or 1) // 2))
    results: dict[str, VersionResult] = {}
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for done in concurrent.futures.as_completed(
            {pool.submit(ensure_env, v): v for v in versions}
        ):
            result = done.result()
            results[result.version] = result
            error = f" {result.error}" if result.error else ""
            progress(
                f"environment flashinfer-python=={result.version}: {result.env} "
                f"({result.install_seconds:.0f} s){error}"
            )
    for version in versions:
        progress(f"tracing flashinfer-python=={version} ...")
        trace_in_env(results[version])
        progress(f"  {version}: {results[version].verdict}")
    return [results[v] for v in versions]


def prepare(versions: list[str] | str) -> records.Recorder:
    """Notebook 09's validation: the versions checked; the recorder its records go through."""
    return records.Recorder("09_version_matrix", {"versions": check_versions(versions)})


def measure_and_record(rec: records.Recorder) -> list[VersionResult]:
    """Measure the recorder's versions; records one "version" per version and the "summary"."""
    results = measure_versions(rec.params["versions"])
    for r in results:
        rec.add("version", r.as_record(), target=r.target or None, packages=r.packages)
    summary = summarize_versions(results)
    measured = [r for r in results if r.target]
    rec.add(
        "summary",
        summary,
        target=measured[0].target if measured else None,
        packages={"flashinfer-python": ", ".join(summary["versions_measured"])},
    )
    return results


def matrix_verdict(results: list[VersionResult]) -> str:
    """Where the story's decision holds and where the upstream op unblocks; AssertionError when
    no version could be measured."""
    summary = summarize_versions(results)
    lines = [
        "the story's decision (blocked unless you write the custom op yourself) holds up to: "
        f"{summary['story_decision_holds_up_to']}",
        f"the upstream op removes the blocker from: {summary['upstream_op_unblocks_from']}",
    ]
    if summary["versions_failed"]:
        failed = ", ".join(summary["versions_failed"])
        lines.append(f"not measured (install or trace failed): {failed}")
    assert summary["versions_measured"], "no version could be measured"
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.compile.matrix", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="build or reuse each version's environment and trace in it")
    go.add_argument(
        "--versions",
        default=",".join(DEFAULT_VERSIONS),
        help="comma list of flashinfer-python versions",
    )
    args = parser.parse_args(argv)
    try:
        results = measure_versions(check_versions(args.versions))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        chain = " -> ".join(r.blockers) or "-"
        print(f"{r.version:14} {chain:80} upstream op: {r.upstream_op.get('present')}  {r.verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
