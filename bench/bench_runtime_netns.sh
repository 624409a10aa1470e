#!/usr/bin/env bash
# The runtime between two "hosts": two network namespaces joined by a veth pair (as
# tests/exec/test_run_hosts.sh makes them), beside the same on one host.
#   1. bench_runtime's round trip and throughput over ipc (one host), then over tcp across the
#      veth (the controller and the plain ZeroMQ router in one namespace, the workers and the
#      echo in the other), plain and with CURVE;
#   2. a PPO run on a small model (the actor and critic at DP 2): on one host, and with one
#      worker in each namespace (the controller beside the first), seconds per iteration.
# Needs root (namespaces). Usage: bench/bench_runtime_netns.sh [BUILD_DIR] (default build).
# The numbers depend on the machine and its load; docs/run.md "Across hosts" has a set.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
bench=$build/bench_runtime ff=$build/fuseflow
[[ -x $bench && -x $ff ]] || { echo "no $bench or $ff: build first" >&2; exit 1; }
id=$$
na=ffba$id nb=ffbb$id
net=10.$((id % 200 + 20)).$(((id / 200) % 250))
a=$net.1 b=$net.2 port=$((21000 + id % 20000))
work=$(mktemp -d /tmp/ff_bench_netns.XXXXXX)
pids=()
finish() {
    for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
    wait 2> /dev/null || true
    ip netns del "$na" 2> /dev/null || true
    ip netns del "$nb" 2> /dev/null || true
    rm -rf "$work"
}
trap finish EXIT
ip netns add "$na" && ip netns add "$nb" || { echo "cannot make network namespaces (needs root)" >&2; exit 1; }
ip -n "$na" link add eth0 type veth peer name eth0 netns "$nb"
ip -n "$na" addr add "$a/24" dev eth0 && ip -n "$nb" addr add "$b/24" dev eth0
for n in "$na" "$nb"; do ip -n "$n" link set lo up && ip -n "$n" link set eth0 up; done
"$ff" keygen "$work/keys" > /dev/null

echo "== one host (ipc)"
ip netns exec "$na" "$bench" --quick | grep -v '^ *16 workers  sum'

remote=4
across() { # LABEL [--curve]
    local label=$1 ckey=() wkey=()
    [[ ${2:-} == --curve ]] && ckey=(--curve "$work/keys/controller.key") wkey=(--curve "$work/keys/worker.key")
    echo "== two hosts, $label"
    ip netns exec "$na" "$bench" --quick --listen "tcp://$a:$port" --plain "tcp://$a:$((port + 1))" --remote $remote "${ckey[@]}" &
    local ctl=$!
    ip netns exec "$nb" "$bench" zmq-echo "tcp://$a:$((port + 1))" &
    pids+=($!)
    for _ in $(seq $remote); do
        ip netns exec "$nb" "$bench" worker --connect "tcp://$a:$port" --connect-timeout 30 "${wkey[@]}" &
        pids+=($!)
    done
    wait $ctl
    port=$((port + 2))
}
across "tcp over a veth pair"
across "tcp with CURVE over a veth pair" --curve

echo "== PPO, actor and critic at DP 2: one host, then one worker on each"
"$ff" init --preset tiny --out "$work/model" num_hidden_layers=4 hidden_size=256 intermediate_size=688 > /dev/null
"$ff" dataset arith --digits 2 --train 2000 --test 200 --seed 1 --out "$work/data" > /dev/null
M=$work/model steps=8
ppo() { # OUT
    echo "$src/examples/ppo.yaml" trainer.out_dir=$1 data.train_files=$work/data/train.jsonl data.val_files=$work/data/test.jsonl \
        data.max_prompt_length=16 data.max_response_length=6 trainer.steps=$steps trainer.test_freq=0 trainer.save_freq=0 \
        data.train_batch_size=16 roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M --workers 2 --threads 1 --no-progress
}
# the median of time.iteration over the iterations after the first (warm-up)
per_iter() {
    python3 -c '
import json, sys, statistics
t = [o["time"]["iteration"] for o in map(json.loads, open(sys.argv[1])) if o.get("iteration", 0) > 1 and "time" in o]
print(f"{statistics.median(t):.3f} s per iteration (median of {len(t)}, after the first)")' "$1"
}
ip netns exec "$na" "$ff" run $(ppo "$work/one") > "$work/one.log" 2>&1 || { cat "$work/one.log" >&2; exit 1; }
echo "  one host:  $(per_iter "$work/one/metrics.jsonl")"
ip netns exec "$na" "$ff" run $(ppo "$work/two") --listen "tcp://$a:$port" --curve "$work/keys/controller.key" --local 1 \
    --expect-timeout 60 > "$work/two.log" 2>&1 &
ctl=$!
ip netns exec "$nb" "$ff" worker --connect "tcp://$a:$port" --curve "$work/keys/worker.key" --host hostB --connect-timeout 60 \
    > "$work/w.log" 2>&1 &
pids+=($!)
wait $ctl || { cat "$work/two.log" >&2; exit 1; }
echo "  two hosts: $(per_iter "$work/two/metrics.jsonl") (tcp with CURVE; --threads 1 in both)"
grep "threads each" "$work/one.log" "$work/two.log" | sed 's/^/  /' || true
