#!/usr/bin/env bash
# roles.ref.weights: on_demand (docs/run.md "Weights on demand"): the reference model's weights
# wait in host memory on its workers and are copied onto the backend for its inference. GRPO on
# the repeat task in the RLHFuse setting (a random tiny model; actor, its generation and the
# reference colocated on 2 workers), migration forced at once (rl.migrate_out tells the freed
# source to prefetch the reference's weights on a helper thread), against the same run with the
# weights resident:
#   - the same responses (samples.jsonl byte for byte) and the metrics the reference's
#     log-probs feed bit for bit (kl_loss, and grad_norm and entropy of the steps it drives: the
#     random model's rewards are all 0, so the KL term alone moves the actor), under the serial
#     and the fused schedule. The rest within 1e-6 + 1e-4: the trainer's micro-batches group
#     the samples by completion, which is timing (docs/run.md "Determinism"), on either side;
#   - every iteration's weights.ref: nothing of the reference on the backend when a generation
#     job began (resident_generating 0), its whole weights during each of its inference subtasks
#     (resident_inferring = the bytes of one load, > 0), each load's bytes;
#   - the overlap: with the serial schedule the reference's log-probs come after the whole
#     generation, so a prefetch sent with the move is done by then: prefetched loads and
#     hidden_s > 0 over the run; with migration off nothing is told ahead: every load is
#     waited for (prefetched 0, hidden_s 0);
#   - the trace: one "load ref weights" slice per load on the "rank R: weights" tracks;
#   - refused naming the key: a trained role on demand, a value that is neither word.
# The copy itself, bit for bit, the backend's counters and a load out of memory:
# tests/model/test_model_ondemand.c.
source "$(dirname "$0")/lib.sh"
prepare_inputs
prepare_repeat_run 4 # 4 iterations: some move even where a loaded machine lets a source end its samples before a move reaches it
rlhfuse="roles.actor.workers=2 roles.actor.rollout.workers=0 graph.train_actor.micro_batch_size=8 graph.rollout.migrate=1.0"

run() { # OUT [overrides...]
  local out=$1; shift
  # shellcheck disable=SC2086
  "$bin" run "$work/run.yaml" trainer.out_dir="$out" $rlhfuse --threads 1 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "run $* failed"; }
}
# A's and B's metrics: KEYS bit for bit, the rest as same_metrics
alike() { # A B WHAT
  cmp -s "$1/samples.jsonl" "$2/samples.jsonl" || { diff "$1/samples.jsonl" "$2/samples.jsonl" | head -5 >&2; fail "$3: other responses"; }
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY' || fail "$3: the reference's metrics are not bit for bit"
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"samples"' in l] for p in sys.argv[1:3])
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("kl_loss", "grad_norm", "entropy", "reward_mean", "response_length"):
        assert x[k] == y[k], (x["iteration"], k, x[k], y[k])
PY
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$work/a.m" "$work/b.m" <<'PY'
import json, sys
for src, dst in ((sys.argv[1], sys.argv[3]), (sys.argv[2], sys.argv[4])):
    with open(dst, "w") as f:
        for l in open(src):
            o = json.loads(l)
            for k in ("weights", "migrate"): o.pop(k, None)
            f.write(json.dumps(o) + "\n")
PY
  same_metrics "$work/a.m" "$work/b.m" 1e-6 1e-4 || fail "$3: other metrics"
}
# weights.ref over the iterations: the memory per iteration, PREFETCH (some|none) over the run
loads() { # OUT PREFETCH
  python3 - "$1/metrics.jsonl" "$2" <<'PY' || fail "$1: weights.ref is not as expected"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples"' in l]
assert len(rows) == 4, len(rows)
pre = hid = 0
for r in rows:
    w = r["weights"]["ref"]
    assert w["loads"] >= 1 and w["bytes"] > 0 and w["bytes"] % w["loads"] == 0, w
    assert w["resident_generating"] == 0, w                     # absent while generating
    assert w["resident_inferring"] == w["bytes"] // w["loads"], w  # all of it during its inference
    assert w["load_s"] > 0 and 0 <= w["hidden_s"] <= w["load_s"] + 1e-9, w
    pre += w["prefetched"]; hid += w["hidden_s"]
    print(f"iteration {r['iteration']}: {w['loads']} loads ({w['prefetched']} prefetched), {w['bytes']} B, "
          f"{w['load_s']*1e3:.3f} ms, {w['hidden_s']*1e3:.3f} ms hidden")
if sys.argv[2] == "some":
    assert pre > 0 and hid > 0, (pre, hid)
else:
    assert pre == 0 and hid == 0, (pre, hid)
PY
}

for sched in serial fused; do
  run "$work/res_$sched" trainer.schedule=$sched
  run "$work/od_$sched" trainer.schedule=$sched roles.ref.weights=on_demand --trace "$work/trace_$sched.json"
  grep -q '"weights"' "$work/res_$sched/metrics.jsonl" && fail "$sched: weights metrics with the weights resident"
  [[ $(python3 -c 'import json,sys; print(sum(json.loads(l)["migrate"]["moved"] for l in open(sys.argv[1])))' "$work/od_$sched/metrics.jsonl") -gt 0 ]] ||
    fail "$sched: nothing migrated"
  alike "$work/od_$sched" "$work/res_$sched" "on_demand against resident ($sched)"
done
loads "$work/od_serial" some
python3 - "$work/trace_serial.json" "$work/od_serial/metrics.jsonl" <<'PY' || fail "the trace has no load slice per load"
import json, sys
t = json.load(open(sys.argv[1])); ev = t["traceEvents"] if isinstance(t, dict) else t
tracks = {(e["pid"], e["tid"]) for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"
          and e["args"]["name"].endswith(": weights")}
sl = [e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("load ref weights")]
n = sum(json.loads(l)["weights"]["ref"]["loads"] for l in open(sys.argv[2]) if '"samples"' in l)
assert tracks and len(sl) == n and all((e["pid"], e["tid"]) in tracks for e in sl), (len(tracks), len(sl), n)
assert any("prefetch" in e["name"] for e in sl)
PY

# nothing told ahead without a migration: every load waited for
run "$work/od_off" trainer.schedule=serial roles.ref.weights=on_demand graph.rollout.migrate=off
loads "$work/od_off" none

run_refused "the actor on demand" "'roles.actor.weights: on_demand' is only for the frozen roles (ref, reward)" roles.actor.weights=on_demand
run_refused "a word" "'roles.ref.weights' must be one of: resident, on_demand" roles.ref.weights=sometimes
echo "ok"
