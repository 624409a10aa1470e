#!/usr/bin/env bash
# `fuseflow schedule show`: the per-rank streams and the simulation for GPipe, 1F1B and
# interleaved 1F1B (bubble beside the formula, in-flight per rank, warm-up), forward-only, the
# JSON (parsed and checked against the formulas), the SVG timeline, and bad input refused with
# the flag named and nothing written.
source "$(dirname "$0")/lib.sh"

expect_ok "help" "$FF_BIN" schedule show --help
grep -q -- "--micro M" "$TMP/out" || fail "help does not list --micro"
"$FF_BIN" --help | grep -q "^  schedule " && ok "listed in fuseflow --help" || fail "fuseflow --help does not list schedule"

expect_ok "1f1b" "$FF_BIN" schedule show --pp 4 --micro 8
grep -qF "makespan 33, bubble 27.27% (formula (p-1)/(m+p-1) = 27.27%)" "$TMP/out" && ok "1f1b bubble = formula" || fail "1f1b bubble: $(grep makespan "$TMP/out")"
grep -q "^rank 0: F0 \[sa0>1\] F1 \[sa1>1\] F2 \[sa2>1\] F3 \[sa3>1 rg0<1\] B0 " "$TMP/out" && ok "stage 0: 3 warm-up forwards, then send forward + receive backward in one call" || fail "rank 0 stream: $(grep '^rank 0:' "$TMP/out")"
grep -q "^rank 3: \[ra0<2\] F0 B0 \[ra1<2 sg0>2\] F1 " "$TMP/out" && ok "last stage: no warm-up, send backward + receive forward in one call" || fail "rank 3 stream"
# in-flight column: p - s on stage s
awk '$1 ~ /^[0-9]+$/ && NF >= 5 {printf "%s ", $4}' "$TMP/out" | grep -qx "4 3 2 1 " && ok "1f1b in flight 4 3 2 1" || fail "1f1b in-flight: $(awk '$1 ~ /^[0-9]+$/ {print $4}' "$TMP/out" | tr '\n' ' ')"

expect_ok "gpipe" "$FF_BIN" schedule show --pp 4 --micro 8 --kind gpipe
awk '$1 ~ /^[0-9]+$/ && NF >= 5 {printf "%s ", $4}' "$TMP/out" | grep -qx "8 8 8 8 " && ok "gpipe holds all 8" || fail "gpipe in-flight"
grep -qF "bubble 27.27% (formula (p-1)/(m+p-1) = 27.27%)" "$TMP/out" && ok "gpipe bubble" || fail "gpipe bubble"

expect_ok "interleaved" "$FF_BIN" schedule show --pp 4 --micro 8 --vpp 2
grep -qF "bubble 15.79% (formula (p-1)/(v m+p-1) = 15.79%)" "$TMP/out" && ok "interleaved bubble = formula" || fail "interleaved bubble: $(grep makespan "$TMP/out")"
grep -q "^rank 0: F0.0 \[sa0.0>1\]" "$TMP/out" && ok "chunks shown" || fail "chunks not shown"

expect_ok "forward-only" "$FF_BIN" schedule show --pp 3 --micro 4 --forward-only
grep '^rank' "$TMP/out" | grep -qE " B[0-9]| step" && fail "forward-only has a backward or a step" || ok "forward-only: forwards alone"
grep -qF "bubble 33.33%" "$TMP/out" && ok "forward-only bubble (p-1)/(m+p-1)" || fail "forward-only bubble"

expect_ok "layers" "$FF_BIN" schedule show --pp 4 --micro 8 --layers 30
grep -qF "layers per virtual stage: 7 8 8 7" "$TMP/out" && ok "the planner's split" || fail "layer split: $(grep layers "$TMP/out")"

expect_ok "json" "$FF_BIN" schedule show --pp 4 --micro 8 --vpp 2 --json
python3 - "$TMP/out" <<'PY' && ok "json: streams, formula, in-flight" || fail "json content"
import json, sys
d = json.load(open(sys.argv[1]))
p, m, v = 4, 8, 2
assert d["kind"] == "interleaved" and d["pp"] == p and d["vpp"] == v and d["micro"] == m
assert len(d["ranks"]) == p
for r in d["ranks"]:
    ops = [i["op"] for i in r["instructions"]]
    assert ops.count("forward") == m * v and ops.count("backward") == m * v and ops[-1] == "optimizer_step", r["rank"]
    for i in r["instructions"]:
        if i["op"].startswith(("send", "recv")):
            assert "peer" in i and "call" in i, i
st = [s["rank"] for s in d["models"][0]["stages"]]
assert st == [k % p for k in range(p * v)], st
sim = d["simulation"]
want = (p - 1) / (v * m + p - 1)
assert abs(sim["bubble_fraction"] - want) < 1e-9 and abs(sim["formula_bubble_fraction"] - want) < 1e-9, sim
warm = [min(2 * (p - s - 1) + (v - 1) * p, m * v) for s in range(p)]
assert [r["peak_in_flight"] for r in sim["ranks"]] == [w + 1 for w in warm], sim["ranks"]
PY

expect_ok "svg" "$FF_BIN" schedule show --pp 2 --micro 4 --svg "$TMP/t.svg"
n=$(grep -o "<rect" "$TMP/t.svg" | wc -l)
# background, 2 rows, 8 F + 8 B + 2 steps, 3 legend swatches
((n == 24)) && ok "svg: one rect per forward, backward and step" || fail "svg has $n rects"

expect_error "pp 0" "--pp wants an integer" "$FF_BIN" schedule show --pp 0 --micro 4
expect_error "micro 0" "--micro wants an integer" "$FF_BIN" schedule show --pp 2 --micro 0
expect_error "past int32" "--micro wants an integer in \[1, 2147483647\], got '2147483648'" "$FF_BIN" schedule show --pp 2 --micro 2147483648
expect_error "pp required" "--pp is required" "$FF_BIN" schedule show --micro 4
expect_error "vpp with gpipe" "--vpp 2 needs --kind interleaved" "$FF_BIN" schedule show --pp 2 --micro 4 --vpp 2 --kind gpipe
expect_error "interleaved needs m % p == 0" "--micro 6 is not a multiple of --pp 4" "$FF_BIN" schedule show --pp 4 --micro 6 --vpp 2
expect_error "interleaved needs chunks" "--kind interleaved needs --vpp" "$FF_BIN" schedule show --pp 4 --micro 8 --kind interleaved
expect_error "unknown kind" "--kind: .*unknown schedule 'zb'" "$FF_BIN" schedule show --pp 4 --micro 8 --kind zb
expect_error "too big" "more than the 16777216 a schedule may hold" "$FF_BIN" schedule show --pp 100000 --micro 100000
expect_error "too few layers" "4 virtual stages but 3 layers" "$FF_BIN" schedule show --pp 4 --micro 8 --layers 3
expect_error "unknown subcommand" "unknown subcommand 'list'" "$FF_BIN" schedule list
expect_error "svg folder missing" "nope/t.svg" "$FF_BIN" schedule show --pp 2 --micro 2 --svg "$TMP/nope/t.svg"
[[ -s "$TMP/out" ]] && fail "printed a schedule before refusing the svg path" || ok "nothing printed before the svg error"
finish
