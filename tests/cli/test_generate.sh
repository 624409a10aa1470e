#!/usr/bin/env bash
# `fuseflow generate`: greedy decoding equals transformers' on folders it wrote; sampling is
# reproducible by seed; stop strings and counts work; bad input is refused.
source "$(dirname "$0")/lib.sh"
D="$SRC/tests/cli/data"

expect_ok "help" "$FF_BIN" generate --help
for m in llama_f32 qwen2_bf16 mistral_sharded; do
  mapfile -t g < <(python3 -c "
import json; g=json.load(open('$D/$m.greedy.json'))
print(g['prompt']); print('' if g['add_special'] else '--raw'); print(g['max_new_tokens'])")
  prompt=${g[0]} raw=${g[1]} n=${g[2]}
  expect_ok "$m greedy" "$FF_BIN" generate --model "$D/$m" --prompt "$prompt" $raw --temperature 0 --max-new-tokens "$n" --json
  python3 - "$D/$m.greedy.json" "$TMP/out" <<'PY' && ok "$m greedy tokens match transformers" || fail "$m greedy differs from transformers"
import json, sys
want = json.load(open(sys.argv[1]))["tokens"]
got = json.loads(open(sys.argv[2]).readline())["tokens"]
print("want", want, "\ngot ", got)
sys.exit(got != want)
PY
done

# --weights bf16 on a checkpoint stored in BF16 holds the same weights: transformers' greedy tokens
mapfile -t g < <(python3 -c "
import json; g=json.load(open('$D/qwen2_bf16.greedy.json'))
print(g['prompt']); print('' if g['add_special'] else '--raw'); print(g['max_new_tokens'])")
expect_ok "qwen2_bf16 greedy, bf16 weights" "$FF_BIN" generate --model "$D/qwen2_bf16" --prompt "${g[0]}" ${g[1]} --temperature 0 \
  --max-new-tokens "${g[2]}" --json --weights bf16
python3 - "$D/qwen2_bf16.greedy.json" "$TMP/out" <<'PY' && ok "bf16 weights: greedy tokens match transformers" || fail "bf16 weights: greedy differs"
import json, sys
sys.exit(json.loads(open(sys.argv[2]).readline())["tokens"] != json.load(open(sys.argv[1]))["tokens"])
PY
expect_error "bad --weights" "--weights wants fp32 or bf16, got 'int8'" "$FF_BIN" generate --model "$D/qwen2_bf16" --prompt a --weights int8
# --kv-dtype bf16: the KV cache rounded; a sampled completion's log-probs move off the fp32 cache's, its length not
expect_ok "fp32 KV cache" "$FF_BIN" generate --model "$D/llama_f32" --prompt "ab" --seed 5 --json --max-new-tokens 12
cp "$TMP/out" "$TMP/kv32"
expect_ok "bf16 KV cache" "$FF_BIN" generate --model "$D/llama_f32" --prompt "ab" --seed 5 --json --max-new-tokens 12 --kv-dtype bf16
python3 - "$TMP/kv32" "$TMP/out" <<'PY' && ok "bf16 KV cache: other log-probs, near the fp32 cache's" || fail "bf16 KV cache: log-probs"
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
assert len(b["tokens"]) == 12 and all(x <= 0 for x in b["logprobs"]), b
n = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), 12)  # compare up to the first other token
d = [abs(x - y) for x, y in zip(a["logprobs"][:n], b["logprobs"][:n])]
print("first %d tokens equal; max |d logprob| there %.3g" % (n, max(d) if d else 0))
sys.exit(0 if n > 0 and 0 < max(d) < 0.1 else 1)
PY
expect_error "bad --kv-dtype" "--kv-dtype wants fp32 or bf16, got 'fp8'" "$FF_BIN" generate --model "$D/qwen2_bf16" --prompt a --kv-dtype fp8

M="$D/llama_f32"
expect_ok "sample seed 3" "$FF_BIN" generate --model "$M" --prompt "ab" --seed 3 --n 3 --json --max-new-tokens 16
cp "$TMP/out" "$TMP/s3a"
expect_ok "sample seed 3 again" "$FF_BIN" generate --model "$M" --prompt "ab" --seed 3 --n 3 --json --max-new-tokens 16
cmp -s "$TMP/out" "$TMP/s3a" && ok "same seed, same samples" || fail "same seed gave different samples"
expect_ok "sample seed 4" "$FF_BIN" generate --model "$M" --prompt "ab" --seed 4 --n 3 --json --max-new-tokens 16
cmp -s "$TMP/out" "$TMP/s3a" && fail "seed ignored" || ok "seed changes samples"
python3 - "$TMP/s3a" <<'PY' && ok "--n 3 gives 3 samples with logprobs" || fail "--n output"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["sample"] for l in lines] == [0, 1, 2], lines
for l in lines:
    assert len(l["tokens"]) == len(l["logprobs"]) == 16 and l["finish"] == "length", l
    assert all(p <= 0 for p in l["logprobs"])
assert len({tuple(l["tokens"]) for l in lines}) > 1, "samples are all equal"
PY
expect_ok "top-k 1 is greedy" "$FF_BIN" generate --model "$M" --prompt "12+34=" --raw --top-k 1 --seed 9 --json --max-new-tokens 12
python3 -c "
import json,sys; a=json.loads(open('$TMP/out').readline())['tokens']; b=json.load(open('$D/llama_f32.greedy.json'))['tokens']; sys.exit(a!=b)" \
  && ok "top-k 1 equals greedy" || fail "top-k 1 is not greedy"

# stop strings: the greedy continuation of "12+34=" is known; stop at its first printable byte
read -r stop_at stop < <(python3 -c "
import json; t=json.load(open('$D/llama_f32.greedy.json'))['tokens']
i=next(i for i,x in enumerate(t) if 33 <= x < 127); print(i + 1, chr(t[i]))")
expect_ok "single-token stop" "$FF_BIN" generate --model "$M" --prompt "12+34=" --raw --temperature 0 --max-new-tokens 12 --json --stop "$stop"
python3 -c "
import json,sys; o=json.loads(open('$TMP/out').readline()); sys.exit(not (o['finish']=='stop' and len(o['tokens'])==$stop_at))" \
  && ok "stops at the stop token" || fail "stop token: $(cat "$TMP/out")"
expect_ok "plain text output" "$FF_BIN" generate --model "$M" --prompt "hi" --max-new-tokens 4 --n 2
grep -q -- "--- sample 1" "$TMP/out" && ok "text output lists samples" || fail "text output"

expect_error "prompt longer than the context" "the prompt has 300 tokens; the model's context is 256" \
  "$FF_BIN" generate --model "$M" --prompt "$(printf 'x%.0s' {1..300})"
expect_error "empty prompt" "the prompt encodes to no tokens" "$FF_BIN" generate --model "$M" --prompt "" --raw
expect_error "bad top-p" "--top-p wants a number" "$FF_BIN" generate --model "$M" --prompt "a" --top-p 0
expect_error "bad temperature" "--temperature wants a number" "$FF_BIN" generate --model "$M" --prompt "a" --temperature -1
expect_error "missing prompt" "--model DIR and --prompt TEXT are required" "$FF_BIN" generate --model "$M"
cp -r "$M" "$TMP/notok" && rm "$TMP/notok/tokenizer.json"
expect_error "no tokenizer" "generate needs the model folder's tokenizer" "$FF_BIN" generate --model "$TMP/notok" --prompt "a"
expect_error "prompt not UTF-8" "not valid UTF-8" "$FF_BIN" generate --model "$M" --prompt $'\xff\xfe'
# a damaged model folder is refused before anything runs
cp -r "$M" "$TMP/cut" && python3 -c "import os; p='$TMP/cut/model.safetensors'; os.truncate(p, os.path.getsize(p) // 2)"
expect_error "truncated safetensors" "cut/model.safetensors: tensor .* the file is truncated" "$FF_BIN" generate --model "$TMP/cut" --prompt "a"
cp -r "$M" "$TMP/shape" && python3 -c "
import json; p='$TMP/shape/config.json'; c=json.load(open(p)); c['intermediate_size']=48; json.dump(c, open(p,'w'))"
expect_error "weights that do not match config.json" "has shape \[40, 16\], expected \[48, 16\]" "$FF_BIN" generate --model "$TMP/shape" --prompt "a"
finish
