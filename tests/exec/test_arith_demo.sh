#!/usr/bin/env bash
# The README's demonstration script (examples/arith_demo.sh) runs end to end on a small
# budget: a fresh model, 100 SFT steps, 2 GRPO and 2 PPO iterations through `fuseflow run`,
# and prints both summaries. It guards the script against rot (its flags, config keys and
# file layout); how much RL learns is test_learn_grpo.sh's and test_learn_ppo.sh's job.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
OUT="$work/demo" FF="$bin" SFT_STEPS=100 GRPO_STEPS=2 PPO_STEPS=2 bash "$src/examples/arith_demo.sh" > "$work/demo.log" 2>&1 ||
  { cat "$work/demo.log" >&2; fail "examples/arith_demo.sh failed"; }
for what in "warm start: $work/demo/sft/checkpoints/step-" "GRPO: held-out exact match" "PPO: held-out exact match"; do
  grep -qF "$what" "$work/demo.log" || { cat "$work/demo.log" >&2; fail "the demo's output lacks '$what'"; }
done
grep -q "after 2 iterations" "$work/demo.log" || { cat "$work/demo.log" >&2; fail "the RL runs did not stop after 2 iterations"; }
n=$(find "$work/demo/sft/checkpoints" -mindepth 1 -maxdepth 1 | wc -l)
[[ "$n" == 1 ]] || fail "the demo should keep only the chosen SFT checkpoint, found $n"
tail -n 2 "$work/demo.log"
