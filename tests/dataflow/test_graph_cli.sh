#!/usr/bin/env bash
# `fuseflow graph`: every example checks and prints; overrides apply; a bad key fails with
# its line and a suggestion; --simulate runs both schedules; --list shows the registries and
# a plugin's additions.
set -euo pipefail
bin=${FF_BIN:?FF_BIN is not set}
src=${FF_SOURCE_DIR:-.}
build=${FF_BUILD_DIR:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for ex in grpo ppo rloo reinforce_pp remax dapo; do
  "$bin" graph "$src/examples/$ex.yaml" > "$out/$ex.txt" || fail "examples/$ex.yaml does not check"
  grep -q "ok" "$out/$ex.txt" || fail "no ok for $ex"
  grep -q "sync_weights" "$out/$ex.txt" || fail "no sync node printed for $ex"
done
grep -q "estimator=gae" "$out/ppo.txt" || fail "ppo does not use gae"

"$bin" graph "$src/examples/grpo.yaml" graph.rollout.n=16 > "$out/n16.txt"
grep -q "group size 16" "$out/n16.txt" || fail "override graph.rollout.n=16 not applied"

if "$bin" graph "$src/examples/grpo.yaml" graph.train_actor.clip_ratio_hihg=0.28 2> "$out/err.txt"; then
  fail "a misspelled key was accepted"
fi
grep -q "unknown key 'graph.train_actor.clip_ratio_hihg'" "$out/err.txt" || fail "no unknown-key error: $(cat "$out/err.txt")"
grep -q "did you mean 'graph.train_actor.clip_ratio_high'" "$out/err.txt" || fail "no suggestion"

if "$bin" graph "$src/examples/grpo.yaml" --check-files data.train_files=/no/such.jsonl 2> "$out/err2.txt"; then
  fail "--check-files accepted a missing data file"
fi
grep -q "does not exist" "$out/err2.txt" || fail "no missing-file error"

"$bin" graph "$src/examples/dapo.yaml" --simulate > "$out/sim.txt" || fail "--simulate failed"
grep -q "^fused schedule" "$out/sim.txt" && grep -q "^serial schedule" "$out/sim.txt" || fail "missing a schedule"
grep -q "simulated iteration: fused" "$out/sim.txt" || fail "no summary line"

"$bin" graph --list > "$out/list.txt"
for name in gae grpo rloo reinforce_plus_plus remax vanilla gpg low_var_kl arith_exact_match remote; do
  grep -q "^  $name " "$out/list.txt" || fail "--list misses $name"
done
[[ -f "$build/example_plugin.so" ]] || fail "$build/example_plugin.so is not built (target ff_example_plugin)"
"$bin" graph --list --plugin "$build/example_plugin.so" > "$out/list2.txt"
grep -q "group_median" "$out/list2.txt" || fail "--list --plugin misses the plugin's estimator"
"$bin" graph --help | grep -q "usage: fuseflow graph" || fail "no --help"
echo "graph cli: ok"
