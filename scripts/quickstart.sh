#!/usr/bin/env bash
# Installs the dependencies, builds fuseflow, and runs the bundled example end to end
# (examples/arith_demo.sh, about 10 minutes on 2 cores): a fresh ~1M-parameter model learns
# 2-digit addition by SFT up to a warm start under 50% held-out exact match, then GRPO and
# PPO with `fuseflow run` lift it (to about 90% on the development machine). Last, the
# greedy answers of the SFT start and of the two RL models to a few problems. Everything it
# writes goes under runs/demo (ignored by git). Not here: SFT alone (README: "Models, data,
# SFT, generation"). The installer's and the compiler's output go to logs (one line per step
# here; a failed step shows the log's last lines and its path).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
bash scripts/deps.sh
mkdir -p build
log=build/quickstart.log
: > "$log"
ff_step "$log" "build: configure" cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
ff_step "$log" "build: compile ($(nproc) jobs)" cmake --build build -j"$(nproc)"
ff=./build/fuseflow

OUT=runs/demo FF=$ff bash examples/arith_demo.sh
sft=$(ls -d runs/demo/sft/checkpoints/step-* | tail -n 1)
grpo=$(ls -d runs/demo/grpo/checkpoints/step-* | tail -n 1)/actor
ppo=$(ls -d runs/demo/ppo/checkpoints/step-* | tail -n 1)/actor
echo
echo "== greedy answers to a few problems"
printf '%-8s %-6s %-10s %-10s %-10s\n' problem right "SFT start" "GRPO" "PPO"
for p in "57+38=" "19+84=" "66+77=" "45+45=" "99+12="; do
  a=$(( ${p%%+*} + $(echo "$p" | sed 's/.*+//; s/=//') ))
  answer() { "$ff" generate --model "$1" --prompt "$p" --temperature 0 --max-new-tokens 8; }
  printf '%-8s %-6s %-10s %-10s %-10s\n' "$p" "$a" "$(answer "$sft")" "$(answer "$grpo")" "$(answer "$ppo")"
done
echo "== done: the models are under runs/demo; sample with  $ff generate --model $grpo --prompt '40+2=' --n 4"
