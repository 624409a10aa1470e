#!/usr/bin/env bash
# GRPO learns (label: learn): from a brief SFT warm start of the small model (40-50%
# of held-out 2-digit sums right), `fuseflow run examples/grpo.yaml` with a short budget
# raises held-out greedy exact match clearly: by at least 6 points on 1000 held-out sums
# (the standard error of one such measurement is 1.6 points; a typical run gains 10-15).
# The sanitizer build (other rounding: another SFT model, another run) uses the same budget.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_sft_learn
steps=60 batch=128 bar=0.06
"$bin" run "$src/examples/grpo.yaml" trainer.out_dir="$work/grpo" trainer.steps=$steps trainer.test_freq=$steps \
  data.train_files="$cache/learn/train.jsonl" data.val_files="$cache/learn/test.jsonl" data.max_prompt_length=16 \
  data.max_response_length=8 data.train_batch_size=$batch roles.actor.model="$sft" roles.ref.model="$sft" roles.actor.workers=1 \
  roles.actor.optim.lr=3e-4 roles.actor.optim.warmup_steps=10 \
  graph.train_actor.mini_batch_size=$((batch / 2)) graph.train_actor.micro_batch_size=512 graph.ref_logprob.micro_batch_size=128 \
  --no-progress > "$work/grpo.log" 2>&1 || { cat "$work/grpo.log" >&2; fail "the GRPO run failed"; }
before=$(eval_acc "$work/grpo/metrics.jsonl" 0)
after=$(eval_acc "$work/grpo/metrics.jsonl" $steps)
echo "GRPO: held-out exact match $before -> $after after $steps iterations"
python3 -c "import sys; b, a, bar = map(float, sys.argv[1:]); sys.exit(0 if a >= b + bar else 1)" "$before" "$after" "$bar" ||
  { tail -5 "$work/grpo.log" >&2; fail "GRPO did not raise held-out accuracy by $bar ($before -> $after)"; }
