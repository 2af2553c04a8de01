# fp4lab: `make reproduce` runs every notebook this machine can run and exports HTML reports;
# `make test` runs the linter and the test suite. Both create the environment in build/venv when missing.
#   make reproduce NOTEBOOKS=01,05        only these notebooks (names or numbers)
#   make reproduce TORCH=torch==2.14.1    another torch build (a CUDA one on a GPU machine)
#   make matrix VERSIONS=0.6.3,0.7.4      the FlashInfer version matrix (notebook 09), then the report
#   make sglang [SGLANG_VERSIONS=0.5.9,0.5.16]  SGLang's own GLM-5 through every release (or those) x SM (notebook 11), then the report
#   make benchmarks [BENCH_ARGS=--cold]  the speed goals (set-up cost, story timing, quantize throughput, FP4 API audit, one check) into data/
#   make readme                           rewrite README.md's findings and timings from data/
#   make pages                            every page the last reproduce exported, checked in headless Chromium
#   make gpu TORCH=<a CUDA torch>         notebooks 04-08 sized for one GPU (within 8 min on an H200)
#   make gpu-bundle [PYTHON_VERSIONS=3.12]  the same as an offline folder (build/gpu-bundle/run.sh OUT),
#                                         with SGLang's backend for notebook 04
#   make lock                             rewrite requirements.lock from pyproject.toml and TORCH

PYTHON   ?= python3
# The one torch pin: the lock is compiled with it, build/venv installs it, and every side
# environment (FlashInfer versions, SGLang releases) gets the torch build installed in build/venv.
# On a GPU machine pass a CUDA build, e.g. TORCH=torch==2.14.1: it is installed over the lock's.
TORCH    ?= torch==2.13.0+cpu
LOCK     := requirements.lock
NOTEBOOKS ?=
VERSIONS ?=
PYTHON_VERSIONS ?=
SGLANG_VERSIONS ?=
# `make test` runs the test files on this many pytest-xdist workers (one per core, four at most:
# each may hold a release's model in memory), each with its own build folder
# (build/test-workers/<worker>), all sharing the uv cache; the files with the slow tests first
# (tests/conftest.py orders them).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, os.cpu_count() or 1))")
BUILD    := build
VENV     := $(BUILD)/venv
PY       := $(VENV)/bin/python
UV       := $(VENV)/bin/uv
UV_PIN   := $(shell sed -n 's/^uv==\([^ ]*\).*/\1/p' $(LOCK))
LOCK_TORCH := $(shell sed -n 's/^\(torch==[^ ]*\).*/\1/p' $(LOCK))
STAMP    := $(VENV)/.installed-$(subst +,-,$(subst =,-,$(subst /,-,$(TORCH))))

# uv builds every environment from one cache inside build/ (files hardlinked, never copied), with
# bytecode compiled on import, not at install (core.venvs.BYTECODE), no Python downloads, and
# pip's find-links (uv reads no pip config).
export UV_CACHE_DIR          := $(abspath $(BUILD))/cache/uv
export UV_LINK_MODE          := hardlink
export UV_PYTHON_DOWNLOADS   := never
PIP_FIND_LINKS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
ifneq ($(strip $(PIP_FIND_LINKS)),)
export UV_FIND_LINKS := $(PIP_FIND_LINKS)
endif

# Every cache stays inside the ignored build folder, never in the home directory.
export FP4LAB_BUILD_DIR      := $(abspath $(BUILD))
export TORCHINDUCTOR_CACHE_DIR := $(abspath $(BUILD))/cache/inductor
export FLASHINFER_WORKSPACE_BASE := $(abspath $(BUILD))/cache/flashinfer
export MPLCONFIGDIR          := $(abspath $(BUILD))/cache/matplotlib
export TRITON_CACHE_DIR      := $(abspath $(BUILD))/cache/triton
export XDG_CACHE_HOME        := $(abspath $(BUILD))/cache/xdg
export HF_HOME               := $(abspath $(BUILD))/cache/huggingface
export IPYTHONDIR            := $(abspath $(BUILD))/cache/ipython
export TVM_FFI_CACHE_DIR     := $(abspath $(BUILD))/cache/tvm-ffi
export JUPYTER_CONFIG_DIR    := $(abspath $(BUILD))/jupyter/config
export JUPYTER_DATA_DIR      := $(abspath $(BUILD))/jupyter/data
export JUPYTER_RUNTIME_DIR   := $(abspath $(BUILD))/jupyter/runtime
export PIP_CACHE_DIR         := $(abspath $(BUILD))/cache/pip
export PYTHONUNBUFFERED      := 1
CACHES := $(TORCHINDUCTOR_CACHE_DIR) $(FLASHINFER_WORKSPACE_BASE) $(MPLCONFIGDIR) $(TRITON_CACHE_DIR) \
          $(XDG_CACHE_HOME) $(HF_HOME) $(IPYTHONDIR) $(PIP_CACHE_DIR) $(TVM_FFI_CACHE_DIR)

.PHONY: reproduce test lint lab list matrix sglang gpu gpu-bundle benchmarks readme pages venv lock clean

# The make targets write results to the committed data/ and figures/; interactive sessions
# (make lab, a notebook run by hand) write to build/data and build/figures.
reproduce matrix sglang gpu benchmarks: export FP4LAB_DATA_DIR := $(abspath data)
reproduce matrix sglang gpu benchmarks: export FP4LAB_FIGURES_DIR := $(abspath figures)

# `exec`: the runner is make's own child, so it stops when make is stopped or killed.
reproduce: $(STAMP)
	exec $(PY) -m fp4lab.core.runner reproduce --notebooks "$(NOTEBOOKS)"

matrix: $(STAMP)
	exec $(PY) -m fp4lab.core.runner reproduce --notebooks 09,10 $(if $(VERSIONS),--param versions=$(VERSIONS))

sglang: $(STAMP)
	exec $(PY) -m fp4lab.core.runner reproduce --notebooks 11,10 $(if $(SGLANG_VERSIONS),--param sglang_versions=$(SGLANG_VERSIONS))

gpu: $(STAMP)
	PY=$(PY) bash scripts/gpu.sh

gpu-bundle: $(STAMP)
	$(PY) -m fp4lab.core.bundle build $(BUILD)/gpu-bundle $(if $(PYTHON_VERSIONS),--python-versions $(PYTHON_VERSIONS))
	$(PY) -m fp4lab.serving.capture.bundled add $(BUILD)/gpu-bundle $(if $(PYTHON_VERSIONS),--python-versions $(PYTHON_VERSIONS))

readme: $(STAMP)
	FP4LAB_DATA_DIR=$(abspath data) $(PY) -m fp4lab.report.readme

benchmarks: $(STAMP)
	$(PY) benchmarks/setup_cost.py
	$(PY) benchmarks/story_timing.py --reproduce $(BENCH_ARGS)
	$(PY) benchmarks/nvfp4_throughput.py
	$(PY) benchmarks/fp4_api_audit.py
	$(PY) benchmarks/check_speed.py

test: lint
	exec $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Needs Debian's chromium (.ci/run installs it); without it `make pages` fails (it exists to render them).
pages: $(STAMP)
	FP4LAB_PAGES=1 exec $(PY) -m pytest -p no:cacheprovider tests/test_pages.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

lab: $(STAMP)
	$(PY) -m jupyter lab --notebook-dir=notebooks

list: $(STAMP)
	$(PY) -m fp4lab.core.runner list

venv: $(STAMP)

# build/venv: a plain venv, uv (at the lock's version) bootstrapped into it with pip, then the
# lock synced exactly (hashes checked), TORCH over it when it is not the lock's, fp4lab editable.
$(STAMP): pyproject.toml $(LOCK)
	mkdir -p $(CACHES) $(UV_CACHE_DIR)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(PY) -m pip install -q --disable-pip-version-check "uv==$(UV_PIN)"
	$(UV) pip sync --python $(PY) $(LOCK)
	$(if $(filter $(LOCK_TORCH),$(TORCH)),,$(UV) pip install --python $(PY) "$(TORCH)")
	$(UV) pip install --python $(PY) --no-deps -e .
	$(PY) -c "from fp4lab.core import venvs; venvs.compile_on_import()"
	$(PY) -m ipykernel install --sys-prefix --name fp4lab --display-name "Python (fp4lab)"
	rm -f $(VENV)/.installed-* && touch $@

lock: $(STAMP)
	echo "$(TORCH)" | $(UV) pip compile pyproject.toml - --extra test --generate-hashes --no-header \
	    --python-version 3.11 --python-platform x86_64-manylinux_2_28 -q -o $(LOCK)

clean:
	rm -rf $(BUILD)/executed $(BUILD)/html $(BUILD)/test
