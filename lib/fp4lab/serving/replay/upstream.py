"""What upstream itself saw of GLM-5 with prefill graphs, next to the replay's cells: agree,
disagree, or why the two cannot be compared.

Each fact is a citation (upstream's CI, an issue with its logs), never an outcome of fp4lab's:
it names the releases and SM it was seen on and what was seen; ``agreement`` reads the replay's
decision rows for the same cells and says whether they say the same, comparing only what the
replay measured (the resolution, the trace, the compiled output, the kernels' availability as
the installed packages declare it), never what the kernels it stood in for would have done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fp4lab.serving.replay import decide, versions

AGREE, DISAGREE, NOT_COMPARABLE = "agree", "disagree", "not comparable"


@dataclass(frozen=True)
class Fact:
    """One thing upstream saw: where (``source``, ``url``), on which releases and SM, and what;
    ``graph``, the prefill graph it concerns (``tc_piecewise``, ``breakable`` or ``full``; None:
    start-up, before any graph)."""

    source: str
    url: str
    releases: tuple[str, ...]
    sm: str
    said: str
    compare: Callable[[dict], tuple[str, str]]
    graph: str | None = "tc_piecewise"

    def replayed(self, row: dict) -> str:
        """The cell's outcome for the graph this fact concerns, named."""
        if self.graph is None:
            return str(row["outcome"])
        outcome = row["outcome"] if self.graph == "tc_piecewise" else row.get(self.graph)
        return f"{self.graph}: {outcome}"


def _ci_runs(row: dict) -> tuple[str, str]:
    if row["outcome"] == "compiles":
        return AGREE, "compiles as released and equals eager"
    if row["outcome"] in ("blocked", "wrong output", "kernel unavailable"):
        return DISAGREE, f"the replay says {row['outcome']}: {decide.short(row['note'])}"
    return NOT_COMPARABLE, f"{row['outcome']}: {decide.short(row['note'])}"


def _dsa_trtllm_fp8(row: dict) -> tuple[str, str]:
    chosen = row.get("kernel_backends") or {}
    if not chosen:
        return NOT_COMPARABLE, "the release's resolution was not recorded"
    picked = (chosen.get("dsa_prefill_backend") or chosen.get("nsa_prefill_backend"),
              chosen.get("dsa_decode_backend") or chosen.get("nsa_decode_backend"),
              chosen.get("kv_cache_dtype"))  # fmt: skip
    said = f"the release resolves prefill={picked[0]}, decode={picked[1]}, KV {picked[2]}"
    fmha = [k for k in row.get("kernels") or [] if "TllmGenFmhaRunner" in k["kernel"]]
    if picked != ("trtllm", "trtllm", "fp8_e4m3"):
        return DISAGREE, said
    if not fmha:
        return NOT_COMPARABLE, f"{said}; the replay recorded no trtllm-gen FMHA kernel"
    gate = fmha[0]
    verdict = AGREE if gate["available"] == "no" else DISAGREE
    return verdict, (f"{said}; trtllm-gen FMHA on SM{row['sm']}: {gate['available']} "
                     f"({gate['evidence']})")  # fmt: skip


def _deepgemm(row: dict) -> tuple[str, str]:
    found = row.get("deep_gemm") or {"evidence": "DeepGEMM's sources were not read"}
    if found.get("available") != "no":
        return NOT_COMPARABLE, f"{found['evidence']}; the replay's cell: {row['outcome']}"
    return AGREE, (f"{decide.short(found['evidence'])}: upstream's \"Unsupported architecture\" is "
                   f"DeepGEMM refusing such a GPU (that start-up calls it is upstream's log, not "
                   f"replayed)")  # fmt: skip


def _musa_probe(row: dict) -> tuple[str, str]:
    met = decide.BLOCKERS["musa_probe_constant"] in row.get("blockers", [])
    if row["outcome"] not in decide.MEASURED:
        return NOT_COMPARABLE, f"{row['outcome']}: {decide.short(row['note'])}"
    return (
        (AGREE, "blocked at the same probe")
        if met
        else (DISAGREE, f"the replay met no is_musa blocker ({row['outcome']})")
    )


def _weak_refs(row: dict) -> tuple[str, str]:
    at_risk = row.get("breakable_weak_refs_at_risk")
    if at_risk is None:
        return NOT_COMPARABLE, f"breakable {row.get('breakable')}: no capture was counted"
    if not at_risk:
        return (
            DISAGREE,
            f"breakable {row['breakable']}: no break input is held by weak reference only",
        )
    return AGREE, (f"breakable {row['breakable']}: {at_risk} break inputs are held by weak reference "
                   f"only, with a bucket captured after theirs (the bug's precondition; a CPU "
                   f"keeps their memory, so the replay cannot show the reuse itself)")  # fmt: skip


FACTS = (
    Fact("upstream CI (test_pcg_glm5_fp4.py)",
         "https://github.com/sgl-project/sglang/tree/main/test",
         tuple(v for v in versions.VERSIONS if versions.order("0.5.13") <= versions.order(v)
               <= versions.order("0.5.21")), "10.0",
         "GLM-5-NVFP4 served with tc_piecewise prefill graphs on B200 passes CI", _ci_runs),
    Fact("sglang#26087", "https://github.com/sgl-project/sglang/issues/26087", ("0.5.12",), "12.0",
         "GLM-5.1-NVFP4 on 8x RTX PRO 6000: every DSA backend stops at start-up at DeepGEMM's "
         "\"Unsupported architecture\"", _deepgemm, graph=None),
    Fact("sglang#29562", "https://github.com/sgl-project/sglang/issues/29562",
         tuple(v for v in versions.VERSIONS if versions.order("0.5.14") <= versions.order(v)
               <= versions.order("0.5.21")), "12.0",
         "GLM-5.2-NVFP4 on RTX PRO 6000 (a dev image): \"Set DSA backends for fp8_e4m3 KV Cache: "
         "prefill=trtllm, decode=trtllm\", then the tc_piecewise compile pass stops in FlashInfer's "
         "TllmGenFmhaRunner: \"Unsupported architecture\"", _dsa_trtllm_fp8),
    Fact("sglang#39054", "https://github.com/sgl-project/sglang/issues/39054", ("0.5.21",), "all",
         "on a real GPU, dynamo stops at is_musa()'s import probe inside the traced forward",
         _musa_probe),
    Fact("sglang#37606", "https://github.com/sgl-project/sglang/issues/37606",
         tuple(v for v in versions.VERSIONS if versions.order("0.5.15") <= versions.order(v)),
         "all", "breakable capture keeps each break's inputs as weak_ref_tensor views; the graph "
         "pool gives their memory to buckets captured later: wrong greedy output or an illegal "
         "memory access (its fix, sglang#37448, is in no release here)", _weak_refs, "breakable"),
)  # fmt: skip
"""The upstream facts the replay is held against (each release's cell of the SM named; ``all``
for every SM)."""


def agreement(rows: list[dict]) -> list[dict]:
    """One row per fact and replayed cell it names: the fact, the cell and the verdict with why;
    a fact whose cells this run did not replay says so."""
    found = []
    for fact in FACTS:
        cells = [r for r in rows if r["sglang_version"] in fact.releases
                 and (fact.sm == "all" or r["sm"] == fact.sm)]  # fmt: skip
        for row in cells:
            verdict, why = fact.compare(row)
            found.append({"source": fact.source, "upstream saw": fact.said,
                          "release": row["sglang_version"], "SM": row["sm"],
                          "replay": fact.replayed(row), "verdict": verdict, "why": why,
                          "url": fact.url})  # fmt: skip
        if not cells:
            found.append({"source": fact.source, "upstream saw": fact.said,
                          "release": ", ".join(fact.releases), "SM": fact.sm, "replay": "",
                          "verdict": NOT_COMPARABLE, "why": "not replayed in this run",
                          "url": fact.url})  # fmt: skip
    return found


def grouped(found: list[dict]) -> list[dict]:
    """``agreement``'s rows with consecutive releases of one fact, SM, verdict and why as one
    row, the releases as a range."""
    rows: list[dict] = []
    for row in found:
        last = rows[-1] if rows else None
        same = last and all(last[k] == row[k] for k in ("source", "SM", "replay", "verdict", "why"))
        if same and row["release"] in versions.VERSIONS:
            last["to"] = row["release"]
            last["release"] = versions.span(last["from"], row["release"])
        else:
            rows.append({**row, "from": row["release"], "to": row["release"]})
    return [{k: v for k, v in r.items() if k not in ("from", "to")} for r in rows]
