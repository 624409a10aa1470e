#!/usr/bin/env bash
# Bad input and interruptions of `fuseflow run`: each stops with a message that names the
# problem (and exit status 1), and leaves no worker process behind:
#   a missing model folder, a missing data file, a misspelled key (with its line and a
#   suggestion), a model a worker cannot load (damaged safetensors), an output folder that
#   holds another run's checkpoints, --resume with nothing to resume;
#   Ctrl-C (SIGINT to the terminal's process group) during a stage: a checkpoint, exit 130,
#   workers gone, and --resume continues from it; a damaged newest checkpoint (weights cut
#   short, state.json garbled): the message names the checkpoint before it and how to resume.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
M=$cache/tiny
cfg=$src/examples/grpo.yaml
base() { # OUT
  echo "$(small_run "$1") data.train_batch_size=4 roles.actor.workers=1 trainer.test_freq=0 graph.train_actor.mini_batch_size=2"
}

# processes still running in a folder (workers inherit the controller's working folder)
left_in() { # DIR
  local n=0 p
  for p in /proc/[0-9]*; do
    [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$1" ]] && n=$((n + 1))
  done
  echo $n
}

expect_fail() { # NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  local d=$work/$name
  mkdir -p "$d"
  local rc=0
  (cd "$d" && "$bin" run "$@" --no-progress > "$d/log" 2>&1) || rc=$?
  [[ $rc == 1 ]] || { cat "$d/log" >&2; fail "$name: exit status $rc, expected 1"; }
  grep -q -- "$pat" "$d/log" || { cat "$d/log" >&2; fail "$name: the message does not mention '$pat'"; }
  sleep 0.2
  [[ $(left_in "$d") == 0 ]] || fail "$name: worker processes were left behind"
}

expect_fail missing_model "roles.actor.model '/no/such/model' has no config.json" "$cfg" $(base "$work/o1") \
  roles.actor.model=/no/such/model roles.ref.model=$M
expect_fail missing_data "data.train_files '/no/such.jsonl' does not exist" "$cfg" $(base "$work/o2") \
  roles.actor.model=$M roles.ref.model=$M data.train_files=/no/such.jsonl
expect_fail wrong_key "did you mean 'graph.train_actor.clip_ratio_high'" "$cfg" $(base "$work/o3") \
  roles.actor.model=$M roles.ref.model=$M graph.train_actor.clip_ratio_hihg=0.3
grep -q "unknown key 'graph.train_actor.clip_ratio_hihg'" "$work/wrong_key/log" || fail "wrong_key: no unknown-key message"

# a reference model whose weights are cut short, in a deep folder (the worker's message is
# longer than the 255 bytes the wire used to carry): its worker cannot load it, and the
# message keeps the file name, the problem and the hint
deep=$work/damaged/$(printf 'level-%02d-of-a-deep-folder/' $(seq 1 12))model
mkdir -p "$(dirname "$deep")"
cp -r "$M" "$deep"
truncate -s 3000 "$deep/model.safetensors"
expect_fail damaged_model "of-a-deep-folder/model/model.safetensors: tensor '" "$cfg" $(base "$work/o4") roles.actor.model=$M \
  roles.ref.model=$deep roles.ref.colocate_with=null roles.ref.workers=1
grep -q "role ref" "$work/damaged_model/log" || fail "damaged_model: the message does not name the role"
grep -q "the data section has only .* bytes (hint: the file is truncated or damaged; copy or download it again)" \
  "$work/damaged_model/log" || fail "damaged_model: the problem or the hint was cut off"

expect_fail resume_nothing "no checkpoint" "$cfg" $(base "$work/o5") roles.actor.model=$M roles.ref.model=$M --resume
# empty and blank data files: which one, what was wrong, what a line looks like
: > "$work/nothing.jsonl"
printf '\n  \n' > "$work/blank.jsonl"
expect_fail empty_train "data.train_files: $work/nothing.jsonl: no examples: the file is empty or holds only blank lines" "$cfg" \
  $(base "$work/o6") roles.actor.model=$M roles.ref.model=$M data.train_files=$work/nothing.jsonl
grep -q '{"prompt": "12+34=", "answer": "46"}' "$work/empty_train/log" || fail "empty_train: no example line"
expect_fail blank_val "data.val_files: $work/blank.jsonl: no examples" "$cfg" $(base "$work/o7") roles.actor.model=$M \
  roles.ref.model=$M data.val_files=$work/blank.jsonl trainer.test_freq=1

# Ctrl-C during a stage: the run is its own process group (as under a terminal) and the
# whole group gets SIGINT; the workers are in groups of their own and stop after the save
d=$work/int
mkdir -p "$d"
(cd "$d" && exec setsid "$bin" run "$cfg" $(base "$d/out") roles.actor.model=$M roles.ref.model=$M trainer.steps=500 \
  --no-progress > "$d/log" 2>&1) &
pid=$!
for _ in $(seq 1 600); do
  [[ -f "$d/out/metrics.jsonl" ]] && [[ $(iterations "$d/out/metrics.jsonl") -ge 1 ]] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.05
done
[[ $(iterations "$d/out/metrics.jsonl") -ge 1 ]] || { cat "$d/log" >&2; fail "the run to interrupt did not start"; }
kill -INT -- -$pid
rc=0
wait $pid || rc=$?
[[ $rc == 130 ]] || { cat "$d/log" >&2; fail "Ctrl-C: exit status $rc, expected 130"; }
grep -q "interrupted .*saved .*checkpoints/step-" "$d/log" || { cat "$d/log" >&2; fail "Ctrl-C: no checkpoint reported"; }
ck=$(ls -d "$d"/out/checkpoints/step-* | tail -1)
[[ -f "$ck/state.json" && -f "$ck/actor/model.safetensors" && -f "$ck/actor.optim.safetensors" ]] || fail "Ctrl-C: incomplete checkpoint $ck"
sleep 0.3
[[ $(left_in "$d") == 0 ]] || fail "Ctrl-C: worker processes were left behind"
done_it=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iteration"])' "$ck/state.json")
# the same config (trainer.steps is part of the schedule), one more iteration with --stop-after
(cd "$d" && "$bin" run "$cfg" $(base "$d/out") roles.actor.model=$M roles.ref.model=$M trainer.steps=500 --resume \
  --stop-after $((done_it + 1)) --no-progress > "$d/log2" 2>&1) || { cat "$d/log2" >&2; fail "--resume after Ctrl-C failed"; }
grep -q "resuming from .*step-0*$done_it" "$d/log2" || fail "--resume did not start from the checkpoint"
[[ $(iterations "$d/out/metrics.jsonl") == $((done_it + 1)) ]] || fail "after --resume, metrics.jsonl has not one line per iteration"

# an output folder with another run's checkpoints
expect_fail not_resumed "pass --resume" "$cfg" $(base "$d/out") roles.actor.model=$M roles.ref.model=$M

# a damaged newest checkpoint: the message names the one before it and how to resume from
# it (not "copy or download it again": there is no other copy); the weights cut short, then
# state.json garbled; following the hint resumes from the one before
r=$work/ck
"$bin" run "$cfg" $(base "$r") roles.actor.model=$M roles.ref.model=$M trainer.steps=3 trainer.save_freq=1 \
  --stop-after 2 --no-progress > "$work/ck.log" 2>&1 || { cat "$work/ck.log" >&2; fail "the run to damage failed"; }
ck2=$r/checkpoints/step-00000002
cp "$ck2/actor/model.safetensors" "$work/ck_weights"
truncate -s 3000 "$ck2/actor/model.safetensors"
expect_fail damaged_ckpt "the one before it is $r/checkpoints/step-00000001" "$cfg" $(base "$r") roles.actor.model=$M \
  roles.ref.model=$M trainer.steps=3 trainer.save_freq=1 --resume
grep -q "mv $ck2 $ck2.damaged" "$work/damaged_ckpt/log" || fail "damaged_ckpt: no way to move it aside"
grep -q "copy or download" "$work/damaged_ckpt/log" && fail "damaged_ckpt: the hint still says to copy or download it"
cp "$work/ck_weights" "$ck2/actor/model.safetensors"
echo '{"iteration": 2, "seed":' > "$ck2/state.json"
expect_fail damaged_state "the one before it is $r/checkpoints/step-00000001" "$cfg" $(base "$r") roles.actor.model=$M \
  roles.ref.model=$M trainer.steps=3 trainer.save_freq=1 --resume
mv "$ck2" "$ck2.damaged"
"$bin" run "$cfg" $(base "$r") roles.actor.model=$M roles.ref.model=$M trainer.steps=3 trainer.save_freq=1 --resume --no-progress \
  > "$work/ck2.log" 2>&1 || { cat "$work/ck2.log" >&2; fail "resuming from the checkpoint before the damaged one failed"; }
grep -q "resuming from .*step-00000001" "$work/ck2.log" || fail "the resume did not start from step-00000001"
[[ $(iterations "$r/metrics.jsonl") == 3 ]] || fail "after resuming from step 1, metrics.jsonl has not 3 iterations"
echo ok
