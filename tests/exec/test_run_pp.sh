#!/usr/bin/env bash
# Pipeline parallelism in `fuseflow run` (roles.<role>.layout.pp, docs/run.md "Layouts"), on the
# tiny SFT model of test_run_tp.sh (2 layers, vocabulary 260):
#   - PPO with the actor, critic and ref at PP 2 on 2 workers (1F1B over the micro-batches of
#     each step, log-probs and values pipelined forward-only), generating in a layout of its own
#     on the same workers (DP 2, each rank receiving the other stage's layers after each update), and
#     at TP 2 x PP 2 on 4 workers (generation at TP 2 x DP 2), also with sequence
#     parallelism, GPipe, and interleaved 1F1B (a 4-layer model), sample the same
#     responses as on 1 worker for 3 iterations with float metrics within 1e-6 + 1% (the
#     stages sum the gradient norm and the tied embedding's two gradients in another order);
#   - at TP 2 x PP 2 with SP the transfers and collectives on the models' buffers (the default)
#     give the bits of those through host memory (FF_DEVICE_COLL=0), and so does generation
#     pipelined at TP 2 x PP 2 (its hidden states and logits);
#   - the timeline has every rank's forwards, backwards and transfers, and `fuseflow trace
#     summary` its bubble; the metrics carry the executor's bubble per step;
#   - a PP 2 run stopped after 2 iterations resumes on 1 worker (the checkpoint holds whole
#     tensors, the stages' gathered by the first) and ends as the 1-worker run does; its
#     checkpoint loads in `fuseflow generate`;
#   - GRPO with the actor at PP 2 and generation on a pool of its own trains like 1 worker, and so
#     do TP 2 x PP 2 generating at TP 1 on the same workers (HybridFlow's micro-DP gather) and at
#     2 x TP 2 on 4 workers of its own; each weight sync's bytes per rank are the formula's
#     (its generation shard minus the training shard it holds; half of it in bf16);
#   - generation pipelined too (in the actor's PP 2 and TP 2 x PP 2 layouts, and at PP 2 on a
#     pool of its own) samples the same responses; its layout defaults to the actor's TP over
#     the rest as DP, and generation over interleaved chunks is refused before any worker starts.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_tp
S=$tp_sft
steps=3
eps="roles.actor.optim.eps=1e-5 roles.critic.optim.eps=1e-5" # as test_run_tp.sh, for the same reason

ppo() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/ppo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model=$S roles.ref.model=$S roles.critic.model=$S \
    graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=4 graph.train_critic.mini_batch_size=4 \
    graph.train_critic.micro_batch_size=4 graph.ref_logprob.micro_batch_size=4 graph.values.micro_batch_size=4 \
    roles.actor.optim.lr=1e-3 roles.critic.optim.lr=1e-3 $eps --val-limit 64 --no-progress --dump-samples "$@" > "$out.log" 2>&1 ||
    { cat "$out.log" >&2; fail "ppo $* did not run"; }
}

ppo "$work/one" roles.actor.workers=1
ppo "$work/pp2" roles.actor.workers=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.dp=2
ppo "$work/tp2pp2" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.tp=2 \
  roles.actor.rollout.layout.dp=2 --trace "$work/tp2pp2.trace.json"
ppo "$work/gpipe" roles.actor.workers=2 roles.actor.layout.pp=2 roles.actor.layout.schedule=gpipe
ppo "$work/tp2pp2sp" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.layout.sp=true
# generation pipelined too (rollout.layout.pp 2: the actor's layout, weights copied locally;
# every stage decodes the same batch, the hidden states passed down, the logits broadcast)
ppo "$work/genpp2" roles.actor.workers=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.pp=2
ppo "$work/gentp2pp2" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.pp=2
grep -q "actor \[0 1\] tp 1 x pp 2 x dp 1, critic" "$work/genpp2.log" || fail "generation is not in the actor's PP 2 layout: $(head -1 "$work/genpp2.log")"
grep -q "actor \[0 1\] tp 1 x pp 2 x dp 1, gen \[0 1\], critic \[0 1\] tp 1 x pp 2 x dp 1, ref \[0 1\] tp 1 x pp 2 x dp 1" "$work/pp2.log" ||
  fail "the roles are not at PP 2: $(head -1 "$work/pp2.log")"
grep -q "actor \[0 1 2 3\] tp 2 x pp 2 x dp 1, gen \[0 1 2 3\] tp 2 x pp 1 x dp 2" "$work/tp2pp2.log" ||
  fail "the actor is not at TP 2 x PP 2: $(head -1 "$work/tp2pp2.log")"
[[ $(iterations "$work/one/metrics.jsonl") == "$steps" ]] || fail "one worker: expected $steps iterations"
for r in pp2 tp2pp2 gpipe tp2pp2sp genpp2 gentp2pp2; do
  same_samples "$work/one" "$work/$r" "$r"
  same_metrics "$work/one/metrics.jsonl" "$work/$r/metrics.jsonl" 1e-6 1e-2 || fail "$r does not train like one worker"
done
# the stages' activations and gradients move in the backend's memory (ff_pipe_transport_coll_dev)
# and TP's collectives run on the models' buffers; FF_DEVICE_COLL=0 moves both through host
# memory: the same bits
FF_DEVICE_COLL=0 ppo "$work/tp2pp2sp_host" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.layout.sp=true
same_samples "$work/tp2pp2sp" "$work/tp2pp2sp_host" "TP 2 x PP 2 with SP through host memory"
same_metrics "$work/tp2pp2sp/metrics.jsonl" "$work/tp2pp2sp_host/metrics.jsonl" 0 0 ||
  fail "TP 2 x PP 2 with SP: the transfers and collectives on the models' buffers do not give the host memory's bits"
# generation pipelined at TP 2 x PP 2: its hidden states and logits too (ff_gen_pipe's device calls)
FF_DEVICE_COLL=0 ppo "$work/gentp2pp2_host" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.pp=2
same_samples "$work/gentp2pp2" "$work/gentp2pp2_host" "generation at TP 2 x PP 2 through host memory"
same_metrics "$work/gentp2pp2/metrics.jsonl" "$work/gentp2pp2_host/metrics.jsonl" 0 0 ||
  fail "generation at TP 2 x PP 2: on the models' buffers it does not give the host memory's bits"

# interleaved 1F1B (2 chunks per stage) needs 4 layers: a fresh 4-layer model, the same
# samples and metrics as one worker
"$bin" init --preset tiny --out "$work/tiny4" num_hidden_layers=4 vocab_size=260 > /dev/null
il() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/ppo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=4 graph.rollout.n=4 roles.actor.model="$work/tiny4" roles.ref.model="$work/tiny4" \
    roles.critic.model="$work/tiny4" graph.train_actor.mini_batch_size=4 graph.train_actor.micro_batch_size=4 \
    graph.train_critic.mini_batch_size=4 graph.train_critic.micro_batch_size=4 $eps --val-limit 32 --no-progress --dump-samples \
    "$@" > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "interleaved $* did not run"; }
}
il "$work/il1" roles.actor.workers=1
il "$work/il" roles.actor.workers=2 roles.actor.layout.pp=2 roles.actor.layout.vpp=2 roles.actor.layout.schedule=interleaved
same_samples "$work/il1" "$work/il" "interleaved PP 2 x VPP 2"
same_metrics "$work/il1/metrics.jsonl" "$work/il/metrics.jsonl" 1e-6 1e-2 || fail "interleaved PP 2 x VPP 2 does not train like one worker"

# the timeline: every rank's forwards and backwards of every micro-batch of each step, its
# bubble per rank in `fuseflow trace summary`, the executor's in the metrics
"$bin" trace summary "$work/tp2pp2.trace.json" --json > "$work/summary.json" || fail "trace summary failed"
python3 - "$work/tp2pp2.trace.json" "$work/summary.json" "$work/tp2pp2/metrics.jsonl" <<'PY' || fail "the TP 2 x PP 2 timeline lacks the pipeline"
import json, re, sys
from collections import Counter
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
names = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] == 0}
fw, bw = Counter(), Counter()
for e in ev:
    if e.get("ph") == "X" and e.get("cat") == "pipe compute":
        rank = names[e["tid"]].split(":")[0]
        (fw if e["name"].startswith("F") else bw)[rank] += 1
# 3 iterations x (actor + critic) x 2 mini-batches x micro-batches (4 samples each of 16): 4
assert sorted(fw) == ["rank 0", "rank 1", "rank 2", "rank 3"], fw
assert set(fw.values()) == {3 * 2 * 2 * 4} and fw == bw, (fw, bw)
s = json.load(open(sys.argv[2]))
p = {o["name"]: o for o in s["pipeline"]}
assert sorted(p) == ["rank 0: pipeline", "rank 1: pipeline", "rank 2: pipeline", "rank 3: pipeline"], p
for o in p.values():
    assert o["steps"] == 3 * 2 * 2 and 0 < o["compute_us"] < o["step_us"] and 0 < o["bubble"] < 1, o
m = [json.loads(l) for l in open(sys.argv[3]) if '"samples"' in l]
assert all(0 < x["actor_pipe_bubble"] < 1 and 0 < x["critic_pipe_bubble"] < 1 for x in m), m
print("bubble per rank:", {k: round(o["bubble"], 3) for k, o in p.items()}, "executor's:", [round(x["actor_pipe_bubble"], 3) for x in m])
# the weight transitions: one slice per sync on their track, with the metrics' bytes
tr = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "weight sync"]
assert len(tr) == 3 and all(names[e["tid"]] == "weight transitions" and e["name"].startswith("micro-DP gather") for e in tr), tr
assert [(e["args"]["bytes"], e["args"]["bytes_max_rank"]) for e in tr] == \
    [(x["weight_sync"]["bytes"], x["weight_sync"]["bytes_max_rank"]) for x in m], (tr, m)
PY

# stopped at PP 2, resumed on one worker
ppo "$work/res" roles.actor.workers=2 roles.actor.layout.pp=2 --stop-after 2
ppo "$work/res" roles.actor.workers=1 --resume
same_metrics "$work/one/metrics.jsonl" "$work/res/metrics.jsonl" 1e-6 1e-2 || fail "a PP 2 checkpoint resumed on one worker does not go on as one worker"
ck=$work/res/checkpoints/step-00000002
[[ -f "$ck/critic/model.safetensors" && -f "$ck/critic.optim.safetensors" && -f "$ck/actor.optim.safetensors" ]] ||
  fail "the PP 2 checkpoint is not whole: $(ls "$ck")"
"$bin" generate --model "$ck/actor" --prompt '1+2=' --temperature 0 --max-new-tokens 4 > /dev/null ||
  fail "the actor checkpointed at PP 2 does not load in fuseflow generate"
# the same Hugging Face tensors (names, shapes, dtype) as a one-worker checkpoint, and the
# optimizer state's too
python3 - "$ck" "$(ls -d "$work"/one/checkpoints/step-* | tail -1)" <<'PY' || fail "the PP 2 checkpoint holds other tensors than one worker's"
import json, struct, sys
def header(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
for part in ["actor/model.safetensors", "critic/model.safetensors", "actor.optim.safetensors", "critic.optim.safetensors"]:
    a, b = header(f"{sys.argv[1]}/{part}"), header(f"{sys.argv[2]}/{part}")
    assert a == b, (part, sorted(set(a) ^ set(b)))
PY

# the actor at PP 2, generation on a pool of its own (the "sync" group: both stages send)
grpo() { # OUT EXTRA...
  local out=$1; shift
  "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=$steps trainer.test_freq=$steps trainer.save_freq=0 \
    data.train_batch_size=8 graph.rollout.n=4 roles.actor.model=$S roles.ref.model=$S graph.train_actor.mini_batch_size=4 \
    graph.train_actor.micro_batch_size=4 roles.actor.optim.lr=1e-3 roles.actor.optim.eps=1e-5 --val-limit 64 --no-progress \
    --dump-samples "$@" > "$out.log" 2>&1 || { cat "$out.log" >&2; fail "grpo $* did not run"; }
}
grpo "$work/g1" roles.actor.workers=1
grpo "$work/gpp2" roles.actor.workers=2 roles.actor.layout.pp=2 roles.actor.rollout.workers=1
grep -q "actor \[0 1\] tp 1 x pp 2 x dp 1, gen \[2\]" "$work/gpp2.log" || fail "not at PP 2 with generation apart: $(head -1 "$work/gpp2.log")"
same_samples "$work/g1" "$work/gpp2" "GRPO at PP 2"
same_metrics "$work/g1/metrics.jsonl" "$work/gpp2/metrics.jsonl" 1e-6 1e-2 || fail "GRPO at PP 2 does not train like one worker"
# training at TP 2 x PP 2, generating at TP 1 (DP 4) on the same 4 workers (HybridFlow's
# case: each rank gathers the rest of the model inside its micro-DP group of all 4)
grpo "$work/ghy" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.tp=1
grep -q "actor \[0 1 2 3\] tp 2 x pp 2 x dp 1, gen \[0 1 2 3\], ref" "$work/ghy.log" || fail "not at TP 2 x PP 2 generating at DP 4: $(head -1 "$work/ghy.log")"
same_samples "$work/g1" "$work/ghy" "GRPO at TP 2 x PP 2 generating at DP 4"
same_metrics "$work/g1/metrics.jsonl" "$work/ghy/metrics.jsonl" 1e-6 1e-2 || fail "GRPO at TP 2 x PP 2 generating at DP 4 does not train like one worker"
# training at TP 2 x PP 2, generating at 2 x TP 2 on 4 workers of its own: each generation rank
# receives exactly its shard from the actor's ranks that hold its pieces
grpo "$work/gpool" roles.actor.workers=4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 \
  roles.actor.rollout.workers=4 roles.actor.rollout.layout.tp=2
grep -q "actor \[0 1 2 3\] tp 2 x pp 2 x dp 1, gen \[4 5 6 7\] tp 2 x pp 1 x dp 2" "$work/gpool.log" ||
  fail "not at TP 2 x PP 2 generating at 2 x TP 2 apart: $(head -1 "$work/gpool.log")"
same_samples "$work/g1" "$work/gpool" "GRPO at TP 2 x PP 2 generating at 2 x TP 2 apart"
same_metrics "$work/g1/metrics.jsonl" "$work/gpool/metrics.jsonl" 1e-6 1e-2 || fail "GRPO generating at 2 x TP 2 apart does not train like one worker"
# the same with bf16 on the wire: half the bytes (the generating copy holds rounded weights)
grpo "$work/ghyb" --workers 4 roles.actor.layout.tp=2 roles.actor.layout.pp=2 roles.actor.rollout.layout.tp=1 \
  roles.actor.rollout.sync_dtype=bf16
# and generation at PP 2 on a pool of its own (each stage receives its layers from the actor)
grpo "$work/ggen" roles.actor.workers=1 roles.actor.rollout.workers=2 roles.actor.rollout.layout.pp=2
grep -q "actor \[0\], gen \[1 2\] tp 1 x pp 2 x dp 1" "$work/ggen.log" || fail "generation is not at PP 2 apart: $(head -1 "$work/ggen.log")"
same_samples "$work/g1" "$work/ggen" "GRPO generating at PP 2"
same_metrics "$work/g1/metrics.jsonl" "$work/ggen/metrics.jsonl" 1e-6 1e-2 || fail "GRPO generating at PP 2 does not train like one worker"

# the weight sync's bytes (metrics "weight_sync") against the formula, per rank from the
# memory report: a local copy moves none; a generation copy on the actor's workers receives its
# shard minus the training shard it holds (gen - actor params bytes: TP 2 x PP 2 -> TP 1 and
# -> TP 2 in HybridFlow's micro-DP groups, PP 2 -> DP 2; half of it in bf16), one on a pool of
# its own its whole shard (gen params bytes), and no rank receives a byte it holds
python3 - "$work" <<'PY' || fail "the weight sync's bytes are not the formula's"
import json, sys
def lines(run): return [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
for run in ["one", "pp2", "tp2pp2", "ghy", "ghyb", "gpp2", "ggen", "gpool"]:
    mem = next(l["memory"] for l in lines(run) if "memory" in l)
    wire = 2 if run == "ghyb" else 4  # bytes per parameter on the wire
    want = [(r["roles"]["gen"]["params_bytes"] - r["roles"].get("actor", {"params_bytes": 0})["params_bytes"]) * wire // 4
            for r in mem if "gen" in r["roles"]]
    if run == "one": want = [0]
    syncs = [l["weight_sync"] for l in lines(run) if "samples" in l]
    assert len(syncs) == 3 and all(w > 0 for w in want) == (run != "one"), (run, syncs, want)
    for w in syncs:
        assert w["bytes"] == sum(want) and w["bytes_max_rank"] == max(want), (run, w, want)
        assert w["time_s"] > 0, (run, w)  # the ranks' subtasks, start to end
    print(f"weight sync {run}: {syncs[0]['bytes']} B in all, {syncs[0]['bytes_max_rank']} B at most on a rank, formula per rank {want}")
    # the 3D-HybridEngine in place: an fp32 copy on the actor's workers reads the whole training
    # shard where it is (in a layout of its own HybridFlow's mapping nests it in the generation
    # shard), so it allocates only the bytes it receives (in the actor's layout: none); a bf16
    # copy is its own
    for r in mem:
        g, a = r["roles"].get("gen"), r["roles"].get("actor")
        if not g or not a: continue
        inplace = g.get("in_place_bytes", 0)
        assert inplace == (a["params_bytes"] if run != "ghyb" else 0), (run, r)
PY

# refused before any worker starts
out=$work/bad
if "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=1 data.train_batch_size=4 \
     roles.ref.model=$work/tiny4 roles.actor.model=$work/tiny4 graph.train_actor.mini_batch_size=2 roles.actor.workers=2 \
     roles.actor.layout.pp=2 roles.actor.rollout.layout.pp=2 roles.actor.rollout.layout.vpp=2 roles.actor.rollout.layout.schedule=interleaved \
     --no-progress > "$work/bad.log" 2>&1; then
  fail "generation at VPP 2 was not refused"
fi
grep -qF "generation runs one chunk per stage (vpp 2)" "$work/bad.log" && grep -qF "roles.actor.rollout.layout vpp: 1" "$work/bad.log" ||
  { cat "$work/bad.log" >&2; fail "the refusal of generation at VPP 2 does not say why and what to do"; }
[[ ! -e "$out" ]] || fail "workers started before the refusal"
if "$bin" run "$src/examples/grpo.yaml" $(small_run "$out") trainer.steps=1 roles.ref.model=$S roles.actor.model=$S \
     roles.actor.rollout.sync_dtype=fp16 --no-progress > "$work/bad2.log" 2>&1; then
  fail "sync_dtype fp16 was not refused"
fi
grep -qF "sync_dtype" "$work/bad2.log" && grep -qF "bf16" "$work/bad2.log" ||
  { cat "$work/bad2.log" >&2; fail "the refusal of sync_dtype fp16 does not name the key and its values"; }
[[ ! -e "$out" ]] || fail "workers started before the refusal of sync_dtype"
echo "ok"
