"""Notebook 12's calls: each version's environment reused (compile.matrix.env), the child run in
it, one record per (version, entry point, SM), one per version, and the summary."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pandas as pd

from fp4lab.compile.audit.run import VERDICTS
from fp4lab.compile.matrix.env import ensure_env, python
from fp4lab.compile.matrix.versions import check_versions
from fp4lab.core import params, paths, process, records

NOTEBOOK = "12_fp4_api_audit"
TIMEOUT_S = 900
NOT_AUDITED = ("no input spec", "unknown entry point", "error")
"""Row verdicts that are not dynamo's: why an entry point was not traced."""


def check_sms(sms: list[str] | str) -> tuple[list[str], list[str]]:
    """The known SMs as "12.0" strings, and a message per unknown one (recorded; the rest go on);
    a wrong type, or no known SM at all, is an error naming ``sms``."""
    if isinstance(sms, str):
        sms = [s.strip() for s in sms.split(",") if s.strip()]
    if not isinstance(sms, (list, tuple)) or not all(isinstance(s, str) for s in sms):
        raise ValueError(f"sms={sms!r} must be a list of SM strings such as '12.0' or '10.0'")
    good, bad = [], []
    for sm in dict.fromkeys(sms):
        try:
            major, minor = params.sm("sms", sm)
            good.append(f"{major}.{minor}")
        except ValueError as exc:
            bad.append(str(exc))
    if not good:
        raise ValueError(f"sms={sms!r} holds no known SM; {bad[0] if bad else 'it is empty'}")
    return good, bad


def check_entry_points(names: list[str] | str) -> list[str]:
    """Entry point names (empty: every one each version has); an error naming ``entry_points``
    for anything that is not a list of identifiers."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not isinstance(names, (list, tuple)) or not all(
        isinstance(n, str) and n.isidentifier() for n in names
    ):
        raise ValueError(f"entry_points={names!r} must be a list of function names (or [] for all)")
    return list(dict.fromkeys(names))


def prepare(versions: list[str] | str, sms: list[str], entry_points: list[str]) -> records.Recorder:
    """Notebook 12's validation; unknown SMs are recorded as bad input and the rest go on."""
    good, bad = check_sms(sms)
    chosen = {
        "versions": check_versions(versions),
        "sms": good,
        "entry_points": check_entry_points(entry_points),
    }
    rec = records.Recorder(NOTEBOOK, chosen)
    for message in bad:
        print(f"bad input: {message}")
        rec.add("bad_input", {"parameter": "sms", "status": "bad input", "reason": message})
    return rec


def audit_version(version: str, sms: list[str], names: list[str]) -> dict:
    """The child's JSON for one version (``env`` says how its environment came), or the failure."""
    built = ensure_env(version)
    if built.env == "failed":
        return {"flashinfer": version, "env": "failed", "error": built.error, "rows": []}
    logs = paths.build_dir() / "audit" / "logs"
    log, out = logs / f"flashinfer-{version}.log", logs / f"flashinfer-{version}.json"
    for stale in (log, out):
        stale.unlink(missing_ok=True)
    cmd = [python(version), "-m", "fp4lab.compile.audit.child", out]
    cmd += ["--sms", ",".join(sms), "--entry-points", ",".join(names)]
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT / "lib"))
    finished = process.run(cmd, log, TIMEOUT_S, env=env)
    if not finished.ok or not out.exists():
        last = (process.tail(log, 1).strip() or "no output").splitlines()[-1]
        error = f"audit {'timed out' if finished.timed_out else 'failed'}: {last}"
        return {"flashinfer": version, "env": "failed", "error": error, "rows": []}
    return {**json.loads(out.read_text()), "env": built.env, "wall_seconds": finished.seconds}


def audit_and_record(rec: records.Recorder, progress=print) -> list[dict]:
    """Every version audited; one "entry" record per row, one "version" per version, the
    "summary"; returns the entry rows (each with its ``version``)."""
    rows: list[dict] = []
    per_version = []
    for version in rec.params["versions"]:
        progress(f"auditing flashinfer-python=={version} ...")
        started = time.perf_counter()
        found = audit_version(version, rec.params["sms"], rec.params["entry_points"])
        packages = found.get("packages") or {"flashinfer-python": version}
        for row in found["rows"]:
            row = {"version": version, **row}
            target = {"sm": row["sm"], "simulated": row.get("simulated", True)}
            rec.add("entry", row, target=target, packages=packages)
            rows.append(row)
        about = {
            "version": version,
            "env": found["env"],
            "error": found.get("error"),
            "entry_points_found": [e["entry_point"] for e in found.get("discovered", [])],
            "audit_seconds": found.get("seconds"),
            "wall_seconds": time.perf_counter() - started,
        }
        rec.add("version", about, packages=packages)
        per_version.append(about)
        progress(
            f"  {version}: {found['env']}, {len(found['rows'])} rows {found.get('error') or ''}"
        )
    rec.add("summary", summarize(rows, per_version))
    return rows


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
