#!/usr/bin/env bash
# `migrate: auto` in `fuseflow run` (docs/run.md "Migration"): GRPO on the repeat task (a random
# tiny model, generation on 2 workers of its own), 3 iterations with auto against the same run
# with migration off:
#   - the same responses (samples.jsonl byte for byte) and metrics within 1e-6 + 1e-4 (whatever
#     auto decides: it moves samples exactly, docs/run.md "Exactness");
#   - iteration 1 has nothing measured: threshold 0, predicted_s and saved_s null, no
#     time.rollout_sim; from iteration 2 the simulation's figures: time.rollout_sim {serial_s,
#     fused_s, migrate_s, rt, survivors, step_jobs} with fused_s <= serial_s, migrate.threshold its rt,
#     predicted_s its migrate_s, saved_s = fused_s - predicted_s >= 0 (and at least 1% of
#     fused_s when a threshold was picked), a threshold from the simulator's sweep or 0;
#   - step_jobs (the rl.generate jobs the decode step fit has read) grows with every iteration
#     that did not migrate (all its jobs) and never shrinks; one that migrated is read up to
#     the decision without the sources' jobs (which of them ended by then is timing: the exact
#     counts are in test_rollout_fit.c), so a run that always migrates keeps fitting;
#   - time.rollout_stage (generation's first dispatch to the last inference result) in every
#     iteration, of both runs;
#   - the choice logged once per iteration at debug level (FF_LOG=debug).
# Which threshold auto picks depends on the measured costs (timing); the decision itself on
# given costs: tests/exec/test_rollout_fit.c.
source "$(dirname "$0")/lib.sh"
prepare_inputs
prepare_repeat_run 3

run() { # OUT [overrides...]
  local out=$1; shift
  FF_LOG=debug "$bin" run "$work/run.yaml" trainer.out_dir="$out" --threads 1 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "run $* failed"; }
}
strip() { python3 - "$1" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    for k in ("time", "memory", "weight_sync", "migrate", "eval_time_s"): o.pop(k, None)
    print(json.dumps(o, sort_keys=True))
PY
}

run "$work/off"
run "$work/auto" graph.rollout.migrate=auto
cmp -s "$work/auto/samples.jsonl" "$work/off/samples.jsonl" ||
  { diff "$work/auto/samples.jsonl" "$work/off/samples.jsonl" | head -5 >&2; fail "auto: other responses than without migration"; }
strip "$work/auto/metrics.jsonl" > "$work/auto.m" && strip "$work/off/metrics.jsonl" > "$work/off.m"
same_metrics "$work/auto.m" "$work/off.m" 1e-6 1e-4 || fail "auto: other metrics than without migration"

python3 - "$work/auto/metrics.jsonl" "$work/off/metrics.jsonl" <<'PY' || fail "auto's metrics"
import json, sys
grid = {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5}
auto = [json.loads(l) for l in open(sys.argv[1])]
off = [json.loads(l) for l in open(sys.argv[2])]
assert len(auto) == 3 == len(off), (len(auto), len(off))
for o in auto + off:
    assert o["time"]["rollout_stage"] > 0, o["time"]
m1 = auto[0]["migrate"]
assert m1["threshold"] == 0 and m1["predicted_s"] is None and m1["saved_s"] is None and m1["moved"] == 0, m1
assert "rollout_sim" not in auto[0]["time"], auto[0]["time"]
for o in auto[1:]:
    m, s = o["migrate"], o["time"]["rollout_sim"]
    assert set(s) == {"serial_s", "fused_s", "migrate_s", "rt", "survivors", "step_jobs"}, s
    assert 0 < s["fused_s"] <= s["serial_s"] + 1e-12 and 0 < s["migrate_s"] <= s["fused_s"] + 1e-12, s
    assert m["threshold"] == s["rt"] and abs(m["predicted_s"] - s["migrate_s"]) < 1e-12, (m, s)
    assert abs(m["saved_s"] - (s["fused_s"] - s["migrate_s"])) < 1e-9 and m["saved_s"] >= 0, (m, s)
    if m["threshold"] > 0:
        assert m["threshold"] in grid and s["survivors"] == 1 and m["saved_s"] >= 0.01 * s["fused_s"] - 1e-12, (m, s)
    else:
        assert s["survivors"] == 0 and m["moved"] == 0 and m["saved_s"] == 0, (m, s)
# the step fit's jobs: some after iteration 1, more after each iteration without a migration
for run in (auto, off):
    for prev, o in zip(run[1:], run[2:]):
        a, b = prev["time"]["rollout_sim"]["step_jobs"], o["time"]["rollout_sim"]["step_jobs"]
        assert 0 < a <= b, (a, b)
        if prev.get("migrate", {}).get("moved", 0) == 0:
            assert b > a, ("an iteration without a migration was not read", a, b)
# with migration off the simulation still predicts (the stage serial, fused and with auto)
for o in off[1:]:
    assert o["time"]["rollout_sim"]["fused_s"] > 0 and "migrate" not in o, o
PY
n=$(grep -c "migrate auto: R_t" "$work/auto.log" || true)
[[ $n -eq 2 ]] || { cat "$work/auto.log" >&2; fail "auto's choice logged $n times in iterations 2-3, not once each"; }
grep -q "iteration 1: migrate: no costs measured yet" "$work/auto.log" || fail "iteration 1's default not logged"
echo "ok"
