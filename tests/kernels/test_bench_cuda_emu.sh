#!/usr/bin/env bash
# bench/bench_cuda.c's own code on the CUDA emulator (build/bench_cuda_emu, --models tiny), so that
# the one GPU run of scripts/gpu-check.sh does not find its bugs: the attention side by side, a
# training measurement with its MFU line, decoding at two batch sizes (with CUDA graphs, beside
# kernel by kernel: a graph captured and replayed), the bf16-products pass (2 sequences a step:
# the weights' bf16 copy made once a step, 3 times in the 3 steps' 6 forwards) and the
# headlines, exit 0, the memory line's LM-head chunk (the default keeps a sequence's logits on
# a device), the training's peak device memory (above 0: cuBLAS's workspace alone is 0.03 GiB), and the decode of a colocated view of a trained model (on its bf16 copy); the decode batches in
# --batches' order after one untimed warm-up decode; with FF_CUDA_ATTENTION=fp32 (gpu-check's
# second run, where the first failed) no tensor-core attention line and the training headline
# naming it; a bad --models or --batches refused (exit 2) naming the value. Skips (77) where the emulator is not built (no C++ compiler).
set -euo pipefail
bin=${FF_BUILD_DIR:?run through ctest}/bench_cuda_emu
[[ -x $bin ]] || { echo "SKIPPED: $bin is not built (no C++ compiler at configure time)"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bin" --models tiny --seq 64 --accum 2 --steps 1 --batches 4,1 --prompt 4 --new 4 --long 2:300 --budget 120 > "$out" 2>&1 ||
  { cat "$out" >&2; echo "FAIL: bench_cuda_emu exited $?"; exit 1; }
for want in '^bench_cuda: cuda:0, training.s FF_CUDA_MATH=bf16' '^bench_cuda_attention tiny: fwd\+bwd .* ms on tensor cores' \
            '^bench_cuda_train tiny: [0-9]+ tok/s, MFU' '^bench_cuda_decode tiny batch 1: [0-9]+ tok/s' \
            '^bench_cuda_decode tiny batch 4: [0-9]+ tok/s' \
            '^  tiny decode batch 4: [0-9]+ tok/s with graphs \(1 captured, 2 steps replayed, 1 eager\), [0-9]+ tok/s kernel by kernel' '^bench_cuda_train tiny: [0-9]+ tok/s, MFU .*FF_CUDA_MATH=bf16' '^bench_cuda_train_tf32 tiny: [0-9]+ tok/s' \
            '^bench_cuda_profile tiny: ' '^bench_cuda_decode_long tiny batch 2, context 304: [0-9]+ decode tok/s with the keys split, [0-9]+ in one block' '^kernel profile \(cuda:0 backend' '^  gemm_bf16 NT +[0-9]+ calls' '^  gemm_bf16 NN +[0-9]+ calls' '^  gemm_bf16 TN +[0-9]+ calls' \
            "^  tiny train with bf16 products: [0-9]+ tok/s with the weights' bf16 copy and bf16 saved inputs \(activations [0-9.]+ GiB\), [0-9]+ tok/s rounding every operand per product \([0-9.]+ GiB\)" \
            "^  tiny: the weights' bf16 copy made 3 times in 6 forwards" \
            '^  tiny: .* device memory: .*; LM head in chunks of 64 tokens \(the logits kept for the backward\)' \
            "^  tiny train peak device memory: (0\\.0[1-9]|0\\.[1-9][0-9]|[1-9][0-9.]*) GiB \\(the backend's buffers and workspace: .*; 2 x 64 tokens a step; bf16 products\\)" \
            "^  tiny decode batch 4 on a colocated view of the trained model: [0-9]+ tok/s \(the model's bf16 copy, made 1 time\), [0-9]+ tok/s with bf16 weights of its own" \
            '^  tiny decode warm-up \(untimed\): batch 1, 4 new tokens' '^bench_cuda: headlines'; do
  grep -Eq "$want" "$out" || { cat "$out" >&2; echo "FAIL: no line matching '$want'"; exit 1; }
done
# the order asked for: the decode batches as --batches names them, after the warm-up
order=$(grep -E '^(  tiny decode warm-up|bench_cuda_decode tiny batch)' "$out" | head -3 | sed 's/:.*//' | tr '\n' '|')
[[ $order == "  tiny decode warm-up (untimed)|bench_cuda_decode tiny batch 4|bench_cuda_decode tiny batch 1|" ]] ||
  { cat "$out" >&2; echo "FAIL: decode order: $order"; exit 1; }
# the attention on CUDA cores asked for: the tensor-core kernels not run, the headline says so
FF_CUDA_ATTENTION=fp32 "$bin" --models tiny --seq 64 --accum 2 --steps 1 --batches 1 --prompt 4 --new 4 --tf32-train 0 \
  --profile 0 --long 0:1 --budget 60 > "$out" 2>&1 || { cat "$out" >&2; echo "FAIL: bench_cuda_emu with FF_CUDA_ATTENTION=fp32 exited $?"; exit 1; }
grep -q '^bench_cuda: the tensor-core attention not run (FF_CUDA_ATTENTION=fp32)' "$out" && ! grep -q '^bench_cuda_attention' "$out" &&
  grep -Eq '^bench_cuda_train tiny: [0-9]+ tok/s, MFU .*, FF_CUDA_ATTENTION=fp32; target' "$out" ||
  { cat "$out" >&2; echo "FAIL: FF_CUDA_ATTENTION=fp32: the tensor-core attention ran, or the headline does not say which attention trained"; exit 1; }
# bad --models and --batches: refused before any work, naming the value
for bad in "--models tiny,nope:unknown model 'nope'" "--models tiny,tiny:a model named twice: 'tiny'" \
           "--batches 1,0:--batches wants up to 8 batch sizes of 1 to 4096" "--batches 4x:got '4x'"; do
  flag=${bad%%:*}
  want=${bad#*:}
  set +e
  # shellcheck disable=SC2086
  msg=$("$bin" $flag 2>&1)
  rc=$?
  set -e
  [[ $rc == 2 && $msg == *"$want"* ]] || { echo "FAIL: '$flag': exit $rc, '$msg' (wanted exit 2 and '$want')"; exit 1; }
done
echo "ok: bench_cuda ran on the emulator: $(grep -c '^bench_cuda_' "$out") headline lines"
