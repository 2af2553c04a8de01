"""Notebook 12's calls: each version's environment reused (compile.matrix.env), one child per
(version, SM) run in it (``core.venvs.run_children``, one per core at once), one record per
(version, entry point, SM), one per version, and the summary with the headline per version and SM.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from fp4lab.compile.audit.run import MUST_WRAP
from fp4lab.compile.matrix.env import ensure_env, python
from fp4lab.compile.matrix.versions import check_released
from fp4lab.core import evidence, page, params, paths, records, venvs
from fp4lab.core.progress import say

NOTEBOOK = "12_fp4_api_audit"
TIMEOUT_S = 900
NOT_AUDITED = ("no input spec", "unknown entry point", "error")
"""Row verdicts that are not the audit's: why an entry point was not called."""
CELLS = ("one_graph", "wrap", "ops_one_graph", "ops_wrap", "input_rejected",
         "target_unsupported", "undetermined", "not_audited")  # fmt: skip
"""What the summary counts per version and SM (each a list of entry point names)."""


def check_entry_points(names: list[str] | str) -> list[str]:
    """Entry point names (empty: every one each version has); an error naming ``entry_points``
    for anything that is not an FP4 entry point of the installed FlashInfer (before any
    environment is built; a name only older releases have is audited with the command's
    ``--versions``)."""
    if names in ("", [], ()):
        return []
    names = params.items("entry_points", names)
    from fp4lab.compile import target
    from fp4lab.compile.audit import surface

    version = getattr(target.flashinfer, "__version__", "?")
    _, missing = surface.find(surface.discover(target.flashinfer), names, version)
    if missing:
        raise ValueError(f"entry_points contains {missing[0]['reason']}")
    return names


def prepare(versions: list[str] | str, sms: list[str], entry_points: list[str]) -> records.Recorder:
    """Notebook 12's validation: versions, SMs and entry point names checked before any build."""
    return records.Recorder(
        NOTEBOOK,
        {
            "versions": check_released(versions),
            "sms": params.sms("sms", sms),
            "entry_points": check_entry_points(entry_points),
        },
    )


def run_audits(
    versions: list[str], sms: list[str], names: list[str], progress=say
) -> dict[str, dict]:
    """Each version's environment built or reused, then audited: one child per version and SM,
    one per core at once. Per version: ``env``, ``error``, its ``rows`` and its ``children``
    (what each child said besides its rows)."""
    found: dict[str, dict] = {}
    children: dict[venvs.Child, tuple[str, str]] = {}
    for version in versions:
        built = ensure_env(version)
        progress(f"flashinfer-python=={version}: environment {built.env} {built.error}".rstrip())
        found[version] = {"env": built.env, "error": built.error, "rows": [], "children": []}
        if built.env == "failed":
            continue
        for sm in sms:
            args = ("--sms", sm, "--entry-points", ",".join(names))
            child = venvs.Child(python(version), "fp4lab.compile.audit.child", args,
                                f"flashinfer-{version}-sm{sm}", f"the audit on SM{sm}")  # fmt: skip
            children[child] = (version, sm)

    def audited(child: venvs.Child, one: dict) -> None:
        version, sm = children[child]
        into = found[version]
        into["children"].append({"sm": sm, **{k: v for k, v in one.items() if k != "rows"}})
        into["rows"] += one.get("rows", [])
        if "error" in one:
            into["env"], into["error"] = "failed", one["error"]
        verdicts = Counter(r["verdict"] for r in one.get("rows", []))
        said = ", ".join(f"{n} {verdict}" for verdict, n in verdicts.most_common())
        progress(f"  {version} SM{sm}: {said or one.get('error')}")

    venvs.run_children(list(children), paths.build_dir() / "audit" / "logs", TIMEOUT_S, audited)
    return found


def audit_and_record(rec: records.Recorder, progress=say) -> list[dict]:
    """``run_audits`` on the notebook's parameters; one "entry" record per row, one "version" per
    version, the "summary"; returns the entry rows (each with its ``version``)."""
    versions = rec.params["versions"]
    found = run_audits(versions, rec.params["sms"], rec.params["entry_points"], progress)
    rows: list[dict] = []
    per_version = []
    for version in versions:
        one = found[version]
        first = next(iter(one["children"]), {})
        packages = first.get("packages") or {"flashinfer-python": version}
        for row in one["rows"]:
            row = {"version": version, **row}
            target = {"sm": row["sm"], "simulated": row.get("simulated", True)}
            rec.add("entry", row, target=target, packages=packages)
            rows.append(row)
        about = {
            "version": version,
            "env": one["env"],
            "error": one["error"],
            "entry_points_found": [e["entry_point"] for e in first.get("discovered", [])],
            "surface_errors": first.get("surface_errors", {}),
            "standins": first.get("standins", []),
            "audit_seconds": {c["sm"]: c.get("seconds") for c in one["children"]},
            "child_seconds": {c["sm"]: c.get("child_seconds") for c in one["children"]},
        }
        rec.add("version", about, packages=packages)
        per_version.append(about)
    rec.summary(**summarize(rows, per_version))
    return rows


def cell_of(row: dict) -> str:
    """Which of CELLS a row counts in."""
    verdict, op = row["verdict"], row.get("form") == "op"
    if verdict == "one graph":
        return "ops_one_graph" if op else "one_graph"
    if verdict in MUST_WRAP:
        return "ops_wrap" if op else "wrap"
    if verdict in ("input rejected", "target unsupported"):
        return verdict.replace(" ", "_")
    return "undetermined" if verdict == "undetermined on CPU" else "not_audited"


def line(version: str, sm: str, cell: dict) -> str:
    """One version and SM in words, for the headline."""
    traced = len(cell["one_graph"]) + len(cell["wrap"])
    ops = len(cell["ops_one_graph"]) + len(cell["ops_wrap"])
    return (
        f"{version} SM{sm}: {len(cell['one_graph'])}/{traced} entry points compile to one graph, "
        f"{len(cell['wrap'])} must be wrapped; registered ops {len(cell['ops_one_graph'])}/{ops} "
        f"compile; {len(cell['input_rejected'])} inputs rejected, {len(cell['target_unsupported'])} "
        f"target unsupported, {len(cell['undetermined'])} undetermined, {len(cell['not_audited'])} "
        "not audited"
    )


def _decision(by: dict[str, dict], measured: list[str]) -> dict:
    """The decision report's verdict, number and why: the newest version measured, its newest SM."""
    if not measured:
        return {"verdict": "UNMEASURED", "number": "no FlashInfer version audited",
                "why": "no version's environment could be built here"}  # fmt: skip
    version = measured[-1]
    sm, cell = max(by[version]["sms"].items(), key=lambda item: float(item[0]))
    one, traced = len(cell["one_graph"]), len(cell["one_graph"]) + len(cell["wrap"])
    ops = cell["ops_one_graph"]
    verdict = (
        "UNBLOCKED" if one == traced else "BLOCKED" if one == 0 and not ops else "PARTLY BLOCKED"
    )
    return {
        "verdict": verdict,
        "number": f"{one} of {traced} FP4 entry points traced compile to one graph, "
        f"{len(ops)} of {len(ops) + len(cell['ops_wrap'])} registered FP4 ops (FlashInfer "
        f"{version}, SM{sm})",
        "why": "each entry point was called eagerly and traced under fullgraph=True with the same "
        "fake CUDA inputs on a simulated GPU; a break counts only where the eager call accepted "
        "the inputs; a registered op that compiles (" + (", ".join(ops) or "none") + ") is what a "
        "piecewise runner can call instead",
    }


def summarize(rows: list[dict], per_version: list[dict]) -> dict:
    """Per version and SM: the entry point names in each of CELLS, the verdicts counted and, for
    the calls that must be wrapped, how their eager call ended; the headline; the decision;
    ``status``."""
    by: dict[str, dict] = {}
    for v in per_version:
        by[v["version"]] = {"env": v["env"], "error": v["error"], "sms": {}}
    for r in rows:
        cell = by[r["version"]]["sms"].setdefault(
            r["sm"], {"verdicts": Counter(), "wrap_eager": Counter(), **{n: [] for n in CELLS}}
        )
        cell["verdicts"][r["verdict"]] += 1
        cell[cell_of(r)].append(r["entry_point"])
        if r["verdict"] in MUST_WRAP:  # how far the eager call went: past the break, always
            cell["wrap_eager"][(r.get("eager") or {}).get("outcome")] += 1
    lines = []
    for version, about in by.items():
        cells = [line(version, sm, c) for sm, c in sorted(about["sms"].items(), reverse=True)]
        lines += cells or [f"{version}: not measured ({about['error']})"]
    measured = [v for v, a in by.items() if a["sms"]]
    return {
        "status": "measured" if measured else "not measured",
        **_decision(by, measured),
        "versions": by,
        "versions_measured": measured,
        "headline": "FlashInfer's FP4 surface under fullgraph=True, eager first: "
        + " | ".join(lines),
        "evidence": ["trace", "simulated_target"],
        "needs": "cpu",
    }


def table(rows: list[dict], newest_only: bool = False) -> pd.DataFrame:
    """One line per (version, SM, entry point) in seven short columns: its form, verdict, eager
    outcome and first blocker; the long text (why, the blocker's frame, the frame with CUDA_HOME
    set, whether a prebuilt install holds, the tensors) folded in ``detail``
    (``core.page.details``). A cell with nothing to say is empty. With ``newest_only``, only the
    last version of the notebook's list."""
    newest = rows[-1]["version"] if newest_only and rows else None
    lines = []
    for r in rows:
        if newest is not None and r["version"] != newest:
            continue
        tgt, install = r.get("trace") or {}, r.get("install") or {}
        said = {"why": r.get("why") or r.get("reason"),
                "blocker frame": tgt.get("blocker_frame"),
                "with CUDA_HOME set": (install.get("jit_cuda_home") or {}).get("blocker_frame"),
                "prebuilt install holds": (install.get("prebuilt") or {}).get("holds"),
                "tensors": r.get("tensors")}  # fmt: skip
        detail = "; ".join(f"{k}: {v}" for k, v in said.items() if v not in (None, ""))
        lines.append({"version": r["version"], "SM": r["sm"], "entry point": r["entry_point"],
                      "form": r.get("form"), "verdict": r["verdict"],
                      "eager": (r.get("eager") or {}).get("outcome"),
                      "blocker": tgt.get("signature"),
                      "detail": page.details("why", detail) if detail else ""})  # fmt: skip
    return pd.DataFrame(lines).fillna("")


def counts(rows: list[dict]) -> pd.DataFrame:
    """Per version and SM, the audit's answer in counts (``cell_of``): entry points that compile
    to one graph of those traced, those to wrap, registered ops that compile, and the calls not
    decided, by why; AssertionError when nothing was audited."""
    evidence.guard(any(r["status"] == "audited" for r in rows), "no entry point could be audited")
    found: dict[tuple[str, str], Counter] = {}
    for r in rows:
        found.setdefault((r["version"], r["sm"]), Counter())[cell_of(r)] += 1
    return pd.DataFrame(
        [{"version": version, "SM": sm,
          "compile to one graph": f"{c['one_graph']}/{c['one_graph'] + c['wrap']}",
          "must be wrapped": c["wrap"],
          "registered ops compile": f"{c['ops_one_graph']}/{c['ops_one_graph'] + c['ops_wrap']}",
          "inputs rejected": c["input_rejected"], "target unsupported": c["target_unsupported"],
          "undetermined": c["undetermined"], "not audited": c["not_audited"]}
         for (version, sm), c in found.items()]
    )  # fmt: skip
