"""serving.standins: the import checks that decide which stand-in an environment needs."""

from __future__ import annotations

import sys

from fp4lab.serving import standins


def test_each_module_is_checked_in_one_process_and_a_failure_names_its_last_line():
    found = standins._import_errors(sys.executable, ["json", "no_such_module_fp4lab"])
    assert found == {"json": "", "no_such_module_fp4lab": (
        "ModuleNotFoundError: No module named 'no_such_module_fp4lab'")}  # fmt: skip


def test_a_prelude_that_fails_is_every_modules_error():
    found = standins._import_errors(sys.executable, ["json", "os"], "raise OSError('no GPU'); ")
    assert found == dict.fromkeys(["json", "os"], "OSError: no GPU")
