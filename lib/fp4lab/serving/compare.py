"""The story's serving comparison: the same model launched with and without Single Batch
Overlap and MSCCLPP, each benchmarked with bench_serving and stopped before the next.

``compare`` runs any list of configurations from the SGLang environment's interpreter. Before
each launch the switches are checked against the installed version's own parser: a rejected
option is recorded as such and not launched. After a launch the record says, per switch,
whether SGLang accepted it or ignored it (its resolved arguments differ), and a configuration
with MSCCLPP says whether MSCCLPP really ran (SGLang's own log line) or fell back to NCCL, and
why. ``serving_settings`` checks notebook 08's serving parameters and ``switch_comparison``
runs its section: skipped (and recorded as skipped) where the machine cannot serve.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd

from fp4lab.core import params, probe, records
from fp4lab.serving.bench import BenchmarkError, bench_serving, serving_table
from fp4lab.serving.cli import CliSpec, UnknownOption
from fp4lab.serving.config import ServerConfig, check_extra_args, pcg_args
from fp4lab.serving.logs import mscclpp_outcome, resolved_args
from fp4lab.serving.server import ServerError, checked, free_port, launch
from fp4lab.serving.sglang_env import ensure_sglang
from fp4lab.serving.tiny_model import make_tiny_model

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_MODEL_PATHS = '"" (a tiny random Llama made here), an existing model folder, or a Hugging Face id such as org/name'
_RESOLVED_AS = {
    "--enable-mscclpp": "enable_mscclpp",
    "--enable-single-batch-overlap": "enable_single_batch_overlap",
}
"""Switches and the resolved server argument that says whether SGLang kept them."""


def unavailable(machine: probe.Machine | None = None) -> str | None:
    """Why this machine cannot run the story's server comparison (SGLang on several Blackwell GPUs), or None."""
    machine = machine or probe.machine()
    return machine.missing("multi-gpu") or machine.missing("fp4-gpu")


@dataclass
class Comparison:
    """One configuration's outcome: its serving rows, or why it has none; what SGLang made of
    each switch; and, with MSCCLPP, whether it ran."""

    config: ServerConfig
    status: str  # ran | failed | rejected
    rows: list[dict] = field(default_factory=list)
    reason: str = ""
    findings: list[str] = field(default_factory=list)
    ready_after_s: float | None = None
    options: dict[str, str] = field(default_factory=dict)
    mscclpp: str = ""
    log_tail: str = ""

    @property
    def shown_as(self) -> str:
        """The label tables and plots use: an MSCCLPP run that fell back says so."""
        fell_back = self.mscclpp.startswith("fell back")
        return self.config.label + (" (fell back to nccl)" if fell_back else "")

    def as_record(self) -> dict:
        """The outcome with its first bench_serving row, for records."""
        return {
            "label": self.config.label, "shown_as": self.shown_as, "status": self.status,
            "reason": self.reason, "findings": self.findings, "ready_after_s": self.ready_after_s,
            "options": self.options, "mscclpp": self.mscclpp, "log_tail": self.log_tail,
            "sglang_version": self.config.cli.sglang if self.config.cli else None,
            "evidence": ["serving"] if self.status == "ran" else [],
            **(self.rows[0] if self.rows else {}),
        }  # fmt: skip

    def describe(self) -> str:
        """One line: the label, how it ended, and what a failed launch's log shows."""
        shown = f": {self.reason} ({', '.join(self.findings) or 'no known signature'})"
        mscclpp = f" [mscclpp: {self.mscclpp}]" if self.mscclpp else ""
        return f"{self.shown_as}: {self.status.upper()}" + (shown if self.reason else "") + mscclpp


def switch_matrix(base: ServerConfig) -> list[ServerConfig]:
    """The base configuration, with SBO, with MSCCLPP, and with both."""
    return [
        replace(base, enable_single_batch_overlap=sbo, enable_mscclpp=mscclpp)
        for mscclpp, sbo in ((False, False), (False, True), (True, False), (True, True))
    ]


def switch_flags(config: ServerConfig) -> list[str]:
    """The flags of the switches ``config`` turns on or off, as its parser spells them."""
    flags = ["--enable-mscclpp"] if config.enable_mscclpp else []
    flags += ["--enable-single-batch-overlap"] if config.enable_single_batch_overlap else []
    if config.piecewise_cuda_graph is not None and config.cli is not None:
        with_pcg = [a for a in pcg_args(config.cli, config.piecewise_cuda_graph) if a[:2] == "--"]
        flags += with_pcg[:1]
    return flags


def option_outcomes(cli: CliSpec, flags: list[str], resolved: dict) -> dict[str, str]:
    """Per flag: accepted | deprecated | ignored (SGLang resolved it otherwise) | rejected."""
    outcomes = {}
    for flag in flags:
        status = cli.status(flag)
        key = _RESOLVED_AS.get(flag)
        if status != "rejected" and key and resolved and resolved.get(key) is not True:
            status = f"ignored: SGLang resolved {key}={resolved.get(key)!r}"
        outcomes[flag] = status
    return outcomes


def _run_one(
    config: ServerConfig, folder: Path, ready_timeout_s: float, recorder, bench
) -> Comparison:
    try:
        config = checked(config)
    except UnknownOption as exc:
        options = {f: "rejected" if config.cli and config.cli.status(f) == "rejected" else "accepted"
                   for f in switch_flags(config)}  # fmt: skip
        return Comparison(config, "rejected", reason=str(exc), options=options)
    log = Path(folder) / f"server_{config.label}.log"
    out = Path(folder) / f"bench_serving_{config.label}.jsonl"
    try:
        with launch(config, log, ready_timeout_s) as server:
            rows = bench_serving(server, out, recorder=recorder, **bench)
            outcome = Comparison(config, "ran", rows, ready_after_s=server.ready_after_s)
    except (ServerError, BenchmarkError) as exc:
        outcome = Comparison(
            config, "failed", reason=str(exc).splitlines()[0],
            findings=[f.signature for f in getattr(exc, "findings", [])],
            log_tail=getattr(exc, "log_tail", ""),
        )  # fmt: skip
    text = log.read_text(errors="replace") if log.exists() else ""
    outcome.options = option_outcomes(config.cli, switch_flags(config), resolved_args(text))
    if config.enable_mscclpp:
        ran, proof = mscclpp_outcome(text)
        outcome.mscclpp = f"ran: {proof}" if ran else proof
    return outcome


def compare(
    configs: Sequence[ServerConfig],
    folder: Path,
    *,
    ready_timeout_s: float = 900.0,
    recorder: records.Recorder | None = None,
    **bench: object,
) -> list[Comparison]:
    """Check, launch, benchmark and stop each configuration in turn; a rejected, crashed or
    never-ready one is kept, named, and the others go on."""
    return [_run_one(c, folder, ready_timeout_s, recorder, bench) for c in configs]


@dataclass(frozen=True)
class ServingSettings:
    """The serving comparison's checked parameters."""

    model_path: str
    tp_size: int
    server_extra_args: tuple[str, ...]
    num_prompts: int
    input_len: int
    output_len: int
    ready_timeout_s: int

    @property
    def params(self) -> dict:
        """The settings a record names (not the timeout, which changes no result)."""
        chosen = asdict(self)
        del chosen["ready_timeout_s"]
        return {**chosen, "server_extra_args": list(self.server_extra_args)}


def check_model_path(model_path: object) -> None:
    """ "" (make a tiny model), an existing folder, or something shaped like a Hugging Face id."""
    if model_path == "" or (
        isinstance(model_path, str) and (Path(model_path).is_dir() or _HUB_ID.fullmatch(model_path))
    ):
        return
    raise ValueError(f"model_path={model_path!r} is not allowed; allowed values: {_MODEL_PATHS}")


def serving_settings(
    *,
    model_path: str,
    tp_size: int,
    server_extra_args: list[str],
    num_prompts: int,
    input_len: int,
    output_len: int,
    ready_timeout_s: int,
) -> ServingSettings:
    """Check the serving parameters (ValueError naming the parameter and its allowed values)."""
    check_model_path(model_path)
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 0:
        raise ValueError(
            f"tp_size={tp_size!r} is not allowed; allowed values: 0 (every GPU) or a positive integer"
        )
    check_extra_args("server_extra_args", server_extra_args)
    for name, value in (
        ("num_prompts", num_prompts),
        ("input_len", input_len),
        ("output_len", output_len),
        ("ready_timeout_s", ready_timeout_s),
    ):
        params.positive(name, value)
    return ServingSettings(
        model_path,
        tp_size,
        tuple(server_extra_args),
        num_prompts,
        input_len,
        output_len,
        ready_timeout_s,
    )


@dataclass
class ServingComparison:
    """The "server" records of the comparison, or why it did not run here."""

    rows: list[dict]
    skip: str | None

    def table(self) -> pd.DataFrame:
        """bench_serving's numbers per configuration that ran, relative to the baseline."""
        return serving_table([r for r in self.rows if r["status"] == "ran"])


def switch_comparison(
    settings: ServingSettings,
    rec: records.Recorder,
    folder: Path,
    machine: probe.Machine | None = None,
) -> ServingComparison:
    """The four launches of ``switch_matrix``, benchmarked and recorded (kind "server"); where
    the machine cannot serve, one "server" record says it was skipped and why."""
    machine = machine or probe.machine()
    skip = unavailable(machine)
    env = None if skip else ensure_sglang()
    if env is not None and not env.ok:
        skip = f"the SGLang {env.version} environment could not be built: {env.error}"
    if skip:
        print(f"serving comparison: SKIPPED: {skip}")
        rec.add("server", {"status": "skipped", "reason": skip})
        return ServingComparison([], skip)
    model = settings.model_path or str(make_tiny_model(Path(folder) / "tiny_model"))
    base = ServerConfig(
        model,
        tp_size=settings.tp_size or machine.gpu_count,
        port=free_port(),
        extra_args=settings.server_extra_args,
        python=env.python,
    )
    outcomes = compare(
        switch_matrix(base),
        folder,
        ready_timeout_s=settings.ready_timeout_s,
        recorder=rec,
        num_prompts=settings.num_prompts,
        input_len=settings.input_len,
        output_len=settings.output_len,
    )
    for outcome in outcomes:
        print(outcome.describe())
    rows = [{**o.as_record(), **env.as_record()} for o in outcomes]
    return ServingComparison(rec.add_all("server", rows), None)
