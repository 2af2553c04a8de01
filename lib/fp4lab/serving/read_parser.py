"""Print, as JSON, the argument parser an SGLang command-line module builds, without running it.

Run by SGLang's own interpreter (it imports nothing from fp4lab):
``<sglang env>/bin/python read_parser.py sglang.launch_server``. The module is run as
``__main__`` with ``argparse.ArgumentParser.parse_args`` replaced by a function that captures
the parser and stops, so what is printed is exactly the parser the module would parse its
command line with, whatever version built it. ``fp4lab.serving.cli`` reads the output.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys


class _Captured(BaseException):
    """Raised from parse_args to stop the module once its parser is complete."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def describe(parser: argparse.ArgumentParser) -> list[dict]:
    """Every optional argument: its spellings, whether it takes a value, its choices, default and help."""
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        options.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "takes_value": action.nargs != 0,
                "nargs": action.nargs if isinstance(action.nargs, (int, str)) else None,
                "choices": [str(c) for c in action.choices] if action.choices else None,
                "help": str(action.help or "") if action.help is not argparse.SUPPRESS else "",
                "default": None
                if action.default in (None, argparse.SUPPRESS)
                else str(action.default),
            }
        )
    return options


def main(module: str) -> int:
    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    sys.argv = [module]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Captured as captured:
        version = None
        try:
            from importlib.metadata import version as package_version

            version = package_version("sglang")
        except Exception:  # a stand-in module has no distribution
            version = None
        print("FP4LAB-PARSER " + json.dumps({"module": module, "sglang": version,
                                             "options": describe(captured.parser)}))  # fmt: skip
        return 0
    print(f"{module} finished without parsing a command line", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
