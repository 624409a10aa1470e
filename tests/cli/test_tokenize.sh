#!/usr/bin/env bash
# `fuseflow tokenize`: ids equal Hugging Face's (the committed tokenizer fixtures' expected
# ids, with and without the template), decoding gives back the text, "\u0000" in a JSON
# string is accepted, text and JSONL both ways, from a file or stdin; bad input is refused
# with a message naming the line and the problem.
source "$(dirname "$0")/lib.sh"
M="$SRC/tests/modelio/data"
TK=(--tokenizer "$M/tok_llama3.json")

expect_ok "help" "$FF_BIN" tokenize --help
grep -q -- "--decode" "$TMP/out" && ok "help names --decode" || fail "help lacks --decode"

# the first 120 strings of the Llama 3 fixture, as {"text"} lines; the ids Hugging Face gave
python3 - "$M/tok_llama3.expected.jsonl" "$TMP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")][:120]
with open(sys.argv[2] + "/in.jsonl", "w") as f:
    for r in rows: f.write(json.dumps({"text": r["text"]}) + "\n")
json.dump(rows, open(sys.argv[2] + "/rows.json", "w"))
PY
check_rows() { # check_rows FIELD OUTFILE KEY: each output line's KEY equals the fixture's FIELD
  python3 - "$TMP/rows.json" "$2" "$1" "$3" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
assert len(got) == len(rows), (len(got), len(rows))
bad = [i for i, (r, g) in enumerate(zip(rows, got)) if r[sys.argv[3]] != g[sys.argv[4]]]
print(f"{len(rows)} lines, {len(bad)} differ", bad[:5])
sys.exit(1 if bad else 0)
PY
}
expect_ok "encode JSONL" "$FF_BIN" tokenize "${TK[@]}" --jsonl --pieces "$TMP/in.jsonl"
cp "$TMP/out" "$TMP/enc.jsonl"
check_rows ids "$TMP/enc.jsonl" ids && ok "ids equal Hugging Face's" || fail "ids differ from Hugging Face's"
python3 -c "
import json, sys
for l in open('$TMP/enc.jsonl'):
    o = json.loads(l); assert len(o['pieces']) == len(o['ids']) and all(isinstance(p, str) for p in o['pieces'])
" && ok "a piece per id" || fail "pieces do not match ids"
expect_ok "encode JSONL from stdin, with the template" bash -c "'$FF_BIN' tokenize ${TK[*]} --jsonl --add-special < '$TMP/in.jsonl'"
check_rows ids_add_special "$TMP/out" ids && ok "template ids equal Hugging Face's" || fail "template ids differ"
expect_ok "special tokens as plain text" "$FF_BIN" tokenize "${TK[@]}" --jsonl --plain-special "$TMP/in.jsonl"
check_rows ids_plain_special "$TMP/out" ids && ok "plain-special ids equal Hugging Face's" || fail "plain-special ids differ"
python3 -c "
import json
for l in open('$TMP/enc.jsonl'): print(json.dumps({'ids': json.loads(l)['ids']}))" > "$TMP/ids.jsonl"
expect_ok "decode JSONL" "$FF_BIN" tokenize "${TK[@]}" --jsonl --decode "$TMP/ids.jsonl"
check_rows decoded "$TMP/out" text && ok "decoding equals Hugging Face's" || fail "decoding differs"

# text in, ids out, and back: the same bytes (a file with a NUL, a tab, CJK, emoji, newlines)
printf 'Hello world\n\tcaf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 12345\n\x00end<|begin_of_text|>' > "$TMP/text.txt"
expect_ok "encode text" "$FF_BIN" tokenize "${TK[@]}" "$TMP/text.txt"
cp "$TMP/out" "$TMP/text.ids"
[[ $(wc -l < "$TMP/text.ids") -eq 1 ]] && ok "ids on one line" || fail "ids not on one line"
expect_ok "decode ids" bash -c "'$FF_BIN' tokenize ${TK[*]} --decode - < '$TMP/text.ids'"
cmp -s "$TMP/out" "$TMP/text.txt" && ok "decode(encode(text)) is the text" || fail "round trip changed the text"
expect_ok "pieces" "$FF_BIN" tokenize "${TK[@]}" --pieces "$TMP/text.txt"
[[ $(wc -l < "$TMP/out") -eq $(wc -w < "$TMP/text.ids") ]] && ok "one 'id<TAB>piece' line per id" || fail "pieces lines != ids"

# "\u0000" in a JSON string is valid JSON: the same ids as the raw bytes
printf 'a\x00b' > "$TMP/nul.txt"
expect_ok "encode a NUL byte" "$FF_BIN" tokenize "${TK[@]}" "$TMP/nul.txt"
want=$(tr ' ' ',' < "$TMP/out")
printf '{"text": "a\\u0000b"}\n' > "$TMP/nul.jsonl"
expect_ok "JSONL text with \\u0000 is accepted" "$FF_BIN" tokenize "${TK[@]}" --jsonl "$TMP/nul.jsonl"
grep -q "\"ids\":\[$want\]" "$TMP/out" && ok "\\u0000 encodes as the NUL byte" || fail "\\u0000: got $(cat "$TMP/out"), want [$want]"

# a model folder: its tokenizer.json and tokenizer_config.json
mkdir -p "$TMP/model" && cp "$M/tok_qwen2.json" "$TMP/model/tokenizer.json"
printf 'Hi <|im_end|>' | "$FF_BIN" tokenize --model "$TMP/model" > "$TMP/out" 2>"$TMP/err" && grep -qE "(^| )2$" "$TMP/out" &&
  ok "--model DIR, special token to its id" || fail "--model DIR: $(cat "$TMP/out" "$TMP/err")"

# ---- bad input ----
expect_error "no tokenizer" "give one of --model DIR or --tokenizer FILE" "$FF_BIN" tokenize "$TMP/text.txt"
expect_error "both" "give one of --model DIR or --tokenizer FILE" "$FF_BIN" tokenize --model "$TMP/model" "${TK[@]}"
expect_error "missing tokenizer" "nothere.json: cannot open" "$FF_BIN" tokenize --tokenizer "$TMP/nothere.json" "$TMP/text.txt"
expect_error "missing model folder" "nodir/tokenizer.json: cannot open" "$FF_BIN" tokenize --model "$TMP/nodir" "$TMP/text.txt"
expect_error "missing input" "nothere.txt: cannot open" "$FF_BIN" tokenize "${TK[@]}" "$TMP/nothere.txt"
printf '{"text": "ok"}\n{"text": "a\n' > "$TMP/bad.jsonl"
expect_error "malformed JSONL" "bad.jsonl:2: malformed JSON" "$FF_BIN" tokenize "${TK[@]}" --jsonl "$TMP/bad.jsonl"
printf '{"text": "ok"}\n\n{"prompt": "x"}\n' > "$TMP/nokey.jsonl"
expect_error "no text field" "nokey.jsonl:3: expected a string field \"text\"" "$FF_BIN" tokenize "${TK[@]}" --jsonl "$TMP/nokey.jsonl"
printf 'ab\xffcd' > "$TMP/latin1.txt"
expect_error "not UTF-8" "latin1.txt: .*not valid UTF-8 \(at byte 2\)" "$FF_BIN" tokenize "${TK[@]}" "$TMP/latin1.txt"
echo "12 x7 5" > "$TMP/notids.txt"
expect_error "not an id" "token 1 'x7' is not a token id" "$FF_BIN" tokenize "${TK[@]}" --decode "$TMP/notids.txt"
echo "12 99999" > "$TMP/range.txt"
expect_error "id out of range" "token id 99999 at position 1 is not in the vocabulary" "$FF_BIN" tokenize "${TK[@]}" --decode "$TMP/range.txt"
printf '{"ids": [1, "a"]}\n' > "$TMP/badids.jsonl"
expect_error "JSONL id not an integer" "badids.jsonl:1: ids\[1\] is not a token id" "$FF_BIN" tokenize "${TK[@]}" --jsonl --decode "$TMP/badids.jsonl"
expect_error "--pieces with --decode" "--pieces, --add-special and --plain-special are for encoding" "$FF_BIN" tokenize "${TK[@]}" --decode --pieces
expect_error "unknown option" "unknown option '--ids'" "$FF_BIN" tokenize "${TK[@]}" --ids
finish
