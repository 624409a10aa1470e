#!/usr/bin/env bash
# The timeline of a PPO run (`fuseflow run examples/ppo.yaml --trace`, two DP ranks, two
# iterations on a small random model) records each sample's path as dependencies between
# jobs: generation -> log-probs and values -> reward -> advantage -> the train steps of its
# mini-batches -> sync -> the next iteration's generation, each dependency a real one (the
# job started after the one it names ended) and drawn as an arrow. `fuseflow trace summary`
# finds the longest chain of dependent jobs along it (at least generate -> log-prob/value
# -> train, several jobs long), and says what the chain is, link by link and by kind.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
prepare_inputs
M=$cache/tiny

"$bin" run "$src/examples/ppo.yaml" $(small_run "$work/ppo") trainer.steps=2 trainer.test_freq=0 trainer.save_freq=0 \
  data.train_batch_size=4 roles.actor.model=$M roles.ref.model=$M roles.critic.model=$M --workers 2 \
  graph.train_actor.mini_batch_size=2 graph.train_actor.micro_batch_size=1 graph.train_critic.mini_batch_size=2 \
  graph.train_critic.micro_batch_size=1 --trace "$work/t.json" --no-progress > "$work/run.log" 2>&1 ||
  { cat "$work/run.log" >&2; fail "the PPO run with --trace failed"; }
grep -q "timeline written to $work/t.json" "$work/run.log" || fail "the run did not say where the timeline is"
"$bin" trace summary "$work/t.json" --json > "$work/summary.json" || fail "trace summary --json failed"
"$bin" trace summary "$work/t.json" > "$work/summary.txt" || fail "trace summary failed"

python3 - "$work/t.json" "$work/summary.json" "$work/summary.txt" <<'PY' || fail "the PPO timeline's dependencies are wrong"
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
summary = json.load(open(sys.argv[2]))
text = open(sys.argv[3]).read()

# jobs: subtask slices (a group job's members merged) and the executor's controller-side jobs
jobs = {}
for e in ev:
    a = e.get("args", {})
    if e.get("ph") != "X" or "job" not in a:
        continue
    j = jobs.setdefault(a["job"], {"name": e["name"], "kind": a["kind"], "after": a["after"], "start": e["ts"],
                                   "end": e["ts"] + e["dur"], "at": []})
    j["start"] = min(j["start"], e["ts"])
    j["end"] = max(j["end"], e["ts"] + e["dur"])
    j["at"].append((e["pid"], e["tid"], e["ts"]))
def named(prefix):
    return [i for i, j in jobs.items() if j["name"].startswith(prefix)]

# every dependency is real: the job started after each job it names had ended (times are
# printed to 1 ns: 2 ns of rounding)
for i, j in jobs.items():
    for d in j["after"]:
        assert d in jobs, f"{j['name']} depends on job {d}, which is not in the trace"
        assert j["start"] >= jobs[d]["end"] - 0.002, f"{j['name']} started before {jobs[d]['name']} ended"

# the sample paths, stage by stage
def deps_named(i, prefix):
    return [d for d in jobs[i]["after"] if jobs[d]["name"].startswith(prefix)]
gens = named("rollout g")
assert len(gens) == 8, f"{len(gens)} generation jobs for 2 iterations x 4 prompts"
for p in ("ref_logprob s", "values s"):
    assert named(p) and all(deps_named(i, "rollout g") for i in named(p)), f"{p} jobs do not depend on generation"
for i in named("reward s"):
    assert jobs[i]["kind"] == "reward_fn" and deps_named(i, "rollout g"), "rewards do not depend on generation"
adv = named("advantage s")
assert adv, "no advantage jobs"
for i in adv:
    assert jobs[i]["kind"] == "advantage"
    for p in ("rollout g", "ref_logprob s", "values s", "reward s"):
        assert deps_named(i, p), f"an advantage does not depend on {p}"
for p in ("train_actor step", "train_critic step"):
    steps = named(p)
    assert len(steps) == 2 * 2 * 2, f"{len(steps)} {p} jobs (2 iterations x 2 mini-batches x 2 ranks)"
    assert all(deps_named(i, "advantage s") for i in steps), f"{p} does not depend on the advantages"
    # the second step of a rank follows its first
    assert all(deps_named(i, p) for i in steps if " step 1 " in jobs[i]["name"]), f"{p} 1 does not follow step 0"
syncs = sorted(named("sync"))
assert len(syncs) == 2 and all(deps_named(i, "train_actor step 1") for i in syncs), "sync does not follow the actor's training"
second = [i for i in gens if i > syncs[0]]
assert len(second) == 4 and all(syncs[0] in jobs[i]["after"] for i in second), "iteration 2 does not generate on the synced weights"

# each dependency is an arrow (cat "after") from the job it names to the job, at its start
starts = {(p, t, ts) for j in jobs.values() for (p, t, ts) in j["at"]}
s_ids = {e["id"] for e in ev if e.get("cat") == "after" and e["ph"] == "s"}
f_ev = [e for e in ev if e.get("cat") == "after" and e["ph"] == "f"]
assert len(s_ids) > 20 and s_ids == {e["id"] for e in f_ev}, "dependency arrows are missing or unpaired"
assert all((e["pid"], e["tid"], e["ts"]) in starts and e.get("bp") == "e" for e in f_ev), "an arrow does not end at a job's start"
assert not any(e.get("cat") == "sample" for e in ev), "the old sample-path arrows are still drawn"

# the summary: the longest chain is the run's critical path, several dependent jobs long
ch = summary["longest_chain"]
links = ch["links"]
assert ch["length"] == len(links) == len(ch["jobs"]) >= 5, ch
kinds = [l["kind"] for l in links]
def subseq(want, have):
    it = iter(have)
    return all(any(w(k) for k in it) for w in want)
assert subseq([lambda k: k == "rl.generate", lambda k: k in ("rl.logprob", "rl.value"), lambda k: k == "rl.train"], kinds), kinds
for a, b in zip(links, links[1:]):
    assert a["job"] in jobs[b["job"]]["after"], f"{b['name']} does not depend on {a['name']}"
    assert b["start_us"] >= a["end_us"] - 0.002, f"{b['name']} starts before {a['name']} ends"
for l in links:
    j = jobs[l["job"]]
    assert (l["name"], l["kind"]) == (j["name"], j["kind"]) and abs(l["start_us"] - j["start"]) < 1e-6 and abs(l["end_us"] - j["end"]) < 1e-6, l
busy = sum(l["end_us"] - l["start_us"] for l in links)
assert abs(ch["busy_us"] - busy) < 1e-3 and ch["elapsed_us"] >= busy - 1e-3, ch
by_kind = {k["kind"]: k["jobs"] for k in ch["kinds"]}
assert sum(by_kind.values()) == len(links) and by_kind.get("rl.train", 0) >= 1, ch["kinds"]
assert any(c["name"].startswith("executor") and c["jobs"] == len(adv) + len(named("reward s")) for c in summary["controller"]), summary["controller"]
m = re.search(r"longest chain of dependent jobs: (\d+) jobs", text)
assert m and int(m.group(1)) == len(links), text
assert "by kind: " in text and "(rl.generate)" in text and "(advantage)" in text, text
print(f"longest chain: {len(links)} jobs: {' -> '.join(kinds)}")
PY
echo "ok"
