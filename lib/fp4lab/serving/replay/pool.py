"""The replay pool of notebooks 11 and 14: for each SGLang release x SM, one child in the
release's environment that imports the release once and walks each (model, walk) asked of it in
a fork of its own (``child.MODES``); every replay kept (``kept``) and taken again, not replayed,
wherever nothing it was measured from changed.

Notebook 11 asks for GLM-5's chain (the story's, on the story's release and SM) and its patch
walk, and, in the same children, the patch walk of each model notebook 14 replays
(``alongside``): each release is imported once for both notebooks, and notebook 14 finds its
replays kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from fp4lab.core import paths, venvs
from fp4lab.core.progress import say
from fp4lab.serving import standins
from fp4lab.serving.replay import env, kept, scan, versions
from fp4lab.serving.replay.shared import breakable_outcome, flags, models

CHILD_TIMEOUT_S = 600
"""The longest a child may take per walk it runs (``child.MODEL_TIMEOUT_S`` each, and the
release's import)."""
CUDA_HOME_CASES = ("unset", "/usr/local/cuda")
"""The default CUDA_HOME values of the story's replay: neither CUDA_HOME nor CUDA_PATH set (a
GPU box whose nvcc is on PATH), and a toolkit at the usual place."""
GLM5 = "glm-5-nvfp4"
"""The story's model in the built-in set (``models.named``)."""
LOGS = "sglang-compile/logs"
"""The children's logs and tiny checkpoints, under the build folder."""
SCANNED = "fp4lab-scan.json"
"""The scan of the installed release, kept in its environment (``scan.cached``)."""

Walk = tuple[models.Model, str]
"""A model and what its fork walks (``child.MODES``)."""


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


def child(version: str, sm: str, cuda_home: list[str], walks: list[Walk],
          env_vars: tuple[tuple[str, str], ...] = ()) -> venvs.Child:  # fmt: skip
    """``python -m fp4lab.serving.replay.release.child OUT replay SM CUDA_HOMES MODES CHECKPOINT...`` in
    the release's environment, each model's tiny checkpoint written for it."""
    names = list(dict.fromkeys(m.name for m, _ in walks))
    stem = (f"{version}-sm{sm}" if names == [GLM5] else f"{names[0]}-{version}-sm{sm}"
            if len(names) == 1 else f"models-{version}-sm{sm}")  # fmt: skip
    written = {m.name: str(models.write_tiny(*m.tiny()[:2], paths.build_dir() / LOGS /
                                             f"{m.name}-{version}-sm{sm}-model")) for m, _ in walks}  # fmt: skip
    python = env.env_dir(version) / "venv" / "bin" / "python"
    return venvs.Child(python, "fp4lab.serving.replay.release.child",
                       ("replay", sm, ",".join(cuda_home), ",".join(w for _, w in walks),
                        *(written[m.name] for m, _ in walks)), stem,
                       f"the {names[0] + ' ' if len(names) == 1 else ''}replay of SGLang {version} "
                       f"on SM{sm}", env_vars)  # fmt: skip


def unpacked(found: dict, count: int) -> list[dict]:
    """A child's result as one replay per walk it was given, each with the child's versions and
    seconds; a child that failed gives its error to each."""
    if "replays" not in found:
        return [found] * count
    shared = {k: v for k, v in found.items() if k != "replays"}
    return [{**shared, **replay} for replay in found["replays"]]


def replay_one(version: str, sm: str, model: models.Model,
               env_vars: tuple[tuple[str, str], ...] = (), walk: str = "patch") -> dict:  # fmt: skip
    """One model's walk (the patch walk unless told) on one release x SM whose environment is
    built, run now."""
    one = child(version, sm, list(CUDA_HOME_CASES), [(model, walk)], env_vars)
    [found] = venvs.run_children([one], paths.build_dir() / LOGS, CHILD_TIMEOUT_S)
    return unpacked(found, 1)[0]


def walks(version: str, sm: str, measured: list[models.Model], mode: str,
          alongside: list[models.Model], graphs: tuple[str, ...] = ()) -> list[Walk]:  # fmt: skip
    """What one release x SM's child walks: each measured model's patch walk and, in ``chain``
    mode, its chain (the story's for GLM-5 on the story's release and SM); the patch walk of
    each model ``alongside``; every model's capture of each prefill graph in ``graphs`` (those
    of ``flags.CAPTURED`` whose backend the release has)."""
    story = (version, sm) == (versions.STORY_VERSION, versions.STORY_SM)
    chains = [(m, "story" if story and m.name == GLM5 else "chain")
              for m in measured if mode == "chain"]  # fmt: skip
    patched = [(m, "patch") for m in [*measured, *alongside]]
    captured = [(m, graph) for graph in graphs for m in [*measured, *alongside]]
    return list({(m.name, w): (m, w) for m, w in [*chains, *patched, *captured]}.values())


def merged(patched: dict, chained: dict | None) -> dict:
    """A model's replay: its patch walk, with the chain (and the CUDA_HOME cases) of its chain
    walk; a chain walk that failed where the patch walk ran makes the replay not measured."""
    if chained is None:
        return patched
    found = patched | {k: chained[k] for k in ("chain", "cuda_home") if k in chained}
    for failure in ("error", "harness_error"):
        if failure in chained and not any(k in patched for k in ("error", "harness_error")):
            found[failure] = chained[failure]
    return found


@dataclass
class _Job:
    run: VersionRun
    sm: str
    keys: dict[tuple[str, str], str]
    found: dict[tuple[str, str], dict]
    missing: list[Walk]


def measure_versions(chosen: list[str], sms: list[str], cuda_home: list[str],
                     progress: Callable[[str], object] = say,
                     measured: list[models.Model] | None = None, mode: str = "chain",
                     alongside: list[models.Model] | None = None,
                     fresh: bool = False) -> list[VersionRun]:  # fmt: skip
    """Each release's environment built or reused and its source scanned, in turn, while the
    replays of the releases before it already run: one child per (release, SM) in one pool, one
    per core at once, for the walks (``walks``) not kept from an earlier run. ``measured``
    (GLM-5 unless given) are the models whose replays are returned; ``alongside`` are walked and
    kept for another notebook; ``fresh`` replays every walk, taking none kept (the benchmarks
    time replays). A release whose environment failed has no replays."""
    runs: list[VersionRun] = []
    jobs: list[_Job] = []
    asked_of: dict[str, _Job] = {}
    measured = measured or [models.named(GLM5)]

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
            graphs = tuple(g for g in flags.CAPTURED if env.has_backend(version, g))
            for sm in sms:
                job = _Job(run, sm, {}, {}, [])
                for m, w in walks(version, sm, measured, mode, alongside or [], graphs):
                    job.keys[m.name, w] = kept.key(compile_env, m, w, cuda_home)
                    got = None if fresh else kept.taken(version, sm, m, w, job.keys[m.name, w])
                    job.missing += [] if got else [(m, w)]
                    job.found |= {(m.name, w): got} if got else {}
                jobs.append(job)
                if job.missing:
                    one = child(version, sm, cuda_home, job.missing)
                    asked_of[one.stem] = job
                    yield one
                else:
                    progress(f"  SGLang {version} on SM{sm}: {len(job.found)} replays kept "
                             f"from an earlier run of the same code and environment")  # fmt: skip

    def finished(one: venvs.Child, found: dict) -> None:
        """Each walk's replay kept as soon as its child ends, and said in one line."""
        job = asked_of[one.stem]
        named = len({m.name for m, _ in job.missing}) > 1  # else the child's label names it
        for (m, walk), replay in zip(job.missing, unpacked(found, len(job.missing)), strict=True):
            kept.keep(job.run.version, job.sm, m, walk, job.keys[m.name, walk], replay)
            job.found[m.name, walk] = replay
            fixed = replay.get("fix", {})
            what = replay.get("error") or replay.get("build_error") or (
                f"runner not driven: {replay['not_driven']}" if replay.get("not_driven") else
                breakable_outcome.outcome(replay, walk)[0] if walk in flags.CAPTURED else
                f"chain of {len(replay.get('chain', []))} steps" if walk != "patch" else
                f"patch {fixed.get('parts')}, compiles {fixed.get('compiles')}")  # fmt: skip
            progress(f"  {one.label}, {f'{m.name} ' if named else ''}{walk}: {what}")

    venvs.run_children(prepared(), paths.build_dir() / LOGS,
                       CHILD_TIMEOUT_S * (len(measured) * 2 + len(alongside or []))
                       * (1 + len(flags.CAPTURED)), finished)  # fmt: skip
    for job in jobs:
        for m in measured:
            chained = next((r for (n, w), r in job.found.items()
                            if n == m.name and w not in ("patch", *flags.CAPTURED)), None)  # fmt: skip
            captured = {f"{g}_walk": job.found[m.name, g] for g in flags.CAPTURED
                        if (m.name, g) in job.found}  # fmt: skip
            job.run.by_model.setdefault(m.name, {})[job.sm] = {
                **merged(job.found[m.name, "patch"], chained),
                **captured,
            }
    return runs
