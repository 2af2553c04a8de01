"""Notebook 11's calls and the command line: each SGLang release's environment built or reused,
its source scanned, its own GLM-5 replayed on each SM inside it, records, verdict; and the patch
for one release x SM written where a user can apply it.

    python -m fp4lab.serving.replay run [--versions all|0.5.9,0.5.21] [--sms 9.0,10.0,12.0]
    python -m fp4lab.serving.replay --sglang 0.5.9 --sm 12.0 --write-patch DIR [--config PATH]
    python -m fp4lab.serving.replay check --config PATH --sglang 0.5.21 --sm 12.0  (``check``)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from fp4lab.core import evidence, params, records
from fp4lab.serving import deep_gemm_sources
from fp4lab.serving.replay import decide, env, pool, scan, timeline, upstream, versions
from fp4lab.serving.replay.pool import CUDA_HOME_CASES, GLM5, VersionRun
from fp4lab.serving.replay.shared import breakable_outcome, models, patch


def sm120_specific(rows: list[dict], version: str) -> bool | None:
    """Whether, in ``version``, only SM120 met FlashInfer's FP4 quantize JIT (None: unknown)."""
    mine = {r["sm"]: r for r in rows if r["sglang_version"] == version}
    measured = {sm: r for sm, r in mine.items() if r["outcome"] in decide.MEASURED}
    if "12.0" not in measured or len(measured) < 2:
        return None
    fp4 = decide.BLOCKERS["fp4_quantize_op"]
    others = [fp4 in r["blockers"] for sm, r in measured.items() if sm != "12.0"]
    return fp4 in measured["12.0"]["blockers"] and not any(others)


def check_cuda_home(cuda_home: list[str] | tuple[str, ...] | str) -> list[str]:
    """CUDA_HOME values as given: ``unset`` or an absolute path, each once."""
    values = params.items("cuda_home", cuda_home, "unset, /usr/local/cuda")
    wrong = [v for v in values if v != "unset" and not v.startswith("/")]
    if wrong:
        raise ValueError(f"cuda_home contains {wrong[0]!r}; allowed values: 'unset' or an "
                         f"absolute path such as /usr/local/cuda")  # fmt: skip
    return values


def prepare(sglang_versions: list[str] | str, sms: list[str] | str,
            cuda_home: list[str] | str = CUDA_HOME_CASES,
            matrix_models: list[str] | str = models.NONE) -> records.Recorder:  # fmt: skip
    """Notebook 11's validation (before any install): releases, SMs, CUDA_HOME values, and the
    models walked alongside GLM-5 for notebook 14 (``pool``)."""
    return records.Recorder(
        "11_sglang_piecewise_replay",
        {
            "sglang_versions": versions.check_versions(sglang_versions),
            "sms": versions.check_sms(sms),
            "cuda_home": check_cuda_home(cuda_home),
            "matrix_models": models.check_names("matrix_models", matrix_models, none=True),
        },
    )


def _target(sm: str) -> dict:
    return {"sm": sm, "simulated": True}


def record_version(rec: records.Recorder, run: VersionRun) -> list[dict]:
    """One record per environment, scan and (release, SM) replay; the decision rows."""
    base = {"sglang_version": run.version}
    rec.add("environment", {**base, **run.environment.as_record()})
    if not run.environment.ok:
        return []
    direct = scan.direct(run.calls)
    rec.add("flashinfer_fp4_calls", {**base, "calls": run.calls, "direct": len(direct),
                                     "wrapped": len(run.calls) - len(direct)})  # fmt: skip
    rows = []
    for sm, replay in run.replays.items():
        ran = [*replay.get("chain", []), *replay.get("fix", {}).get("steps", [])]
        entry = next((r["entry"] for r in ran if r.get("entry")), "its ModelRunner")
        rec.add("replay", {**base, "sm": sm, "evidence": evidence.of_values(ran),
                           "what_ran": "the release's GlmMoeDsaForCausalLM through "
                           + entry.split(".model_runner.")[-1], **replay},
                target=_target(sm))  # fmt: skip
        rows.append({**decide.cell(run.version, sm, replay, run.calls),
                     **breakable_outcome.captured_fields(replay), "kept": replay.get("kept"),
                     "deep_gemm": deep_gemm_sources.on_sm(run.environment.deep_gemm, sm)})  # fmt: skip
    return rows


def measure_and_record(rec: records.Recorder, extra: tuple[str, ...] = ()) -> list[dict]:
    """Every release measured (``pool.measure_versions``; a failed one recorded, the others go on,
    the models of ``matrix_models`` walked alongside and kept for notebook 14); the
    decision table's rows recorded as "decision" and the "summary"."""
    rows: list[dict] = []
    chosen = versions.check_versions(rec.params["sglang_versions"], extra)
    runs = pool.measure_versions(chosen, rec.params["sms"], rec.params["cuda_home"],
                                 alongside=[models.named(n) for n in rec.params["matrix_models"]])  # fmt: skip
    for run in runs:
        rows += record_version(rec, run)
    for row in rows:
        rec.add("decision", row, target=_target(row["sm"]))
    print(timeline.tally(rows))  # the page's one line; each replay's went to the terminal
    held = upstream.agreement(rows)
    for row in held:
        rec.add("upstream", row)
    story = [
        r.replays.get(versions.STORY_SM, {}) for r in runs if r.version == versions.STORY_VERSION
    ]
    chain = story[0].get("chain") if story else None
    rec.summary(**{
        "status": "measured" if any(r["outcome"] in decide.MEASURED for r in rows)
        else "not measured",
        "headline": verdict(rows),
        **decide.decision(rows),
        "needs": "cpu",
        "versions_measured": [r.version for r in runs if r.environment.ok],
        "versions_failed": {r.version: r.environment.error for r in runs if not r.environment.ok},
        "story_blockers_0_5_9": decide.blockers(chain) if chain else None,
        "sm120_specific_0_5_9": sm120_specific(rows, versions.STORY_VERSION),
        "by_version": timeline.compact(rows),
        "timeline": timeline.timeline(rows),
        "not_measured_harness": {f"{r['sglang_version']} SM{r['sm']}": r["note"]
                                 for r in rows if r["outcome"] == "not measured"},
        "upstream": {v: sum(r["verdict"] == v for r in held)
                     for v in (upstream.AGREE, upstream.DISAGREE, upstream.NOT_COMPARABLE)},
        "replays_kept": sum(r["kept"] is not None for r in rows),
        "evidence": breakable_outcome.evidence_of(rows),
    })  # fmt: skip
    return rows


def verdict(rows: list[dict]) -> str:
    """One line per (release, SM): outcome, blockers, patch, MoE path, the option a GLM-5 user
    passes."""
    lines = [f"SGLang {r['sglang_version']} SM{r['sm']}: {timeline.what(r)}; MoE: {r['moe']}; "
             f"GLM-5 flag: {r['flag']}" for r in rows]  # fmt: skip
    lines += [timeline.sentence(rows, sm) for sm in dict.fromkeys(r["sm"] for r in rows)]
    specific = sm120_specific(rows, versions.STORY_VERSION)
    if specific is not None:
        lines.append(f"FlashInfer's FP4 quantize JIT blocked only SM120 in SGLang "
                     f"{versions.STORY_VERSION}: {'yes' if specific else 'no'}")  # fmt: skip
    return "\n".join(lines) or "no release could be measured"


def write_patch(version: str, sm: str, folder: Path, progress: Callable[[str], object] = print,
                model: models.Model | None = None) -> int:  # fmt: skip
    """Replay the release's model (GLM-5 unless given) on ``sm`` and write the patch its blockers
    need into ``folder``; 0 when written or none is needed, 1 when a blocker has no patch part."""
    model = model or models.named(GLM5)
    built = env.ensure_env(version)
    if not built.ok:
        progress(f"error: sglang=={version}: {built.error}")
        return 1
    found = pool.replay_one(version, sm, model)
    fixed = found.get("fix", {})
    if not fixed:
        progress(f"error: {found.get('error') or found.get('build_error')}")
        return 1
    if not fixed["parts"]:
        progress(f"SGLang {version} on SM{sm}: {model.name} compiles as released; no patch is "
                 f"needed")  # fmt: skip
        return 0
    for path in patch.write(folder, version, sm, fixed["plugin"]):
        progress(f"wrote {path}")
    if not fixed["compiles"]:
        last = fixed["steps"][-1]
        progress(f"the patch removes {', '.join(fixed['parts'])}; still blocked at "
                 f"{last['blocker_frame']}: {last['message']}")  # fmt: skip
        return 1
    progress(f"with it {model.name} compiles ({fixed['pieces']} pieces) and "
             f"{'equals' if fixed['equals_eager'] else 'does NOT equal'} eager (a CPU replay)")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        parser = argparse.ArgumentParser(prog="python -m fp4lab.serving.replay run")
        parser.add_argument("--versions", default=versions.ALL,
                            help=f"{versions.ALL} (the default) or releases, comma-separated")  # fmt: skip
        parser.add_argument("--sms", default=",".join(versions.SMS))
        parser.add_argument("--cuda-home", default=",".join(CUDA_HOME_CASES))
        args = parser.parse_args(argv[1:])
        try:
            rec = prepare(args.versions, args.sms, args.cuda_home)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(verdict(measure_and_record(rec)))
        return 0
    parser = argparse.ArgumentParser(prog="python -m fp4lab.serving.replay",
                                     description="write the patch a model (GLM-5 unless --config) "
                                     "needs for one release x SM (or: run --versions ... --sms "
                                     "...; check --config ...)")  # fmt: skip
    parser.add_argument("--sglang", required=True, help=f"one of {', '.join(versions.VERSIONS)}")
    parser.add_argument("--sm", required=True, help=f"one of {', '.join(versions.SMS)}")
    parser.add_argument("--write-patch", required=True, metavar="DIR")
    parser.add_argument("--config", help="a config.json or its folder (default: GLM-5's)")
    args = parser.parse_args(argv)
    try:
        params.choice("--sglang", args.sglang, versions.VERSIONS)
        params.choice("--sm", args.sm, tuple(versions.SMS))
        folder = params.folder("--write-patch", args.write_patch)
        model = models.read(args.config) if args.config else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return write_patch(args.sglang, args.sm, folder, model=model)
