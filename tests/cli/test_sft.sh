#!/usr/bin/env bash
# `fuseflow sft`: the loss falls, the prompt is masked, --resume reproduces an uninterrupted
# run exactly (losses and final weights), Ctrl-C saves a checkpoint, bad configs and data are
# refused with the file and line.
source "$(dirname "$0")/lib.sh"
cd "$TMP"

# a very small model keeps this quick under ASan
"$FF_BIN" init --preset tiny --out model hidden_size=32 intermediate_size=64 num_hidden_layers=2 \
  num_attention_heads=2 num_key_value_heads=1 max_position_embeddings=64 >/dev/null || fail "init"
"$FF_BIN" dataset arith --digits 2 --train 400 --test 40 --seed 3 --out data >/dev/null || fail "dataset"
cat > run.yaml <<'Y'
model: model
out: run
data:
  train: data/train.jsonl
  test: data/test.jsonl
train:
  steps: 40
  batch_size: 16
  seed: 5
  log_every: 10
  eval_every: 20
  eval_samples: 20
  save_every: 20
optim:
  lr: 5.0e-3
  warmup_steps: 2
Y
expect_ok "help" "$FF_BIN" sft --help
expect_ok "train 40 steps" "$FF_BIN" sft --config run.yaml
grep -q "step     10/40 | loss" err && ok "progress lines" || fail "no progress line: $(head -c 300 err)"
grep -q "ETA" err && grep -q "tok/s" err && ok "progress shows tokens/s and ETA" || fail "progress fields"
grep -q "eval @ 20 | held-out loss" err && ok "held-out eval" || fail "no eval line"
python3 - <<'PY' && ok "loss falls" || fail "loss did not fall"
import json
m = [json.loads(l) for l in open("run/metrics.jsonl")]
tr = [x["loss"] for x in m if "loss" in x]
ev = [x for x in m if "eval_loss" in x]
print("loss", tr[0], "->", tr[-1], "| evals", [(e["step"], round(e["eval_loss"], 3), e["exact_match"]) for e in ev])
assert len(tr) == 40 and len(ev) == 2
assert tr[-1] < tr[0] - 1.5, (tr[0], tr[-1])
PY
[[ -f run/final/model.safetensors && -f run/final/tokenizer.json && -f run/checkpoints/step-00000040/optimizer.safetensors ]] \
  && ok "final model and checkpoints" || fail "missing outputs: $(ls -R run | head -30)"
expect_ok "the trained model generates" "$FF_BIN" generate --model run/final --prompt "12+34=" --temperature 0 --max-new-tokens 6

# the prompt is masked: random prompts, a constant response; only the response is learned
python3 - <<'PY'
import json, random
r = random.Random(1)
with open("const.jsonl", "w") as f:
    for _ in range(200):
        p = "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12))
        f.write(json.dumps({"prompt": p + ":", "response": "ok"}) + "\n")
PY
expect_ok "constant responses" "$FF_BIN" sft --config run.yaml out=const data.train=const.jsonl data.test=null train.steps=50 train.eval_every=0 optim.lr=1e-2 optim.min_lr_ratio=1
python3 -c "
import json; m=[json.loads(l) for l in open('const/metrics.jsonl')]; l=m[-1]['loss']; print('final loss', l)
import sys; sys.exit(0 if l < 0.5 else 1)" && ok "loss covers the response only (with the random prompts in it, it could not fall below 2.6)" || fail "prompt not masked?"

# resume: 3 + 3 steps equal 6 steps, to the last bit
cat > r.yaml <<'Y'
model: model
out: full
data:
  train: data/train.jsonl
train:
  steps: 6
  batch_size: 60
  seed: 2
  save_every: 3
optim:
  lr: 3.0e-3
  warmup_steps: 2
Y
expect_ok "uninterrupted 6 steps" "$FF_BIN" sft --config r.yaml
expect_ok "first half" "$FF_BIN" sft --config r.yaml out=split train.stop_after=3
grep -q "stopped after step 3" err && ok "stop_after message" || fail "stop_after: $(cat err)"
[[ -d split/checkpoints/step-00000003 && ! -d split/final ]] && ok "checkpoint at step 3, no final model yet" || fail "split state: $(ls -R split | head)"
expect_ok "resume" "$FF_BIN" sft --config r.yaml out=split --resume
grep -q "resuming from split/checkpoints/step-00000003" err && ok "resumed from step 3" || fail "resume message: $(cat err)"
python3 - <<'PY' && ok "resumed losses equal the uninterrupted run" || fail "resumed run differs"
import json
a = [(x["step"], x["loss"]) for x in map(json.loads, open("full/metrics.jsonl")) if "loss" in x]
b = [(x["step"], x["loss"]) for x in map(json.loads, open("split/metrics.jsonl")) if "loss" in x]
print("full ", a); print("split", b)
assert len(a) == 6 and a == b
PY
cmp -s full/final/model.safetensors split/final/model.safetensors && ok "final weights identical" || fail "final weights differ"
[[ $(ls split/checkpoints) == $'step-00000003\nstep-00000006' ]] && ok "keep_checkpoints keeps the newest two" || fail "checkpoints: $(ls split/checkpoints)"
expect_error "resume past the end" "the checkpoint is at step 6, train.steps is 6" "$FF_BIN" sft --config r.yaml out=split --resume
expect_error "resume with another seed and schedule: refused, the changes listed" "this config changes the run: train.seed: 2 -> 9, train.steps: 6 -> 9" \
  "$FF_BIN" sft --config r.yaml out=split --resume train.seed=9 train.steps=9
expect_error "another seed is refused even with --resume-with-changes" "seed 2 on 400 examples; this run has seed 9" \
  "$FF_BIN" sft --config r.yaml out=split --resume-with-changes train.seed=9 train.steps=9
[[ $(wc -l < split/config_changes.jsonl) == 1 ]] && grep -q '"key":"train.stop_after","was":"3","now":null,"harmless":true' split/config_changes.jsonl \
  && ok "the resume records its harmless change (train.stop_after), failed ones nothing" || fail "split/config_changes.jsonl: $(cat split/config_changes.jsonl)"
expect_error "resume without checkpoints" "--resume: no checkpoint in nothing/checkpoints" "$FF_BIN" sft --config r.yaml out=nothing --resume
expect_absent "a resume with nothing to resume makes no folder" nothing

# resume is honest: a config that changes the run (an override changed or missing, a longer
# schedule) is refused with the differences; harmless keys pass; --resume-with-changes goes on;
# every difference is recorded; OUT/config.yaml stays the original, each checkpoint has its own
expect_ok "a run to resume" "$FF_BIN" sft --config r.yaml out=hon train.stop_after=3 optim.warmup_steps=1
[[ -f hon/checkpoints/step-00000003/config.yaml ]] && ok "the checkpoint records its config" || fail "no hon/checkpoints/step-00000003/config.yaml"
cp hon/config.yaml hon.config.orig && cp hon/metrics.jsonl hon.metrics.orig
expect_error "resume with a changed override" "this config changes the run: optim.lr: 3.0e-3 -> 1e-2" \
  "$FF_BIN" sft --config r.yaml out=hon --resume optim.warmup_steps=1 optim.lr=1e-2
grep -q -- "--resume-with-changes" err && ok "the refusal says how to go on" || fail "no hint: $(cat err)"
expect_error "resume without an override" "this config changes the run: optim.warmup_steps: 1 -> 2" "$FF_BIN" sft --config r.yaml out=hon --resume
expect_error "resume with a longer schedule" "train.steps: 6 -> 8" "$FF_BIN" sft --config r.yaml out=hon --resume optim.warmup_steps=1 train.steps=8
cmp -s hon/config.yaml hon.config.orig && cmp -s hon/metrics.jsonl hon.metrics.orig && ok "refused resumes change nothing" || fail "a refused resume changed config.yaml or metrics.jsonl"
expect_absent "refused resumes record nothing" hon/config_changes.jsonl
expect_ok "harmless changes pass" "$FF_BIN" sft --config r.yaml out=hon --resume optim.warmup_steps=1 train.log_every=2 train.stop_after=4
expect_ok "--resume-with-changes continues" "$FF_BIN" sft --config r.yaml out=hon --resume-with-changes optim.warmup_steps=1 train.steps=8
grep -q "resuming with train.steps changed: 6 -> 8" err && ok "the accepted change is logged" || fail "no log line: $(cat err)"
python3 - <<'PY' && ok "the changes are recorded in config_changes.jsonl" || fail "config_changes.jsonl"
import json
rec = [json.loads(l) for l in open("hon/config_changes.jsonl")]
print(rec)
assert [r["step"] for r in rec] == [3, 4] and not any("unrecorded" in r for r in rec), rec
assert {c["key"]: c for c in rec[0]["changes"]} == {
    "train.log_every": {"key": "train.log_every", "was": None, "now": "2", "harmless": True},
    "train.stop_after": {"key": "train.stop_after", "was": "3", "now": "4", "harmless": True}}, rec[0]
ch = {c["key"]: c for c in rec[1]["changes"]}
assert ch["train.steps"] == {"key": "train.steps", "was": "6", "now": "8", "harmless": False}, rec[1]
m = [json.loads(l) for l in open("hon/metrics.jsonl")]
assert [x["step"] for x in m if "loss" in x] == list(range(1, 9)), m
PY
cmp -s hon/config.yaml hon.config.orig && ok "OUT/config.yaml stays the original run's" || fail "OUT/config.yaml was overwritten"
grep -q "steps: 8" hon/checkpoints/step-00000008/config.yaml && ok "the new checkpoint records the changed config" || fail "step-8 config"
# a checkpoint that does not record its config (made before the record existed)
expect_ok "a run to resume" "$FF_BIN" sft --config r.yaml out=old train.stop_after=3
rm old/checkpoints/step-00000003/config.yaml old/config.yaml
expect_error "resume from a checkpoint without its config" "does not record its config" "$FF_BIN" sft --config r.yaml out=old --resume
expect_ok "... with --resume-with-changes" "$FF_BIN" sft --config r.yaml out=old --resume-with-changes
grep -q '"unrecorded":true' old/config_changes.jsonl && ok "the unchecked resume is recorded" || fail "old/config_changes.jsonl: $(cat old/config_changes.jsonl)"

# every path sft writes is checked before it trains (each of these used to fail at the end)
touch afile
mkdir -p w1 w2 w3/metrics.jsonl && touch w1/final w2/checkpoints
expect_error "final/ is a file" "w1/final: .* but it is a file" "$FF_BIN" sft --config r.yaml out=w1
expect_error "checkpoints/ is a file" "w2/checkpoints: .* but it is a file" "$FF_BIN" sft --config r.yaml out=w2 train.save_every=0
expect_error "metrics.jsonl is a folder" "w3/metrics.jsonl: .* but it is a folder" "$FF_BIN" sft --config r.yaml out=w3
expect_error "out under a file" "afile/out: cannot create directory" "$FF_BIN" sft --config r.yaml out=afile/out
expect_absent "nothing trained" w1/metrics.jsonl w2/metrics.jsonl w1/config.yaml w2/config.yaml

# leftovers of dead runs are removed (and logged) at the next start; a live process's stay
sleep 0 & dead=$!
wait $dead
mkdir -p "lo/checkpoints/step-00000003.tmp-$dead" "lo/final.tmp-$dead" "lo/final.old-$dead" "lo/checkpoints/step-00000002.tmp-$$"
head -c 100000 /dev/zero > "lo/checkpoints/step-00000003.tmp-$dead/model.safetensors"
echo x > "lo/metrics.jsonl.tmp.$dead" && echo x > "lo/config.yaml.tmp.$dead"
expect_ok "a run where a dead one left its staging" "$FF_BIN" sft --config r.yaml out=lo train.steps=2
gone=1
for p in "checkpoints/step-00000003.tmp-$dead" "final.tmp-$dead" "final.old-$dead" "metrics.jsonl.tmp.$dead" "config.yaml.tmp.$dead"; do
  [[ ! -e "lo/$p" ]] && grep -q "removed lo/$p, left by process $dead, which is gone" err || { gone=0; fail "leftover lo/$p: $(ls lo lo/checkpoints; cat err)"; }
done
((gone)) && ok "leftovers of a dead run removed, each logged"
[[ -d "lo/checkpoints/step-00000002.tmp-$$" ]] && ok "a live process's staging folder stays" || fail "a live process's staging folder was removed"

# Ctrl-C: the step finishes, a checkpoint is saved, exit 130, --resume continues
"$FF_BIN" sft --config r.yaml out=intr train.steps=100000 train.save_every=0 2>intr.err &
pid=$!
for _ in $(seq 1 600); do
  [[ -s intr/metrics.jsonl ]] && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
rc=$?
if ((rc == 130)) && grep -q "interrupted; saved" intr.err && ls intr/checkpoints/step-* >/dev/null 2>&1; then ok "Ctrl-C saves a checkpoint (exit 130)"; else fail "Ctrl-C: rc $rc, $(tail -c 300 intr.err)"; fi

# bad configs and data: file and line named, nothing trained
printf 'model: model\nout: bad\ndata:\n  train: data/train.jsonl\ntrain:\n  step: 5\n' > typo.yaml
expect_error "misspelled key" "typo.yaml:6: unknown key 'train.step'.*did you mean 'train.steps'" "$FF_BIN" sft --config typo.yaml
expect_error "misspelled override" "unknown key 'optim.learning_rate'" "$FF_BIN" sft --config r.yaml out=bad optim.learning_rate=1
expect_error "bad value" "optim.lr' must be in \[0, 10\], got -1" "$FF_BIN" sft --config r.yaml out=bad optim.lr=-1
expect_error "wrong type" "train.steps.*integer" "$FF_BIN" sft --config r.yaml out=bad train.steps=many
expect_error "missing key" "the config has no 'data.train'" "$FF_BIN" sft --config r.yaml out=bad data.train=
expect_error "missing config" "nope.yaml" "$FF_BIN" sft --config nope.yaml
# sections are typed: a plain value or a list where a section (data, train, optim) belongs is
# an error at its line or override, not a section of defaults
printf 'model: model\nout: bad\ndata:\n  train: data/train.jsonl\ntrain: 7\n' > scalar.yaml
expect_error "train: 7 in the file" "scalar.yaml:5: 'train' is a section \(a map of keys such as 'steps'\), not the plain value '7'" \
  "$FF_BIN" sft --config scalar.yaml
printf 'model: model\nout: bad\ndata:\n  train: data/train.jsonl\noptim: fast\n' > scalar2.yaml
expect_error "optim: fast in the file" "scalar2.yaml:5: 'optim' is a section" "$FF_BIN" sft --config scalar2.yaml
printf 'model: model\nout: bad\ndata: [data/train.jsonl]\n' > list.yaml
expect_error "data as a list" "list.yaml:3: 'data' is a section \(a map of keys such as 'train'\), not a list" "$FF_BIN" sft --config list.yaml
for o in train=5 optim=fast data=3 "optim=[1]" "train=[a]"; do
  expect_error "override $o" "override '${o//[/\\[}': '${o%%=*}' is a section" "$FF_BIN" sft --config r.yaml out=bad "$o"
done
expect_error "missing data" "missing.jsonl: cannot open" "$FF_BIN" sft --config r.yaml out=bad data.train=missing.jsonl
printf '{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2=", "response": 4}\n' > badfield.jsonl
expect_error "non-string response" "badfield.jsonl:2: expected string fields" "$FF_BIN" sft --config r.yaml out=bad data.train=badfield.jsonl
printf '{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2=", \n' > malformed.jsonl
expect_error "malformed JSONL" "malformed.jsonl:2: malformed JSON" "$FF_BIN" sft --config r.yaml out=bad data.train=malformed.jsonl
: > nothing.jsonl
printf '\n \n' > blank.jsonl
expect_error "empty training data" "nothing.jsonl: no examples: the file is empty or holds only blank lines .hint: one JSON object per line: \{\"prompt\"" \
  "$FF_BIN" sft --config r.yaml out=bad data.train=nothing.jsonl
expect_error "blank test data" "blank.jsonl: no examples: the file is empty or holds only blank lines" "$FF_BIN" sft --config r.yaml \
  out=bad data.test=blank.jsonl
python3 -c "import json; print(json.dumps({'prompt': 'x' * 70, 'response': 'y'}))" > long.jsonl
expect_error "example longer than the context" "long.jsonl:1: 72 tokens with eos, more than max_position_embeddings 64" "$FF_BIN" sft --config r.yaml out=bad data.train=long.jsonl
expect_error "missing model" "nomodel/config.json: cannot open" "$FF_BIN" sft --config r.yaml out=bad model=nomodel
cp -r model cut && python3 -c "import os; p='cut/model.safetensors'; os.truncate(p, os.path.getsize(p) - 8)"
expect_error "truncated safetensors" "cut/model.safetensors: .*truncated" "$FF_BIN" sft --config r.yaml out=bad model=cut
cp -r model arch && python3 -c "
import json; p='arch/config.json'; c=json.load(open(p)); c['architectures']=['LlamaForTokenClassification']; json.dump(c, open(p,'w'))"
expect_error "unsupported architecture" "arch/config.json: unsupported architecture 'LlamaForTokenClassification'" "$FF_BIN" sft --config r.yaml out=bad model=arch
expect_absent "nothing written for failed runs" "bad/final" "bad/checkpoints"
finish
