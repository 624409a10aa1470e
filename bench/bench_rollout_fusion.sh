#!/usr/bin/env bash
# bench_rollout_fusion: RLHFuse's generation + inference fusion with long-tail migration
# (issue 12, docs/run.md "Migration") measured through `fuseflow run` on the long-tail
# workload: the stage time (time.rollout_stage: the generation's first dispatch to the last
# inference result) three ways, same seeds, same samples (migration moves them exactly):
#   serial   trainer.schedule serial, migrate off: all generation, then the inference
#   fused    schedule fused, migrate off: a finished sample's inference starts at once
#   migrate  schedule fused, migrate auto: R_t and survivors from the simulator on the run's
#            measured costs (its first iteration measures, so it is left out of every mean)
#   forced   schedule fused, migrate 0.1 (what a migration does here when auto declines one)
#   half     schedule fused, migrate 0.5 (moves here in most iterations, where 0.1 and 1.0 seldom do)
#   ondemand as half, with roles.ref.weights: on_demand (the reference's weights in host
#            memory, loaded for its log-probs, prefetched by the migration's sources): its
#            stage time beside half's, and the loads (weights.ref: seconds, hidden by overlap)
# on 2 and on 4 generation workers at 1 thread each, with the simulator's prediction of each
# (time.rollout_sim, from the costs the run measured before that iteration) beside it.
#
# Workloads (--workload):
#   flat (the default): a random-init `fuseflow init --preset small` model cut to 4 layers
#     (13M parameters, 50 MB f32) whose response lengths the generate node's
#     `lengths: {median: 8, p99_ratio: 10, max: 96}` draws (docs/run.md "Response lengths"),
#     8 prompts x 8 responses per iteration. Why the default: RLHFuse's gain needs a decode
#     step whose cost is nearly flat in the batch (memory-bound decoding, as on a GPU), so that
#     a worker holding a few long samples wastes nearly a whole instance. On one CPU thread the
#     tiny model's step grows about in proportion to the batch (it is compute, in cache), the
#     small model's barely does between batch 2 and 8 (a matrix-vector product reads all the
#     weights per step); docs/run.md "Migration" has the measured table.
#   heavy: RLHFuse's setting, where the inference is as heavy as the models (its critic and
#     reward model as large as the actor or larger): flat's actor and reference (4 layers) with
#     a critic of 12 layers (3x, a random `--preset small` of 38M parameters), the same lengths
#     and prompts, and the values and reference log-probs in micro-batches of 8 (a prompt's
#     responses), so that a finished sample's inference can start while others decode. flat
#     and sft-tiny keep micro-batches of 64 (their meaning before): with 64 samples per
#     iteration that is one job per node, which starts only when the last sample is done, so
#     their "fused" overlaps the two inference nodes with each other, never with decoding, and
#     a migration frees a worker for nothing (docs/run.md "Migration", the breakdown).
#     --infer-micro N sets the micro-batch for any workload.
#   sft-tiny: `fuseflow dataset repeat` (repeat counts log-normal, median 8, p99 about 10x),
#     the tiny model (1M parameters) fine-tuned 150 SFT steps as examples/grpo_repeat.yaml's
#     header says (cached under BUILD/bench_cache/rollout_fusion), whose response lengths then
#     follow the counts' tail; 32 prompts x 8 responses: the learned lengths, a step in
#     proportion to the batch.
# Both: PPO with a critic: the inference the freed workers take is the critic's values and
# the reference log-probs; actor, critic and reference colocated on the generation workers
# (the RLHFuse setting).
#
# The modes run in turn (--rounds times), so that a shared machine's load drifts over all of
# them alike; each figure is the mean over the rounds' iterations 2..N.
# Each run writes a trace; for every mode but serial the bench prints where each generation
# worker's stage went (the stage: the first rl.generate's start to the last inference's end,
# per iteration 2..N, mean over rounds): decoding (its rl.generate spans less the inference it
# ran inside them), inference (rl.logprob / rl.value / rl.score) and idle.
#
# Usage: build/bench_rollout_fusion [--workload flat|heavy|sft-tiny] [--iterations N (default 3)] [--rounds R (default 1)]
#        [--workers "2 4"] [--modes "serial fused migrate forced half ondemand"] [--infer-micro N]
# (CMake writes build/bench_rollout_fusion, which runs this with the built fuseflow.)
# The last line is the headline on 2 workers:
#   rollout_fusion: <serial/migrate> x over serial, <fused/migrate> x over fused (target: 1.3x over serial)
set -euo pipefail
bin=${FF_BIN:?FF_BIN: the fuseflow binary (build/bench_rollout_fusion sets it)}
build=${FF_BUILD_DIR:-$(dirname "$bin")}
src=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
iters=3
rounds=1
workers="2 4"
workload=flat
modes="serial fused migrate forced half ondemand"
infer_micro=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --iterations) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --workload) workload=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --infer-micro) infer_micro=$2; shift 2 ;;
    *) echo "bench_rollout_fusion: unknown option $1 (--workload flat|heavy|sft-tiny, --infer-micro N, --iterations N, --rounds R, --workers \"2 4\", --modes \"serial fused migrate forced half ondemand\")" >&2; exit 2 ;;
  esac
done
[[ $workload == flat || $workload == heavy || $workload == sft-tiny ]] ||
  { echo "bench_rollout_fusion: --workload is flat, heavy or sft-tiny, not $workload" >&2; exit 2; }
[[ -z $infer_micro || $infer_micro =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench_rollout_fusion: --infer-micro is a positive count of samples, not $infer_micro" >&2; exit 2; }
[[ " $modes " == *" serial "* ]] || { echo "bench_rollout_fusion: --modes must include serial (the others compare with it)" >&2; exit 2; }
[[ $iters -ge 2 ]] || { echo "bench_rollout_fusion: --iterations needs at least 2 (the first measures)" >&2; exit 2; }
cache=$build/bench_cache/rollout_fusion
mkdir -p "$cache"
work=$(mktemp -d /tmp/bench_rollout_fusion.XXXXXX)
trap 'rm -rf "$work"' EXIT

critic=""
if [[ $workload == flat || $workload == heavy ]]; then
  model=$cache/small4
  if [[ ! -f $model/config.json ]]; then
    "$bin" init --preset small --out "$model" num_hidden_layers=4 --seed 1 > /dev/null
  fi
  if [[ $workload == heavy ]]; then
    critic=$cache/small12
    [[ -f $critic/config.json ]] || "$bin" init --preset small --out "$critic" num_hidden_layers=12 --seed 2 > /dev/null
    infer_micro=${infer_micro:-8}
  fi
  if [[ ! -f $cache/repeat/train.jsonl ]]; then
    "$bin" dataset repeat --median 8 --p99-ratio 10 --max 96 --train 5000 --test 200 --seed 1 --out "$cache/repeat" > /dev/null
  fi
  prompts=8 mini=8 micro=16 # micro divides the 16 samples per rank of a mini-batch on 4 workers
  lengths=", lengths: {median: 8, p99_ratio: 10, max: 96}"
else
model=$cache/sft_repeat/checkpoints/step-00000150
prompts=32 mini=32 micro=32 lengths=""
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
fi
critic=${critic:-$model}
infer_micro=${infer_micro:-64}

cat > "$work/ppo.yaml" <<EOF
trainer: {steps: $iters, seed: 1, schedule: fused, save_freq: 0, test_freq: 0, acc_reward: repeat_match}
data: {train_files: $cache/repeat/train.jsonl, val_files: $cache/repeat/test.jsonl, train_batch_size: $prompts,
       max_prompt_length: 8, max_response_length: 100}
roles:
  actor: {model: $model, workers: 2, optim: {lr: 5.0e-4, grad_clip: 1.0}}
  critic: {model: $critic, colocate_with: actor, optim: {lr: 1.0e-3, grad_clip: 1.0}}
  ref: {model: $model, colocate_with: actor}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 8, temperature: 1.0$lengths}
  values: {op: value, role: critic, in: [prompt, response], out: [values], micro_batch_size: $infer_micro}
  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob], micro_batch_size: $infer_micro}
  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: repeat_match}
  advantage: {op: advantage, in: {score: score, values: values}, out: [advantages, returns], estimator: gae,
              gamma: 1.0, lam: 0.95}
  train_critic: {op: train, role: critic, in: [prompt, response, values, returns], cliprange_value: 0.5,
                 mini_batch_size: $mini, micro_batch_size: $micro}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob], loss: vanilla,
                mini_batch_size: $mini, micro_batch_size: $micro, kl_loss: {type: low_var_kl, coef: 0.001}}
EOF

echo "bench_rollout_fusion: workload $workload: PPO (critic values + reference log-probs), $((prompts * 8)) samples per iteration,"
echo "  critic $(basename "$critic") ($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$critic/config.json") layers), actor and reference $(basename "$model"), inference micro-batches of $infer_micro"
echo "  $rounds rounds x $iters iterations per mode (means over iterations 2..$iters), 1 thread per worker, $(nproc) cores here"
echo "  load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
for w in $workers; do
  for r in $(seq "$rounds"); do
    for mode in $modes; do
      sched=fused mig=off weights=resident
      [[ $mode == serial ]] && sched=serial
      [[ $mode == migrate ]] && mig=auto
      [[ $mode == forced ]] && mig=0.1
      [[ $mode == half || $mode == ondemand ]] && mig=0.5
      [[ $mode == ondemand ]] && weights=on_demand
      out=$work/${mode}_${w}_$r
      "$bin" run "$work/ppo.yaml" trainer.out_dir="$out" roles.actor.workers="$w" trainer.schedule=$sched \
        graph.rollout.migrate=$mig roles.ref.weights=$weights --threads 1 --no-progress --dump-samples --trace "$out.trace.json" > "$out.log" 2>&1 ||
        { cat "$out.log" >&2; exit 1; }
      cmp -s "$out/samples.jsonl" "$work/serial_${w}_1/samples.jsonl" ||
        echo "  note: $mode on $w workers (round $r) sampled other responses than serial (it should not)"
    done
  done
done

echo "  load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work" "$workers" "$rounds" "$modes" <<'PY'
import json, sys, statistics as st
work, workers, rounds, modes = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4].split()
key = {"serial": "serial_s", "fused": "fused_s", "migrate": "migrate_s", "forced": "migrate_s", "half": "migrate_s", "ondemand": "migrate_s"}
def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]: out[-1][1] = max(out[-1][1], b)
        else: out.append([a, b])
    return out
def length(iv): return sum(b - a for a, b in iv)
def inter(x, y): # the overlap of two unions
    i = j = 0; t = 0.0
    while i < len(x) and j < len(y):
        t += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]: i += 1
        else: j += 1
    return t
def breakdown(path):
    """per generation worker, mean over iterations 2..N: (decode, inference, idle) seconds of the stage"""
    ev = json.load(open(path))["traceEvents"]
    its = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("ph") == "X" and e.get("cat") == "stage" and e["name"].startswith("iteration "))
    sub = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "subtask" and e["args"]["kind"] in ("rl.generate", "rl.migrate_in", "rl.logprob", "rl.value", "rl.score")]
    acc = {}
    for t0, t1 in its[1:]:
        it = [e for e in sub if t0 <= e["ts"] < t1]
        gen = [e for e in it if e["args"]["kind"] in ("rl.generate", "rl.migrate_in")]
        if not gen: continue
        inf = [e for e in it if e not in gen]
        s0 = min(e["ts"] for e in gen)
        s1 = max([e["ts"] + e["dur"] for e in inf] or [max(e["ts"] + e["dur"] for e in gen)])
        for pid in sorted({e["pid"] for e in gen}):
            g = union([(e["ts"], e["ts"] + e["dur"]) for e in gen if e["pid"] == pid])
            i = union([(e["ts"], e["ts"] + e["dur"]) for e in inf if e["pid"] == pid])
            d, n = length(g) - inter(g, i), length(i)
            a = acc.setdefault(pid, [0.0, 0.0, 0.0, 0])
            a[0] += d * 1e-6; a[1] += n * 1e-6; a[2] += max(0.0, (s1 - s0) - d - n) * 1e-6; a[3] += 1
    return {p: (a[0] / a[3], a[1] / a[3], a[2] / a[3]) for p, a in acc.items()}
head = None
for w in workers:
    res = {}
    for mode in [m for m in ("serial", "fused", "migrate", "forced", "half", "ondemand") if m in modes]:
        rows = [json.loads(l) for r in range(1, rounds + 1) for l in list(open(f"{work}/{mode}_{w}_{r}/metrics.jsonl"))[1:]]
        stage = [r["time"]["rollout_stage"] for r in rows]
        pred = [r["time"]["rollout_sim"][key[mode]] for r in rows if "rollout_sim" in r["time"]]
        mig = [r.get("migrate", {}) for r in rows]
        res[mode] = st.mean(stage)
        extra = ""
        if mode in ("migrate", "forced", "half", "ondemand"):
            extra = "  migrated in %d of %d iterations (%d samples), simulated saving %.3f s per iteration" % (
                sum(1 for m in mig if m.get("moved", 0) > 0), len(mig), sum(m.get("moved", 0) for m in mig),
                st.mean(m.get("saved_s") or 0 for m in mig))
        print("  %s workers  %-8s stage %6.3f s (sd %.3f)  simulated %6.3f s%s" % (
            w, mode, res[mode], st.pstdev(stage), st.mean(pred) if pred else float("nan"), extra))
        bd = [breakdown(f"{work}/{mode}_{w}_{r}.trace.json") for r in range(1, rounds + 1)]
        print("      per worker, s of the stage (decode / inference / idle): " + "  ".join(
            "w%d %.2f/%.2f/%.2f" % (p - 1, *(st.mean(b[p][k] for b in bd if p in b) for k in range(3)))
            for p in sorted({p for b in bd for p in b})))
    nan = float("nan")
    s, f, m, c = (res.get(k, nan) for k in ("serial", "fused", "migrate", "forced"))
    print("  %s workers: fused %.2fx over serial; auto migration %.2fx over serial, %.2fx over fused; forced R_t 0.1 %.2fx over serial, %.2fx over fused" % (
        w, s / f, s / m, f / m, s / c, f / c))
    if "ondemand" in res and "half" in res:
        wr = [json.loads(l)["weights"]["ref"] for rr in range(1, rounds + 1)
              for l in list(open(f"{work}/ondemand_{w}_{rr}/metrics.jsonl"))[1:]]
        print("  %s workers: ref weights on demand: stage %.3f s against %.3f s resident (R_t 0.5, %+.1f%%); per iteration "
              "%.1f MB loaded in %.2f ms, %.2f ms of it hidden by overlap (%d of %d loads prefetched)" % (
              w, res["ondemand"], res["half"], 100 * (res["ondemand"] / res["half"] - 1), st.mean(x["bytes"] for x in wr) / 1e6,
              1e3 * st.mean(x["load_s"] for x in wr), 1e3 * st.mean(x["hidden_s"] for x in wr),
              sum(x["prefetched"] for x in wr), sum(x["loads"] for x in wr)))
    if head is None:
        head = (s / m, f / m)
print("rollout_fusion: %.2f x over serial, %.2f x over fused (target: 1.3x over serial)" % head)
PY
