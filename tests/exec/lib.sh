# Shared by the tests/exec shell tests: paths, failure reporting, and a cache of the inputs
# every run needs (a small random model, the arithmetic data), made once per build folder
# under a lock so tests running in parallel share it.
set -euo pipefail
bin=${FF_BIN:?FF_BIN is not set (run through ctest)}
src=${FF_SOURCE_DIR:-.}
build=${FF_BUILD_DIR:-build}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export FF_BIN=$bin
src=$(cd "$src" && pwd)
build=$(cd "$build" && pwd)
cache=$build/exec_cache
mkdir -p "$cache"
work=$(mktemp -d /tmp/ff_exec_test.XXXXXX)
cleanup() { [[ -n "${FF_KEEP_TEST:-}" ]] || rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
sanitized() { [[ "${FF_SANITIZED:-0}" == "1" ]]; }

# cache: tiny (a random 2-layer model with the byte tokenizer) and arith (2-digit sums)
prepare_inputs() {
  (
    flock 9
    if [[ ! -f "$cache/tiny/config.json" ]]; then
      "$bin" init --preset tiny --out "$cache/tiny" num_hidden_layers=2 hidden_size=64 intermediate_size=128 > /dev/null
    fi
    if [[ ! -f "$cache/arith/train.jsonl" ]]; then
      "$bin" dataset arith --digits 2 --train 2000 --test 200 --seed 1 --out "$cache/arith" > /dev/null
    fi
  ) 9> "$cache/.lock"
}

# cache: sft_small (the small model fine-tuned briefly on the arithmetic task: it answers in
# the right format, rarely correctly, so rewards carry signal)
prepare_sft_small() {
  prepare_inputs
  (
    flock 9
    if [[ ! -f "$cache/sft_small/final/config.json" ]]; then
      rm -rf "$cache/sft_small" # a run cut short: sft refuses a folder with checkpoints
      "$bin" sft --config "$src/examples/sft_arith.yaml" model="$cache/tiny" out="$cache/sft_small" \
        data.train="$cache/arith/train.jsonl" data.test="$cache/arith/test.jsonl" train.steps=300 train.batch_size=64 \
        train.eval_every=0 train.save_every=0 train.log_every=1000 > "$cache/sft_small.log" 2>&1 ||
        { cat "$cache/sft_small.log" >&2; exit 1; }
    fi
  ) 9> "$cache/.lock" || fail "the SFT warm start failed"
}

# cache: learn/ (2-digit sums, 5000 + 1000 held out) and learn_sft (the small model fine-tuned on them
# for 900 steps of a 2000-step schedule: 30-60% of held-out sums right (the jump from 20-30% to
# 50-70% falls between steps 700 and 1000, where rounding moves it: at 700 one machine had 40%,
# another 14-23%, from which PPO gained 5 points in 100 iterations), a warm start
# RL can improve within a minute)
prepare_sft_learn() {
  prepare_inputs
  (
    flock 9
    if [[ ! -f "$cache/learn/train.jsonl" ]]; then
      "$bin" dataset arith --digits 2 --train 5000 --test 1000 --seed 1 --out "$cache/learn" > /dev/null
    fi
    if [[ ! -f "$cache/learn_sft/checkpoints/step-00000900/config.json" ]]; then
      rm -rf "$cache/learn_sft"
      "$bin" sft --config "$src/examples/sft_arith.yaml" model="$cache/tiny" out="$cache/learn_sft" \
        data.train="$cache/learn/train.jsonl" data.test="$cache/learn/test.jsonl" train.steps=2000 train.stop_after=900 \
        train.batch_size=128 train.eval_every=0 train.save_every=0 train.log_every=1000 train.keep_checkpoints=1 \
        > "$cache/learn_sft.log" 2>&1 || { cat "$cache/learn_sft.log" >&2; exit 1; }
    fi
  ) 9> "$cache/.lock" || fail "the SFT warm start failed"
  sft=$cache/learn_sft/checkpoints/step-00000900
}

# cache for tensor parallelism: tiny_v260 (tiny with vocab_size 260, so that TP 2 divides the
# vocabulary: the byte tokenizer's 259 ids do not), sft_tp (it fine-tuned as sft_small is) and,
# with learn=1, learn_sft_tp (as learn_sft); sets $tp_model, $tp_sft (and $tp_learn_sft)
prepare_tp() { # [learn]
  prepare_inputs
  [[ "${1:-}" != learn ]] || prepare_sft_learn
  (
    flock 9
    if [[ ! -f "$cache/tiny_v260/config.json" ]]; then
      "$bin" init --preset tiny --out "$cache/tiny_v260" num_hidden_layers=2 hidden_size=64 intermediate_size=128 vocab_size=260 > /dev/null
    fi
    if [[ ! -f "$cache/sft_tp/final/config.json" ]]; then
      rm -rf "$cache/sft_tp"
      "$bin" sft --config "$src/examples/sft_arith.yaml" model="$cache/tiny_v260" out="$cache/sft_tp" \
        data.train="$cache/arith/train.jsonl" data.test="$cache/arith/test.jsonl" train.steps=300 train.batch_size=64 \
        train.eval_every=0 train.save_every=0 train.log_every=1000 > "$cache/sft_tp.log" 2>&1 || { cat "$cache/sft_tp.log" >&2; exit 1; }
    fi
    if [[ "${1:-}" == learn && ! -f "$cache/learn_sft_tp/checkpoints/step-00000700/config.json" ]]; then
      rm -rf "$cache/learn_sft_tp"
      "$bin" sft --config "$src/examples/sft_arith.yaml" model="$cache/tiny_v260" out="$cache/learn_sft_tp" \
        data.train="$cache/learn/train.jsonl" data.test="$cache/learn/test.jsonl" train.steps=2000 train.stop_after=700 \
        train.batch_size=128 train.eval_every=0 train.save_every=0 train.log_every=1000 train.keep_checkpoints=1 \
        > "$cache/learn_sft_tp.log" 2>&1 || { cat "$cache/learn_sft_tp.log" >&2; exit 1; }
    fi
  ) 9> "$cache/.lock" || fail "the tensor-parallel inputs could not be made"
  tp_model=$cache/tiny_v260 tp_sft=$cache/sft_tp/final tp_learn_sft=$cache/learn_sft_tp/checkpoints/step-00000700
}

# The held-out accuracy of one iteration of a run (0: before training), from its
# metrics.jsonl; fails when that iteration has none, so that a run which skipped an
# evaluation cannot compare an accuracy with itself.
eval_acc() { # METRICS ITERATION
  python3 -c '
import json, sys
v = [o["eval_acc"] for o in map(json.loads, open(sys.argv[1])) if o.get("iteration") == int(sys.argv[2]) and "eval_acc" in o]
if not v: sys.exit(f"{sys.argv[1]}: no eval_acc at iteration {sys.argv[2]}")
print(v[-1])' "$1" "$2"
}

# The overrides that point an example config at the cached inputs, small and quick.
small_run() { # OUT_DIR
  echo "trainer.out_dir=$1 data.train_files=$cache/arith/train.jsonl data.val_files=$cache/arith/test.jsonl" \
       "data.max_prompt_length=16 data.max_response_length=6"
}

# The long-tail repeat task (`fuseflow dataset repeat`) for GRPO on the cached tiny model with a
# generation pool of 2 workers, written to $work/run.yaml: STEPS iterations of BATCH prompts x
# n N, responses up to MAX_RESPONSE tokens, EXTRA more keys of the generate node.
write_repeat_run() { # STEPS BATCH N MAX_RESPONSE [EXTRA]
  data=$work/rep
  "$bin" dataset repeat --median 8 --p99-ratio 10 --max 40 --train 200 --test 20 --seed 1 --out "$data" > /dev/null ||
    fail "dataset repeat"
  cat > "$work/run.yaml" <<EOF
trainer: {steps: $1, seed: 3, schedule: fused, save_freq: 0, test_freq: 0, acc_reward: repeat_match}
data: {train_files: $data/train.jsonl, val_files: $data/test.jsonl, train_batch_size: $2, max_prompt_length: 8,
       max_response_length: $4}
roles:
  actor: {model: $cache/tiny, workers: 1, rollout: {workers: 2}, optim: {lr: 1.0e-3}}
  ref: {model: $cache/tiny, colocate_with: actor}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: $3, temperature: 1.0${5:+, $5}}
  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob]}
  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: repeat_match}
  advantage: {op: advantage, in: [score], out: [advantages], estimator: grpo}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob], loss: vanilla,
                mini_batch_size: $2, micro_batch_size: 16, kl_loss: {type: low_var_kl, coef: 0.001}}
  sync: {op: sync_weights, role: actor, after: [train_actor]}
EOF
}

# The migration tests' run: 4 prompts x n 4, responses up to 40 tokens.
prepare_repeat_run() { write_repeat_run "$1" 4 4 40; } # STEPS

# Drawn response lengths (graph.rollout.lengths {median 8, p99_ratio 10, max 96}): 10 prompts x
# n 8, up to 100 tokens (test_run_lengths.sh, test_run_kv.sh); lengths_run OUT [overrides...] runs
# it, dumping the samples.
prepare_lengths_run() { write_repeat_run "$1" 10 8 100 "lengths: {median: 8, p99_ratio: 10, max: 96}"; } # STEPS
lengths_run() { # OUT [overrides...]
  local out=$1; shift
  "$bin" run "$work/run.yaml" trainer.out_dir="$out" --threads 1 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "run $* failed"; }
}

# $work/run.yaml with the overrides must fail, saying EXPECTED (a grep pattern).
run_refused() { # WHAT EXPECTED overrides...
  local what=$1 want=$2; shift 2
  if "$bin" run "$work/run.yaml" trainer.out_dir="$work/bad" --no-progress "$@" > "$work/bad.log" 2>&1; then fail "$what: accepted"; fi
  grep -q -- "$want" "$work/bad.log" || { cat "$work/bad.log" >&2; fail "$what: no message naming $want"; }
  rm -rf "$work/bad"
}

# The iteration lines of a metrics file (JSON lines with "samples").
iterations() { grep -c '"samples"' "$1" || true; }

# Compare two metrics.jsonl files without the times, the workers' (and devices') memory, the pipeline bubbles, the fuse decision, the KV use and
# the weight sync's bytes (they depend on the layout): the same lines and keys, integers equal,
# floats within atol + rtol |b| (exact when both are 0).
same_metrics() { # A B ATOL RTOL
  python3 - "$@" <<'PY'
import json, sys
a, b, atol, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def load(p):
    out = []
    for l in open(p):
        o = json.loads(l); o.pop("time", None); o.pop("eval_time_s", None); o.pop("memory", None)
        o.pop("device_memory", None)  # each device's peak: the layout's and the collectives' buffers
        o.pop("actor_pipe_bubble", None); o.pop("critic_pipe_bubble", None); o.pop("weight_sync", None)
        o.pop("fuse", None)  # whether the steps were fused (graph.<actor train>.fuse)
        o.pop("rollout_kv", None)  # the KV blocks the busiest rollout held: which worker took which jobs
        o.pop("rollout_decode", None)  # decode steps per engine (graphs or not): how the work was split
        o.pop("offload", None); out.append(o)  # the actor's moves for generation (roles.actor.offload: bytes, times)
    return out
A, B = load(a), load(b)
bad = []
if len(A) != len(B): bad.append(f"{len(A)} lines against {len(B)}")
for x, y in zip(A, B):
    if set(x) != set(y): bad.append(f"iteration {x.get('iteration')}: keys {sorted(set(x) ^ set(y))}")
    for k in x:
        u, v = x[k], y.get(k)
        if isinstance(u, float) or isinstance(v, float):
            if v is None or abs(u - v) > atol + rtol * abs(v): bad.append(f"iteration {x.get('iteration')}: {k} {u!r} vs {v!r}")
        elif u != v: bad.append(f"iteration {x.get('iteration')}: {k} {u!r} vs {v!r}")
for m in bad[:20]: print(m, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}

# samples.jsonl of two runs byte for byte
same_samples() { # A B WHAT
  cmp -s "$1/samples.jsonl" "$2/samples.jsonl" || { diff "$1/samples.jsonl" "$2/samples.jsonl" | head -5 >&2; fail "$3: other samples"; }
}

tp_grpo() { # OUT EXTRA...: GRPO on prepare_tp's SFT model ($S), $steps iterations
  local out=$1; shift
  "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model=$S roles.ref.model=$S graph.train_actor.mini_batch_size=4 \
    roles.actor.optim.lr=1e-3 roles.actor.optim.eps=1e-5 --val-limit 64 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "grpo $* did not run"; }
}
