#!/usr/bin/env bash
# `fuseflow run` with its roles on a GPU (docs/run.md "Backends"), end to end: GRPO on the tiny
# model for 2 iterations with the actor (and its colocated reference) on cuda, one worker (one
# GPU: the machine gpu-check.sh runs on has one), beside
# the same run on the CPU:
#   - the run says its rank computes on cuda:0, ends, and writes 2 iterations of metrics, every
#     number finite, the same keys as the CPU run's;
#   - its checkpoint loads in `fuseflow generate` on the CPU (the weights came back whole);
#   - its reference (colocated, so on cuda) holds bf16 weights, about half the actor's bytes,
#     and the run says so; roles.ref.dtype: fp32 keeps them fp32;
#   - the device memory: the load line, each iteration's device_memory peak and the console's, a
#     counter on the --trace timeline; a GPU too small to train on refused (on the emulator);
#   - FF_DEVICE_COLL=0 (collectives through host memory) runs too, and so does
#     roles.actor.rollout.graphs: false (decode steps without CUDA graphs; on the emulator, the
#     samples of the graphs' run byte for byte).
# The samples are not compared: the GPU's bf16 products (the default) round otherwise, so sampling
# may part.
#
# Two ways: on a real GPU (scripts/gpu-check.sh runs it where one is lent; it skips, exit 77,
# saying why, where none answers: no nvidia-smi or none listed, a build without CUDA, a runtime
# that sees no device); or, with FF_CUDA_EMU_BIN (ctest's exec/test_run_cuda_emu), the GPU runs
# use that build of the command, whose cuda backend is the emulator (kernels/cuda/emu/), and the
# controller counts two GPUs through the stand-in driver (FF_FAKE_LIBCUDA); there a run of 2
# workers, data parallel on cuda:0 and cuda:1 (collectives through host memory: NCCL is not
# emulated), runs as well.
source "$(dirname "$0")/lib.sh"
gbin=$bin
genv=()
if [[ -n ${FF_CUDA_EMU_BIN:-} ]]; then
  gbin=$FF_CUDA_EMU_BIN
  [[ -f ${FF_FAKE_LIBCUDA:-} ]] || fail "FF_FAKE_LIBCUDA (the stand-in CUDA driver the build makes) is not set: run through ctest"
  genv=(FF_LIBCUDA=$FF_FAKE_LIBCUDA "FAKE_CUDA_GPUS=emulated GPU,emulated GPU" FF_CUDA_EMU_DEVICES=2)
elif ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
  echo "SKIPPED: no GPU (nvidia-smi is missing or lists none)"
  exit 77
fi
prepare_inputs
if ! "$gbin" generate --model "$cache/tiny" --prompt "1+1=" --max-new-tokens 1 --device cuda > "$work/probe.log" 2>&1; then
  echo "SKIPPED: the cuda backend does not run here: $(head -c 300 "$work/probe.log")"
  exit 77
fi

grpo() { # OUT EXTRA... (GPU_RUN=1: the GPU build and its environment)
  local out=$1; shift
  local b=$bin e=()
  [[ -z ${GPU_RUN:-} ]] || { b=$gbin; e=("${genv[@]}" FF_BIN="$gbin"); } # FF_BIN: the workers the run starts
  env "${e[@]}" timeout 240 "$b" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=2 trainer.test_freq=2 trainer.save_freq=2 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model="$cache/tiny" roles.ref.model="$cache/tiny" \
    --workers "${WORKERS:-1}" --val-limit 16 --no-progress "$@" > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "grpo $* did not run"; }
}
grpo_fails() { # OUT EXTRA...: the GPU run, which must stop with an error (not hang)
  local out=$1; shift
  local rc=0
  env "${genv[@]}" FF_BIN="$gbin" timeout 240 "$gbin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=2 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model="$cache/tiny" roles.ref.model="$cache/tiny" --workers 1 \
    --val-limit 16 --no-progress "$@" > "$out.log" 2>&1 || rc=$?
  ((rc != 0)) || fail "$out: the run succeeded"
  ((rc != 124)) || fail "$out: the run hung"
}
grpo "$work/cpu"
# (on the emulator, other processes hold 1 GiB of each GPU: FF_CUDA_EMU_OTHERS; a GPU ignores it)
others=0
[[ -z ${FF_CUDA_EMU_BIN:-} ]] || others=1073741824
FF_CUDA_EMU_OTHERS=$others GPU_RUN=1 grpo "$work/gpu" roles.actor.backend=cuda --trace "$work/gpu.trace.json"
grep -q "rank 0 computes on cuda:0" "$work/gpu.log" || fail "the actor is not on cuda:0: $(head -3 "$work/gpu.log")"
[[ $(iterations "$work/gpu/metrics.jsonl") == 2 ]] || fail "the GPU run wrote $(iterations "$work/gpu/metrics.jsonl") iterations, not 2"
python3 - "$work/cpu/metrics.jsonl" "$work/gpu/metrics.jsonl" <<'PY' || fail "the GPU run's metrics"
import json, math, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
def walk(x, path):
    if isinstance(x, dict):
        for k, v in x.items(): walk(v, path + "." + k)
    elif isinstance(x, list):
        for i, v in enumerate(x): walk(v, "%s[%d]" % (path, i))
    elif isinstance(x, float) and not math.isfinite(x):
        sys.exit("%s is %r" % (path, x))
for i, (a, b) in enumerate(zip(cpu, gpu)):
    walk(b, "iteration %d" % (i + 1))
    missing = sorted(set(a) - set(b) - {"memory"})
    if missing: sys.exit("iteration %d lacks %s" % (i + 1, missing))
PY
ck=$(ls -d "$work/gpu/checkpoints/"step-* | tail -1)
"$bin" generate --model "$ck/actor" --prompt "12+34=" --max-new-tokens 4 --device cpu > "$work/gen.log" 2>&1 ||
  { cat "$work/gen.log" >&2; fail "the GPU run's checkpoint does not load on the CPU"; }
GPU_RUN=1 FF_DEVICE_COLL=0 grpo "$work/gpu_host" roles.actor.backend=cuda roles.ref.dtype=fp32
[[ $(iterations "$work/gpu_host/metrics.jsonl") == 2 ]] || fail "FF_DEVICE_COLL=0: not 2 iterations"
# the reference on cuda holds bf16 weights unless roles.ref.dtype says fp32, and the run says so
grep -q "run: the ref holds bf16 weights on cuda (roles.ref.dtype" "$work/gpu.log" || fail "the default run does not say its reference is bf16"
! grep -q "holds bf16 weights" "$work/gpu_host.log" || fail "roles.ref.dtype=fp32: the run says bf16"
python3 - "$work/gpu/metrics.jsonl" "$work/gpu_host/metrics.jsonl" <<'PY' || fail "the reference's weight bytes on cuda"
import json, sys
for path, lo, hi in ((sys.argv[1], 0.5, 0.51), (sys.argv[2], 1.0, 1.0)):
    mem = next(json.loads(l)["memory"] for l in open(path) if '"memory"' in l)
    r = mem[0]["roles"]
    share = r["ref"]["params_bytes"] / r["actor"]["params_bytes"]
    print(f"{path}: the reference holds {share:.3f} of the actor's weight bytes")
    assert lo <= share <= hi, (path, share)
PY
# device memory: the load line says what the rank holds on its GPU of its capacity, and what is
# free; the first metrics line has them as device_bytes / device_capacity_bytes /
# device_free_bytes (held + free within the capacity); every iteration has the rank's
# peak on the device since the last (above what it held after loading: the training step's
# gradients, moments, activations and workspace), within the capacity, and the console says it
grep -qE "run: rank 0 holds .* after loading \(peak .*\), cuda:0 .* of its .* \([0-9.]+ [KMG]iB free\); its roles need" "$work/gpu.log" ||
  fail "the load line does not say what rank 0 holds on cuda:0: $(grep 'after loading' "$work/gpu.log")"
grep -qE "^iter 1/2 .* \| gpu [0-9.]+ [KMG]iB/[0-9.]+ [KMG]iB \([0-9.]+ [KMG]iB free at least\)$" "$work/gpu.log" ||
  fail "the iteration line has no gpu peak and least free: $(grep '^iter 1' "$work/gpu.log")"
python3 - "$work/gpu/metrics.jsonl" "$work/cpu/metrics.jsonl" "$others" <<'PY' || fail "the device memory in metrics.jsonl"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
m = next(l["memory"][0] for l in lines if "memory" in l)
held, cap, free = m["device_bytes"], m["device_capacity_bytes"], m["device_free_bytes"]
assert 0 < held < cap and 0 < free and held + free <= cap, m
its = [l for l in lines if "samples" in l]
assert len(its) == 2, len(its)
others = int(sys.argv[3])
assert free <= cap - held - others, (m, others)
for l in its:
    d = l["device_memory"]
    assert [e["rank"] for e in d] == [0] and d[0]["capacity_bytes"] == cap, d
    assert held < d[0]["peak_bytes"] <= cap, (held, d)
    # the least free: at most what the peak left beside what the others hold (the emulator's
    # exactly that: no CUDA context there)
    mf = d[0]["min_free_bytes"]
    assert 0 <= mf <= cap - d[0]["peak_bytes"] - others, (d, others)
    if others:
        assert mf == cap - d[0]["peak_bytes"] - others, (d, others)
print("cuda:0 held", held, "after loading; peaks", [l["device_memory"][0]["peak_bytes"] for l in its], "of", cap)
cpu = [json.loads(l) for l in open(sys.argv[2])]
assert not any("device_memory" in l for l in cpu) and "device_bytes" not in next(l["memory"][0] for l in cpu if "memory" in l)
PY
# --trace: the device memory as a counter of the worker's process, sampled at each result
python3 - "$work/gpu.trace.json" <<'PY' || fail "the trace has no device memory counter"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
c = [e for e in ev if e["ph"] == "C" and e["name"] == "device memory (MiB)"]
assert len(c) >= 4 and all(e["pid"] == 1 for e in c), c[:3]
for e in c:
    a = e["args"]
    assert a["peak since its last result"] >= a["held at the result"] > 0, e
print(len(c), "device memory samples, the highest peak", max(e["args"]["peak since its last result"] for e in c), "MiB")
names = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["pid"] == 1 and e["name"] == "process_name"]
assert names and names[0].endswith(", cuda:0)"), names  # the worker's process says its GPU, not its hello's cpu
PY
"$bin" trace summary "$work/gpu.trace.json" > /dev/null || fail "trace summary of the GPU run's trace"
# decode steps kernel by kernel (roles.actor.rollout.graphs: false) against the CUDA graphs of
# the default: on the emulator the same samples byte for byte (on a GPU a padded batch may pick
# other cuBLAS kernels, so only that it runs)
GPU_RUN=1 grpo "$work/gpu_eager" roles.actor.backend=cuda roles.actor.rollout.graphs=false --dump-samples
[[ $(iterations "$work/gpu_eager/metrics.jsonl") == 2 ]] || fail "rollout.graphs=false: not 2 iterations"
python3 - "$work/gpu/metrics.jsonl" "$work/gpu_eager/metrics.jsonl" <<'PY' || fail "rollout_decode: graphs not replayed on cuda, or replayed with graphs: false"
import json, sys
g = [json.loads(l)["rollout_decode"] for l in open(sys.argv[1]) if '"samples"' in l]
e = [json.loads(l)["rollout_decode"] for l in open(sys.argv[2]) if '"samples"' in l]
print("rollout_decode with graphs", g, "graphs: false", e)
assert all(x["graph_steps"] > 0 and x["eager_steps"] > 0 for x in g), g  # the first step of each size is eager
assert all(x["graph_steps"] == 0 and x["eager_steps"] > 0 for x in e), e
PY
if [[ -n ${FF_CUDA_EMU_BIN:-} ]]; then
  GPU_RUN=1 grpo "$work/gpu_graphs" roles.actor.backend=cuda --dump-samples
  same_samples "$work/gpu_graphs" "$work/gpu_eager" "rollout.graphs=false against the graphs"
fi
if [[ -n ${FF_CUDA_EMU_BIN:-} ]]; then
  # bf16 products (the default) from the fp32 checkpoint: the reference (bf16 weights, on cuda)
  # scores as the actor's training forward does (the actor's bf16 copy of its weights, its
  # embedding rows too), so the first iteration's KL loss, taken before any update, is 0
  # exactly, and the second's, after one, is not (the emulator's products are batch invariant,
  # so micro-batches grouped otherwise give the same rows; a GPU's cuBLAS need not be)
  GPU_RUN=1 grpo "$work/gpu_bf16" roles.actor.backend=cuda roles.actor.optim.lr=1e-3 \
    graph.train_actor.entropy_coeff=0.01 # a gradient though every reward is 0
  grep -q "run: the cuda workers multiply in bf16 (FF_CUDA_MATH unset: the default" "$work/gpu_bf16.log" ||
    fail "the run does not say its cuda products are bf16: $(head -5 "$work/gpu_bf16.log")"
  python3 - "$work/gpu_bf16/metrics.jsonl" <<'PY' || fail "bf16 products: the reference does not score as the actor trains"
import json, sys
kl = [json.loads(l)["kl_loss"] for l in open(sys.argv[1]) if '"kl_loss"' in l]
print("bf16 products, a bf16 reference: kl_loss by iteration", kl)
assert len(kl) == 2 and kl[0] == 0.0 and kl[1] > 0, kl
PY
fi
if [[ -n ${FF_CUDA_EMU_BIN:-} ]]; then
  # a GPU too small to train on (the emulator's FF_CUDA_EMU_MEMORY: 1.5 MiB, which holds the
  # weights, not the actor's weights, gradients, AdamW moments and bf16 copy with the
  # reference's weights beside them): refused once loaded, before any iteration, naming what
  # the step needs and what to change
  FF_CUDA_EMU_MEMORY=1572864 grpo_fails "$work/small_gpu" roles.actor.backend=cuda
  for t in "cuda:0 cannot train the actor: its optimizer step needs on the device at once the actor's weights" \
           "AdamW moments" "bf16 copy for the products" "the ref's weights" "over the device's 1.5 MiB" "roles.ref.weights: on_demand"; do
    grep -qF -- "$t" "$work/small_gpu.log" || fail "the small GPU's refusal does not say '$t': $(tail -3 "$work/small_gpu.log")"
  done
  ! grep -q "^iter 1" "$work/small_gpu.log" || fail "the small GPU ran an iteration"
  # a GPU big enough, but other processes hold 1 MiB of its 2.5 MiB (FF_CUDA_EMU_OTHERS): refused
  # the same way, over what fuseflow can have of it, saying who holds the rest
  FF_CUDA_EMU_MEMORY=2621440 FF_CUDA_EMU_OTHERS=1048576 grpo_fails "$work/shared_gpu" roles.actor.backend=cuda
  for t in "cuda:0 cannot train the actor" "1.7 MiB in all, over the 1.5 MiB it can have of the device's 2.5 MiB (it holds" \
           "other processes, the CUDA context and NCCL hold the rest, nvidia-smi lists them" "free of other processes"; do
    grep -qF -- "$t" "$work/shared_gpu.log" || fail "the shared GPU's refusal does not say '$t': $(tail -3 "$work/shared_gpu.log")"
  done
  # the reference in host memory between its uses (weights: on_demand) is not on the device at
  # the step: at 1.6 MiB the check lets the run start, and the first allocation that does not
  # fit (a stream's kernel scratch) stops it with the device's own account
  FF_CUDA_EMU_MEMORY=1677722 grpo_fails "$work/small_gpu_od" roles.actor.backend=cuda roles.ref.weights=on_demand
  ! grep -q "cannot train the actor" "$work/small_gpu_od.log" || fail "on demand: the reference's weights were counted"
  grep -qE "out of device memory .*cuda:0: fuseflow holds .* of its 1.6 MiB, .* free" "$work/small_gpu_od.log" ||
    fail "on demand: not the device's out-of-memory account: $(tail -3 "$work/small_gpu_od.log")"
  # a generation engine whose KV cache does not fit (every slot at 241 positions on a 2.1 MiB
  # device) names the key that sizes it, beside the device's account
  FF_CUDA_EMU_MEMORY=2200000 grpo_fails "$work/small_gpu_kv" roles.actor.backend=cuda data.max_prompt_length=120 \
    data.max_response_length=120
  for t in "the actor's generation engine, whose KV cache is roles.actor.rollout.kv_memory 1 of its" "lower kv_memory" \
           "out of device memory allocating"; do
    grep -qF -- "$t" "$work/small_gpu_kv.log" || fail "the KV cache's refusal does not say '$t': $(tail -3 "$work/small_gpu_kv.log")"
  done
fi
if [[ -n ${FF_CUDA_EMU_BIN:-} ]]; then # the emulator has GPUs to spare: 2 workers, data parallel over cuda:0 and cuda:1
  GPU_RUN=1 WORKERS=2 grpo "$work/gpu2" roles.actor.backend=cuda
  grep -q "rank 1 computes on cuda:1" "$work/gpu2.log" || fail "2 workers: rank 1 is not on cuda:1: $(head -3 "$work/gpu2.log")"
  [[ $(iterations "$work/gpu2/metrics.jsonl") == 2 ]] || fail "2 workers on cuda: not 2 iterations"
fi
echo "ok: GRPO on cuda:0, 2 iterations, finite metrics, its checkpoint loads on the CPU"
