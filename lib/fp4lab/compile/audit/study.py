"""Notebook 12's calls: each version's environment reused (compile.matrix.env), the child run in
it (``core.venvs.run_children``), one record per (version, entry point, SM), one per version, and
the summary."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from fp4lab.compile.audit.run import VERDICTS
from fp4lab.compile.matrix.env import ensure_env, python
from fp4lab.compile.matrix.versions import check_released
from fp4lab.core import params, paths, records, venvs

NOTEBOOK = "12_fp4_api_audit"
TIMEOUT_S = 900
NOT_AUDITED = ("no input spec", "unknown entry point", "error")
"""Row verdicts that are not dynamo's: why an entry point was not traced."""


def check_entry_points(names: list[str] | str) -> list[str]:
    """Entry point names (empty: every one each version has); an error naming ``entry_points``
    for anything that is not a list of FP4 entry points of the installed FlashInfer (before any
    environment is built; a name only older releases have is audited with the command's
    ``--versions``)."""
    if names in ("", [], ()):
        return []
    names = params.items("entry_points", names)
    from fp4lab.compile import target
    from fp4lab.compile.audit import surface

    _, missing = surface.find(target.flashinfer, names)
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


def audit_and_record(rec: records.Recorder, progress=print) -> list[dict]:
    """Every version's environment built or reused, then audited (one child per core at once);
    one "entry" record per row, one "version" per version, the "summary"; returns the entry rows
    (each with its ``version``)."""
    sms, names = rec.params["sms"], rec.params["entry_points"]
    found: dict[str, dict] = {}
    children = {}
    for version in rec.params["versions"]:
        built = ensure_env(version)
        progress(f"flashinfer-python=={version}: environment {built.env} {built.error}".rstrip())
        if built.env == "failed":
            found[version] = {"env": "failed", "error": built.error, "rows": []}
            continue
        args = ("--sms", ",".join(sms), "--entry-points", ",".join(names))
        children[venvs.Child(python(version), "fp4lab.compile.audit.child", args,
                             f"flashinfer-{version}", "audit")] = (version, built.env)  # fmt: skip

    def audited(child: venvs.Child, one: dict) -> None:
        version, env = children[child]
        found[version] = {"rows": [], **one, "env": "failed" if "error" in one else env}
        progress(f"  {version}: {found[version]['env']}, {len(found[version]['rows'])} rows "
                 f"{one.get('error') or ''}".rstrip())  # fmt: skip

    venvs.run_children(list(children), paths.build_dir() / "audit" / "logs", TIMEOUT_S, audited)
    rows: list[dict] = []
    per_version = []
    for version in rec.params["versions"]:
        one = found[version]
        packages = one.get("packages") or {"flashinfer-python": version}
        for row in one["rows"]:
            row = {"version": version, **row}
            target = {"sm": row["sm"], "simulated": row.get("simulated", True)}
            rec.add("entry", row, target=target, packages=packages)
            rows.append(row)
        about = {
            "version": version,
            "env": one["env"],
            "error": one.get("error"),
            "entry_points_found": [e["entry_point"] for e in one.get("discovered", [])],
            "audit_seconds": one.get("seconds"),
            "child_seconds": one.get("child_seconds"),
        }
        rec.add("version", about, packages=packages)
        per_version.append(about)
    rec.summary(**summarize(rows, per_version))
    return rows


def _decision(by: dict[str, dict], measured: list[str]) -> dict:
    """The decision report's verdict, number and why: the newest version measured, its newest SM."""
    if not measured:
        return {"verdict": "UNMEASURED", "number": "no FlashInfer version audited",
                "why": "no version's environment could be built here"}  # fmt: skip
    version = measured[-1]
    sm, cell = max(by[version]["sms"].items(), key=lambda item: float(item[0]))
    one, traced = len(cell["one_graph"]), len(cell["one_graph"]) + len(cell["wrap"])
    verdict = "UNBLOCKED" if one == traced else "BLOCKED" if one == 0 else "PARTLY BLOCKED"
    return {
        "verdict": verdict,
        "number": f"{one} of {traced} FP4 entry points traced compile to one graph "
        f"(FlashInfer {version}, SM{sm})",
        "why": "each entry point was traced under fullgraph=True with small inputs on a simulated "
        "target; one that breaks must be wrapped in a custom op for a piecewise runner (a break "
        "is not yet checked against an eager call with the same inputs)",
    }


def summarize(rows: list[dict], per_version: list[dict]) -> dict:
    """Per version and SM: entry points audited, how many compile to one graph (which), which a
    piecewise runner must still wrap; the headline; ``status``."""
    by: dict[str, dict] = {}
    for v in per_version:
        by[v["version"]] = {"env": v["env"], "error": v["error"], "sms": {}}
    for r in rows:
        cell = by[r["version"]]["sms"].setdefault(
            r["sm"], {"verdicts": Counter(), "one_graph": [], "wrap": [], "not_audited": []}
        )
        cell["verdicts"][r["verdict"]] += 1
        key = "one_graph" if r["verdict"] == VERDICTS[0] else "wrap"
        cell["not_audited" if r["verdict"] in NOT_AUDITED else key].append(r["entry_point"])
    lines = []
    for version, about in by.items():
        counts = [
            f"SM{sm}: {len(c['one_graph'])}/{len(c['one_graph']) + len(c['wrap'])}"
            for sm, c in sorted(about["sms"].items(), reverse=True)
        ]
        lines.append(f"{version}: " + ("; ".join(counts) or f"not measured ({about['error']})"))
    measured = [v for v, a in by.items() if a["sms"]]
    return {
        "status": "measured" if measured else "not measured",
        **_decision(by, measured),
        "versions": by,
        "versions_measured": measured,
        "headline": "FP4 entry points that compile to one graph (of those traced), per version: "
        + " | ".join(lines),
        "evidence": ["trace", "simulated_target"],
        "needs": "cpu",
    }


def table(rows: list[dict]) -> pd.DataFrame:
    """One line per (version, entry point, SM), to filter: verdicts, blockers, frames, the op."""
    lines = []
    for r in rows:
        tgt, cpu = r.get("target") or {}, r.get("cpu") or {}
        op = r.get("custom_op") or {}
        lines.append(
            {
                "version": r["version"],
                "sm": r["sm"],
                "entry_point": r["entry_point"],
                "kind": r.get("kind"),
                "verdict": r["verdict"],
                "blocker": tgt.get("signature"),
                "blocker_frame": tgt.get("blocker_frame"),
                "message": tgt.get("message") or r.get("reason"),
                "stages": ", ".join(r.get("target_stages") or []),
                "cpu_blocker": cpu.get("signature"),
                "after_all_stages": (r.get("final") or {}).get("signature"),
                "custom_op": op.get("qualname") if op.get("present") else None,
                "op_has_fake": op.get("fake_or_meta"),
                "tensors": r.get("tensors"),
            }
        )
    return pd.DataFrame(lines)


def audit_verdict(rows: list[dict]) -> str:
    """The headline, and per version the entry points a piecewise runner must wrap, from the
    summary of ``rows``; AssertionError when nothing was audited."""
    assert any(r["status"] == "audited" for r in rows), "no entry point could be audited"
    summary = records.latest(NOTEBOOK)[-1]["values"]
    lines = [summary["headline"]]
    for version, about in summary["versions"].items():
        for sm, cell in sorted(about["sms"].items(), reverse=True):
            lines.append(f"{version} SM{sm} one graph: {', '.join(cell['one_graph']) or 'none'}")
            lines.append(f"{version} SM{sm} must be wrapped: {', '.join(cell['wrap']) or 'none'}")
    return "\n".join(lines)
