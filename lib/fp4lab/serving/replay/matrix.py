"""Notebook 14's calls: every model of the built-in set (``models/``) through every SGLang
release's piecewise runner on each simulated SM, and the model x release answer per SM.

The replay is notebook 11's pool (``pool.measure_versions``: one child per release and SM, each
importing its release once and walking every model in a fork of itself), each model's patch walk
(the eager pass and the user's patch; the story's chain is notebook 11's), taken from notebook
11's children where they walked it alongside and nothing changed since (``kept``). Each (model,
release, SM) becomes one "decision" record with the model, its blocker frames and dynamo's
graph-break codes, the kernels that stood in for it, and when it was replayed if it was kept.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from fp4lab.core import records
from fp4lab.core.progress import say
from fp4lab.serving.replay import decide, pool, timeline, versions
from fp4lab.serving.replay.shared import breakable_outcome, flags, models

NAME = "14_fp4_model_matrix"


def prepare(model_names: list[str] | str, sglang_versions: list[str] | str,
            sms: list[str] | str) -> records.Recorder:  # fmt: skip
    """Notebook 14's validation, before any install: models, releases, SMs."""
    return records.Recorder(NAME, {"models": models.check_names("models", model_names),
                                   "sglang_versions": versions.check_versions(sglang_versions),
                                   "sms": versions.check_sms(sms)})  # fmt: skip


def row(model: models.Model, version: str, sm: str, replay: dict, calls: list[dict]) -> dict:
    """One decision row: ``decide.cell`` with the model, its blockers' frames and graph-break
    codes, the names of what stood in, and when a kept replay was measured (None: by this run)."""
    return {"model": model.name, "architecture": model.architecture,
            "quantization": model.quantization, "kv_cache": model.kv_cache,
            **decide.cell(version, sm, replay, calls),
            "blocker_frames": decide.blocker_frames(replay),
            "standins": sorted({s["name"] for s in replay.get("standins", [])}),
            "standins_reached": replay.get("standins_reached", []),
            **breakable_outcome.captured_fields(replay),
            "kept": replay.get("kept")}  # fmt: skip


def measure(chosen: list[models.Model], sglang_versions: list[str], sms: list[str],
            progress: Callable[[str], object] = say, fresh: bool = False) -> list[pool.VersionRun]:  # fmt: skip
    """Every model of ``chosen`` on every release x SM, as notebook 14 and its benchmark run it:
    each model's patch walk, kept from notebook 11's children where they walked it alongside
    (none with ``fresh``)."""
    return pool.measure_versions(sglang_versions, sms, ["unset"], progress, chosen, "patch",
                                 fresh=fresh)  # fmt: skip


def measure_and_record(rec: records.Recorder) -> list[dict]:
    """Every (model, release, SM) replayed and recorded as "decision"; the per-model timelines
    in the "summary"."""
    chosen = [models.named(n) for n in rec.params["models"]]
    runs = measure(chosen, rec.params["sglang_versions"], rec.params["sms"])
    rows = []
    for run in runs:
        rec.add("environment", {"sglang_version": run.version, **run.environment.as_record()})
        for model in chosen:
            for sm, replay in run.by_model.get(model.name, {}).items():
                rows.append(row(model, run.version, sm, replay, run.calls))
                rec.add("decision", rows[-1], target={"sm": sm, "simulated": True})
    print(timeline.tally(rows))  # the page's one line; each replay's went to the terminal
    per_model = {m.name: [r for r in rows if r["model"] == m.name] for m in chosen}
    rec.summary(**{
        "status": "measured" if any(r["outcome"] in decide.MEASURED for r in rows)
        else "not measured",
        "headline": verdict(rows),
        **decision(rows),
        "needs": "cpu",
        "models": {m.name: m.as_record() for m in chosen},
        "timelines": {n: timeline.timeline(mine, n) for n, mine in per_model.items()},
        "versions_failed": {r.version: r.environment.error for r in runs if not r.environment.ok},
        "replays_kept": sum(r["kept"] is not None for r in rows),
        "evidence": breakable_outcome.evidence_of(rows),
    })  # fmt: skip
    return rows


def counts(rows: list[dict]) -> dict[str, int]:
    """How many (release, SM) cells had each outcome."""
    return {o: sum(r["outcome"] == o for r in rows) for o in decide.OUTCOMES}


def decision(rows: list[dict]) -> dict:
    """The report's verdict over the matrix: per model, the cells that compile as released, and
    those blocked; never more than the traced cells say; and each captured graph's outcomes."""
    reachable = [r for r in rows if r["outcome"] in decide.MEASURED]
    blocked = [r for r in reachable if r["outcome"] == "blocked"]
    works = [r for r in reachable if r["outcome"] == "compiles"]
    verdict = ("UNMEASURED" if not reachable else "UNBLOCKED" if len(works) == len(reachable)
               else "PARTLY BLOCKED" if works else "BLOCKED")  # fmt: skip
    per = "; ".join(f"{name}: {c['compiles']} compile, {c['blocked']} blocked, "
                    f"{c['wrong output']} wrong output, {c['kernel unavailable']} kernel unavailable, "
                    f"{c['not applicable']} not applicable, {c['not measured']} not measured"
                    for name, c in ((n, counts([r for r in rows if r["model"] == n]))
                                    for n in dict.fromkeys(r["model"] for r in rows)))  # fmt: skip
    wrong = sum(r["outcome"] == "wrong output" for r in reachable)
    missing = sum(r["outcome"] == "kernel unavailable" for r in reachable)
    number = (
        f"{len(blocked)} of {len(reachable)} reachable model x release x SM blocked"
        + (f", {wrong} wrong output" if wrong else "")
        + (f", {missing} kernel unavailable" if missing else "")
    )
    tallies = {}
    for graph in flags.CAPTURED:  # the releases' captured graphs, by their own runner (simulated)
        captured = [r for r in rows if r.get(graph) not in (None, "not applicable")]
        tallies[graph] = tally = dict(collections.Counter(r[graph] for r in captured))
        risky = sum(r[graph] == "works" and bool(r.get(f"{graph}_weak_refs_at_risk"))
                    for r in captured)  # fmt: skip
        said = [f"{tally.get('works', 0)} of {len(captured)} cells work"
                + (f" ({risky} with weak-referenced break inputs at risk, sglang#37606)"
                   if risky else ""),
                *(f"{n} {o}" for o, n in tally.items() if o != "works")]  # fmt: skip
        number += f"; {graph} graphs (simulated capture): {', '.join(said)}" if captured else ""
    return {"verdict": verdict, "number": number, "why": per, **tallies}


def verdict(rows: list[dict]) -> str:
    """One sentence per model and SM (its timeline)."""
    lines = []
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        lines += [f"{name} {timeline.sentence(mine, sm, name)}"
                  for sm in dict.fromkeys(r["sm"] for r in mine)]  # fmt: skip
    return "\n".join(lines) or "no model could be measured"
