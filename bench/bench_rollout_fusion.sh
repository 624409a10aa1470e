#!/usr/bin/env bash
# bench_rollout_fusion: RLHFuse's generation + inference fusion with long-tail migration
# (issue 12, docs/run.md "Migration") measured through `fuseflow run` on the long-tail
# workload: the stage time (time.rollout_stage: the generation's first dispatch to the last
# inference result) three ways, same seeds, same samples (migration moves them exactly):
#   serial   trainer.schedule serial, migrate off: all generation, then the inference
#   fused    schedule fused, migrate off: a finished sample's inference starts at once
#   migrate  schedule fused, migrate auto: R_t and survivors from the simulator on the run's
#            measured costs (its first iteration measures, so it is left out of every mean)
# on 2 and on 4 generation workers at 1 thread each, with the simulator's prediction of each
# (time.rollout_sim, from the costs the run measured before that iteration) beside it.
#
# Workload: `fuseflow dataset repeat` (repeat counts log-normal, median 8, p99 about 10x),
# a tiny model (1M parameters) fine-tuned 150 SFT steps as examples/grpo_repeat.yaml's header
# says (cached under BUILD/bench_cache/rollout_fusion), whose response lengths then follow the
# counts' tail. PPO with a critic: the inference the freed workers take is the critic's values
# and the reference log-probs; actor, critic and reference colocated on the generation
# workers (the RLHFuse setting), 32 prompts x 8 responses per iteration.
#
# Usage: build/bench_rollout_fusion [--iterations N (default 8)] [--workers "2 4"]
# (CMake writes build/bench_rollout_fusion, which runs this with the built fuseflow.)
# The last line is the headline on 2 workers:
#   rollout_fusion: <serial/migrate> x over serial, <fused/migrate> x over fused (target: 1.3x over serial)
set -euo pipefail
bin=${FF_BIN:?FF_BIN: the fuseflow binary (build/bench_rollout_fusion sets it)}
build=${FF_BUILD_DIR:-$(dirname "$bin")}
src=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
iters=8
workers="2 4"
while [[ $# -gt 0 ]]; do
  case $1 in
    --iterations) iters=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    *) echo "bench_rollout_fusion: unknown option $1 (--iterations N, --workers \"2 4\")" >&2; exit 2 ;;
  esac
done
[[ $iters -ge 2 ]] || { echo "bench_rollout_fusion: --iterations needs at least 2 (the first measures)" >&2; exit 2; }
cache=$build/bench_cache/rollout_fusion
mkdir -p "$cache"
work=$(mktemp -d /tmp/bench_rollout_fusion.XXXXXX)
trap 'rm -rf "$work"' EXIT

model=$cache/sft_repeat/checkpoints/step-00000150
if [[ ! -f $model/config.json ]]; then
  echo "bench_rollout_fusion: preparing the long-tail workload (about a minute of SFT) in $cache"
  rm -rf "$cache/tiny" "$cache/repeat" "$cache/sft_repeat"
  "$bin" init --preset tiny --out "$cache/tiny" > /dev/null
  "$bin" dataset repeat --median 8 --p99-ratio 10 --max 96 --train 5000 --test 200 --seed 1 --out "$cache/repeat" > /dev/null
  "$bin" sft --config "$src/examples/sft_arith.yaml" model="$cache/tiny" out="$cache/sft_repeat" \
    data.train="$cache/repeat/train.jsonl" data.test="$cache/repeat/test.jsonl" train.steps=400 \
    train.stop_after=150 train.batch_size=64 train.eval_every=0 train.save_every=150 train.log_every=1000 \
    > "$cache/sft.log" 2>&1 || { cat "$cache/sft.log" >&2; exit 1; }
fi

cat > "$work/ppo.yaml" <<EOF
trainer: {steps: $iters, seed: 1, schedule: fused, save_freq: 0, test_freq: 0, acc_reward: repeat_match}
data: {train_files: $cache/repeat/train.jsonl, val_files: $cache/repeat/test.jsonl, train_batch_size: 32,
       max_prompt_length: 8, max_response_length: 100}
roles:
  actor: {model: $model, workers: 2, optim: {lr: 5.0e-4, grad_clip: 1.0}}
  critic: {model: $model, colocate_with: actor, optim: {lr: 1.0e-3, grad_clip: 1.0}}
  ref: {model: $model, colocate_with: actor}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 8, temperature: 1.0}
  values: {op: value, role: critic, in: [prompt, response], out: [values], micro_batch_size: 64}
  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob], micro_batch_size: 64}
  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: repeat_match}
  advantage: {op: advantage, in: {score: score, values: values}, out: [advantages, returns], estimator: gae,
              gamma: 1.0, lam: 0.95}
  train_critic: {op: train, role: critic, in: [prompt, response, values, returns], cliprange_value: 0.5,
                 mini_batch_size: 32, micro_batch_size: 32}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob], loss: vanilla,
                mini_batch_size: 32, micro_batch_size: 32, kl_loss: {type: low_var_kl, coef: 0.001}}
EOF

echo "bench_rollout_fusion: PPO (critic values + reference log-probs) on the repeat task, 256 samples per iteration,"
echo "  $iters iterations per run (means over iterations 2..$iters), 1 thread per worker, $(nproc) cores on this machine"
for w in $workers; do
  for mode in serial fused migrate; do
    sched=fused mig=off
    [[ $mode == serial ]] && sched=serial
    [[ $mode == migrate ]] && mig=auto
    "$bin" run "$work/ppo.yaml" trainer.out_dir="$work/${mode}_$w" roles.actor.workers="$w" trainer.schedule=$sched \
      graph.rollout.migrate=$mig --threads 1 --no-progress --dump-samples > "$work/${mode}_$w.log" 2>&1 ||
      { cat "$work/${mode}_$w.log" >&2; exit 1; }
  done
  cmp -s "$work/serial_$w/samples.jsonl" "$work/migrate_$w/samples.jsonl" && cmp -s "$work/fused_$w/samples.jsonl" "$work/migrate_$w/samples.jsonl" ||
    echo "  note: the three runs on $w workers sampled different responses (they should not)"
done

python3 - "$work" "$workers" <<'PY'
import json, sys, statistics as st
work, workers = sys.argv[1], sys.argv[2].split()
key = {"serial": "serial_s", "fused": "fused_s", "migrate": "migrate_s"}
head = None
for w in workers:
    res = {}
    for mode in ("serial", "fused", "migrate"):
        rows = [json.loads(l) for l in open(f"{work}/{mode}_{w}/metrics.jsonl")][1:]
        meas = st.mean(r["time"]["rollout_stage"] for r in rows)
        pred = [r["time"]["rollout_sim"][key[mode]] for r in rows if "rollout_sim" in r["time"]]
        mig = [r.get("migrate", {}) for r in rows]
        res[mode] = meas
        extra = ""
        if mode == "migrate":
            th = [m.get("threshold", 0) for m in mig]
            extra = "  R_t %s, moved %s, saved_s (simulated) %s" % (
                ",".join("%g" % t for t in th), ",".join(str(m.get("moved", 0)) for m in mig),
                ",".join("%.3f" % (m.get("saved_s") or 0) for m in mig))
        print("  %d workers  %-8s stage %7.3f s (sd %.3f)  simulated %7.3f s%s" % (
            int(w), mode, meas, st.pstdev(r["time"]["rollout_stage"] for r in rows), st.mean(pred) if pred else float("nan"), extra))
    s, f, m = res["serial"], res["fused"], res["migrate"]
    print("  %d workers: fused %.2fx over serial, migrate %.2fx over serial, %.2fx over fused" % (int(w), s / f, s / m, f / m))
    if head is None:
        head = (s / m, f / m)
print("rollout_fusion: %.2f x over serial, %.2f x over fused (target: 1.3x over serial)" % head)
PY
