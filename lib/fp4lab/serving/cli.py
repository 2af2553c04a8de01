"""The command-line options an installed SGLang really has, read from its own argument parser.

``read_parser`` runs ``fp4lab/serving/read_parser.py`` with SGLang's interpreter and keeps the
result beside that environment. ``CliSpec.check`` refuses a command line the parser would
refuse (exit 2 after a minute of imports) before anything is launched, naming the options of
the same topic the installed version does have; ``CliSpec.status`` says whether an option is
accepted, accepted but deprecated, or rejected.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fp4lab.core import process

READER = Path(__file__).with_name("read_parser.py")
MARK = "FP4LAB-PARSER "
CACHE = ".fp4lab-parsers"
_GENERIC = {
    "enable",
    "disable",
    "enforce",
    "use",
    "no",
    "max",
    "min",
    "num",
    "size",
    "path",
    "mode",
}


class UnknownOption(ValueError):
    """A command line names an option, or a value, the installed SGLang does not accept."""


class ParserUnreadable(RuntimeError):
    """SGLang's interpreter could not build the module's parser (a broken environment)."""


@dataclass(frozen=True)
class Option:
    """One optional argument as the parser defines it."""

    options: tuple[str, ...]
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None
    help: str

    @property
    def deprecated(self) -> bool:
        return self.help.lower().startswith("deprecated")

    def describe(self) -> str:
        shown = "/".join(self.options)
        return f"{shown} {{{','.join(self.choices)}}}" if self.choices else shown


@dataclass(frozen=True)
class CliSpec:
    """The optional arguments of one SGLang module (``sglang.launch_server`` ...) of one version."""

    module: str
    sglang: str | None
    options: tuple[Option, ...]

    @classmethod
    def from_json(cls, data: dict) -> CliSpec:
        options = tuple(
            Option(
                tuple(o["options"]),
                o["dest"],
                o["takes_value"],
                o["nargs"],
                tuple(o["choices"]) if o["choices"] else None,
                o["help"],
            )
            for o in data["options"]
        )
        return cls(data["module"], data.get("sglang"), options)

    @property
    def who(self) -> str:
        return f"this SGLang ({self.sglang or 'unknown version'}, {self.module})"

    def find(self, flag: str) -> Option | None:
        return next((o for o in self.options if flag in o.options), None)

    def related(self, flag: str) -> tuple[str, list[Option]]:
        """The options sharing the longest run of words with ``flag``, and that run ('' if none)."""
        words = flag.lstrip("-").split("-")
        for n in range(len(words), 0, -1):
            for start in range(len(words) - n + 1):
                window = words[start : start + n]
                if set(window) <= _GENERIC:
                    continue
                topic = "-".join(window)
                found = [o for o in self.options if any(topic in s for s in o.options)]
                if found:
                    return topic, found
        return "", []

    def no_such_option(self, flag: str) -> UnknownOption:
        """The error for a flag the parser lacks, naming the options of its topic."""
        topic, found = self.related(flag)
        listed = "; ".join(o.describe() for o in found) if found else "none"
        return UnknownOption(
            f"{self.who} has no option {flag}; its {topic or 'related'} options are: {listed}"
        )

    def check(self, argv: Sequence[str]) -> None:
        """Raise UnknownOption for any flag, value or stray argument the parser would refuse."""
        index = 0
        while index < len(argv):
            token = argv[index]
            index += 1
            if not token.startswith("-"):
                raise UnknownOption(f"{self.who} would refuse the stray argument {token!r}")
            flag, has_inline, inline = token.partition("=")
            option = self.find(flag)
            if option is None:
                raise self.no_such_option(flag)
            if not option.takes_value:
                if has_inline:
                    raise UnknownOption(f"{self.who}: {flag} takes no value, got {inline!r}")
                continue
            values = [inline] if has_inline else []
            while not has_inline and index < len(argv) and not argv[index].startswith("--"):
                values.append(argv[index])
                index += 1
                if option.nargs in (None, 1, "?"):
                    break
            if not values and option.nargs not in ("?", "*"):
                raise UnknownOption(f"{self.who}: {flag} needs a value")
            bad = [v for v in values if option.choices and v not in option.choices]
            if bad:
                raise UnknownOption(
                    f"{self.who}: {flag} takes one of {', '.join(option.choices)}; not {bad[0]!r}"
                )

    def status(self, flag: str) -> str:
        """accepted | deprecated (accepted, but its help says it is deprecated) | rejected."""
        option = self.find(flag)
        if option is None:
            return "rejected"
        return "deprecated" if option.deprecated else "accepted"


def read_parser(python: str, module: str, timeout_s: float = 600.0) -> CliSpec:
    """The parser ``module`` builds in ``python``'s environment (cached in that environment)."""
    cache = Path(python).parent.parent / CACHE / f"{module}.json"
    if cache.exists():
        return CliSpec.from_json(json.loads(cache.read_text()))
    cache.parent.mkdir(parents=True, exist_ok=True)
    log = cache.with_suffix(".log")
    log.unlink(missing_ok=True)
    finished = process.run([python, str(READER), module], log, timeout_s)
    text = log.read_text(errors="replace") if log.exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith(MARK)), None)
    if not finished.ok or line is None:
        raise ParserUnreadable(
            f"could not read {module}'s parser: {finished.describe()}\n{process.tail(log)}"
        )
    data = json.loads(line[len(MARK) :])
    cache.write_text(json.dumps(data))
    return CliSpec.from_json(data)
