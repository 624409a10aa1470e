#!/usr/bin/env bash
# scripts/gpu-check.sh OUTDIR: the one prepared run for a machine with an NVIDIA GPU (an H200
# lent for minutes: docs/cuda.md). In at most 8 minutes, each step under its own time limit:
#   1. gpu      nvidia-smi: the GPU, driver and memory (fails at once, exit 3, without a GPU)
#   2. build    cmake -DFF_CUDA=ON Release into build-gpu (-j16; warnings not errors there), only the targets below; when
#               this machine lacks fuseflow's libraries (ZeroMQ, msgpack, ...), against the
#               folder .gpu-deps that scripts/gpu-deps.sh packed elsewhere and the run carried;
#               then `fuseflow devices` (the GPU as the cuda backend opens it, NCCL)
#   3. tests    ctest -R 'cuda|nccl' (not exec/test_run_cuda nor the emulator's copies of the
#               CUDA tests: CI runs those): the CUDA backend against the CPU one, entry by entry
#               and at model level, `generate --device cuda`, the NCCL collectives and a cpu
#               group's NCCL twin, GRPO end to end with the actor on cuda (exec/test_run_cuda_gpu)
#   4. bench    bench/bench_cuda.c: the training attention on tensor cores beside the fp32
#               kernels, training tokens/s and MFU at seq 2048, decode tokens/s at
#               batch 32/1/256 (after an untimed warm-up), Llama-3.2-1B- then
#               Qwen2.5-0.5B-shaped random models (what the targets need first); bf16
#               products with the weights' copy beside per-product rounding; the kernel
#               profile of the 1B model's training step; where it failed before the 1B
#               model's headlines (a kernel that faulted), once more with FF_CUDA_ATTENTION=fp32
#   5. torch    bench/bench_cuda_torch.py: the same work in PyTorch eager bf16 (SDPA) and HF
#               generate, where python3 has torch
#   6. verdict  scripts/gpu-verdict.py: each fuseflow figure beside its PyTorch one, their
#               ratio, and the issue's targets met or not in this run (into results.txt)
#   7. sanitize only when tests of step 3 failed, and with the budget left after the rest:
#               those tests again under compute-sanitizer's memcheck (into tests.log), so
#               that the one run also brings back the kernel and address of a bad access
# Everything goes to OUTDIR, 8 files at most (what a device run brings back): gpu-check.log
# (all output), one log per step (gpu build tests bench torch), summary.txt (each step's
# status and time) and results.txt (the headline lines of both benchmarks).
# Exit 0 when every step passed, 1 when one failed or timed out, 2 on bad usage, 3 without a
# GPU. Budget: GPU_CHECK_BUDGET seconds in all (default 470); GPU_CHECK_SCALE=N multiplies
# each step's limit (a dry run on a slow machine without a GPU, with a fake nvidia-smi).
set -uo pipefail

usage() {
  echo "usage: scripts/gpu-check.sh OUTDIR   (on a machine with an NVIDIA GPU; see docs/cuda.md)" >&2
  exit 2
}
(($# == 1)) || usage
[[ -n "$1" && "$1" != -* ]] || usage
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=$(realpath -m "$1")
mkdir -p "$OUTDIR" || { echo "gpu-check: cannot create $OUTDIR" >&2; exit 2; }
rm -f "$OUTDIR"/{gpu,build,tests,bench,torch}.log "$OUTDIR/results.txt"
LOG="$OUTDIR/gpu-check.log"
: >"$LOG"
exec 3>&1 > >(tee -a "$LOG") 2>&1
TEE=$!
# quit RC: exit once tee has written everything (its output can trail the script's end)
quit() {
  exec >&3 2>&1
  wait "$TEE" 2>/dev/null
  exit "$1"
}
SUMMARY="$OUTDIR/summary.txt"
: >"$SUMMARY"
BUDGET=${GPU_CHECK_BUDGET:-470}
SCALE=${GPU_CHECK_SCALE:-1} # multiplies every step's limit: for a dry run on a slow machine (docs/cuda.md)
START=$SECONDS
FAILED=0
BUILD="$SRC/build-gpu"

left() { echo $((BUDGET - (SECONDS - START))); }
# step NAME LIMIT CMD...: run the program CMD under min(LIMIT, what is left) seconds, its
# output appended to OUTDIR/NAME.log too (NAME up to its first '-': build-configure and
# build-compile share build.log); records "NAME ok|FAILED (exit N)|TIMED OUT after S s" in
# summary.txt.
step() {
  local name=$1 limit=$(($2 * SCALE))
  shift 2
  local l
  l=$(left)
  ((l - 5 < limit)) && limit=$((l - 5))
  if ((limit < 10)); then
    echo "== $name: skipped, the budget of $BUDGET s is spent"
    echo "$name skipped (budget spent)" >>"$SUMMARY"
    FAILED=1
    return 1
  fi
  echo "== $name (limit ${limit} s, $(left) s left): $*"
  local t0=$SECONDS rc
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUTDIR/${name%%-*}.log"
  rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0))
  if ((rc == 0)); then
    echo "$name ok (${dt} s)" >>"$SUMMARY"
  elif ((rc == 124 || rc == 137)); then
    echo "$name TIMED OUT after ${dt} s" >>"$SUMMARY"
    FAILED=1
  else
    echo "$name FAILED (exit $rc, ${dt} s)" >>"$SUMMARY"
    FAILED=1
  fi
  return "$rc"
}

finish() {
  echo "== summary ($((SECONDS - START)) s of $BUDGET)"
  cat "$SUMMARY"
  if [[ -s "$OUTDIR/results.txt" ]]; then
    echo "== results"
    cat "$OUTDIR/results.txt"
  fi
  quit "$FAILED"
}

# ---- 1. the GPU ------------------------------------------------------------------------------
echo "gpu-check: $(date -u +%FT%TZ) in $SRC, output in $OUTDIR, budget $BUDGET s"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no GPU here: nvidia-smi is not installed. This script is for a machine with an NVIDIA GPU (docs/cuda.md); nothing was built or run."
  echo "gpu no GPU (nvidia-smi missing)" >>"$SUMMARY"
  quit 3
fi
probe=$(timeout 30 nvidia-smi -L 2>&1)
if ! grep -q '^GPU ' <<<"$probe"; then
  echo "gpu-check: no GPU here: nvidia-smi -L says: $(head -c 300 <<<"$probe"). Nothing was built or run."
  echo "gpu no GPU (nvidia-smi -L lists none)" >>"$SUMMARY"
  quit 3
fi
step gpu 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm,power.limit --format=csv
timeout 20 nvidia-smi >>"$OUTDIR/gpu.log" 2>&1
echo "nvcc: $(command -v nvcc || echo missing; nvcc --version 2>/dev/null | tail -1)"
echo "cmake: $(cmake --version 2>/dev/null | head -1)"
echo "cc: $(cc --version 2>/dev/null | head -1)"
echo "cpus: $(nproc)"

# ---- 2. the build ----------------------------------------------------------------------------
export PATH="$PATH:/usr/local/cuda/bin"
# FF_WERROR=OFF: the lent machine's image has its own gcc, whose new warnings must not stop the
# one run it gets (CI builds with warnings as errors); the build log keeps them
CM_ARGS=(-S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFF_CUDA=ON -DFF_WERROR=OFF)
command -v ninja >/dev/null 2>&1 && CM_ARGS+=(-G Ninja)
C_FLAGS=""
# NCCL: the toolkit's, else the one PyTorch's wheels bring (nvidia-nccl-*), else none (the
# NCCL test then skips, saying fuseflow was built without NCCL)
if ! compgen -G "/usr/local/cuda/lib64/libnccl.so*" >/dev/null && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so'; then
  nv=$(python3 -c 'import nvidia, sys; print(list(nvidia.__path__)[0])' 2>/dev/null)
  nccl_lib=$( [[ -n "$nv" ]] && find "$nv" -name 'libnccl.so*' 2>/dev/null | head -1)
  nccl_h=$( [[ -n "$nv" ]] && find "$nv" -name nccl.h 2>/dev/null | head -1)
  if [[ -n "$nccl_lib" && -n "$nccl_h" ]]; then
    echo "gpu-check: NCCL from PyTorch's wheels: $nccl_lib"
    CM_ARGS+=("-DNCCL_LIB=$nccl_lib")
    C_FLAGS+=" -isystem $(dirname "$nccl_h")"
  else
    echo "gpu-check: no NCCL found (toolkit, ldconfig, python3's nvidia packages): the NCCL test will skip"
  fi
fi
# GPU_CHECK_DEPS=1 uses .gpu-deps even where the libraries are installed (to try that path).
if [[ "${GPU_CHECK_DEPS:-0}" == 1 ]] || ! pkg-config --exists libzmq msgpack jansson yaml-0.1 libpcre2-8 openblas 2>/dev/null; then
  DEPS="$SRC/.gpu-deps"
  if [[ ! -d "$DEPS/pkgconfig" ]]; then
    echo "gpu-check: this machine lacks fuseflow's libraries (pkg-config finds not all of libzmq msgpack jansson yaml-0.1 libpcre2-8 openblas) and no .gpu-deps folder came with the run: run scripts/gpu-deps.sh where they are installed and carry .gpu-deps"
    echo "build FAILED (missing libraries, no .gpu-deps)" >>"$SUMMARY"
    FAILED=1
    finish
  fi
  echo "gpu-check: building against $DEPS (scripts/gpu-deps.sh)"
  LIB="$DEPS/usr/lib/x86_64-linux-gnu"
  export PKG_CONFIG_LIBDIR="$DEPS/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$DEPS"
  if ! command -v pkg-config >/dev/null 2>&1; then
    export PATH="$DEPS/bin:$PATH"
    CM_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$DEPS/bin/pkg-config")
  fi
  # -isystem: their headers are system headers (ev.h's macros warn under -Werror otherwise;
  # GCC drops a -I of the same folder). DT_RPATH (not RUNPATH) so that the libraries' own
  # dependencies come from there too.
  RP="-L$LIB -Wl,--disable-new-dtags,-rpath,$LIB"
  C_FLAGS+=" -isystem $DEPS/usr/include"
  CM_ARGS+=("-DCMAKE_PREFIX_PATH=$DEPS/usr" "-DCMAKE_EXE_LINKER_FLAGS=$RP" "-DCMAKE_SHARED_LINKER_FLAGS=$RP"
    "-DCMAKE_MODULE_LINKER_FLAGS=$RP")
fi
CM_ARGS+=("-DCMAKE_C_FLAGS=$C_FLAGS")
# The tests of step 3: only those of the targets built here (the rest of the suite runs in CI,
# without a GPU). Not exec/test_run_cuda: it checks the controller's GPU assignment against a
# stand-in driver (ff_fake_libcuda, not built here) and expects the workers to find no device,
# which is CI's machine, not this one; nor the emulator's tests (_emu, _emu_low, _emu_order),
# which CI runs. tests/arch/test_gpu_check.sh checks that these pick no other test.
GPU_TESTS_R='cuda|nccl|kernels/test_backend'
GPU_TESTS_E='exec/test_run_cuda$|_emu$|_emu_'
TARGETS=(kernels_test_cuda_backend kernels_test_backend model_test_model_cuda coll_test_coll_nccl fuseflow_cli bench_cuda)
step build-configure 60 cmake "${CM_ARGS[@]}" || finish
step build-compile 200 cmake --build "$BUILD" -j16 --target "${TARGETS[@]}" || finish
# what a worker here sees (each GPU as the cuda backend opens it, its memory and what is free,
# NCCL): into build.log, and results.txt
step build-devices 20 "$BUILD/fuseflow" devices && sed -n '/^machine: /,/^nccl: /p' "$OUTDIR/build.log" >>"$OUTDIR/results.txt"

# ---- 3. the CUDA tests -----------------------------------------------------------------------
FAILED_LIST="$BUILD/Testing/Temporary/LastTestsFailed.log" # ctest's list of the failed tests (step 7)
rm -f "$FAILED_LIST"
step tests 130 ctest --test-dir "$BUILD" -R "$GPU_TESTS_R" -E "$GPU_TESTS_E" --output-on-failure --timeout 90

# ---- 4. the benchmark ------------------------------------------------------------------------
step bench 110 "$BUILD/bench_cuda" --budget 75
rc=$?
# A kernel that faults on the device (an illegal or misaligned address) leaves the process's
# CUDA context unusable: every later figure of that run is lost. The tensor-core attention's
# inline PTX (the training's, and the prefills' before decoding) is what no GPU ran before this
# script, so where the run failed or timed out before the 1B model's training or batch-32
# decode headline, once more with the attention on CUDA cores (in what the budget has left);
# its training headline says FF_CUDA_ATTENTION=fp32, and so does the verdict, which keeps a
# first run's figure over it
if ((rc != 0)) && ! { grep -q '^bench_cuda_train llama1b: ' "$OUTDIR/bench.log" &&
  grep -q '^bench_cuda_decode llama1b batch 32: ' "$OUTDIR/bench.log"; }; then
  { echo "gpu-check: bench failed (exit $rc) before the 1B model's training and batch-32 decode figures: again with the attention on CUDA cores (FF_CUDA_ATTENTION=fp32); the first run's last lines:"
    tail -n 3 "$OUTDIR/bench.log" | sed 's/^/  | /'; } | tee -a "$OUTDIR/results.txt"
  step bench-fp32attention 100 env FF_CUDA_ATTENTION=fp32 "$BUILD/bench_cuda" --budget 60
fi
# headlines come as measured and again at the end: keep each once (a run cut short keeps some)
grep -E '^bench_cuda_(attention|train|decode|decode_long|profile)|^  [a-z0-9.]+ decode batch [0-9]+: .* with graphs|^  [a-z0-9.]+ decode batch [0-9]+ on a colocated view|graphs off|^  [a-z0-9.]+ train with bf16 products|device memory: params|train peak device memory|bf16 copy made|^kernel profile|^  [a-z_0-9]+( [A-Z]{2})? +[0-9]+ calls' "$OUTDIR/bench.log" 2>/dev/null | awk '!seen[$0]++' >>"$OUTDIR/results.txt"

# ---- 5. PyTorch beside it --------------------------------------------------------------------
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step torch 90 env PYTHONUNBUFFERED=1 python3 "$SRC/bench/bench_cuda_torch.py" --budget 55
  grep -E '^(torch_train|torch_attention|hf_decode)|torch train peak device memory' "$OUTDIR/torch.log" 2>/dev/null | awk '!seen[$0]++' >>"$OUTDIR/results.txt"
else
  echo "== torch: skipped: python3 has no torch that sees the GPU"
  echo "torch skipped (no torch with CUDA)" >>"$SUMMARY"
fi

# ---- 6. the issue's targets, from this run's side-by-side lines --------------------------------
python3 "$SRC/scripts/gpu-verdict.py" "$OUTDIR/results.txt" >"$OUTDIR/verdict.tmp" 2>&1 && cat "$OUTDIR/verdict.tmp" >>"$OUTDIR/results.txt"
rm -f "$OUTDIR/verdict.tmp"

# ---- 7. a failed CUDA test again under compute-sanitizer ----------------------------------------
# Last, so that it takes only what the benchmarks left. memcheck names the kernel, the thread and
# the address of an out-of-bounds or misaligned access, and the CUDA call that failed first; a
# wrong number with no bad access shows nothing here (tests.log has the test's own account).
# --target-processes all: the shell tests and the run's workers are child processes. Where the
# tool cannot attach to the GPU (seen under gVisor), what it prints instead is in tests.log.
if [[ -s "$FAILED_LIST" ]]; then
  failed=$(sed -n 's/^[0-9]*://p' "$FAILED_LIST" | paste -sd'|' -)
  if command -v compute-sanitizer >/dev/null 2>&1; then
    step tests-sanitize 150 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
      ctest --test-dir "$BUILD" -R "^($failed)\$" --output-on-failure --timeout 140
  else
    echo "== tests-sanitize: skipped: no compute-sanitizer on PATH (failed: $failed)"
    echo "tests-sanitize skipped (no compute-sanitizer)" >>"$SUMMARY"
  fi
fi
finish
