#!/usr/bin/env bash
# Nothing `fuseflow run` writes is lost, and nothing it left behind stays:
#   1. an output folder (or a file in it) that cannot be written stops the run before any
#      iteration (trainer.save_freq: 0, so a late failure would lose every iteration); a
#      disk that fills up during the run stops it at the first metrics line it cannot write;
#   6. staging folders and temporary files of dead runs in the output folder, and the
#      controller sockets of killed runs, are removed (and logged) by the next run, while a
#      live process's are kept;
#  10. --trace to a path that cannot be written is refused at the start, and a timeline lost
#      at the end is an error naming the path;
#  11. --resume with a config that changes the run (an override changed or missing, another
#      trainer.steps) is refused with the differences listed; harmless keys pass and are
#      recorded; --resume-with-changes continues and records the change; OUT/config.yaml stays
#      the original and each checkpoint records its own config.
# The read-only and full filesystem cases need `mount -t tmpfs` (root in a container that
# allows it); without it they are skipped and said so.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
M=$cache/tiny
cfg=$src/examples/grpo.yaml
export TMPDIR=$work/tmp # the controllers' sockets: this test's own
mkdir -p "$TMPDIR"
base() { # OUT
  echo "$(small_run "$1") data.train_batch_size=4 roles.actor.workers=1 trainer.test_freq=0 graph.train_actor.mini_batch_size=2" \
       "roles.actor.model=$M roles.ref.model=$M trainer.save_freq=0 trainer.steps=2"
}
run_ff() { "$bin" run "$cfg" "$@" --no-progress; }
iters_in() { [[ -f "$1" ]] && iterations "$1" || echo 0; }
# until FILE holds N iterations (120 s: a loaded, sanitized CI machine is slow to start a run; 8 s
# fell through to the fault injected next, with another message), else fail
wait_iters() { # FILE N WHAT
  for _ in $(seq 1 6000); do [[ $(iters_in "$1") -ge $2 ]] && return 0; sleep 0.02; done
  fail "$3: the run did not reach iteration $2 in 120 s"
}

# refused NAME PATTERN ARGS...: exit 1, the message matches, and no iteration ran
refused() {
  local name=$1 pat=$2; shift 2
  local rc=0
  run_ff "$@" > "$work/$name.log" 2>&1 || rc=$?
  [[ $rc == 1 ]] || { cat "$work/$name.log" >&2; fail "$name: exit status $rc, expected 1"; }
  grep -q -- "$pat" "$work/$name.log" || { cat "$work/$name.log" >&2; fail "$name: the message does not mention '$pat'"; }
  ! grep -q "^iter " "$work/$name.log" || { cat "$work/$name.log" >&2; fail "$name: iterations ran before the failure"; }
  echo "ok: $name"
}

can_mount=0
mkdir -p "$work/mnt_probe"
if mount -t tmpfs -o size=64k tmpfs "$work/mnt_probe" 2>/dev/null; then umount "$work/mnt_probe"; can_mount=1; fi
mounts=()
cleanup_mounts() { for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done; cleanup; }
trap cleanup_mounts EXIT

# ---- 1. the output folder ------------------------------------------------------------------
touch "$work/file"
refused out_under_a_file "$work/file/out" $(base "$work/file/out")
mkdir -p "$work/o1/metrics.jsonl"
refused metrics_is_a_folder "o1/metrics.jsonl: .* but it is a folder" $(base "$work/o1")
mkdir -p "$work/o2/config.yaml"
refused config_is_a_folder "o2/config.yaml: .* but it is a folder" $(base "$work/o2")
mkdir -p "$work/o3" && touch "$work/o3/checkpoints"
refused checkpoints_is_a_file "o3/checkpoints: .* but it is a file" $(base "$work/o3")
mkdir -p "$work/o4" && ln -s /dev/full "$work/o4/metrics.jsonl"
refused metrics_is_a_device "o4/metrics.jsonl: .* neither a file nor a folder" $(base "$work/o4")
mkdir -p "$work/o5/samples.jsonl"
refused samples_is_a_folder "o5/samples.jsonl" $(base "$work/o5") --dump-samples
if ((can_mount)); then
  mkdir -p "$work/ro" && mount -t tmpfs -o ro,size=1m tmpfs "$work/ro" && mounts+=("$work/ro")
  refused out_read_only "Read-only file system" $(base "$work/ro")
  refused out_below_read_only "Read-only file system" $(base "$work/ro/sub")
  # a disk that fills up while the run goes: it stops at the first line it cannot write
  mkdir -p "$work/full" && mount -t tmpfs -o size=256k tmpfs "$work/full" && mounts+=("$work/full")
  rc=0
  (run_ff $(base "$work/full/out") trainer.steps=400 > "$work/full.log" 2>&1) &
  pid=$!
  wait_iters "$work/full/out/metrics.jsonl" 1 "disk full"
  dd if=/dev/zero of="$work/full/fill" bs=4k count=128 2>/dev/null || true
  wait $pid || rc=$?
  [[ $rc == 1 ]] || { cat "$work/full.log" >&2; fail "disk full: exit status $rc, expected 1"; }
  grep -q "metrics.jsonl: cannot append: No space left on device" "$work/full.log" || { cat "$work/full.log" >&2; fail "disk full: no message naming metrics.jsonl"; }
  grep -q "no checkpoint was saved" "$work/full.log" || { cat "$work/full.log" >&2; fail "disk full: the message does not say what can be resumed"; }
  n=$(iters_in "$work/full/out/metrics.jsonl")
  (( n < 400 )) || fail "disk full: the run went on to the end"
  python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$work/full/out/metrics.jsonl" || fail "disk full: a partial metrics line was left"
  echo "ok: disk full mid-run stops after $n iterations, naming metrics.jsonl"
else
  echo "skipped: the read-only and full filesystem cases (mount -t tmpfs is not allowed here)"
fi

# ---- 10. the timeline ----------------------------------------------------------------------
refused trace_under_a_file "file/t.json: cannot be written: Not a directory" $(base "$work/t1") --trace "$work/file/t.json"
mkdir -p "$work/tdir"
refused trace_is_a_folder "tdir: is a folder" $(base "$work/t2") --trace "$work/tdir"
if ((can_mount)); then
  refused trace_read_only "ro/t.json: cannot be written: Read-only file system" $(base "$work/t3") --trace "$work/ro/t.json"
fi
# the folder of the timeline disappears during the run: the run trains, the timeline is lost
mkdir -p "$work/tgone"
rc=0
(run_ff $(base "$work/t4") trainer.steps=60 --trace "$work/tgone/t.json" > "$work/tgone.log" 2>&1) &
pid=$!
wait_iters "$work/t4/metrics.jsonl" 1 "lost timeline"
rm -rf "$work/tgone"
wait $pid || rc=$?
[[ $rc == 1 ]] || { cat "$work/tgone.log" >&2; fail "lost timeline: exit status $rc, expected 1"; }
grep -q -- "--trace $work/tgone/t.json: the timeline was not written" "$work/tgone.log" || { cat "$work/tgone.log" >&2; fail "lost timeline: no message naming the path"; }
! grep -q "timeline written" "$work/tgone.log" || fail "lost timeline: it says it wrote it"
echo "ok: a timeline lost at the end is an error naming its path"

# ---- 6. leftovers ----------------------------------------------------------------------------
sleep 0 & dead=$!
wait $dead
mkdir -p "$work/l/checkpoints/step-00000003.tmp-$dead/actor" "$work/l/checkpoints/step-00000004.tmp-$$"
head -c 100000 /dev/zero > "$work/l/checkpoints/step-00000003.tmp-$dead/actor/model.safetensors"
echo '{"iteration": 1}' > "$work/l/metrics.jsonl.tmp.$dead"
mkdir -p "$work/l/checkpoints/step-00000002.old-$dead"
run_ff $(base "$work/l") > "$work/l.log" 2>&1 || { cat "$work/l.log" >&2; fail "leftovers: the run failed"; }
for p in "checkpoints/step-00000003.tmp-$dead" "metrics.jsonl.tmp.$dead" "checkpoints/step-00000002.old-$dead"; do
  [[ ! -e "$work/l/$p" ]] || fail "leftovers: $p of dead process $dead is still there"
  grep -q "removed $work/l/$p, left by process $dead, which is gone" "$work/l.log" || { cat "$work/l.log" >&2; fail "leftovers: the removal of $p is not logged"; }
done
[[ -d "$work/l/checkpoints/step-00000004.tmp-$$" ]] || fail "leftovers: the staging folder of a live process was removed"
echo "ok: a dead run's staging folders and temporary files are removed (logged); a live one's stay"

# a run killed (SIGKILL) mid-run leaves its socket; the next run removes it
d=$work/k
mkdir -p "$d"
(cd "$d" && exec "$bin" run "$cfg" $(base "$d/out") trainer.steps=5000 trainer.save_freq=1 --no-progress > "$d/log" 2>&1) &
pid=$!
wait_iters "$d/out/metrics.jsonl" 2 "killed run"
kill -KILL $pid
wait $pid 2>/dev/null || true
for p in /proc/[0-9]*; do [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$d" ]] && kill -KILL "${p#/proc/}" 2>/dev/null; done
sock=$(ls "$TMPDIR"/fuseflow-$pid-*.sock 2>/dev/null | head -1)
[[ -S "$sock" ]] || fail "killed run: no socket of process $pid in $TMPDIR to clean up ($(ls "$TMPDIR"))"
# and a socket whose process lives: kept
python3 -c '
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(os.path.join(sys.argv[1], "fuseflow-%d-0.sock" % os.getpid())); s.listen(1)
print(os.getpid(), flush=True); time.sleep(60)' "$TMPDIR" > "$work/live.pid" &
live=$!
for _ in $(seq 1 6000); do [[ -S "$TMPDIR/fuseflow-$live-0.sock" ]] && break; sleep 0.02; done
[[ -S "$TMPDIR/fuseflow-$live-0.sock" ]] || fail "the live process's socket did not appear in 120 s"
(cd "$d" && "$bin" run "$cfg" $(base "$d/out") trainer.steps=5000 trainer.save_freq=1 --resume --stop-after 3 --no-progress > "$d/log2" 2>&1) \
  || { cat "$d/log2" >&2; fail "killed run: --resume failed"; }
[[ ! -e "$sock" ]] || fail "killed run: its socket $sock is still there"
grep -q "removed $sock, the socket of process $pid, which is gone" "$d/log2" || { cat "$d/log2" >&2; fail "killed run: the socket's removal is not logged"; }
[[ -S "$TMPDIR/fuseflow-$live-0.sock" ]] || fail "the socket of a live process was removed"
kill $live 2>/dev/null || true; wait $live 2>/dev/null || true
grep -q "resuming from" "$d/log2" || fail "killed run: did not resume"
echo "ok: a killed run's socket is removed by the next run (logged); a live process's stays"

# ---- 11. resume is honest ------------------------------------------------------------------
o=$work/r
run_ff $(base "$o") trainer.steps=4 roles.actor.optim.lr=2e-5 graph.rollout.n=4 --stop-after 2 > "$work/r1.log" 2>&1 ||
  { cat "$work/r1.log" >&2; fail "resume: the first half failed"; }
[[ -f "$o/checkpoints/step-00000002/config.yaml" ]] || fail "resume: the checkpoint does not record its config"
cp "$o/config.yaml" "$work/config.orig"
cp "$o/metrics.jsonl" "$work/metrics.orig"
refused resume_changed_override "this config changes the run: roles.actor.optim.lr: 2e-5 -> 3e-5" \
  $(base "$o") trainer.steps=4 roles.actor.optim.lr=3e-5 graph.rollout.n=4 --resume
refused resume_missing_override "graph.rollout.n: 4 -> 8" $(base "$o") trainer.steps=4 roles.actor.optim.lr=2e-5 --resume
refused resume_longer_schedule "trainer.steps: 4 -> 6" $(base "$o") trainer.steps=6 roles.actor.optim.lr=2e-5 graph.rollout.n=4 --resume
grep -q "resume-with-changes" "$work/resume_longer_schedule.log" || fail "resume: the refusal does not say how to go on"
cmp -s "$o/config.yaml" "$work/config.orig" || fail "resume: a refused resume changed OUT/config.yaml"
cmp -s "$o/metrics.jsonl" "$work/metrics.orig" || fail "resume: a refused resume changed OUT/metrics.jsonl"
[[ ! -e "$o/config_changes.jsonl" ]] || fail "resume: a refused resume recorded changes"
# harmless keys (evaluation and save frequency) pass, and are recorded as such
run_ff $(base "$o") trainer.steps=4 roles.actor.optim.lr=2e-5 graph.rollout.n=4 trainer.save_freq=1 --resume --stop-after 3 \
  > "$work/r2.log" 2>&1 || { cat "$work/r2.log" >&2; fail "resume: a harmless change was refused"; }
python3 - "$o/config_changes.jsonl" <<'PY' || fail "resume: the harmless change is not recorded"
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1])]
assert len(rec) == 1 and rec[0]["iteration"] == 2 and "unrecorded" not in rec[0], rec
assert rec[0]["changes"] == [{"key": "trainer.save_freq", "was": "0", "now": "1", "harmless": True}], rec
PY
# --resume-with-changes: a longer schedule, recorded; config.yaml stays the original
run_ff $(base "$o") trainer.steps=5 roles.actor.optim.lr=2e-5 graph.rollout.n=4 --resume-with-changes > "$work/r3.log" 2>&1 ||
  { cat "$work/r3.log" >&2; fail "resume: --resume-with-changes failed"; }
grep -q "resuming with trainer.steps changed: 4 -> 5" "$work/r3.log" || { cat "$work/r3.log" >&2; fail "resume: the accepted change is not logged"; }
[[ $(iterations "$o/metrics.jsonl") == 5 ]] || fail "resume: --resume-with-changes did not run to iteration 5"
cmp -s "$o/config.yaml" "$work/config.orig" || fail "resume: OUT/config.yaml (the original run's record) was overwritten"
grep -q "steps: 5" "$o/checkpoints/step-00000005/config.yaml" || fail "resume: the new checkpoint does not record the changed config"
python3 - "$o/config_changes.jsonl" <<'PY' || fail "resume: the accepted change is not recorded"
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1])]
assert len(rec) == 2 and rec[1]["iteration"] == 3, rec
ch = {c["key"]: c for c in rec[1]["changes"]}
assert ch["trainer.steps"] == {"key": "trainer.steps", "was": "4", "now": "5", "harmless": False}, rec[1]
PY
echo "ok: --resume refuses changed or missing overrides and another schedule, lists them, keeps config.yaml; harmless keys and --resume-with-changes are recorded"
echo ok
