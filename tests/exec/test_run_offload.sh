#!/usr/bin/env bash
# roles.actor.offload (docs/run.md "Memory of the colocated copy"): the colocated actor gives its
# gradients back and moves its AdamW state to host memory for generation (at the weight sync)
# and takes them back at its first step. On the tiny SFT model of test_run_tp.sh, GRPO for 3
# iterations with offload on and off:
#   - on 1 worker (the copy in the actor's layout) and at TP 2 x PP 2 generating at TP 1 on the
#     same 4 workers (HybridFlow's micro-DP gather into a view of the training shard): the same
#     samples, and the metrics within 1e-6 + 1%. Not bit for bit: two runs with offload off
#     already differ in the last bits of the update (measured here: 1 of 4 runs of the 1-worker
#     case, grad_norm 2.717533043 against 2.717532521; test_run_zero.sh says the same of DP);
#     that the moves change no bit is tests/model/test_model_zero.c's (in-process, bit for
#     bit at ZeRO-0, ZeRO-1 and TP 2 x DP 2) and tests/reshard/test_reshard_inplace.c's;
#   - every iteration of an "on" run reports the move: the AdamW bytes over the ranks twice the
#     gradient bytes (8 against 4 bytes a parameter) and the same bytes back; an "off" run has no
#     "offload" metrics;
#   - at ZeRO-1 over 2 replicas each rank moves its half of the state: the AdamW bytes equal
#     the gradient bytes; it trains as with offload off (within 1e-6 + 1%: two DP runs already
#     differ in the last bits, test_run_zero.sh);
#   - a run checkpointing every iteration (while the actor is away: the state is brought back
#     for the checkpoint, and goes away again, so each step reloads it) stopped after 2 and resumed with offload off (a harmless change,
#     logged) ends as the straight run does;
#   - roles.ref.offload is refused, naming the actor.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_tp
S=$tp_sft
steps=3
moved() { # METRICS PER_PARAM_RATIO (AdamW bytes / gradient bytes): every iteration moved, both ways
  python3 - "$1" "$2" <<'PY' || fail "$1: the offload metrics are not as expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l]
ratio = float(sys.argv[2])
assert rows, "no iterations"
for r in rows:
    o = r.get("offload")
    assert o, f"iteration {r.get('iteration')}: no offload metrics"
    assert o["bytes"] > 0 and o["bytes"] == ratio * o["grad_bytes"], o
    assert o["reload_bytes"] == o["bytes"] and o["time_s"] >= 0 and o["reload_time_s"] >= 0, o
    print(f"iteration {r['iteration']}: offload {o['bytes']} B AdamW + {o['grad_bytes']} B gradients, {o['time_s']*1e3:.3f} ms out, {o['reload_time_s']*1e3:.3f} ms back")
PY
}
none_moved() { ! grep -q '"offload"' "$1" || fail "$1: offload metrics with offload off"; }
alike() { # A B WHAT
  same_samples "$1" "$2" "$3"
  same_metrics "$1/metrics.jsonl" "$2/metrics.jsonl" 1e-6 1e-2 || fail "$3: offload on and off do not train alike"
}

tp_grpo "$work/on1" roles.actor.workers=1
tp_grpo "$work/off1" roles.actor.workers=1 roles.actor.offload=false
moved "$work/on1/metrics.jsonl" 2
none_moved "$work/off1/metrics.jsonl"
alike "$work/on1" "$work/off1" "1 worker"

hy="--workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.tp=1"
tp_grpo "$work/on_hy" $hy
tp_grpo "$work/off_hy" $hy roles.actor.offload=false
grep -q "actor \[0 1 2 3\] tp 2 x pp 2 x dp 1, gen \[0 1 2 3\]," "$work/on_hy.log" ||
  fail "not at TP 2 x PP 2 generating at TP 1: $(head -1 "$work/on_hy.log")"
moved "$work/on_hy/metrics.jsonl" 2
none_moved "$work/off_hy/metrics.jsonl"
alike "$work/on_hy" "$work/off_hy" "TP 2 x PP 2 -> TP 1"

tp_grpo "$work/on_z1" roles.actor.workers=2 roles.actor.layout.zero=1
tp_grpo "$work/off_z1" roles.actor.workers=2 roles.actor.layout.zero=1 roles.actor.offload=false
moved "$work/on_z1/metrics.jsonl" 1
same_metrics "$work/on_z1/metrics.jsonl" "$work/off_z1/metrics.jsonl" 1e-6 1e-2 || fail "ZeRO-1: offload on does not train as off"

# a checkpoint while the actor is away (the sync comes after its step): its state back first;
# resumed with offload off (a harmless change), the run ends as the straight one
tp_grpo "$work/res" roles.actor.workers=1 trainer.save_freq=1 --stop-after 2
tp_grpo "$work/res" roles.actor.workers=1 roles.actor.offload=false --resume
grep -q "resuming with roles.actor.offload changed (harmless): (absent) -> false" "$work/res.log" ||
  { cat "$work/res.log" >&2; fail "the change of roles.actor.offload is not logged as harmless"; }
same_samples "$work/on1" "$work/res" "resumed with offload off"
python3 - "$work/res/metrics.jsonl" <<'PY' || fail "checkpointing every iteration: the actor did not go away again after each checkpoint"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l]
assert [r["iteration"] for r in rows] == [1, 2, 3], rows
for r in rows[:2]:  # offload on: away again after each checkpoint, so every step reloads
    assert r["offload"]["reload_bytes"] == r["offload"]["bytes"] > 0, r["offload"]
assert "offload" not in rows[2], rows[2]  # resumed with offload off
PY
same_metrics "$work/on1/metrics.jsonl" "$work/res/metrics.jsonl" 1e-6 1e-2 || fail "resumed with offload off: not the straight run"

if "$bin" run "$src/examples/grpo.yaml" $(small_run "$work/bad") trainer.steps=1 roles.actor.model=$S roles.ref.model=$S \
  roles.ref.offload=true --no-progress > "$work/bad.log" 2>&1; then fail "roles.ref.offload was accepted"; fi
grep -q "'roles.ref.offload' is only for the actor" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "roles.ref.offload: no clear error"; }
echo "ok"
