"""fullgraph=False under SGLang's own piecewise backend, per release: what a step returns.

Each release's environment (``serving.replay.env``) runs ``sglang_backend`` on notebook 04's
stack, and ``model_capture`` on the release's own GLM-5 through its own runner; their rows become
"sglang_backend" and "sglang_model_capture" records, a release a drive could not run a
"..._not_measured" record naming why. ``decision`` turns them into the notebook's verdict: WRONG
OUTPUT where the captured step under fullgraph=False differs from the same compile run uncaptured
while the custom op's equals it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fp4lab.core import evidence, params, paths, records, venvs
from fp4lab.serving.capture import bundled
from fp4lab.serving.replay import env, versions
from fp4lab.serving.replay.pool import GLM5
from fp4lab.serving.replay.shared import models

DEFAULT_VERSIONS = ("0.5.9", "0.5.12", "0.5.21")
"""The story's release, the last of the first runner family and the tc_piecewise backend's."""

CHILD_TIMEOUT_S = 600


def releases(sglang_versions: list[str] | str) -> list[str]:
    """The releases asked for, checked (each of ``versions.VERSIONS``, or ``all``)."""
    return versions.check_versions(sglang_versions)


def model_sm(value: str) -> str:
    """The SM the release's own GLM-5 is captured on, checked (one of ``versions.SMS``)."""
    params.choice("model_sm", value, tuple(versions.SMS))
    return value


def levels(capture: str, target: bool = False) -> list[str]:
    """What a drive's rows reached: traced (on a simulated target SM with ``target``), the
    reference kernels, capture imitated or real."""
    return evidence.check(
        ["trace", *(["simulated_target"] if target else []), "reference_kernel",
         "simulated_capture" if capture == "simulated" else "cuda_graph_replay"]
    )  # fmt: skip


def measure(rec: records.Recorder, scale: int, layers: int, sizes: list[int]) -> list[dict]:
    """SGLang's own backend on the layer stack (``sglang_backend``) in every release of
    ``rec.params["sglang_versions"]``, one release per core at once (the next release's
    environment is built while the children run); every row recorded, the measured ones
    returned."""
    logs = paths.build_dir() / "logs" / rec.notebook
    logs.mkdir(parents=True, exist_ok=True)
    ready: list[env.CompileEnv] = []

    def children() -> Iterator[venvs.Child]:
        for version in versions.check_versions(rec.params["sglang_versions"]):
            built = bundled.environment(version) or env.ensure_env(version)  # says one line
            if not built.ok:
                rec.add("sglang_backend_not_measured",
                        {"sglang_version": version, "why": f"environment: {built.error}"})  # fmt: skip
                continue
            print(f"SGLang {version}: its piecewise backend on {layers} layers ...", flush=True)
            ready.append(built)
            yield venvs.Child(
                built.python, "fp4lab.serving.capture.sglang_backend",
                (str(scale), str(layers), ",".join(map(str, sizes))), f"capture-{version}",
                f"SGLang {version}'s piecewise backend", built.child_env,
            )  # fmt: skip

    def done(child: venvs.Child, found: dict) -> None:
        print(f"  {child.label}: {found.get('error') or 'measured'}", flush=True)

    found_all = venvs.run_children(children(), logs, CHILD_TIMEOUT_S, done)  # fills ``ready``
    rows = []
    for built, found in zip(ready, found_all, strict=True):
        packages = {"sglang": built.version, **built.installed}
        why = found.get("unsplittable") or found.get("error")
        if why or not found.get("rows"):
            rec.add("sglang_backend_not_measured",
                    {"sglang_version": built.version, "why": why or "no rows",
                     "harness": "unsplittable" not in found}, packages=packages)  # fmt: skip
            continue
        common = {"sglang_version": built.version, "capture": found["capture"],
                  "contexts": found["contexts"], "standins": found["standins"],
                  "environment_standins": [s["name"] for s in built.standins],
                  "evidence": levels(found["capture"])}  # fmt: skip
        for row in found["rows"]:
            rows.append(rec.add("sglang_backend", {**common, **row}, packages=packages)["values"])
    return rows


MODEL_LAYERS = 4
"""Decoder layers of the tiny GLM-5 the runner captures: the dense one and three MoE layers, so
that layers of one kind can share a graph (the replay's own has two)."""

MODEL_TIMEOUT_S = 900


def model_checkpoint() -> Path:
    """The replay's tiny GLM-5 with ``MODEL_LAYERS`` layers, written under build/."""
    config, quant, _ = models.named(GLM5).tiny()
    folder = paths.build_dir() / "sglang-compile" / "logs" / f"{GLM5}-{MODEL_LAYERS}-layers"
    return models.write_tiny({**config, "num_hidden_layers": MODEL_LAYERS}, quant, folder)


def measure_model(rec: records.Recorder, sm: str) -> list[dict]:
    """The release's own GLM-5 through its own runner, captured and replayed
    (``model_capture``), in every release of ``rec.params["sglang_versions"]`` at ``sm``, one
    release per core at once; every row recorded, the measured ones returned."""
    if bundled.offline():
        rec.skip("sglang_model_capture", "the offline GPU bundle carries SGLang's backend on the "
                 "layer stack only; the release's GLM-5 is built by the replay, on a CPU, from "
                 "the model folders and with the CPU kernels the bundle does not carry")  # fmt: skip
        return []
    logs = paths.build_dir() / "logs" / rec.notebook
    logs.mkdir(parents=True, exist_ok=True)
    ready, rows = [], []
    for version in versions.check_versions(rec.params["sglang_versions"]):
        built = env.ensure_env(version)
        if not built.ok:
            rec.add("sglang_model_capture_not_measured",
                    {"sglang_version": version, "sm": sm, "why": f"environment: {built.error}"})  # fmt: skip
            continue
        ready.append(built)
    if not ready:
        return rows
    checkpoint = str(model_checkpoint())  # from models/, which the GPU bundle does not carry
    children = [(built, venvs.Child(
        built.python, "fp4lab.serving.capture.model_capture", (sm, checkpoint),
        f"model-capture-{built.version}-sm{sm}", f"SGLang {built.version}'s runner on its GLM-5"))
        for built in ready]  # fmt: skip
    print(f"SGLang's own GLM-5 ({MODEL_LAYERS} layers) through its runner, captured, at SM{sm}: "
          f"{', '.join(b.version for b, _ in children)} ...", flush=True)  # fmt: skip

    def done(child: venvs.Child, found: dict) -> None:
        print(f"  {child.stem}: {found.get('error') or 'measured'}", flush=True)

    found_all = venvs.run_children([c for _, c in children], logs, MODEL_TIMEOUT_S, done)
    for (built, _), found in zip(children, found_all, strict=True):
        packages = {"sglang": built.version, **built.installed}
        if found.get("error") or not found.get("rows"):
            rec.add("sglang_model_capture_not_measured",
                    {"sglang_version": built.version, "sm": sm, "why": found.get("error", "no rows"),
                     "harness": True}, packages=packages)  # fmt: skip
            continue
        common = {"sglang_version": built.version, "sm": sm, "model": GLM5,
                  "layers": MODEL_LAYERS, "capture": found["capture"], "standins": found["standins"],
                  "evidence": levels(found["capture"], target=True)}  # fmt: skip
        for row in found["rows"]:
            if "not_measured" in row:
                print(f"  {built.version} {row['variant']}: not measured: {row['not_measured']}")
                rec.add("sglang_model_capture_not_measured", {**common, **row}, packages=packages)
                continue
            rows.append(
                rec.add("sglang_model_capture", {**common, **row}, packages=packages)["values"]
            )
    return rows


def _of(rows: list[dict], variant: str) -> list[dict]:
    return [r for r in rows if r["variant"] == variant]


def _model_number(model_rows: list[dict]) -> str:
    """The GLM-5 drive's deciding numbers: the worst replay, each replay SGLang refused, or why
    there are none."""
    breaks = _of(model_rows, "fullgraph_false")
    compared = [r for r in breaks if "max_abs_vs_uncaptured" in r]
    refused = [r for r in breaks if "replay_error" in r]
    if not compared and not refused:
        return "the release's own GLM-5 through its runner: not measured"
    said = []
    if compared:
        worst = max(compared, key=lambda r: r["max_abs_vs_uncaptured"])
        where = ", ".join(sorted({r["sglang_version"] for r in compared}, key=versions.order))
        said.append(f"SGLang {where}, SM{worst['sm']}: by up to {worst['max_abs_vs_uncaptured']:.3g} "
                    f"(logits up to {worst['max_abs_eager']:.3g})")  # fmt: skip
    said += [f"SGLang {r['sglang_version']}, SM{r['sm']}: its replayed forward fails in SGLang's "
             f"own code ({r['replay_error'].split(' [at ')[0]}; {r['graphs_first_compiled_in_capture']} "
             f"graphs were first compiled in the capture pass)" for r in refused]  # fmt: skip
    unfixed = "" if _of(model_rows, "custom_op") else ", its custom op not measured"
    return f"the release's own GLM-5 through its runner: {'; '.join(said)}{unfixed}"


def decision(rows: list[dict], asked: list[str], model_rows: list[dict] = ()) -> dict:
    """The verdict, its number and why, from the rows of every release asked for: the story's
    stack (``rows``) and the release's own GLM-5 (``model_rows``)."""
    model_rows = list(model_rows)
    measured = sorted({r["sglang_version"] for r in rows}, key=versions.order)
    missing = [v for v in asked if v not in measured]
    breaks, fixed = _of(rows, "fullgraph_false"), _of(rows, "custom_op")
    if not breaks or not fixed:
        return dict(
            verdict="UNMEASURED",
            number=f"no release measured of {', '.join(asked)}",
            why="SGLang's own backend could not be driven; see the not-measured records",
        )
    everything = [*rows, *(r for r in model_rows if "max_abs_vs_uncaptured" in r)]
    breaks, fixed = _of(everything, "fullgraph_false"), _of(everything, "custom_op")
    worst = max(_of(rows, "fullgraph_false"), key=lambda r: r["max_abs_vs_uncaptured"])
    fixed_worst = max(r["max_abs_vs_uncaptured"] for r in fixed)
    shared = sorted({f"graph {e['graph']} {e['piece']}" for r in _of(rows, "fullgraph_false")
                     for e in r["replays_of_another_layer"]})  # fmt: skip
    asserted = [r["debug_mode"] for r in breaks if r.get("debug_mode", {}).get("assertion")]
    how = "capture imitated on a CPU" if worst["capture"] == "simulated" else "real CUDA graphs"
    coverage = f"SGLang {', '.join(measured)}" + (
        f" (not measured: {', '.join(missing)})" if missing else ""
    )
    number = (
        f"fullgraph=False: the replayed step differs from the same compile run uncaptured by up to "
        f"{worst['max_abs_vs_uncaptured']:.3g} (eager outputs up to {worst['max_abs_eager']:.3g}); "
        f"{_model_number(model_rows)}; custom op: {fixed_worst:.3g}"
    )
    debug = f"{asserted[0]['assertion']} ({asserted[0]['during']})" if asserted else "no assertion"
    detail = (
        f"under {coverage}'s own install_torch_compiled, SGLangBackend and CUDAPiecewiseBackend "
        f"({how}): pieces replaying a capture made for another layer: {', '.join(shared) or 'none'}; "
        f"SGLang's debug mode: {debug}"
    )
    if fixed_worst != 0.0:
        return dict(
            verdict="FAILED",
            number=number,
            why=f"the custom op's captured step should equal its uncaptured one; {detail}",
        )
    refused = [r for r in model_rows if "replay_error" in r]
    if any(r["variant"] == "custom_op" for r in refused):
        return dict(verdict="FAILED", number=number,
                    why=f"SGLang refused the custom op's replayed forward; {detail}")  # fmt: skip
    if not refused and all(r["max_abs_vs_uncaptured"] == 0.0 for r in breaks):
        return dict(verdict="WORKS", number=number, why=f"both variants replay correctly {detail}")
    return dict(verdict="WRONG OUTPUT", number=number,
                why=f"a graph after a break is shared by every layer of a class, so its pieces "
                f"replay one layer's capture for all of them; {detail}")  # fmt: skip
