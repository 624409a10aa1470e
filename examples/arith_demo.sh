#!/usr/bin/env bash
# The whole story on the bundled arithmetic task, on a CPU: a fresh tiny model, an SFT warm
# start (about 40% of held-out 2-digit sums right), then GRPO and then PPO with `fuseflow
# run` (the controller and a worker process), each printing held-out greedy exact match
# before and after. The RL settings are examples/grpo_arith.yaml and examples/ppo_arith.yaml
# (docs/rl-recipe.md explains them); docs/run.md has measured numbers.
#
#   bash examples/arith_demo.sh                 # everything under runs/demo (about 15 min on 2 cores)
#   OUT=/tmp/demo GRPO_STEPS=100 PPO_STEPS=100 bash examples/arith_demo.sh      # shorter
#
# FF: the fuseflow binary (default build/fuseflow). Re-running starts over (OUT is replaced).
set -euo pipefail
cd "$(dirname "$0")/.."
FF=${FF:-build/fuseflow}
out=${OUT:-runs/demo}
grpo_steps=${GRPO_STEPS:-200}
ppo_steps=${PPO_STEPS:-200}
[[ -x "$FF" ]] || { echo "arith_demo: $FF not found: build first (cmake -S . -B build && cmake --build build -j)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

stamp "1/5 a fresh tiny model (byte tokenizer, ~1M parameters)"
"$FF" init --preset tiny --out "$out/tiny" > /dev/null
stamp "2/5 the task: 2-digit additions, 5000 to train on, 500 held out"
"$FF" dataset arith --digits 2 --min-digits 2 --train 5000 --test 500 --seed 1 --out "$out/arith" > /dev/null
stamp "3/5 SFT warm start: 1000 steps of a 2000-step schedule"
"$FF" sft --config examples/sft_arith.yaml model="$out/tiny" out="$out/sft" data.train="$out/arith/train.jsonl" \
  data.test="$out/arith/test.jsonl" train.steps=2000 train.stop_after=1000 train.batch_size=128 train.seed=1 \
  optim.lr=3e-3 train.eval_every=1000 train.eval_samples=500 train.log_every=500 train.keep_checkpoints=1 2>&1 |
  grep -E "^eval|stopped" || true
sft=$out/sft/checkpoints/step-00001000
[[ -f "$sft/config.json" ]] || { echo "arith_demo: the SFT checkpoint is missing" >&2; exit 1; }
data="data.train_files=$out/arith/train.jsonl data.val_files=$out/arith/test.jsonl"
stamp "4/5 GRPO ($grpo_steps iterations, examples/grpo_arith.yaml)"
"$FF" run examples/grpo_arith.yaml $data roles.actor.model="$sft" roles.ref.model="$sft" trainer.out_dir="$out/grpo" \
  trainer.steps="$grpo_steps" trainer.test_freq=20 --no-progress | grep -E "EVAL|^run: [^:]*$" || true
stamp "5/5 PPO ($ppo_steps iterations, examples/ppo_arith.yaml)"
"$FF" run examples/ppo_arith.yaml $data roles.actor.model="$sft" roles.ref.model="$sft" roles.critic.model="$sft" \
  trainer.out_dir="$out/ppo" trainer.steps="$ppo_steps" trainer.test_freq=20 --no-progress | grep -E "EVAL|^run: [^:]*$" || true

summary() { # NAME METRICS
  python3 - "$@" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path)]
ev = [r for r in rows if "eval_acc" in r]
secs = sum(r.get("time", {}).get("iteration", 0) + r.get("time", {}).get("eval", 0) for r in rows)
print(f"{name}: held-out exact match {100 * ev[0]['eval_acc']:.1f}% -> {100 * ev[-1]['eval_acc']:.1f}% "
      f"(best {100 * max(r['eval_acc'] for r in ev):.1f}%) after {ev[-1]['iteration']} iterations, {secs / 60:.1f} min")
PY
}
echo
stamp "done"
summary GRPO "$out/grpo/metrics.jsonl"
summary PPO "$out/ppo/metrics.jsonl"
