#!/usr/bin/env bash
# bf16 weights of the roles that only infer (docs/run.md "bf16 weights"): `roles.ref.dtype:
# bf16` and `roles.actor.rollout.dtype: bf16`, GRPO on the repeat task with a KL term (the
# reference colocated with the actor, generation on a pool of 2 workers that a resharding sync
# writes into, then on the actor's own worker, where the copy is a copy, not a view):
#   - the runs finish; the memory report gives the reference and the generating copies about
#     half the actor's weight bytes (bf16 matrices, fp32 norms), the fp32 run the same bytes;
#   - the KL term sees the rounding: the fp32 reference starts equal to the actor (KL about 0,
#     below 1e-9), the bf16 one near it (above that, below 1e-4);
#   - with `roles.ref.weights: on_demand` each load of the bf16 reference moves half the bytes;
#   - `roles.actor.rollout.kv_dtype: bf16` (the KV cache in bf16) runs, its weights fp32, and
#     its rollout log-probs move off the reference's full forward (|kl| of the first iteration,
#     0 with identical weights: below 1e-7 with the fp32 cache, above with bf16);
#   - sharded: PPO at TP 2 x PP 2 on 4 workers with every bf16 key runs, each rank's reference
#     shard half its actor shard;
#   - refused before any worker starts, naming the key: dtype on a trained role, bf16 generation
#     with sync_delta, a word that is no dtype (weights or KV cache).
# The numbers themselves (bit for bit those of an fp32 model on the rounded weights):
# tests/model/test_model_bf16.c.
source "$(dirname "$0")/lib.sh"
prepare_inputs
prepare_repeat_run 2
run() { # OUT [overrides...]
  local out=$1; shift
  "$bin" run "$work/run.yaml" trainer.out_dir="$out" --threads 1 --no-progress "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "run $* failed"; }
}
run "$work/fp32"
run "$work/pool" roles.ref.dtype=bf16 roles.actor.rollout.dtype=bf16
run "$work/local" roles.ref.dtype=bf16 roles.actor.rollout.dtype=bf16 roles.actor.rollout.workers=0
run "$work/kv" roles.actor.rollout.kv_dtype=bf16
run "$work/od32" roles.ref.weights=on_demand
run "$work/od16" roles.ref.weights=on_demand roles.ref.dtype=bf16
grep -qE "^run: rank 0 holds .* ref [0-9.]+ KiB weights$" "$work/pool.log" || { cat "$work/pool.log" >&2; fail "no memory line"; }

python3 - "$work" <<'PY' || fail "the bf16 runs' memory or KL are wrong"
import json, sys
def lines(run):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
for run in ("fp32", "pool", "local", "kv"):
    L = lines(run)
    it = [o for o in L if "samples" in o]
    assert len(it) == 2, (run, len(it))
    mem = next(o["memory"] for o in L if "memory" in o)
    actor = next(r["roles"]["actor"]["params_bytes"] for r in mem if "actor" in r["roles"])
    for r in mem:
        for role in ("ref", "gen"):
            if role not in r["roles"]:
                continue
            o = r["roles"][role]
            share = o["params_bytes"] / actor
            print(f"{run}: rank {r['rank']} {role} holds {o['params_bytes']} bytes of weights, {share:.3f} of the actor's")
            if run in ("fp32", "kv"):
                assert o["params_bytes"] == actor, (run, r)
            else:
                assert 0.5 <= share < 0.51 and "in_place_bytes" not in o, (run, r)
    if run == "kv":  # the rollout's log-probs (old_logprob) against the reference's full forward
        kv, ref = abs(it[0]["kl"]), abs(next(o for o in lines("fp32") if "samples" in o)["kl"])
        print(f"kv: first iteration's |kl| (old_logprob - ref_logprob) {kv:.3g}, with the fp32 cache {ref:.3g}")
        assert ref < 1e-7 < kv, (ref, kv)
        continue
    kl = it[0]["kl_loss"]
    print(f"{run}: first iteration's kl_loss {kl:.3g}")
    assert (kl < 1e-9) if run == "fp32" else (1e-9 < kl < 1e-4), (run, kl)
PY

# on demand, the reference's host copy and each load are the bf16 bytes
python3 - "$work/od32/metrics.jsonl" "$work/od16/metrics.jsonl" <<'PY' || fail "bf16 on-demand loads are not half the bytes"
import json, sys
def per_load(p):
    w = [json.loads(l)["weights"]["ref"] for l in open(p) if '"samples"' in l]
    assert w and all(x["loads"] >= 1 for x in w), w
    return {x["bytes"] // x["loads"] for x in w}, {x["resident_inferring"] for x in w}
(b32,), (r32,) = per_load(sys.argv[1])
(b16,), (r16,) = per_load(sys.argv[2])
print(f"on demand: a load of the reference is {b16} bytes in bf16, {b32} in fp32 ({b16 / b32:.3f})")
assert 0.5 <= b16 / b32 < 0.51 and r16 == b16 and r32 == b32, (b32, b16, r32, r16)
PY

# sharded: PPO at TP 2 x PP 2 on 4 workers (the reference scored through the pipeline, generation
# at TP 2 x DP 2, each weight sync resharding into the bf16 copy) with every bf16 key at once
prepare_tp
"$bin" run "$src/examples/ppo.yaml" $(small_run "$work/tp_pp") trainer.steps=2 trainer.test_freq=0 trainer.save_freq=0 \
  data.train_batch_size=8 graph.rollout.n=4 roles.actor.model="$tp_sft" roles.ref.model="$tp_sft" roles.critic.model="$tp_sft" \
  graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=4 graph.train_critic.mini_batch_size=4 \
  graph.train_critic.micro_batch_size=4 graph.ref_logprob.micro_batch_size=4 graph.values.micro_batch_size=4 \
  roles.actor.workers=4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.ref.dtype=bf16 roles.actor.rollout.dtype=bf16 \
  roles.actor.rollout.kv_dtype=bf16 --no-progress > "$work/tp_pp.log" 2>&1 || { cat "$work/tp_pp.log" >&2; fail "TP 2 x PP 2 with bf16 did not run"; }
python3 - "$work/tp_pp/metrics.jsonl" <<'PY' || fail "TP 2 x PP 2: the bf16 reference's shards are not half the actor's"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
assert sum("samples" in o for o in L) == 2, L
mem = next(o["memory"] for o in L if "memory" in o)
assert len(mem) == 4, mem
for r in mem:  # the reference shares the actor's layout: its shard, half the bytes
    share = r["roles"]["ref"]["params_bytes"] / r["roles"]["actor"]["params_bytes"]
    assert 0.5 <= share < 0.52, (r["rank"], share)
print("TP 2 x PP 2: each rank's bf16 reference shard is", [round(r["roles"]["ref"]["params_bytes"] / r["roles"]["actor"]["params_bytes"], 3) for r in mem], "of its actor shard")
PY

run_refused "dtype on the actor" "'roles.actor.dtype: bf16' is only for the frozen roles (ref, reward)" roles.actor.dtype=bf16
run_refused "bf16 generation with sync_delta" "with 'dtype: bf16' they are rounded where they are stored" \
  roles.actor.rollout.dtype=bf16 roles.actor.rollout.sync_delta=true
run_refused "a word" "'roles.ref.dtype' must be one of: fp32, bf16" roles.ref.dtype=int8
run_refused "a KV word" "'roles.actor.rollout.kv_dtype' must be one of: fp32, bf16" roles.actor.rollout.kv_dtype=fp8
grep -q "started" "$work/bad.log" 2> /dev/null && fail "workers started before a refusal"
echo "ok"
