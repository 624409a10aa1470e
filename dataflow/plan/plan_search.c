/* Layout search: every TP, CP, PP, EP degree, micro-batch size, pipeline schedule and chunk count,
 * ZeRO stage and checkpointing choice that the constraints allow for a model, a GPU count and a
 * global batch; the layouts that fit in HBM ranked by estimated iteration time.
 *
 * Fast because the loops are nested so that what a level fixes is computed once at that level:
 * where the groups sit (per TP, CP, PP, EP), the layer placement (per PP and chunks); each
 * candidate then costs one pass over its stages. The naive mode evaluates every candidate from
 * scratch (validation, allocation, visiting every group of ranks), as calling ff_plan_evaluate in
 * a loop would: bench/bench_plan.c compares the two, tests/plan check they agree. */
#include <stdlib.h>
#include <string.h>

#include "dataflow/plan/plan_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

static size_t divisors(int64_t n, int64_t *out, size_t cap) {
    size_t k = 0;
    for (int64_t d = 1; d <= n && k < cap; d++)
        if (n % d == 0) out[k++] = d;
    return k;
}

typedef struct keeper {
    ff_plan_candidate *best;
    size_t n, cap;
} keeper;

static bool better(const ff_plan_candidate *a, const ff_plan_candidate *b) {
    if (a->iteration_s != b->iteration_s) return a->iteration_s < b->iteration_s;
    return a->total_bytes < b->total_bytes;
}

static void keep(keeper *k, const ff_plan_candidate *c) {
    if (k->n == k->cap && !better(c, &k->best[k->n - 1])) return;
    size_t i = k->n < k->cap ? k->n++ : k->cap - 1;
    while (i > 0 && better(c, &k->best[i - 1])) {
        k->best[i] = k->best[i - 1];
        i--;
    }
    k->best[i] = *c;
}

static void record(keeper *k, ff_plan_search_result *out, const ff_plan_input *in, const ff_plan_result *r) {
    out->evaluated++;
    if (!r->memory.fits) return;
    out->fitting++;
    ff_plan_candidate c;
    memset(&c, 0, sizeof c);
    c.layout = in->layout;
    c.micro_batch = in->workload.micro_batch;
    c.micro_batches = in->workload.micro_batches;
    c.iteration_s = r->time.iteration_s;
    c.total_bytes = r->memory.total_bytes;
    c.bubble_fraction = r->time.bubble_fraction;
    c.tokens_per_s = r->time.tokens_per_s;
    c.compute_fraction = r->time.compute_fraction;
    keep(k, &c);
}

int ff_plan_search(const ff_plan_input *base, const ff_plan_search_opts *o, ff_plan_search_result *out) {
    memset(out, 0, sizeof *out);
    int64_t t0 = ff_now_ns();
    if (o->global_batch < 1)
        return ff_error_set("search", "give the sequences per optimizer step with --global-batch", "no global batch");
    ff_plan_input in = *base;
    /* check the model, workload and cluster once, on the simplest layout */
    in.layout.tp = in.layout.cp = in.layout.pp = in.layout.ep = in.layout.vpp = 1;
    in.layout.dp = 0;
    in.layout.schedule = FF_PLAN_1F1B;
    in.layout.zero_schedule = FF_PLAN_ZS_DEFAULT;
    in.layout.layers_first = in.layout.layers_last = 0;
    in.workload.micro_batches = 1;
    in.workload.global_batch = 0;
    {
        ff_plan_input probe = in;
        if (ff_plan_resolve(&probe)) return ff_error_wrap("search");
        in.model = probe.model;
    }
    const ff_plan_model *m = &in.model;
    int64_t N = in.cluster.gpus, L = m->layers, B = o->global_batch, S = in.workload.seq;
    size_t top = o->top ? o->top : 10;
    unsigned zmask = o->zero_mask ? o->zero_mask : 0xF;
    keeper k = {ff_calloc(top, sizeof(ff_plan_candidate)), 0, top};
    int64_t *lay = ff_calloc((size_t)(3 * L + 3), sizeof(int64_t));
    pplink *pl = ff_calloc((size_t)L + 1, sizeof(pplink));
    int64_t dt[512], dc[512], de[512];
    if (!k.best || !lay || !pl) {
        free(k.best), free(lay), free(pl);
        return -1;
    }
    static const int64_t mbs[] = {1, 2, 4, 8, 16};
    size_t ntp = divisors(N, dt, 512);
    for (size_t it = 0; it < ntp; it++) {
        int64_t t = dt[it];
        if ((o->max_tp && t > o->max_tp) || (m->kv_heads % t && t % m->kv_heads) || m->heads % t || m->ffn % t || (m->experts && m->expert_ffn % t)) continue;
        size_t ncp = divisors(N / t, dc, 512);
        for (size_t ic = 0; ic < ncp; ic++) {
            int64_t c = dc[ic];
            if ((o->max_cp && c > o->max_cp) || (c > 1 && S % (2 * c))) continue;
            if (in.layout.sequence_parallel && t > 1 && (S / c) % t) continue;
            int64_t dp_[512];
            size_t npp = divisors(N / (t * c), dp_, 512);
            for (size_t ip = 0; ip < npp; ip++) {
                int64_t p = dp_[ip], d = N / (t * c * p);
                if (p > L || (o->max_pp && p > o->max_pp)) continue;
                size_t nep = 1;
                de[0] = 1;
                if (m->experts > 0) {
                    nep = 0;
                    int64_t tmp[512];
                    size_t n = divisors(d, tmp, 512);
                    for (size_t i = 0; i < n; i++)
                        if (m->experts % tmp[i] == 0 && (!o->max_ep || tmp[i] <= o->max_ep)) de[nep++] = tmp[i];
                }
                for (size_t ie = 0; ie < nep; ie++) {
                    int64_t e = de[ie];
                    in.layout.tp = t, in.layout.cp = c, in.layout.pp = p, in.layout.dp = d, in.layout.ep = e;
                    prep pr;
                    memset(&pr, 0, sizeof pr);
                    pr.n_stages = p;
                    pr.layers = lay, pr.moe_layers = lay + L + 1, pr.pp = pl;
                    if (!o->naive) { /* where the groups sit: fixed by t, c, p, e */
                        rankmap rm;
                        rankmap_build(&in, &rm);
                        prep_links(&in, &rm, false, &pr);
                    }
                    for (size_t ib = 0; ib < sizeof mbs / sizeof mbs[0]; ib++) {
                        int64_t b = mbs[ib];
                        if ((o->max_mbs && b > o->max_mbs) || (o->max_mbs == 0 && b > 8)) continue;
                        if (B % (b * d)) continue;
                        if (o->min_tokens && b * S / c < o->min_tokens && b * S / c < S) continue; /* a whole sequence always passes */
                        int64_t G = B / (b * d);
                        in.workload.micro_batch = b, in.workload.micro_batches = G, in.workload.global_batch = B;
                        int64_t vmax = p > 1 ? (o->max_vpp ? o->max_vpp : 8) : 1;
                        for (int64_t v = 1; v <= vmax; v++) {
                            if (v > 1 && (v * p > L || G % p)) continue;
                            for (int si = 0; si < 2; si++) { /* 1F1B (or interleaved), then AFAB */
                                ff_plan_schedule sch = v > 1 ? FF_PLAN_INTERLEAVED : (si ? FF_PLAN_AFAB : FF_PLAN_1F1B);
                                if (si && (v > 1 || p == 1)) continue;
                                in.layout.vpp = v, in.layout.schedule = sch;
                                if (!o->naive && prep_place(&in, pr.layers, pr.moe_layers, lay + 2 * (L + 1))) continue;
                                for (int z = 0; z <= 3; z++) {
                                    if (!(zmask & (1u << z))) continue;
                                    if (sch == FF_PLAN_AFAB && z != 2) continue; /* AFAB only pays with ZeRO-2's one reduce-scatter */
                                    in.layout.zero = z;
                                    in.layout.zero_schedule = FF_PLAN_ZS_DEFAULT;
                                    for (int ck = 0; ck <= (o->try_checkpoint ? 1 : 0); ck++) {
                                        in.layout.checkpoint = ck;
                                        if (o->max_candidates && out->evaluated >= o->max_candidates) goto done;
                                        ff_plan_result r;
                                        if (o->naive) {
                                            if (ff_plan_evaluate(&in, &r)) continue;
                                            record(&k, out, &in, &r);
                                            ff_plan_result_clear(&r);
                                        } else {
                                            plan_core(&in, &pr, &r, NULL);
                                            record(&k, out, &in, &r);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
done:
    free(lay), free(pl);
    out->best = k.best;
    out->n_best = k.n;
    out->elapsed_s = (double)(ff_now_ns() - t0) * 1e-9;
    ff_error_clear();
    return 0;
}

void ff_plan_search_result_clear(ff_plan_search_result *r) {
    if (!r) return;
    free(r->best);
    memset(r, 0, sizeof *r);
}
