/* The generation + inference stage as the run measures it, for `migrate: auto` (docs/run.md
 * "Migration"): the controller fits each generation worker's decode step time as a function of
 * its batch and context from the rl.generate timings of iterations without a migration, the
 * inference forwards' seconds per token from the rl.logprob/value/score timings, a
 * migration's latency and cost per moved sample from past migrations, and keeps the last iteration's response lengths; at the
 * start of an iteration it feeds those to the planner's simulator (plan.h,
 * ff_plan_rollout_simulate) on the live generation workers, which picks R_t and the survivors
 * and predicts the stage's time serial, fused and fused with migration.
 *
 * The step fit reconstructs batches from job ends only: a worker decodes its open jobs in
 * lockstep, so a job of longest response L took L steps, and each of its samples is taken to
 * finish at the share of the job's time its length is of L; the inference subtasks the worker
 * ran meanwhile are taken off. An iteration that migrated is read up to the decision: until
 * then every worker decoded as without migration, so its jobs that ended before it are read,
 * except on a source (a job moved away ends early: no lockstep to read on its rank); the
 * survivors' jobs still open then are taken at their own rate to their ends, which the moved
 * samples slow (a small bias beside the reconstruction's). Not here: the decision's use
 * (exec_iter.c maybe_migrate), any measurement on the workers. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

typedef struct gen_rec {
    int rank;
    int64_t start_ns, end_ns;
    double plen;       /* prompt tokens of its samples (their mean) */
    int64_t off, n;    /* its response lengths: lens[off .. off + n) */
    int32_t lmax;
    bool moved; /* its open samples left at a migration: ended early, never read */
} gen_rec;

typedef struct busy_rec {
    int rank;
    int64_t start_ns, end_ns;
} busy_rec;

struct ex_rollout {
    /* this iteration's records */
    gen_rec *gen;
    int64_t ngen, cap_gen;
    int32_t *lens; /* [nlen] response tokens of the jobs' samples (gen_rec's, then the others) */
    int64_t nlen, cap_len;
    int32_t *final; /* [nfinal] every sample's final response length this iteration */
    int64_t nfinal, cap_final;
    double plen_sum, plen_n;
    busy_rec *busy;
    int64_t nbusy, cap_busy;
    /* over the run: the step fit's weighted normal equations over (1, batch, context) */
    double xtx[3][3], xty[3];
    int64_t nobs; /* jobs read */
    double infer_s[EX_MAX_NODES], infer_tok[EX_MAX_NODES]; /* per scoring node */
    double mv[5];                                          /* past migrations: sums of 1, n, n^2, t, n t (n moved in t s) */
    /* the last finished iteration: its response lengths and mean prompt */
    int64_t *hist;
    int64_t nhist;
    double hist_plen;
    /* the fit the simulation uses: step = a + b batch + c context (seconds) */
    double a, b, c, infer_per_tok, move_latency, move_per_sample;
};

static int grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * size);
    if (!q) return -1;
    *p = q, *cap = n;
    return 0;
}

static ex_rollout *ro_of(ex_run *x) {
    if (!x->ro) x->ro = ff_calloc(1, sizeof *x->ro);
    return x->ro;
}

void ex_rollout_free(ex_rollout **pr) {
    if (!pr || !*pr) return;
    ex_rollout *r = *pr;
    free(r->gen), free(r->lens), free(r->final), free(r->busy), free(r->hist);
    free(r);
    *pr = NULL;
}

void ex_rollout_gen(ex_run *x, int rank, int64_t start_ns, int64_t end_ns, double plen, const int32_t *rl, int64_t n, bool moved) {
    ex_rollout *r = ro_of(x);
    if (!r || n < 1 || start_ns <= 0 || end_ns <= start_ns) return;
    if (grow((void **)&r->gen, &r->cap_gen, r->ngen + 1, sizeof *r->gen) ||
        grow((void **)&r->lens, &r->cap_len, r->nlen + n, sizeof *r->lens))
        return; /* a lost observation, not an error */
    gen_rec *g = &r->gen[r->ngen++];
    *g = (gen_rec){.rank = rank, .start_ns = start_ns, .end_ns = end_ns, .plen = plen, .off = r->nlen, .n = n, .moved = moved};
    for (int64_t i = 0; i < n; i++) {
        int32_t l = rl[i] > 0 ? rl[i] : 0;
        r->lens[r->nlen++] = l;
        if (l > g->lmax) g->lmax = l;
    }
}

void ex_rollout_final(ex_run *x, double plen, const int32_t *rl, int64_t n) {
    ex_rollout *r = ro_of(x);
    if (!r || grow((void **)&r->final, &r->cap_final, r->nfinal + n, sizeof *r->final)) return;
    for (int64_t i = 0; i < n; i++) r->final[r->nfinal++] = rl[i];
    r->plen_sum += plen * (double)n, r->plen_n += (double)n;
}

void ex_rollout_infer(ex_run *x, int node, int rank, int64_t start_ns, int64_t end_ns, int64_t tokens) {
    ex_rollout *r = ro_of(x);
    if (!r || start_ns <= 0 || end_ns <= start_ns || node < 0 || node >= EX_MAX_NODES) return;
    r->infer_s[node] += (double)(end_ns - start_ns) * 1e-9;
    r->infer_tok[node] += (double)tokens;
    if (grow((void **)&r->busy, &r->cap_busy, r->nbusy + 1, sizeof *r->busy)) return;
    r->busy[r->nbusy++] = (busy_rec){rank, start_ns, end_ns};
}

static double overlap_ns(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    int64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? (double)(hi - lo) : 0;
}

/* One observation per rl.generate job that ended by `cut_ns` (a migration's decision; INT64_MAX
 * without) on a worker none of whose jobs was moved away: its mean step time against the mean
 * batch and context of its worker over the job's time, into the normal equations. */
static void fold_steps(ex_rollout *r, int64_t cut_ns) {
    for (int64_t k = 0; k < r->ngen; k++) {
        const gen_rec *g = &r->gen[k];
        if (g->lmax < 1 || g->moved || g->end_ns > cut_ns) continue;
        bool source = false;
        for (int64_t o = 0; o < r->ngen && !source; o++) source = r->gen[o].moved && r->gen[o].rank == g->rank;
        if (source) continue;
        double D = (double)(g->end_ns - g->start_ns), busy = 0, bsum = 0, csum = 0;
        for (int64_t q = 0; q < r->nbusy; q++)
            if (r->busy[q].rank == g->rank) busy += overlap_ns(g->start_ns, g->end_ns, r->busy[q].start_ns, r->busy[q].end_ns);
        double Deff = D - busy;
        if (Deff <= 0.1 * D) continue;
        for (int64_t o = 0; o < r->ngen; o++) { /* the worker's samples alive during the job */
            const gen_rec *h = &r->gen[o];
            if (h->rank != g->rank || h->lmax < 1) continue;
            double Dh = (double)(h->end_ns - h->start_ns), rate = (double)h->lmax / Dh; /* tokens per ns */
            for (int64_t i = 0; i < h->n; i++) {
                double s0 = (double)h->start_ns, s1 = s0 + Dh * (double)r->lens[h->off + i] / (double)h->lmax;
                double lo = fmax(s0, (double)g->start_ns), hi = fmin(s1, (double)g->end_ns);
                if (hi <= lo) continue;
                bsum += hi - lo;
                /* context: prompt + tokens so far, linear in time */
                csum += h->plen * (hi - lo) + rate * ((hi - s0) * (hi - s0) - (lo - s0) * (lo - s0)) / 2;
            }
        }
        const double v[3] = {1.0, bsum / D, csum / D}, y = Deff * 1e-9 / (double)g->lmax, w = (double)g->lmax;
        for (int i = 0; i < 3; i++) {
            for (int j = 0; j < 3; j++) r->xtx[i][j] += w * v[i] * v[j];
            r->xty[i] += w * v[i] * y;
        }
        r->nobs++;
    }
}

/* Least squares over the first n of (1, batch, context) by elimination; 0 and out[0..n), or -1
 * when singular. */
static int solve(const ex_rollout *r, int n, const int *use, double *out) {
    double A[3][4];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) A[i][j] = r->xtx[use[i]][use[j]];
        A[i][n] = r->xty[use[i]];
    }
    for (int c = 0; c < n; c++) {
        int p = c;
        for (int i = c + 1; i < n; i++)
            if (fabs(A[i][c]) > fabs(A[p][c])) p = i;
        if (fabs(A[p][c]) < 1e-12 * (fabs(A[0][0]) + 1e-300)) return -1;
        for (int j = 0; j <= n; j++) {
            double t = A[c][j];
            A[c][j] = A[p][j], A[p][j] = t;
        }
        for (int i = 0; i < n; i++) {
            if (i == c) continue;
            double f = A[i][c] / A[c][c];
            for (int j = c; j <= n; j++) A[i][j] -= f * A[c][j];
        }
    }
    for (int i = 0; i < n; i++) out[i] = A[i][n] / A[i][i];
    return 0;
}

/* The step fit with non-negative terms: all three, else without the context, else the batch
 * alone through the origin, else a constant. */
static void fit(ex_rollout *r) {
    double s[3];
    r->a = r->b = r->c = 0;
    if (r->nobs >= 3 && solve(r, 3, (const int[]){0, 1, 2}, s) == 0 && s[0] >= 0 && s[1] >= 0 && s[2] >= 0) {
        r->a = s[0], r->b = s[1], r->c = s[2];
    } else if (r->nobs >= 2 && solve(r, 2, (const int[]){0, 1}, s) == 0 && s[0] >= 0 && s[1] >= 0) {
        r->a = s[0], r->b = s[1];
    } else if (r->nobs >= 2 && solve(r, 1, (const int[]){1}, s) == 0 && s[0] > 0) {
        r->b = s[0];
    } else if (r->xtx[0][0] > 0) {
        r->a = r->xty[0] / r->xtx[0][0];
    }
    r->infer_per_tok = 0;
    for (int k = 0; k < EX_MAX_NODES; k++)
        if (r->infer_tok[k] > 0) r->infer_per_tok += r->infer_s[k] / r->infer_tok[k];
    /* a migration's time: t = latency + per sample x n, least squares (a round trip and step
     * boundaries dominate; the bytes are small beside them) */
    const double *v = r->mv, det = v[0] * v[2] - v[1] * v[1];
    r->move_latency = r->move_per_sample = 0;
    if (v[0] > 0) {
        double per = det > 1e-12 * (v[0] * v[2] + 1e-300) ? (v[0] * v[4] - v[1] * v[3]) / det : 0;
        double lat = (v[3] - per * v[1]) / v[0];
        if (per < 0) per = 0, lat = v[3] / v[0];
        if (lat < 0) lat = 0, per = v[2] > 0 ? v[4] / v[2] : 0;
        r->move_latency = lat, r->move_per_sample = per;
    }
}

void ex_rollout_finish(ex_run *x, const ex_iter *I) {
    ex_rollout *r = x->ro;
    if (!r) return;
    fold_steps(r, I->mig_sources == 0 ? INT64_MAX : I->mig_t0_ns);
    if (I->mig_moved > 0 && I->mig_t1_ns > I->mig_t0_ns) {
        const double n = (double)I->mig_moved, t = (double)(I->mig_t1_ns - I->mig_t0_ns) * 1e-9;
        r->mv[0] += 1, r->mv[1] += n, r->mv[2] += n * n, r->mv[3] += t, r->mv[4] += n * t;
    }
    if (r->nfinal > 0) {
        int64_t *h = realloc(r->hist, (size_t)r->nfinal * sizeof *h);
        if (h) {
            r->hist = h, r->nhist = r->nfinal;
            for (int64_t i = 0; i < r->nfinal; i++) h[i] = r->final[i];
            r->hist_plen = r->plen_n > 0 ? r->plen_sum / r->plen_n : 1;
        }
    }
    fit(r);
    r->ngen = r->nlen = r->nfinal = r->nbusy = 0;
    r->plen_sum = r->plen_n = 0;
}

static double step_cb(void *ctx, int64_t batch, int64_t context) {
    const ex_rollout *r = ctx;
    return r->a + r->b * (double)batch + r->c * (double)context;
}
static double infer_cb(void *ctx, int64_t tokens) { return ((const ex_rollout *)ctx)->infer_per_tok * (double)tokens; }
static double move_cb(void *ctx, int64_t tokens) { return tokens ? ((const ex_rollout *)ctx)->move_per_sample : 0; }

int ex_rollout_plan_stage(ex_run *x, int workers, int64_t samples, int32_t max_len, double migrate, int64_t survivors,
                          ex_rollout_plan *p) {
    memset(p, 0, sizeof *p);
    ex_rollout *r = x->ro;
    if (!r || r->nhist < 1 || r->nobs < 1 || workers < 1 || samples < 1 || max_len < 1) return 0; /* nothing measured yet */
    if (!(step_cb(r, 1, 1) > 0)) return 0;
    int64_t *lens = ff_malloc((size_t)samples * sizeof *lens);
    if (!lens) return -1;
    for (int64_t i = 0; i < samples; i++) { /* the last iteration's lengths, cycled to this one's count */
        int64_t l = r->hist[i % r->nhist];
        lens[i] = l < 1 ? 1 : l > max_len ? max_len : l;
    }
    ff_plan_rollout_input in;
    ff_plan_rollout_input_defaults(&in);
    snprintf(in.cluster.name, sizeof in.cluster.name, "run");
    in.cluster.gpus = workers, in.cluster.domain = workers; /* one host: every move is the same link */
    in.gen_tp = 1;
    in.samples = samples;
    in.prompt_len = r->hist_plen >= 1 ? (int64_t)llround(r->hist_plen) : 1;
    in.max_len = max_len;
    in.lengths = lens;
    in.migrate = migrate;
    in.survivors = survivors < workers ? survivors : 0;
    in.step_s = step_cb, in.infer_gpu_s = infer_cb, in.move_s = move_cb, in.cost_ctx = r;
    in.move_latency_s = r->move_latency;
    ff_plan_rollout out;
    int rc = ff_plan_rollout_simulate(&in, &out);
    free(lens);
    if (rc != 0) return -1;
    p->valid = true;
    p->serial_s = out.serial_s;
    p->fused_s = out.overlap.total_s;
    /* auto migrates only for a simulated gain of at least 1% (the fit's own error is larger
     * than a rounding's win) */
    if (migrate < 0 && !(out.migrate.total_s < 0.99 * out.overlap.total_s)) out.migrate = out.overlap;
    p->rt = out.migrate.survivors ? out.migrate.rt : 0;
    p->survivors = (int)out.migrate.survivors;
    p->migrate_s = out.migrate.total_s;
    p->step_a = r->a, p->step_b = r->b, p->step_c = r->c, p->infer_per_tok = r->infer_per_tok;
    p->move_latency_s = r->move_latency, p->move_per_sample_s = r->move_per_sample;
    p->step_jobs = r->nobs;
    return 0;
}
