#!/usr/bin/env bash
# Multi-host, simulated: the controller in one network namespace, workers in another, joined
# by a veth pair, over tcp with CURVE keys from `fuseflow keygen`. Two workers with
# worker.key join and run subtasks, then collectives between them; a
# worker without keys cannot join. Skipped (exit 77) where namespaces are not permitted.
set -u
FF_BIN=${FF_BIN:?FF_BIN must point to the fuseflow binary}
id=$$
nsc=ffc$id nsw=ffw$id va=ffva$id vb=ffvb$id
subnet=10.$((id % 200 + 20)).$(((id / 200) % 250)).
ctl_ip=${subnet}1 wk_ip=${subnet}2
port=$((20000 + id % 20000))
tmp=$(mktemp -d /tmp/ff-test-netns-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    ip netns del "$nsc" 2>/dev/null
    ip netns del "$nsw" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! ip netns add "$nsc" 2>/dev/null; then
    echo "SKIPPED: cannot create network namespaces here (needs root and CAP_SYS_ADMIN; CI containers often forbid it)"
    exit 77
fi
if ! ip netns add "$nsw" || ! ip link add "$va" type veth peer name "$vb" ||
    ! ip link set "$va" netns "$nsc" || ! ip link set "$vb" netns "$nsw"; then
    echo "SKIPPED: network namespaces exist but veth links cannot be made here"
    exit 77
fi
ip -n "$nsc" addr add "$ctl_ip/24" dev "$va" && ip -n "$nsw" addr add "$wk_ip/24" dev "$vb" &&
    ip -n "$nsc" link set "$va" up && ip -n "$nsw" link set "$vb" up &&
    ip -n "$nsc" link set lo up && ip -n "$nsw" link set lo up || { echo "FAILED: setting up the link"; exit 1; }

"$FF_BIN" keygen "$tmp/keys" > /dev/null || exit 1
fail=0

# the controller: waits for two remote workers, runs sums, then collectives between them
ip netns exec "$nsc" "$FF_BIN" runtime-demo --workers 0 --remote 2 --wait 30 --listen "tcp://$ctl_ip:$port" \
    --curve "$tmp/keys/controller.key" --tasks 2000 --kind sum --trace "$tmp/t.json" > "$tmp/ctl.out" 2>&1 &
ctl=$!
pids+=($ctl)
# an intruder without keys is refused (the controller is up: it waits for two workers)...
ip netns exec "$nsw" "$FF_BIN" worker --connect "tcp://$ctl_ip:$port" --connect-timeout 20 > "$tmp/bad.out" 2>&1
rc=$?
if [[ $rc -ne 1 ]] || ! grep -q -- "pass --curve worker.key" "$tmp/bad.out"; then
    echo "FAILED: a worker without keys was not refused (exit $rc)"; cat "$tmp/bad.out"; fail=1
fi
# ...then the two real workers join (they share the worker namespace; their cpu collectives
# listen on its veth address)
for i in 0 1; do
    ip netns exec "$nsw" "$FF_BIN" worker --connect "tcp://$ctl_ip:$port" --curve "$tmp/keys/worker.key" \
        --device "cpu:$i" > "$tmp/w$i.out" 2>&1 &
    pids+=($!)
done
wait "$ctl"
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAILED: controller exit $rc"; cat "$tmp/ctl.out"; fail=1; fi
grep -q "2000 sum subtasks" "$tmp/ctl.out" || { echo "FAILED: no subtasks ran"; cat "$tmp/ctl.out"; fail=1; }
[[ $(grep -c "remote" "$tmp/ctl.out") -eq 2 ]] || { echo "FAILED: expected two remote workers"; cat "$tmp/ctl.out"; fail=1; }
for i in 0 1; do
    wait "${pids[$((i + 1))]}" || { echo "FAILED: worker $i exit $?"; cat "$tmp/w$i.out"; fail=1; }
done
"$FF_BIN" trace summary "$tmp/t.json" > "$tmp/sum.out" || { echo "FAILED: summary"; fail=1; }

# collectives between the two remote workers, across the namespaces
port2=$((port + 1))
ip netns exec "$nsc" "$FF_BIN" runtime-demo --workers 0 --remote 2 --wait 30 --listen "tcp://$ctl_ip:$port2" \
    --curve "$tmp/keys/controller.key" --tasks 50 --kind collective --mode split > "$tmp/ctl2.out" 2>&1 &
ctl=$!
pids=($ctl)
for i in 0 1; do
    ip netns exec "$nsw" "$FF_BIN" worker --connect "tcp://$ctl_ip:$port2" --curve "$tmp/keys/worker.key" \
        > "$tmp/v$i.out" 2>&1 &
    pids+=($!)
done
wait "$ctl" || { echo "FAILED: collectives across namespaces"; cat "$tmp/ctl2.out" "$tmp"/v*.out; fail=1; }
grep -q "50 collective subtasks" "$tmp/ctl2.out" || { echo "FAILED: collectives output"; cat "$tmp/ctl2.out"; fail=1; }
for p in "${pids[@]:1}"; do wait "$p" || fail=1; done
[[ $fail -eq 0 ]] && echo "multi-host over veth with CURVE: ok ($(grep 'subtasks/s' "$tmp/ctl.out"))"
exit $fail
