"""Notebook 09's calls and the command line: every version's environment built or reused, the
child run in each, one record per version and the summary.

    python -m fp4lab.compile.matrix run --versions 0.6.3,0.7.4    # build/reuse, trace, print
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
from collections.abc import Callable

from fp4lab.compile.matrix.env import TRACE_TIMEOUT_S, child, ensure_env, read_child
from fp4lab.compile.matrix.result import VERDICTS, VersionResult, summarize_versions
from fp4lab.compile.matrix.versions import DEFAULT_VERSIONS, check_released, check_versions
from fp4lab.core import evidence, paths, records, venvs
from fp4lab.core.progress import say


def measure_versions(
    versions: list[str], workers: int | None = None, progress: Callable[[str], object] = say
) -> list[VersionResult]:
    """Build or reuse every environment (in parallel where the machine allows), then trace in
    each (one child per core at once)."""
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
    children = {child(v): v for v in versions if results[v].env != "failed"}
    progress(f"tracing {', '.join(children.values()) or 'no version'} ...")

    def traced(one: venvs.Child, found: dict) -> None:
        version = children[one]
        progress(f"  {version}: {read_child(results[version], found).verdict}")

    venvs.run_children(
        list(children), paths.build_dir() / "matrix" / "logs", TRACE_TIMEOUT_S, traced
    )
    return [results[v] for v in versions]


def prepare(versions: list[str] | str) -> records.Recorder:
    """Notebook 09's validation: the versions checked; the recorder its records go through."""
    return records.Recorder("09_version_matrix", {"versions": check_released(versions)})


def measure_and_record(rec: records.Recorder) -> list[VersionResult]:
    """Measure the recorder's versions; records one "version" per version (its provenance holds
    the packages of that version's environment) and the "summary"."""
    results = measure_versions(rec.params["versions"])
    for r in results:
        rec.add("version", r.as_record(), target=r.target or None, packages=r.packages or None)
    summary = summarize_versions(results)
    measured = [r for r in results if r.target]
    rec.summary(
        **summary,
        evidence=evidence.of_values([row for r in results for row in r.chain]),
        provenance={
            "target": measured[0].target if measured else None,
            "packages": {"flashinfer-python": ", ".join(summary["versions_measured"])},
        },
    )
    return results


def matrix_verdict(results: list[VersionResult]) -> str:
    """The versions of each verdict, where the story's decision holds and where the upstream op
    unblocks; AssertionError when no version could be measured."""
    summary = summarize_versions(results)
    evidence.guard(summary["versions_measured"], "no version could be measured")
    lines = [
        f"{verdict}: {', '.join(versions) or 'none of the versions measured'}"
        for verdict, versions in summary["verdict_ranges"].items()
    ]
    lines += [
        "the story's decision (blocked unless you write the custom op yourself) holds up to: "
        f"{summary['story_decision_holds_up_to']}",
        f"the upstream op removes the blocker, with the right arguments, from: "
        f"{summary['upstream_op_unblocks_from']}",
    ]
    undecided = [r for r in results if r.env != "failed" and r.verdict not in VERDICTS]
    lines += [f"{r.version}: {r.verdict}" for r in undecided]
    if summary["versions_failed"]:
        failed = ", ".join(summary["versions_failed"])
        lines.append(f"not measured (install or trace failed): {failed}")
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
        results = measure_versions(check_released(args.versions))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        chain = " -> ".join(r.blockers) or "-"
        print(f"{r.version:14} {chain:80} forwarding: {r.forwarding_status}  {r.verdict}")
    return 0
