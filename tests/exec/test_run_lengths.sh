#!/usr/bin/env bash
# Drawn response lengths in `fuseflow run` (graph.<generate>.lengths, docs/run.md "Response
# lengths"): GRPO with a random tiny model, each response's length drawn log-normal
# {median: 8, p99_ratio: 10, max: 96}:
#   - the lengths follow it: over 320 samples the median within 7..9 tokens and the p99 within
#     50..96 (the set p99 is 80), none above max, a tail (the longest over 5x the median);
#   - the same responses (samples.jsonl byte for byte) with migration forced at once, KV rows
#     and recompute: a moved sample keeps its drawn length;
#   - without lengths the same run's median is another (the option is what sets them);
#   - bad values refused naming the key.
source "$(dirname "$0")/lib.sh"
prepare_inputs
prepare_lengths_run 4
# the median, p99 and maximum of the response lengths, and how many
stats() { python3 - "$1/samples.jsonl" <<'PY'
import json, sys
L = sorted(json.loads(l)["response_tokens"] for l in open(sys.argv[1]))
print(L[len(L) // 2], L[int(0.99 * len(L))], L[-1], len(L))
PY
}

# 1. the distribution
lengths_run "$work/off"
read -r med p99 mx n <<< "$(stats "$work/off")"
[[ $n -eq 320 ]] || fail "$n samples, expected 320"
[[ $med -ge 7 && $med -le 9 ]] || fail "median length $med, expected 8 +- 1"
[[ $p99 -ge 50 && $p99 -le 96 ]] || fail "p99 length $p99, expected about 80"
[[ $mx -le 96 && $mx -gt $((5 * med)) ]] || fail "longest $mx: above max 96, or no tail over the median $med"

# 2. the same with migration, forced at once (R_t 1.0: moves at the first decision, whatever
# the timing) with the KV rows and with a recompute; 4 prompts x 4 so that a survivor's free
# slots hold the others' samples
small="data.train_batch_size=4 graph.rollout.n=4 graph.train_actor.mini_batch_size=4"
# shellcheck disable=SC2086
lengths_run "$work/off4" $small
for with in kv recompute; do
  # shellcheck disable=SC2086
  lengths_run "$work/mig_$with" $small graph.rollout.migrate=1.0 graph.rollout.migrate_with="$with"
  cmp -s "$work/mig_$with/samples.jsonl" "$work/off4/samples.jsonl" ||
    { diff "$work/mig_$with/samples.jsonl" "$work/off4/samples.jsonl" | head -4 >&2; fail "migrate $with: other responses"; }
  # iterations that moved samples: a source can finish its last sequence before rl.migrate_out
  # reaches it (the tiny model decodes a step in well under a millisecond; a loaded CI machine
  # did it in one of two iterations), so some of the four may move none: one must move, and the
  # samples above are compared in every iteration, moved or not
  moved=$(python3 -c 'import json,sys; print(sum(json.loads(l)["migrate"]["moved"] > 0 for l in open(sys.argv[1])))' \
    "$work/mig_$with/metrics.jsonl")
  [[ $moved -ge 1 ]] || fail "migrate $with: only $moved of the iterations moved samples, so too little was checked"
done

# 3. the option is what sets them: without it the random model runs on (its eos is rare)
python3 - "$work/run.yaml" > "$work/plain.yaml" <<'PY'
import sys
print(open(sys.argv[1]).read().replace(", lengths: {median: 8, p99_ratio: 10, max: 96}", ""))
PY
"$bin" run "$work/plain.yaml" trainer.out_dir="$work/plain" trainer.steps=1 --threads 1 --no-progress --dump-samples \
  > "$work/plain.log" 2>&1 || { cat "$work/plain.log" >&2; fail "the run without lengths failed"; }
read -r pmed _ <<< "$(stats "$work/plain")"
[[ $pmed -gt 20 ]] || fail "without lengths the median is $pmed: the lengths did not come from the option"

# 4. bad values
run_refused "an unknown key" "lengths has no key 'mean'" graph.rollout.lengths.mean=8
run_refused "median 0" "lengths.median 0 must be in" graph.rollout.lengths.median=0
run_refused "p99 under the median" "lengths.p99_ratio 0.5 must be in" graph.rollout.lengths.p99_ratio=0.5
run_refused "max under the median" "lengths.max 4 must be 0 or in" graph.rollout.lengths.max=4
run_refused "not a map" "'lengths' must be a map" graph.rollout.lengths=8
echo "ok"
