#!/usr/bin/env bash
# The workers' collectives on GPU buffers (NCCL twins on streams of their own, ordered by events:
# docs/run.md "Backends") run end to end on the CUDA emulator (kernels/cuda/emu/) with
# fuseflow_emu's NCCL stand-in, which runs each collective with the cpu backend in its stream's
# order. Each layout, with its roles on cuda, gives the same samples and the same metrics bit for
# bit as with FF_DEVICE_COLL=0 (the same collectives through host memory on the cpu group):
#   - PPO at TP 2 x DP 2 with sequence parallelism (the TP all-reduces, SP gathers and scatters,
#     the DP gradient sum) and ZeRO-1 (reduce-scatter and all-gather in the flat buffers), its
#     TP 2 generation's decode steps replayed as CUDA graphs that hold their collectives, and the
#     same with every capture failing (FF_CUDA_EMU_CAPTURE_FAIL=all): eager decoding, its
#     collectives kept out of the failed captures; and with the captures of one rank of each
#     TP pair alone failing (=1,3): each pair agrees, every rank decodes eagerly;
#   - the same with bf16 products (FF_CUDA_MATH=bf16: the weights' bf16 copies, docs/model.md);
#   - PPO at PP 2 (the pipeline's activations and gradients between stages);
#   - GRPO at PP 2 generating pipelined over both stages (its decode steps as graphs holding the
#     stages' sends, receives and the logits' broadcast), and with the second stage's captures
#     alone failing;
#   - GRPO training at TP 2 and generating at TP 1 on a pool of its own (the weight sync).
# The emulator runs queued kernels only when waited for, so a collective whose stream does not
# wait for the kernels that wrote its input would read stale data and part from the host run.
# Skips (77) without FF_CUDA_EMU_BIN (ctest sets it where the emulator is built).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
[[ -n ${FF_CUDA_EMU_BIN:-} ]] || { echo "SKIPPED: FF_CUDA_EMU_BIN is not set (the emulator is not built)"; exit 77; }
[[ -f ${FF_FAKE_LIBCUDA:-} ]] || fail "FF_FAKE_LIBCUDA (the stand-in CUDA driver the build makes) is not set: run through ctest"
prepare_tp
S=$tp_sft
steps=2
gpus="FAKE_CUDA_GPUS=emu,emu,emu,emu"
cuda=(roles.actor.backend=cuda roles.critic.backend=cuda)

run() { # CONFIG OUT EXTRA...
  local cfg=$1 out=$2; shift 2
  env FF_BIN="$FF_CUDA_EMU_BIN" FF_LIBCUDA="$FF_FAKE_LIBCUDA" "$gpus" FF_CUDA_EMU_DEVICES=4 FF_CUDA_MATH="${MATH:-fp32}" \
    timeout 400 "$FF_CUDA_EMU_BIN" run "$src/examples/$cfg.yaml" $(small_run "$out") trainer.steps=$steps \
    trainer.test_freq=0 trainer.save_freq=0 data.train_batch_size=8 graph.rollout.n=4 roles.actor.model=$S \
    roles.ref.model=$S roles.actor.optim.lr=1e-3 roles.actor.optim.eps=1e-5 --no-progress --dump-samples "$@" \
    > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "$cfg $* did not run"; }
}
both() { # WHAT CONFIG NAME EXTRA...: the run on the models' buffers and through host memory, the same bits
  local what=$1 cfg=$2 name=$3; shift 3
  run "$cfg" "$work/$name" "$@"
  FF_DEVICE_COLL=0 run "$cfg" "$work/${name}_host" "$@"
  grep -q "computes on cuda:" "$work/$name.log" || fail "$what: no rank computes on cuda"
  [[ $(iterations "$work/$name/metrics.jsonl") == "$steps" ]] || fail "$what: not $steps iterations"
  same_samples "$work/$name" "$work/${name}_host" "$what"
  same_metrics "$work/$name/metrics.jsonl" "$work/${name}_host/metrics.jsonl" 0 0 ||
    fail "$what: the collectives on the GPU buffers do not give the bits of those through host memory"
  echo "ok: $what"
}
ppo_args=(roles.critic.model=$S graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=8
          graph.train_critic.mini_batch_size=4 graph.train_critic.micro_batch_size=8 roles.critic.optim.lr=1e-3
          roles.critic.optim.eps=1e-5)

both "TP 2 x DP 2 with SP and ZeRO-1 on cuda" ppo tpdp --workers 4 "${ppo_args[@]}" "${cuda[@]}" roles.actor.layout.tp=2 \
  roles.actor.layout.sp=true roles.actor.layout.zero=1
# the run NAME's generation decoded in CUDA graphs that hold its collectives (recorded by the
# NCCL stand-in, run at each replay), with the samples of NAME_host (checked by both), which
# decodes kernel by kernel (its collectives through host memory cannot be captured)
graphs_replayed() { # WHAT NAME
  python3 - "$work/$2/metrics.jsonl" "$work/$2_host/metrics.jsonl" "$1" <<'PY' || fail "$1: decode steps not replayed as graphs"
import json, sys
dev = [json.loads(l)["rollout_decode"] for l in open(sys.argv[1]) if '"samples"' in l]
host = [json.loads(l)["rollout_decode"] for l in open(sys.argv[2]) if '"samples"' in l]
print(sys.argv[3], "rollout_decode on the buffers", dev, "through host memory", host)
assert dev and sum(d["graph_steps"] for d in dev) > 0, dev  # the first step of each size runs eagerly
assert host and all(h["graph_steps"] == 0 and h["eager_steps"] > 0 for h in host), host
PY
  echo "ok: $1: decode steps as graphs with their collectives"
}
# the actor's colocated generating copy at TP 2: the TP all-reduces and the logits' all-gather
graphs_replayed "TP 2 generation" tpdp
# every capture failing (FF_CUDA_EMU_CAPTURE_FAIL=all: invalidated from its start, as by a call a
# capture cannot hold): the collectives stay out of the failed captures (NCCL's launch onto one
# fails and takes the communicator down: the stand-in's does), every rank decodes eagerly from
# then on, saying why, with the same samples and metrics
FF_CUDA_EMU_CAPTURE_FAIL=all run ppo "$work/tpdp_nocap" --workers 4 "${ppo_args[@]}" "${cuda[@]}" roles.actor.layout.tp=2 \
  roles.actor.layout.sp=true roles.actor.layout.zero=1
same_samples "$work/tpdp_nocap" "$work/tpdp_host" "failed captures"
same_metrics "$work/tpdp_nocap/metrics.jsonl" "$work/tpdp_host/metrics.jsonl" 0 0 || fail "failed captures: not the metrics of the eager run"
grep -q "decode steps run kernel by kernel from now on, not as CUDA graphs: graph capture" "$work/tpdp_nocap.log" ||
  fail "failed captures: no warning naming why: $(grep -i graph "$work/tpdp_nocap.log" | head -3)"
no_replays() { # WHAT NAME
  python3 - "$work/$2/metrics.jsonl" <<'PY' || fail "$1: decode steps replayed"
import json, sys
d = [json.loads(l)["rollout_decode"] for l in open(sys.argv[1]) if '"samples"' in l]
assert d and all(x["graph_steps"] == 0 and x["eager_steps"] > 0 for x in d), d
PY
}
no_replays "failed captures" tpdp_nocap
echo "ok: failed captures on every rank: eager decoding, the same samples"
# the captures of one rank alone failing in each TP pair (devices 1 and 3: ranks 1 and 3). Left
# eager while its partner replayed, its collectives would meet theirs launched from a graph,
# which NCCL does not pair (the stand-in refuses the mix: the run stopped). Each pair agrees
# after each capture, and both decode eagerly, the partner saying why
FF_CUDA_EMU_CAPTURE_FAIL=1,3 run ppo "$work/tpdp_cap1" --workers 4 "${ppo_args[@]}" "${cuda[@]}" roles.actor.layout.tp=2 \
  roles.actor.layout.sp=true roles.actor.layout.zero=1
same_samples "$work/tpdp_cap1" "$work/tpdp_host" "one rank's failed captures"
same_metrics "$work/tpdp_cap1/metrics.jsonl" "$work/tpdp_host/metrics.jsonl" 0 0 || fail "one rank's failed captures: not the metrics of the eager run"
grep -q "not as CUDA graphs: graph capture: it failed on another rank of the tensor-parallel group" "$work/tpdp_cap1.log" ||
  fail "one rank's failed captures: its partner did not say why it decodes eagerly: $(grep -i graph "$work/tpdp_cap1.log" | head -3)"
no_replays "one rank's failed captures" tpdp_cap1
echo "ok: failed captures on one rank of a TP pair: both decode eagerly, the same samples"
# bf16 products (FF_CUDA_MATH=bf16): the trained models' bf16 copies of their TP shards, and the
# gradients rounded once, under SP and ZeRO-1
MATH=bf16 both "TP 2 x DP 2 with SP and ZeRO-1 on cuda, bf16 products" ppo tpdp16 --workers 4 "${ppo_args[@]}" "${cuda[@]}" \
  roles.actor.layout.tp=2 roles.actor.layout.sp=true roles.actor.layout.zero=1
both "PP 2 on cuda" ppo pp --workers 2 "${ppo_args[@]}" "${cuda[@]}" roles.actor.layout.pp=2
# generation pipelined over the 2 stages: the hidden states sent and received between them and
# the last stage's logits broadcast, in each stage's decode graphs
# (the random tiny model: it never stops early, so each iteration decodes to the response limit
# and its batch sizes come again, the second time as a replay)
both "GRPO at PP 2, generating at PP 2 on cuda" grpo ppgen --workers 2 roles.actor.backend=cuda roles.actor.layout.pp=2 \
  roles.actor.rollout.layout.pp=2 roles.actor.model="$cache/tiny_v260" roles.ref.model="$cache/tiny_v260"
graphs_replayed "PP 2 generation" ppgen
# the second stage's captures alone failing: the stages agree, both decode eagerly
FF_CUDA_EMU_CAPTURE_FAIL=1 run grpo "$work/ppgen_cap1" --workers 2 roles.actor.backend=cuda roles.actor.layout.pp=2 \
  roles.actor.rollout.layout.pp=2 roles.actor.model="$cache/tiny_v260" roles.ref.model="$cache/tiny_v260"
same_samples "$work/ppgen_cap1" "$work/ppgen_host" "one stage's failed captures"
same_metrics "$work/ppgen_cap1/metrics.jsonl" "$work/ppgen_host/metrics.jsonl" 0 0 || fail "one stage's failed captures: not the metrics of the eager run"
no_replays "one stage's failed captures" ppgen_cap1
echo "ok: failed captures on one pipeline stage: both decode eagerly, the same samples"
both "GRPO at TP 2, generating at TP 1 on a pool of 2, all on cuda" grpo sync roles.actor.backend=cuda \
  roles.actor.layout.tp=2 roles.actor.workers=2 roles.actor.rollout.workers=2 roles.actor.rollout.layout.tp=1
echo "all checks passed"
