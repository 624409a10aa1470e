#!/usr/bin/env bash
# The rollout's paged KV cache in `fuseflow run` (roles.actor.rollout.kv_block, kv_memory;
# docs/run.md "KV cache"): GRPO with drawn response lengths (n 8, up to 96 tokens) on a
# generation pool of 2 workers.
#   - blocks of 8 positions and a pool of 0.2 of every slot at full length (the least that holds
#     one group at full length; whether requests wait depends on the drawn lengths, and
#     tests/model/test_generate_paged.c makes them wait), and blocks of 1: the samples equal the default run's byte for byte (the cache's
#     layout and the waiting change no token: each sample draws from its own stream);
#   - metrics.jsonl's rollout_kv: the pool and block size each run asked for, the most blocks a
#     rollout held within the pool, a larger share of the smaller pool;
#   - a pool too small for one group, kv_memory 0, kv_block 0 and a word for graphs (decode steps
#     as CUDA graphs, docs/cuda.md) are refused before any worker starts, naming the key (and, for the pool, the smallest share that works).
source "$(dirname "$0")/lib.sh"
prepare_inputs
prepare_lengths_run 2
lengths_run "$work/default"
[[ $(wc -l < "$work/default/samples.jsonl") -ge 160 ]] || fail "the default run dumped too few samples"
for v in "kv_block=8 kv_memory=0.2" "kv_block=1"; do
  ov=()
  for kv in $v; do ov+=("roles.actor.rollout.$kv"); done
  out=$work/kv_${v// /_}
  out=${out//=/}
  lengths_run "$out" "${ov[@]}"
  cmp -s "$work/default/samples.jsonl" "$out/samples.jsonl" ||
    { diff "$work/default/samples.jsonl" "$out/samples.jsonl" | head -4 >&2; fail "$v: the samples differ from the default cache's"; }
done

# metrics: each iteration's rollout_kv (the most blocks a rollout held, its pool: 40 slots x 7
# blocks of 16 by default; 0.2 of 40 x 14 blocks of 8 = 112) and rollout_decode (on the cpu, all
# eager: at least the longest response's 96 steps)
python3 - "$work" <<'PY' || fail "the rollout_kv metrics are wrong"
import json, sys
def kv(run):
    return [json.loads(l)["rollout_kv"] for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl") if '"samples"' in l]
d, s = kv("default"), kv("kv_kv_block8_kv_memory0.2")
assert len(d) == len(s) == 2, (d, s)
for k in d: assert k["pool_blocks"] == 280 and k["block_positions"] == 16 and 0 < k["peak_blocks"] <= 280, k
for k in s: assert k["pool_blocks"] == 112 and k["block_positions"] == 8 and 0 < k["peak_blocks"] <= 112, k
assert max(k["peak_share"] for k in s) > max(k["peak_share"] for k in d), (d, s)
print("rollout_kv peak share: default", [round(k["peak_share"], 3) for k in d], "kv_memory 0.2", [round(k["peak_share"], 3) for k in s])
# rollout_decode: the cpu backend has no graphs, so every decode step is eager
ds = [json.loads(l)["rollout_decode"] for l in open(f"{sys.argv[1]}/default/metrics.jsonl") if '"samples"' in l]
assert len(ds) == 2 and all(x["graph_steps"] == 0 and x["eager_steps"] >= 96 for x in ds), ds
print("rollout_decode:", ds)
PY

refused() { # WHAT GREP... -- OVERRIDES...
  local what=$1; shift
  local pats=()
  while [[ $1 != -- ]]; do pats+=("$1"); shift; done
  shift
  local out=$work/bad
  rm -rf "$out"
  if "$bin" run "$work/run.yaml" trainer.out_dir="$out" --threads 1 --no-progress "$@" > "$out.log" 2>&1; then
    fail "$what was not refused"
  fi
  for p in "${pats[@]}"; do
    grep -qF -- "$p" "$out.log" || { cat "$out.log" >&2; fail "the refusal of $what does not say '$p'"; }
  done
  [[ ! -e "$out/metrics.jsonl" ]] || fail "the run of $what started before the refusal"
  grep -q "worker" "$out.log" && grep -q "started" "$out.log" && fail "workers started before the refusal of $what"
  return 0
}
# slots per engine: 10 x 8 / 2 = 40; blocks of 8 over 8 + 100 + 1 positions: 14 a sequence;
# one group of 8 may fill 112 of the 560: a share of 0.2 at least
refused "a pool below one group" "roles.actor.rollout.kv_memory" "at least 0.2" "112" -- roles.actor.rollout.kv_block=8 \
  roles.actor.rollout.kv_memory=0.1
refused "kv_memory 0" "kv_memory" "[1e-06, 1]" -- roles.actor.rollout.kv_memory=0
refused "kv_block 0" "kv_block" -- roles.actor.rollout.kv_block=0
refused "graphs: maybe" "roles.actor.rollout.graphs" -- roles.actor.rollout.graphs=maybe
echo "ok"
