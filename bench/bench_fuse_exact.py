#!/usr/bin/env python3
"""bench_fuse_exact: the fused actor+critic solver (`fuseflow schedule fuse`) against the exact
optimum, where one can be had. The issue's target for the solver is "at the lower bound wherever
the lower bound is reached by any schedule, within 1% elsewhere": fuseflow's own lower bound
(dataflow/fuse.c) cannot say which instances it misses because the bound is loose and which
because the search is weak. This tool settles it with an exact model of the same problem in
Google OR-tools' CP-SAT (a constraint solver; not a dependency of fuseflow, only of this
benchmark: `scripts/deps.sh --bench` puts it into the bench venv):

  - an interval per task (model i, stage s, micro-batch k, forward or backward), its length the
    instance's time; no two intervals of a node overlap; a forward after the same micro-batch's
    forward on the previous stage, a backward after its forward on the last stage and after its
    backward on the next stage; on each node the k-th forward (backward) of a model is
    micro-batch k (the instance's rule), so they run in micro-batch order; hop latency added to
    each crossing;
  - minimise the makespan. Any feasible assignment of start times is a schedule (the node
    lists sorted by start), and fuseflow's simulator runs those lists no later, so the optimum
    here is the least makespan of any schedule. Each optimal schedule is checked back through
    `fuseflow schedule check` (its makespan must equal CP-SAT's).
  - with --peak, also: at the solver's makespan, is a peak activation of at most 1.3x the
    bound feasible (a reservoir per node: + activation at a forward's start, - at a
    backward's; the simulator's memory is the same prefix sum in list order)?
  - with --peak-min, also: the least peak of any schedule at the solver's makespan (a cumulative
    per node whose tasks are the micro-batches in flight, from a forward's start to its
    backward's, under one capacity that CP-SAT minimises, started from the solver's schedule as
    a hint): the best found, scored back through `fuseflow schedule check`, and the proven
    lower end (the larger of CP-SAT's bound and fuseflow's peak bound).

It generates the instances of bench/bench_fuse.c (the same family and formulas: 8 and 16
nodes; the critic on every node reversed, or as two replicas of nodes/2 stages; 8..64
micro-batches; forward ratios 5:4 5:2 2:2 2:1, backward twice; activation 1.6/1.8/2.0 to 1),
solves each with fuseflow (--solver-seconds, 2 threads, seed 1, as bench_fuse), and runs
CP-SAT (--exact-seconds, 2 workers) on the instances where the solver is not at fuseflow's own
lower bound (all of them with --all). Per instance: the bound, the solver's makespan, the exact
optimum (or CP-SAT's proven interval when it runs out of time), and the solver over the optimum.

Usage: bench/bench_fuse_exact.py --fuseflow build/fuseflow [--quick] [--all] [--peak] [--peak-min]
         [--solver-seconds 9.5] [--exact-seconds 60] [--only N,N,...] [--keep DIR]
The last line is the headline (with --peak-min a second line follows it: of the instances, on
how many the least peak is decided, proven over 1.3x fuseflow's peak bound, and the solver within
1.3x of the proven lower end):
  fuse_exact: N instances; the bound reachable on R, the solver at it on A; unreachable on U, the
  solver within 1% of the optimum on W; D undecided (target: ...)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

try:
    from ortools.sat.python import cp_model
except ImportError:
    sys.exit("bench_fuse_exact: needs OR-tools (pip install ortools; scripts/deps.sh --bench puts it into "
             "~/.cache/fuseflow/bench-venv: run this script with that venv's python)")

RATIOS = [(5, 4), (5, 2), (2, 2), (2, 1)]
ACTS = [1.6, 1.8, 2.0]
ACT_SCALE = 10  # activations are multiples of 0.1 in the family: integers for CP-SAT


def family(quick):
    """The instances of bench_fuse.c in its order (idx counts every instance, quick or not)."""
    idx = 0
    for nodes in (8, 16):
        for replicas in (1, 2):
            for micro in (8, 16, 32, 64):
                for fa, fc in RATIOS:
                    act = ACTS[idx % 3]
                    idx += 1
                    if quick and (nodes != 8 or micro not in (8, 32)):
                        continue
                    per = nodes // replicas
                    models = [{"name": "actor", "family": "actor", "stages": list(range(nodes)), "micro_batches": micro,
                               "forward": fa, "backward": 2 * fa, "activation": act}]
                    for r in range(replicas):
                        models.append({"name": "critic%d" % r, "family": "critic",
                                       "stages": [r * per + per - 1 - s for s in range(per)], "micro_batches": micro // replicas,
                                       "forward": fc * replicas, "backward": 2 * fc * replicas, "activation": 1.0 * replicas})
                    label = "%d %s %d %d:%d" % (nodes, "pp%d" % nodes if replicas == 1 else "pp%dx2" % per, micro, fa, fc)
                    yield idx - 1, label, {"nodes": nodes, "models": models}


def model_of(inst, makespan_cap=None, peak_cap=None, min_peak=False):
    """The CP-SAT model: (model, makespan var, {(i, s, k, 'F'|'B'): start var}, node of each key).
    With min_peak (and a makespan_cap): minimise the peak activation instead, a cumulative per
    node whose tasks are the micro-batches in flight there (from a forward's start to the same
    micro-batch's backward's start, its activation high) under one capacity, the peak."""
    for md in inst["models"]:
        for key in ("forward", "backward"):
            if md[key] != int(md[key]):
                raise SystemExit("bench_fuse_exact: times must be integers (%s %s = %g)" % (md["name"], key, md[key]))
    hop = int(inst.get("hop_latency", 0))
    horizon = sum(md["micro_batches"] * len(md["stages"]) * (md["forward"] + md["backward"] + 2 * hop) for md in inst["models"])
    m = cp_model.CpModel()
    starts, node_of = {}, {}
    per_node = {n: [] for n in range(inst["nodes"])}
    levels = {n: ([], []) for n in range(inst["nodes"])}
    mk = m.NewIntVar(0, horizon, "makespan")
    for i, md in enumerate(inst["models"]):
        S, M = len(md["stages"]), md["micro_batches"]
        f, b = int(md["forward"]), int(md["backward"])
        a = int(round(md["activation"] * ACT_SCALE))
        for s in range(S):
            n = md["stages"][s]
            for k in range(M):
                for kind, d in (("F", f), ("B", b)):
                    v = m.NewIntVar(0, horizon, "%s%d_%d_%d" % (kind, i, s, k))
                    per_node[n].append(m.NewFixedSizeIntervalVar(v, d, ""))
                    levels[n][0].append(v)
                    levels[n][1].append(a if kind == "F" else -a)
                    starts[i, s, k, kind] = v
                    node_of[i, s, k, kind] = n
        for s in range(S):
            for k in range(M):
                F, B = starts[i, s, k, "F"], starts[i, s, k, "B"]
                if s > 0:
                    m.Add(F >= starts[i, s - 1, k, "F"] + f + hop)
                if s == S - 1:
                    m.Add(B >= F + f)
                else:
                    m.Add(B >= starts[i, s + 1, k, "B"] + b + hop)
                if k > 0:
                    m.Add(F >= starts[i, s, k - 1, "F"] + f)
                    m.Add(B >= starts[i, s, k - 1, "B"] + b)
                m.Add(mk >= B + b)
    for n in per_node:
        m.AddNoOverlap(per_node[n])
    if makespan_cap is not None:
        m.Add(mk <= int(makespan_cap))
    else:
        m.Minimize(mk)
    if min_peak:
        assert makespan_cap is not None
        peak = m.NewIntVar(0, sum(int(round(md["activation"] * ACT_SCALE)) * md["micro_batches"] for md in inst["models"]), "peak")
        flights = {n: ([], []) for n in range(inst["nodes"])}
        for i, md in enumerate(inst["models"]):
            a = int(round(md["activation"] * ACT_SCALE))
            for s_ in range(len(md["stages"])):
                for k in range(md["micro_batches"]):
                    F, B = starts[i, s_, k, "F"], starts[i, s_, k, "B"]
                    size = m.NewIntVar(0, horizon, "")
                    flights[md["stages"][s_]][0].append(m.NewIntervalVar(F, size, B, ""))
                    flights[md["stages"][s_]][1].append(a)
        for n in flights:
            if flights[n][0]:
                m.AddCumulative(flights[n][0], flights[n][1], peak)
        m.Minimize(peak)
        mk = peak  # the objective
    if peak_cap is not None:
        for n in levels:
            if levels[n][0]:
                m.AddReservoirConstraint(levels[n][0], levels[n][1], 0, int(peak_cap))
    return m, mk, starts, node_of


def run_cp(m, seconds):
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = seconds
    s.parameters.num_workers = 2
    return s, s.Solve(m)


def lists_of(inst, solver, starts, node_of):
    """The node lists of a CP-SAT solution, in the `fuseflow schedule check` form."""
    rows = {n: [] for n in range(inst["nodes"])}
    for key, v in starts.items():
        rows[node_of[key]].append((solver.Value(v), key[0], key[3]))
    return {"schedule": [[[i, kind] for _, i, kind in sorted(rows[n])] for n in range(inst["nodes"])]}


def start_times(inst, schedule):
    """The start of every task when the node lists run as `fuseflow schedule check` runs them
    (a task starts when its node is free and its micro-batch's previous step has ended), keyed
    as model_of's starts; a hint for CP-SAT."""
    stage_of = [{n: s for s, n in enumerate(md["stages"])} for md in inst["models"]]
    lists = []
    for n, row in enumerate(schedule):
        seen, keys = {}, []
        for i, kind in row:
            k = seen.get((i, kind), 0)
            seen[i, kind] = k + 1
            keys.append((i, stage_of[i][n], k, kind))
        lists.append(keys)
    end, start, pos, free = {}, {}, [0] * len(lists), [0] * len(lists)
    moved = True
    while moved:
        moved = False
        for n, keys in enumerate(lists):
            while pos[n] < len(keys):
                i, s, k, kind = keys[pos[n]]
                md = inst["models"][i]
                hop = int(inst.get("hop_latency", 0))
                if kind == "F":
                    dep = (i, s - 1, k, "F") if s > 0 else None
                else:
                    dep = (i, s, k, "F") if s == len(md["stages"]) - 1 else (i, s + 1, k, "B")
                if dep is not None and dep not in end:
                    break
                ready = 0 if dep is None else end[dep] + (hop if dep[1] != s else 0)
                t = max(free[n], ready)
                start[i, s, k, kind] = t
                end[i, s, k, kind] = free[n] = t + int(md["forward" if kind == "F" else "backward"])
                pos[n] += 1
                moved = True
    return start


def fuseflow_json(args, *argv):
    out = subprocess.run([args.fuseflow, "schedule", *argv, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fuseflow", required=True)
    ap.add_argument("--quick", action="store_true", help="8 nodes, 8 and 32 micro-batches only (bench_fuse's --quick)")
    ap.add_argument("--all", action="store_true", help="CP-SAT on every instance, not only where the solver misses the bound")
    ap.add_argument("--peak", action="store_true", help="also decide a peak of 1.3x the bound at the solver's makespan")
    ap.add_argument("--solver-seconds", type=float, default=9.5)
    ap.add_argument("--exact-seconds", type=float, default=60)
    ap.add_argument("--peak-min", action="store_true",
                    help="also the least peak of any schedule at the solver's makespan (CP-SAT, from the solver's schedule)")
    ap.add_argument("--only", default="", help="instance indices (bench_fuse's order over all 64), comma separated")
    ap.add_argument("--keep", default="", help="a folder to keep each instance, solver schedule and optimal schedule in")
    args = ap.parse_args()
    only = {int(x) for x in args.only.split(",") if x}
    tmp = args.keep or tempfile.mkdtemp(prefix="bench_fuse_exact.")
    os.makedirs(tmp, exist_ok=True)
    print("%-22s %8s %8s %8s %12s %9s %9s %s" % ("instance", "bound", "solver", "optimum", "status", "solver/opt", "exact s",
                                                    "peak<=1.3x bound at solver's makespan" if args.peak else ""))
    n = reach = reach_ok = other = other_ok = undecided = 0
    pk_decided = pk_within = pk_proven_over = pk_n = 0
    for idx, label, inst in family(args.quick):
        if only and idx not in only:
            continue
        path = os.path.join(tmp, "i%02d.json" % idx)
        with open(path, "w") as fh:
            json.dump(inst, fh)
        sol = fuseflow_json(args, "fuse", path, "--seconds", str(args.solver_seconds), "--threads", "2", "--seed", "1")
        lb, got = sol["lower_bound"]["makespan"], sol["makespan"]
        n += 1
        if got <= lb * (1 + 1e-9) and not args.all:
            opt, status, secs = lb, "bound", 0.0  # the solver is at fuseflow's bound: the bound is the optimum
        else:
            m, mk, starts, node_of = model_of(inst)
            t0 = time.time()
            cs, r = run_cp(m, args.exact_seconds)
            secs = time.time() - t0
            status = cs.StatusName(r)
            if r == cp_model.OPTIMAL:
                opt = cs.Value(mk)
                spath = os.path.join(tmp, "i%02d.optimal.json" % idx)
                with open(spath, "w") as fh:
                    json.dump(lists_of(inst, cs, starts, node_of), fh)
                chk = fuseflow_json(args, "check", path, spath)
                if abs(chk["makespan"] - opt) > 1e-9:
                    sys.exit("bench_fuse_exact: instance %d: fuseflow scores CP-SAT's optimal schedule %g, CP-SAT %g: "
                             "the two models differ" % (idx, chk["makespan"], opt))
            elif r == cp_model.FEASIBLE:
                opt = None
                status = "%g..%g" % (cs.BestObjectiveBound(), cs.ObjectiveValue())
            else:
                opt = None
                status = "unknown"
        peak_txt = ""
        if args.peak:
            cap = int(1.3 * sol["lower_bound"]["peak_activation"] * ACT_SCALE + 1e-9)
            if sol["peak_activation"] * ACT_SCALE <= cap + 1e-9:
                peak_txt = "the solver's (%g)" % sol["peak_activation"]
            else:
                m, _, _, _ = model_of(inst, makespan_cap=got, peak_cap=cap)
                cs, r = run_cp(m, args.exact_seconds)
                peak_txt = {cp_model.OPTIMAL: "exists", cp_model.FEASIBLE: "exists",
                            cp_model.INFEASIBLE: "none exists"}.get(r, "undecided") + " (solver %g, cap %g)" % (
                                sol["peak_activation"], cap / ACT_SCALE)
        if args.peak_min:
            m, obj, starts, node_of = model_of(inst, makespan_cap=got, min_peak=True)
            hint = start_times(inst, sol["schedule"])
            for key, v in starts.items():
                m.AddHint(v, hint[key])
            t0 = time.time()
            cs, r = run_cp(m, args.exact_seconds)
            plb = sol["lower_bound"]["peak_activation"]
            low = max(cs.BestObjectiveBound() / ACT_SCALE, sol["lower_bound"]["peak_activation"])  # both are bounds
            best = cs.ObjectiveValue() / ACT_SCALE if r in (cp_model.OPTIMAL, cp_model.FEASIBLE) else float("nan")
            if r in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                spath = os.path.join(tmp, "i%02d.least_peak.json" % idx)
                with open(spath, "w") as fh:
                    json.dump(lists_of(inst, cs, starts, node_of), fh)
                chk = fuseflow_json(args, "check", path, spath)
                # a feasible (not optimal) objective may lie above the schedule's own peak
                if chk["peak_activation"] > best + 1e-6 or chk["makespan"] > got + 1e-9:
                    sys.exit("bench_fuse_exact: instance %d: fuseflow scores CP-SAT's least-peak schedule at peak %g makespan %g, "
                             "CP-SAT peak %g under %g: the two models differ" % (idx, chk["peak_activation"], chk["makespan"], best, got))
                best = chk["peak_activation"]
            pk_n += 1
            pk_decided += r == cp_model.OPTIMAL or best <= low + 1e-9
            pk_within += sol["peak_activation"] <= 1.3 * low + 1e-9
            pk_proven_over += low > 1.3 * plb + 1e-9
            peak_txt += " least peak %s%s in %.0f s (bound %g, 1.3x %g; solver %g = %.3fx the least found)" % (
                "%g" % best if best <= low + 1e-9 else "%g..%g" % (low, best), "" if best <= low + 1e-9 else " (open)",
                time.time() - t0, plb, 1.3 * plb, sol["peak_activation"], sol["peak_activation"] / best)
        if opt is None:
            undecided += 1
            ratio = "-"
        elif opt <= lb * (1 + 1e-9):  # the bound is reached by some schedule: the solver must reach it
            ratio = "%.4f" % (got / opt)
            reach += 1
            reach_ok += got <= opt * (1 + 1e-9)
        else:  # no schedule reaches the bound: within 1% of the least makespan
            ratio = "%.4f" % (got / opt)
            other += 1
            other_ok += got <= opt * 1.01 + 1e-9
        print("%-22s %8g %8g %8s %12s %9s %9.1f %s" % (label, lb, got, "-" if opt is None else "%g" % opt, status, ratio, secs, peak_txt),
              flush=True)
    print("fuse_exact: %d instances; the bound reachable on %d, the solver at it on %d; unreachable on %d, the solver within 1%% "
          "of the optimum on %d; %d undecided (target: at the bound wherever it is reachable, within 1%% of the optimum "
          "elsewhere)" % (n, reach, reach_ok, other, other_ok, undecided))
    if args.peak_min:
        print("fuse_exact peak: %d instances at the solver's makespan; the least peak decided on %d; proven over 1.3x fuseflow's "
              "peak bound on %d; the solver within 1.3x of the proven least peak's lower end on %d (target: peak <= 1.3x its lower "
              "bound)" % (pk_n, pk_decided, pk_proven_over, pk_within))


if __name__ == "__main__":
    main()
