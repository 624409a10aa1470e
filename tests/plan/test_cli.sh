#!/usr/bin/env bash
# `fuseflow plan` end to end: the report, the JSON keys the issue names (with the Llama 3 405B
# figures), files with overrides, config.json, matrices, search, and bad input with its exit code
# and message. Env: FF_BIN (the fuseflow binary), FF_SOURCE_DIR.
set -uo pipefail
FF_BIN=${FF_BIN:-}
SRC=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
if [[ -z "$FF_BIN" || ! -x "$FF_BIN" ]]; then echo "SKIPPED: no fuseflow binary (FF_BIN)"; exit 77; fi
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
TMP=$(mktemp -d /tmp/ff_plan_cli_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# expect RC PATTERN -- ARGS: run the command, check its exit code and that stdout+stderr match
expect() {
  local want_rc=$1 pattern=$2; shift 3
  local out rc
  out=$("$FF_BIN" plan "$@" 2>&1); rc=$?
  [[ $rc == "$want_rc" ]] || fail "plan $* exited $rc, wanted $want_rc: $(echo "$out" | tail -3)"
  grep -qE -- "$pattern" <<<"$out" || fail "plan $* did not print /$pattern/: $(echo "$out" | tail -3)"
}

expect 0 "usage: fuseflow plan" -- --help
expect 0 "DOES NOT FIT: the largest is stage 2" -- --model llama3-405b --gpus 16384 --layout TP8-PP16-DP128 --seq 8192 --micro-batches 16
expect 0 "rank = tp \+ 8 pp \+ 128 dp; server = rank / 8" -- --model llama3-405b --gpus 16384 --layout TP8-PP16-DP128 --seq 8192 --micro-batches 16
expect 0 "126 layers on 16 stages: 7 8 8 8 8 8 8 8 8 8 8 8 8 8 8 7" -- --model llama3-405b --gpus 16384 --layout TP8-PP16-DP128 --seq 8192 --micro-batches 16
expect 0 "stays on rails" -- "$SRC/examples/plan/gpt3-175b.yaml"

# the JSON object and its figures (section 3.7 of the chapter)
"$FF_BIN" plan "$SRC/examples/plan/llama3-405b-128k.yaml" --json > "$TMP/p.json" || fail "json run"
$PY - "$TMP/p.json" <<'EOF' || fail "JSON keys or values"
import json, sys
d = json.load(open(sys.argv[1]))
m, t, tm = d["memory"], d["traffic"], d["time"]
for k in ("state_bytes", "activation_bytes", "total_bytes"): assert m[k] > 0, k
for dim in ("tp", "cp", "pp", "dp", "ep"):
    assert "bytes" in t[dim] and "link" in t[dim], dim
assert t["tp"]["link"] == "nvlink" and t["cp"]["link"] == "nic" and t["dp"]["link"] == "nic" and t["ep"]["link"] == "none"
assert abs(t["cp"]["bytes_mean"] / 24e9 - 1) < 0.01, t["cp"]["bytes_mean"]
assert abs(t["dp"]["bytes_mean"] / 18.8e9 - 1) < 0.01
assert abs(tm["bubble_fraction"] - 15 / 31) < 1e-9
assert tm["iteration_s"] > 0 and abs(tm["iteration_s"] - tm["bubble_s"] - tm["last_s"] - tm["sync_s"]) < 1e-6 * tm["iteration_s"]
assert d["layout"]["stage_layers"] == [7] + [8] * 14 + [7]
assert d["network"]["cross_domain_on_rails"] is True
EOF

# overrides on top of a file, and flags with =
out=$("$FF_BIN" plan "$SRC/examples/plan/llama3-405b-8k.yaml" layout.degrees=TP8-PP16-DP64 cluster.gpus=8192 workload.micro_batches=32 --json) || fail "overrides"
$PY -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["layout"]["dp"]==64 and d["workload"]["global_batch"]==2048, d["layout"]' "$out" || fail "override values"
expect 0 "TP4 CP1 PP2 DP1" -- --model llama3-8b --tp=4 --pp=2 --seq=2048

# a config.json, a custom cluster, rail-only
expect 0 "1.24 B parameters" -- --config "$SRC/examples/plan/tiny-config.json" --gpus 8 --seq 4096
expect 0 "rail-only" -- "$SRC/examples/plan/custom-rail-only.yaml"
expect 0 "crosses rails" -- "$SRC/examples/plan/mixtral-8x7b-ep.yaml" layout.order=tp,cp,pp,dp

# matrices
expect 0 "wrote .*gpt3.server.svg" -- "$SRC/examples/plan/gpt3-175b.yaml" --matrix "$TMP/gpt3"
for f in gpu.csv server.csv ranks.csv gpu.svg server.svg; do [[ -s "$TMP/gpt3.$f" ]] || fail "missing $f"; done
[[ $(wc -l < "$TMP/gpt3.ranks.csv") == 129 ]] || fail "ranks.csv lines"
expect 0 "wrote .*/m.gpu.csv" -- "$SRC/examples/plan/gpt3-175b.yaml" --matrix "$TMP/m.csv" --matrix-limit 16

# search
expect 0 "layouts evaluated in" -- search --model llama3-70b --gpus 256 --seq 8192 --global-batch 512 --top 3
"$FF_BIN" plan search --model llama3-70b --gpus 256 --seq 8192 --global-batch 512 --json > "$TMP/s.json" || fail "search json"
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["candidates"]; assert len(c)==10 and all(c[i]["iteration_s"]<=c[i+1]["iteration_s"] for i in range(9))' "$TMP/s.json" || fail "search ranking"

# network at a cluster size: 16,384 GPUs on radix-64 switches
expect 0 "non-blocking Clos  3 tier\(s\), 1280 switches, 98304 transceivers" -- network --gpus 16384
expect 0 "rail-only          8 rails, 2 tier\(s\), 768 switches, 65536 transceivers" -- network --gpus 16384
"$FF_BIN" plan network --gpus 32768 --gpus-per-domain 256 --json > "$TMP/n.json" || fail "network json"
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["rail_only"]["switches"] < d["clos"]["switches"]' "$TMP/n.json" || fail "network values"
expect 2 "give the cluster size with --gpus" -- network
expect 2 "radix" -- network --gpus 64 --radix 63

# bad input: exit 2 for bad usage, 1 for a layout that cannot run, and a message that says why
expect 2 "unknown model preset" -- --model llama9
expect 2 "unknown option '--tpp' \(hint: did you mean --tp\?\)" -- --model llama3-8b --tpp 2
expect 2 "--tp needs a value" -- --model llama3-8b --tp
expect 2 "unknown key|layout.tpp" -- --model llama3-8b layout.tpp=2
expect 2 "wrong kind of unit" -- --model llama3-8b --hbm 450GB/s
expect 2 "no_such.yaml" -- no_such.yaml
expect 0 "each replicated on 2 GPUs" -- --model llama3-8b --tp 16 --gpus 16
expect 1 "TP 12 and the 8 key-value heads: neither divides the other" -- --model llama3-8b --tp 12 --gpus 24
expect 1 "but the cluster has 16 GPUs" -- --model llama3-8b --gpus 16 --layout TP8-DP4
expect 1 "PP 64 has more stages than the 32 layers" -- --model llama3-8b --pp 64
expect 1 "EP 8 without experts" -- --model llama3-8b --gpus 8 --ep 8
printf '{"hidden_size": 64,\n "num_hidden_layers": oops}\n' > "$TMP/bad.json"
expect 2 "bad.json:2:" -- --config "$TMP/bad.json"
expect 2 "give the cluster size with --gpus" -- search --model llama3-8b --global-batch 64
expect 1 "no global batch" -- search --model llama3-8b --gpus 8

# reshard: the 70B case on four DGX H100, its JSON keys and numbers, a pool, bad layouts
expect 0 "3D-HybridEngine +30.867 GB" -- reshard --model llama3-70b --train TP8-PP4 --gen TP4
expect 0 "naive / 3D-HybridEngine: 1.77x the time" -- reshard --model llama3-70b --train TP8-PP4 --gen TP4 --cluster dgx-h100
"$FF_BIN" plan reshard --model llama3-70b --train TP8-PP4 --gen TP4 --json > "$TMP/r.json" || fail "reshard json"
$PY - "$TMP/r.json" <<'EOF2' || fail "reshard JSON keys or values"
import json, sys
d = json.load(open(sys.argv[1]))
M = d["model_bytes"]
assert d["gpus"] == 32 and d["micro_dp"] == 8 and d["group_per_domain"] == 2 and d["group_domains"] == 4, d
for k in ("hybrid", "naive", "rank0"):
    for f in ("recv_bytes", "nvlink_bytes", "nic_bytes", "peak_bytes", "time_s"): assert f in d[k], (k, f)
assert abs(d["hybrid"]["recv_bytes"] + d["train"]["shard_bytes"] - d["gen"]["shard_bytes"]) < 1e-6 * M
assert abs(d["hybrid"]["recv_bytes"] - (M / 4 - M / 32)) < 1e-6 * M
assert abs(d["naive"]["recv_bytes"] - (M - M / 32)) < 1e-6 * M and d["naive"]["peak_bytes"] == M
assert d["naive"]["time_s"] > d["hybrid"]["time_s"] and d["rank0"]["time_s"] > d["naive"]["time_s"]
EOF2
"$FF_BIN" plan reshard --model llama3-70b --train TP8-PP4 --gen TP4 --gen-workers 8 --json > "$TMP/rp.json" || fail "reshard pool json"
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pool_senders"]==8 and abs(d["pool"]["recv_bytes"]-d["gen"]["shard_bytes"])<1 and "hybrid" not in d' "$TMP/rp.json" || fail "reshard pool values"
expect 0 "fuseflow plan reshard --model llama3-70b --train TP8-PP4 --gen TP4" -- reshard --help
expect 1 "generation TP 8 x PP 3 = 24 does not divide training TP 8 x PP 4 = 32" -- reshard --model llama3-70b --train TP8-PP4 --gen TP8-PP3
expect 1 "TP 3 does not divide the 64 query heads" -- reshard --model llama3-70b --train TP8-PP4 --gen TP3
expect 2 "unknown cluster preset" -- reshard --model llama3-70b --train TP8-PP4 --gen TP4 --cluster dgx-a100
expect 2 "--dtype 'fp8': use bf16 or fp32" -- reshard --model llama3-70b --train TP8-PP4 --gen TP4 --dtype fp8
expect 2 "give --model NAME or --config" -- reshard --train TP8-PP4 --gen TP4

# rollout: RLHFuse's 65B setting, JSON, a lengths file, bad input
expect 0 "migration +[0-9.]+ s +1\.[0-9]+x serial" -- rollout --model llama-65b --infer llama-65b,llama-33b,llama-33b --gpus 64 --gen-tp 8 --max-len 1024
"$FF_BIN" plan rollout --model llama-65b --gpus 64 --gen-tp 8 --migrate off --json > "$TMP/ro.json" || fail "rollout json"
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["instances"]==8 and d["overlap_s"]<=d["serial_s"] and d["migrate"]["moved"]==0 and d["sweep"]==[]' "$TMP/ro.json" || fail "rollout json values"
printf '# lengths\n4\n4\n4\n400\n\n' > "$TMP/lens.txt"
expect 0 "4 samples, prompt 512, responses median 4, p99 4, longest 400" -- rollout --model llama3-8b --gpus 2 --lengths "$TMP/lens.txt" --max-len 512
printf '4\nfour\n' > "$TMP/badlens.txt"
expect 2 "badlens.txt:2: 'four' is not a length" -- rollout --model llama3-8b --gpus 2 --lengths "$TMP/badlens.txt"
expect 2 "--lengths /nonexistent: No such file" -- rollout --model llama3-8b --gpus 2 --lengths /nonexistent
expect 1 "gen TP 3 does not divide 64 GPUs" -- rollout --model llama-65b --gpus 64 --gen-tp 3
expect 1 "leaves no room for one sequence" -- rollout --model llama-65b --gpus 8
expect 2 "--migrate '2': use off, auto, or R_t" -- rollout --model llama3-8b --gpus 8 --migrate 2
expect 2 "unknown option '--bogus'" -- rollout --model llama3-8b --gpus 8 --bogus 1
expect 2 "give --model NAME .* and --gpus N" -- rollout --model llama3-8b

if (( fails )); then echo "$fails failure(s)"; exit 1; fi
echo "ok"
