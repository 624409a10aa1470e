#!/usr/bin/env bash
# `--device cuda` / `--backend cuda` on the commands that take it (generate, logprobs, sft):
# without a GPU (or without CUDA in the build) a clear error that names what is missing and says
# to use the cpu backend; with one, in exact fp32 (FF_CUDA_MATH=fp32, --weights fp32, --kv-dtype
# fp32), greedy decoding gives the CPU's tokens (and with CUDA graphs the tokens of --eager
# steps), log-prob scoring the CPU's within 1e-4, and two SFT steps the CPU's losses and
# gradient norms within 1e-4 relative, their model loading on the CPU; the commands' defaults on
# cuda are bf16 weights and a bf16 KV cache (the outputs of asking for them, not fp32's).
# With FF_CUDA_EMU_BIN (ctest's cli/test_generate_cuda_emu) the cuda runs use that build of the
# command, whose cuda backend is the CUDA emulator (kernels/cuda/emu/): the GPU half, on the CPU.
source "$(dirname "$0")/lib.sh"
M="$SRC/tests/cli/data/llama_f32"
GBIN=${FF_CUDA_EMU_BIN:-$FF_BIN}

if "$GBIN" generate --model "$M" --prompt "ab" --temperature 0 --max-new-tokens 4 --device cuda >"$TMP/probe" 2>"$TMP/probe.err"; then
  gpu=1
else
  gpu=0
fi
[[ -z ${FF_CUDA_EMU_BIN:-} ]] || ((gpu == 1)) || fail "the emulator's build does not run generate --device cuda: $(cat "$TMP/probe.err")"
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
f32=(--weights fp32 --kv-dtype fp32) # exact fp32 on cuda (the defaults there are bf16)
expect_ok "greedy on cuda" env FF_CUDA_MATH=fp32 "$GBIN" generate --model "$M" --prompt "ab" --temperature 0 --max-new-tokens 24 --json --device cuda "${f32[@]}"
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

# decode steps as CUDA graphs (the default; 3 sequences padded to 4 rows) against --eager
expect_ok "3 greedy samples on cuda (graphs)" env FF_CUDA_MATH=fp32 "$GBIN" generate --model "$M" --prompt "ab" \
  --temperature 0 --max-new-tokens 24 --n 3 --json --device cuda "${f32[@]}"
cp "$TMP/out" "$TMP/graphs.json"
expect_ok "3 greedy samples on cuda --eager" env FF_CUDA_MATH=fp32 "$GBIN" generate --model "$M" --prompt "ab" \
  --temperature 0 --max-new-tokens 24 --n 3 --json --device cuda --eager "${f32[@]}"
if python3 - "$TMP/graphs.json" "$TMP/out" "$TMP/cpu.json" <<'PY'; then
import json, sys
g = [json.loads(l)["tokens"] for l in open(sys.argv[1])]
e = [json.loads(l)["tokens"] for l in open(sys.argv[2])]
c = json.loads(open(sys.argv[3]).readline())["tokens"]
print("graphs", g, "\neager ", e)
sys.exit(not (len(g) == len(e) == 3 and g == e and g[0] == c))
PY
  ok "decoding with graphs gives the eager steps' tokens (and the cpu's)"
else
  fail "decoding with graphs differs from the eager steps"
fi
expect_ok "--eager on cpu (nothing to turn off)" "$FF_BIN" generate --model "$M" --prompt "ab" --temperature 0 \
  --max-new-tokens 4 --eager --device cpu

printf '{"tokens": [1, 2, 3, 4, 5, 6]}\n{"tokens": [7, 8, 9]}\n' > "$TMP/seqs.jsonl"
expect_ok "logprobs on cpu" "$FF_BIN" logprobs --model "$M" --input "$TMP/seqs.jsonl" --output "$TMP/lp_cpu.jsonl" --backend cpu
expect_ok "logprobs on cuda" env FF_CUDA_MATH=fp32 "$GBIN" logprobs --model "$M" --input "$TMP/seqs.jsonl" \
  --output "$TMP/lp_cuda.jsonl" --backend cuda --weights fp32
if python3 - "$TMP/lp_cpu.jsonl" "$TMP/lp_cuda.jsonl" <<'PY'; then
import json, sys
a = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
b = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 2 and all(len(x) == len(y) for x, y in zip(a, b)), (a, b)
worst = max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))
print("max |cuda - cpu| log-prob", worst)
sys.exit(worst > 1e-4)
PY
  ok "cuda log-probs equal the cpu's within 1e-4"
else
  fail "cuda log-probs differ from the cpu's"
fi

# on cuda the defaults are bf16 weights and a bf16 KV cache (as HF holds a bf16 model): the same
# outputs as asking for them, not the fp32 ones
expect_ok "sampling on cuda, the defaults" env FF_CUDA_MATH=fp32 "$GBIN" generate --model "$M" --prompt "ab" \
  --max-new-tokens 24 --json --device cuda --seed 3
cp "$TMP/out" "$TMP/def.json"
expect_ok "sampling on cuda, bf16 asked for" env FF_CUDA_MATH=fp32 "$GBIN" generate --model "$M" --prompt "ab" \
  --max-new-tokens 24 --json --device cuda --seed 3 --weights bf16 --kv-dtype bf16
cp "$TMP/out" "$TMP/b16.json"
expect_ok "sampling on cuda, fp32 asked for" env FF_CUDA_MATH=fp32 "$GBIN" generate --model "$M" --prompt "ab" \
  --max-new-tokens 24 --json --device cuda --seed 3 "${f32[@]}"
cp "$TMP/out" "$TMP/f32.json"
expect_ok "logprobs on cuda, the default weights" env FF_CUDA_MATH=fp32 "$GBIN" logprobs --model "$M" \
  --input "$TMP/seqs.jsonl" --output "$TMP/lp_def.jsonl" --backend cuda
expect_ok "logprobs on cuda, bf16 weights" env FF_CUDA_MATH=fp32 "$GBIN" logprobs --model "$M" \
  --input "$TMP/seqs.jsonl" --output "$TMP/lp_b16.jsonl" --backend cuda --weights bf16
if python3 - "$TMP/def.json" "$TMP/b16.json" "$TMP/f32.json" "$TMP/lp_def.jsonl" "$TMP/lp_b16.jsonl" "$TMP/lp_cuda.jsonl" <<'PY'; then
import json, sys
d, b, f = (json.loads(open(p).readline())["logprobs"] for p in sys.argv[1:4])
ld, lb, lf = ([json.loads(l)["logprobs"] for l in open(p)] for p in sys.argv[4:7])
print("generate: default == bf16", d == b, ", default != fp32", d != f, "; logprobs: default == bf16", ld == lb, ", != fp32", ld != lf)
sys.exit(not (d == b and d != f and ld == lb and ld != lf))
PY
  ok "on cuda generate and logprobs default to bf16 weights (and generate to a bf16 KV cache)"
else
  fail "the cuda defaults of generate / logprobs are not bf16"
fi

printf '{"prompt": "1+2=", "response": "3"}\n{"prompt": "2+2=", "response": "4"}\n' > "$TMP/sft.jsonl"
sft_args=(--config "$SRC/examples/sft_arith.yaml" model="$M" data.train="$TMP/sft.jsonl" data.test=null train.steps=2
          train.batch_size=1)
expect_ok "sft on cpu" "$FF_BIN" sft "${sft_args[@]}" out="$TMP/sft_cpu" --backend cpu
expect_ok "sft on cuda" env FF_CUDA_MATH=fp32 "$GBIN" sft "${sft_args[@]}" out="$TMP/sft_cuda" --backend cuda
# on a device each step's line and metrics say the most the backend held in it, of the device's memory
if grep -qE "tok/s \| gpu [0-9.]+ [KMG]?i?B/[0-9.]+ [KMG]?i?B \| ETA" "$TMP/err" && python3 - "$TMP/sft_cpu/metrics.jsonl" "$TMP/sft_cuda/metrics.jsonl" <<'PY'; then
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert not any("device_peak_bytes" in x for x in a), a
for y in b:
    assert 0 < y["device_peak_bytes"] <= y["device_capacity_bytes"], y
print("cuda SFT device peaks", [y["device_peak_bytes"] for y in b], "of", b[0]["device_capacity_bytes"])
PY
  ok "cuda SFT steps report their device peak (console and metrics.jsonl), cpu steps none"
else
  fail "cuda SFT steps do not report their device peak: $(grep step "$TMP/err" | head -2)"
fi
if python3 - "$TMP/sft_cpu/metrics.jsonl" "$TMP/sft_cuda/metrics.jsonl" <<'PY'; then
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        print("step", x["step"], k, "cpu", x[k], "cuda", y[k])
        if abs(x[k] - y[k]) > 1e-4 * abs(x[k]): sys.exit(1)
PY
  ok "cuda SFT losses and gradient norms equal the cpu's within 1e-4"
else
  fail "cuda SFT steps differ from the cpu's"
fi
expect_ok "the cuda SFT model generates on the cpu" "$FF_BIN" generate --model "$TMP/sft_cuda/final" --prompt "1+2=" \
  --max-new-tokens 2 --device cpu
finish
