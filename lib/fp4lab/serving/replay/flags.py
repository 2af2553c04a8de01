"""The options a model's user passes to one SGLang release to get torch.compile piecewise graphs,
read from the release's own parser (help texts, choices, defaults) and its auto-disable rule."""

from __future__ import annotations

from fp4lab.core import glm5


def user_flags(
    options: list[dict], auto_disabled: bool, architecture: str = glm5.ARCHITECTURE
) -> tuple[list[str] | None, str]:
    """The options the user of ``architecture`` passes to this release's server to get
    torch.compile piecewise graphs, read from its own parser (help texts, choices, defaults) and
    its auto-disable rule; None with the reason where no option reaches them."""
    spelled = {name: o for o in options for name in o["options"]}

    def live(flag: str) -> bool:
        return flag in spelled and not spelled[flag]["help"].lower().startswith("deprecated")

    prefill = spelled.get("--cuda-graph-backend-prefill")
    if prefill:
        choices = prefill.get("choices") or []
        if "tc_piecewise" not in choices:
            return None, (f"the release removed torch.compile piecewise graphs: "
                          f"--cuda-graph-backend-prefill takes {'|'.join(choices)}")  # fmt: skip
        flags = [] if prefill.get("default") == "tc_piecewise" else [
            "--cuda-graph-backend-prefill", "tc_piecewise"
        ]  # fmt: skip
        how = (
            f"the parser's default prefill backend is {prefill['default']}"
            if prefill.get("default")
            else "the parser leaves the prefill backend unset: tc_piecewise is asked for"
        )
    elif live("--enable-piecewise-cuda-graph"):
        flags, how = ["--enable-piecewise-cuda-graph"], "off unless enabled"
    elif "--enable-piecewise-cuda-graph" in spelled or "--disable-piecewise-cuda-graph" in spelled:
        flags, how = [], "on by default (the enable option is deprecated)"
    else:
        return None, "the release's parser has no piecewise CUDA graph option"
    if auto_disabled:
        if not live("--enforce-piecewise-cuda-graph"):
            return (
                None,
                f"{architecture} is on the release's auto-disable list, and no option overrides it",
            )
        flags.append("--enforce-piecewise-cuda-graph")
        how += f"; {architecture} is on the release's auto-disable list"
    return flags, how


def flag_row(replay: dict) -> tuple[list[str] | None, str, dict]:
    """The flags, how they were read, and the auto-disable rule a replay recorded."""
    disabled = replay.get("auto_disabled") or {}
    architecture = disabled.get("architecture") or glm5.ARCHITECTURE
    flags, how = user_flags(
        replay.get("piecewise_options", []), bool(disabled.get("disabled")), architecture
    )
    return flags, how, disabled
