#!/usr/bin/env bash
# Installs the dependencies, builds fuseflow, and runs the bundled example: a ~1M-parameter
# model learns multi-digit addition by SFT (about a minute on 2 cores), then answers a few
# problems. Everything it writes goes under runs/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)"
ff=./build/fuseflow

echo "== 1. a randomly initialised tiny model (byte tokenizer)"
$ff init --preset tiny --out runs/tiny --force
echo "== 2. the arithmetic task: 5000 training problems, 500 held out"
$ff dataset arith --digits 3 --train 5000 --test 500 --seed 1 --out runs/arith
echo "== 3. SFT (examples/sft_arith.yaml): watch the loss fall"
$ff sft --config examples/sft_arith.yaml
echo "== 4. greedy answers of the trained model (runs/sft_arith/final)"
for p in "12+34=" "250+250=" "123+456=" "907+95=" "88+9="; do
  printf '%-10s %s\n' "$p" "$($ff generate --model runs/sft_arith/final --prompt "$p" --temperature 0 --max-new-tokens 8)"
done
echo "== done: sample with  $ff generate --model runs/sft_arith/final --prompt '40+2=' --n 4"
