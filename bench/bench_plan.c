/* Planner search speed: candidates per second of `fuseflow plan search` (values hoisted out of
 * the inner loops, groups from the rank factors) against the naive search that evaluates every
 * candidate from scratch with ff_plan_evaluate (validation, allocation, visiting every group of
 * ranks), on the same candidates in the same run, and a check that both rank them alike.
 *
 * Case: Llama 3 405B on 16,384 H100s, 8K sequences, 2048 sequences per step, every TP, CP, PP,
 * chunk count, micro-batch size, ZeRO stage and checkpointing choice. The naive search is slow
 * enough here that it runs on the first candidates only; its rate is measured on those. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

static double run(const ff_plan_input *in, ff_plan_search_opts *o, ff_plan_search_result *r) {
    int64_t t0 = ff_now_ns();
    if (ff_plan_search(in, o, r)) {
        fprintf(stderr, "bench_plan: %s\n", ff_error_message());
        exit(1);
    }
    return (double)(ff_now_ns() - t0) * 1e-9;
}

int main(void) {
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    if (ff_plan_model_preset("llama3-405b", &in.model) || ff_plan_cluster_preset("dgx-h100", &in.cluster)) return 1;
    in.cluster.gpus = 16384;
    in.workload.seq = 8192;
    ff_plan_search_opts o;
    memset(&o, 0, sizeof o);
    o.global_batch = 2048;
    o.try_checkpoint = true;
    o.top = 10;

    /* fast, the whole space, best of 5 */
    double best = 1e30;
    size_t all = 0, fitting = 0;
    ff_plan_search_result r;
    for (int rep = 0; rep < 5; rep++) {
        double s = run(&in, &o, &r);
        if (s < best) best = s;
        all = r.evaluated, fitting = r.fitting;
        ff_plan_search_result_clear(&r);
    }
    double fast_rate = (double)all / best;
    printf("fast search: %zu candidates (%zu fit) in %.1f ms: %.0f candidates/s\n", all, fitting, best * 1e3, fast_rate);

    /* both on the same first candidates: same ranking, and the naive rate */
    o.max_candidates = 300;
    ff_plan_search_result a, b;
    double tf = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        double s = run(&in, &o, &a);
        if (s < tf) tf = s;
        if (rep < 19) ff_plan_search_result_clear(&a);
    }
    o.naive = true;
    double tn = run(&in, &o, &b);
    int same = a.evaluated == b.evaluated && a.fitting == b.fitting && a.n_best == b.n_best;
    for (size_t i = 0; same && i < a.n_best; i++)
        same = a.best[i].iteration_s == b.best[i].iteration_s && a.best[i].layout.tp == b.best[i].layout.tp &&
               a.best[i].layout.pp == b.best[i].layout.pp && a.best[i].layout.cp == b.best[i].layout.cp;
    double naive_rate = (double)b.evaluated / tn;
    printf("naive search: %zu candidates in %.1f ms: %.0f candidates/s (fast on the same: %.2f ms); rankings %s\n", b.evaluated, tn * 1e3,
           naive_rate, tf * 1e3, same ? "identical" : "DIFFER");
    ff_plan_search_result_clear(&a);
    ff_plan_search_result_clear(&b);
    if (!same) return 1;
    printf("plan_search: %.0f candidates/s (target: >= 10000 candidates/s, thousands in well under a second; %.0fx the naive "
           "search that re-evaluates every candidate, on the same %zu)\n",
           fast_rate, tn / tf, (size_t)o.max_candidates);
    return 0;
}
