#!/usr/bin/env bash
# make gpu: run what one GPU can run of notebooks 04-08, with GPU-sized parameters.
#
# Each notebook runs through `python -m fp4lab.core.runner reproduce` (records with provenance
# in data/, executed copies and HTML in build/), one call per notebook so each gets its own
# parameters and its own time budget. On one GPU the budgets add up to 540 s: on one H200
# the whole script finishes within 9 minutes, and a notebook over its budget is stopped and reported
# without stopping the others. Inner timeouts (timeout_s parameters) are set below each
# budget so the notebooks' own harnesses stop their child processes first.
#
#   PY=build/venv/bin/python scripts/gpu.sh     run (the Makefile passes PY)
#   DRY_RUN=1 scripts/gpu.sh                    print the commands, run nothing, need no GPU
#   NO_HTML=1 scripts/gpu.sh                    skip the HTML export (the offline bundle has no nbconvert)
#   ONLY=04,06 scripts/gpu.sh                   only these notebooks (numbers), each with its budget
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-build/venv/bin/python}

if [[ -z "${DRY_RUN:-}" ]]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "make gpu needs a CUDA GPU visible to torch; this machine has none. Run 'make reproduce' here instead." >&2
    exit 2
  fi
fi

failed=()
started=$SECONDS

# wanted NOTEBOOK: whether ONLY (when set) names it
wanted() { [[ -z "${ONLY:-}" || ",$ONLY," == *",$1,"* ]]; }

# step BUDGET_S NOTEBOOK [--param NAME=VALUE ...]
step() {
  local budget=$1 notebook=$2
  shift 2
  wanted "$notebook" || return 0
  local cmd=("$PY" -m fp4lab.core.runner reproduce --notebooks "$notebook" ${NO_HTML:+--no-html} "$@")
  if [[ -n "${DRY_RUN:-}" ]]; then
    echo "${cmd[*]}"
    return
  fi
  echo "== notebook $notebook (budget ${budget} s, $((SECONDS - started)) s used so far)"
  timeout --kill-after=15 "$budget" "${cmd[@]}"
  local status=$?
  if [[ $status -eq 124 || $status -eq 137 ]]; then
    echo "   notebook $notebook: STOPPED after its ${budget} s budget" >&2
    failed+=("$notebook (over budget)")
  elif [[ $status -ne 0 ]]; then
    failed+=("$notebook (exit $status)")
  fi
}

# 04: GLM-5's full widths, the three compile variants, CUDA-graph replay on the GPU; and the
# breakable releases' own capture timed at 0-32 breaks on a 32-layer stack (a prefill bucket of
# 1024 tokens at hidden 4096), one release at a time: in the offline bundle every release it
# carries, on the machine's torch (elsewhere the notebook's two, in their CPU environments).
breaks=()
[[ -n "${FP4LAB_OFFLINE_BUNDLE:-}" ]] && breaks=(--param break_releases=all)
step 240 04 --param scale=1 --param layers=4 --param 'token_counts=[64,256,1024,2048]' --param backend=inductor --param iters=30 --param warmup=3 --param device=cuda \
  "${breaks[@]}" --param 'break_shape=[1024,4096,32]' --param 'break_counts=[0,1,2,4,8,16,32]'
# 05: the custom-op fix at GLM-5's hidden size (head_dim 128); it traces FlashInfer's own code.
if [[ -z "${DRY_RUN:-}" ]] && wanted 05 && ! "$PY" -c 'import flashinfer' 2>/dev/null; then
  echo "== notebook 05 SKIPPED: flashinfer-python is not importable here (the story's call site is FlashInfer's)"
else
  step 90 05 --param tokens=256 --param hidden=6144 --param heads=48 --param ffn=12288 --param layers=2
fi
# 06: FP4 kernels on the GPU, at matrix sizes worth timing.
step 90 06 --param device=cuda --param 'throughput_shapes=[[4096,4096],[8192,8192]]' --param throughput_iters=20
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if ((gpus >= 2)); then
  # Several GPUs (not the 10-minute single-H200 case): nccl eager and in CUDA graphs, MSCCLPP
  # through SGLang where installed; the overlap benchmark on nccl at half GLM-5 width; and, on a
  # Blackwell node with SGLang, four server launches for the switch comparison (minutes each).
  step 150 07 --param sizes=1KiB:64MiB --param iters=20 --param warmup=5 --param timeout_s=130
  step 1500 08 --param scale=2 --param tokens=256 --param iters=20 --param warmup=3 --param timeout_s=120 --param ready_timeout_s=300 --param num_prompts=64
else
  # One GPU: 07 and 08 need no GPU; their GPU sections are skipped and recorded as skipped.
  step 60 07 --param sizes=1KiB:64MiB --param iters=20 --param warmup=5 --param timeout_s=45
  step 60 08 --param scale=16 --param tokens=256 --param iters=20 --param warmup=3 --param timeout_s=45
fi

[[ -n "${DRY_RUN:-}" ]] && exit 0
echo "make gpu: $((SECONDS - started)) s in all; results in data/, executed notebooks and HTML in build/"
if ((${#failed[@]})); then
  echo "make gpu: not finished: ${failed[*]}" >&2
  exit 1
fi
