#!/usr/bin/env bash
# --resume continues a run as if it had not stopped. PPO (actor, critic with its optimizer,
# adaptive KL coefficient, data order) from a briefly fine-tuned model runs 4 iterations
# straight, and again stopped after 2 (--stop-after) and resumed. Sampled tokens, rewards,
# accuracy, response lengths and counts are equal exactly; float metrics agree to
# 1e-6 + 1e-4 relative. What differs is rounding in the last bits of log-probs: continuous
# batching groups requests (and micro-batches samples) by arrival time, and the CPU
# kernels round differently for different batch shapes, so two uninterrupted runs differ
# the same way (measured: 1e-7 relative, 1e-5 on sums that cancel such as pg_loss). That
# the checkpoint restores weights and optimizer state bit for bit is checked by
# tests/exec/test_rlworker.c.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_sft_small
M=$cache/sft_small/final
cfg=$src/examples/ppo.yaml
args() { # OUT
  echo "$(small_run "$1") trainer.steps=4 trainer.test_freq=2 trainer.save_freq=0 data.train_batch_size=8" \
       "roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M roles.actor.workers=1 roles.actor.optim.lr=1e-4" \
       "graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=4 graph.train_critic.mini_batch_size=4" \
       "graph.train_critic.micro_batch_size=4 graph.rollout.n=2 --val-limit 40 --no-progress"
}
"$bin" run "$cfg" $(args "$work/a") > "$work/a.log" 2>&1 || { cat "$work/a.log" >&2; fail "the straight run failed"; }
"$bin" run "$cfg" $(args "$work/b") --stop-after 2 > "$work/b1.log" 2>&1 || { cat "$work/b1.log" >&2; fail "the first half failed"; }
grep -q "stopped after iteration 2" "$work/b1.log" || fail "--stop-after 2 did not stop"
[[ -d "$work/b/checkpoints/step-00000002" ]] || fail "no checkpoint at iteration 2"
"$bin" run "$cfg" $(args "$work/b") --resume > "$work/b2.log" 2>&1 || { cat "$work/b2.log" >&2; fail "the resumed run failed"; }
[[ $(iterations "$work/b/metrics.jsonl") == 4 ]] || fail "the resumed run's metrics.jsonl does not hold 4 iterations"
python3 - "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY' || fail "the resumed run sampled differently"
import json, sys
A, B = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
exact = ["iteration", "samples", "reward_mean", "acc", "response_length", "actor_steps", "critic_steps", "eval_acc"]
bad = [(a["iteration"], k, a.get(k), b.get(k)) for a, b in zip(A, B) for k in exact if a.get(k) != b.get(k)]
assert len(A) == len(B) and not bad, bad
PY
same_metrics "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" 1e-6 1e-4 || fail "the resumed run's metrics differ"
echo ok
