#!/usr/bin/env bash
# `fuseflow dataset arith`: right answers, seeded, test set distinct and disjoint from train,
# bad options refused without output.
source "$(dirname "$0")/lib.sh"

expect_ok "help" "$FF_BIN" dataset arith --help
grep -q "train.jsonl" "$TMP/out" || fail "help does not mention train.jsonl"
expect_ok "generate" "$FF_BIN" dataset arith --digits 3 --train 2000 --test 300 --seed 1 --out "$TMP/a"
expect_ok "same seed" "$FF_BIN" dataset arith --digits 3 --train 2000 --test 300 --seed 1 --out "$TMP/b"
expect_ok "other seed" "$FF_BIN" dataset arith --digits 3 --train 2000 --test 300 --seed 2 --out "$TMP/c"
cmp -s "$TMP/a/train.jsonl" "$TMP/b/train.jsonl" && cmp -s "$TMP/a/test.jsonl" "$TMP/b/test.jsonl" && ok "deterministic" || fail "same seed gave different files"
cmp -s "$TMP/a/train.jsonl" "$TMP/c/train.jsonl" && fail "different seeds gave the same file" || ok "seed matters"

python3 - "$TMP/a" <<'PY' && ok "answers, counts, digits, disjoint test set" || fail "dataset content"
import json, sys
d = sys.argv[1]
train = [json.loads(l) for l in open(d + "/train.jsonl")]
test = [json.loads(l) for l in open(d + "/test.jsonl")]
assert len(train) == 2000 and len(test) == 300, (len(train), len(test))
for e in train + test:
    assert set(e) == {"prompt", "response", "answer"}, e
    p = e["prompt"]
    assert p.endswith("="), p
    a, b = p[:-1].split("+")
    assert 1 <= len(a) <= 3 and 1 <= len(b) <= 3, p
    assert str(int(a) + int(b)) == e["answer"] == e["response"], e
tp = [e["prompt"] for e in test]
assert len(set(tp)) == len(tp), "test problems repeat"
assert not set(tp) & {e["prompt"] for e in train}, "a test problem is in train"
lens = {len(e["prompt"][:-1].split("+")[0]) for e in train}
assert lens == {1, 2, 3}, lens
PY

expect_ok "all operators" "$FF_BIN" dataset arith --digits 2 --min-digits 2 --ops '+-*' --train 300 --test 50 --out "$TMP/ops"
python3 - "$TMP/ops" <<'PY' && ok "operators and min-digits" || fail "operators"
import json, re, sys
seen = set()
for l in open(sys.argv[1] + "/train.jsonl"):
    e = json.loads(l)
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", e["prompt"]).groups()
    assert len(a) == 2 and len(b) == 2
    seen.add(op)
    assert int(e["answer"]) == eval(a + op + b), e
assert seen == {"+", "-", "*"}, seen
PY

expect_error "digits out of range" "--digits wants an integer in \[1, 9\]" "$FF_BIN" dataset arith --digits 12 --out "$TMP/x"
expect_error "unknown option" "unknown option '--nope'" "$FF_BIN" dataset arith --nope 1 --out "$TMP/x"
expect_error "missing --out" "--out DIR is required" "$FF_BIN" dataset arith
expect_error "test set too large" "only 100 distinct problems" "$FF_BIN" dataset arith --digits 1 --test 60 --out "$TMP/x"
expect_error "bad operator" "--ops takes characters from" "$FF_BIN" dataset arith --ops '/' --out "$TMP/x"
expect_error "min above max" "--min-digits 3 is more than --digits 2" "$FF_BIN" dataset arith --digits 2 --min-digits 3 --out "$TMP/x"
expect_error "unknown dataset" "unknown dataset 'gsm8k'" "$FF_BIN" dataset gsm8k --out "$TMP/x"
expect_absent "no output after errors" "$TMP/x/*.jsonl"
touch "$TMP/file"
expect_error "out is a file" "not a directory|cannot create" "$FF_BIN" dataset arith --out "$TMP/file/sub"
finish
