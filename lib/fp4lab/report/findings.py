"""The findings and timings README.md quotes, each sentence built from the newest records.

Every bullet says how its result was obtained (``core.evidence``) and on what machine; a
notebook without records yields "not measured at this commit", never an old number.
"""

from __future__ import annotations

import re

from fp4lab.core import paths, records
from fp4lab.report import answers, view
from fp4lab.report.story import of_kind, story_table


def _latest(notebook: str, kind: str) -> list[dict]:
    return of_kind(records.latest(notebook), kind)


def _where(record: dict) -> str:
    prov = record["provenance"]
    target = f"SM{prov['target_sm']} {'simulated' if prov['simulated'] else 'real'}"
    return f"{prov['device']}, {target if prov['target_sm'] else 'no target SM'}"


def _summary_line(notebook: str, label: str) -> str:
    rows = _latest(notebook, "summary")
    if not rows:
        return f"- {label}: not measured at this commit."
    v = rows[-1]["values"]
    where = rows[-1]["provenance"]["device"]
    if "verdict" not in v:
        return f"- {label} ({where}): {v['status']}; {v['headline']}."
    levels = ", ".join(v.get("evidence") or []) or "a timing"
    head = f"- {label}: **{v['verdict']}**, {v['number']} ({levels} on {where})."
    why = v["why"][:1].upper() + v["why"][1:]
    return f"{head} {view.within(why, WORDS - len(head.split()), notebook)}"


WORDS = 120
"""The most words of prose a finding says; the rest is on its notebook's page."""


def _story_line() -> str:
    table = story_table()
    if "observed" not in table:
        return "- The story's three crashes: not measured at this commit."
    parts = [
        f"{row['story']} {row['observed']} ({row['seconds']:.2f} s, {row['target']}; needed "
        f"first: {row['needed first']}; evidence: {row['evidence']})"
        for _, row in table.iterrows()
    ]
    agree = (table["reproduced"] == "yes").sum()
    return (
        f"- The story's crashes, reproduced at trace time ({agree}/{len(table)} as the story "
        f"reported): {'; '.join(parts)}."
    )


def _ranges(versions: list[str], measured: list[str]) -> str:
    """``versions`` as ranges of neighbours in ``measured`` ("0.6.12–0.7.0, 0.7.4")."""
    spans: list[list[str]] = []
    for version in sorted(versions, key=measured.index):
        if spans and measured.index(spans[-1][-1]) + 1 == measured.index(version):
            spans[-1].append(version)
        else:
            spans.append([version])
    return ", ".join(s[0] if len(s) == 1 else f"{s[0]}–{s[-1]}" for s in spans)


def _matrix_line() -> str:
    rows = _latest("09_version_matrix", "summary")
    if not rows:
        return "- Across FlashInfer versions: not measured at this commit."
    v = rows[-1]["values"]
    measured = v["versions_measured"]
    ranges = "; ".join(
        f"{verdict}: {_ranges(versions, measured)}"
        for verdict, versions in (v.get("verdict_ranges") or {}).items()
        if versions
    )
    return (
        f"- Across {len(measured)} FlashInfer versions from {measured[0]} to {measured[-1]} "
        f"(ranges of those; trace on "
        f"{_where(rows[-1])}): {ranges}. The story's decision holds up to "
        f"{v['story_decision_holds_up_to'] or 'none of them'}; the upstream op removes the "
        f"blocker, with the right arguments, from {v['upstream_op_unblocks_from'] or 'none of them'}."
    )


def _sglang_line() -> str:
    rows = _latest(answers.SGLANG, "summary")
    if not rows:
        return "- GLM-5 in SGLang's piecewise runner: not measured at this commit."
    v = rows[-1]["values"]
    decisions = [r["values"] for r in _latest(answers.SGLANG, "decision")]
    blocked = [r for r in decisions if r["outcome"] == "blocked"]
    fixed = [r for r in blocked if r["compiles_with_patch"] and r["equals_eager"]]
    patch = (f" fp4lab's patch makes {len(fixed)} of the {len(blocked)} blocked cells compile and "
             f"equal eager." if blocked else "")  # fmt: skip
    return (f"- GLM-5 through each SGLang release's tc_piecewise prefill graphs (notebook 11, on "
            f"{_where(rows[-1])}): **{v['verdict']}**, {v['number']}.{patch} Per SM, below.")  # fmt: skip


def _models_line() -> str:
    """Notebook 14's decision in one line; its table follows the findings."""
    return _summary_line(answers.MODELS, "Each built-in FP4 model through SGLang's tc_piecewise "
                         "prefill graphs, every release x SM (notebook 14)") + " Per model, below."  # fmt: skip


def _tables() -> str:
    """The SGLang replay's answers as tables after the findings (``answers``), with the grid."""
    parts = []
    if answers.per_sm():
        grid = f"figures/{answers.GRID}.png"  # the committed one, as README shows it
        figure = (
            f"\n![GLM-5 per release and SM]({grid})\n" if (paths.REPO_ROOT / grid).exists() else ""
        )
        parts.append(
            f"#### GLM-5 per SM (notebook 11)\n\n{answers.per_sm()}\n"
            f"{answers.per_sm_given()}{figure}"
        )
    if answers.per_model():
        parts.append(f"#### Each built-in model per SM (notebook 14)\n\n{answers.per_model()}")
    return "\n".join(parts)


_PARAM = re.compile(r"(\w+): ")


def _audit_unspecified_line(sm: str = "12.0") -> str:
    """Notebook 12's entry points left without an input spec (newest version, ``sm``), each with
    the parameters nothing gave a spec for, read from their records."""
    summary = _latest("12_fp4_api_audit", "summary")
    if not summary or not summary[-1]["values"].get("versions_measured"):
        return "- FP4 entry points left without an input spec: not measured at this commit."
    version = summary[-1]["values"]["versions_measured"][-1]
    rows = [r["values"] for r in _latest("12_fp4_api_audit", "entry")
            if r["values"].get("version") == version and r["values"].get("sm") == sm]  # fmt: skip
    left = [r for r in rows if r["verdict"] == "no input spec"]
    params = {r["entry_point"]: ", ".join(_PARAM.findall(r["reason"])) for r in left}
    named = "; ".join(f"`{name}` ({found or 'no signature'})" for name, found in params.items())
    text = (f"{len(left)} of {len(rows)}, so not audited; each names the parameters that neither "
            "the parameter table, the docstring nor the annotation gives (a multi-rank workspace, "
            f"a symmetric-memory buffer, a CuTe DSL compile-time type, a shape no docstring "
            f"states): {named or 'none'}")  # fmt: skip
    head = f"- FP4 entry points left without an input spec (FlashInfer {version}, SM{sm}):"
    return f"{head} {view.within(text, WORDS - len(head.split()), '12_fp4_api_audit')}"


def findings() -> str:
    """The README's findings, one bullet per question, from the newest records."""
    lines = [
        _story_line(),
        _matrix_line(),
        _sglang_line(),
        _models_line(),
        _summary_line("12_fp4_api_audit", "FlashInfer's FP4 API under fullgraph=True"),
        _audit_unspecified_line(),
        _summary_line("06_nvfp4_kernels", "FP4 kernels"),
        _summary_line("07_mscclpp_allreduce", "MSCCLPP allreduce"),
        _summary_line("08_single_batch_overlap", "Single Batch Overlap"),
        _summary_line("04_fullgraph_false_tradeoff", "fullgraph=False instead"),
        _summary_line("13_sglang_cpu_server", "A live SGLang server on this CPU"),
    ]
    tables = _tables()
    return "\n".join(lines) + "\n" + (f"\n{tables}" if tables else "")


def _bytes_gb(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _newest_with(rows: list[dict], key: str) -> dict | None:
    """The newest row whose values hold ``key``."""
    return next((r for r in reversed(rows) if key in r["values"]), None)


def _goal_said(seconds: float, goal: float) -> str:
    return f"goal {goal / 60:.0f} min {'met' if seconds < goal else 'MISSED'}"


def _pages_said(rows: list[dict], commit: str) -> str:
    """The pages of the cold run at ``commit`` in headless Chromium (``make pages``), from the
    newest record of them that says Chromium was there to render them."""
    v = next((r["values"] for r in reversed(rows) if r["values"].get("pages_cold_chromium")
              and r["values"].get("pages_cold_commit") == commit), None)  # fmt: skip
    if v is None:
        return "; its pages: no record of them rendered in Chromium"
    how = "all pass" if v["pages_cold_exit"] == 0 else f"FAILED (exit {v['pages_cold_exit']})"
    return f"; its {len(v['pages_cold_checked'])} pages in headless Chromium (`make pages`): {how}"


def _fresh_clone_lines(rows: list[dict]) -> list[str]:
    """The cold `make reproduce` and CI in a fresh clone, each from its newest record."""
    lines = []
    cold = _newest_with(rows, "reproduce_cold_s")
    if cold is not None:
        v, full = cold["values"], cold["provenance"]["git"]["commit"]
        commit = full[:10]
        slowest = sorted(v.get("reproduce_cold_notebooks", {}).items(), key=lambda kv: -kv[1][1])[
            :3
        ]
        slowest_said = "; slowest: " + ", ".join(f"{name} {s:.0f} s" for name, (_, s) in slowest)
        failed = [
            n for n, (status, _) in v.get("reproduce_cold_notebooks", {}).items() if status != "ran"
        ]
        failed_said = "; did not run to the end: " + ", ".join(failed)
        lines.append(
            f"- `make reproduce` from a fresh clone, cold (empty caches, every package downloaded; "
            f"commit {commit}): {v['reproduce_cold_s']:.0f} s, {_goal_said(v['reproduce_cold_s'], 2700)}"
            f"{slowest_said if slowest else ''}{failed_said if failed else ''}; its build/ "
            f"{_bytes_gb(v['build_cold_bytes'])}, goal 25 GiB "
            f"{'met' if v['build_cold_bytes'] <= 25 * 2**30 else 'MISSED'}{_pages_said(rows, full)};"
        )  # fmt: skip
    ci = _newest_with(rows, "ci_s")
    if ci is not None:
        v, commit = ci["values"], ci["provenance"]["git"]["commit"][:10]
        how = "passed" if v["ci_exit"] == 0 else f"FAILED (exit {v['ci_exit']})"
        before = {
            True: " (Chromium already installed: its apt install not timed)",
            False: " (Chromium installed by it)",
        }.get(v.get("ci_chromium_installed_before"), "")
        lines.append(f"- CI (`bash .ci/run`) in a fresh clone at commit {commit}: {v['ci_s']:.0f} s"
                     f"{before}, {_goal_said(v['ci_s'], 1200)}, {how};")  # fmt: skip
    return lines


def timings() -> str:
    """How long the story takes to replay here, and the environments' sizes, from the benchmarks."""
    rows = records.latest("benchmark_story")
    if not rows:
        return "Not measured at this commit: run `make benchmarks`.\n"
    v, prov = rows[-1]["values"], rows[-1]["provenance"]
    lines = [
        f"Measured by `benchmarks/story_timing.py` at commit {prov['git']['commit'][:10]} on "
        f"{prov['device']} ({prov['time_utc']}):",
        f"- the story's three signatures: {v['three_signatures_s']:.2f} s together in one warm "
        f"process, {v['speedup_vs_restarts']:.0f}x faster than three 4-minute restarts;",
    ]
    if "reproduce_warm_s" in v:
        lines.append(f"- `make reproduce`, warm: {v['reproduce_warm_s']:.0f} s;")
    lines += _fresh_clone_lines(records.read("benchmark_story"))
    lines.append(f"- the environment (build/venv): {_bytes_gb(v['venv_bytes'])}.")
    versions = [
        r["values"] for r in _latest("09_version_matrix", "version") if r["values"]["env_bytes"]
    ]
    if versions:
        sizes = sorted(r["env_bytes"] for r in versions)
        lines.append(
            f"- each FlashInfer version of the matrix: {_bytes_gb(sizes[0])} to "
            f"{_bytes_gb(sizes[-1])} ({len(sizes)} versions, build/matrix/)."
        )
    goal = _latest("nvfp4_throughput", "public_goal")
    if goal:
        g = goal[-1]["values"]
        torchao = (
            f" and {g['speed_vs_torchao']:.2f}x torchao's compiled nvfp4_quantize"
            if "speed_vs_torchao" in g
            else ""
        )
        lines.append(
            f"- `fp4lab.fp4.kernels.quantize` on {g['M']}x{g['K']} {g['dtype']} "
            f"(`benchmarks/nvfp4_throughput.py`, {goal[-1]['provenance']['device']}): "
            f"{g['ratio_to_copy']:.2f} of a preallocated copy_{torchao} (goal "
            f"{g['copy_goal']:.2f} and 1x; load average {g['load_average_after']:.1f})."
        )
    lines += _matrix_timing()
    return "\n".join(lines) + "\n"


def _met(seconds: float, goal: float) -> str:
    return f"goal {goal:.0f} s {'met' if seconds < goal else 'MISSED'}"


def _matrix_timing() -> list[str]:
    """Notebook 14's model matrix, warm, and one ``check``, from their benchmarks' newest records
    (the built-in set as it was then, against the set notebook 14 measured last)."""
    lines, found = [], _latest("benchmark_model_matrix", "timing")
    check = _latest("benchmark_check", "timing")
    matrix = records.latest("14_fp4_model_matrix")
    if found:
        v, p = found[-1]["values"], found[-1]["params"]
        now = len(matrix[-1]["params"].get("models", [])) if matrix else len(p["models"])
        of = "" if len(p["models"]) == now else f" of the {now} notebook 14 measured last"
        commit = found[-1]["provenance"]["git"]["commit"][:10]
        lines.append(f"- notebook 14's model matrix, warm ({len(p['models'])} built-in models{of} "
                     f"x {len(p['versions'])} releases x {len(p['sms'])} SMs: {v['cells']} cells): "
                     f"{v['matrix_s']:.0f} s on {v['cores']} cores, {_met(v['matrix_s'], v['goal_s'])} "
                     f"(`benchmarks/model_matrix.py` at commit {commit}).")  # fmt: skip
    if check:
        v, p = check[-1]["values"], check[-1]["params"]
        built = " (its environment built)" if p["cold"] else ""
        commit = check[-1]["provenance"]["git"]["commit"][:10]
        lines.append(f"- one `check` ({p['config']}, SGLang {p['sglang']}, SM{p['sm']}): "
                     f"{v['warm_s']:.0f} s warm, {_met(v['warm_s'], v['goal_s'])}; its first run "
                     f"{v['first_s']:.0f} s{built}, {len(v['progress'])} progress lines, the "
                     f"longest {v['longest_line']} characters (`benchmarks/check_speed.py` at "
                     f"commit {commit}).")  # fmt: skip
    return lines
