"""What a break of the breakable prefill graph costs, per release (``breakable_timing``, run in
the release's environment or, in the offline GPU bundle, on the bundle's release with the
breakable release's own files).

Each release's rows become "breakable_break_cost" records; a release the harness could not run a
"breakable_break_cost_not_measured" one, and a release without the capture a
"breakable_break_cost_not_applicable" one. Children run one at a time, so that a timed capture
has the GPU to itself. ``fit`` turns a release's timed rows into the cost of one break, the slope
of replay time over the number of breaks, recorded as "breakable_break_cost_fit".
"""

from __future__ import annotations

import pandas as pd

from fp4lab.core import evidence, params, paths, probe, records, venvs
from fp4lab.serving.capture import bundled
from fp4lab.serving.replay import env, versions

KIND = "breakable_break_cost"
CHILD_TIMEOUT_S = 600
UPSTREAM_IDLE_US = 590
"""sglang#35851: GPU idle per layer break in prefill, SGLang 0.5.16 on one H200, a 40-layer
hybrid model whose breaks run its attention and metadata work (not the mechanism alone)."""


def releases(value: list[str] | str) -> list[str]:
    """The releases ``break_releases`` asks for: each of ``versions.VERSIONS``, or ``all`` (every
    release; in the offline bundle, those it carries the breakable capture of)."""
    allowed = f"{versions.ALL}, {', '.join(versions.VERSIONS)}"
    asked = params.items("break_releases", value, allowed)
    if asked == [versions.ALL]:
        return bundled.breakable_releases() if bundled.offline() else list(versions.VERSIONS)
    params.choices("break_releases", asked, versions.VERSIONS)
    return asked


def shape(value: list[int]) -> list[int]:
    """``break_shape`` checked: [tokens, hidden, layers], each a positive integer."""
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(f"break_shape={value!r} must be [tokens, hidden, layers]")
    params.positive_list("break_shape", list(value))
    return list(value)


def break_counts(value: list[int], layers: int) -> list[int]:
    """``break_counts`` checked: a list of distinct counts, each 0..``layers``."""
    params.choices("break_counts", value, range(layers + 1))
    if len(set(value)) != len(value):
        raise ValueError(f"break_counts={value!r} repeats a count; give each once")
    return sorted(value)


def _where(version: str) -> tuple[env.CompileEnv | None, str, str]:
    """The environment that runs the release's capture, the child's folder argument ("-":
    installed there), and why not (a reason; "n/a: ..." when the release has no such capture)."""
    if bundled.offline():
        folder = bundled.breakable_files(version)
        if folder is None:
            return None, "", (f"n/a: the bundle carries no breakable capture of SGLang {version} "
                              f"(its wheel has none, read when the bundle was built)")  # fmt: skip
        built, argument = bundled.environment(bundled.RELEASE), str(folder)
    else:
        built, argument = env.ensure_env(version), "-"
    if not built.ok:
        return None, "", f"environment: {built.error}"
    if argument == "-" and not env.has_backend(version, "breakable"):
        return None, "", f"n/a: SGLang {version} has no breakable CUDA graph (no backend file)"
    return built, argument, ""


def measure(rec: records.Recorder, shape: tuple[int, int, int], counts: list[int],
            timing: tuple[int, int]) -> list[dict]:  # fmt: skip
    """The breakable capture of every release of ``rec.params["break_releases"]`` timed on
    ``shape`` (tokens, hidden, layers) at each break count; every row recorded, the measured
    ones returned."""
    logs = paths.build_dir() / "logs" / rec.notebook
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for version in releases(rec.params["break_releases"]):
        built, folder, why = _where(version)
        if built is None:
            kind = "not_applicable" if why.startswith("n/a: ") else "not_measured"
            rec.add(f"{KIND}_{kind}", {"sglang_version": version, "why": why.removeprefix("n/a: ")})
            continue
        print(
            f"SGLang {version}: its breakable capture, {len(counts)} break counts ...", flush=True
        )
        child = venvs.Child(
            built.python, "fp4lab.serving.capture.breakable_timing",
            (folder, ",".join(map(str, shape)), ",".join(map(str, counts)),
             ",".join(map(str, timing))),
            f"break-cost-{version}", f"SGLang {version}'s breakable capture", built.child_env,
        )  # fmt: skip
        found = venvs.run_child(child, logs, CHILD_TIMEOUT_S)
        packages = {"sglang": version, **built.installed}
        if bundled.offline():
            packages["sglang"] = f"{version} (breakable files), {built.version} (the rest)"
        if found.get("error") or not found.get("rows"):
            print(f"  not measured: {found.get('error', 'no rows')}", flush=True)
            rec.add(f"{KIND}_not_measured", {"sglang_version": version, "harness": True,
                    "why": found.get("error", "no rows")}, packages=packages)  # fmt: skip
            continue
        common = {key: found.get(key) for key in ("capture", "loaded_from", "files", "standins",
                                                  "device", "sm")}  # fmt: skip
        common.update(sglang_version=version, tokens=shape[0], hidden=shape[1], layers=shape[2],
                      environment_standins=[s["name"] for s in built.standins],
                      evidence=evidence.check(["simulated_capture" if found["capture"] ==
                                               "simulated" else "cuda_graph_replay"]))  # fmt: skip
        own = [
            rec.add(KIND, {**common, **row}, packages=packages)["values"] for row in found["rows"]
        ]
        cost = fit(own)
        if cost is not None:
            rec.add(f"{KIND}_fit", {**common, **cost, "replays_equal_eager": all(map(works, own))},
                    packages=packages)  # fmt: skip
        rows += own
        print(f"  {summary(rows, version)}", flush=True)
    if any(r["capture"] == "simulated" for r in rows):
        missing = probe.machine().missing("gpu") or (
            "the releases' environments hold a CPU build of torch (the offline GPU bundle runs "
            "their capture on the machine's own)"
        )
        rec.skip("breakable_break_cost_timing", f"{missing}; a break's cost is GPU time: the "
                 "capture was imitated and nothing was timed")  # fmt: skip
    return rows


def works(row: dict) -> bool:
    """Whether a replay equals eager and ran each break once (a bf16 rounding allowed)."""
    if row["variant"] == "eager":
        return True
    close = row["max_abs_diff"] <= 2**-7 * max(row["max_abs_expected"], 1e-30)
    return close and row["eager_calls_per_replay"] == (
        row["breaks"] if row["variant"] == "breakable" else 0
    )


def fit(rows: list[dict]) -> dict | None:
    """The cost of one break from one release's timed breakable rows: the least-squares slope of
    replay time over breaks (µs per break) and its intercept (ms), or None when untimed or
    fewer than two counts."""
    points = [(r["breaks"], r["replay_ms"]) for r in rows
              if r["variant"] == "breakable" and r.get("replay_ms") is not None]  # fmt: skip
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mean_b, mean_t = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / sum(
        (b - mean_b) ** 2 for b, _ in points
    )
    return {"us_per_break": slope * 1e3, "intercept_ms": mean_t - slope * mean_b, "points": n}


def summary(rows: list[dict], version: str) -> str:
    """One release in one line: replays equal to eager, segments, and the cost per break."""
    own = [r for r in rows if r["sglang_version"] == version and r["variant"] != "eager"]
    bad = [f"{r['variant']} {r['breaks']}" for r in own if not works(r)]
    most = max((r for r in own if r["variant"] == "breakable"), key=lambda r: r["breaks"])
    said = (f"SGLang {version}: {len(own) - len(bad)} of {len(own)} replays equal eager"
            + (f" (not: {', '.join(bad)})" if bad else "")
            + f"; {most['breaks']} breaks made {most['segments']} segments")  # fmt: skip
    cost = fit(own)
    if cost is None:
        return f"{said}; cost per break not timed ({own[0]['capture']} capture)"
    return (
        f"{said}; {cost['us_per_break']:.1f} µs per break on {own[0]['device']} "
        f"(sglang#35851: ~{UPSTREAM_IDLE_US} µs of idle GPU per break, breaks doing real work)"
    )


def table(rows: list[dict]) -> pd.DataFrame:
    """Each replay: release, variant, breaks, segments, whether it equals eager, and its times
    where it was timed (eager's "equals eager" is blank: it is the reference)."""
    columns = {"sglang_version": "release", "variant": "variant", "breaks": "breaks",
               "segments": "segments", "replay_ms": "replay ms", "capture_ms": "capture ms"}  # fmt: skip
    if not any(r.get("replay_ms") is not None for r in rows):
        columns = {k: c for k, c in columns.items() if not k.endswith("_ms")}
    frame = pd.DataFrame(
        [{**{c: r.get(k) for k, c in columns.items()},
          "equals eager": "" if r["variant"] == "eager" else works(r)} for r in rows],
        columns=[*columns.values(), "equals eager"],
    )  # fmt: skip
    return frame.astype(object).where(frame.notna(), "")


def lines(rows: list[dict]) -> list[str]:
    """``summary`` for every release with rows, oldest first."""
    found = sorted({r["sglang_version"] for r in rows}, key=versions.order)
    return [summary(rows, version) for version in found]
