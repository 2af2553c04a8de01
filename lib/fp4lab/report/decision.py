"""The decision: the story's todo list, and what fp4lab added to it, re-decided from the records
in data/.

Each notebook's summary record carries its decision (``verdict``, the one ``number`` that
decides it, ``why``) and the evidence levels its run reached; this module lays them side by side
and reads nothing but records. Nothing here runs an experiment.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from pandas.io.formats.style import Styler

from fp4lab.core import paths, records
from fp4lab.core.figures import provenance_line
from fp4lab.report import answers, view
from fp4lab.report.story import STORY_STEPS, of_kind


@dataclass(frozen=True)
class Question:
    """One line of the decision: the optimization, what the story said, the notebooks that decide it."""

    optimization: str
    story_said: str
    notebooks: tuple[str, ...]


CRASHES = tuple(notebook for _, notebook, _ in STORY_STEPS)
QUESTIONS = (
    Question("Piecewise CUDA graphs, as the story compiled them", "BLOCKED", CRASHES),
    Question("Piecewise CUDA graphs with a custom op", "rejected, untried", ("05_custom_op_fix",)),
    Question(
        "Piecewise CUDA graphs in FlashInfer releases", "not examined", ("09_version_matrix",)
    ),
    Question(
        "Piecewise CUDA graphs for GLM-5 in SGLang releases",
        "not examined",
        ("11_sglang_piecewise_replay",),
    ),
    Question(
        "Piecewise CUDA graphs for other FP4 models in SGLang releases",
        "not examined (one model)",
        ("14_fp4_model_matrix",),
    ),
    Question("fullgraph=False instead", "assumed worthless", ("04_fullgraph_false_tradeoff",)),
    Question("MSCCLPP allreduce", "next, Tier 1", ("07_mscclpp_allreduce",)),
    Question("Single Batch Overlap", "next, Tier 1", ("08_single_batch_overlap",)),
    Question("FP4 quantize kernels", "not examined", ("06_nvfp4_kernels",)),
    Question("FlashInfer's FP4 API under fullgraph=True", "not examined", ("12_fp4_api_audit",)),
    Question("A live SGLang server (the harness)", "4-minute restarts", ("13_sglang_cpu_server",)),
)
"""The story's list first, then what fp4lab added, each with the notebooks whose summaries decide it."""


def _reproduce_status() -> dict[str, dict]:
    return {r["values"]["notebook"]: r["values"] for r in records.latest("reproduce")}


def _summary(notebook: str) -> dict | None:
    found = of_kind(records.latest(notebook), "summary")
    return found[-1] if found else None


def _not_run(notebook: str, status: dict[str, dict]) -> str:
    s = status.get(notebook)
    if s is None:
        return f"{notebook} has no records: run make reproduce"
    return f"{notebook} {s['status']}: {s['reason']}"


def evidence_text(notebook: str) -> str:
    """``trace, simulated target · cpu, SM12.0 simulated``: the levels of a notebook's newest
    summary and where they were reached (the target SM of any record of that run)."""
    rows = records.latest(notebook)
    summary = of_kind(rows, "summary")[-1]
    levels = ", ".join(level.replace("_", " ") for level in summary["values"].get("evidence") or [])
    prov = next((r["provenance"] for r in rows if r["provenance"].get("target_sm")), None)
    target = (
        f"SM{prov['target_sm']} {'simulated' if prov['simulated'] else 'real'}"
        if prov
        else "no target SM"
    )
    return f"{levels or 'a timing, no level'} · {summary['provenance']['device']}, {target}"


def _decided(question: Question, status: dict[str, dict]) -> dict:
    summaries = [_summary(nb) for nb in question.notebooks]
    missing = [nb for nb, s in zip(question.notebooks, summaries, strict=True) if s is None]
    row = {"optimization": question.optimization, "story said": question.story_said}
    if missing:
        return {**row, "verdict": "UNMEASURED", "evidence": "no record",
                "number": "", "why": "; ".join(_not_run(nb, status) for nb in missing)}  # fmt: skip
    values = [s["values"] for s in summaries]
    unrecorded = [
        nb for nb, v in zip(question.notebooks, values, strict=True) if "verdict" not in v
    ]
    if unrecorded:
        return {**row, "verdict": "UNMEASURED", "evidence": evidence_text(question.notebooks[-1]),
                "number": "", "why": f"{', '.join(unrecorded)}: its newest run predates recorded "
                "verdicts; re-run it"}  # fmt: skip
    verdicts = list(dict.fromkeys(v["verdict"] for v in values))
    return {
        **row,
        "verdict": verdicts[0] if len(verdicts) == 1 else " / ".join(verdicts),
        "evidence": evidence_text(question.notebooks[-1]),
        "number": "; ".join(v["number"] for v in values),
        "why": values[-1]["why"],
    }


def verdict_table() -> pd.DataFrame:
    """One row per question: the verdict, its evidence, the deciding number, why, the notebooks."""
    status = _reproduce_status()
    rows = [{**_decided(q, status), "see": list(q.notebooks)} for q in QUESTIONS]
    return pd.DataFrame(rows)


def verdict_view() -> Styler:
    """The verdict table as the report shows it: wrapped to the page, notebooks as links."""
    table = verdict_table()
    for column in ("number", "why"):
        table[column] = [view.within(text, view.CELL_WORDS, nbs[-1]) if text else text
                         for text, nbs in zip(table[column], table["see"], strict=True)]  # fmt: skip
    table["see"] = [" ".join(view.link(nb) for nb in nbs) for nbs in table["see"]]
    widths = {"optimization": "15%", "story said": "9%", "verdict": "10%", "evidence": "14%",
              "number": "22%", "why": "24%", "see": "6%"}  # fmt: skip
    return view.table(table, widths, raw=("see",))


def answer() -> str:
    """The first screen's answer, in Markdown: was PCG really blocked, and what is each
    alternative worth, each with its verdict and number as the records give them."""
    table = verdict_table().set_index("optimization")

    def said(question: Question) -> str:
        row = table.loc[question.optimization]
        return f"**{row['verdict']}** ({row['number'] or row['why']})"

    story, custom_op, flashinfer, sglang = QUESTIONS[:4]
    alternatives = "; ".join(f"{q.optimization}: {said(q)}" for q in QUESTIONS[4:7])
    return (
        f"**Was piecewise CUDA graphs really blocked?** As the story compiled it: {said(story)}. "
        f"With a custom op around the quantize: {said(custom_op)}. In FlashInfer's own releases: "
        f"{said(flashinfer)}. In SGLang's releases: {said(sglang)}.\n\n"
        f"{sglang_per_sm()}"
        f"**What the alternatives are worth.** {alternatives}.\n\n"
        "Each verdict claims no more than its evidence column: *trace* means dynamo traced the "
        "code and nothing ran; *simulated target* means the Blackwell SM was made up on a CPU; "
        "*simulated capture* means CUDA-graph capture was imitated on a CPU (the captured "
        "operators re-run on the captured tensors)."
    )


def sglang_per_sm() -> str:
    """GLM-5 through SGLang's releases per SM: notebook 11's grid and its per-SM table ('' before
    a run that recorded a timeline)."""
    table = answers.per_sm()
    if not table:
        return ""
    return (f"**GLM-5 through SGLang's releases, per SM** (trace on a simulated target; "
            f"tc_piecewise is the story's path, not what every release gives with no flag):\n\n"
            f"{answers.grid_html()}\n\n{table}\n{answers.per_sm_given()}\n")  # fmt: skip


def provenance_table() -> pd.DataFrame:
    """Each notebook with records: where its newest run's numbers came from."""
    names = sorted(paths.record_files())
    rows = [
        (name, provenance_line(records.latest(name)[-1]["provenance"]))
        for name in names
        if records.latest(name)
    ]
    return pd.DataFrame(rows, columns=["notebook", "provenance"])


def passed_over_table() -> pd.DataFrame:
    """Runs newer than the one each notebook's numbers come from (``records.latest``): when they
    ran, how many records they wrote, why they were passed over, and what `make reproduce` said
    of the notebook last."""
    status = _reproduce_status()
    rows = [
        {
            "notebook": name,
            "started (UTC)": run["time_utc"],
            "records": run["records"],
            "passed over because": run["why"],
            "make reproduce said": ": ".join(
                str(status[name][k]) for k in ("status", "reason") if status[name][k]
            )
            if name in status
            else "",
        }
        for name in sorted(paths.record_files())
        for run in records.newer_runs(name)
    ]
    columns = ["notebook", "started (UTC)", "records", "passed over because", "make reproduce said"]
    return pd.DataFrame(rows, columns=columns)


def skipped_table() -> pd.DataFrame:
    """What the last `make reproduce` ran, failed or skipped, and why."""
    columns = ["notebook", "status", "reason", "seconds"]
    rows = records.latest("reproduce")
    if not rows:
        return pd.DataFrame(columns=columns)
    return (
        pd.DataFrame([r["values"] for r in rows])[columns]
        .drop_duplicates("notebook", keep="last")
        .reset_index(drop=True)
    )
