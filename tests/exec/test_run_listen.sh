#!/usr/bin/env bash
# `fuseflow run --listen` on one machine, the hosts told apart by `fuseflow worker --host`
# (tests/exec/test_run_hosts.sh runs across network namespaces):
#   - PPO at TP 2 x DP 2 with four workers joining over tcp with CURVE from hostA, hostB,
#     hostA, hostB in turn: each replica's TP pair is placed on one host (ranks 0 and 2 on
#     hostA hold replica 0), and the run samples and trains as the same run on local workers;
#     a worker without the key is refused first and the run goes on;
#   - one local worker and three from hostB: replica 0 spans two hosts, and the log says so;
#   - workers giving their local index (their rail): each host's share goes by index, not by
#     join order, so the DP groups keep to rails, and the log says so; indices that differ
#     between the hosts are warned of, naming both;
#   - --curve or --local without --listen, and more --local workers than the run has, are
#     refused with a message naming the option.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_tp
S=$tp_sft
set +e
"$bin" keygen "$work/keys" > /dev/null || fail "keygen"
eps="roles.actor.optim.eps=1e-5 roles.critic.optim.eps=1e-5" # as test_run_tp.sh (why there)
ppo_args() { # OUT
  echo "$src/examples/ppo.yaml" $(small_run "$1") trainer.steps=2 trainer.test_freq=0 trainer.save_freq=0 data.train_batch_size=8 \
    graph.rollout.n=4 roles.actor.model=$S roles.ref.model=$S roles.critic.model=$S graph.train_actor.mini_batch_size=4 \
    graph.train_actor.micro_batch_size=8 graph.train_critic.mini_batch_size=4 graph.train_critic.micro_batch_size=8 \
    roles.actor.optim.lr=1e-3 roles.critic.optim.lr=1e-3 $eps --workers 4 roles.actor.layout.tp=2 --no-progress --dump-samples
}
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; cleanup' EXIT
# the controller's endpoint, once it listens (tcp://127.0.0.1:0 picks a free port)
endpoint_of() { # LOG
  local ep=""
  for _ in $(seq 400); do
    ep=$(grep -o 'listening on tcp://[0-9.]*:[0-9]*' "$1" | grep -o 'tcp://.*') && break
    sleep 0.05
  done
  [[ -n "$ep" ]] || { cat "$1" >&2; fail "the controller does not listen"; }
  echo "$ep"
}
joined() { # LOG N: wait for the N-th join line
  for _ in $(seq 400); do
    [[ $(grep -c '^run: worker joined' "$1") -ge $2 ]] && return 0
    sleep 0.05
  done
  cat "$1" >&2; fail "worker $2 did not join"
}

"$bin" run $(ppo_args "$work/local") > "$work/local.log" 2>&1 || { cat "$work/local.log" >&2; fail "the local run"; }

"$bin" run $(ppo_args "$work/hosts") --listen tcp://127.0.0.1:0 --curve "$work/keys/controller.key" --expect-timeout 60 \
  > "$work/hosts.log" 2>&1 &
ctl=$!
pids+=($ctl)
ep=$(endpoint_of "$work/hosts.log")
"$bin" worker --connect "$ep" --host intruder --connect-timeout 20 > "$work/intruder.log" 2>&1
[[ $? -eq 1 ]] && grep -q -- "pass --curve worker.key" "$work/intruder.log" || { cat "$work/intruder.log" >&2; fail "a worker without the key got in"; }
n=0
for h in hostA hostB hostA hostB; do
  "$bin" worker --connect "$ep" --curve "$work/keys/worker.key" --host $h > "$work/w$n.log" 2>&1 &
  pids+=($!)
  n=$((n + 1))
  joined "$work/hosts.log" $n
done
wait $ctl || { cat "$work/hosts.log" >&2; fail "the run across hosts"; }
for want in "rank 0: host hostA (actor gen critic ref; actor dp 0 tp 0" "rank 2: host hostA (actor gen critic ref; actor dp 0 tp 1" \
            "rank 1: host hostB (actor gen critic ref; actor dp 1 tp 0" "rank 3: host hostB (actor gen critic ref; actor dp 1 tp 1"; do
  grep -qF "run: $want" "$work/hosts.log" || { cat "$work/hosts.log" >&2; fail "not placed: $want"; }
done
! grep -q "spans hosts" "$work/hosts.log" || fail "a replica spans hosts though each host has two workers"
cmp -s "$work/local/samples.jsonl" "$work/hosts/samples.jsonl" || fail "other samples across hosts"
same_metrics "$work/local/metrics.jsonl" "$work/hosts/metrics.jsonl" 1e-6 1e-2 || fail "TP 2 x DP 2 across hosts does not train as locally"
echo "TP 2 x DP 2 on two hosts joining in turn: replicas whole on each host, the local run's samples and metrics"

# one local worker (this machine's name) and three from hostB: replica 0 spans both
"$bin" run $(ppo_args "$work/span") --stop-after 1 --listen tcp://127.0.0.1:0 --curve "$work/keys/controller.key" --local 1 \
  --expect-timeout 60 > "$work/span.log" 2>&1 &
ctl=$!
pids+=($ctl)
ep=$(endpoint_of "$work/span.log")
for n in 1 2 3; do
  "$bin" worker --connect "$ep" --curve "$work/keys/worker.key" --host hostB > "$work/s$n.log" 2>&1 &
  pids+=($!)
done
wait $ctl || { cat "$work/span.log" >&2; fail "the run with a spanning replica"; }
grep -q "run: warning: replica 0 of the actor spans hosts $(hostname) and hostB" "$work/span.log" ||
  { cat "$work/span.log" >&2; fail "no warning for a replica across hosts"; }

# local indices: joined as hostA 1, hostB 1, hostA 0, hostB 0, placed by index on each host
rails_run() { # NAME INDEX_A1 INDEX_B1 INDEX_A2 INDEX_B2
  local name=$1; shift
  "$bin" run $(ppo_args "$work/$name") --stop-after 1 --listen tcp://127.0.0.1:0 --curve "$work/keys/controller.key" \
    --expect-timeout 60 > "$work/$name.log" 2>&1 &
  local c=$!
  pids+=($c)
  local e n=0
  e=$(endpoint_of "$work/$name.log")
  for h in hostA hostB hostA hostB; do
    "$bin" worker --connect "$e" --curve "$work/keys/worker.key" --host $h --local-index $1 > "$work/$name$n.log" 2>&1 &
    pids+=($!)
    shift; n=$((n + 1))
    joined "$work/$name.log" $n
  done
  wait $c || { cat "$work/$name.log" >&2; fail "the run $name"; }
}
rails_run rails 1 1 0 0
for want in "rank 2: host hostA index 0 (actor gen critic ref; actor dp 0 tp 0" "rank 0: host hostA index 1 (actor gen critic ref; actor dp 0 tp 1" \
            "rank 3: host hostB index 0 (actor gen critic ref; actor dp 1 tp 0" "rank 1: host hostB index 1 (actor gen critic ref; actor dp 1 tp 1" \
            "the actor's DP groups are rail-aligned" "the critic's DP groups are rail-aligned"; do
  grep -qF "run: $want" "$work/rails.log" || { cat "$work/rails.log" >&2; fail "not placed by local index: $want"; }
done
rails_run offrail 0 2 1 3
grep -qF "run: warning: the actor's DP group at tp 0 pp 0 is not rail-aligned: local indices 0 on hostA, 2 on hostB" "$work/offrail.log" ||
  { cat "$work/offrail.log" >&2; fail "no warning for DP groups off the rails"; }
echo "local indices: placed by index on each host, rail-aligned; other indices on each host warned of"

# refused options
"$bin" run $(ppo_args "$work/u1") --curve "$work/keys/controller.key" > "$work/u1.log" 2>&1
[[ $? -eq 2 ]] && grep -q -- "--curve needs --listen" "$work/u1.log" || { cat "$work/u1.log" >&2; fail "--curve without --listen"; }
"$bin" run $(ppo_args "$work/u2") --local 1 > "$work/u2.log" 2>&1
[[ $? -eq 2 ]] && grep -q -- "--local K needs --listen" "$work/u2.log" || { cat "$work/u2.log" >&2; fail "--local without --listen"; }
"$bin" run $(ppo_args "$work/u3") --listen tcp://127.0.0.1:0 --local 5 > "$work/u3.log" 2>&1
[[ $? -eq 1 ]] && grep -q -- "--local: 5 local workers, the run has 4" "$work/u3.log" || { cat "$work/u3.log" >&2; fail "--local above the run's workers"; }
echo "listen: placement by host, refused options: ok"
