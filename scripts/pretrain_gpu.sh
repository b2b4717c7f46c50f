#!/usr/bin/env bash
# Issue 16, item 4, in one command on a machine with a CUDA GPU (run from the repository root, after `make test`
# or with .venv made): prepare the Wikipedia shards if absent, pretrain configs/bert-small-wiki-gpu.yaml from
# scratch (resumes when runs/bert-small-gpu holds checkpoints), then report tokens/s, MFU against the GPU's dense
# bf16 peak and the held-out MLM accuracy and probes (bench/fill_mask_model.py --no-sst2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUN=${RUN:-runs/bert-small-gpu}
[ -f runs/wiki-minilm/meta.json ] || "$PY" -m encoderlab prepare --corpus ../shared/data/wikipedia --tokenizer minilm \
  --out runs/wiki-minilm --holdout 0.005
RESUME=$([ -f "$RUN/checkpoints/latest" ] && echo --resume || true)
"$PY" -m encoderlab pretrain --config configs/bert-small-wiki-gpu.yaml --out "$RUN" $RESUME "$@"
"$PY" scripts/gpu_mfu.py "$RUN"
"$PY" bench/fill_mask_model.py --model "$RUN/model" --no-sst2 --results-dir "$RUN"
