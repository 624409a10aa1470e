#!/usr/bin/env bash
# `fuseflow run`'s loggers (trainer.logger) and its picture:
#   [console, jsonl, tensorboard]: the iteration lines on stdout, metrics.jsonl, one event
#     file, and OUT/curves.png (a PNG) at the end; with TensorBoard installed, its reader
#     finds every number of each metrics line at its iteration, nested ones as time/NODE;
#   [jsonl]: no iteration lines, no event file, the picture still drawn;
#   tensorboard alone: an event file, metrics.jsonl empty, and the run says why it drew no
#     picture (and still succeeds).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
M=$cache/tiny
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"
run_with() { # OUT LOGGER
  "$bin" run "$src/examples/grpo.yaml" $(small_run "$1") data.train_batch_size=4 roles.actor.workers=1 trainer.test_freq=2 \
    data.val_batch_size=8 graph.train_actor.mini_batch_size=2 roles.actor.model=$M roles.ref.model=$M trainer.save_freq=0 \
    trainer.steps=2 "trainer.logger=$2" --val-limit 8 --no-progress > "$1.out" 2> "$1.err" || fail "run with $2: $(tail -n 5 "$1.err")"
}
png_ok() { [[ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]]; }

o=$work/all
run_with "$o" "[console,jsonl,tensorboard]"
grep -q "^iter 2/2 | reward" "$o.out" || fail "console: no iteration line: $(head -c 300 "$o.out")"
[[ $(iterations "$o/metrics.jsonl") == 2 ]] || fail "jsonl: $(iterations "$o/metrics.jsonl") iterations in metrics.jsonl"
[[ $(ls "$o"/events.out.tfevents.* | wc -l) == 1 ]] || fail "tensorboard: $(ls "$o") "
png_ok "$o/curves.png" || fail "no PNG at $o/curves.png"
grep -q "run: learning curves in $o/curves.png" "$o.err" || fail "the run does not say where the picture is"
echo "ok: [console, jsonl, tensorboard]"

o=$work/jsonl
run_with "$o" "[jsonl]"
grep -q "^iter " "$o.out" && fail "no console logger, yet: $(grep -m1 '^iter ' "$o.out")"
compgen -G "$o/events.out.tfevents.*" > /dev/null && fail "an event file without the tensorboard logger"
[[ $(iterations "$o/metrics.jsonl") == 2 ]] || fail "jsonl alone: metrics.jsonl"
png_ok "$o/curves.png" || fail "no picture with jsonl alone"
echo "ok: [jsonl]"

o=$work/tb
run_with "$o" tensorboard
[[ ! -s "$o/metrics.jsonl" ]] || fail "metrics.jsonl written without the jsonl logger"
[[ $(ls "$o"/events.out.tfevents.* | wc -l) == 1 ]] || fail "tensorboard alone: no event file"
grep -q "run: no learning curves: .*no metrics to draw" "$o.err" || fail "no word on the missing picture: $(tail -n 3 "$o.err")"
echo "ok: tensorboard alone"

if python3 -c "import tensorboard" 2> /dev/null; then
  python3 - "$work/all" <<'PY' || fail "TensorBoard's reader disagrees with metrics.jsonl"
import json, math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = sys.argv[1]
ea = EventAccumulator(out, size_guidance={"scalars": 0}); ea.Reload()
got = {t: {e.step: e.value for e in ea.Scalars(t)} for t in ea.Tags()["scalars"]}
want = {}
def walk(o, prefix, it):
    for k, v in o.items():
        if prefix == "" and k == "iteration": continue
        if isinstance(v, dict): walk(v, prefix + k + "/", it)
        elif isinstance(v, (int, float)) and not isinstance(v, bool): want.setdefault(prefix + k, {})[it] = v
for line in open(out + "/metrics.jsonl"):
    m = json.loads(line); walk(m, "", m["iteration"])
bad = [t for t in want if t not in got or set(got[t]) != set(want[t]) or
       any(not math.isclose(got[t][s], want[t][s], rel_tol=1e-6, abs_tol=1e-30) for s in want[t])]
assert "time/iteration" in want and "eval_acc" in want and "reward_mean" in want, sorted(want)
print("TensorBoard tags:", len(got), "; disagreeing:", bad)
sys.exit(1 if bad else 0)
PY
  echo "ok: TensorBoard reads the run's scalars"
else
  echo "(TensorBoard's reader not checked: the Python package tensorboard is not installed)"
fi
echo "all checks passed"
