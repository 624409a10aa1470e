#!/usr/bin/env bash
# `fuseflow init`: presets and YAML configs give the right architecture and parameter count,
# the folder loads in the other commands, seeds reproduce, bad configs are refused without
# leaving a folder behind.
source "$(dirname "$0")/lib.sh"

expect_ok "help" "$FF_BIN" init --help
expect_ok "tiny preset" "$FF_BIN" init --preset tiny --out "$TMP/tiny"
grep -q "1.02M parameters" "$TMP/out" && ok "tiny is ~1M parameters" || fail "tiny size: $(cat "$TMP/out")"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [[ -f "$TMP/tiny/$f" ]] || fail "tiny lacks $f"
done
python3 - "$TMP/tiny" <<'PY' && ok "tiny config.json" || fail "tiny config.json"
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
assert c["architectures"] == ["LlamaForCausalLM"] and c["vocab_size"] == 259, c
assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (256, 257, 258), c
assert c["num_hidden_layers"] == 4 and c["hidden_size"] == 128 and c["tie_word_embeddings"] is True, c
PY
expect_ok "same seed" "$FF_BIN" init --preset tiny --out "$TMP/tiny2"
cmp -s "$TMP/tiny/model.safetensors" "$TMP/tiny2/model.safetensors" && ok "deterministic weights" || fail "same seed, different weights"
expect_ok "other seed" "$FF_BIN" init --preset tiny --out "$TMP/tiny3" --seed 5
cmp -s "$TMP/tiny/model.safetensors" "$TMP/tiny3/model.safetensors" && fail "seed ignored" || ok "seed changes weights"

expect_ok "small preset" "$FF_BIN" init --preset small --out "$TMP/small" --dtype bf16
grep -qE "25\.[0-9]+M parameters" "$TMP/out" && ok "small is ~25M parameters" || fail "small size: $(cat "$TMP/out")"
rm -rf "$TMP/small"

expect_ok "overrides" "$FF_BIN" init --preset tiny --out "$TMP/ov" num_hidden_layers=2 hidden_size=64 num_attention_heads=2 num_key_value_heads=1
python3 -c "import json,sys; c=json.load(open('$TMP/ov/config.json')); sys.exit(not (c['num_hidden_layers']==2 and c['hidden_size']==64 and c['head_dim']==32))" \
  && ok "overrides reach config.json" || fail "overrides"

cat > "$TMP/q.yaml" <<'Y'
model_type: qwen2
hidden_size: 32
intermediate_size: 48
num_hidden_layers: 2
num_attention_heads: 4
num_key_value_heads: 2
max_position_embeddings: 64
value_head: true
Y
expect_ok "yaml config, qwen2 with value head, HF tokenizer" "$FF_BIN" init --config "$TMP/q.yaml" --tokenizer "$SRC/tests/modelio/data/tok_qwen2.json" --out "$TMP/q"
python3 - "$TMP/q" <<'PY' && ok "qwen2 folder: biases, score head, tokenizer vocab" || fail "qwen2 folder"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
assert c["architectures"] == ["Qwen2ForSequenceClassification"], c
assert c["vocab_size"] == 554, c["vocab_size"]
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
assert h["score.weight"]["shape"] == [1, 32]
assert h["model.layers.1.self_attn.k_proj.bias"]["shape"] == [16]
PY

expect_error "existing folder" "already exists.*--force" "$FF_BIN" init --preset tiny --out "$TMP/tiny"
echo stale > "$TMP/tiny/stale.txt"
expect_ok "--force replaces" "$FF_BIN" init --preset tiny --out "$TMP/tiny" --force
[[ -e "$TMP/tiny/stale.txt" ]] && fail "old folder contents survived --force" || ok "folder replaced as a whole"

printf 'hidden_size: 64\nnum_hidden_layer: 2\n' > "$TMP/typo.yaml"
expect_error "misspelled key" "typo.yaml:2: unknown key 'num_hidden_layer'.*num_hidden_layers" "$FF_BIN" init --config "$TMP/typo.yaml" --out "$TMP/bad1"
printf 'model_type: gpt2\n' > "$TMP/arch.yaml"
expect_error "unsupported architecture" "unsupported model_type 'gpt2'" "$FF_BIN" init --config "$TMP/arch.yaml" --out "$TMP/bad2"
expect_error "vocab smaller than the tokenizer" "'vocab_size' must be in \[259" "$FF_BIN" init --preset tiny vocab_size=100 --out "$TMP/bad3"
expect_error "heads that do not divide" "num_key_value_heads" "$FF_BIN" init --preset tiny num_key_value_heads=3 --out "$TMP/bad4"
expect_error "bad value type" "hidden_size.*integer" "$FF_BIN" init --preset tiny hidden_size=wide --out "$TMP/bad5"
expect_error "unknown preset" "unknown preset 'huge'" "$FF_BIN" init --preset huge --out "$TMP/bad6"
expect_error "both preset and config" "one of --preset" "$FF_BIN" init --preset tiny --config "$TMP/q.yaml" --out "$TMP/bad7"
expect_error "bad dtype" "--dtype must be" "$FF_BIN" init --preset tiny --dtype f8 --out "$TMP/bad8"
expect_error "missing tokenizer file" "nope.json: cannot open" "$FF_BIN" init --preset tiny --tokenizer "$TMP/nope.json" --out "$TMP/bad9"
expect_error "missing config file" "missing.yaml" "$FF_BIN" init --config "$TMP/missing.yaml" --out "$TMP/bad10"
expect_absent "no folder after errors" "$TMP/bad*"
finish
