#!/usr/bin/env bash
# scripts/slurm/fuseflow.sbatch under a real single-node Slurm: the test starts its own munged
# (its own key and socket), slurmctld and slurmd (in the foreground, -D, with a slurm.conf, state
# and logs in its temporary folder, ports of its own: nothing global changes), submits the
# script for a short GRPO run with two tasks on the one node, waits for the job (every wait has
# a deadline), and checks that
#   - the job completed and the run wrote every iteration's metrics, with both workers joined
#     from the node (the Slurm node name as their host), each reporting the node's cores and
#     the GPUs of a stand-in CUDA driver (tests/runtime/fake_libcuda.c, two "NVIDIA H200"),
#     and a rank placed on each by its local index (SLURM_LOCALID);
#   - the job's keys (the controller's folder and the node-local worker.key) were removed.
# The daemons are stopped at the end (trap). Skipped (exit 77, naming what failed) without root,
# without the Debian packages (munge, slurmctld, slurmd, slurm-client), or where the daemons
# cannot start.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
set +e
skip() { echo "SKIPPED: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "a Slurm of its own needs root (slurmd launches the job's tasks)"
for b in munged munge mungekey slurmctld slurmd sbatch squeue scontrol sinfo srun sbcast; do
    command -v "$b" > /dev/null || [[ -x /usr/sbin/$b ]] ||
        skip "no $b (apt-get install munge slurmctld slurmd slurm-client; scripts/deps.sh does)"
done
PATH=$PATH:/usr/sbin
[[ -f ${FF_FAKE_LIBCUDA:-} ]] || fail "FF_FAKE_LIBCUDA (the stand-in CUDA driver the build makes) is not set: run through ctest"
sl=$work/slurm
mkdir -p "$sl/state" "$sl/spool" "$work/keys"
chmod 755 "$work" "$sl" # munged wants the socket's folders searchable by all
id=$$
ctld_port=$((30000 + id % 15000 * 2)) slurmd_port=$((30001 + id % 15000 * 2)) ff_port=$((20000 + id % 10000))
node=$(hostname -s)
dpids=()
job=""
slurm_cleanup() {
    [[ -n "$job" ]] && scancel "$job" 2> /dev/null
    for p in "${dpids[@]}"; do kill "$p" 2> /dev/null; done
    for p in "${dpids[@]}"; do # the daemons stop within a second or two on SIGTERM
        for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
        kill -9 "$p" 2> /dev/null
    done
    wait 2> /dev/null
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

# munge: a key and a socket of the test's own
dd if=/dev/urandom of="$sl/munge.key" bs=1024 count=1 status=none && chmod 400 "$sl/munge.key" || fail "making the munge key"
munged -F -S "$sl/munge.sock" --key-file="$sl/munge.key" --log-file="$sl/munged.log" --pid-file="$sl/munged.pid" \
    --seed-file="$sl/munged.seed" > "$sl/munged.out" 2>&1 &
dpids+=($!)
munge_ok() { munge -S "$sl/munge.sock" -n 2> /dev/null | unmunge -S "$sl/munge.sock" > /dev/null 2>&1; }
wait_for 10 munge_ok || { tail "$sl/munged.out" >&2; skip "munged did not start (its log above)"; }

cat > "$sl/slurm.conf" << EOF
ClusterName=ff$id
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sl/munge.sock
StateSaveLocation=$sl/state
SlurmdSpoolDir=$sl/spool
SlurmctldPidFile=$sl/slurmctld.pid
SlurmdPidFile=$sl/slurmd.pid
SlurmctldLogFile=$sl/slurmctld.log
SlurmdLogFile=$sl/slurmd.log
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
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=ff Nodes=ALL Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF=$sl/slurm.conf
(cd "$sl" && exec slurmctld -D -f "$SLURM_CONF" > "$sl/slurmctld.out" 2>&1) &
dpids+=($!)
(cd "$sl" && exec slurmd -D -N "$node" -f "$SLURM_CONF" > "$sl/slurmd.out" 2>&1) &
dpids+=($!)
# the clients retry for long when a daemon does not answer: bound each call
for c in sinfo sbatch scontrol scancel; do eval "$c() { timeout 15 $(type -P $c) \"\$@\"; }"; done
node_idle() { [[ $(sinfo -h -n "$node" -o %t 2> /dev/null) == idle ]]; }
wait_for 30 node_idle || { tail_logs; skip "slurmctld/slurmd did not bring node $node up within 30 s (logs above)"; }
echo "slurm: ff$id up in ${SECONDS} s (node $node, slurmctld port $ctld_port)"

prepare_inputs
M=$cache/tiny
steps=3
state() { scontrol show job "$job" -o 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
done_state() { case $(state) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;; esac; return 1; }
# submit the script with two tasks on the one node and wait for the job: sets $job_done, $st
submit() { # OUT_NAME RUN_ARGS...
    local name=$1; shift
    job=$(FF_BIN=$bin FF_PORT=$ff_port FF_KEY_DIR=$work/keys FF_LIBCUDA=$FF_FAKE_LIBCUDA FAKE_CUDA_GPUS="NVIDIA H200,NVIDIA H200" sbatch --parsable --nodes 1 --ntasks-per-node 2 \
        --time 2 --output "$work/$name.out" --chdir "$work" "$src/scripts/slurm/fuseflow.sbatch" "$@" 2> "$work/sbatch.err")
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

# the actor at DP 2, one rank per task
t0=$SECONDS
submit job "$src/examples/grpo.yaml" $(small_run "$work/out") trainer.steps=$steps trainer.test_freq=0 trainer.save_freq=0 \
    data.train_batch_size=4 roles.actor.model=$M roles.ref.model=$M roles.actor.workers=2 graph.train_actor.mini_batch_size=2
took=$((SECONDS - t0))
[[ $st == COMPLETED ]] || { scontrol show job "$job_done" >&2; tail_logs; fail "job $job_done ended $st"; }
log=$work/job.out
grep -q "^fuseflow: controller on $node:$ff_port, 2 workers on 1 nodes ($node)" "$log" ||
    { cat "$log" >&2; fail "the script's first line does not name the controller and the workers"; }
dev="\([0-9]* of \)\?$(getconf _NPROCESSORS_ONLN) cores, 2 GPUs: 2 x NVIDIA H200"
[[ $(grep -c "^run: worker joined: rank [01] from $node (cpu; $dev)" "$log") -eq 2 ]] ||
    { cat "$log" >&2; fail "not both workers joined from node $node with its devices"; }
grep -q "^run: host $node: 2 workers; $dev$" "$log" || { cat "$log" >&2; fail "no devices line for node $node"; }
for i in 0 1; do # the task of local index i holds the planner's rank i
    grep -q "^run: rank [01]: host $node index $i (actor gen ref; actor dp $i tp 0 pp 0)" "$log" ||
        { cat "$log" >&2; fail "the task of local index $i not placed on $node at actor dp $i"; }
done
[[ $(iterations "$work/out/metrics.jsonl") -eq $steps ]] ||
    { cat "$log" >&2; fail "metrics.jsonl has $(iterations "$work/out/metrics.jsonl") iterations, not $steps"; }
keys_removed "$log" # (the workers joined over CURVE with the node's copy: it was there)
ok=$job_done

# a run the controller refuses (a key no config has): the job fails at once, the workers
# stopped rather than left waiting for a controller (600 s), and the keys removed
t1=$SECONDS
submit bad "$src/examples/grpo.yaml" $(small_run "$work/bad") roles.actor.model=$M roles.ref.model=$M trainer.no_such_key=1
[[ $st == FAILED ]] || { cat "$work/bad.out" >&2; fail "the job of a refused run ended $st, not FAILED"; }
grep -q "no_such_key" "$work/bad.out" || { cat "$work/bad.out" >&2; fail "the refused run's job output does not name the bad key"; }
[[ $((SECONDS - t1)) -le 30 ]] || fail "the job of a refused run took $((SECONDS - t1)) s to end"
keys_removed "$work/bad.out"
echo "job $ok: $steps iterations on 2 Slurm tasks, keys removed, in ${took} s; job $job_done (a refused run) failed in $((SECONDS - t1)) s, keys removed; the test ${SECONDS} s"
