"""What a model's user gets from one SGLang release and the flags they pass, read from the
release's own resolution as the replay recorded it (``resolution.reach``): the prefill graph
resolved with no flag and the rule that decided it, and per prefill graph the first command line
that resolves to it; never from the parser's defaults."""

from __future__ import annotations

NEEDED, UNREACHED, UNKNOWN = "none needed", "none reaches it", "unknown"
"""A flag cell where no flag is needed, where no command line reaches the graph, and where the
resolution was not recorded (the release did not import here)."""
CAPTURED = ("breakable", "full")
"""The prefill graphs a release captures through its own runner and backend, walked wherever the
release has that backend (a child's walk, ``prefill_walk``; the outcome, ``breakable_outcome``)."""


def rule_text(resolved: dict) -> str:
    """Where the release decided a resolution: its refusal, else the first frame of its rule with
    its last log line, else that the value parsed stood."""
    if resolved.get("refused"):
        return f"refused: {resolved['refused']}"
    frames, logged = resolved.get("rule") or [], resolved.get("logged") or []
    where = frames[0] if frames else "the parsed value stood"
    said = [line for line in logged if "graph" in line.lower()]
    return where + (f' ("{said[-1].split(": ", 1)[-1]}")' if said else "")


def flag_text(flags: list[str] | None) -> str:
    """A command line beyond the model's own (``NEEDED`` when empty, ``UNREACHED`` for None)."""
    return UNREACHED if flags is None else " ".join(flags) if flags else NEEDED


def read(replay: dict, graph: str = "tc_piecewise") -> dict:
    """The row fields a replay's resolution gives for ``graph``: ``flags`` (None: no option
    reaches it), ``flag``, ``flag_why``, the default prefill graph and its rule, the flags of
    every graph, the kernel backends and token buckets of the default resolution."""
    found = replay.get("resolution")
    if not found:
        return {"flags": None, "flag": UNKNOWN, "flag_why": "the release's resolution was not "
                "recorded", "default_prefill": None, "default_rule": None, "graph_flags": {},
                "kernel_backends": {}, "buckets": None}  # fmt: skip
    default, wanted = found["default"], found["graphs"][graph]
    flags = wanted["flags"]
    by_default = (
        f"the release resolves {default['prefill_graph']} by default ({rule_text(default)})"
    )
    if flags is None:
        why = f"{by_default}; no option reaches {graph}: {rule_text(wanted['resolved'])}"
    elif flags:
        why = f"{by_default}; {' '.join(flags)} resolves {graph} ({rule_text(wanted['resolved'])})"
    else:
        why = by_default
    return {"flags": flags, "flag": flag_text(flags), "flag_why": why,
            "default_prefill": default["prefill_graph"], "default_rule": rule_text(default),
            "graph_flags": {g: flag_text(r["flags"]) for g, r in found["graphs"].items()},
            "kernel_backends": default.get("backends", {}), "buckets": default.get("buckets")}  # fmt: skip
