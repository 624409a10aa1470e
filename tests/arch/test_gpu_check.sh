#!/usr/bin/env bash
# scripts/gpu-check.sh, the one prepared run for a GPU machine, where there is none: bad
# usage exits 2; without nvidia-smi, or with one that lists no GPU, it stops at once (exit 3)
# saying so, with its log and summary in OUTDIR and nothing built. bench_cuda refuses clearly
# without a device, the PyTorch side and the scripts parse (and the PyTorch side runs on the
# CPU where a python has torch 2), and shellcheck (where installed)
# finds nothing in the scripts of the GPU path.
source "$(dirname "$0")/../cli/lib.sh"
G="$SRC/scripts/gpu-check.sh"

expect_error "no OUTDIR" "usage: scripts/gpu-check.sh OUTDIR" bash "$G"
expect_error "an option instead of OUTDIR" "usage" bash "$G" --help

mkdir -p "$TMP/bin"
# a PATH without nvidia-smi: the system folders only
SYS_PATH=$(command -v timeout tee realpath date grep cat | xargs -n1 dirname | sort -u | tr '\n' ':')
t0=$SECONDS
PATH="$SYS_PATH" bash "$G" "$TMP/o1" >"$TMP/out" 2>&1
rc=$?
((rc == 3)) && ok "no nvidia-smi: exit 3" || fail "no nvidia-smi: exit $rc: $(head -c 400 "$TMP/out")"
grep -q "no GPU here: nvidia-smi is not installed" "$TMP/out" && ok "says why" || fail "no reason given: $(cat "$TMP/out")"
grep -q "no GPU" "$TMP/o1/summary.txt" && [[ -s "$TMP/o1/gpu-check.log" ]] && ok "log and summary written" || fail "no log or summary in $TMP/o1"
((SECONDS - t0 < 10)) && ok "fails fast" || fail "took $((SECONDS - t0)) s to fail"
[[ ! -e "$SRC/build-gpu/CMakeCache.txt" || "$SRC/build-gpu/CMakeCache.txt" -ot "$TMP/o1/gpu-check.log" ]] && ok "nothing built" || fail "build-gpu was configured"

# an nvidia-smi that finds no device (a driver without a GPU)
printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' >"$TMP/bin/nvidia-smi"
chmod +x "$TMP/bin/nvidia-smi"
PATH="$TMP/bin:$SYS_PATH" bash "$G" "$TMP/o2" >"$TMP/out" 2>&1
rc=$?
((rc == 3)) && grep -q "No devices were found" "$TMP/out" && ok "nvidia-smi without a GPU: exit 3, its words quoted" ||
  fail "nvidia-smi without a GPU: exit $rc: $(head -c 400 "$TMP/out")"

# the benchmark without a device: a clear error, no crash
if [[ -x "${FF_BUILD_DIR:-}/bench_cuda" ]]; then
  expect_error "bench_cuda without a GPU" "no CUDA device|without the CUDA backend" "$FF_BUILD_DIR/bench_cuda" --steps 1
  expect_error "bench_cuda bad option" "unknown option --nope" "$FF_BUILD_DIR/bench_cuda" --nope 1
fi
# the tests gpu-check runs on the GPU: only those of the targets it builds (a test added under a
# name its selection picks, and not built there, would fail that one run as "Not Run")
if [[ -f "${FF_BUILD_DIR:-}/CTestTestfile.cmake" ]]; then
  eval "$(grep -E "^GPU_TESTS_[RE]='[^']*'$" "$G")"
  picked=$(ctest --test-dir "$FF_BUILD_DIR" -N -R "${GPU_TESTS_R:?}" -E "${GPU_TESTS_E:?}" | sed -n 's/^ *Test *#[0-9]*: //p')
  meant=" cli/test_generate_cuda coll/test_coll_nccl exec/test_run_cuda_gpu kernels/test_backend kernels/test_cuda_backend kernels/test_cuda_skip model/test_model_cuda "
  other=$(for t in $picked; do [[ "$meant" == *" $t "* ]] || echo "$t"; done)
  [[ -z "$other" && "$picked" == *kernels/test_backend* ]] && ok "gpu-check's tests: $(echo $picked)" ||
    fail "gpu-check's test selection picks tests it does not build: ${other:-none} (picked: $(echo $picked))"
fi
expect_ok "bench_cuda_torch.py compiles" python3 -m py_compile "$SRC/bench/bench_cuda_torch.py"
# The PyTorch side run for real, on the CPU (--device cpu --models tiny), where a python has
# torch 2 (FF_TORCH_PYTHON, else python3; CI's has none): otherwise the GPU machine's torch and
# transformers would meet this script first in the one GPU run, and an API change there would
# lose the comparison the verdict needs.
PY=${FF_TORCH_PYTHON:-python3}
if "$PY" -c 'import sys, torch; sys.exit(0 if hasattr(torch.nn.functional, "scaled_dot_product_attention") else 1)' 2>/dev/null; then
  T="$SRC/bench/bench_cuda_torch.py"
  "$PY" "$T" --device cpu --models tiny --seq 64 --accum 2 --steps 1 --batches 4,1 --prompt 4 --new 4 --budget 120 >"$TMP/torch.out" 2>&1
  rc=$?
  ((rc == 0)) && ok "bench_cuda_torch.py on the cpu: exit 0" || fail "bench_cuda_torch.py on the cpu: exit $rc: $(tail -c 600 "$TMP/torch.out")"
  grep -Eq '^torch_train tiny: [0-9]+ tok/s, MFU [0-9.]+ % of 989 TFLOP/s \(seq 64, 2 a step' "$TMP/torch.out" &&
    ok "its training line" || fail "no torch_train line: $(cat "$TMP/torch.out")"
  grep -Eq '^torch_attention tiny: fwd\+bwd [0-9.]+ ms with SDPA, [0-9.]+ TFLOP/s \(seq 64, 4/2 heads, head_dim 32, bf16\)$' "$TMP/torch.out" &&
    ok "its attention line" || fail "no torch_attention line: $(cat "$TMP/torch.out")"
  if "$PY" -c 'import transformers' 2>/dev/null; then
    got=$(grep -E '^hf_decode tiny batch [0-9]+: [0-9]+ tok/s \(HF generate, bf16, sampling\)$' "$TMP/torch.out" | head -2 | sed 's/:.*//' | tr '\n' '|')
    [[ "$got" == "hf_decode tiny batch 4|hf_decode tiny batch 1|" ]] && ok "its HF generate lines, in --batches' order" ||
      fail "HF generate lines: '$got': $(cat "$TMP/torch.out")"
  else
    ok "this python has no transformers: the HF generate part not checked"
  fi
  "$PY" "$T" --device cpu --models tiny,nope >"$TMP/torch.out" 2>&1
  rc=$?
  ((rc == 2)) && grep -q "unknown model 'nope'" "$TMP/torch.out" && ok "an unknown model refused (exit 2)" ||
    fail "an unknown model: exit $rc: $(cat "$TMP/torch.out")"
else
  ok "no python with torch 2 here (FF_TORCH_PYTHON): the PyTorch side's cpu run skipped"
fi
# the verdict (step 6) on a results.txt written as the two benchmarks print: each pair's ratio,
# a target met, one missed, one whose other side was not measured, and the headline
V="$SRC/scripts/gpu-verdict.py"
cat >"$TMP/results.txt" <<'EOF'
machine: 16 of 16 cores, 1 GPU: 1 x NVIDIA H100 80GB HBM3
bench_cuda_train llama1b: 41000 tok/s, MFU 43.0 % of 989 TFLOP/s (seq 2048, 4 a step; target on llama1b: >= 40 %, >= PyTorch eager)
bench_cuda_decode llama1b batch 32: 7000 tok/s (target at batch 32: >= 3x HF generate)
bench_cuda_decode qwen0.5b batch 32: 9000 tok/s (target at batch 32: >= 3x HF generate)
bench_cuda_train llama1b: 41000 tok/s, MFU 43.0 % of 989 TFLOP/s (seq 2048, 4 a step; target on llama1b: >= 40 %, >= PyTorch eager)
torch_train llama1b: 38000 tok/s, MFU 39.9 % of 989 TFLOP/s (seq 2048, 4 a step, eager + autocast bf16 + SDPA)
hf_decode llama1b batch 32: 2500 tok/s (HF generate, bf16, sampling)
bench_cuda_attention llama1b: fwd+bwd 3.10 ms on tensor cores, 155.0 TFLOP/s; fp32 cores 9.00 ms, 53.4 TFLOP/s (0.34x the fp32 kernels' time; seq 2048, 32/8 heads, head_dim 64)
torch_attention llama1b: fwd+bwd 1.24 ms with SDPA, 387.5 TFLOP/s (seq 2048, 32/8 heads, head_dim 64, bf16)
torch_attention qwen0.5b: fwd+bwd 0.50 ms with SDPA, 300.0 TFLOP/s (seq 2048, 14/2 heads, head_dim 64, bf16)
EOF
expect_ok "the verdict" python3 "$V" "$TMP/results.txt"
for t in "train llama1b: fuseflow 41000 tok/s, MFU 43.0 %; PyTorch eager 38000 tok/s; 1.08x; target >= 1x PyTorch: met; target MFU >= 40 %: met" \
         "decode llama1b batch 32: fuseflow 7000 tok/s; HF generate 2500 tok/s; 2.80x; target >= 3x HF: NOT met" \
         "decode qwen0.5b batch 32: fuseflow 9000 tok/s; HF generate not measured; target >= 3x HF: not measured" \
         "attention llama1b (fwd+bwd, no target): fuseflow 3.10 ms; PyTorch SDPA 1.24 ms; 2.50x SDPA's time" \
         "attention qwen0.5b (fwd+bwd, no target): fuseflow not measured; PyTorch SDPA 0.50 ms" \
         "gpu_verdict: 2 of 4 targets met (target: 4 of 4; not measured: decode qwen0.5b batch 32)"; do
  grep -qxF -- "$t" "$TMP/out" && ok "verdict: ${t%%;*}" || fail "the verdict lacks '$t': $(cat "$TMP/out")"
done
[[ $(tail -1 "$TMP/out") == gpu_verdict:* ]] && ok "verdict: the headline last" || fail "verdict: not the headline last"
# gpu-check's second bench run (the first failed before the 1B model's figures): its headline
# names the CUDA-core attention, and the verdict says so beside the figure; where the first run
# measured a model, its figure stands
cat >"$TMP/results2.txt" <<'EOF'
bench_cuda_train llama1b: 30000 tok/s, MFU 31.0 % of 989 TFLOP/s (seq 2048, 4 a step, FF_CUDA_MATH=bf16, FF_CUDA_ATTENTION=fp32; target on llama1b: >= 40 %, >= PyTorch eager)
bench_cuda_train qwen0.5b: 60000 tok/s, MFU 33.0 % of 989 TFLOP/s (seq 2048, 4 a step, FF_CUDA_MATH=bf16; target on llama1b: >= 40 %, >= PyTorch eager)
bench_cuda_train qwen0.5b: 50000 tok/s, MFU 27.5 % of 989 TFLOP/s (seq 2048, 4 a step, FF_CUDA_MATH=bf16, FF_CUDA_ATTENTION=fp32; target on llama1b: >= 40 %, >= PyTorch eager)
torch_train llama1b: 38000 tok/s, MFU 39.9 % of 989 TFLOP/s (seq 2048, 4 a step, eager + autocast bf16 + SDPA)
EOF
python3 "$V" "$TMP/results2.txt" >"$TMP/out" 2>&1
grep -qF "train llama1b: fuseflow 30000 tok/s, MFU 31.0 % (attention on CUDA cores, FF_CUDA_ATTENTION=fp32); PyTorch eager 38000 tok/s; 0.79x" "$TMP/out" &&
  grep -qxF "train qwen0.5b: fuseflow 60000 tok/s, MFU 33.0 %; PyTorch eager not measured" "$TMP/out" &&
  ok "verdict: a training figure with the attention on CUDA cores says so" || fail "verdict, FF_CUDA_ATTENTION=fp32: $(cat "$TMP/out")"
python3 "$V" "$TMP/none.txt" >"$TMP/out" 2>&1
(($? == 2)) && grep -q "cannot read" "$TMP/out" && ok "verdict: a missing file, exit 2" || fail "verdict, a missing file: $(cat "$TMP/out")"
expect_ok "gpu-deps.sh parses" bash -n "$SRC/scripts/gpu-deps.sh"
if command -v shellcheck >/dev/null; then
  expect_ok "shellcheck, the scripts" shellcheck "$G" "$SRC/scripts/gpu-deps.sh" "$SRC/tests/kernels/test_cuda_skip.sh"
  expect_ok "shellcheck -S warning, the tests" shellcheck -S warning "$SRC/tests/arch/test_gpu_check.sh" \
    "$SRC/tests/cli/test_generate_cuda.sh"
else
  ok "shellcheck not installed: skipped that check"
fi
finish
