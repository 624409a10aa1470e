#!/usr/bin/env bash
# `--device cuda` / `--backend cuda` on the commands that take it (generate, logprobs, sft):
# without a GPU (or without CUDA in the build)
# a clear error that names what is missing and says to use the cpu backend; with one, greedy
# decoding on the GPU gives the CPU's tokens and log-prob scoring agrees with the CPU's.
source "$(dirname "$0")/lib.sh"
M="$SRC/tests/cli/data/llama_f32"

if "$FF_BIN" generate --model "$M" --prompt "ab" --temperature 0 --max-new-tokens 4 --device cuda >"$TMP/probe" 2>"$TMP/probe.err"; then
  gpu=1
else
  gpu=0
fi
if ((gpu == 0)); then
  expect_error "generate --device cuda without a GPU" "no CUDA device|built without the CUDA backend" \
    "$FF_BIN" generate --model "$M" --prompt "ab" --device cuda
  if grep -qE "cpu backend" "$TMP/err"; then ok "the error says to use the cpu backend"; else fail "no hint in: $(cat "$TMP/err")"; fi
  expect_error "generate --device cuda:7 without a GPU" "no CUDA device|built without the CUDA backend|requested but" \
    "$FF_BIN" generate --model "$M" --prompt "ab" --device cuda:7
  expect_error "generate --backend cuda (the same option) without a GPU" "no CUDA device|built without the CUDA backend" \
    "$FF_BIN" generate --model "$M" --prompt "ab" --backend cuda
  printf '{"tokens": [1, 2, 3]}\n' > "$TMP/seqs.jsonl"
  expect_error "logprobs --backend cuda without a GPU" "no CUDA device|built without the CUDA backend" \
    "$FF_BIN" logprobs --model "$M" --input "$TMP/seqs.jsonl" --output "$TMP/lp.jsonl" --backend cuda
  printf '{"prompt": "1+2=", "response": "3"}\n' > "$TMP/sft.jsonl"
  expect_error "sft --backend cuda without a GPU" "no CUDA device|built without the CUDA backend" \
    "$FF_BIN" sft --config "$SRC/examples/sft_arith.yaml" model="$M" out="$TMP/sft_cuda" data.train="$TMP/sft.jsonl" \
    data.test=null train.steps=1 --backend cuda
  [[ ! -e "$TMP/sft_cuda/checkpoints" ]] || fail "sft wrote checkpoints before the backend failed"
  expect_ok "sft --backend cpu:1 (the same as device=cpu:1)" "$FF_BIN" sft --config "$SRC/examples/sft_arith.yaml" model="$M" \
    out="$TMP/sft_cpu" data.train="$TMP/sft.jsonl" data.test=null train.steps=1 train.batch_size=1 device=cuda --backend cpu:1
  finish
fi

expect_ok "greedy on cpu" "$FF_BIN" generate --model "$M" --prompt "ab" --temperature 0 --max-new-tokens 24 --json --device cpu
cp "$TMP/out" "$TMP/cpu.json"
expect_ok "greedy on cuda" env FF_CUDA_MATH=fp32 "$FF_BIN" generate --model "$M" --prompt "ab" --temperature 0 --max-new-tokens 24 --json --device cuda
if python3 - "$TMP/cpu.json" "$TMP/out" <<'PY'; then
import json, sys
a = json.loads(open(sys.argv[1]).readline())["tokens"]
b = json.loads(open(sys.argv[2]).readline())["tokens"]
print("cpu ", a, "\ncuda", b)
sys.exit(a != b)
PY
  ok "cuda greedy tokens equal the cpu's"
else
  fail "cuda greedy tokens differ from the cpu's"
fi
finish
