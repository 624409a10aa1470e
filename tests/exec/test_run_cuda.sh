#!/usr/bin/env bash
# `backend: cuda` per role in `fuseflow run` (docs/run.md "Backends"), on a machine without a
# GPU: what can be checked without one.
#   - one GPU per cuda worker: with the stand-in driver listing 4 GPUs (FF_LIBCUDA,
#     FAKE_CUDA_GPUS), the 4 workers of actor + ref (colocated) + a generation pool of 2 take
#     cuda:0..3, and each then fails to make its backend with the CUDA runtime's own error
#     (no device here, or a build without CUDA), naming the backend and the config; the run
#     says its cuda workers multiply in bf16 and its generation pool holds bf16 weights (the
#     defaults on cuda);
#   - too few GPUs (none; one for 4 workers), and an unknown FF_CUDA_MATH: refused once the
#     workers join, before any model loads, naming the roles' backend keys or the variable;
#   - colocated roles on other backends, and an unknown backend: refused before any worker
#     starts, naming the key.
source "$(dirname "$0")/lib.sh"
prepare_inputs
[[ -f ${FF_FAKE_LIBCUDA:-} ]] || fail "FF_FAKE_LIBCUDA (the stand-in CUDA driver the build makes) is not set: run through ctest"
common=(data.train_files=$cache/arith/train.jsonl data.val_files=$cache/arith/test.jsonl data.max_prompt_length=16
        data.max_response_length=6 roles.actor.model=$cache/tiny roles.ref.model=$cache/tiny trainer.steps=1 --no-progress)
run() { # NAME [env...] -- overrides...
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  rm -rf "$work/$name"
  if env "${envs[@]}" timeout 120 "$bin" run "$src/examples/grpo.yaml" trainer.out_dir="$work/$name" "${common[@]}" "$@" \
       > "$work/$name.log" 2>&1; then
    fail "$name: the run succeeded on a machine without a GPU"
  fi
  [[ $? -ne 124 ]] || fail "$name: the run hung"
}
says() { # NAME TEXT...
  local name=$1; shift
  for t in "$@"; do
    grep -qF -- "$t" "$work/$name.log" || { cat "$work/$name.log" >&2; fail "$name: the output does not say '$t'"; }
  done
}
fake=(FF_LIBCUDA=$FF_FAKE_LIBCUDA)

run four "${fake[@]}" "FAKE_CUDA_GPUS=NVIDIA H200,NVIDIA H200,NVIDIA H200,NVIDIA H200" -- roles.actor.backend=cuda \
  roles.actor.rollout.workers=2
says four "rank 0 computes on cuda:0" "rank 1 computes on cuda:1" "rank 2 computes on cuda:2" "rank 3 computes on cuda:3" \
  "backend cuda:" "backend: cuda in the run config" \
  "run: the generation pool holds bf16 weights on cuda (roles.actor.rollout.dtype" "run: the cuda workers multiply in bf16"
grep -qE "no CUDA device|built without the CUDA backend" "$work/four.log" || { cat "$work/four.log" >&2; fail "four: not the runtime's error"; }
grep -q "iter 1" "$work/four.log" && fail "four: an iteration ran"

run none "${fake[@]}" "FAKE_CUDA_GPUS=" -- roles.actor.backend=cuda
says none "roles.actor.backend" "roles.ref.backend" "runs 2 workers on cuda" "sees 0 GPUs"
grep -q "computes on cuda" "$work/none.log" && fail "none: a GPU was assigned"

run one "${fake[@]}" "FAKE_CUDA_GPUS=NVIDIA H200" -- roles.actor.backend=cuda roles.actor.rollout.workers=2
says one "runs 4 workers on cuda" "sees 1 GPU"

run math "${fake[@]}" "FAKE_CUDA_GPUS=NVIDIA H200,NVIDIA H200" FF_CUDA_MATH=int4 -- roles.actor.backend=cuda
says math "FF_CUDA_MATH" "unknown value 'int4'" "use bf16 (the default), tf32 or fp32"
grep -qE "no CUDA device|built without the CUDA backend" "$work/math.log" && fail "math: the workers loaded before the refusal"

run mixed -- roles.actor.backend=cuda roles.ref.backend=cpu
says mixed "roles.ref.backend: cpu" "colocated with 'actor', whose backend is cuda"
grep -q "workers (" "$work/mixed.log" && fail "mixed: workers started before the refusal"

run unknown -- roles.actor.backend=tpu
says unknown "roles.actor.backend" "tpu"
echo "ok"
