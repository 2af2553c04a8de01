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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fp4lab.core import evidence, params, paths, records, venvs
from fp4lab.serving import standins
from fp4lab.serving.replay import decide, env, models, patch, scan, timeline, versions

CHILD_TIMEOUT_S = 600
"""The longest a child may take per model it replays (``child.MODEL_TIMEOUT_S`` each, and the
release's import)."""
CUDA_HOME_CASES = ("unset", "/usr/local/cuda")
"""The default CUDA_HOME values of the story's replay: neither CUDA_HOME nor CUDA_PATH set (a
GPU box whose nvcc is on PATH), and a toolkit at the usual place."""


@dataclass
class VersionRun:
    """Everything measured for one SGLang release: each model's replay per SM."""

    version: str
    environment: env.CompileEnv
    calls: list[dict] = field(default_factory=list)
    by_model: dict[str, dict[str, dict]] = field(default_factory=dict)

    @property
    def replays(self) -> dict[str, dict]:
        """The replays per SM of the first model measured (GLM-5 in notebook 11)."""
        return next(iter(self.by_model.values()), {})


GLM5 = "glm-5-nvfp4"
"""The story's model in the built-in set (``models.named``)."""

LOGS = "sglang-compile/logs"
"""The children's logs and tiny checkpoints, under the build folder."""


def child(version: str, sm: str, cuda_home: list[str], mode: str, measured: list[models.Model],
          env_vars: tuple[tuple[str, str], ...] = ()) -> venvs.Child:  # fmt: skip
    """``python -m fp4lab.serving.replay.child OUT replay SM CUDA_HOMES MODE CHECKPOINT...`` in
    the release's environment, each model's tiny checkpoint written for it (``child.MODES``)."""
    names = [m.name for m in measured]
    stem = (f"{version}-sm{sm}" if names == [GLM5] else f"{names[0]}-{version}-sm{sm}"
            if len(names) == 1 else f"models-{version}-sm{sm}")  # fmt: skip
    checkpoints = [str(models.write_tiny(*m.tiny()[:2], paths.build_dir() / LOGS /
                                         f"{m.name}-{version}-sm{sm}-model")) for m in measured]  # fmt: skip
    python = env.env_dir(version) / "venv" / "bin" / "python"
    return venvs.Child(python, "fp4lab.serving.replay.child",
                       ("replay", sm, ",".join(cuda_home), mode, *checkpoints), stem,
                       f"the {names[0] + ' ' if len(names) == 1 else ''}replay of SGLang {version} "
                       f"on SM{sm}", env_vars)  # fmt: skip


def unpacked(found: dict, count: int) -> list[dict]:
    """A child's result as one replay per model it was given, each with the child's versions and
    seconds; a child that failed gives its error to each."""
    if "replays" not in found:
        return [found] * count
    shared = {k: v for k, v in found.items() if k != "replays"}
    return [{**shared, **replay} for replay in found["replays"]]


def replay_one(version: str, sm: str, model: models.Model, mode: str = "patch",
               env_vars: tuple[tuple[str, str], ...] = ()) -> dict:  # fmt: skip
    """One model's replay on one release x SM whose environment is built."""
    one = child(version, sm, list(CUDA_HOME_CASES), mode, [model], env_vars)
    [found] = venvs.run_children([one], paths.build_dir() / LOGS, CHILD_TIMEOUT_S)
    return unpacked(found, 1)[0]


SCANNED = "fp4lab-scan.json"
"""The scan of the installed release, kept in its environment (``scan.cached``)."""


def measure_versions(chosen: list[str], sms: list[str], cuda_home: list[str],
                     progress: Callable[[str], object] = print,
                     measured: list[models.Model] | None = None,
                     mode: str = "chain") -> list[VersionRun]:  # fmt: skip
    """Each release's environment built or reused and its source scanned, in turn, while the
    replays of the releases before it already run: one child per (release, SM) in one pool, one
    per core at once, so no core waits while a release's last SM runs alone. Each child imports
    the release once and replays every model (GLM-5 unless ``measured`` names models) in a fork
    of itself; ``mode`` is what each walks (``child.MODES``: in ``chain``, GLM-5 alone on the
    story's SM of the story's release also walks the story's patch and each CUDA_HOME). A
    release whose environment failed has no replays."""
    runs: list[VersionRun] = []
    jobs: list[tuple[VersionRun, str]] = []
    measured = measured or [models.named(GLM5)]
    story = mode == "chain" and [m.name for m in measured] == [GLM5]

    def prepared() -> Iterator[venvs.Child]:
        for version in chosen:
            compile_env = env.ensure_env(version)  # its environment says one line (core.venvs)
            if compile_env.error:
                progress(
                    f"sglang=={version}: environment {compile_env.status}: {compile_env.error}"
                )
            run = VersionRun(version, compile_env)
            runs.append(run)
            if not compile_env.ok:
                continue
            package = standins.site_packages(str(compile_env.python)) / "sglang"
            run.calls = scan.cached(package, env.env_dir(version) / "venv" / SCANNED)
            for sm in sms:
                jobs.append((run, sm))
                walks = ("story" if story and (version, sm) == (versions.STORY_VERSION,
                                                                 versions.STORY_SM) else mode)  # fmt: skip
                yield child(version, sm, cuda_home, walks, measured)

    def shown(one: venvs.Child, found: dict) -> None:
        for name, replay in zip(
            [m.name for m in measured], unpacked(found, len(measured)), strict=True
        ):
            fixed = replay.get("fix", {})
            what = replay.get("error") or replay.get("build_error") or (
                f"runner not driven: {replay['not_driven']}" if replay.get("not_driven") else
                f"patch {fixed.get('parts')}, compiles {fixed.get('compiles')}")  # fmt: skip
            progress(f"  {one.label}{f', {name}' if len(measured) > 1 else ''}: {what}")

    found = venvs.run_children(prepared(), paths.build_dir() / LOGS,
                               CHILD_TIMEOUT_S * len(measured), shown)  # fmt: skip
    for (run, sm), result in zip(jobs, found, strict=True):
        for model, replay in zip(measured, unpacked(result, len(measured)), strict=True):
            run.by_model.setdefault(model.name, {})[sm] = replay
    return runs


def check_cuda_home(cuda_home: list[str] | tuple[str, ...] | str) -> list[str]:
    """CUDA_HOME values as given: ``unset`` or an absolute path, each once."""
    values = params.items("cuda_home", cuda_home, "unset, /usr/local/cuda")
    wrong = [v for v in values if v != "unset" and not v.startswith("/")]
    if wrong:
        raise ValueError(f"cuda_home contains {wrong[0]!r}; allowed values: 'unset' or an "
                         f"absolute path such as /usr/local/cuda")  # fmt: skip
    return values


def prepare(sglang_versions: list[str] | str, sms: list[str] | str,
            cuda_home: list[str] | str = CUDA_HOME_CASES) -> records.Recorder:  # fmt: skip
    """Notebook 11's validation (before any install): releases, SMs and CUDA_HOME values."""
    return records.Recorder(
        "11_sglang_piecewise_replay",
        {
            "sglang_versions": versions.check_versions(sglang_versions),
            "sms": versions.check_sms(sms),
            "cuda_home": check_cuda_home(cuda_home),
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
        rows.append(decide.cell(run.version, sm, replay, run.calls))
    return rows


def measure_and_record(rec: records.Recorder, extra: tuple[str, ...] = ()) -> list[dict]:
    """Every release measured (``measure_versions``; a failed one recorded, the others go on); the
    decision table's rows recorded as "decision" and the "summary"."""
    rows: list[dict] = []
    chosen = versions.check_versions(rec.params["sglang_versions"], extra)
    runs = measure_versions(chosen, rec.params["sms"], rec.params["cuda_home"])
    for run in runs:
        rows += record_version(rec, run)
    for row in rows:
        rec.add("decision", row, target=_target(row["sm"]))
    story = [
        r.replays.get(versions.STORY_SM, {}) for r in runs if r.version == versions.STORY_VERSION
    ]
    chain = story[0].get("chain") if story else None
    rec.summary(**{
        "status": "measured" if any(r["outcome"] in ("blocked", "compiles") for r in rows)
        else "not measured",
        "headline": verdict(rows),
        **decide.decision(rows),
        "needs": "cpu",
        "versions_measured": [r.version for r in runs if r.environment.ok],
        "versions_failed": {r.version: r.environment.error for r in runs if not r.environment.ok},
        "story_blockers_0_5_9": decide.blockers(chain) if chain else None,
        "sm120_specific_0_5_9": decide.sm120_specific(rows, versions.STORY_VERSION),
        "by_version": decide.compact(rows),
        "timeline": timeline.timeline(rows),
        "not_measured_harness": {f"{r['sglang_version']} SM{r['sm']}": r["note"]
                                 for r in rows if r["outcome"] == "not measured"},
        "evidence": evidence.of_values(rows),
    })  # fmt: skip
    return rows


def verdict(rows: list[dict]) -> str:
    """One line per (release, SM): outcome, blockers, patch, MoE path, the option a GLM-5 user
    passes."""
    lines = [f"SGLang {r['sglang_version']} SM{r['sm']}: {decide._what(r)}; MoE: {r['moe']}; "
             f"GLM-5 flag: {r['flag']}" for r in rows]  # fmt: skip
    lines += [timeline.sentence(rows, sm) for sm in dict.fromkeys(r["sm"] for r in rows)]
    specific = decide.sm120_specific(rows, versions.STORY_VERSION)
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
    found = replay_one(version, sm, model)
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
