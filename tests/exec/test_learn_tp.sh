#!/usr/bin/env bash
# PPO learns at TP 2 and at TP 2 x PP 2 (label: learn) as it does at TP 1: from one SFT warm
# start (the tiny model with a vocabulary of 260, which TP 2 divides, fine-tuned as
# test_learn_ppo.sh's), the run of test_learn_ppo.sh with the actor, critic and ref at TP 2 on 2
# workers, at TP 2 x PP 2 on 4 (generation at TP 2 x DP 2 on the same workers), and the same run
# on 1 worker each raise held-out greedy exact match on 1000 held-out sums by at least 5 points
# in 150 iterations, and end within 5 points of each other (TP changes rounding, and the
# one-worker run batches its generation by arrival time, which after a hundred updates changes
# which responses are sampled; so the runs agree in what they learn, not bit for bit).
# Measured: 42.2% -> 50.2% and 51.8% on one worker (two runs), 42.2% -> 50.9% at TP 2 (both
# runs: a TP replica decodes its prompts as one batch, so its rounding does not depend on
# timing), 42.2% -> 49.9% at TP 2 x PP 2 (beside 51.1% and 50.9%); under the sanitizers
# (another SFT start, 260 iterations) 29.0% -> 37.0% and 36.0%, and in a later run 35.3% on one
# worker, 36.0% at TP 2, 36.1% at TP 2 x PP 2.
# GRPO whose actor trains at TP 2 x PP 2 and generates at TP 1 (DP 4) on the same 4 workers
# (HybridFlow's case: each rank gathers the rest of the model inside its micro-DP group of 4
# after every update, and gives it back before the next) learns as the DP-only run on 4
# workers does: both raise held-out exact match by at least 6 points in 60 iterations (the
# recipe of test_learn_grpo.sh; 120 under the sanitizers) and end within 5 points of each
# other. Measured: 42.2% -> 53.5% at DP 4, 42.2% -> 54.4% at TP 2 x PP 2 -> TP 1 (30 s and 13 s);
# under the sanitizers 29.0% -> 37.0% and 36.5% in 120 iterations (34.9% on both after 60).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_tp learn
sft=$tp_learn_sft
steps=150 bar=0.05 apart=0.05
if sanitized; then steps=260; fi
learn() { # OUT EXTRA...
  local out=$1; shift
  local t0=$SECONDS
  "$bin" run "$src/examples/ppo.yaml" trainer.out_dir="$out" trainer.steps=$steps trainer.test_freq=$steps \
    data.train_files="$cache/learn/train.jsonl" data.val_files="$cache/learn/test.jsonl" data.max_prompt_length=16 \
    data.max_response_length=8 data.train_batch_size=128 graph.rollout.n=4 \
    roles.actor.model="$sft" roles.ref.model="$sft" roles.critic.model="$sft" \
    roles.actor.optim.lr=2e-4 roles.critic.optim.lr=1e-3 graph.advantage.kl_penalty.coef=0.001 graph.reward.format_score=0.0 \
    graph.train_actor.mini_batch_size=64 graph.train_actor.micro_batch_size=256 graph.train_critic.mini_batch_size=64 \
    graph.train_critic.micro_batch_size=256 graph.ref_logprob.micro_batch_size=128 graph.values.micro_batch_size=128 \
    "$@" --no-progress > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "the PPO run $* failed"; }
  echo "$(( SECONDS - t0 ))"
}
t1=$(learn "$work/tp1" roles.actor.workers=1)
t2=$(learn "$work/tp2" roles.actor.workers=2 roles.actor.layout.tp=2)
t4=$(learn "$work/tp2pp2" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2)
grep -q "actor \[0 1 2 3\] tp 2 x pp 2 x dp 1, gen \[0 1 2 3\] tp 2 x pp 1 x dp 2, critic \[0 1 2 3\] tp 2 x pp 2 x dp 1" "$work/tp2pp2.log" ||
  fail "the roles are not at TP 2 x PP 2: $(head -1 "$work/tp2pp2.log")"
grep -q "actor \[0 1\] tp 2 x pp 1 x dp 1, critic \[0 1\] tp 2 x pp 1 x dp 1, ref \[0 1\] tp 2 x pp 1 x dp 1" "$work/tp2.log" ||
  fail "the roles are not at TP 2: $(head -1 "$work/tp2.log")"
b1=$(eval_acc "$work/tp1/metrics.jsonl" 0) a1=$(eval_acc "$work/tp1/metrics.jsonl" $steps)
b2=$(eval_acc "$work/tp2/metrics.jsonl" 0) a2=$(eval_acc "$work/tp2/metrics.jsonl" $steps)
b4=$(eval_acc "$work/tp2pp2/metrics.jsonl" 0) a4=$(eval_acc "$work/tp2pp2/metrics.jsonl" $steps)
echo "PPO: held-out exact match TP 1 $b1 -> $a1 (${t1}s), TP 2 $b2 -> $a2 (${t2}s), TP 2 x PP 2 $b4 -> $a4 (${t4}s) after $steps iterations"
[[ "$b1" == "$b2" ]] || fail "the two runs start from different accuracies ($b1, $b2): the same model at TP 2 decodes otherwise"
python3 -c "import sys; b, a, bar = map(float, sys.argv[1:]); sys.exit(0 if a >= b + bar else 1)" "$b1" "$a1" "$bar" ||
  { tail -5 "$work/tp1.log" >&2; fail "PPO at TP 1 did not raise held-out accuracy by $bar ($b1 -> $a1)"; }
python3 -c "import sys; b, a, bar = map(float, sys.argv[1:]); sys.exit(0 if a >= b + bar else 1)" "$b2" "$a2" "$bar" ||
  { tail -5 "$work/tp2.log" >&2; fail "PPO at TP 2 did not raise held-out accuracy by $bar ($b2 -> $a2)"; }
python3 -c "import sys; x, y, d = map(float, sys.argv[1:]); sys.exit(0 if abs(x - y) <= d else 1)" "$a1" "$a2" "$apart" ||
  fail "PPO at TP 2 ended $a2, at TP 1 $a1: more than $apart apart"
[[ "$b1" == "$b4" ]] || fail "TP 2 x PP 2 starts from another accuracy ($b4, TP 1 $b1)"
python3 -c "import sys; b, a, bar = map(float, sys.argv[1:]); sys.exit(0 if a >= b + bar else 1)" "$b4" "$a4" "$bar" ||
  { tail -5 "$work/tp2pp2.log" >&2; fail "PPO at TP 2 x PP 2 did not raise held-out accuracy by $bar ($b4 -> $a4)"; }
python3 -c "import sys; x, y, d = map(float, sys.argv[1:]); sys.exit(0 if abs(x - y) <= d else 1)" "$a1" "$a4" "$apart" ||
  fail "PPO at TP 2 x PP 2 ended $a4, at TP 1 $a1: more than $apart apart"

# GRPO: DP 4 against TP 2 x PP 2 generating at TP 1 (DP 4), the same 4 workers
gsteps=60 gbar=0.06
if sanitized; then gsteps=120; fi # another SFT start (29.0%): 60 iterations gained 5.9 points on both layouts
grpo_learn() { # OUT EXTRA...
  local out=$1; shift
  local t0=$SECONDS
  "$bin" run "$src/examples/grpo.yaml" trainer.out_dir="$out" trainer.steps=$gsteps trainer.test_freq=$gsteps \
    data.train_files="$cache/learn/train.jsonl" data.val_files="$cache/learn/test.jsonl" data.max_prompt_length=16 \
    data.max_response_length=8 data.train_batch_size=128 roles.actor.model="$sft" roles.ref.model="$sft" \
    roles.actor.optim.lr=3e-4 roles.actor.optim.warmup_steps=10 graph.train_actor.mini_batch_size=64 \
    graph.train_actor.micro_batch_size=128 graph.ref_logprob.micro_batch_size=128 "$@" --no-progress > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "the GRPO run $* failed"; }
  echo "$(( SECONDS - t0 ))"
}
tg1=$(grpo_learn "$work/gdp4" roles.actor.workers=4)
tg4=$(grpo_learn "$work/ghy" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.tp=1)
grep -q "actor \[0 1 2 3\] tp 2 x pp 2 x dp 1, gen \[0 1 2 3\], ref" "$work/ghy.log" ||
  fail "GRPO is not at TP 2 x PP 2 generating at DP 4: $(head -1 "$work/ghy.log")"
gb1=$(eval_acc "$work/gdp4/metrics.jsonl" 0) ga1=$(eval_acc "$work/gdp4/metrics.jsonl" $gsteps)
gb4=$(eval_acc "$work/ghy/metrics.jsonl" 0) ga4=$(eval_acc "$work/ghy/metrics.jsonl" $gsteps)
echo "GRPO: held-out exact match DP 4 $gb1 -> $ga1 (${tg1}s), TP 2 x PP 2 generating at TP 1 $gb4 -> $ga4 (${tg4}s) after $gsteps iterations"
python3 - "$work/ghy/metrics.jsonl" <<'PY' || fail "the TP 2 x PP 2 GRPO run's weight syncs moved nothing"
import json, sys
w = [json.loads(l)["weight_sync"] for l in open(sys.argv[1]) if '"samples"' in l]
assert len(w) > 0 and all(x["bytes"] > 0 and x["bytes_max_rank"] > 0 for x in w), w[:3]
print(f"GRPO TP 2 x PP 2 -> TP 1: {w[0]['bytes_max_rank']} B at most per rank per sync, {sum(x['time_s'] for x in w) / len(w) * 1e3:.1f} ms each")
PY
[[ "$gb1" == "$gb4" ]] || fail "the GRPO runs start from different accuracies ($gb1, $gb4)"
for pair in "DP 4:$gb1:$ga1" "TP 2 x PP 2 generating at TP 1:$gb4:$ga4"; do
  IFS=: read -r what b a <<< "$pair"
  python3 -c "import sys; b, a, bar = map(float, sys.argv[1:]); sys.exit(0 if a >= b + bar else 1)" "$b" "$a" "$gbar" ||
    fail "GRPO at $what did not raise held-out accuracy by $gbar ($b -> $a)"
done
python3 -c "import sys; x, y, d = map(float, sys.argv[1:]); sys.exit(0 if abs(x - y) <= d else 1)" "$ga1" "$ga4" "$apart" ||
  fail "GRPO at TP 2 x PP 2 generating at TP 1 ended $ga4, at DP 4 $ga1: more than $apart apart"
