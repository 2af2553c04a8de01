"""Release resolutions shaped as ``resolution.reach`` records them, for decisions made without a
replay (the tests of real releases read the real ones)."""

from __future__ import annotations

PREFILL = "--cuda-graph-backend-prefill"


def resolved(tc_flags: list[str] | None, default: str = "breakable",
             rule: str = "sglang/srt/model_executor/cuda_graph_config.py:153:<lambda>",
             logged: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """A replay's resolution: ``default`` resolved with no flag (by ``rule``, having logged
    ``logged``), tc_piecewise reached by ``tc_flags`` (None: refused by the parser)."""
    base = ["--quantization", "modelopt_fp4"]
    first = {"flags": base, "prefill_graph": default, "rule": [rule] if rule else [], "logged": list(logged),
             "buckets": [4, 8, 16], "backends": {"attention_backend": "dsa"}}  # fmt: skip
    refused = {"flags": [*base, PREFILL, "tc_piecewise"], "prefill_graph": None,
               "refused": "the parser: argument --cuda-graph-backend-prefill: tc_piecewise was "
               "removed; select breakable, full, or disabled"}  # fmt: skip
    reached = {**first, "prefill_graph": "tc_piecewise", "flags": [*base, *(tc_flags or [])]}
    graphs = {"tc_piecewise": {"flags": tc_flags, "resolved": refused if tc_flags is None else reached},
              "breakable": {"flags": [PREFILL, "breakable"], "resolved": {**first, "prefill_graph": "breakable"}},
              "full": {"flags": [PREFILL, "full"], "resolved": {**first, "prefill_graph": "full"}}}  # fmt: skip
    return {"base": base, "default": first, "graphs": graphs}


REACHED = resolved([PREFILL, "tc_piecewise"])
"""0.5.16-like: breakable by default, tc_piecewise by the prefill option."""
ENABLED = resolved(["--enable-piecewise-cuda-graph"], default="disabled", rule="")
"""0.5.9-like: no prefill graph unless enabled."""
REMOVED = resolved(None)
"""0.5.23-like: breakable by default; tc_piecewise refused by the parser."""
