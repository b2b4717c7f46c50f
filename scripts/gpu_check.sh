#!/usr/bin/env bash
# Issue 35's GPU check in one command, for whoever next has a CUDA GPU: from the repository root,
#   bash scripts/gpu_check.sh            # about 7 minutes on an H100; --quick: about 4
# It makes the ~13 MB data folder from ../shared/data when it is absent (`python bench/gpu.py --prepare gpu-data`,
# which needs no GPU: make it beside the checkout and carry it to a GPU machine that lacks ../shared), then runs
# bench/gpu.py: bert-small, bert-base at 128 and modernbert-base at 512 through the loop and alone, GPU utilization,
# a fine-tuning, inference against sentence-transformers, a stop by `timeout` and its resume. It writes
# bench/results/gpu.json (commit it) and needs torch with CUDA; sentence-transformers for the inference reference.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DATA=${DATA:-gpu-data}
[ -f "$DATA/wiki/meta.json" ] || PYTHONPATH="$PWD/src" "$PY" bench/gpu.py --prepare "$DATA"
PYTHONPATH="$PWD/src" "$PY" bench/gpu.py --data "$DATA" "$@"
