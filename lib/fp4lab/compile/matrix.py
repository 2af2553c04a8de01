"""Is it still blocked? The FP4 trace against a list of FlashInfer versions, each in its own environment.

For every version: an isolated virtual environment under build/matrix/ (torch at the
project's default pin, one shared pip download cache), reused when present; in it, a child
process (``python -m fp4lab.compile.matrix probe``) traces the public ``flashinfer.fp4_quantize``
under fullgraph=True with the simulated Blackwell target and walks its blocker chain, checks
whether ``torch.ops.flashinfer.fp4_quantize`` exists and compiles to one graph, and whether
fp4lab's own custom op does. A version that fails to install or import is recorded as such
and the others go on.

    python -m fp4lab.compile.matrix run --versions 0.6.3,0.7.4      # build/reuse envs, probe, print a table
    python -m fp4lab.compile.matrix probe                          # inside one env: JSON on stdout
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fp4lab.core import paths

DEFAULT_VERSIONS = ("0.6.3", "0.6.11.post3", "0.6.12", "0.7.4")
"""The story's era (early 2026), the last release before the upstream op, the first with it (PR #3081), the newest."""

TORCH = "torch==2.13.0"
VERDICTS = (
    "blocked",
    "unblocked through torch.ops.flashinfer.fp4_quantize",
    "unblocked only through fp4lab's custom op",
)
PROBE_TIMEOUT_S = 600


@dataclass
class VersionResult:
    """What one FlashInfer version does with the story's trace."""

    version: str
    env: str  # reused | built | failed
    install_seconds: float = 0.0
    env_bytes: int = 0
    wheel_bytes: int = 0
    error: str = ""
    chain: list[dict] = field(default_factory=list)
    upstream_op: dict = field(default_factory=dict)
    fp4lab_op: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)
    packages: dict = field(default_factory=dict)
    import_staging: str | None = None

    @property
    def blockers(self) -> list[str]:
        """The public path's blockers in the order met (the last one ends the walk)."""
        return [row["signature"] for row in self.chain if row["signature"] != "ok"]

    @property
    def story_patches_needed(self) -> list[str]:
        """The story's own patches the walk had to apply on this version."""
        return [row["stage"] for row in self.chain if row["origin"] == "story"]

    @property
    def verdict(self) -> str:
        if self.env == "failed":
            return "not measured: " + self.error.splitlines()[0] if self.error else "not measured"
        if self.chain and self.chain[-1]["signature"] == "ok":
            return "unblocked: the public function traces"
        if self.upstream_op.get("signature") == "ok" and self.upstream_op.get("graph_count") == 1:
            return VERDICTS[1]
        if self.fp4lab_op.get("signature") == "ok" and self.fp4lab_op.get("graph_count") == 1:
            return VERDICTS[2]
        return VERDICTS[0]

    @property
    def story_decision_holds(self) -> bool | None:
        """The story's BLOCKED holds where nothing short of writing a custom op unblocks it."""
        return None if self.env == "failed" else self.verdict in (VERDICTS[0], VERDICTS[2])

    def as_record(self) -> dict:
        return {
            **asdict(self),
            "blockers": self.blockers,
            "story_patches_needed": self.story_patches_needed,
            "upstream_op_present": bool(self.upstream_op.get("present")),
            "verdict": self.verdict,
            "story_decision_holds": self.story_decision_holds,
        }


def check_versions(versions: list[str]) -> list[str]:
    """Versions as written ("0.6.12"); a clear error for anything that is not a version."""
    from packaging.version import InvalidVersion, Version

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


def env_dir(version: str) -> Path:
    return paths.build_dir() / "matrix" / f"flashinfer-{version}"


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _pip_env() -> dict:
    env = dict(os.environ)
    env.setdefault(
        "PIP_CACHE_DIR", str(paths.build_dir() / "cache" / "pip")
    )  # shared by every version
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def ensure_env(version: str, torch_spec: str = TORCH) -> VersionResult:
    """Build (or reuse) the environment for one version; never raises for an install failure."""
    env = env_dir(version)
    stamp = env / ".fp4lab-ready"
    wheels = paths.build_dir() / "matrix" / "wheels" / version
    if stamp.exists() and stamp.read_text().strip() == torch_spec:
        return VersionResult(
            version,
            "reused",
            env_bytes=paths.disk_bytes(env),
            wheel_bytes=paths.disk_bytes(wheels) if wheels.exists() else 0,
        )
    started = time.perf_counter()
    shutil.rmtree(env, ignore_errors=True)
    steps = [  # the FlashInfer wheel first, so a version that does not exist fails in seconds
        [sys.executable, "-m", "venv", str(env)],
        [
            str(_python(env)),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(wheels),
            f"flashinfer-python=={version}",
        ],
        [str(_python(env)), "-m", "pip", "install", "-q", torch_spec],
        [
            str(_python(env)),
            "-m",
            "pip",
            "install",
            "-q",
            f"flashinfer-python=={version}",
            torch_spec,
        ],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, env=_pip_env())
        if done.returncode != 0:
            tail = [
                line
                for line in done.stderr.splitlines()
                if line.strip() and not line.startswith("WARNING: Location")
            ][-3:]
            shutil.rmtree(env, ignore_errors=True)
            return VersionResult(
                version,
                "failed",
                time.perf_counter() - started,
                error=f"{' '.join(step[2:5])} failed: {' | '.join(tail)}",
            )
    stamp.write_text(torch_spec)
    return VersionResult(
        version,
        "built",
        time.perf_counter() - started,
        env_bytes=paths.disk_bytes(env),
        wheel_bytes=paths.disk_bytes(wheels),
    )


def probe_in_env(result: VersionResult) -> VersionResult:
    """Run the probe in the version's environment (a child process, killed on timeout)."""
    if result.env == "failed":
        return result
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    try:
        done = subprocess.run(
            [str(_python(env_dir(result.version))), "-m", "fp4lab.compile.matrix", "probe"],
            capture_output=True,
            text=True,
            env=env,
            timeout=PROBE_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        result.env, result.error = "failed", f"probe did not finish within {PROBE_TIMEOUT_S} s"
        return result
    if done.returncode != 0:
        result.env, result.error = (
            "failed",
            "probe failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1],
        )
        return result
    found = json.loads(done.stdout.strip().splitlines()[-1])
    result.chain, result.upstream_op, result.fp4lab_op = (
        found["chain"],
        found["upstream_op"],
        found["fp4lab_op"],
    )
    result.target, result.packages, result.import_staging = (
        found["target"],
        found["packages"],
        found["import_staging"],
    )
    return result


def probe() -> dict:
    """Inside one environment: the story's trace on the installed FlashInfer, as plain data."""
    import torch

    from fp4lab.compile import segment, trace
    from fp4lab.compile import staging as fp
    from fp4lab.core import probe

    shape = segment.LayerShape(hidden=64, heads=2, ffn=128)
    x = segment.tokens_input(shape, 16)
    chain = fp.walk_blocker_chain(segment.Stack(shape, 1, fp.fp4_quantize), x)
    keep = (
        "step",
        "stage",
        "origin",
        "story",
        "signature",
        "message",
        "skipped_builtin",
        "blocker_frame",
        "seconds",
    )
    with torch.no_grad(), fp.simulated_target() as target, fp.upstream_op_cpu_kernel() as op:
        if op is None:
            upstream = {"present": False}
        else:
            outcome = trace.attempt(segment.Stack(shape, 1, lambda h, gs: op(h, gs)), x)
            upstream = {
                "present": True,
                "schema": str(op._schema),
                "signature": outcome.signature,
                "graph_count": outcome.graph_count,
                "message": outcome.message,
            }
    with torch.no_grad(), fp.simulated_target(), fp.custom_op_fp4_quantize():
        outcome = trace.attempt(segment.Stack(shape, 1, fp.fp4_quantize), x)
        ours = {
            "signature": outcome.signature,
            "graph_count": outcome.graph_count,
            "message": outcome.message,
        }
    return {
        "packages": {name: probe.package_version(name) for name in ("torch", "flashinfer-python")},
        "target": target,
        "import_staging": fp.IMPORT_STAGING,
        "chain": [{k: row[k] for k in keep} for row in chain],
        "upstream_op": upstream,
        "fp4lab_op": ours,
    }


def summarize(results: list[VersionResult]) -> dict:
    """Up to which version the story's decision holds, and from which the upstream op removes the blocker."""
    from packaging.version import Version

    measured = sorted((r for r in results if r.env != "failed"), key=lambda r: Version(r.version))
    holds = [r.version for r in measured if r.story_decision_holds]
    unblocked = [r.version for r in measured if r.verdict == VERDICTS[1]]
    return {
        "versions_measured": [r.version for r in measured],
        "versions_failed": [r.version for r in results if r.env == "failed"],
        "story_decision_holds_up_to": holds[-1] if holds else None,
        "upstream_op_unblocks_from": unblocked[0] if unblocked else None,
    }


def run(versions: list[str], workers: int | None = None, progress=print) -> list[VersionResult]:
    """Build or reuse every environment (in parallel where the machine allows), then probe each."""
    versions = check_versions(versions)
    workers = workers or max(1, min(len(versions), (os.cpu_count() or 1) // 2))
    results: dict[str, VersionResult] = {}
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for done in concurrent.futures.as_completed(
            {pool.submit(ensure_env, v): v for v in versions}
        ):
            result = done.result()
            results[result.version] = result
            progress(
                f"environment flashinfer-python=={result.version}: {result.env} ({result.install_seconds:.0f} s){' ' + result.error if result.error else ''}"
            )
    for version in versions:
        progress(f"probing flashinfer-python=={version} ...")
        probe_in_env(results[version])
        progress(f"  {version}: {results[version].verdict}")
    return [results[v] for v in versions]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fp4lab.compile.matrix", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="build or reuse each version's environment and probe it")
    go.add_argument(
        "--versions",
        default=",".join(DEFAULT_VERSIONS),
        help="comma list of flashinfer-python versions",
    )
    sub.add_parser("probe", help="inside one environment: print the probe's JSON")
    args = parser.parse_args(argv)
    if args.command == "probe":
        import warnings

        warnings.simplefilter("ignore")
        print(json.dumps(probe()))
        return 0
    try:
        results = run([v.strip() for v in args.versions.split(",") if v.strip()])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(
            f"{r.version:14} {' -> '.join(r.blockers) or '-':80} upstream op: {r.upstream_op.get('present')}  {r.verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
