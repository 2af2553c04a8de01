"""make gpu-bundle: one folder under the limit, installable offline, with SGLang's backend for
notebook 04; run.sh on a CPU skips GPU checks and says what it did not measure."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fp4lab.core import bundle, probe, records, venvs
from fp4lab.serving.capture import breakable_timing, bundled
from fp4lab.serving.replay import versions

SMALL = [
    f"--param={p}"
    for p in ("scale=64", "layers=2", "token_counts=[16]", "backend=eager", "warmup=1", "iters=3",
              "shapes=[[64,256]]", "throughput_shapes=[[128,256]]", "throughput_iters=2",
              "break_releases=all", "break_shape=[8,32,4]", "break_counts=[0,4]")
]  # fmt: skip
"""Notebooks 04 and 06 at test size: the bundle's mechanics, not its measurements."""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "gpu-bundle"
    assert bundle.main(["build", str(out)]) == 0
    assert bundled.main(["add", str(out)]) == 0
    return out


def test_the_bundle_holds_sources_wheels_and_run_sh_under_the_limit(built):
    size = sum(p.stat().st_size for p in built.rglob("*") if p.is_file())
    assert size <= bundle.LIMIT_BYTES
    assert (built / "run.sh").stat().st_mode & 0o111
    assert (built / "src/lib/fp4lab/core/runner.py").exists()
    assert (built / "src/notebooks/06_nvfp4_kernels.ipynb").exists()
    pins = (built / "requirements.txt").read_text().split()
    names = {pin.split("==")[0] for pin in pins}
    assert {"papermill", "ipykernel", "nbformat", "torchao"} <= names
    assert not names & {"torch", "triton", "numpy", "pandas", "matplotlib", "flashinfer-python"}
    wheels = [p.name for p in (built / "wheels").glob("*.whl")]
    assert not [w for w in wheels if w.startswith(("torch-", "triton-"))], (
        "the GPU machine has them"
    )
    for tag in ("cp311", "cp312"):  # binary wheels for this machine's and the GPU machine's Python
        assert any(w.startswith("pyyaml-") and tag in w for w in wheels), tag
    assert not names & {"uv", "pip"}, "run.sh builds no environment and installs with pip"


def test_the_bundle_carries_sglangs_backend_without_what_the_machine_brings(built):
    folder = built / bundled.FOLDER
    pins = (folder / "requirements.txt").read_text().split()
    names = {pin.split("==")[0] for pin in pins}
    assert pins[0] == f"sglang=={bundled.RELEASE}" and {"pydantic", "aiohttp", "orjson"} <= names
    shipped = (built / "requirements.txt").read_text().split()
    assert not names & {p.split("==")[0] for p in shipped}, "each distribution is bundled once"
    assert "pillow" in bundled.provided() and "pillow" not in names, "matplotlib brings it"
    wheels = [p.name for p in (folder / "wheels").glob("*.whl")]
    assert f"sglang-{bundled.RELEASE}-py3-none-any.whl" in wheels
    for tag in ("cp311", "cp312"):
        assert any(w.startswith("pydantic_core-") and tag in w for w in wheels), tag
    kernel = folder / "site" / "sgl_kernel"
    assert (kernel / "__init__.py").exists() and not list(kernel.rglob("*.so*"))
    assert (folder / "site" / bundled.OPS_STANDIN).exists()
    standins = json.loads((folder / "standins.json").read_text())
    assert [s["name"] for s in standins][-1] == "sgl_kernel_binaries_not_bundled"
    carried = sorted((p.name for p in (folder / bundled.BREAKABLE).iterdir()), key=versions.order)
    assert versions.ranges(carried) == "0.5.14–0.5.23", "read from each release's wheel"
    assert sorted(p.name for p in (folder / bundled.BREAKABLE / "0.5.23").iterdir()) == sorted(
        breakable_timing.FILES
    )


def test_the_bundle_names_the_commit_it_was_built_from(built):
    stamped = json.loads((built / "src" / records.BUNDLE_GIT_FILE).read_text())
    assert stamped == records.git_state() and len(stamped["commit"]) == 40


def test_unknown_extras_are_refused_before_any_download(tmp_path, capsys):
    assert bundle.main(["build", str(tmp_path / "b"), "--with", "scipy"]) == 2
    assert "allowed values: numpy, pandas, matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_install_takes_only_what_the_interpreter_lacks(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (tmp_path / "requirements.txt").write_text("pytest==0.0.1\nno-such-dist-fp4lab==1.0\n")
    assert bundle.missing(["pytest==0.0.1", "no-such-dist-fp4lab==1.0"]) == [
        "no-such-dist-fp4lab==1.0"
    ]
    with pytest.raises(subprocess.CalledProcessError):  # offline, and the wheel is not there
        bundle.install(wheels, tmp_path / "site")


def _python_with(env_dir: Path, packages: list[str]) -> Path:
    """A bare python3 (uv-built, from the shared cache) with only ``packages``, their bytecode
    compiled at install as a machine's own python3 has it."""
    uv, env = [venvs.uv_binary(), "--quiet"], {**venvs.uv_environment(), "UV_COMPILE_BYTECODE": "1"}
    subprocess.run(
        [*uv, "venv", "--seed", "--python", sys.executable, env_dir], check=True, env=env
    )
    python = env_dir / "bin" / "python"
    subprocess.run([*uv, "pip", "install", "--python", python, *packages], check=True, env=env)
    return python


def test_run_sh_names_what_the_interpreter_lacks_before_installing_anything(built, tmp_path):
    assert (built / "expects.txt").read_text().split() == ["matplotlib", "numpy", "pandas"]
    python = _python_with(tmp_path / "no-pandas", [venvs.torch_requirement(), "numpy"])
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(built / "run.sh"), str(out)], env={**os.environ,
                          "PYTHON": str(python)}, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "run.sh: this python3 lacks matplotlib, pandas, which the bundle does not carry; nothing "
        "was installed. Rebuild the bundle with them: python -m fp4lab.core.bundle build "
        "build/gpu-bundle --with matplotlib,pandas (or set PYTHON=... to one that has them)"
    )
    assert not (out / ".site").exists()


@pytest.mark.bundle
def test_run_sh_offline_on_a_cpu_python_records_every_gpu_check_as_skipped(built, tmp_path):
    """A python3 with only torch and Triton (and the scientific stack the GPU image has) runs the
    bundle."""
    triton = f"triton=={importlib.metadata.version('triton')}"
    stack = [venvs.torch_requirement(), triton, "pandas==3.1.1", "matplotlib==3.11.2"]
    python = _python_with(tmp_path / "gpu-like-python", stack)
    out = tmp_path / "out"
    run_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FP4LAB_", "PIP_", "JUPYTER"))
    }
    done = subprocess.run(
        ["bash", str(built / "run.sh"), str(out), *SMALL],
        env={**run_env, "PYTHON": str(python), "PIP_NO_INDEX": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    statuses = {
        r["values"]["notebook"]: r["values"]["status"]
        for r in map(json.loads, (out / "data" / "reproduce.jsonl").read_text().splitlines())
    }
    assert statuses == dict.fromkeys(["04_fullgraph_false_tradeoff", "06_nvfp4_kernels"], "ran")
    drive = [json.loads(line) for line in
             (out / "data" / "04_fullgraph_false_tradeoff.jsonl").read_text().splitlines()]  # fmt: skip
    rows = [r["values"] for r in drive if r["kind"] == "sglang_backend"]
    assert {(r["sglang_version"], r["capture"]) for r in rows} == {(bundled.RELEASE, "simulated")}
    assert {r["variant"] for r in rows} == {"fullgraph_false", "custom_op"}
    assert "sgl_kernel_binaries_not_bundled" in rows[0]["environment_standins"]
    packages = next(r for r in drive if r["kind"] == "sglang_backend")["provenance"]["packages"]
    assert packages["sglang"] == bundled.RELEASE and {"pydantic", "sgl-kernel"} <= set(packages)
    refused = {r["values"]["sglang_version"]: r["values"]["why"] for r in drive
               if r["kind"] == "sglang_backend_not_measured"}  # fmt: skip
    assert set(refused) == {"0.5.12", "0.5.21"}
    assert refused["0.5.12"] == (f"environment: the offline GPU bundle carries SGLang "
                                 f"{bundled.RELEASE} only; 0.5.12 needs a package registry to "
                                 f"build its environment")  # fmt: skip
    timed = [r for r in drive if r["kind"] == "breakable_break_cost"]
    carried = sorted({r["values"]["sglang_version"] for r in timed}, key=versions.order)
    assert versions.ranges(carried) == "0.5.14–0.5.23", "every release the bundle carries"
    assert [(r["values"]["variant"], r["values"]["breaks"]) for r in timed][:4] == [
        ("eager", 0),
        ("graph", 0),
        ("breakable", 0),
        ("breakable", 4),
    ]
    assert {r["values"]["loaded_from"] for r in timed} == {"files"} and len(timed) == 40
    assert timed[-1]["provenance"]["packages"]["sglang"] == (
        f"0.5.23 (breakable files), {bundled.RELEASE} (the rest)"
    )
    breakable = [r["values"] for r in timed if r["values"]["variant"] == "breakable"]
    assert all(r["equal"] and r["segments"] == r["breaks"] + 1 for r in breakable)
    assert [r["values"]["check"] for r in drive if r["kind"] == "skipped"] == [
        "sglang_model_capture",
        "breakable_break_cost_timing",
    ]
    assert not (out / "build" / "sglang-compile" / "0.5.12").exists(), "nothing was built"
    skipped = [
        json.loads(line)["values"]
        for name in ("06_nvfp4_kernels",)
        for line in (out / "data" / f"{name}.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "skipped"
    ]
    checks = {s["check"]: s["reason"] for s in skipped}
    assert {"triton_bit_exact", "capture_replay", "flashinfer_bit_exact"} <= set(checks), checks
    no_gpu = probe.machine().missing("gpu")
    assert checks["triton_bit_exact"] == f"{no_gpu}; fp4lab's Triton kernel runs on a CUDA GPU"
    assert checks["capture_replay"] == f"{no_gpu}; CUDA-graph capture needs a CUDA GPU"
    assert checks["flashinfer_bit_exact"] == (
        f"{no_gpu}; FlashInfer's FP4 kernel needs an SM100+ GPU"
    )
    summary = (out / "summary.txt").read_text().splitlines()
    assert len(summary) == 2 and all(": ran in " in line for line in summary)
    assert summary[0].endswith("not measured: sglang_backend 0.5.12, sglang_backend 0.5.21")
    assert list((out / "figures").glob("*.png")), "figures come back with the records"
    with tarfile.open(out / "results.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"summary.txt", "data/04_fullgraph_false_tradeoff.jsonl"} <= names
    assert any(n.startswith("figures/") and n.endswith(".png") for n in names)
    first = json.loads((out / "data" / "06_nvfp4_kernels.jsonl").read_text().splitlines()[0])
    assert first["provenance"]["git"] == {**records.git_state(), "from": "bundle"}
