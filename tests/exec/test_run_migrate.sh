#!/usr/bin/env bash
# Long-tail migration in `fuseflow run` (graph.rollout.migrate, docs/run.md "Migration"): GRPO on
# the repeat task (a random tiny model, generation on workers of its own) with migration forced
# at several thresholds, the KV rows sent or recomputed, against the same run with migration off:
#   - the same responses (samples.jsonl byte for byte) at every threshold, both ways;
#   - the same metrics within 1e-6 + 1e-4 (the log-probs feed the losses; not bit for bit: a
#     prefill's rounding depends on which prompts share it, which is timing, with or without
#     migration), also with one sample per prompt on 2 and 4 workers;
#   - metrics.jsonl's migrate {moved, bytes, time_s} per iteration: moved > 0 when forced at
#     once, the KV rows' bytes above the recompute's; the trace's "migrate" arrows;
#   - bad values refused naming the key; a TP generation layout refused with the reason.
# A survivor killed during a migration: tests/exec/test_run_kill.c (case 5).
source "$(dirname "$0")/lib.sh"
prepare_inputs
data=$work/rep
"$bin" dataset repeat --median 8 --p99-ratio 10 --max 40 --train 200 --test 20 --seed 1 --out "$data" > /dev/null
cat > "$work/run.yaml" <<EOF
trainer: {steps: 2, seed: 3, schedule: fused, save_freq: 0, test_freq: 0, acc_reward: repeat_match}
data: {train_files: $data/train.jsonl, val_files: $data/test.jsonl, train_batch_size: 4, max_prompt_length: 8,
       max_response_length: 40}
roles:
  actor: {model: $cache/tiny, workers: 1, rollout: {workers: 2}, optim: {lr: 1.0e-3}}
  ref: {model: $cache/tiny, colocate_with: actor}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4, temperature: 1.0}
  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob]}
  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: repeat_match}
  advantage: {op: advantage, in: [score], out: [advantages], estimator: grpo}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob], loss: vanilla,
                mini_batch_size: 4, micro_batch_size: 16, kl_loss: {type: low_var_kl, coef: 0.001}}
  sync: {op: sync_weights, role: actor, after: [train_actor]}
EOF

run() { # OUT [overrides...]
  local out=$1; shift
  "$bin" run "$work/run.yaml" trainer.out_dir="$out" --threads 1 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "run $* failed"; }
}
# metrics.jsonl without the keys that depend on timing or placement, for an exact comparison
strip() { python3 - "$1" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    for k in ("time", "memory", "weight_sync", "migrate", "eval_time_s"): o.pop(k, None)
    print(json.dumps(o, sort_keys=True))
PY
}
# migrate.KEY of each iteration, one per line
mig() { python3 -c 'import json,sys; [print(json.loads(l)["migrate"][sys.argv[2]]) for l in open(sys.argv[1])]' "$1/metrics.jsonl" "$2"; }

# 1. GRPO, 4 samples per prompt on 2 workers: the same responses at every threshold, both ways
run "$work/off"
for how in kv recompute; do
  for rt in 1.0 0.5; do
    o=$work/on_${how}_$rt
    run "$o" graph.rollout.migrate=$rt graph.rollout.migrate_with=$how
    cmp -s "$o/samples.jsonl" "$work/off/samples.jsonl" ||
      { diff "$o/samples.jsonl" "$work/off/samples.jsonl" | head -5 >&2; fail "$how at $rt: other responses than without migration"; }
    strip "$o/metrics.jsonl" > "$o.m" && strip "$work/off/metrics.jsonl" > "$work/off.m"
    same_metrics "$o.m" "$work/off.m" 1e-6 1e-4 || fail "$how at $rt: other metrics than without migration"
  done
  # forced at once, every iteration moves the unfinished samples of one worker (its groups of
  # 4, about half of the 16: the dispatch to the least loaded worker decides how many), never
  # the survivor's
  for m in $(mig "$work/on_${how}_1.0" moved); do [[ $m -gt 0 && $m -lt 16 ]] || fail "$how at 1.0: moved $m of 16 samples"; done
  for t in $(mig "$work/on_${how}_1.0" time_s); do python3 -c "import sys; sys.exit(not 0 < $t < 10)" || fail "$how: time_s $t"; done
done
kv=$(mig "$work/on_kv_1.0" bytes | sed -n 1p) rc=$(mig "$work/on_recompute_1.0" bytes | sed -n 1p) # sed reads all: head would end python with a broken pipe (pipefail)
[[ $kv -gt $((2 * rc)) && $rc -gt 0 ]] || fail "the KV rows' states ($kv bytes) are not larger than the recompute's ($rc)"

# 2. one sample per prompt, the KV rows, on 2 workers and on 4 (bit for bit in quiet runs; a
# loaded machine's timing changes prefill packing, so within the same tolerance)
one="graph.rollout.n=1 graph.advantage.estimator=reinforce_plus_plus data.train_batch_size=4 graph.train_actor.mini_batch_size=4
     graph.train_actor.micro_batch_size=4"
for w in 2 4; do
  # shellcheck disable=SC2086
  run "$work/off1_$w" $one roles.actor.rollout.workers=$w
  # shellcheck disable=SC2086
  run "$work/on1_$w" $one roles.actor.rollout.workers=$w graph.rollout.migrate=1.0 --trace "$work/trace_$w.json"
  cmp -s "$work/on1_$w/samples.jsonl" "$work/off1_$w/samples.jsonl" || fail "n=1 on $w workers: other responses"
  strip "$work/on1_$w/metrics.jsonl" > "$work/on1_$w.m" && strip "$work/off1_$w/metrics.jsonl" > "$work/off1_$w.m"
  same_metrics "$work/on1_$w.m" "$work/off1_$w.m" 1e-6 1e-4 || fail "n=1 on $w workers: other metrics than without migration"
  for m in $(mig "$work/on1_$w" moved); do [[ $m -gt 0 ]] || fail "n=1 on $w workers: nothing moved"; done
  python3 - "$work/trace_$w.json" "$(mig "$work/on1_$w" moved | paste -sd+ | bc)" <<'PY' || fail "the trace has no migrate arrow per move"
import json, sys
t = json.load(open(sys.argv[1])); ev = t["traceEvents"] if isinstance(t, dict) else t
starts = [e for e in ev if e.get("name") == "migrate" and e.get("ph") == "s"]
ends = [e for e in ev if e.get("name") == "migrate" and e.get("ph") == "f"]
# one arrow per migrated job (a prompt's samples move together), from the source's track to another
assert starts and len(starts) == len(ends) and len(starts) <= int(sys.argv[2]), (len(starts), len(ends), sys.argv[2])
by_id = {e["id"]: e for e in starts}
assert all((by_id[e["id"]]["pid"], by_id[e["id"]]["tid"]) != (e["pid"], e["tid"]) for e in ends)
PY
done

# 3. bad values, TP generation
refused() { # WHAT EXPECTED overrides...
  local what=$1 want=$2; shift 2
  if "$bin" run "$work/run.yaml" trainer.out_dir="$work/bad" --no-progress "$@" > "$work/bad.log" 2>&1; then fail "$what: accepted"; fi
  grep -q -- "$want" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "$what: no message naming $want"; }
  rm -rf "$work/bad"
}
refused "a fraction over 1" "'migrate' is neither off, auto nor a fraction" graph.rollout.migrate=2
refused "a word" "'migrate' is neither off, auto nor a fraction" graph.rollout.migrate=sometimes
refused "migrate_with" "'migrate_with' is neither kv nor recompute" graph.rollout.migrate=auto graph.rollout.migrate_with=rows
"$bin" init --preset tiny --out "$work/v260" num_hidden_layers=2 hidden_size=64 intermediate_size=128 vocab_size=260 > /dev/null
refused "TP generation" "migrate needs data-parallel generation workers" graph.rollout.migrate=auto \
  roles.actor.model="$work/v260" roles.ref.model="$work/v260" "roles.actor.rollout={workers: 2, layout: {tp: 2}}"
echo "ok"
