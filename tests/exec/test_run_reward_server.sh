#!/usr/bin/env bash
# A reward written in Python (examples/reward_server.py over ZeroMQ) drives `fuseflow run`:
# GRPO with `function: remote` gives exactly the rewards of the built-in arith_exact_match on
# the same samples (same seed: same responses). Skipped, with the reason, without pyzmq.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
py=python3
/usr/bin/python3 -c 'import zmq' > /dev/null 2>&1 && py=/usr/bin/python3
if ! $py -c 'import zmq' > /dev/null 2>&1; then
  echo "SKIPPED: $py cannot import zmq: install python3-zmq (scripts/deps.sh) to run the reward-server test" >&2
  exit 77
fi
prepare_sft_small
M=$cache/sft_small/final
ep=ipc://$work/reward.sock
$py "$src/examples/reward_server.py" --bind "$ep" > "$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; cleanup' EXIT
args() { # OUT
  echo "$(small_run "$1") trainer.steps=2 trainer.test_freq=0 data.train_batch_size=4 roles.actor.model=$M roles.ref.model=$M" \
       "roles.actor.workers=1 graph.train_actor.mini_batch_size=2 --no-progress"
}
"$bin" run "$src/examples/grpo.yaml" $(args "$work/builtin") > "$work/builtin.log" 2>&1 || { cat "$work/builtin.log" >&2; fail "built-in run"; }
"$bin" run "$src/examples/grpo.yaml" $(args "$work/remote") graph.reward.function=remote "graph.reward.endpoint=$ep" \
  graph.reward.server_function=arith > "$work/remote.log" 2>&1 || { cat "$work/remote.log" "$work/server.log" >&2; fail "remote run"; }
python3 - "$work/builtin/metrics.jsonl" "$work/remote/metrics.jsonl" <<'PY' || fail "the remote rewards differ from the built-in ones"
import json, sys
A, B = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(A) == len(B) == 2
for a, b in zip(A, B):
    assert a["reward_mean"] == b["reward_mean"] and a["acc"] == b["acc"], (a, b)
assert any(a["reward_mean"] > 0 for a in A), "no reward at all: the comparison says little"
PY
echo ok
