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

# repeat: the long-tail workload's law (median and p99 of the counts), letters, seeds, bad options
expect_ok "repeat" "$FF_BIN" dataset repeat --median 8 --p99-ratio 10 --max 128 --train 4000 --test 200 --seed 3 --out "$TMP/r"
grep -q "median 8, p99" "$TMP/out" || fail "repeat does not report its counts"
python3 - "$TMP/r" <<'PY' && ok "repeat counts follow the log-normal" || fail "repeat content"
import json, re, sys
d = sys.argv[1]
train = [json.loads(l) for l in open(d + "/train.jsonl")]
test = [json.loads(l) for l in open(d + "/test.jsonl")]
assert len(train) == 4000 and len(test) == 200
ns = []
for e in train + test:
    n, c = re.fullmatch(r"(\d+)\*([a-z])=", e["prompt"]).groups()
    assert e["answer"] == e["response"] == c * int(n), e
    ns.append(int(n))
ns = sorted(ns[:4000])
med, p99 = ns[2000], ns[int(0.99 * 3999)]
assert 7 <= med <= 9, med
assert 60 <= p99 <= 110, p99   # 10x the median, sampling noise at 40 samples above it
assert max(ns) <= 128 and min(ns) >= 1
PY
expect_ok "repeat same seed" "$FF_BIN" dataset repeat --train 100 --test 10 --seed 3 --out "$TMP/r2"
expect_ok "repeat same seed again" "$FF_BIN" dataset repeat --train 100 --test 10 --seed 3 --out "$TMP/r3"
cmp -s "$TMP/r2/train.jsonl" "$TMP/r3/train.jsonl" && ok "repeat deterministic" || fail "repeat: same seed gave different files"
expect_error "repeat median above max" "--median 200 is more than --max 100" "$FF_BIN" dataset repeat --median 200 --max 100 --out "$TMP/x"
expect_error "repeat ratio below 1" "--p99-ratio" "$FF_BIN" dataset repeat --p99-ratio 0.5 --out "$TMP/x"
expect_error "unknown dataset" "available: arith, repeat" "$FF_BIN" dataset nope --out "$TMP/x"
finish
