#!/usr/bin/env bash
# scripts/slurm/fuseflow.sbatch under a real Slurm that the test starts itself: its own munged
# (its own key and socket), slurmctld and slurmd (in the foreground, -D, with a slurm.conf, state
# and logs in its temporary folder, ports of its own: nothing global changes). Every wait has a
# deadline; the daemons are stopped at the end (trap).
#   1. One node, two tasks: GRPO with the actor at DP 2 completes and writes every iteration's
#      metrics; both workers join from the node (the Slurm node name as their host), each
#      reporting the node's cores and the GPUs of a stand-in CUDA driver
#      (tests/runtime/fake_libcuda.c, two "NVIDIA H200"), and each is placed by its local
#      index (SLURM_LOCALID); the job's keys (the controller's folder and the node's
#      worker.key) are removed. A run the controller refuses fails its job within seconds,
#      the workers stopped and the keys removed.
#   2. Two nodes, each a network namespace with an slurmd of its own (slurmctld in a third,
#      joined by a bridge, as tests/exec/test_run_hosts.sh makes them): the same run with one
#      task per node, the controller on the first node, gives the one-node run's metrics; one
#      worker joins from each node, the ranks are placed one per node and the actor's DP group
#      is rail-aligned. Skipped alone (the first part still counts) where namespaces are not
#      permitted.
# Skipped (exit 77, naming what failed) without root, without the Debian packages (munge,
# slurmctld, slurmd, slurm-client), or where the daemons cannot start.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
set +e
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "a Slurm of its own needs root (slurmd launches the job's tasks)"
for b in munged munge slurmctld slurmd sbatch scontrol scancel sinfo srun sbcast nsenter; do
    command -v "$b" > /dev/null || [[ -x /usr/sbin/$b ]] ||
        skip "no $b (apt-get install munge slurmctld slurmd slurm-client; scripts/deps.sh does)"
done
PATH=$PATH:/usr/sbin
[[ -f ${FF_FAKE_LIBCUDA:-} ]] || fail "FF_FAKE_LIBCUDA (the stand-in CUDA driver the build makes) is not set: run through ctest"
sl=$work/slurm
mkdir -p "$sl" "$work/keys"
chmod 755 "$work" "$sl" # munged wants the socket's folders searchable by all
id=$$
# ports below the kernel's ephemeral range (32768 up), where another process's connection may
# hold any port, and none that a socket on this machine uses now
port_free() { [[ -z $(ss -Htan "( sport = :$1 )" 2> /dev/null) ]]; }
p=$((10000 + id % 4000 * 2))
for _ in $(seq 100); do
    port_free $p && port_free $((p + 1)) && port_free $((p + 8000)) && break
    p=$((10000 + (p - 10000 + 2) % 8000))
done
ctld_port=$p slurmd_port=$((p + 1)) ff_port=$((p + 8000))
nsc=ffsc$id nsa=ffsa$id nsb=ffsb$id br=ffsbr$id
subnet=10.$((id % 200 + 20)).$(((id / 200) % 250)).
node=$(hostname -s)
dpids=() nss=()
job="" client_ns=""
slurm_cleanup() {
    [[ -n "$job" ]] && scancel "$job" 2> /dev/null
    for p in "${dpids[@]}"; do kill "$p" 2> /dev/null; done
    for p in "${dpids[@]}"; do # the daemons stop within a second or two on SIGTERM
        for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
        kill -9 "$p" 2> /dev/null
    done
    # what the daemons started and left (a job's slurmstepd, its script, an srun): every such
    # process carries this test's SLURM_CONF, which this shell drops first
    unset SLURM_CONF
    local left
    left=$(grep -lsz "^SLURM_CONF=$sl/" /proc/[0-9]*/environ | cut -d/ -f3)
    for p in $left; do kill -9 "$p" 2> /dev/null; done
    wait 2> /dev/null
    for n in "${nss[@]}"; do ip netns del "$n" 2> /dev/null; done
    cleanup
}
trap slurm_cleanup EXIT
tail_logs() { for f in "$sl"/*.log "$sl"/*.out "$work"/*.out; do [[ -f $f ]] && { echo "== $f"; tail -n 30 "$f"; }; done >&2; }
# until COMMAND succeeds, at most S seconds
wait_for() { # S COMMAND...
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do
        [[ $SECONDS -lt $deadline ]] || return 1
        sleep 0.2
    done
}
# the clients retry for long when a daemon does not answer: bound each call; they run in the
# namespace of the cluster's slurmctld, if it has one
for c in sinfo sbatch scontrol scancel; do
    eval "$c() { timeout 15 \${client_ns:+ip netns exec \$client_ns} $(type -P $c) \"\$@\"; }"
done
# a daemon in the background, in namespace NS if given (nsenter: only the network, so that
# slurmd still sees /sys/fs/cgroup, which `ip netns exec` remounts away)
daemon() { # LOG NS COMMAND...
    local log=$1 ns=$2; shift 2
    (cd "$sl" && exec ${ns:+nsenter --net=/run/netns/$ns} "$@" > "$log" 2>&1) &
    dpids+=($!)
}

# munge: a key and a socket of the test's own, for both clusters
dd if=/dev/urandom of="$sl/munge.key" bs=1024 count=1 status=none && chmod 400 "$sl/munge.key" || fail "making the munge key"
daemon "$sl/munged.out" "" munged -F -S "$sl/munge.sock" --key-file="$sl/munge.key" --log-file="$sl/munged.log" \
    --pid-file="$sl/munged.pid" --seed-file="$sl/munged.seed"
munge_ok() { munge -S "$sl/munge.sock" -n 2> /dev/null | unmunge -S "$sl/munge.sock" > /dev/null 2>&1; }
wait_for 10 munge_ok || { tail "$sl/munged.out" >&2; skip "munged did not start (its log above)"; }

# a cluster: slurm.conf, slurmctld (in CTLD_NS if given) and one slurmd per node, each in its
# namespace; waits until every node is idle (else skips, naming the cluster)
start_cluster() { # NAME CTLD_ADDR CTLD_NS NODE:ADDR:NS...
    local name=$1 addr=$2 ns=$3; shift 3
    local d=$sl/$name
    mkdir -p "$d/state"
    cat > "$d/slurm.conf" << EOF
ClusterName=$name
SlurmctldHost=$node($addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sl/munge.sock
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool-%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$sl/$name-slurmctld.log
SlurmdLogFile=$sl/$name-slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
EOF
    local n nodes=()
    for n in "$@"; do
        IFS=: read -r nn na nns <<< "$n"
        echo "NodeName=$nn NodeAddr=$na CPUs=$(($# == 1 ? 2 : 1)) State=UNKNOWN" >> "$d/slurm.conf" # 2 tasks on one node, 1 on each of two
        nodes+=("$nn")
    done
    echo "PartitionName=ff Nodes=ALL Default=YES MaxTime=10 State=UP" >> "$d/slurm.conf"
    export SLURM_CONF=$d/slurm.conf
    client_ns=$ns
    daemon "$sl/$name-slurmctld.out" "$ns" slurmctld -D -f "$SLURM_CONF"
    for n in "$@"; do
        IFS=: read -r nn na nns <<< "$n"
        mkdir -p "$d/spool-$nn"
        daemon "$sl/$name-slurmd-$nn.out" "$nns" slurmd -D -N "$nn" -f "$SLURM_CONF"
    done
    all_idle() { [[ $(sinfo -h -o %t 2> /dev/null | sort -u | tr -d '\n') == idle ]]; }
    wait_for 30 all_idle || { tail_logs; skip "cluster $name: slurmctld/slurmd did not bring nodes ${nodes[*]} up within 30 s (logs above)"; }
    echo "slurm: cluster $name up at ${SECONDS} s (nodes ${nodes[*]})"
}

prepare_inputs
M=$cache/tiny
steps=3
grpo_args=("$src/examples/grpo.yaml" trainer.steps=$steps trainer.test_freq=0 trainer.save_freq=0 data.train_batch_size=4
    roles.actor.model=$M roles.ref.model=$M roles.actor.workers=2 graph.train_actor.mini_batch_size=2)
state() { scontrol show job "$job" -o 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
done_state() { case $(state) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;; esac; return 1; }
# submit the script and wait for the job: sets $job_done, $st
submit() { # OUT_NAME NODES TASKS_PER_NODE RUN_ARGS...
    local name=$1 nodes=$2 per=$3; shift 3
    job=$(FF_BIN=$bin FF_PORT=$ff_port FF_KEY_DIR=$work/keys FF_LIBCUDA=$FF_FAKE_LIBCUDA FAKE_CUDA_GPUS="NVIDIA H200,NVIDIA H200" \
        sbatch --parsable --nodes "$nodes" --ntasks-per-node "$per" --time 2 --output "$work/$name.out" --chdir "$work" \
        "$src/scripts/slurm/fuseflow.sbatch" "$@" 2> "$work/sbatch.err")
    [[ -n "$job" ]] || { cat "$work/sbatch.err" >&2; tail_logs; fail "sbatch refused the script"; }
    job=${job%%;*}
    wait_for 150 done_state || { scontrol show job "$job" >&2; tail_logs; fail "job $job not done within 150 s (state $(state))"; }
    st=$(state) job_done=$job job="" # nothing to cancel at the end
}
# the job's keys, where the script says it made them: the controller's folder (under
# FF_KEY_DIR) and each node's worker.key, both gone
keys_removed() { # LOG
    local keyline key_dir node_key
    keyline=$(grep -m1 "^fuseflow: keys in " "$1")
    key_dir=$(sed -n 's/^fuseflow: keys in \([^,]*\),.*/\1/p' <<< "$keyline")
    node_key=$(sed -n 's/.*worker.key at \([^ ]*\) on each node.*/\1/p' <<< "$keyline")
    [[ $key_dir == "$work/keys/"* && -n $node_key ]] || { cat "$1" >&2; fail "the script does not say where the job's keys are"; }
    [[ ! -e $key_dir && -z $(ls -A "$work/keys") ]] || fail "the job's key folder is left: $key_dir"
    [[ ! -e $node_key ]] || fail "the node's worker.key is left: $node_key"
}
dev="\([0-9]* of \)\?$(getconf _NPROCESSORS_ONLN) cores, 2 GPUs: 2 x NVIDIA H200"

# 1. one node, two tasks: the actor at DP 2, one rank per task
start_cluster ff$id 127.0.0.1 "" "$node:127.0.0.1:"
t0=$SECONDS
submit one 1 2 "${grpo_args[@]}" $(small_run "$work/one")
took=$((SECONDS - t0))
[[ $st == COMPLETED ]] || { scontrol show job "$job_done" >&2; tail_logs; fail "job $job_done ended $st"; }
log=$work/one.out
grep -q "^fuseflow: controller on $node:$ff_port (127.0.0.1), 2 workers on 1 nodes ($node)" "$log" ||
    { cat "$log" >&2; fail "the script's first line does not name the controller and the workers"; }
[[ $(grep -c "^run: worker joined: rank [01] from $node (cpu; $dev)" "$log") -eq 2 ]] ||
    { cat "$log" >&2; fail "not both workers joined from node $node with its devices"; }
grep -q "^run: host $node: 2 workers; $dev$" "$log" || { cat "$log" >&2; fail "no devices line for node $node"; }
for i in 0 1; do # the task of local index i holds the planner's rank i
    grep -q "^run: rank [01]: host $node index $i (actor gen ref; actor dp $i tp 0 pp 0)" "$log" ||
        { cat "$log" >&2; fail "the task of local index $i not placed on $node at actor dp $i"; }
done
[[ $(iterations "$work/one/metrics.jsonl") -eq $steps ]] ||
    { cat "$log" >&2; fail "metrics.jsonl has $(iterations "$work/one/metrics.jsonl") iterations, not $steps"; }
keys_removed "$log" # (the workers joined over CURVE with the node's copy: it was there)
echo "job $job_done: $steps iterations on 2 Slurm tasks of one node, keys removed, in ${took} s"

# a run the controller refuses (a key no config has): the job fails within seconds, the workers
# stopped rather than left waiting for a controller (600 s), and the keys removed (about 3 s;
# 15 when the workers' srun, still launching its step, ignores SIGTERM and the script's
# SIGKILL 10 s later ends it)
t1=$SECONDS
submit bad 1 2 "$src/examples/grpo.yaml" $(small_run "$work/bad") roles.actor.model=$M roles.ref.model=$M trainer.no_such_key=1
[[ $st == FAILED ]] || { cat "$work/bad.out" >&2; fail "the job of a refused run ended $st, not FAILED"; }
grep -q "no_such_key" "$work/bad.out" || { cat "$work/bad.out" >&2; fail "the refused run's job output does not name the bad key"; }
[[ $((SECONDS - t1)) -le 45 ]] || fail "the job of a refused run took $((SECONDS - t1)) s to end"
keys_removed "$work/bad.out"
echo "job $job_done (a refused run): failed in $((SECONDS - t1)) s, keys removed"

# 2. two nodes in namespaces on a bridge (slurmctld's namespace holds it)
if ! ip netns add "$nsc" 2> /dev/null; then
    echo "two nodes: not run (cannot create network namespaces here); the test took ${SECONDS} s"
    exit 0
fi
nss+=("$nsc")
ip netns add "$nsa" && nss+=("$nsa") && ip netns add "$nsb" && nss+=("$nsb") && ip -n "$nsc" link add "$br" type bridge &&
    ip -n "$nsc" link set lo up && ip -n "$nsc" addr add "${subnet}1/24" dev "$br" && ip -n "$nsc" link set "$br" up ||
    fail "setting up the bridge"
k=2
for n in "$nsa" "$nsb"; do
    ip -n "$nsc" link add "v$k$id" type veth peer name eth0 netns "$n" && ip -n "$nsc" link set "v$k$id" master "$br" &&
        ip -n "$nsc" link set "v$k$id" up && ip -n "$n" addr add "$subnet$k/24" dev eth0 && ip -n "$n" link set eth0 up &&
        ip -n "$n" link set lo up || fail "setting up the link of $n"
    k=$((k + 1))
done
start_cluster ffn$id "${subnet}1" "$nsc" "ffa:${subnet}2:$nsa" "ffb:${subnet}3:$nsb"
t2=$SECONDS
submit two 2 1 "${grpo_args[@]}" $(small_run "$work/two")
[[ $st == COMPLETED ]] || { scontrol show job "$job_done" >&2; tail_logs; fail "the two-node job $job_done ended $st"; }
log=$work/two.out
grep -q "^fuseflow: controller on ffa:$ff_port (${subnet}2), 2 workers on 2 nodes (ffa,ffb)" "$log" ||
    { cat "$log" >&2; fail "the two-node job's first line does not name the controller at ffa's address"; }
for h in ffa ffb; do
    grep -q "^run: worker joined: rank [01] from $h (cpu; $dev)" "$log" || { cat "$log" >&2; fail "no worker joined from $h"; }
    grep -q "^run: rank [01]: host $h index 0 (actor gen ref; actor dp [01] tp 0 pp 0)" "$log" ||
        { cat "$log" >&2; fail "no rank placed on $h"; }
done
grep -q "^run: 2 workers on 2 hosts" "$log" && grep -q "^run: the actor's DP groups are rail-aligned" "$log" ||
    { cat "$log" >&2; fail "the two-node placement is not one rank per node, rail-aligned"; }
# the same samples; float metrics within the DP tests' 1e-6 + 1e-4 (test_run_hosts.sh: why)
same_metrics "$work/two/metrics.jsonl" "$work/one/metrics.jsonl" 1e-6 1e-4 || fail "two nodes' metrics differ from one node's"
keys_removed "$log"
echo "job $job_done: the one-node metrics on two nodes (network namespaces), keys removed, in $((SECONDS - t2)) s; the test ${SECONDS} s"
