"""Bad input to every command-line entry point: a named error (the parameter and what is
allowed), exit code 2, no traceback, nothing recorded; each row goes to the reliability table."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

CASES = [
    (["fp4lab.core.runner", "reproduce", "--notebooks", ","], "NOTEBOOKS is empty; allowed values"),
    (["fp4lab.core.runner", "reproduce", "--notebooks", "42"], "NOTEBOOKS contains '42', which is not a notebook"),
    (["fp4lab.core.runner", "reproduce", "--notebooks", "05", "--param", "tokenz=3"],
     "--param tokenz: no selected notebook has such a parameter; allowed values: backends"),
    (["fp4lab.core.runner", "reproduce", "--param", "tokens"], "--param 'tokens' must look like NAME=VALUE"),
    (["fp4lab.compile.matrix", "run", "--versions", "9.9.9"],
     "versions contains '9.9.9': flashinfer-python has no such release on the package index"),
    (["fp4lab.compile.matrix", "run", "--versions", "latest"], "versions contains 'latest', which is not a version"),
    (["fp4lab.compile.audit", "flashinfer:fp4_quantize", "--versions", "abc"],
     "versions contains 'abc', which is not a version"),
    (["fp4lab.compile.audit", "flashinfer:fp4_quantize", "--sm", "13.7"], "sms='13.7' is not a known SM"),
    (["fp4lab.compile.audit", "flashinfer:no_such_fp4"], "has no attribute 'no_such_fp4'"),
    (["fp4lab.serving.replay", "run", "--versions", "0.4.0"], "sglang_versions contains '0.4.0'; allowed values"),
    (["fp4lab.serving.replay", "run", "--sms", "8.0"], "sms contains '8.0'; allowed values: 9.0, 10.0, 12.0"),
    (["fp4lab.core.bundle", "build", "{tmp}/bundle", "--with", "scipy"],
     "--with ['scipy']: allowed values: numpy, pandas, matplotlib"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "named"), CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_bad_input_is_named_without_a_traceback(argv, named, tmp_path, monkeypatch, reliability):
    monkeypatch.setenv("FP4LAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FP4LAB_BUILD_DIR", str(tmp_path / "build"))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", *(a.format(tmp=tmp_path) for a in argv)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    reliability({"case": " ".join(argv), "kind": "bad input", "clear_error": named in output,
                 "traceback": "Traceback" in output, "orphans": 0, "seconds": seconds})  # fmt: skip
    assert done.returncode == 2, output[-2000:]
    assert named in done.stderr and "Traceback" not in output, output[-2000:]
    assert not (tmp_path / "data").exists(), "nothing is recorded for a refused input"
