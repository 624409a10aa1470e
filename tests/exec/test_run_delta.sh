#!/usr/bin/env bash
# Delta weight syncs in `fuseflow run` (roles.actor.rollout.sync_delta, docs/run.md "Weight
# sync"), on the tiny SFT model of test_run_tp.sh: GRPO trained at TP 2 generating on a pool of
# its own (2 workers, DP 2), bf16 and fp32 on the wire. With sync_delta the pool's copy must be
# the dense sync's bit for bit, so the samples equal the dense runs' exactly (the metrics within 1e-6: the trainer's
# TP sums vary in the last bits from run to run); each
# iteration's metrics carry weight_sync.delta (the share of compared elements that changed,
# the bytes saved): the first sync has nothing to compare against, later ones changed a part
# in bf16 and nearly all in fp32 (printed: the measured fractions). sync_delta on the actor's
# own workers (no pool) is refused before any worker starts, naming the key and why.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_tp
S=$tp_sft
steps=4
lr=${FF_DELTA_LR:-1e-3}

grpo() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model=$S roles.ref.model=$S graph.train_actor.mini_batch_size=4 \
    graph.train_actor.micro_batch_size=4 roles.actor.optim.lr=$lr roles.actor.optim.eps=1e-5 --val-limit 16 --no-progress \
    --dump-samples roles.actor.workers=2 roles.actor.layout.tp=2 roles.actor.rollout.workers=2 "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "grpo $* did not run"; }
}
for dt in bf16 fp32; do
  grpo "$work/dense_$dt" roles.actor.rollout.sync_dtype=$dt
  grpo "$work/delta_$dt" roles.actor.rollout.sync_dtype=$dt roles.actor.rollout.sync_delta=true
  cmp -s "$work/dense_$dt/samples.jsonl" "$work/delta_$dt/samples.jsonl" ||
    { diff "$work/dense_$dt/samples.jsonl" "$work/delta_$dt/samples.jsonl" | head -5 >&2; fail "$dt: the delta sync's samples differ"; }
done
python3 - "$work" "$lr" <<'PY' || fail "the delta syncs' metrics are wrong"
import json, sys
def lines(run): return [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl") if "samples" in l]
for dt in ["bf16", "fp32"]:
    dense, delta = lines(f"dense_{dt}"), lines(f"delta_{dt}")
    assert len(dense) == len(delta) == 4, (dt, len(dense), len(delta))
    for a, b in zip(dense, delta):
        for k in ["reward_mean", "response_length", "kl", "acc"]:  # kl: the trainer's TP sums, within 1e-6
            assert abs(a.get(k, 0) - b.get(k, 0)) <= 1e-6 + 1e-6 * abs(a.get(k, 0)), (dt, k, a.get(k), b.get(k))
        assert "delta" not in a["weight_sync"], a["weight_sync"]
        d = b["weight_sync"]["delta"]
        assert b["weight_sync"]["bytes"] + d["bytes_saved"] == a["weight_sync"]["bytes"], (dt, a["weight_sync"], b["weight_sync"])
    fr = [l["weight_sync"]["delta"]["changed_fraction"] for l in delta]
    saved = [l["weight_sync"]["delta"]["bytes_saved"] for l in delta]
    assert fr[0] == 1.0 and saved[0] < 0, (dt, fr, saved)  # the first sync: dense, headers on top
    if dt == "bf16": assert all(0 < f < 1 for f in fr[1:]), fr
    else: assert all(f > 0.5 for f in fr[1:]), fr
    print(f"{dt} (lr {sys.argv[2]}): changed fraction per sync {[round(f, 4) for f in fr]}, bytes saved {saved} "
          f"of {delta[0]['weight_sync']['bytes'] + saved[0]} B per sync dense")
PY
out=$work/bad
if "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=1 roles.ref.model=$S roles.actor.model=$S \
     roles.actor.rollout.sync_delta=true --no-progress > "$work/bad.log" 2>&1; then
  fail "sync_delta without a pool was not refused"
fi
grep -qF "sync_delta" "$work/bad.log" && grep -qF "rollout.workers" "$work/bad.log" ||
  { cat "$work/bad.log" >&2; fail "the refusal of sync_delta without a pool does not name the key and what to do"; }
[[ ! -e "$out" ]] || fail "workers started before the refusal of sync_delta"
echo "ok"
