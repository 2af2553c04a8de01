"""fullgraph=False under SGLang's own piecewise backend, per release: what a step returns.

Each release's environment (``serving.replay.env``) runs ``sglang_backend`` on notebook 04's
stack; its rows become "sglang_backend" records, a release the drive could not run an
"sglang_backend_not_measured" record naming why. ``decision`` turns them into the notebook's
verdict: WRONG OUTPUT where the captured step under fullgraph=False differs from the same
compile run uncaptured while the custom op's equals it.
"""

from __future__ import annotations

from fp4lab.core import evidence, paths, records, venvs
from fp4lab.serving.replay import env, versions

DEFAULT_VERSIONS = ("0.5.9", "0.5.12", "0.5.21")
"""The story's release, the last of the first runner family and the tc_piecewise backend's."""

CHILD_TIMEOUT_S = 600


def releases(sglang_versions: list[str] | str) -> list[str]:
    """The releases asked for, checked (each of ``versions.VERSIONS``, or ``all``)."""
    return versions.check_versions(sglang_versions)


def levels(capture: str) -> list[str]:
    """What a drive's rows reached: traced, the reference quantize, capture imitated or real."""
    return evidence.check(
        ["trace", "reference_kernel", "simulated_capture" if capture == "simulated"
         else "cuda_graph_replay"]
    )  # fmt: skip


def measure(rec: records.Recorder, scale: int, layers: int, sizes: list[int]) -> list[dict]:
    """Every release of ``rec.params["sglang_versions"]`` driven in turn; its rows recorded."""
    rows = []
    logs = paths.build_dir() / "logs" / rec.notebook
    logs.mkdir(parents=True, exist_ok=True)
    for version in versions.check_versions(rec.params["sglang_versions"]):
        built = env.ensure_env(version)  # its environment says one line (core.venvs)
        if not built.ok:
            rec.add(
                "sglang_backend_not_measured",
                {"sglang_version": version, "why": f"environment: {built.error}"},
            )
            continue
        print(f"SGLang {version}: its piecewise backend on {layers} layers ...", flush=True)
        child = venvs.Child(
            built.python, "fp4lab.serving.capture.sglang_backend",
            (str(scale), str(layers), ",".join(map(str, sizes))), f"capture-{version}",
            f"SGLang {version}'s piecewise backend",
        )  # fmt: skip
        found = venvs.run_child(child, logs, CHILD_TIMEOUT_S)
        packages = {"sglang": version, **built.installed}
        why = found.get("unsplittable") or found.get("error")
        if why or not found.get("rows"):
            rec.add("sglang_backend_not_measured",
                    {"sglang_version": version, "why": why or "no rows",
                     "harness": "unsplittable" not in found}, packages=packages)  # fmt: skip
            continue
        common = {"sglang_version": version, "capture": found["capture"],
                  "contexts": found["contexts"], "standins": found["standins"],
                  "evidence": levels(found["capture"])}  # fmt: skip
        for row in found["rows"]:
            rows.append(rec.add("sglang_backend", {**common, **row}, packages=packages)["values"])
    return rows


def _of(rows: list[dict], variant: str) -> list[dict]:
    return [r for r in rows if r["variant"] == variant]


def decision(rows: list[dict], asked: list[str]) -> dict:
    """The verdict, its number and why, from the rows of every release asked for."""
    measured = sorted({r["sglang_version"] for r in rows}, key=versions.order)
    missing = [v for v in asked if v not in measured]
    breaks, fixed = _of(rows, "fullgraph_false"), _of(rows, "custom_op")
    if not breaks or not fixed:
        return dict(
            verdict="UNMEASURED",
            number=f"no release measured of {', '.join(asked)}",
            why="SGLang's own backend could not be driven; see the not-measured records",
        )
    worst = max(breaks, key=lambda r: r["max_abs_vs_uncaptured"])
    fixed_worst = max(r["max_abs_vs_uncaptured"] for r in fixed)
    shared = sorted({f"graph {e['graph']} {e['piece']}" for r in breaks
                     for e in r["replays_of_another_layer"]})  # fmt: skip
    asserted = [r["debug_mode"] for r in breaks if r.get("debug_mode", {}).get("assertion")]
    how = "capture imitated on a CPU" if worst["capture"] == "simulated" else "real CUDA graphs"
    coverage = f"SGLang {', '.join(measured)}" + (
        f" (not measured: {', '.join(missing)})" if missing else ""
    )
    number = (
        f"fullgraph=False: the replayed step differs from the same compile run uncaptured by up to "
        f"{worst['max_abs_vs_uncaptured']:.3g} (eager outputs up to {worst['max_abs_eager']:.3g}); "
        f"custom op: {fixed_worst:.3g}"
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
    if worst["max_abs_vs_uncaptured"] == 0.0:
        return dict(verdict="WORKS", number=number, why=f"both variants replay correctly {detail}")
    return dict(verdict="WRONG OUTPUT", number=number,
                why=f"a graph after a break is shared by every layer of a class, so its pieces "
                f"replay one layer's capture for all of them; {detail}")  # fmt: skip
