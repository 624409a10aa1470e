#!/usr/bin/env bash
# --resume continues a run as if it had not stopped. PPO (actor, critic with its optimizer,
# adaptive KL coefficient, data order) from a briefly fine-tuned model runs 4 iterations
# straight, and again stopped after 2 (--stop-after) and resumed. Sampled tokens, rewards,
# accuracy, response lengths and counts are equal exactly; float metrics agree to
# 1e-6 + 1e-4 relative. What differs is rounding in the last bits of log-probs: continuous
# batching groups requests (and micro-batches samples) by arrival time, and the CPU
# kernels round differently for different batch shapes, so two uninterrupted runs differ
# the same way (measured: 1e-7 relative, 1e-5 on sums that cancel such as pg_loss). That
# the checkpoint restores weights and optimizer state bit for bit is checked by
# tests/exec/test_rlworker.c.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_sft_small
M=$cache/sft_small/final
cfg=$src/examples/ppo.yaml
args() { # OUT
  echo "$(small_run "$1") trainer.steps=4 trainer.test_freq=2 trainer.save_freq=0 data.train_batch_size=8" \
       "roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M roles.actor.workers=1 roles.actor.optim.lr=1e-4" \
       "graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=4 graph.train_critic.mini_batch_size=4" \
       "graph.train_critic.micro_batch_size=4 graph.rollout.n=2 --val-limit 40 --no-progress"
}
"$bin" run "$cfg" $(args "$work/a") > "$work/a.log" 2>&1 || { cat "$work/a.log" >&2; fail "the straight run failed"; }
"$bin" run "$cfg" $(args "$work/b") --stop-after 2 > "$work/b1.log" 2>&1 || { cat "$work/b1.log" >&2; fail "the first half failed"; }
grep -q "stopped after iteration 2" "$work/b1.log" || fail "--stop-after 2 did not stop"
[[ -d "$work/b/checkpoints/step-00000002" ]] || fail "no checkpoint at iteration 2"
"$bin" run "$cfg" $(args "$work/b") --resume > "$work/b2.log" 2>&1 || { cat "$work/b2.log" >&2; fail "the resumed run failed"; }
[[ $(iterations "$work/b/metrics.jsonl") == 4 ]] || fail "the resumed run's metrics.jsonl does not hold 4 iterations"
python3 - "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY' || fail "the resumed run sampled differently"
import json, sys
A, B = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
exact = ["iteration", "samples", "reward_mean", "acc", "response_length", "actor_steps", "critic_steps", "eval_acc"]
bad = [(a["iteration"], k, a.get(k), b.get(k)) for a, b in zip(A, B) for k in exact if a.get(k) != b.get(k)]
assert len(A) == len(B) and not bad, bad
PY
same_metrics "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" 1e-6 1e-4 || fail "the resumed run's metrics differ"
# each start of the workers reports their memory once: in the run log, and in the first
# metrics line it writes (the evaluation before training, the first iteration after a resume)
for log in a b1 b2; do
  grep -qE "^run: rank 0 holds [0-9.]+ [KMG]iB after loading \(peak [0-9.]+ [KMG]iB\); its roles need [0-9.]+ [KMG]iB: actor .* weights \+ .* gradients \+ .* optimizer, gen .* weights( \([^)]*in place\))?, critic .* weights \+ .* gradients \+ .* optimizer, ref .* weights$" \
    "$work/$log.log" || { cat "$work/$log.log" >&2; fail "$log: no memory line for rank 0 after loading"; }
done
python3 - "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY' || fail "the memory reports in metrics.jsonl are wrong"
import json, sys
A, B = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [i for i, o in enumerate(A) if "memory" in o] == [0], "a: memory only in the first line"
assert [o["iteration"] for o in B if "memory" in o] == [0, 3], "b: memory in the first line of each start"
for o in (A[0], B[0], B[3]):
    (m,) = o["memory"]  # one rank, hosting every role but a reward model
    r = m["roles"]
    assert m["rank"] == 0 and sorted(r) == ["actor", "critic", "gen", "ref"], m
    p = r["actor"]["params_bytes"]
    assert p > 0 and r["gen"]["params_bytes"] == r["ref"]["params_bytes"] == p, m
    for k in ("actor", "critic"):  # trained: gradients and two moments
        assert r[k]["grads_bytes"] == r[k]["params_bytes"] and r[k]["optimizer_bytes"] == 2 * r[k]["params_bytes"], m
    for k in ("gen", "ref"):  # inference only
        assert r[k]["grads_bytes"] == 0 and r[k]["optimizer_bytes"] == 0, m
    held = sum(v["params_bytes"] for v in r.values())
    assert m["peak_bytes"] >= m["resident_bytes"] >= held, m
PY
echo ok
