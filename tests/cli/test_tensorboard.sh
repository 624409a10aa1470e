#!/usr/bin/env bash
# TensorBoard event files of `fuseflow sft` (`train.logger`), read by TensorBoard's own reader
# (EventAccumulator): every scalar of metrics.jsonl at its step with its value, and after a
# resume that rewrites steps, each step once (the restart event makes TensorBoard drop the
# steps written again). Also: a logger list without console prints no step lines, a wrong
# logger name is refused for `sft` and `run` with the choices, a misspelled key with the
# right one. Skipped (after the checks that need no TensorBoard) where the Python package
# tensorboard is not installed (`pip install tensorboard`). The format itself:
# tests/modelio/test_tfevents.c.
source "$(dirname "$0")/lib.sh"
cd "$TMP"

"$FF_BIN" init --preset tiny --out model hidden_size=32 intermediate_size=64 num_hidden_layers=2 \
  num_attention_heads=2 num_key_value_heads=1 max_position_embeddings=64 >/dev/null || fail "init"
"$FF_BIN" dataset arith --digits 2 --train 200 --test 20 --seed 3 --out data >/dev/null || fail "dataset"
cat > sft.yaml <<'Y'
model: model
out: run
data: {train: data/train.jsonl, test: data/test.jsonl}
train: {steps: 20, batch_size: 8, eval_every: 10, eval_samples: 10, save_every: 10, logger: [jsonl, tensorboard]}
Y
expect_error "a wrong logger name (sft)" "'train.logger.1' must be one of: console, jsonl, tensorboard, got 'wandb'" \
  "$FF_BIN" sft --config sft.yaml "train.logger=[jsonl,wandb]"
expect_error "a wrong logger name (run)" "'trainer.logger' must be one of: console, jsonl, tensorboard, got 'tb'" \
  "$FF_BIN" run "$SRC/examples/grpo_arith.yaml" trainer.logger=tb trainer.out_dir=rl
expect_error "a misspelled logger key" "unknown key 'train.loggers' \(hint: did you mean 'train.logger'\?\)" \
  "$FF_BIN" sft --config sft.yaml "train.loggers=[jsonl]"
expect_ok "sft with jsonl and tensorboard" "$FF_BIN" sft --config sft.yaml
grep -q "step .*| loss" err && fail "no console logger, yet step lines: $(grep -m1 'step' err)" || ok "no console logger: no step lines"
n=$(ls run/events.out.tfevents.* 2>/dev/null | wc -l)
[[ $n == 1 ]] && ok "one event file" || fail "$n event files"
# resume from step 10 (the checkpoint of step 20 removed): steps 11..20 are written again
rm -rf run/checkpoints/step-00000020 run/final
sleep 1 # the next file's name has a later second
expect_ok "resume from step 10" "$FF_BIN" sft --config sft.yaml --resume
n=$(ls run/events.out.tfevents.* 2>/dev/null | wc -l)
[[ $n == 2 ]] && ok "a second event file for the resumed run" || fail "$n event files after the resume"

if ! python3 -c "import tensorboard" 2>/dev/null; then
  ((FAILS)) && finish
  echo "SKIPPED: the Python package tensorboard is not installed (pip install tensorboard); the other checks passed"
  exit 77
fi
python3 - <<'PY' && ok "TensorBoard reads every scalar of metrics.jsonl, each step once" || fail "TensorBoard's reader disagrees"
import json, math, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator("run", size_guidance={"scalars": 0})
ea.Reload()
tags = set(ea.Tags()["scalars"])
want = {}
for line in open("run/metrics.jsonl"):
    m = json.loads(line)
    for k, v in m.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
            want.setdefault(k, {})[m["step"]] = v
bad = []
if set(want) - tags:
    bad.append(f"tags missing in TensorBoard: {sorted(set(want) - tags)}")
for tag, steps in want.items():
    if tag not in tags:
        continue
    got = ea.Scalars(tag)
    seen = [e.step for e in got]
    if sorted(seen) != sorted(steps) or len(seen) != len(set(seen)):
        bad.append(f"{tag}: steps {seen}, metrics.jsonl has {sorted(steps)}")
        continue
    for e in got:
        if not math.isclose(e.value, steps[e.step], rel_tol=1e-6, abs_tol=1e-30):
            bad.append(f"{tag} at {e.step}: {e.value} vs {steps[e.step]}")
if sorted(want["loss"]) != list(range(1, 21)) or sorted(want["eval_loss"]) != [10, 20]:
    bad.append(f"metrics.jsonl steps: loss {sorted(want['loss'])}, eval_loss {sorted(want['eval_loss'])}")
print("tags:", sorted(tags))
print("\n".join(bad) or "all agree")
sys.exit(1 if bad else 0)
PY
finish
