#!/usr/bin/env bash
# `fuseflow logprobs` against Hugging Face transformers on folders it wrote (F32, BF16,
# sharded; byte, Qwen2 and Llama 3 tokenizers), then every kind of bad input: a clear
# message, a non-zero exit, and no output file.
source "$(dirname "$0")/lib.sh"
D="$SRC/tests/cli/data"

compare() { # compare NAME OUT: our log-probs vs transformers' (tests/cli/make_fixtures.py)
  python3 - "$D/$1.expected.jsonl" "$2" <<'PY'
import json, sys
exp = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
got = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
assert len(exp) == len(got), (len(exp), len(got))
worst = 0.0
for e, g in zip(exp, got):
    assert len(e) == len(g), (len(e), len(g))
    worst = max([worst] + [abs(a - b) for a, b in zip(e, g)])
print("max |diff| vs transformers: %.2e" % worst)
sys.exit(0 if worst < 1e-4 else 1)
PY
}

expect_ok "help" "$FF_BIN" logprobs --help
for m in llama_f32 qwen2_bf16 mistral_sharded; do
  extra=()
  [[ $m == mistral_sharded ]] && extra=(--add-special)
  expect_ok "$m runs" "$FF_BIN" logprobs --model "$D/$m" --input "$D/$m.input.jsonl" --output "$TMP/$m.out" "${extra[@]}"
  if compare "$m" "$TMP/$m.out"; then ok "$m matches transformers"; else fail "$m differs from transformers"; fi
done
# stdout, and small batches give the same numbers as one big batch
expect_ok "stdout, batches of 8 tokens" "$FF_BIN" logprobs --model "$D/llama_f32" --input "$D/llama_f32.input.jsonl" --batch-tokens 8
cp "$TMP/out" "$TMP/small_batches.out"
if compare llama_f32 "$TMP/small_batches.out"; then ok "batching does not change results"; else fail "batched results differ"; fi

# --weights bf16: a checkpoint stored in BF16 loses nothing (the transformers numbers to 1e-4);
# an F32 one is rounded (near, not equal); a bad value is refused naming the choices
expect_ok "bf16 weights of a BF16 checkpoint" "$FF_BIN" logprobs --model "$D/qwen2_bf16" --input "$D/qwen2_bf16.input.jsonl" \
  --output "$TMP/qwen2_w16.out" --weights bf16
if compare qwen2_bf16 "$TMP/qwen2_w16.out"; then ok "bf16 weights of a BF16 checkpoint match transformers"; else fail "bf16 weights of a BF16 checkpoint differ"; fi
expect_ok "bf16 weights of an F32 checkpoint" "$FF_BIN" logprobs --model "$D/llama_f32" --input "$D/llama_f32.input.jsonl" \
  --output "$TMP/llama_w16.out" --weights bf16
if compare llama_f32 "$TMP/llama_w16.out" >/dev/null; then fail "rounding to bf16 changed nothing"; else ok "rounding to bf16 moves the log-probs"; fi
python3 - "$TMP/llama_w16.out" "$TMP/llama_f32.out" <<'PY' && ok "bf16 weights: log-probs within 3% of their size of fp32" || fail "bf16 weights: log-probs too far from fp32"
import json, sys
a = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
b = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
worst = max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p, q))
big = max(abs(y) for q in b for y in q)
print("bf16 weights against fp32: max |diff| %.3g (of log-probs up to %.3g)" % (worst, big))
sys.exit(0 if 0 < worst < 0.03 * big else 1)  # bf16 keeps 8 significant bits
PY
expect_error "bad --weights" "--weights wants fp32 or bf16, got 'fp16'" "$FF_BIN" logprobs --model "$D/llama_f32" \
  --input "$D/llama_f32.input.jsonl" --weights fp16

# ---- bad input ----
M="$TMP/model"
fresh() { rm -rf "$M"; cp -r "$D/llama_f32" "$M"; }
run() { "$FF_BIN" logprobs --model "$M" --input "$1" --output "$TMP/result.jsonl"; }
echo '{"tokens": [1, 2, 3]}' > "$TMP/good.jsonl"

fresh
printf '{"tokens": [1, 2]}\n{"tokens": [5, 259, 7]}\n' > "$TMP/range.jsonl"
expect_error "token id out of range" "range.jsonl:2: token id 259 at position 1 is out of range for vocab_size 259" run "$TMP/range.jsonl"
printf '{"tokens": [1, 2]}\n{"tokens": [1, 2\n' > "$TMP/malformed.jsonl"
expect_error "malformed JSONL" "malformed.jsonl:2: malformed JSON" run "$TMP/malformed.jsonl"
printf '{"tokens": [1, "x"]}\n' > "$TMP/nonint.jsonl"
expect_error "non-integer token" "nonint.jsonl:1: token 1 is not an integer" run "$TMP/nonint.jsonl"
printf '{"ids": [1]}\n' > "$TMP/nokey.jsonl"
expect_error "neither tokens nor text" "nokey.jsonl:1: expected \{\"tokens\"" run "$TMP/nokey.jsonl"
printf '{"tokens": []}\n' > "$TMP/empty.jsonl"
expect_error "empty sequence" "empty.jsonl:1: the sequence is empty" run "$TMP/empty.jsonl"
: > "$TMP/nothing.jsonl"
expect_error "an empty file" "nothing.jsonl: no input lines: the file is empty or holds only blank lines .hint: write one JSON object per line" \
  run "$TMP/nothing.jsonl"
printf '\n  \n\t\n' > "$TMP/blank.jsonl"
expect_error "a file of blank lines" "blank.jsonl: no input lines: the file is empty or holds only blank lines" run "$TMP/blank.jsonl"
python3 -c "import json; print(json.dumps({'tokens': [1] * 300}))" > "$TMP/long.jsonl"
expect_error "longer than the context" "long.jsonl:1: 300 tokens, more than the model's max_position_embeddings 256" run "$TMP/long.jsonl"
expect_error "missing input" "nothere.jsonl: cannot open" run "$TMP/nothere.jsonl"
rm "$M/tokenizer.json"
printf '{"text": "hi"}\n' > "$TMP/text.jsonl"
expect_error "text without a tokenizer" "text.jsonl:1: a \"text\" line needs a tokenizer" run "$TMP/text.jsonl"

fresh
python3 - "$M/model.safetensors" <<'PY'
import os, sys
p = sys.argv[1]; os.truncate(p, os.path.getsize(p) - 100)
PY
expect_error "truncated safetensors" "model.safetensors: .*(data section has only|truncated)" run "$TMP/good.jsonl"

st_edit() { # st_edit PYTHON-EXPR-ON-h: rewrite the safetensors header
  python3 - "$M/model.safetensors" "$1" <<'PY'
import json, struct, sys
p, expr = sys.argv[1], sys.argv[2]
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
exec(expr)
hb = json.dumps(h).encode()
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + data)
PY
}
fresh; st_edit 'h["model.norm.weight"]["data_offsets"][0] -= 4'
expect_error "header lies about a size" "tensor 'model.norm.weight': data_offsets span 68 bytes but shape and dtype F32 need 64" run "$TMP/good.jsonl"
fresh; st_edit 'h["model.norm.weight"]["data_offsets"] = [0, 64]'
expect_error "header lies about offsets (overlap)" "overlap" run "$TMP/good.jsonl"
fresh; st_edit 'h["model.norm.weight"]["data_offsets"] = [10**9, 10**9 + 64]'
expect_error "offsets beyond the file" "data ends at byte 1000000064" run "$TMP/good.jsonl"
fresh; st_edit 'h["model.norm.weight"]["dtype"] = "F8_E4M3"; h["model.norm.weight"]["shape"] = [64]'
expect_error "unsupported dtype" "unsupported dtype 'F8_E4M3'" run "$TMP/good.jsonl"
fresh; python3 -c "
import struct; p='$M/model.safetensors'; raw=open(p,'rb').read()
open(p,'wb').write(struct.pack('<Q', 10**12) + raw[8:])"
expect_error "header length beyond the file" "header length 1000000000000 goes beyond the end of the file" run "$TMP/good.jsonl"
fresh; python3 -c "
import struct; p='$M/model.safetensors'; raw=open(p,'rb').read(); n=struct.unpack('<Q', raw[:8])[0]
open(p,'wb').write(raw[:8] + b'{\"x\":' + b' ' * (n - 5) + raw[8+n:])"
expect_error "malformed header JSON" "malformed JSON header" run "$TMP/good.jsonl"
fresh; st_edit 'h["model.layers.0.mlp.up_proj.weight"]["shape"] = [20, 32]'
expect_error "wrong shape" "tensor 'model.layers.0.mlp.up_proj.weight' has shape \[20, 32\], expected \[40, 16\]" run "$TMP/good.jsonl"
fresh; st_edit 'h["model.layers.0.mlp.up_proj.weight2"] = h.pop("model.layers.0.mlp.up_proj.weight")'
expect_error "missing tensor" "missing tensor 'model.layers.0.mlp.up_proj.weight'" run "$TMP/good.jsonl"
fresh; rm "$M/model.safetensors"
expect_error "missing safetensors" "no model.safetensors" run "$TMP/good.jsonl"
fresh; python3 -c "
import json; p='$M/config.json'; c=json.load(open(p)); c['architectures']=['GPT2LMHeadModel']; c['model_type']='gpt2'; json.dump(c, open(p,'w'))"
expect_error "unsupported architecture" "config.json: unsupported architecture 'GPT2LMHeadModel'" run "$TMP/good.jsonl"
fresh; python3 -c "
import json; p='$M/config.json'; c=json.load(open(p)); c['rope_scaling']={'rope_type':'yarn','factor':2.0}; json.dump(c, open(p,'w'))"
expect_error "unsupported rope scaling" "unsupported rope scaling 'yarn'" run "$TMP/good.jsonl"
fresh; printf '{"model_type": "llama",' > "$M/config.json"
expect_error "malformed config.json" "config.json: malformed JSON" run "$TMP/good.jsonl"
expect_error "missing model folder" "nomodel/config.json: cannot open" "$FF_BIN" logprobs --model "$TMP/nomodel" --input "$TMP/good.jsonl" --output "$TMP/result.jsonl"
expect_error "missing --input" "--model DIR and --input FILE are required" "$FF_BIN" logprobs --model "$D/llama_f32"
expect_absent "no partial output file" "$TMP/result.jsonl" "$TMP/result.jsonl.tmp*"
finish
