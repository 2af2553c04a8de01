"""Notebook 11's calls and the command line: each SGLang version's environment built or reused,
its source scanned, the replay and the per-SM quantize choice run inside it, records, verdict.

    python -m fp4lab.serving.replay run --versions 0.5.9,0.5.21 --sms 9.0,10.0,12.0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from fp4lab.core import evidence, paths, records, venvs
from fp4lab.serving import standins
from fp4lab.serving.replay import decide, env, scan, versions

CHILD_TIMEOUT_S = 600


@dataclass
class VersionRun:
    """Everything measured for one SGLang version."""

    version: str
    environment: env.CompileEnv
    calls: list[dict] = field(default_factory=list)
    replay: dict = field(default_factory=dict)
    selections: dict[str, dict] = field(default_factory=dict)


def child(version: str, mode: str, sm: str) -> venvs.Child:
    """``python -m fp4lab.serving.replay.child OUT MODE SM`` in the version's environment."""
    python = env.env_dir(version) / "venv" / "bin" / "python"
    return venvs.Child(python, "fp4lab.serving.replay.child", (mode, sm),
                       f"{version}-{mode}-sm{sm}", mode)  # fmt: skip


def measure_version(
    version: str, sms: list[str], replay_sm: str, progress: Callable[[str], object] = print
) -> VersionRun:
    """Build or reuse the environment; scan it, then replay and select in it (one child per core
    at once); skipped when the environment failed."""
    compile_env = env.ensure_env(version)
    progress(f"sglang=={version}: environment {compile_env.status} ({compile_env.seconds:.0f} s)"
             + (f" {compile_env.error}" if compile_env.error else ""))  # fmt: skip
    run = VersionRun(version, compile_env)
    if not compile_env.ok:
        return run
    package = standins.site_packages(str(compile_env.python)) / "sglang"
    run.calls = scan.scan(package)
    children = [child(version, "replay", replay_sm), *(child(version, "select", sm) for sm in sms)]

    def shown(one: venvs.Child, found: dict) -> None:
        what = found.get("error") or found.get("implementation") or "done"
        progress(f"  {one.label} on SM{one.args[1]}: {what}")

    run.replay, *selected = venvs.run_children(
        children, paths.build_dir() / "sglang-compile" / "logs", CHILD_TIMEOUT_S, shown
    )
    run.selections = dict(zip(sms, selected, strict=True))
    return run


def prepare(sglang_versions: list[str] | str, sms: list[str] | str) -> records.Recorder:
    """Notebook 11's validation (before any install): versions and SMs checked."""
    return records.Recorder(
        "11_sglang_piecewise_replay",
        {
            "sglang_versions": versions.check_versions(sglang_versions),
            "sms": versions.check_sms(sms),
        },
    )


def _target(sm: str) -> dict:
    return {"sm": sm, "simulated": True}


def record_version(rec: records.Recorder, run: VersionRun, replay_sm: str) -> list[dict]:
    """One record per environment, scan, replay and (version, SM) selection; the decision rows."""
    base = {"sglang_version": run.version}
    rec.add("environment", {**base, **run.environment.as_record()})
    if not run.environment.ok:
        return []
    direct = scan.direct(run.calls)
    rec.add("flashinfer_fp4_calls", {**base, "calls": run.calls, "direct": len(direct),
                                     "wrapped": len(run.calls) - len(direct)})  # fmt: skip
    replay = run.replay
    ran = [*replay.get("chain", []), replay.get("fp4lab_op", {}), replay.get("sglang_op", {})]
    rec.add("replay", {**base, "sm": replay_sm, "evidence": evidence.of_values(ran),
                       "what_ran": "sglang.srt.compilation.compile.install_torch_compiled",
                       "blockers": decide.blockers(replay.get("chain", [])), **replay},
            target=_target(replay_sm))  # fmt: skip
    rows = []
    for sm, selection in run.selections.items():
        levels = evidence.of_values(selection.get("chain", []))
        rec.add("selection", {**base, "sm": sm, "evidence": levels,
                              "what_ran": "sglang.srt.layers.quantization.modelopt_quant", **selection},
                target=_target(sm))  # fmt: skip
        rows.append(decide.cell(run.version, sm, selection, replay))
    return rows


def measure_and_record(rec: records.Recorder, replay_sm: str = versions.STORY_SM,
                       extra: tuple[str, ...] = ()) -> list[dict]:  # fmt: skip
    """Every version measured in turn (a failed one recorded, the others go on); the decision
    table's rows recorded as "decision" and the "summary"."""
    rows: list[dict] = []
    runs = []
    for version in versions.check_versions(rec.params["sglang_versions"], extra):
        run = measure_version(version, rec.params["sms"], replay_sm)
        runs.append(run)
        rows += record_version(rec, run, replay_sm)
    for row in rows:
        rec.add(
            "decision",
            row,
            target=_target(row["sm"]),
        )
    story = [r for r in runs if r.version == versions.STORY_VERSION and r.replay.get("chain")]
    rec.summary(**{
        "status": "measured" if rows else "not measured",
        "headline": verdict(rows),
        **decide.decision(rows),
        "needs": "cpu",
        "versions_measured": [r.version for r in runs if r.environment.ok],
        "versions_failed": {r.version: r.environment.error for r in runs if not r.environment.ok},
        "story_blockers_0_5_9": decide.blockers(story[0].replay["chain"]) if story else None,
        "sm120_specific_0_5_9": decide.sm120_specific(rows, versions.STORY_VERSION),
        "by_version": decide.compact(rows),
        "evidence": evidence.of_values(rows),
    })  # fmt: skip
    return rows


def verdict(rows: list[dict]) -> str:
    """One line per (version, SM): outcome, where blocked, through which op it compiles, the
    options a GLM-5 user needs."""
    lines = []
    for r in rows:
        how = f"blocked at {r['blocked_at']}" if r["outcome"] == "blocked" else r["outcome"]
        how += f" ({r['note']})" if r["outcome"] == "not applicable" else ""
        through = f"; compiles through {r['compiles_through']}" if r["compiles_through"] else ""
        counts = (f" ({r['graphs']} graph, {r['piecewise_graphs']} piecewise)"
                  if r["graphs"] is not None else "")  # fmt: skip
        lines.append(f"SGLang {r['sglang_version']} SM{r['sm']}: quantize {r['quantize']}, {how}"
                     f"{through}{counts}; GLM-5 flag: {r['flag']}")  # fmt: skip
    specific = decide.sm120_specific(rows, versions.STORY_VERSION)
    if specific is not None:
        lines.append(f"the story's crash path was SM120-specific in SGLang {versions.STORY_VERSION}: "
                     f"{'yes' if specific else 'no'} (from the quantize each SM took)")  # fmt: skip
    return "\n".join(lines) or "no version could be measured"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp4lab.serving.replay")
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="build or reuse each version's environment, replay, select")
    go.add_argument("--versions", default=",".join(versions.DEFAULT_VERSIONS))
    go.add_argument("--sms", default=",".join(versions.SMS))
    args = parser.parse_args(argv)
    try:
        rec = prepare(args.versions, args.sms)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(verdict(measure_and_record(rec)))
    return 0
