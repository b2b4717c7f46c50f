#!/usr/bin/env bash
# A short tour of encoderlab: encoderlab-fill-mask (minilm adapted by this toolkit's continued pretraining, shipped
# in models/) and all-MiniLM-L6-v2 (shipped inside a PyPI package). No download, no ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=out/demo
mkdir -p "$OUT"

echo "== 0. Fill in the blank with the shipped model, models/encoderlab-fill-mask (the default: no --model):"
echo "==    encoderlab fill-mask \"The cat [MASK] on the mat.\" ..."
encoderlab fill-mask "The cat [MASK] on the mat." "Paris is the [MASK] of France." "I love [MASK] learning." --top-k 5
echo "(minilm's encoder with a masked-LM head, adapted on Wikipedia, then averaged with its sibling runs and a tenth of minilm: models/encoderlab-fill-mask/README.md)"
echo

echo "== 1. What is in the checkpoint: encoderlab info --model minilm"
encoderlab info --model minilm

echo
echo "== 2. Embed one sentence per line: encoderlab embed --model minilm --input examples/sentences.txt --out $OUT/sentences.npy"
encoderlab embed --model minilm --input examples/sentences.txt --out "$OUT/sentences.npy"

echo
echo "== 3. Rank sentences by meaning: encoderlab similarity --model minilm QUERY CANDIDATES..."
encoderlab similarity --model minilm "A person plays an instrument." \
  "A man is playing a guitar on stage." "The stock market fell sharply this morning." \
  "The kitten naps in the sun by the window." "Someone performs music with a stringed instrument."

echo
echo "== 4. The same ranking with int8 weights and per-token int8 activations: --precision int8"
encoderlab similarity --model minilm --precision int8 "A person plays an instrument." \
  "A man is playing a guitar on stage." "The stock market fell sharply this morning." \
  "The kitten naps in the sun by the window." "Someone performs music with a stringed instrument."

echo
echo "== 5. Where layer 2, head 11 looks: encoderlab attention --model minilm TEXT --layer 2 --head 11"
encoderlab attention --model minilm "The cat sat on the mat because it was tired." --layer 2 --head 11 \
  --out "$OUT/attention-l2h11.png"
encoderlab attention --model minilm "The cat sat on the mat because it was tired." --layer 2 --out "$OUT/attention-l2.png"

echo
echo "== 6. Export to ONNX and check it against PyTorch: encoderlab export onnx --model minilm --int8"
encoderlab export onnx --model minilm --out "$OUT/minilm-int8.onnx" --int8

echo
echo "== 7. The BERT family side by side (random weights; size and CPU speed on the same token ids):"
echo "==    encoderlab compare --presets distilbert-base albert-base electra-small --quick"
encoderlab compare --presets distilbert-base albert-base electra-small --quick --no-progress

echo
echo "Files written in $OUT: sentences.npy, the attention maps (attention-*.png) and minilm-int8.onnx"
echo
echo "To run these commands yourself, put encoderlab on the PATH of your shell first (once per new shell):"
echo "    source .venv/bin/activate        # or call $(pwd)/.venv/bin/encoderlab"
