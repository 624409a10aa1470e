#!/usr/bin/env bash
# The runtime's commands end to end: worker, keygen, runtime-demo (+ --trace), trace summary,
# with their errors.
set -u
FF_BIN=${FF_BIN:?FF_BIN must point to the fuseflow binary}
tmp=$(mktemp -d /tmp/ff-test-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESCRIPTION COMMAND... : the command must succeed
    local what=$1; shift
    if ! "$@" > "$tmp/out" 2> "$tmp/err"; then
        echo "FAILED: $what"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}
expect_rc() { # expect_rc RC PATTERN DESCRIPTION COMMAND...: exit status RC and PATTERN in stderr+stdout
    local want=$1 pattern=$2 what=$3; shift 3
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    if [[ $rc -ne $want ]] || ! grep -q -- "$pattern" "$tmp/out" "$tmp/err"; then
        echo "FAILED: $what (exit $rc, wanted $want and '$pattern')"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}

check "worker --help" "$FF_BIN" worker --help
grep -q -- "--connect ENDPOINT" "$tmp/out" || { echo "FAILED: worker --help text"; fail=1; }
expect_rc 2 "required" "worker without --connect" "$FF_BIN" worker
expect_rc 2 "unknown option" "worker with a bad option" "$FF_BIN" worker --connect ipc:///tmp/x --frobnicate 1
expect_rc 2 "--rank wants" "worker with a bad rank" "$FF_BIN" worker --connect ipc:///tmp/x --rank minus
expect_rc 1 "no welcome" "worker with nobody to talk to" \
    "$FF_BIN" worker --connect "ipc://$tmp/nobody.sock" --connect-timeout 0.2
expect_rc 1 "cannot connect" "worker with a bad endpoint" "$FF_BIN" worker --connect "nonsense://x"

# A controller that fails without CURVE in play: the worker names what it saw, not CURVE.
# Stand-ins on a unix socket: one that drops every connection (out of descriptors looks like
# this), one that accepts and never answers, one that exits after the first connection.
cat > "$tmp/fake.py" <<'PY'
import socket, sys, time
mode, path = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path); s.listen(16); s.settimeout(0.05)
held, end = [], time.time() + 5
while time.time() < end:
    try: c, _ = s.accept()
    except socket.timeout: continue
    if mode == "drop": c.close()
    else: held.append(c)
    if mode == "die": break
PY
fake_ctl() { # MODE PATTERN: a worker against the stand-in exits 1 with PATTERN and without CURVE
  local sock=$tmp/$1.sock
  python3 "$tmp/fake.py" "$1" "$sock" & local pid=$!
  for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.02; done
  expect_rc 1 "$2" "worker against a controller that does '$1'" "$FF_BIN" worker --connect "ipc://$sock" --connect-timeout 1.5
  # CURVE may be named as one possibility among others (a CURVE controller can drop a plain
  # worker the same way), never as the cause
  if grep -qiE "controller uses curve|keys? (do not|don't) match|wrong key" "$tmp/out" "$tmp/err"; then
    echo "FAILED: '$1': the worker blames CURVE"; cat "$tmp/err"; fail=1; fi
  if [[ $1 != drop ]] && grep -qi "curve" "$tmp/out" "$tmp/err"; then echo "FAILED: '$1': the worker names CURVE"; cat "$tmp/err"; fail=1; fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
}
fake_ctl drop "closed the connection during the handshake 5 times in a row.*file descriptors"
fake_ctl mute "connected, but the controller did not answer"
fake_ctl die "the controller closed the connection and accepted no new one"
expect_rc 1 "nothing accepted a connection" "worker with no controller at all" \
    "$FF_BIN" worker --connect "ipc://$tmp/nobody2.sock" --connect-timeout 0.3

check "keygen" "$FF_BIN" keygen "$tmp/keys"
[[ $(stat -c %a "$tmp/keys/controller.key") == 600 && $(stat -c %a "$tmp/keys/worker.key") == 600 ]] ||
    { echo "FAILED: key files are not mode 600"; fail=1; }
grep -q "role = worker" "$tmp/keys/worker.key" || { echo "FAILED: worker.key content"; fail=1; }
expect_rc 2 "usage" "keygen without a directory" "$FF_BIN" keygen
expect_rc 1 "this is a controller key file" "worker with the controller's key" \
    "$FF_BIN" worker --connect "ipc://$tmp/x.sock" --curve "$tmp/keys/controller.key"

check "runtime-demo with a trace" "$FF_BIN" runtime-demo --workers 3 --tasks 3000 --kind sum --trace "$tmp/t.json"
grep -q "3000 sum subtasks" "$tmp/out" || { echo "FAILED: runtime-demo output"; cat "$tmp/out"; fail=1; }
check "runtime-demo, a chain of sleeps" "$FF_BIN" runtime-demo --workers 2 --tasks 5 --kind sleep --sleep-ms 2 \
    --chain --trace "$tmp/chain.json"
check "runtime-demo, collectives" "$FF_BIN" runtime-demo --workers 3 --tasks 20 --kind collective
check "runtime-demo, DP split" "$FF_BIN" runtime-demo --workers 3 --tasks 50 --kind axpy --mode split
expect_rc 1 "first failure" "runtime-demo whose subtasks fail" "$FF_BIN" runtime-demo --workers 1 --tasks 2 --kind fail
# a subtask over a worker's frame limit fails with the reason (it used to wait forever)
"$FF_BIN" worker --connect "ipc://$tmp/limit.sock" --max-frame 1000 --log off &
limited=$!
expect_rc 1 "tensor frame 0 has 4000 bytes, over worker 0's limit of 1000" "runtime-demo over a worker's frame limit" \
    timeout 60 "$FF_BIN" runtime-demo --workers 0 --remote 1 --listen "ipc://$tmp/limit.sock" --floats 1000 --tasks 3
wait $limited || { echo "FAILED: the limited worker did not exit cleanly"; fail=1; }
expect_rc 2 "--mode wants" "runtime-demo with a bad mode" "$FF_BIN" runtime-demo --mode sideways

# More local workers than the machine runs: refused at once, before any controller or worker
# (5 s, not 1: a loaded CI machine under ASan once took over a second to start the binary;
# starting 100000 workers would take minutes)
t0=$(date +%s%N)
expect_rc 2 "--workers 100000: this machine runs at most [0-9]* local workers" "runtime-demo --workers 100000" \
    "$FF_BIN" runtime-demo --workers 100000 --tasks 1
(( ($(date +%s%N) - t0) / 1000000 < 5000 )) || { echo "FAILED: --workers 100000 took over 5 seconds to refuse"; fail=1; }
grep -q "controller at" "$tmp/out" && { echo "FAILED: --workers 100000 started a controller"; fail=1; }
expect_rc 2 "wants a whole number" "runtime-demo --workers 1e12" "$FF_BIN" runtime-demo --workers 1e12
# the descriptor limit binds: 2 per worker in the controller (it used to abort inside ZeroMQ)
expect_rc 2 "RLIMIT_NOFILE (ulimit -n) 100" "runtime-demo past ulimit -n" \
    bash -c "ulimit -n 100 && exec '$FF_BIN' runtime-demo --workers 30 --tasks 1"
check "runtime-demo at the descriptor limit" bash -c "ulimit -n 100 && exec '$FF_BIN' runtime-demo --workers 18 --tasks 50"

check "trace summary" "$FF_BIN" trace summary "$tmp/t.json"
grep -q "worker 0 (" "$tmp/out" && grep -q "longest chain" "$tmp/out" || { echo "FAILED: summary text"; cat "$tmp/out"; fail=1; }
check "trace summary --json" "$FF_BIN" trace summary "$tmp/chain.json" --json
python3 - "$tmp/out" <<'PY' || fail=1
import json, sys
s = json.load(open(sys.argv[1]))
chain = s["longest_chain"]
assert chain["length"] == 5, chain            # the five dependent sleeps
assert len(s["workers"]) == 2, s["workers"]
assert all(w["busy_us"] + w["idle_us"] - s["span_us"] < 1e-6 for w in s["workers"])
PY
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/t.json" || { echo "FAILED: trace is not JSON"; fail=1; }
expect_rc 1 "no traceEvents" "summary of a non-trace" bash -c "echo '{}' > $tmp/x.json && '$FF_BIN' trace summary $tmp/x.json"
expect_rc 1 "$tmp/missing.json" "summary of a missing file" "$FF_BIN" trace summary "$tmp/missing.json"
expect_rc 2 "usage" "trace without a subcommand" "$FF_BIN" trace

exit $fail
