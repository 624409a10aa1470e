#!/usr/bin/env bash
# bench_rollout_fusion_learn: the learning proof of issue 12: GRPO with a reference on the
# long-tail repeat task (examples/grpo_repeat.yaml's recipe: the tiny model after 150 SFT
# steps, 32 prompts x 8 responses, repeat_match), or PPO with a critic and GAE (--algo ppo,
# examples/ppo_repeat.yaml: 128 prompts x 1 response), on 2 workers that generate and score
# (actor, reference and critic colocated, 1 thread each), once with migration off and once with
# `migrate: auto` (or --migrate R_T), same seeds. Prints both curves (reward, acc and held-out eval_acc per
# iteration), where they differ, the iterations auto migrated in, and both wall times.
# Migration moves a sample exactly (docs/run.md "Exactness": the same tokens and log-probs bit
# for bit), so the curves agree up to the order the trainer's micro-batches sum the samples in;
# the wall times are what a shared machine gives.
#
# Usage: build/bench_rollout_fusion_learn [--iterations N (default 30)] [--migrate auto|R_T (default auto)]
#                                         [--algo grpo|ppo (default grpo)]
# Shares bench_rollout_fusion's cached workload (BUILD/bench_cache/rollout_fusion).
set -euo pipefail
bin=${FF_BIN:?FF_BIN: the fuseflow binary (build/bench_rollout_fusion_learn sets it)}
build=${FF_BUILD_DIR:-$(dirname "$bin")}
src=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
iters=30
on=auto
algo=grpo
while [[ $# -gt 0 ]]; do
  case $1 in
    --iterations) iters=$2; shift 2 ;;
    --migrate) on=$2; shift 2 ;;
    --algo) algo=$2; shift 2 ;;
    *) echo "bench_rollout_fusion_learn: unknown option $1 (--iterations N, --migrate auto|R_T, --algo grpo|ppo)" >&2; exit 2 ;;
  esac
done
case $algo in
  grpo) roles=(examples/grpo_repeat.yaml graph.train_actor.micro_batch_size=128) ;;
  ppo) roles=(examples/ppo_repeat.yaml roles.critic.model=CRITIC) ;;
  *) echo "bench_rollout_fusion_learn: --algo grpo or ppo, not '$algo'" >&2; exit 2 ;;
esac
cache=$build/bench_cache/rollout_fusion
extra=("${roles[@]:1}")
model=$cache/sft_repeat/checkpoints/step-00000150
extra=("${extra[@]/CRITIC/$model}")
if [[ ! -f $model/config.json ]]; then
  echo "bench_rollout_fusion_learn: no SFT'd model in $cache: run build/bench_rollout_fusion --workload sft-tiny --iterations 2 --workers 2 --modes serial first" >&2
  exit 2
fi
work=$(mktemp -d /tmp/bench_rollout_fusion_learn.XXXXXX)
trap '[[ -n "${FF_KEEP:-}" ]] || rm -rf "$work"' EXIT
for mig in off auto; do
  t0=$(date +%s.%N)
  "$bin" run "$src/${roles[0]}" trainer.out_dir="$work/$mig" trainer.steps="$iters" \
    data.train_files="$cache/repeat/train.jsonl" data.val_files="$cache/repeat/test.jsonl" \
    roles.actor.model="$model" roles.ref.model="$model" roles.actor.workers=2 "${extra[@]}" \
    graph.rollout.migrate="$([[ $mig == off ]] && echo off || echo "$on")" --threads 1 --no-progress > "$work/$mig.log" 2>&1 || { cat "$work/$mig.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t0 $t1" > "$work/$mig.wall"
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
lines = {m: [json.loads(l) for l in open(f"{work}/{m}/metrics.jsonl")] for m in ("off", "auto")}
runs = {m: [o for o in v if "reward_mean" in o] for m, v in lines.items()}  # training iterations
evals = {m: {o["iteration"]: o["eval_acc"] for o in v if "eval_acc" in o} for m, v in lines.items()}
wall = {m: (lambda a, b: b - a)(*map(float, open(f"{work}/{m}.wall").read().split())) for m in runs}
def g(r, k):
    v = r.get(k)
    return "%.3f" % v if v is not None else "  -  "
print("iter | off: reward  acc    eval  | on:   reward  acc    eval  | on: R_t   moved  stage off/on (s)")
dr = da = 0.0
for a, b in zip(runs["off"], runs["auto"]):
    m = b.get("migrate", {})
    dr = max(dr, abs(a["reward_mean"] - b["reward_mean"]))
    da = max(da, abs(a.get("acc", 0) - b.get("acc", 0)))
    print("%4d | %s %s %s | %s %s %s | %6g %5d  %.3f / %.3f" % (
        a["iteration"], g(a, "reward_mean"), g(a, "acc"), g({"e": evals["off"].get(a["iteration"])}, "e"),
        g(b, "reward_mean"), g(b, "acc"), g({"e": evals["auto"].get(b["iteration"])}, "e"),
        m.get("threshold", 0), m.get("moved", 0), a["time"]["rollout_stage"], b["time"]["rollout_stage"]))
mig = sum(1 for r in runs["auto"] if r.get("migrate", {}).get("moved", 0) > 0)
so = sum(r["time"]["rollout_stage"] for r in runs["off"]); sa = sum(r["time"]["rollout_stage"] for r in runs["auto"])
print("largest difference per iteration: reward %.2g, acc %.2g; migrated in %d of %d iterations" % (dr, da, mig, len(runs["auto"])))
print("wall time: off %.1f s, on %.1f s (%.2fx); generation + inference stages: off %.1f s, on %.1f s" % (
    wall["off"], wall["auto"], wall["off"] / wall["auto"], so, sa))
PY
