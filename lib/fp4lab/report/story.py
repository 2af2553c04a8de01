"""The story's replay in the report: each of its three crashes as this run observed it.

Nothing here runs an experiment; the table is drawn from the newest records in data/."""

from __future__ import annotations

import pandas as pd

from fp4lab.core import records

STORY_STEPS = (
    ("msg 988", "01_nvcc_subprocess_crash", "attempt"),
    ("msg 992", "02_file_io_trace", "verdict"),
    ("msgs 1002/1009", "03_compiler_disable_fullgraph", "attempt"),
)
"""The story's three crashes: its message, the notebook that replays it, the record kind that holds the verdict."""


def of_kind(rows: list[dict], kind: str) -> list[dict]:
    """The records of one kind."""
    return [r for r in rows if r["kind"] == kind]


def target_text(prov: dict) -> str:
    """``SM12.0 (simulated)``: the target a record was made for, and whether it was real."""
    return f"SM{prov['target_sm']} ({'simulated' if prov['simulated'] else 'real'})"


def needed_text(values: dict) -> str:
    """What a crash needed before it was reached: the stages applied, the story's own marked."""
    stages = values.get("stages_applied") or []
    text = ", ".join(
        f"{s['stage']} ({'story patch' if s.get('story_patch') else s.get('origin')})"
        for s in stages
    )
    if values.get("depends_on_flashinfer") is False:
        text += (
            "; " if text else ""
        ) + "FlashInfer not needed: a plain function fails the same way"
    return text or "nothing"


def story_table() -> pd.DataFrame:
    """Each crash of the story: what it said, what this run observed, and whether they agree."""
    table = []
    for message, notebook, kind in STORY_STEPS:
        found = of_kind(records.latest(notebook), kind)
        if not found:
            table.append(
                {
                    "story": message,
                    "notebook": notebook,
                    "reproduced": "no record: the notebook did not run",
                }
            )
            continue
        r = found[0]
        v = r["values"]
        table.append(
            {
                "story": message,
                "notebook": notebook,
                "expected": v["expected_signature"],
                "observed": v["signature"],
                "reproduced": "yes"
                if v["signature"] == v["expected_signature"]
                else "NO: upstream behaviour changed",
                "dynamo says": v.get("message"),
                "blocked in": v.get("blocker_frame"),
                "seconds": round(v["seconds"], 2),
                "target": target_text(r["provenance"]),
                "needed first": needed_text(v),
                "evidence": ", ".join(v.get("evidence") or []) or "not recorded",
            }
        )
    return pd.DataFrame(table)


SHORT = ("story", "notebook", "expected", "observed", "reproduced", "seconds", "target", "evidence")
"""The story table's columns a reader scans; the long ones are ``story_details``'."""


def story_summary() -> pd.DataFrame:
    """``story_table``'s short columns: each crash, expected and observed, reproduced or not."""
    table = story_table()
    return table[[c for c in SHORT if c in table]]


def story_details() -> pd.DataFrame:
    """``story_table``'s long columns, keyed by the story's message: dynamo's words, the frame it
    stopped in, what had to be in place first."""
    table = story_table()
    return table[[c for c in ("story", "dynamo says", "blocked in", "needed first") if c in table]]
