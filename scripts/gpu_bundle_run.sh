#!/usr/bin/env bash
# run.sh of the offline GPU bundle (make gpu-bundle): ./run.sh OUT_DIR [--param NAME=VALUE ...]
#
# Needs a python3 (PYTHON=..., default python3) with torch >= 2.11; reaches no registry.
# Installs what that interpreter lacks from wheels/ into OUT_DIR/.site (pip, offline), runs the
# GPU notebooks (04-08 with GPU-sized parameters where torch sees a CUDA GPU; 04-06 with their
# CPU defaults elsewhere, every GPU check then recorded as skipped; 05 only where FlashInfer
# imports: the story's call site is FlashInfer's), and writes records to
# OUT_DIR/data, figures to OUT_DIR/figures, executed notebooks to OUT_DIR/build, and one
# summary line per notebook to the terminal and OUT_DIR/summary.txt; the three are packed into
# OUT_DIR/results.tar.gz, one file to bring back. Where the bundle carries
# SGLang's backend (sglang/), it is installed offline under OUT_DIR/build and notebook 04 drives
# it, with real CUDA-graph capture where torch sees a GPU. Parameters after OUT_DIR
# go to the notebooks run without a CUDA device (e.g. small ones for a quick check).
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 OUT_DIR [--param NAME=VALUE ...]" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
PY=${PYTHON:-python3}
SITE="$OUT/.site"

"$PY" - "$HERE/expects.txt" <<'PYEOF'
import importlib.util, sys
try:
    import torch
except ImportError:
    sys.exit("run.sh needs a python3 with torch >= 2.11; this one has no torch (set PYTHON=...)")
major, minor = (int(p) for p in torch.__version__.split(".")[:2])
if (major, minor) < (2, 11):
    sys.exit(f"run.sh needs torch >= 2.11; this python3 has {torch.__version__}")
lacks = [n for n in open(sys.argv[1]).read().split() if importlib.util.find_spec(n) is None]
if lacks:
    sys.exit(f"run.sh: this python3 lacks {', '.join(lacks)}, which the bundle does not carry; "
             "nothing was installed. Rebuild the bundle with them: python -m fp4lab.core.bundle "
             f"build build/gpu-bundle --with {','.join(lacks)} (or set PYTHON=... to one that has them)")
print(f"torch {torch.__version__}, CUDA device: {torch.cuda.is_available()}")
PYEOF

export PYTHONPATH="$SITE:$HERE/src/lib${PYTHONPATH:+:$PYTHONPATH}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m fp4lab.core.bundle install "$HERE/wheels" "$SITE"
"$PY" -m ipykernel install --name fp4lab --prefix "$SITE/kernel" >/dev/null
export JUPYTER_PATH="$SITE/kernel/share/jupyter" JUPYTER_DATA_DIR="$OUT/build/jupyter"
export FP4LAB_BUILD_DIR="$OUT/build" FP4LAB_DATA_DIR="$OUT/data" FP4LAB_FIGURES_DIR="$OUT/figures"
export TORCHINDUCTOR_CACHE_DIR="$OUT/build/cache/inductor" TRITON_CACHE_DIR="$OUT/build/cache/triton"
export MPLCONFIGDIR="$OUT/build/cache/matplotlib" PYTHONUNBUFFERED=1
# No environment is built here (no registry): SGLang's backend is the bundled release's, if any.
export FP4LAB_OFFLINE_BUNDLE=1
if [[ -d "$HERE/sglang" ]]; then
  "$PY" -m fp4lab.serving.capture.bundled install "$HERE/sglang"
fi

status=0
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  PY="$PY" NO_HTML=1 bash "$HERE/src/scripts/gpu.sh" || status=$?
else
  notebooks=04,06
  if "$PY" -c 'import flashinfer' 2>/dev/null; then notebooks=04,05,06; fi
  echo "no CUDA device: notebooks $notebooks with their CPU defaults; GPU checks recorded as skipped"
  "$PY" -m fp4lab.core.runner reproduce --notebooks "$notebooks" --no-html "$@" || status=$?
fi
"$PY" -m fp4lab.core.bundle summary "$OUT/data" | tee "$OUT/summary.txt"
# One archive of what comes back to be committed (data/gpu/<machine>/, figures/gpu/<machine>/).
tar -czf "$OUT/results.tar.gz" --ignore-failed-read -C "$OUT" data figures summary.txt 2>/dev/null || true
echo "records, figures and summary in one archive: $OUT/results.tar.gz"
exit $status
