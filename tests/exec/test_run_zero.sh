#!/usr/bin/env bash
# ZeRO-1 in `fuseflow run`: PPO (actor and critic colocated on 2 DP workers) from a briefly
# fine-tuned model, 4 iterations at roles.*.layout.zero: 0 and at 1. Checked:
#   - the same run: sampled tokens, rewards, accuracy, lengths and counts exactly, float
#     metrics within 1e-6 + 1e-4 relative, and the final checkpoints' weights and optimizer
#     state within 1e-5. Not bit for bit: two zero 0 runs already differ in the last bits
#     (continuous batching groups requests by arrival time and the kernels round by batch
#     shape, test_run_resume.sh; measured: 4 of 8 zero 0 runs differ from the others by up
#     to 4e-7 in the weights), and zero 1 runs fall among the same few outcomes. That the
#     sharded step itself is zero 0's bit for bit is tests/model/test_model_zero.c's and
#     tests/roles/test_trainer.c's;
#   - each rank's optimizer bytes (the memory report) are its half of zero 0's, the two
#     halves adding up to zero 0's 8 bytes per parameter;
#   - resume across stages: zero 1 stopped after 2 iterations and resumed at zero 0, and
#     zero 0 resumed at zero 1 (roles.*.layout is a harmless key), give the straight run;
#   - roles.actor.layout.zero: 2 is refused with "ZeRO-2/3 are not built".
# The step times of both stages are printed (rl.train subtasks from --trace).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_sft_small
M=$cache/sft_small/final
cfg=$src/examples/ppo.yaml
args() { # OUT ZERO
  echo "$(small_run "$1") trainer.steps=4 trainer.test_freq=2 trainer.save_freq=2 data.train_batch_size=8" \
       "roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M roles.actor.workers=2 roles.actor.optim.lr=1e-4" \
       "roles.actor.layout.zero=$2 roles.critic.layout.zero=$2" \
       "graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=4 graph.train_critic.mini_batch_size=4" \
       "graph.train_critic.micro_batch_size=4 graph.rollout.n=2 --val-limit 40 --no-progress"
}
run_ff() { # NAME ARGS...
  local name=$1; shift
  "$bin" run "$cfg" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; fail "$name failed"; }
}
run_ff z0 $(args "$work/z0" 0) --trace "$work/z0.trace.json"
run_ff z1 $(args "$work/z1" 1) --trace "$work/z1.trace.json"
run_ff r10a $(args "$work/r10" 1) --stop-after 2
run_ff r10b $(args "$work/r10" 0) --resume
run_ff r01a $(args "$work/r01" 0) --stop-after 2
run_ff r01b $(args "$work/r01" 1) --resume
grep -q "resuming with roles.actor.layout.zero changed (harmless): 1 -> 0" "$work/r10b.log" || { cat "$work/r10b.log" >&2; fail "the change of stage is not logged"; }

for b in z1 r10 r01; do
  [[ $(iterations "$work/$b/metrics.jsonl") == 4 ]] || fail "$b: metrics.jsonl does not hold 4 iterations"
  python3 - "$work/z0/metrics.jsonl" "$work/$b/metrics.jsonl" <<'PY' || fail "$b sampled differently from zero 0"
import json, sys
A, B = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
exact = ["iteration", "samples", "reward_mean", "acc", "response_length", "actor_steps", "critic_steps", "eval_acc"]
bad = [(a["iteration"], k, a.get(k), b.get(k)) for a, b in zip(A, B) for k in exact if a.get(k) != b.get(k)]
assert len(A) == len(B) and not bad, bad
PY
  same_metrics "$work/z0/metrics.jsonl" "$work/$b/metrics.jsonl" 1e-6 1e-4 || fail "$b: the metrics differ from zero 0's"
done

# the last checkpoints: the same weights and optimizer state (whole tensors at either stage)
python3 - "$work/z0/checkpoints/step-00000004" "$work/z1/checkpoints/step-00000004" \
  "$work/r10/checkpoints/step-00000004" "$work/r01/checkpoints/step-00000004" <<'PY' || fail "the checkpoints differ"
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (path, k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b])
    return out
files = ["actor/model.safetensors", "critic/model.safetensors", "actor.optim.safetensors", "critic.optim.safetensors"]
ref = sys.argv[1]
for other in sys.argv[2:]:
    for f in files:
        A, B = load(f"{ref}/{f}"), load(f"{other}/{f}")
        assert sorted(A) == sorted(B), (other, f)
        worst = max((abs(x - y) for k in A for x, y in zip(A[k], B[k])), default=0)
        assert worst <= 1e-5, (other, f, worst)
        print(f"{other.split('/')[-3]} {f}: max difference {worst:.3g}")
PY

# memory: each rank of the zero 1 run holds half of the optimizer state
python3 - "$work/z0/metrics.jsonl" "$work/z1/metrics.jsonl" <<'PY' || fail "the optimizer bytes are not split"
import json, sys
A, B = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
ma, mb = A[0]["memory"], B[0]["memory"]
assert [m["rank"] for m in ma] == [m["rank"] for m in mb] == [0, 1], (ma, mb)
for role in ("actor", "critic"):
    full = [m["roles"][role]["optimizer_bytes"] for m in ma]
    half = [m["roles"][role]["optimizer_bytes"] for m in mb]
    params = ma[0]["roles"][role]["params_bytes"]
    assert full == [2 * params] * 2, (role, full, params)
    assert sum(half) == 2 * params and max(half) <= params + 8 * 4096, (role, half, params)
    print(f"{role}: optimizer bytes per rank {full[0]} at zero 0, {half} at zero 1")
PY

# step times from the traces: the mean of the actor's rl.train subtasks
python3 - "$work/z0.trace.json" "$work/z1.trace.json" <<'PY' || fail "no train steps in the traces"
import json, sys
for z, path in enumerate(sys.argv[1:3]):
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    d = [e["dur"] for e in ev if e.get("ph") == "X" and "train_actor step" in e.get("name", "")]
    assert d, path
    print(f"zero {z}: {len(d)} actor steps, mean {sum(d) / len(d) / 1000:.2f} ms")
PY

# ZeRO-2/3 are refused before anything starts
rc=0
"$bin" run "$cfg" $(args "$work/z2" 2) > "$work/z2.log" 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "ZeRO-2/3 are not built" "$work/z2.log" || { cat "$work/z2.log" >&2; fail "zero 2 was not refused"; }
echo ok
