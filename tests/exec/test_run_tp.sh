#!/usr/bin/env bash
# Tensor parallelism in `fuseflow run` (roles.<role>.layout, docs/run.md "Layouts"), on a
# tiny SFT model whose vocabulary (260) TP 2 divides:
#   - PPO with the actor, critic and ref at TP 2 on 2 workers, at TP 2 x DP 2 on 4, and at TP 4
#     on 4 (above the 2 key-value heads: each replicated on 2 ranks), sample
#     the same responses (so the same rewards) as on 1 worker for 3 iterations, with float
#     metrics within 1e-6 + 1% (TP sums partial products in another order; measured worst,
#     relative: approx_kl 2.8e-4, pg_loss 1.3e-4, ratio_max 7e-5, kl 7e-5, the rest below;
#     under the sanitizers grad_norm and approx_kl 5.6e-4);
#   - the same at TP 2 with sequence parallelism; at TP 2 x DP 2 with it, the collectives on the
#     models' buffers (the default) give the bits of those through host memory (FF_DEVICE_COLL=0);
#   - a TP 2 run stopped after 2 iterations resumes on 1 worker (the checkpoint holds whole
#     tensors) and ends as the TP 1 run does; its checkpoint loads in `fuseflow generate`;
#   - GRPO with generation at TP 2 on a pool of its own while training at TP 1 (weights synced
#     across layouts), the reverse, and training at TP 2 with generation at DP 2 on the same
#     workers, train like the colocated TP 1 run;
#   - a reward model at TP 2 on workers of its own gives the TP 1 scores (within 1e-6 + 1e-4);
#   - layouts that cannot run are refused before any worker starts, with the planner's words.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_tp
S=$tp_sft
steps=3
# Adam's eps: with 1e-8, a weight whose gradient is at rounding level moves by +-lr, its sign
# set by the rounding, so TP 1 and TP 2 would differ by lr-sized steps after one update and
# sample otherwise soon (as two DP layouts would); 1e-5 keeps such weights still and leaves
# real gradients' steps as they are (tests/model/test_model_tp.c does the same)
eps="roles.actor.optim.eps=1e-5 roles.critic.optim.eps=1e-5"

ppo() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/ppo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model=$S roles.ref.model=$S roles.critic.model=$S \
    graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=8 graph.train_critic.mini_batch_size=4 \
    graph.train_critic.micro_batch_size=8 roles.actor.optim.lr=1e-3 roles.critic.optim.lr=1e-3 $eps --val-limit 64 --no-progress \
    --dump-samples "$@" > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "ppo $* did not run"; }
}

ppo "$work/tp1" roles.actor.workers=1
ppo "$work/tp2" roles.actor.workers=2 roles.actor.layout.tp=2
ppo "$work/tp2dp2" --workers 4 roles.actor.layout.tp=2
grep -q "actor \[0 1\] tp 2 x pp 1 x dp 1, critic \[0 1\] tp 2 x pp 1 x dp 1, ref \[0 1\] tp 2 x pp 1 x dp 1" "$work/tp2.log" ||
  fail "the roles are not at TP 2: $(head -1 "$work/tp2.log")"
grep -q "actor \[0 1 2 3\] tp 2 x pp 1 x dp 2" "$work/tp2dp2.log" || fail "the actor is not at TP 2 x DP 2: $(head -1 "$work/tp2dp2.log")"
grep -q "rank 1 holds .*actor 178 KiB weights" "$work/tp2.log" || fail "a TP rank does not hold half the actor: $(grep 'rank 1' "$work/tp2.log")"
[[ $(iterations "$work/tp1/metrics.jsonl") == "$steps" ]] || fail "tp1: expected $steps iterations"
same_samples "$work/tp1" "$work/tp2" "TP 2"
same_samples "$work/tp1" "$work/tp2dp2" "TP 2 x DP 2"
same_metrics "$work/tp1/metrics.jsonl" "$work/tp2/metrics.jsonl" 1e-6 1e-2 || fail "TP 2 does not train like TP 1"
same_metrics "$work/tp1/metrics.jsonl" "$work/tp2dp2/metrics.jsonl" 1e-6 1e-2 || fail "TP 2 x DP 2 does not train like TP 1"
# with sequence parallelism (norms on each rank's rows, all-gather / reduce-scatter around the blocks)
ppo "$work/sp" roles.actor.workers=2 roles.actor.layout.tp=2 roles.actor.layout.sp=true
same_samples "$work/tp1" "$work/sp" "TP 2 with SP"
same_metrics "$work/tp1/metrics.jsonl" "$work/sp/metrics.jsonl" 1e-6 1e-2 || fail "TP 2 with SP does not train like TP 1"
# the workers run the models' collectives on their buffers (ff_model_comm's dev_ calls, the cpu
# ff_coll reading the cpu backend's memory); FF_DEVICE_COLL=0 copies them through host memory
# instead: the same collectives on the same values, so the same bits (TP 2 x DP 2 with SP: the
# all-reduces, gathers and scatters and the DP gradient sum)
ppo "$work/sp_dp" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.sp=true
FF_DEVICE_COLL=0 ppo "$work/sp_dp_host" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.sp=true
same_samples "$work/sp_dp" "$work/sp_dp_host" "TP 2 x DP 2 with SP, collectives through host memory"
same_metrics "$work/sp_dp/metrics.jsonl" "$work/sp_dp_host/metrics.jsonl" 0 0 ||
  fail "the collectives on the models' buffers do not give the bits of those through host memory"

# TP 4 above the 2 key-value heads: each head replicated on 2 ranks (the planner accepts it,
# docs/planner.md "Replicated key-value heads"), and it trains as TP 1
ppo "$work/tp4" roles.actor.workers=4 roles.actor.layout.tp=4
grep -q "actor \[0 1 2 3\] tp 4 x pp 1 x dp 1" "$work/tp4.log" || fail "the actor is not at TP 4: $(head -1 "$work/tp4.log")"
same_samples "$work/tp1" "$work/tp4" "TP 4 (KV heads replicated)"
same_metrics "$work/tp1/metrics.jsonl" "$work/tp4/metrics.jsonl" 1e-6 1e-2 || fail "TP 4 with replicated KV heads does not train like TP 1"
# and with sequence parallelism: 22 positions per sequence over 4 ranks (the engine splits any
# token count; the planner is given the sequence rounded up to a multiple of TP)
ppo "$work/tp4sp" roles.actor.workers=4 roles.actor.layout.tp=4 roles.actor.layout.sp=true
same_samples "$work/tp1" "$work/tp4sp" "TP 4 with SP"
same_metrics "$work/tp1/metrics.jsonl" "$work/tp4sp/metrics.jsonl" 1e-6 1e-2 || fail "TP 4 with SP does not train like TP 1"

# TP 2 x DP 2 with the optimizer state sharded over the replicas (ZeRO-1): trains as TP 1,
# and its checkpoint (saved by both replicas' gathers) resumes at ZeRO-0
ppo "$work/zero" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.zero=1 roles.critic.layout.zero=1 --stop-after 2
ppo "$work/zero" --workers 4 roles.actor.layout.tp=2 --resume
same_samples "$work/tp1" "$work/zero" "TP 2 x DP 2 at ZeRO-1"
same_metrics "$work/tp1/metrics.jsonl" "$work/zero/metrics.jsonl" 1e-6 1e-2 || fail "TP 2 x DP 2 at ZeRO-1 does not train like TP 1"

# stopped at TP 2, resumed at TP 1
ppo "$work/res" roles.actor.workers=2 roles.actor.layout.tp=2 --stop-after 2
ppo "$work/res" roles.actor.workers=1 --resume
same_metrics "$work/tp1/metrics.jsonl" "$work/res/metrics.jsonl" 1e-6 1e-2 || fail "a TP 2 checkpoint resumed at TP 1 does not go on as TP 1"
[[ -f "$work/res/checkpoints/step-00000002/critic/model.safetensors" && -f "$work/res/checkpoints/step-00000002/critic.optim.safetensors" ]] ||
  fail "the TP 2 checkpoint has no critic"
"$bin" generate --model "$work/res/checkpoints/step-00000002/actor" --prompt '1+2=' --temperature 0 --max-new-tokens 4 > /dev/null ||
  fail "the actor checkpointed at TP 2 does not load in fuseflow generate"

# generation at another layout than training, on a pool of its own
tp_grpo "$work/g1" roles.actor.workers=1
tp_grpo "$work/gen_tp2" roles.actor.workers=1 roles.actor.rollout.workers=2 roles.actor.rollout.layout.tp=2
tp_grpo "$work/train_tp2" roles.actor.workers=2 roles.actor.layout.tp=2 roles.actor.rollout.workers=1
grep -q "actor \[0\], gen \[1 2\] tp 2 x pp 1 x dp 1" "$work/gen_tp2.log" || fail "generation is not at TP 2 apart: $(head -1 "$work/gen_tp2.log")"
same_samples "$work/g1" "$work/gen_tp2" "generation at TP 2"
same_samples "$work/g1" "$work/train_tp2" "training at TP 2"
same_metrics "$work/g1/metrics.jsonl" "$work/gen_tp2/metrics.jsonl" 1e-6 1e-2 || fail "generation at TP 2 does not train like TP 1"
same_metrics "$work/g1/metrics.jsonl" "$work/train_tp2/metrics.jsonl" 1e-6 1e-2 || fail "training at TP 2 does not train like TP 1"
# and on the same workers: training at TP 2, generation at DP 2 (each rank receiving the other TP half after each update)
tp_grpo "$work/relaid" roles.actor.workers=2 roles.actor.layout.tp=2 roles.actor.rollout.layout.tp=1 roles.actor.rollout.layout.dp=2
grep -q "actor \[0 1\] tp 2 x pp 1 x dp 1, gen \[0 1\]" "$work/relaid.log" || fail "generation is not at DP 2 beside TP 2: $(head -1 "$work/relaid.log")"
same_samples "$work/g1" "$work/relaid" "generation at DP 2 on the TP 2 workers"
same_metrics "$work/g1/metrics.jsonl" "$work/relaid/metrics.jsonl" 1e-6 1e-2 || fail "generation at DP 2 on the TP 2 workers does not train like TP 1"
# HybridFlow's TP 4 -> TP 2 on the same 4 workers: generation TP groups {0 2} and {1 3}, each rank
# gathering the other half of its generation shard from its micro-DP neighbour (replicated
# key/value heads at TP 4: 2 of them), the bytes per rank its generation shard minus its own
tp_grpo "$work/tp4to2" --workers 4 roles.actor.layout.tp=4 roles.actor.rollout.layout.tp=2
grep -q "actor \[0 1 2 3\] tp 4 x pp 1 x dp 1, gen \[0 1 2 3\] tp 2 x pp 1 x dp 2" "$work/tp4to2.log" ||
  fail "not at TP 4 generating at TP 2: $(head -1 "$work/tp4to2.log")"
same_samples "$work/g1" "$work/tp4to2" "TP 4 generating at TP 2"
same_metrics "$work/g1/metrics.jsonl" "$work/tp4to2/metrics.jsonl" 1e-6 1e-2 || fail "TP 4 generating at TP 2 does not train like TP 1"
python3 - "$work/tp4to2/metrics.jsonl" <<'PY' || fail "TP 4 -> TP 2: the weight sync's bytes are not the formula's"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
mem = next(l["memory"] for l in L if "memory" in l)
want = [r["roles"]["gen"]["params_bytes"] - r["roles"]["actor"]["params_bytes"] for r in mem]
for w in [l["weight_sync"] for l in L if "samples" in l]:
    assert w["bytes"] == sum(want) and w["bytes_max_rank"] == max(want) and min(want) > 0, (w, want)
# in place: the copy reads the whole training shard where it is and allocates only what it receives
assert all(r["roles"]["gen"]["in_place_bytes"] == r["roles"]["actor"]["params_bytes"] for r in mem), mem
PY

# a reward model (op: score, a value head) at TP 2 on workers of its own scores as at TP 1
"$bin" init --preset tiny --out "$work/rm" num_hidden_layers=2 hidden_size=64 intermediate_size=128 vocab_size=260 value_head=true \
  --seed 5 > /dev/null
for tp in 1 2; do
  cat > "$work/rm$tp.yaml" <<YAML
trainer: {steps: 2, seed: 2, out_dir: $work/rmrun$tp}
data: {train_files: $cache/arith/train.jsonl, train_batch_size: 4, max_prompt_length: 16, max_response_length: 6}
roles:
  actor: {model: $S, workers: 1, optim: {lr: 1.0e-3, eps: 1.0e-5}}
  reward: {model: $work/rm, workers: 2, layout: {tp: $tp}}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4}
  rm: {op: score, role: reward, in: [prompt, response], out: [score], micro_batch_size: 4}
  advantage: {op: advantage, in: [score], out: [advantages], estimator: grpo}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages], mini_batch_size: 2, micro_batch_size: 4}
  sync: {op: sync_weights, role: actor, after: [train_actor]}
YAML
  "$bin" run "$work/rm$tp.yaml" --no-progress --dump-samples > "$work/rm$tp.log" 2>&1 || { cat "$work/rm$tp.log" >&2; fail "the reward model at TP $tp did not run"; }
done
grep -q "reward \[1 2\] tp 2 x pp 1 x dp 1" "$work/rm2.log" || fail "the reward model is not at TP 2: $(head -1 "$work/rm2.log")"
python3 - "$work/rmrun1/samples.jsonl" "$work/rmrun2/samples.jsonl" <<'PY' || fail "the reward model at TP 2 scores otherwise"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(a) == len(b) == 2 * 4 * 4 and len({o["score"] for o in a}) > 4, (len(a), len(b))
for x, y in zip(a, b):
    assert x["response"] == y["response"] and abs(x["score"] - y["score"]) <= 1e-6 + 1e-4 * abs(x["score"]), (x, y)
PY

# refused before any worker starts (no output folder, no worker line), with the planner's words
refused() { # NEEDLE EXTRA...
  local needle=$1; shift
  local out=$work/bad
  rm -rf "$out"
  if "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=1 data.train_batch_size=4 roles.ref.model=$S \
       graph.train_actor.mini_batch_size=2 "$@" --no-progress > "$work/bad.log" 2>&1; then
    fail "a run with $* was not refused"
  fi
  grep -qF -- "$needle" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "$*: the refusal does not say '$needle'"; }
  ! grep -q "workers (.* threads each)\|holds .* after loading" "$work/bad.log" && [[ ! -e "$out" ]] ||
    fail "$*: workers started before the refusal"
}
refused "TP 3 and the 2 key-value heads: neither divides the other" roles.actor.model=$S roles.actor.workers=3 roles.actor.layout.tp=3
refused "TP x CP x PP x DP = 2 x 1 x 1 x 2 = 4, but the cluster has 2 GPUs" roles.actor.model=$S roles.actor.workers=2 \
  roles.actor.layout.tp=2 roles.actor.layout.dp=2
refused "TP x CP x PP = 2 does not divide the 3 GPUs" roles.actor.model=$S roles.actor.workers=3 roles.actor.layout.tp=2
refused "PP 4 has more stages than the 2 layers" roles.actor.model=$S roles.actor.workers=4 roles.actor.layout.pp=4
refused "TP 2 does not divide the vocabulary of 259 tokens" roles.actor.model=$cache/tiny roles.ref.model=$cache/tiny \
  roles.actor.workers=2 roles.actor.layout.tp=2
refused "roles.ref.layout (dp 1, tp 2, pp 1 on 2 workers) cannot run $cache/tiny/config.json: layout: TP 2 does not divide the vocabulary" \
  roles.actor.model=$S roles.ref.model=$cache/tiny roles.actor.workers=2 roles.actor.layout.tp=2
refused "role 'ref' is colocated with 'actor' but has layout dp 2 x tp 1" roles.actor.model=$S roles.actor.workers=2 \
  roles.actor.layout.tp=2 roles.ref.layout.tp=1
refused "'roles.actor.tp' moved into the role's layout" roles.actor.model=$S roles.actor.workers=2 roles.actor.tp=2
echo "ok"
