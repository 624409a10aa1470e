#!/usr/bin/env bash
# RLHFuse's intra-stage fusion in `fuseflow run` (graph.train_actor.fuse, docs/run.md "Fused
# actor and critic training"), PPO on a fresh 4-layer tiny model (vocabulary 260):
#   - the actor and the critic at PP 4 on 4 workers (the critic's stages reversed), at PP 2 x
#     DP 2, and the actor at PP 4 with the critic as PP 2 x 2 replicas: `fuse: on` trains each
#     mini-batch of both in one fused step (rl.train_fused), samples the same responses and
#     gives the same metrics as `fuse: off` within the pipeline tests' 1e-6 + 1% (the critic's
#     reversed stages sum its gradient norm in another order; with the critic replicas exactly:
#     the same checkpoint bytes), and says it fused in metrics.jsonl ({"fuse": {"on": true, ...}});
#   - `auto` logs the simulated serial and fused makespans and its choice, and trains the same;
#   - the trace has one slice per rank for a fused step, labelled with both nodes;
#   - a run stopped after 2 fused iterations resumes with fuse off (the critic's checkpoint is
#     whole tensors, independent of its reversed stages) and ends as the fuse-off run does;
#   - the same with the critic replicas (and `auto` where they cannot fuse: one line, serial);
#   - bad configs are refused with the key named before any worker starts: fuse on at pp 1,
#     a critic pp not dividing the actor's, the critic at tp 2 or on workers of its own, without
#     a critic train node, with different mini-batch sizes, interleaved stages, an unknown value,
#     a fuse_peak out of range or not a number;
#   - fuse_peak (a cap on the fused schedule's activation memory per rank, x serial 1F1B's):
#     at 1 the unit instance fuses at the serial peak (the least peak within a makespan slack)
#     and trains as fuse off; at 0.2 nothing fits and it trains serially, saying so.
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
fused_in_metrics() { # METRICS WANT(true|false) WHAT
  python3 - "$1" "$2" <<'PY' || fail "$3: metrics.jsonl does not say fuse on = $2"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l]
want = sys.argv[2] == "true"
assert m and all(x["fuse"]["on"] == want and x["fuse"]["predicted_gain"] > 0.05 for x in m), [x.get("fuse") for x in m]
# planned iterations carry what the fused schedule costs in memory against serial's
assert all(x["fuse"]["predicted_peak_ratio"] > 0 for x in m if x["fuse"]["on"]), [x.get("fuse") for x in m]
print("fuse per iteration:", [x["fuse"] for x in m])
PY
}

pp4="--workers 4 roles.actor.layout.pp=4"
ppo "$work/off4" $pp4
ppo "$work/on4" $pp4 graph.train_actor.fuse=on --trace "$work/on4.trace.json"
grep -q "actor \[0 1 2 3\] tp 1 x pp 4 x dp 1, gen \[0 1 2 3\], critic \[0 1 2 3\] tp 1 x pp 4 x dp 1" "$work/on4.log" ||
  fail "the roles are not at PP 4: $(head -1 "$work/on4.log")"
grep -q "run: fuse on: the critic's stage k on pipeline rank 3-k" "$work/on4.log" || { cat "$work/on4.log" >&2; fail "fuse on does not say the critic is reversed"; }
grep -q "run: fuse on: pp 4, actor 4 micro-batches .* simulated streams' makespan serial [0-9]*, fused [0-9]* .*fused steps" "$work/on4.log" ||
  { cat "$work/on4.log" >&2; fail "fuse on does not log its instance and makespans"; }
same_samples "$work/off4" "$work/on4" "fuse on at PP 4"
same_metrics "$work/off4/metrics.jsonl" "$work/on4/metrics.jsonl" 1e-6 1e-2 || fail "fuse on at PP 4 does not train like fuse off"
fused_in_metrics "$work/on4/metrics.jsonl" true "fuse on at PP 4"
# the memory cost, logged and in the metrics: the unit instance's serial 1F1B holds 4
# micro-batches of activation 1 on rank 0 (the actor's first stage) and rank 3 (the critic's)
ratio=$(grep -o "peak activation per rank serial 4, fused [0-9.]* ([0-9.]*x)" "$work/on4.log" | head -1 | sed 's/.*(\([0-9.]*\)x)/\1/')
[[ -n "$ratio" ]] || { cat "$work/on4.log" >&2; fail "fuse on does not log the peak activation per rank (serial 4 on the unit instance)"; }
python3 - "$work/on4/metrics.jsonl" "$ratio" <<'PY' || fail "the metrics' predicted_peak_ratio is not the logged one"
import json, sys
m = [json.loads(l)["fuse"] for l in open(sys.argv[1]) if '"samples"' in l]
assert all(abs(x["predicted_peak_ratio"] - float(sys.argv[2])) < 0.006 for x in m), (m, sys.argv[2])
PY
# the trace: every fused step is one subtask slice on each of the 4 ranks, named after both nodes
python3 - "$work/on4.trace.json" <<'PY' || fail "the trace does not show the fused steps per rank"
import json, sys
from collections import Counter
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
fused = [e for e in ev if e.get("ph") == "X" and e.get("pid", 0) > 0 and "train_actor + train_critic" in e.get("name", "")]
per = Counter(e["pid"] for e in fused)
# 3 iterations x 2 mini-batches, on each worker
assert sorted(per) == [1, 2, 3, 4] and set(per.values()) == {3 * 2}, per
serial = [e for e in ev if e.get("ph") == "X" and e.get("pid", 0) > 0 and e.get("name", "").startswith("train_critic step")]
assert not serial, serial[:2]
PY
# the iteration times, serial against fused (for the log: on shared cores they are noise)
python3 - "$work/off4/metrics.jsonl" "$work/on4/metrics.jsonl" <<'PY'
import json, sys
def t(p): return [round(json.loads(l)["time"]["iteration"], 3) for l in open(p) if '"samples"' in l]
print("iteration seconds, serial:", t(sys.argv[1]), "fused:", t(sys.argv[2]))
PY

# PP 2 x DP 2 on 4 workers: two fused pipelines, each model's gradients summed over the replicas
ppo "$work/off22" --workers 4 roles.actor.layout.pp=2
ppo "$work/on22" --workers 4 roles.actor.layout.pp=2 graph.train_actor.fuse=on
grep -q "actor \[0 1 2 3\] tp 1 x pp 2 x dp 2" "$work/on22.log" || fail "not at PP 2 x DP 2: $(head -1 "$work/on22.log")"
same_samples "$work/off22" "$work/on22" "fuse on at PP 2 x DP 2"
same_metrics "$work/off22/metrics.jsonl" "$work/on22/metrics.jsonl" 1e-6 1e-2 || fail "fuse on at PP 2 x DP 2 does not train like fuse off"
fused_in_metrics "$work/on22/metrics.jsonl" true "fuse on at PP 2 x DP 2"

# the actor at PP 4 with the critic as PP 2 x 2 replicas on the same 4 workers: replica 0 on
# ranks [1, 0] and replica 1 on [3, 2] when fused (each reversed in its half of the actor's
# pipeline), [0, 1] and [2, 3] when not; the critic's share of each mini-batch split between
# them, their gradients summed over both before the critic's step. Fused and serial train the
# same bit for bit here (the final checkpoints' weights and AdamW states are the same bytes):
# each stage runs the same micro-batches in the same order, and the gradient norm sums 2
# stages (a + b = b + a in floating point; at PP 4 reversed the order of 4 terms changes).
c22="--workers 4 roles.actor.layout.pp=4 roles.critic.layout.pp=2 roles.critic.layout.dp=2"
ppo "$work/offc2" $c22
ppo "$work/onc2" $c22 graph.train_actor.fuse=on
grep -q "actor \[0 1 2 3\] tp 1 x pp 4 x dp 1, gen \[0 1 2 3\], critic \[0 1 2 3\] tp 1 x pp 2 x dp 2" "$work/onc2.log" ||
  fail "not actor PP 4 with critic PP 2 x DP 2: $(head -1 "$work/onc2.log")"
grep -q "run: fuse on: 2 critic replicas in each actor pipeline, replica b's stage k on pipeline rank b x 2 + 1-k" "$work/onc2.log" ||
  { cat "$work/onc2.log" >&2; fail "fuse on does not say where the critic replicas are"; }
grep -q "run: fuse on: pp 4, actor 4 micro-batches on stages 0..3 .*, critic replicas 2 on 1..0, 2 on 3..2 .* fused steps" "$work/onc2.log" ||
  { cat "$work/onc2.log" >&2; fail "fuse on does not log the instance of the critic replicas"; }
same_samples "$work/offc2" "$work/onc2" "fuse on, critic PP 2 x 2"
same_metrics "$work/offc2/metrics.jsonl" "$work/onc2/metrics.jsonl" 0 0 || fail "fuse on with critic PP 2 x 2 does not train exactly like fuse off"
fused_in_metrics "$work/onc2/metrics.jsonl" true "fuse on, critic PP 2 x 2"
for f in actor/model critic/model actor.optim critic.optim; do
  cmp -s "$work/offc2/checkpoints/step-00000003/$f.safetensors" "$work/onc2/checkpoints/step-00000003/$f.safetensors" ||
    fail "fuse on with critic PP 2 x 2: $f.safetensors differs from fuse off's"
done
python3 - "$work/onc2/metrics.jsonl" <<'PY' || fail "the critic replicas' steps are not all in the metrics"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l]
assert all(x["critic_steps"] == 2 and x["actor_steps"] == 2 and x["value_loss"] > 0 for x in m), m
PY
# auto on the same layout: measured from its serial first iteration, then its choice
ppo "$work/autoc2" $c22 graph.train_actor.fuse=auto
grep -q "run: fuse auto: pp 4, actor 4 micro-batches .* measured), critic replicas 2 on 1..0, 2 on 3..2 (.* ms, .* ms, .* KB): .*, \(fused\|serial\) steps" "$work/autoc2.log" ||
  { cat "$work/autoc2.log" >&2; fail "fuse auto with critic replicas does not log its measured instance"; }
same_samples "$work/offc2" "$work/autoc2" "fuse auto, critic PP 2 x 2"
same_metrics "$work/offc2/metrics.jsonl" "$work/autoc2/metrics.jsonl" 0 0 || fail "fuse auto with critic PP 2 x 2 does not train like fuse off"
# auto where the critic replicas cannot fuse (other mini-batch sizes): one line saying why, the
# nested critic trained serially
ppo "$work/autoc2m" $c22 graph.train_actor.fuse=auto graph.train_critic.mini_batch_size=4 graph.train_critic.micro_batch_size=4
[[ $(grep -c "run: fuse auto: the actor and the critic train one after the other (node 'train_actor' has mini_batch_size 2 x epochs 1, node 'train_critic' 4 x 1)" "$work/autoc2m.log") == 1 ]] ||
  { cat "$work/autoc2m.log" >&2; fail "fuse auto with other mini-batch sizes does not say once why it trains serially"; }
! grep -q '"fuse"' "$work/autoc2m/metrics.jsonl" || fail "fuse auto with other mini-batch sizes reports fused steps"
# stopped after 2 fused iterations, resumed with fuse off (the critic's blocks then forward)
ppo "$work/resc2" $c22 graph.train_actor.fuse=on --stop-after 2
ppo "$work/resc2" $c22 --resume
grep -q "resuming from" "$work/resc2.log" || fail "the critic PP 2 x 2 run did not resume: $(head -2 "$work/resc2.log")"
same_metrics "$work/offc2/metrics.jsonl" "$work/resc2/metrics.jsonl" 0 0 || fail "critic PP 2 x 2: fused iterations resumed with fuse off do not go on as fuse off"

# auto: the first iteration serial, its stages' times measured; then the simulator's choice on
# the measured instance, logged with its numbers, and the same training whichever it is
ppo "$work/auto4" $pp4 graph.train_actor.fuse=auto
grep -q "run: fuse auto: pp 4, actor 4 micro-batches on stages 0..3 (forward [0-9.e+-]* ms, backward [0-9.e+-]* ms, activation [0-9.e+-]* KB per stage, measured), critic 4 on 3..0 .* simulated streams' makespan serial [0-9.e+-]* ms, fused [0-9.e+-]* ms .*gain -*[0-9.]*%, \(fused\|serial\) steps" \
  "$work/auto4.log" || { cat "$work/auto4.log" >&2; fail "fuse auto does not log its measured instance, makespans and choice"; }
same_samples "$work/off4" "$work/auto4" "fuse auto at PP 4"
same_metrics "$work/off4/metrics.jsonl" "$work/auto4/metrics.jsonl" 1e-6 1e-2 || fail "fuse auto at PP 4 does not train like fuse off"
python3 - "$work/auto4/metrics.jsonl" "$(grep -o 'gain -*[0-9.]*%, [a-z]* steps' "$work/auto4.log")" <<'PY' || fail "fuse auto's metrics do not follow its choice"
import json, re, sys
m = [json.loads(l)["fuse"] for l in open(sys.argv[1]) if '"samples"' in l]
gain, choice = re.match(r"gain (-?[0-9.]+)%, (\w+) steps", sys.argv[2]).groups()
assert m[0] == {"on": False, "predicted_gain": 0.0}, m  # the measured iteration: nothing planned
assert all(x["on"] == (choice == "fused") and abs(100 * x["predicted_gain"] - float(gain)) < 0.06 for x in m[1:]), (m, gain, choice)
assert (float(gain) >= 5) == (choice == "fused"), (gain, choice)
print("fuse auto:", m, "choice", choice, "at a predicted gain of", gain, "%")
PY
grep "run: fuse auto: pp" "$work/auto4.log"

# fuse_peak: a memory cap per rank, as a multiple of the serial 1F1B's peak. On the unit
# instance the fastest schedule holds 5 (1.25x); capped at 1, the least peak within a makespan
# slack, the first slack that fits: fused steps with the serial peak, training as fuse off
ppo "$work/cap4" $pp4 graph.train_actor.fuse=on graph.train_actor.fuse_peak=1
grep -q "run: fuse on: the critic's stage k on pipeline rank 3-k of the actor's pipeline; each mini-batch of both trains in one fused step, where a schedule holds at most 1 x the serial 1F1B's activation memory per rank (fuse_peak)" "$work/cap4.log" ||
  { cat "$work/cap4.log" >&2; fail "fuse_peak is not in fuse on's description"; }
grep -q "peak activation per rank serial 4, fused [0-4] (\(0\.[0-9]*\|1\.00\)x; fuse_peak 1: the least peak within [0-9.]*% of the fastest schedule): gain [0-9.]*%, fused steps" "$work/cap4.log" ||
  { cat "$work/cap4.log" >&2; fail "fuse on with fuse_peak 1 does not fit the serial peak (or does not say how)"; }
same_samples "$work/off4" "$work/cap4" "fuse on at PP 4 under fuse_peak 1"
same_metrics "$work/off4/metrics.jsonl" "$work/cap4/metrics.jsonl" 1e-6 1e-2 || fail "fuse on under fuse_peak 1 does not train like fuse off"
fused_in_metrics "$work/cap4/metrics.jsonl" true "fuse on under fuse_peak 1"
python3 - "$work/cap4/metrics.jsonl" <<'PY' || fail "fuse_peak 1: the metrics' predicted peak ratio is over the cap"
import json, sys
m = [json.loads(l)["fuse"] for l in open(sys.argv[1]) if '"samples"' in l]
assert all(x["predicted_peak_ratio"] <= 1 + 1e-9 for x in m), m
PY
# a cap no fused schedule fits (a forward alone holds 1 of the serial 4): serial steps, said so
ppo "$work/cap02" $pp4 graph.train_actor.fuse=on graph.train_actor.fuse_peak=0.2
grep -q "fuse_peak 0.2: no fused schedule found under it, the least within 100% of the fastest): gain [-0-9.]*%, serial steps (over fuse_peak)" "$work/cap02.log" ||
  { cat "$work/cap02.log" >&2; fail "fuse on under an unreachable fuse_peak does not train serially saying why"; }
same_metrics "$work/off4/metrics.jsonl" "$work/cap02/metrics.jsonl" 0 0 || fail "fuse on over fuse_peak does not train exactly as fuse off"
python3 - "$work/cap02/metrics.jsonl" <<'PY' || fail "fuse on over fuse_peak reports fused steps"
import json, sys
m = [json.loads(l)["fuse"] for l in open(sys.argv[1]) if '"samples"' in l]
assert m and all(not x["on"] for x in m), m
PY
grep -h "run: fuse on: pp" "$work/cap4.log" "$work/cap02.log"
# auto where it cannot fuse (pp 1): one line saying why, trained serially
ppo "$work/auto1" roles.actor.workers=1 graph.train_actor.fuse=auto
grep -q "run: fuse auto: the actor and the critic train one after the other (fuse needs the actor and the critic pipelined (pp >= 2)" \
  "$work/auto1.log" || { cat "$work/auto1.log" >&2; fail "fuse auto at pp 1 does not say why it trains serially"; }
! grep -q '"fuse"' "$work/auto1/metrics.jsonl" || fail "fuse auto at pp 1 reports fused steps"

# stopped after 2 fused iterations, resumed with fuse off: the critic's checkpoint (whole
# tensors, gathered from its reversed stages) loads in the forward layout
ppo "$work/res" $pp4 graph.train_actor.fuse=on --stop-after 2
ppo "$work/res" $pp4 --resume
grep -q "resuming from" "$work/res.log" || fail "the run did not resume: $(head -2 "$work/res.log")"
same_metrics "$work/off4/metrics.jsonl" "$work/res/metrics.jsonl" 1e-6 1e-2 || fail "fused iterations resumed with fuse off do not go on as fuse off"

# refused before any worker starts, with the key named
refused() { # WHAT WANT OVERRIDES...
  local what=$1 want=$2; shift 2
  local out=$work/bad
  if "$bin" run "$src/examples/ppo.yaml" $(small_run "$out") trainer.steps=1 data.train_batch_size=4 graph.rollout.n=4 \
       roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M graph.train_actor.mini_batch_size=2 \
       graph.train_critic.mini_batch_size=2 graph.train_actor.micro_batch_size=2 graph.train_critic.micro_batch_size=2 \
       --no-progress "$@" > "$work/bad.log" 2>&1; then
    fail "$what was not refused"
  fi
  grep -qF "graph.train_actor.fuse" "$work/bad.log" || grep -qF "train_actor.fuse" "$work/bad.log" ||
    { cat "$work/bad.log" >&2; fail "the refusal of $what does not name the key"; }
  grep -qF -- "$want" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "the refusal of $what does not say: $want"; }
  [[ ! -e "$out" ]] || fail "workers started before the refusal of $what"
}
refused "fuse on at pp 1" "pipelined (pp >= 2), the critic's pp dividing the actor's" roles.actor.workers=1 graph.train_actor.fuse=on
refused "fuse on with a critic pp that does not divide the actor's" "the critic's pp dividing the actor's (actor pp 2, critic pp 4)" \
  --workers 4 roles.actor.layout.pp=2 roles.critic.layout.pp=4 roles.critic.layout.dp=1 graph.train_actor.fuse=on
refused "fuse on with the critic at tp 2" "critic tp 2 pp 2 dp 1" $c22 roles.critic.layout.tp=2 roles.critic.layout.dp=1 \
  graph.train_actor.fuse=on
refused "fuse on with the critic replicas on other workers" "roles.critic.colocate_with: actor" $c22 roles.critic.colocate_with=null \
  roles.critic.workers=4 graph.train_actor.fuse=on
refused "fuse on with other mini-batch sizes" "the same mini_batch_size and epochs" $pp4 graph.train_actor.fuse=on \
  graph.train_critic.mini_batch_size=4
refused "fuse on with interleaved stages" "vpp 1 with the 1f1b schedule" --workers 4 roles.actor.layout.pp=2 roles.actor.layout.vpp=2 \
  roles.actor.layout.schedule=interleaved graph.train_actor.fuse=on
refused "an unknown fuse value" "off, on, auto" $pp4 graph.train_actor.fuse=sometimes
refused "fuse_peak 0" "'fuse_peak' must be in [0.1, 100], got 0" $pp4 graph.train_actor.fuse=on graph.train_actor.fuse_peak=0
refused "fuse_peak not a number" "fuse_peak" $pp4 graph.train_actor.fuse=on graph.train_actor.fuse_peak=lots
# without a critic train node: GRPO's graph has none
out=$work/bad
if "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=1 data.train_batch_size=4 roles.ref.model=$M \
     roles.actor.model=$M graph.train_actor.mini_batch_size=2 --workers 4 roles.actor.layout.pp=4 graph.train_actor.fuse=on \
     --no-progress > "$work/bad.log" 2>&1; then
  fail "fuse on without a critic was not refused"
fi
grep -qF "train_actor.fuse" "$work/bad.log" && grep -qF "no critic train node" "$work/bad.log" ||
  { cat "$work/bad.log" >&2; fail "the refusal of fuse without a critic does not name the key and the reason"; }
[[ ! -e "$out" ]] || fail "workers started before the refusal of fuse without a critic"
echo "ok"
