#!/usr/bin/env bash
# `fuseflow run --listen` across hosts, simulated by three network namespaces joined by a
# bridge in the controller's: the controller (no local workers, CURVE) in one, a worker that
# calls itself hostA in another, one called hostB in the third (`fuseflow worker --host`).
#   - GRPO with the actor at DP 2 (ref colocated), one rank per host, gives the same metrics
#     as the same run on one host; the log places a rank on each host;
#   - a run whose workers never come stops after --expect-timeout naming how many are
#     missing and the command a host must run;
#   - cutting hostB's link mid-run stops the run (it does not hang) with an error naming the
#     lost rank, the last checkpoint left for --resume, and that --resume, on one host,
#     finishes with the uninterrupted run's metrics;
#   - cutting the link of a host that holds only a generation worker (a pool of its own, 2
#     workers: one on hostA beside the actor, one on hostB) does not stop the run: the lost
#     worker's samples are generated again on the other (from their seeds, so the same
#     responses, byte for byte), the sync group goes on without it, and the run ends with the
#     metrics of the same run on one host.
# Skipped (exit 77) where namespaces are not permitted.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
set +e
id=$$
nsc=ffhc$id nsa=ffha$id nsb=ffhb$id br=ffbr$id
subnet=10.$((id % 200 + 20)).$(((id / 200) % 250)).
ctl_ip=${subnet}1 port=$((20000 + id % 20000))
pids=()
hosts_cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    for n in "$nsc" "$nsa" "$nsb"; do ip netns del "$n" 2>/dev/null; done
    cleanup
}
trap hosts_cleanup EXIT
if ! ip netns add "$nsc" 2>/dev/null; then
    echo "SKIPPED: cannot create network namespaces here (needs root and CAP_SYS_ADMIN; CI containers often forbid it)"
    exit 77
fi
if ! ip netns add "$nsa" || ! ip netns add "$nsb" || ! ip -n "$nsc" link add "$br" type bridge; then
    echo "SKIPPED: network namespaces exist but links cannot be made here"
    exit 77
fi
ip -n "$nsc" link set lo up && ip -n "$nsc" addr add "$ctl_ip/24" dev "$br" && ip -n "$nsc" link set "$br" up ||
    fail "setting up the bridge"
k=2
for n in "$nsa" "$nsb"; do # a veth per host: one end on the bridge, the other in the host
    ip -n "$nsc" link add "v$k$id" type veth peer name eth0 netns "$n" && ip -n "$nsc" link set "v$k$id" master "$br" &&
        ip -n "$nsc" link set "v$k$id" up && ip -n "$n" addr add "$subnet$k/24" dev eth0 && ip -n "$n" link set eth0 up &&
        ip -n "$n" link set lo up || fail "setting up the link of $n"
    k=$((k + 1))
done

prepare_inputs
M=$cache/tiny
"$bin" keygen "$work/keys" > /dev/null || fail "keygen"
steps=3
grpo() { # OUT EXTRA...
  local out=$1; shift
  echo "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=0 "$@" data.train_batch_size=4 \
    roles.actor.model=$M roles.ref.model=$M roles.actor.workers=2 graph.train_actor.mini_batch_size=2 --no-progress
}
worker() { # NS HOST PORT: a worker on that host, in the background
  ip netns exec "$1" "$bin" worker --connect "tcp://$ctl_ip:$3" --curve "$work/keys/worker.key" --host "$2" \
    --connect-timeout 60 > "$work/$2-$3.log" 2>&1 &
  pids+=($!)
}

# the reference: the same run on one host
"$bin" run $(grpo "$work/one" trainer.save_freq=0) > "$work/one.log" 2>&1 ||
    { cat "$work/one.log" >&2; fail "the one-host run"; }

# across hosts: the controller waits for both workers; they join over CURVE
p1=$port
ip netns exec "$nsc" "$bin" run $(grpo "$work/two" trainer.save_freq=0) \
  --listen "tcp://$ctl_ip:$p1" --curve "$work/keys/controller.key" --expect-timeout 60 > "$work/two.log" 2>&1 &
ctl=$!
worker "$nsa" hostA $p1
worker "$nsb" hostB $p1
wait $ctl || { cat "$work/two.log" "$work"/host*-$p1.log >&2; fail "the run across hosts"; }
for h in hostA hostB; do
    # its devices: the machine's cores (and its own where its affinity allows fewer), GPUs or none
    dev="\([0-9]* of \)\?$(getconf _NPROCESSORS_ONLN) cores, "
    grep -q "^run: worker joined: rank [01] from $h (cpu; $dev" "$work/two.log" || { cat "$work/two.log" >&2; fail "no join line for $h"; }
    grep -q "^run: host $h: 1 worker; $dev" "$work/two.log" || { cat "$work/two.log" >&2; fail "no devices line for $h"; }
    grep -q "^run: rank [01]: host $h (actor gen ref; actor dp [01] tp 0 pp 0)" "$work/two.log" || { cat "$work/two.log" >&2; fail "no rank placed on $h"; }
done
grep -q "listening on tcp://$ctl_ip:$p1 for 2 workers" "$work/two.log" || fail "no listening line"
# one worker per host: each gets all of this host's cores, not half
grep -q "^run: 2 workers on 2 hosts, $(nproc) threads each (each host's cores over its workers, or a worker's own CPUs where fewer)" "$work/two.log" ||
    { grep threads "$work/two.log" >&2; fail "threads per worker not by host"; }
grep -q "^run: .*: 2 workers (threads: once they join)" "$work/two.log" ||
    { grep "^run: " "$work/two.log" >&2; fail "the first line states a thread count before the hosts are known"; }
# the same samples, so the same rewards; float metrics within the DP tests' 1e-6 + 1e-4 (the fused
# schedule spreads the samples over the replicas by load, which sums them in another order)
same_metrics "$work/two/metrics.jsonl" "$work/one/metrics.jsonl" 1e-6 1e-4 || fail "metrics across hosts differ from one host's"
echo "DP 2 across two hosts: the one-host metrics ($(grep -c '^iter' "$work/two.log") iterations)"

# nobody comes: the error counts the missing and names the command
p2=$((port + 1))
ip netns exec "$nsc" "$bin" run $(grpo "$work/none" trainer.save_freq=0) \
  --listen "tcp://$ctl_ip:$p2" --curve "$work/keys/controller.key" --expect-timeout 1 > "$work/none.log" 2>&1
rc=$?
[[ $rc -eq 1 ]] || { cat "$work/none.log" >&2; fail "a run without its workers exited $rc"; }
grep -q "0 of the run's 2 workers joined within 1 s: 2 missing (start each on its host with \`fuseflow worker --connect tcp://$ctl_ip:$p2 --curve worker.key\`" \
  "$work/none.log" || { cat "$work/none.log" >&2; fail "the timeout does not name the missing workers and the command"; }

# hostB's link cut after a checkpoint: the run stops, naming the lost rank (enough
# iterations that it is still running then: they take milliseconds here)
p3=$((port + 2))
steps=100
# --threads 1 here and in the runs it is compared with: across hosts each worker would take its
# host's 2 cores, and training at cpu:2 rounds otherwise than the one-host runs' cpu:1
ip netns exec "$nsc" "$bin" run $(grpo "$work/cut" trainer.save_freq=5) --threads 1 \
  --listen "tcp://$ctl_ip:$p3" --curve "$work/keys/controller.key" --expect-timeout 60 > "$work/cut.log" 2>&1 &
ctl=$!
worker "$nsa" hostA $p3
worker "$nsb" hostB $p3
for _ in $(seq 2400); do [[ -d "$work/cut/checkpoints/step-00000005" ]] && break; sleep 0.025; done
[[ -d "$work/cut/checkpoints/step-00000005" ]] || { cat "$work/cut.log" >&2; fail "no first checkpoint"; }
# the controller held while the link goes down, so that the cut comes a few iterations after the
# checkpoint however fast they run (it went on for as long as this shell took)
kill -STOP $ctl
ip -n "$nsc" link set v3$id down
kill -CONT $ctl
t0=$(date +%s)
wait $ctl
rc=$?
took=$(($(date +%s) - t0))
[[ $rc -eq 1 ]] || { cat "$work/cut.log" >&2; fail "the cut run exited $rc"; }
[[ $took -le 40 ]] || fail "the cut run took $took s to stop"
bad=$(grep -o "^run: rank [01]: host hostB" "$work/cut.log" | grep -o "[01]")
grep -q "worker $bad\b.*\(dead\|lost\|silent\)\|rank $bad\b.*\(dead\|lost\|silent\)" "$work/cut.log" ||
    { cat "$work/cut.log" >&2; fail "the error does not name the lost rank $bad"; }
grep -q "resume from the checkpoint $work/cut/checkpoints/step-[0-9]*" "$work/cut.log" ||
    { cat "$work/cut.log" >&2; fail "the error does not name the checkpoint to resume from"; }
echo "link cut: stopped in ${took} s: $(grep -o 'fuseflow run: .\{0,160\}' "$work/cut.log" | head -1)"
# resume on one host: the uninterrupted run's metrics
"$bin" run $(grpo "$work/full" trainer.save_freq=5) --threads 1 > "$work/full.log" 2>&1 ||
    { cat "$work/full.log" >&2; fail "the uninterrupted run"; }
"$bin" run $(grpo "$work/cut" trainer.save_freq=5) --threads 1 --resume > "$work/resume.log" 2>&1 ||
    { cat "$work/resume.log" >&2; fail "--resume after the cut"; }
# the iterations up to the cut and 4 past it (the cut comes at about the 10th; the run resumes
# from the last checkpoint, every 5): later ones drift apart beyond the tolerance, as any two
# DP runs whose sums differ in order do. On an AMD EPYC (session 11) training on the CPU
# backend at cpu:1 and at cpu:2 differs from the second step (measured with sft; which kernel
# rounds by the thread count is not traced), and kl (~1e-4, compared at 1e-6) left the
# tolerance at iteration 16 in one run under the sanitizers, when 25 iterations were compared
cut_at=$(grep -c '^iter' "$work/cut.log")
[[ $cut_at -lt 25 ]] || fail "the link was cut at iteration $cut_at, after the iterations compared"
n=$((cut_at + 4))
head -n $n "$work/cut/metrics.jsonl" > "$work/cut25.jsonl"
head -n $n "$work/full/metrics.jsonl" > "$work/full25.jsonl"
same_metrics "$work/cut25.jsonl" "$work/full25.jsonl" 1e-6 1e-4 || fail "the resumed run's metrics differ"
echo "resumed on one host after the cut at iteration $cut_at: the uninterrupted run's metrics"

# a generation-only host lost: its samples go to the live generation worker and the run ends
p4=$((port + 3))
steps=40 # enough that the cut (after the 3rd) comes mid-run even when the machine is loaded
ip -n "$nsc" link set v3$id up || fail "bringing hostB's link back"
pool="roles.actor.rollout.workers=2 trainer.save_freq=0 --dump-samples"
"$bin" run $(grpo "$work/pool1" $pool) roles.actor.workers=1 > "$work/pool1.log" 2>&1 ||
    { cat "$work/pool1.log" >&2; fail "the one-host run with a generation pool"; }
ip netns exec "$nsc" "$bin" run $(grpo "$work/pool" $pool) roles.actor.workers=1 \
  --listen "tcp://$ctl_ip:$p4" --curve "$work/keys/controller.key" --expect-timeout 60 > "$work/pool.log" 2>&1 &
ctl=$!
worker "$nsa" hostA $p4
ip netns exec "$nsa" "$bin" worker --connect "tcp://$ctl_ip:$p4" --curve "$work/keys/worker.key" --host hostA \
  --connect-timeout 60 > "$work/hostA2-$p4.log" 2>&1 &
pids+=($!)
# hosts are placed in the order their first worker joined: hostB's comes last, so the actor
# (the planner's rank 0) is on hostA and hostB holds only a generation worker
for _ in $(seq 600); do grep -q "worker joined: .*2 of 3" "$work/pool.log" 2>/dev/null && break; sleep 0.05; done
worker "$nsb" hostB $p4
for _ in $(seq 600); do [[ $(grep -c '^iter' "$work/pool.log" 2>/dev/null) -ge 3 ]] && break; sleep 0.05; done
grep -q "^run: rank 2: host hostB (gen;" "$work/pool.log" || { cat "$work/pool.log" >&2; fail "the generation worker is not the one on hostB"; }
ip -n "$nsc" link set v3$id down
cut_at=$(grep -c '^iter' "$work/pool.log")
wait $ctl || { cat "$work/pool.log" >&2; fail "the run stopped when a generation-only host was lost"; }
[[ $cut_at -lt $steps ]] || fail "the link was cut after the last iteration ($cut_at)"
grep -q "worker 2\b.*\(dead\|lost\|silent\)\|rank 2\b.*\(dead\|lost\|silent\)" "$work/pool.log" ||
    { cat "$work/pool.log" >&2; fail "the log does not say the generation worker on hostB was lost"; }
[[ $(grep -c '^iter' "$work/pool.log") -eq $steps ]] || { cat "$work/pool.log" >&2; fail "not every iteration ran after the loss"; }
# the same responses byte for byte: the lost worker's groups, generated again on hostA from their
# seeds, round as they would have on hostB (batch invariance; before it a token near a boundary
# of the distribution flipped in one sanitizer run in four and the metrics drifted apart)
same_samples "$work/pool" "$work/pool1" "the run that lost a generation host"
same_metrics "$work/pool/metrics.jsonl" "$work/pool1/metrics.jsonl" 1e-6 1e-4 ||
    fail "the run that lost a generation host does not train as the one-host run"
echo "generation-only host cut at iteration $cut_at: the run went on on hostA, the one-host metrics ($steps iterations)"
