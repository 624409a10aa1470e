#!/usr/bin/env bash
# `fuseflow run` checks its sizes before anything starts, each with a message naming the key,
# the value and the limit (exit status 1, at once, no worker started, no big allocation; "at
# once" is under 5 s, 15 under the sanitizers: a refusal takes about 0.05 s, and the limit only
# has to tell it from a run that starts work, which the other checks see too, without failing
# on a loaded CI machine):
#   a batch whose samples need more memory than the machine has (it used to grow the
#   controller until the kernel killed it), a batch larger than the training set;
#   response lengths past 32-bit range (3000000000 failed on a worker with an unrelated
#   error, 4294967400 wrapped to 104 and ran), written as 3e9, or past a model's context
#   (the actor's, or another role's);
#   more local workers than the descriptor limit allows.
# And a run at the limits still runs: prompt + response = the context, a batch = the set; a
# generate node's max_tokens longer than data.max_response_length is not cut short.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
M=$cache/tiny # max_position_embeddings 256
cfg=$src/examples/grpo.yaml
base() { # OUT
  echo "$(small_run "$1") data.train_batch_size=4 roles.actor.workers=1 trainer.test_freq=0 graph.train_actor.mini_batch_size=2" \
       "roles.actor.model=$M roles.ref.model=$M trainer.steps=1"
}

# Run; exit status, seconds and the peak resident memory of the process tree (MiB).
measure() { # DIR ARGS...
  local d=$1; shift
  python3 - "$d" "$@" <<'PY'
import resource, subprocess, sys, time
d, args = sys.argv[1], sys.argv[2:]
t = time.time()
with open(d + "/log", "w") as log:
    rc = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, cwd=d).returncode
dt = time.time() - t
mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(rc, "%.2f" % dt, int(mib))
PY
}

# processes still running in a folder (workers inherit the controller's working folder)
left_in() { # DIR
  local n=0 p
  for p in /proc/[0-9]*; do
    [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$1" ]] && n=$((n + 1))
  done
  echo $n
}

limit_s=5
sanitized && limit_s=15 # the sanitizers' start-up
pre=() # a command prefix for the next expect_refusal (a ulimit)
expect_refusal() { # NAME PATTERN ARGS...: `fuseflow run ARGS` exits 1 quickly with PATTERN, nothing started
  local name=$1 pat=$2; shift 2
  local d=$work/$name
  mkdir -p "$d"
  read -r rc secs mib < <(measure "$d" "${pre[@]}" "$bin" run "$@" --no-progress)
  [[ $rc == 1 ]] || { cat "$d/log" >&2; fail "$name: exit status $rc, expected 1"; }
  grep -qF -- "$pat" "$d/log" || { cat "$d/log" >&2; fail "$name: the message does not say '$pat'"; }
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$secs" "$limit_s" ||
    fail "$name: took ${secs}s to refuse (limit ${limit_s}s)"
  ((mib < 500)) || fail "$name: the refusal used ${mib} MiB"
  grep -q "^run: .* workers" "$d/log" && fail "$name: the run started"
  [[ $(left_in "$d") == 0 ]] || fail "$name: processes were left behind"
  echo "$name: refused in ${secs}s, ${mib} MiB"
}

# item 2: memory for the requested batch, then the dataset (2000 training prompts)
expect_refusal batch_1e8 "'data.train_batch_size=100000000': 100000000 prompts x n 8 = 800000000 samples per iteration need about" \
  "$cfg" $(base "$work/o1") data.train_batch_size=100000000
grep -q "more than half of .* (hint: lower data.train_batch_size or n" "$work/batch_1e8/log" || fail "batch_1e8: no limit or hint"
expect_refusal batch_n "1000000 prompts x n 64 = 64000000 samples per iteration need about" "$cfg" $(base "$work/o2") \
  data.train_batch_size=1000000 graph.rollout.n=64
expect_refusal gen_batches "4000000 prompts (data.train_batch_size 4 x trainer.max_gen_batches 1000000: a filter draws more)" \
  "$src/examples/dapo.yaml" $(base "$work/o12") trainer.max_gen_batches=1000000
expect_refusal batch_dataset "data.train_batch_size 2001 is more than the 2000 prompts of $cache/arith/train.jsonl" \
  "$cfg" $(base "$work/o3") data.train_batch_size=2001 graph.train_actor.mini_batch_size=2001 graph.train_actor.micro_batch_size=1

# item 9: 32-bit range, the way it is written, the models' context
expect_refusal resp_3e9_digits "'data.max_response_length' must be in [1, 1073741824], got 3000000000" \
  "$cfg" $(base "$work/o4") data.max_response_length=3000000000
expect_refusal resp_wraps "'data.max_response_length' must be in [1, 1073741824], got 4294967400" \
  "$cfg" $(base "$work/o5") data.max_response_length=4294967400
expect_refusal resp_3e9 "must be an integer, got '3e9' (hint: write the digits: 3000000000)" \
  "$cfg" $(base "$work/o6") data.max_response_length=3e9
expect_refusal resp_context "data.max_prompt_length 16 + data.max_response_length 241 = 257 tokens do not fit the context of roles.actor.model (max_position_embeddings 256 in $M/config.json)" \
  "$cfg" $(base "$work/o7") data.max_response_length=241
expect_refusal max_tokens_context "data.max_prompt_length 16 + graph.rollout.max_tokens 300 = 316 tokens do not fit" \
  "$cfg" $(base "$work/o8") graph.rollout.max_tokens=300
expect_refusal prompt_context "data.max_prompt_length 250 + data.max_response_length 16 = 266 tokens do not fit" \
  "$cfg" $(base "$work/o9") data.max_prompt_length=250 data.max_response_length=16
# a role other than the actor: a reference model with a shorter context
[[ -f "$work/short/config.json" ]] ||
  "$bin" init --preset tiny --out "$work/short" num_hidden_layers=2 hidden_size=64 intermediate_size=128 max_position_embeddings=22 > /dev/null
expect_refusal ref_context "data.max_prompt_length 16 + data.max_response_length 7 = 23 tokens do not fit the context of roles.ref.model (max_position_embeddings 22" \
  "$cfg" $(base "$work/o10") roles.ref.model=$work/short roles.ref.colocate_with=null roles.ref.workers=1 data.max_response_length=7
# the accuracy rule names a reward function that does not exist
expect_refusal acc_reward "trainer.acc_reward: unknown reward function 'nope' (hint: known: arith_exact_match, format, repeat_match" \
  "$cfg" $(base "$work/o11") trainer.acc_reward=nope

# item 12: local workers past the descriptor limit (2 per worker in the controller)
pre=(bash -c 'ulimit -n 80 && exec "$@"' ulimit) # (80 - 64 kept for the controller) / 2 = 8 workers
expect_refusal workers_nofile "the run needs 10 local worker processes; this machine runs at most 8 next to the controller (RLIMIT_NOFILE (ulimit -n) 80" \
  "$cfg" $(base "$work/o11") data.train_batch_size=10 roles.actor.workers=10 graph.train_actor.mini_batch_size=10 \
  graph.train_actor.micro_batch_size=8
pre=()

# at the limits: prompt + response = the context (16 + 6 = 22); a batch of the whole training set
"$bin" dataset arith --digits 2 --train 8 --test 2 --seed 1 --out "$work/eight" > /dev/null
d=$work/edge
mkdir -p "$d"
(cd "$d" && "$bin" run "$cfg" $(base "$d/out") roles.actor.model=$work/short roles.ref.model=$work/short \
  data.train_files=$work/eight/train.jsonl data.train_batch_size=8 --no-progress > "$d/log" 2>&1) ||
  { cat "$d/log" >&2; fail "a run at the limits did not run"; }
grep -q "^iter 1/1" "$d/log" || { cat "$d/log" >&2; fail "edge: no iteration"; }
# a generate node's max_tokens past data.max_response_length sizes the rollout's slots (they
# held prompt + data.max_response_length, and cut these responses at about 18 tokens)
d=$work/long
mkdir -p "$d"
(cd "$d" && "$bin" run "$cfg" $(base "$d/out") graph.rollout.max_tokens=60 --no-progress > "$d/log" 2>&1) ||
  { cat "$d/log" >&2; fail "max_tokens 60 did not run"; }
python3 - "$d/out/metrics.jsonl" <<'PY' || fail "responses were cut short of graph.rollout.max_tokens"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l][-1]
print("mean response length with max_tokens 60:", m["response_length"])
sys.exit(0 if m["response_length"] > 30 else 1)
PY
echo ok
