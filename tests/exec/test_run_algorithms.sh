#!/usr/bin/env bash
# `fuseflow run` runs every example algorithm end to end on a small random model (two
# iterations each): PPO (critic, GAE, KL penalty), GRPO (also with two DP ranks, with a
# rollout pool of its own synced by resharding, and with the serial schedule, all giving the
# same metrics), RLOO, REINFORCE++, ReMax (greedy baseline per group), DAPO (dynamic
# sampling), a reward model on a worker of its own, and a graph whose estimator, policy
# loss, KL and reward all come from the example C plugin. Each writes metrics.jsonl with the
# expected keys and a checkpoint that loads as a model folder; the GRPO run's --trace has
# subtasks named by node and sample, stage tracks and dependency arrows (test_run_trace.sh
# checks the dependencies themselves on a PPO run).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
M=$cache/tiny
steps=2

run_example() { # NAME EXTRA_OVERRIDES...
  local ex=$1; shift
  local out=$work/$ex
  if ! "$bin" run "$src/examples/$ex.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=0 trainer.save_freq=0 \
       data.train_batch_size=4 roles.actor.model=$M roles.actor.workers=1 "$@" --no-progress > "$work/$ex.log" 2>&1; then
    cat "$work/$ex.log" >&2
    fail "examples/$ex.yaml did not run"
  fi
  [[ $(iterations "$out/metrics.jsonl") == "$steps" ]] || fail "$ex: expected $steps iteration lines in metrics.jsonl"
  [[ -f "$out/checkpoints/step-0000000$steps/actor/config.json" ]] || fail "$ex: no final checkpoint"
}

run_example grpo roles.ref.model=$M graph.train_actor.mini_batch_size=2
grep -q '"kl_loss"' "$work/grpo/metrics.jsonl" || fail "grpo: no kl_loss metric"
run_example ppo roles.ref.model=$M roles.critic.model=$M graph.train_actor.mini_batch_size=2 graph.train_actor.micro_batch_size=2 \
  graph.train_critic.mini_batch_size=2 graph.train_critic.micro_batch_size=2
for k in value_loss kl_coef kl_penalty critic_grad_norm; do
  grep -q "\"$k\"" "$work/ppo/metrics.jsonl" || fail "ppo: no $k metric"
done
[[ -f "$work/ppo/checkpoints/step-00000002/critic/config.json" && -f "$work/ppo/checkpoints/step-00000002/critic.optim.safetensors" ]] ||
  fail "ppo: the critic is not in the checkpoint"
grep -q '"controller"\|"kl_coef"' "$work/ppo/checkpoints/step-00000002/state.json" || fail "ppo: no KL coefficient in the state"
run_example rloo roles.ref.model=$M graph.train_actor.mini_batch_size=2
run_example reinforce_pp roles.ref.model=$M graph.train_actor.mini_batch_size=2 graph.train_actor.micro_batch_size=2
run_example remax roles.ref.model=$M graph.train_actor.mini_batch_size=2 graph.train_actor.micro_batch_size=2
run_example dapo graph.train_actor.mini_batch_size=2 trainer.max_gen_batches=2
grep -q '"prompts_drawn"' "$work/dapo/metrics.jsonl" || fail "dapo: dynamic sampling drew no extra prompts"

# the checkpoint is a model folder the other commands load
"$bin" generate --model "$work/grpo/checkpoints/step-00000002/actor" --prompt '1+2=' --temperature 0 --max-new-tokens 4 > /dev/null ||
  fail "the checkpointed actor does not load in fuseflow generate"

# two DP ranks, a rollout pool of its own, and the serial schedule give the same iterations as
# one worker with the fused schedule
run_grpo() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=0 trainer.save_freq=0 \
    data.train_batch_size=4 roles.actor.model=$M roles.ref.model=$M graph.train_actor.mini_batch_size=2 "$@" --no-progress \
    > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "grpo $* did not run"; }
}
run_grpo "$work/dp1" roles.actor.workers=1
run_grpo "$work/dp2" --workers 2 --trace "$work/trace.json"
run_grpo "$work/sep" --workers 2 roles.actor.rollout.workers=2
run_grpo "$work/serial" roles.actor.workers=1 trainer.schedule=serial
grep -q "serial schedule" "$work/serial.log" || fail "trainer.schedule=serial was not used"
same_metrics "$work/dp1/metrics.jsonl" "$work/serial/metrics.jsonl" 1e-6 1e-4 || fail "the serial schedule does not train like the fused one"
grep -q "actor \[0 1\]" "$work/sep.log" && grep -q "gen \[2 3\]" "$work/sep.log" || fail "the rollout pool was not placed apart: $(head -1 "$work/sep.log")"
# (equal up to float rounding: batches are composed differently on two workers)
same_metrics "$work/dp1/metrics.jsonl" "$work/dp2/metrics.jsonl" 1e-6 1e-4 || fail "two DP ranks do not train like one"
same_metrics "$work/dp1/metrics.jsonl" "$work/sep/metrics.jsonl" 1e-6 1e-4 || fail "a separate rollout pool does not train like a colocated one"

# the timeline
python3 - "$work/trace.json" <<'PY' || fail "the trace is incomplete"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = [e["name"] for e in ev if e.get("cat") == "subtask"]
assert any(n.startswith("rollout g") for n in names), "no generation subtasks named by group"
assert any(n.startswith("ref_logprob s") for n in names), "no log-prob subtasks named by samples"
assert any(n.startswith("train_actor step") for n in names), "no training steps"
assert any(e.get("cat") == "local" and e["name"].startswith("reward s") for e in ev), "no controller-side reward slices"
assert any(e.get("cat") == "stage" for e in ev), "no stage tracks"
flows = [e for e in ev if e.get("cat") == "after"]
assert len(flows) > 10 and len([e for e in flows if e["ph"] == "s"]) == len([e for e in flows if e["ph"] == "f"]), "no dependency arrows"
PY

# a graph built from the example plugin's estimator, loss, KL and reward
plugin=$build/example_plugin.so
[[ -f "$plugin" ]] || fail "$plugin is not built (target ff_example_plugin)"
cat > "$work/plugin.yaml" <<YAML
trainer: {steps: $steps, seed: 2, out_dir: $work/plugin, plugins: [$plugin]}
data: {train_files: $cache/arith/train.jsonl, train_batch_size: 4, max_prompt_length: 16, max_response_length: 6}
roles:
  actor: {model: $M, workers: 1, optim: {lr: 1.0e-3}}
  ref: {model: $M, colocate_with: actor}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4}
  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob]}
  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: short_answer, max_chars: 12}
  advantage: {op: advantage, in: [score], out: [advantages], estimator: group_median, scale: 2.0}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob],
                loss: clipped_adv_pg, adv_clip: 1.0, kl_loss: {type: sq, coef: 0.01}, mini_batch_size: 2, micro_batch_size: 4}
  sync: {op: sync_weights, role: actor, after: [train_actor]}
YAML
"$bin" run "$work/plugin.yaml" --no-progress > "$work/plugin.log" 2>&1 || { cat "$work/plugin.log" >&2; fail "the plugin graph did not run"; }
[[ $(iterations "$work/plugin/metrics.jsonl") == "$steps" ]] || fail "plugin: no metrics"
python3 - "$work/plugin/metrics.jsonl" <<'PY' || fail "the plugin's reward never scored (short answers exist)"
import json, sys
rs = [json.loads(l).get("reward_mean", 0) for l in open(sys.argv[1]) if '"samples"' in l]
assert any(r > 0 for r in rs), rs
PY
# a reward model (op: score on role reward, a value head) on a worker of its own
"$bin" init --preset tiny --out "$work/rm" num_hidden_layers=2 hidden_size=64 intermediate_size=128 value_head=true --seed 5 > /dev/null
cat > "$work/rm.yaml" <<YAML
trainer: {steps: $steps, seed: 2, out_dir: $work/rmrun}
data: {train_files: $cache/arith/train.jsonl, train_batch_size: 4, max_prompt_length: 16, max_response_length: 6}
roles:
  actor: {model: $M, workers: 1, optim: {lr: 1.0e-3}}
  reward: {model: $work/rm, workers: 1}
graph:
  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4}
  rm: {op: score, role: reward, in: [prompt, response], out: [score], micro_batch_size: 4}
  advantage: {op: advantage, in: [score], out: [advantages], estimator: grpo}
  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages], mini_batch_size: 2, micro_batch_size: 4}
  sync: {op: sync_weights, role: actor, after: [train_actor]}
YAML
"$bin" run "$work/rm.yaml" --no-progress --dump-samples > "$work/rm.log" 2>&1 || { cat "$work/rm.log" >&2; fail "the reward-model graph did not run"; }
grep -q "reward \[1\]" "$work/rm.log" || fail "the reward model is not on a worker of its own: $(head -1 "$work/rm.log")"
python3 - "$work/rmrun/samples.jsonl" <<'PY' || fail "the reward model's scores are not per sample"
import json, sys
s = [json.loads(l)["score"] for l in open(sys.argv[1])]
assert len(s) == 2 * 4 * 4 and len(set(s)) > 4, s
PY
echo "ok"
