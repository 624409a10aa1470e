/* The fused schedule's solver (fuseflow/fuse.h ff_fuse_solve): makespan first, then peak
 * activation memory. Not here: the simulator and the bounds it stops at (fuse.c).
 *
 * Three search spaces, the simulator's times in all:
 * - Decoding: a point (per model and node a cap, per task a perturbation, a memory budget)
 *   becomes a schedule by list scheduling. The nodes run in simulated time; a node that falls
 *   free takes, of its tasks that can start, the one with the highest key: its tail (the least
 *   time from its end to the end of any schedule, fuse_heads_tails: the longest remaining path
 *   first, the rule behind the preemptive bound) plus the perturbation. A model's forwards on a
 *   node wait while its cap of micro-batches is in flight there (S - s everywhere: 1F1B's
 *   memory), or while the node's memory would pass the budget. Caps alone always decode to a
 *   valid schedule (a node never takes a task that cannot start, and each model's caps let it
 *   finish alone); a budget can leave every node waiting, and that point is worth nothing.
 * - Orders: the node lists themselves, a task moved a few places (RLHFuse's move); a move that
 *   deadlocks is undone.
 * - Windows: the makespan repair (fuse_lns.c), a window of the critical path re-decoded.
 * Fixed points first (caps at the fewest in flight the makespan bound allows, 1F1B's, looser,
 * none), then simulated annealing in each thread, cycles alternating between the two spaces
 * (until the makespan is at its bound, two cycles in three are the repair's, each from where the
 * last repair cycle ended when that ties the best makespan: a walk along its plateau),
 * in rounds of a fixed number of evaluations; after a round the threads compare. A thread whose
 * makespan has not improved for KICK_CYCLES decoding cycles starts its decoding afresh from a
 * random fixed point with random perturbations (the search has basins it does not leave by
 * small moves). Once the best makespan is the bound, all go on from it to lower the peak (the
 * memory phase: budgets under the best peak, orders weighing memory, and in a third of the turns
 * a capped search, the shortest makespan under a fixed memory target from 1F1B-like caps, and a
 * repair, orders against every node's excess over that target: begin_cycle, begin_capped);
 * with a makespan slack F also once MK_SHARE of the rounds or the time is spent,
 * and then the least peak within (1 + F) x the best makespan wins (better_under). They stop at
 * both bounds (the peak's at the cap), after STALE_ROUNDS rounds without a lower peak in the
 * memory phase, or when the search's share of the time (1 - POLISH_SHARE) is spent. Rounds of
 * fixed work make the result depend only on the seed and the thread count whenever it stops
 * before the time. The memory phase's search has 1 - WALK_SHARE of the time left when it starts;
 * then every thread walks from the best schedule (fuse_mem.c fuse_mem_walk: random moves of a task
 * or of a micro-batch's chain kept while the memory does not rise and the makespan stays under the
 * cap) until the peak bound, WALK_STALE simulations without a gain, or the search's old deadline
 * (with max_rounds: WALK_ROUND_TRIES x max_rounds simulations each). Then the memory descent on the
 * best schedule (fuse_mem.c: moves that lower a node's memory and raise it nowhere, kept while the
 * makespan stays under the cap; at most DESCEND_TRIES simulations). Last, what runs: the executor's streams (ff_fuse_to_pipe) block in their
 * transfers, which the fused simulator does not model, so the best schedule's tasks are moved a
 * little (polish) while the fused makespan and peak stay and the streams' simulated makespan does
 * not rise; that step has POLISH_SHARE of the time and at most POLISH_TRIES moves. */
#include "fuseflow/fuse.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataflow/fuse_internal.h"
#include "dataflow/fuse_lns.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

#define ROUND_DECODES 48      /* evaluations of a thread between two comparisons */
#define CYCLE_DECODES 1500    /* evaluations of one annealing cycle (hot to cold), then back to the thread's best */
#define STALE_ROUNDS 2000     /* rounds without a better peak at the bound before stopping */
#define MEM_WEIGHT 0.002      /* energy = makespan / LB + MEM_WEIGHT x peak / its bound */
#define MEM_WEIGHT_AT_BOUND 0.05 /* the order search's in the memory phase, on (peak + MEAN_WEIGHT x mean node peak) / its bound */
#define MEAN_WEIGHT 0.1       /* the mean node peak smooths the plateaus of the max */
#define OVER_CAP 0.05         /* with a slack, in the memory phase: the energy of a makespan over the cap (5 x the hottest temperature) */
#define OVER_SLOPE 2.0        /* and more per (makespan over the cap) / the bound: a way back under it */
#define MK_SHARE 0.5          /* with a slack: the makespan search's share of the rounds or the time, unless at the bound sooner */
#define KICK_CYCLES 3         /* decoding cycles without a shorter makespan before a thread starts afresh */
#define POLISH_TRIES 1000      /* order moves tried on the executor's streams after the search */
#define POLISH_SHARE 0.15     /* of the time budget kept for them */
#define CAP_START 1.3         /* the capped search's first memory target: this x the peak bound at the cap */
#define CAP_EXTRA 2           /* and its first caps: 1F1B's S - s plus this (the budget holds the memory) */
#define OVER_NODES 1.0        /* its energy adds this x the mean over the nodes of (end - bound)+ / bound */
#define CAP_PATIENCE 3        /* capped cycles without a shorter makespan under the target before it rises */
#define REPAIR_WEIGHT 0.2     /* the repair's energy: makespan / LB + this x the nodes' summed excess over its target / the peak bound */
#define REPAIR_STEP 0.5       /* its target: the capped target, at most the best peak less this x the least activation */
#define DESCEND_TRIES 4000    /* simulations of the memory descent after the search (fuse_mem.c) */
#define WALK_SHARE 0.8        /* of the time left when the memory phase starts: the memory walk's (fuse_mem.c), after the search
                               * (on bench_fuse's 8-node 32-micro-batch instances 0.8 beat 0.5 on 5 of 8 and 1.0 on 4) */
#define WALK_ROUND_TRIES 24   /* with max_rounds: the walk's simulations per thread per round of the budget */

typedef struct problem {
    const ff_fuse_instance *in;
    int32_t on[FF_FUSE_MAX_NODES][FF_FUSE_MAX_MODELS]; /* models with a stage on each node */
    int32_t non[FF_FUSE_MAX_NODES];
    double *qf, *qb;        /* [items] tails (fuse_ctx offsets) */
    double lb, peak_lb;     /* makespan bound; peak bound at it */
    double scale;           /* typical task time: the perturbations' unit */
    int32_t least[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]; /* the fewest in flight at the makespan bound */
    int64_t items;
} problem;

typedef struct point {
    int32_t cap[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES];
    double budget;          /* a node starts no forward that would take its memory above this */
    double *nf, *nb;        /* [items] perturbations of the keys */
} point;

typedef struct decoder {
    fuse_ctx ctx;
    double tn[FF_FUSE_MAX_NODES];   /* when the node can start its choice (INFINITY: none) */
    int8_t ch_model[FF_FUSE_MAX_NODES], ch_back[FF_FUSE_MAX_NODES];
    double ch_ready[FF_FUSE_MAX_NODES];
    int32_t fc[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES], bc[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES];
    double free_at[FF_FUSE_MAX_NODES], mem[FF_FUSE_MAX_NODES], peak[FF_FUSE_MAX_NODES];
    int32_t in_flight[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]; /* the most micro-batches of a model in flight on a node */
} decoder;

static bool better(double mk, double pk, double bmk, double bpk) {
    if (!isfinite(bmk)) return isfinite(mk);
    double tol = 1e-9 * fmax(bmk, 1);
    if (mk < bmk - tol) return true;
    if (mk > bmk + tol) return false;
    return pk < bpk - 1e-9 * fmax(bpk, 1);
}

/* In the memory phase, of two schedules within the makespan cap the lower peak is better, and one
 * within it beats one over it; over it (and with no cap: INFINITY) makespan first. */
static bool better_under(double cap, double mk, double pk, double bmk, double bpk) {
    if (isfinite(cap) && isfinite(bmk) && (mk <= cap) != (bmk <= cap)) return mk <= cap;
    if (isfinite(cap) && mk <= cap && bmk <= cap) {
        if (pk < bpk - 1e-9 * fmax(bpk, 1)) return true;
        if (pk > bpk + 1e-9 * fmax(bpk, 1)) return false;
        return mk < bmk - 1e-9 * fmax(bmk, 1);
    }
    return better(mk, pk, bmk, bpk);
}

static bool at_bound(const problem *p, double mk) { return mk <= p->lb * (1 + 1e-9) + 1e-12; }

/* Node n's next task: among the forward (if under its cap) and the backward of each model
 * that can start, the highest key among those ready when the node could start the first. */
static void choose(const problem *p, const point *x, decoder *d, int32_t n) {
    const ff_fuse_instance *in = p->in;
    const fuse_ctx *c = &d->ctx;
    double rel[2 * FF_FUSE_MAX_MODELS], key[2 * FF_FUSE_MAX_MODELS], first = INFINITY;
    int nc = 0;
    int8_t cm[2 * FF_FUSE_MAX_MODELS], cb[2 * FF_FUSE_MAX_MODELS];
    for (int a = 0; a < p->non[n]; a++) {
        int i = p->on[n][a];
        const ff_fuse_model *m = &in->models[i];
        int32_t st = c->stage_of[i][n], f = d->fc[i][n], b = d->bc[i][n];
        int64_t base = c->off[i];
        if (f < m->micro && f - b < x->cap[i][n] && d->mem[n] + m->act <= x->budget * (1 + 1e-12)) {
            double r = st == 0 ? 0 : c->f_end[base + (int64_t)(st - 1) * m->micro + f];
            if (r >= 0) {
                if (st > 0) r += in->hop_latency;
                int64_t it = base + (int64_t)st * m->micro + f;
                rel[nc] = r, key[nc] = p->qf[it] + x->nf[it], cm[nc] = (int8_t)i, cb[nc++] = 0;
            }
        }
        if (b < f) {
            double r = st == m->n_stages - 1 ? c->f_end[base + (int64_t)st * m->micro + b] : c->b_end[base + (int64_t)(st + 1) * m->micro + b];
            if (r >= 0) {
                if (st < m->n_stages - 1) r += in->hop_latency;
                int64_t it = base + (int64_t)st * m->micro + b;
                rel[nc] = r, key[nc] = p->qb[it] + x->nb[it], cm[nc] = (int8_t)i, cb[nc++] = 1;
            }
        }
    }
    for (int j = 0; j < nc; j++) first = fmin(first, rel[j]);
    d->tn[n] = INFINITY;
    if (!nc) return;
    double t = fmax(first, d->free_at[n]);
    int best = -1;
    for (int j = 0; j < nc; j++)
        if (rel[j] <= t && (best < 0 || key[j] > key[best] || (key[j] == key[best] && cb[j] > cb[best]))) best = j;
    d->tn[n] = t;
    d->ch_model[n] = cm[best];
    d->ch_back[n] = cb[best];
    d->ch_ready[n] = rel[best];
}

/* Decode x into out (its lists rewritten; room for every task already there). 0, or 1 when the
 * nodes are left with nothing they may start (a memory budget too tight: every node full of
 * forwards whose backwards wait for forwards on full nodes; caps alone cannot do this). */
static int decode(const problem *p, const point *x, decoder *d, ff_fuse_schedule *out, double *mk, double *pk) {
    const ff_fuse_instance *in = p->in;
    fuse_ctx *c = &d->ctx;
    for (int64_t i = 0; i < p->items; i++) c->f_end[i] = c->b_end[i] = -1;
    memset(d->fc, 0, sizeof d->fc);
    memset(d->bc, 0, sizeof d->bc);
    memset(d->in_flight, 0, sizeof d->in_flight);
    int64_t total = 0;
    for (int32_t n = 0; n < in->nodes; n++) {
        d->free_at[n] = d->mem[n] = d->peak[n] = 0;
        out->n_tasks[n] = 0;
        total += c->tasks[n];
    }
    for (int32_t n = 0; n < in->nodes; n++) choose(p, x, d, n);
    double peak = 0;
    for (int64_t step = 0; step < total; step++) {
        int32_t n = -1;
        for (int32_t q = 0; q < in->nodes; q++)
            if (d->tn[q] < INFINITY && (n < 0 || d->tn[q] < d->tn[n])) n = q;
        if (n < 0) return 1;
        int i = d->ch_model[n];
        const ff_fuse_model *m = &in->models[i];
        int32_t st = c->stage_of[i][n], next = -1;
        double t0 = fmax(d->free_at[n], d->ch_ready[n]);
        if (!d->ch_back[n]) {
            int32_t k = d->fc[i][n]++;
            d->free_at[n] = t0 + m->fwd;
            c->f_end[c->off[i] + (int64_t)st * m->micro + k] = d->free_at[n];
            d->mem[n] += m->act;
            d->peak[n] = fmax(d->peak[n], d->mem[n]);
            peak = fmax(peak, d->mem[n]);
            if (d->fc[i][n] - d->bc[i][n] > d->in_flight[i][n]) d->in_flight[i][n] = d->fc[i][n] - d->bc[i][n];
            if (st + 1 < m->n_stages) next = m->stages[st + 1];
        } else {
            int32_t k = d->bc[i][n]++;
            d->free_at[n] = t0 + m->bwd;
            c->b_end[c->off[i] + (int64_t)st * m->micro + k] = d->free_at[n];
            d->mem[n] -= m->act;
            if (st > 0) next = m->stages[st - 1];
        }
        out->tasks[n][out->n_tasks[n]++] = (ff_fuse_task){.model = (uint8_t)i, .backward = (uint8_t)d->ch_back[n]};
        choose(p, x, d, n);
        if (next >= 0) choose(p, x, d, next);
    }
    double end = 0;
    for (int32_t n = 0; n < in->nodes; n++) end = fmax(end, d->free_at[n]);
    *mk = end;
    *pk = peak;
    return 0;
}

/* ---- one thread's search ---------------------------------------------------------------- */

typedef struct shared shared;

typedef struct worker {
    const problem *p;
    shared *sh;
    int id;
    ff_rng rng;
    decoder d;
    point cur, best_pt;        /* the decoding search's point and its best */
    point anchor;              /* where decoding cycles start: the best since the last fresh start */
    point cap_pt;              /* the capped search's best point under its target (its budget: the target) */
    double cap_pt_mk, cap_pt_pk;
    double cap_target;         /* the capped search's memory target P (0: not begun) */
    int cap_stuck;             /* capped cycles since its makespan last improved */
    double cap_last_mk;
    double rep_target;         /* the repair cycle's memory target */
    double an_mk, an_pk, last_mk;
    int stuck;                 /* decoding cycles since the thread's makespan last improved */
    double pt_mk, pt_pk;
    ff_fuse_schedule sched;    /* what the last decode wrote */
    ff_fuse_schedule osched;   /* the order search's schedule */
    double onode_peak[FF_FUSE_MAX_NODES];
    ff_fuse_schedule best_sched; /* the thread's best of either search */
    double best_mk, best_pk;
    double cur_e;
    int mode;                  /* this cycle: 0 decoding, 1 orders; in the memory phase also 2 capped decoding, 3 repair (orders); before it 4, the makespan repair (fuse_lns.c) */
    int64_t decodes, in_cycle, cycles;
    bool restart;              /* start a cycle from the best at the next round */
    double mem_step;           /* a budget cycle aims this fraction of the way from the best peak to its bound */
    double budget_from;        /* the best peak when the budget cycle now running began (0: none) */
    int failed;
    uint64_t seed;             /* the solve's seed: the walk's and the polish's streams come from it */
    double streams_mk;         /* after polish: the streams' makespan of best_sched */
    fuse_lns *lns;             /* mode 4: the makespan repair (fuse_lns.c) */
    ff_fuse_schedule plateau;  /* where the last repair cycle ended, when that tied the best makespan: the next starts
                                * there (a cycle from the best schedule itself anneals back into the same basin; on
                                * bench_fuse's 16 nodes PP8 x 2 8 micro-batches 2:2 the bound took 0.2-14 s that way,
                                * 0.5-3 s from the plateau: docs/pipeline.md "The makespan repair") */
    bool have_plateau;         /* false until such a cycle, and again when the best makespan falls */
} worker;

struct shared {
    pthread_mutex_t gate;      /* threads start together, or leave when one could not start */
    pthread_cond_t open;
    int go;                    /* 0: wait, 1: run, -1: leave */
    pthread_barrier_t barrier;
    int64_t deadline_ns;
    int64_t rounds, max_rounds; /* done so far; the budget (0: none) */
    bool stop;
    bool memory_phase;         /* the best makespan is at its bound (or, with a slack, its search's share is
                                * spent): lower the memory under cap_mk */
    double slack;              /* ff_fuse_solve_opts.makespan_slack */
    double cap_exact;          /* the memory phase's makespan cap: (1 + slack) x the best makespan then (the bound at slack 0) */
    double cap_mk;             /* cap_exact and a rounding tolerance, what comparisons use (INFINITY before the phase) */
    double cap_peak_lb;        /* the peak bound at cap_mk: the memory phase stops there */
    int64_t switch_ns;         /* with a slack: the memory phase starts by this time at the latest */
    int64_t walk_deadline_ns;  /* the memory walk's end (the search's deadline before the memory phase took WALK_SHARE of what was left) */
    int stale;
    double round_mk, round_pk; /* the best over all threads after the last round */
    worker *w;
    int n;
};

static int point_init(point *x, int64_t items) {
    x->nf = ff_calloc((size_t)items, sizeof *x->nf);
    x->nb = ff_calloc((size_t)items, sizeof *x->nb);
    return x->nf && x->nb ? 0 : -1;
}

static void point_free(point *x) {
    free(x->nf);
    free(x->nb);
    x->nf = x->nb = NULL;
}

static void point_copy(point *dst, const point *src, int64_t items) {
    memcpy(dst->cap, src->cap, sizeof dst->cap);
    dst->budget = src->budget;
    memcpy(dst->nf, src->nf, (size_t)items * sizeof *dst->nf);
    memcpy(dst->nb, src->nb, (size_t)items * sizeof *dst->nb);
}

/* caps: the fewest in flight at the bound (least) or S - s, + extra, at least 1, at most m;
 * extra < 0: m; no perturbation */
static void point_plain(const problem *p, point *x, int extra, bool least) {
    const ff_fuse_instance *in = p->in;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        for (int32_t s = 0; s < m->n_stages; s++) {
            int64_t c = extra < 0 ? m->micro : (least ? p->least[i][m->stages[s]] : (int64_t)m->n_stages - s) + extra;
            x->cap[i][m->stages[s]] = (int32_t)(c < 1 ? 1 : c > m->micro ? m->micro : c);
        }
    }
    x->budget = INFINITY;
    memset(x->nf, 0, (size_t)p->items * sizeof *x->nf);
    memset(x->nb, 0, (size_t)p->items * sizeof *x->nb);
}

/* Before the memory phase, memory only breaks ties. In it, a makespan under the cap costs
 * nothing; the decoding search looks for the cap under a memory budget below the best peak
 * (begin_cycle), and the order search weighs the memory more, with the mean node peak to smooth
 * the plateaus of the max. At slack 0 the cap is the bound and a makespan over it costs what it
 * is over (the makespan-first energy); with a slack the cap is a wall (a step,
 * then a slope back), and both searches weigh the memory so: on A of bench_fuse's family (8
 * nodes, 32 micro-batches, 5:2) at slack 0.02 it found peak 19.6 where the soft cap found 22.4. */
static double energy(const worker *w, double mk, double pk, const double *node_peak) {
    const problem *p = w->p;
    const shared *sh = w->sh;
    if (!sh->memory_phase) return mk / p->lb + MEM_WEIGHT * pk / p->peak_lb;
    if (w->mode == 2) return mk / p->lb + MEM_WEIGHT * pk / sh->cap_peak_lb; /* the budget holds the memory */
    if (w->mode == 3) { /* repair: every node's excess over the target, not only the max's */
        double ex = 0;
        for (int32_t n = 0; n < p->in->nodes; n++) ex += fmax(0, node_peak[n] - w->rep_target);
        return mk / p->lb + REPAIR_WEIGHT * ex / sh->cap_peak_lb;
    }
    double over = sh->slack == 0 ? mk / p->lb /* the same energy bit for bit as before the slack existed */
                  : mk > sh->cap_exact ? OVER_CAP + OVER_SLOPE * (mk - sh->cap_exact) / p->lb : 0;
    if (w->mode == 0 && sh->slack == 0) return over + MEM_WEIGHT * pk / sh->cap_peak_lb;
    double mean = 0;
    for (int32_t n = 0; n < p->in->nodes; n++) mean += node_peak[n];
    mean /= p->in->nodes;
    return over + MEM_WEIGHT_AT_BOUND * (pk + MEAN_WEIGHT * mean) / sh->cap_peak_lb;
}

/* Caps down to what the decoded schedule used: it decodes to the same schedule (a cap that
 * never bound changes no choice), and a cap move of -1 then always bites. */
static void tighten(worker *w, point *x) {
    const ff_fuse_instance *in = w->p->in;
    for (int i = 0; i < in->n_models; i++)
        for (int32_t s = 0; s < in->models[i].n_stages; s++) {
            int32_t n = in->models[i].stages[s];
            if (w->d.in_flight[i][n] < x->cap[i][n]) x->cap[i][n] = w->d.in_flight[i][n];
        }
}

static void copy_lists(ff_fuse_schedule *dst, const ff_fuse_schedule *src) {
    for (int32_t n = 0; n < src->nodes; n++) {
        memcpy(dst->tasks[n], src->tasks[n], (size_t)src->n_tasks[n] * sizeof **src->tasks);
        dst->n_tasks[n] = src->n_tasks[n];
    }
}

static void keep_if_best(worker *w, const ff_fuse_schedule *s, double mk, double pk) {
    if (!better_under(w->sh->cap_mk, mk, pk, w->best_mk, w->best_pk)) return;
    if (mk < w->best_mk * (1 - 1e-9)) w->have_plateau = false; /* a shorter one: the repair starts from it */
    w->best_mk = mk;
    w->best_pk = pk;
    copy_lists(&w->best_sched, s);
}

/* Decode x; keep it as the thread's best point and schedule when it is. */
static int try_point(worker *w, const point *x, double *e) {
    double mk, pk;
    w->decodes++;
    if (decode(w->p, x, &w->d, &w->sched, &mk, &pk)) { /* over the budget: no schedule */
        *e = INFINITY;
        return 0;
    }
    *e = energy(w, mk, pk, w->d.peak);
    if (w->mode == 2) { /* the makespan is a max, flat under most moves: also how far each node ends past the bound */
        double over = 0;
        for (int32_t n = 0; n < w->p->in->nodes; n++) over += fmax(0, w->d.free_at[n] - w->p->lb);
        *e += OVER_NODES * over / (w->p->lb * w->p->in->nodes);
    }
    if (w->mode == 2 && better(mk, pk, w->cap_pt_mk, w->cap_pt_pk)) {
        w->cap_pt_mk = mk;
        w->cap_pt_pk = pk;
        point_copy(&w->cap_pt, x, w->p->items);
    }
    if (better_under(w->sh->cap_mk, mk, pk, w->an_mk, w->an_pk)) {
        w->an_mk = mk;
        w->an_pk = pk;
        point_copy(&w->anchor, x, w->p->items);
    }
    if (better_under(w->sh->cap_mk, mk, pk, w->pt_mk, w->pt_pk)) {
        w->pt_mk = mk;
        w->pt_pk = pk;
        point_copy(&w->best_pt, x, w->p->items);
    }
    keep_if_best(w, &w->sched, mk, pk);
    return 0;
}

/* The least activation of a model (1 if none has any): the memory phase's step. */
static double mem_unit(const problem *p) {
    double unit = INFINITY;
    for (int i = 0; i < p->in->n_models; i++)
        if (p->in->models[i].act > 0) unit = fmin(unit, p->in->models[i].act);
    return isfinite(unit) ? unit : 1;
}

/* A capped cycle (the memory phase): the shortest makespan under a fixed memory budget, the
 * target, from the capped search's best point under it. The high-memory points the makespan
 * search ends at do not come down by budgets just under their peak (the decoder then waits where
 * it ran ahead), so this search starts low: 1F1B's caps plus CAP_EXTRA, under a target of
 * CAP_START x the peak bound (or just under the best peak, if lower), and raises caps and
 * redraws perturbations to shorten it. Where it reaches the cap (the bound at slack 0) it is the
 * thread's best (try_point: a lower peak) and the target drops to just under that peak; after
 * CAP_PATIENCE cycles without a shorter makespan the target rises halfway to the best peak, or,
 * there already, it starts afresh from random caps and perturbations. */
static int begin_capped(worker *w) {
    const problem *p = w->p;
    double unit = mem_unit(p);
    double goal = w->best_pk - 0.5 * unit, target = w->cap_target;
    if (target > 0) {
        w->cap_stuck = w->cap_pt_mk < w->cap_last_mk * (1 - 1e-9) ? 0 : w->cap_stuck + 1;
        w->cap_last_mk = w->cap_pt_mk;
    }
    bool fresh = target == 0;
    if (fresh) {
        target = fmin(goal, CAP_START * w->sh->cap_peak_lb);
    } else if (w->cap_stuck >= CAP_PATIENCE) {
        if (target < goal * (1 - 1e-9)) target = 0.5 * (target + goal);
        else fresh = true;
    }
    if (target > goal) target = goal;
    if (fresh) {
        static const int extras[] = {0, 1, 2, 4, -1};
        point_plain(p, &w->cap_pt, w->cap_target > 0 ? extras[ff_rng_below(&w->rng, 5)] : CAP_EXTRA, false);
        if (w->cap_target > 0)
            for (int64_t it = 0; it < p->items; it++) {
                w->cap_pt.nf[it] = 2 * p->scale * ff_rng_normal(&w->rng);
                w->cap_pt.nb[it] = 2 * p->scale * ff_rng_normal(&w->rng);
            }
    }
    if (fresh || target != w->cap_target) {
        w->cap_target = target;
        w->cap_pt.budget = target;
        w->cap_pt_mk = w->cap_pt_pk = w->cap_last_mk = INFINITY;
        w->cap_stuck = 0;
    }
    point_copy(&w->cur, &w->cap_pt, p->items);
    return try_point(w, &w->cur, &w->cur_e);
}

/* A cycle starts from the thread's best: its best point (decoding) or best schedule (orders),
 * the two in turn, threads out of step. In the memory phase two more in the turn: a capped cycle
 * (begin_capped) and a repair, the order search from the best schedule under an energy that
 * counts every node's peak over a target a little under the best peak (the max alone has
 * plateaus: on the lead's 8-node instance at its bound 261 most nodes sit near the peak). */
static int begin_cycle(worker *w) {
    if (w->mode == 4 && w->in_cycle > 0 && !w->sh->memory_phase) {
        fuse_score pr;
        w->decodes++;
        if (!fuse_run(&w->d.ctx, &w->osched, &pr, NULL, NULL) && pr.makespan <= w->best_mk * (1 + 1e-9)) {
            copy_lists(&w->plateau, &w->osched);
            w->have_plateau = true;
        }
    }
    w->in_cycle = 0;
    if (w->budget_from > 0) { /* a budget cycle ended: bolder after a success, humbler after none */
        w->mem_step = w->best_pk < w->budget_from ? fmin(0.5, 1.5 * w->mem_step) : 0.5 * w->mem_step;
        w->budget_from = 0;
    }
    int64_t turn = w->cycles++ + w->id;
    w->mode = (int)(turn % 2);
    if (!w->sh->memory_phase && turn % 3 != 2) w->mode = 4; /* two cycles in three: the makespan repair, on the best schedule */
    if (w->sh->memory_phase && turn % 6 >= 4) w->mode = 2 + (int)(turn % 2); /* a third of the turns */
    if (w->mode == 3 && w->cap_target == 0) w->mode = 2; /* the capped search sets the target first */
    if (w->mode == 3) w->rep_target = fmin(w->cap_target, w->best_pk - REPAIR_STEP * mem_unit(w->p));
    if (w->mode == 2) return begin_capped(w);
    if (w->mode == 0 && !w->sh->memory_phase) { /* stuck in one basin: start afresh elsewhere */
        w->stuck = w->best_mk < w->last_mk * (1 - 1e-9) ? 0 : w->stuck + 1;
        w->last_mk = w->best_mk;
        if (w->stuck >= KICK_CYCLES) {
            static const int extras[] = {0, 1, 2, 4, -1};
            point_plain(w->p, &w->anchor, extras[ff_rng_below(&w->rng, 5)], ff_rng_below(&w->rng, 2) != 0);
            for (int64_t it = 0; it < w->p->items; it++) {
                w->anchor.nf[it] = 2 * w->p->scale * ff_rng_normal(&w->rng);
                w->anchor.nb[it] = 2 * w->p->scale * ff_rng_normal(&w->rng);
            }
            w->an_mk = w->an_pk = INFINITY;
            w->stuck = 0;
        }
    }
    if (w->mode == 0) {
        point_copy(&w->cur, w->sh->memory_phase ? &w->best_pt : &w->anchor, w->p->items);
        if (w->sh->memory_phase) { /* the bound under less memory than the best has */
            double unit = INFINITY;
            for (int i = 0; i < w->p->in->n_models; i++)
                if (w->p->in->models[i].act > 0) unit = fmin(unit, w->p->in->models[i].act);
            if (isfinite(unit)) {
                w->cur.budget = w->best_pk - fmax(0.5 * unit, w->mem_step * fmax(0, w->best_pk - w->sh->cap_peak_lb));
                w->budget_from = w->best_pk;
            }
        }
        return try_point(w, &w->cur, &w->cur_e);
    }
    copy_lists(&w->osched, w->mode == 4 && w->have_plateau ? &w->plateau : &w->best_sched);
    fuse_score r;
    if (fuse_run(&w->d.ctx, &w->osched, &r, NULL, NULL)) return ff_error_set("fuse solver", "this is a bug", "the best schedule deadlocks");
    w->decodes++;
    memcpy(w->onode_peak, r.node_peak, sizeof w->onode_peak);
    w->cur_e = energy(w, r.makespan, r.peak, r.node_peak);
    return 0;
}

/* Decoding: change a cap by one (at the bound, half the time: lower one on the node with the
 * highest peak), or redraw the perturbations of a few consecutive micro-batches of one stage;
 * kept by Metropolis at temperature temp. */
static int step_decode(worker *w, double temp) {
    const problem *p = w->p;
    const ff_fuse_instance *in = p->in;
    point *x = &w->cur;
    int i = (int)ff_rng_below(&w->rng, (uint64_t)in->n_models);
    int32_t s = (int32_t)ff_rng_below(&w->rng, (uint64_t)in->models[i].n_stages), node = in->models[i].stages[s];
    int32_t dir = ff_rng_below(&w->rng, 2) ? 1 : -1, k0 = 0, len = 0;
    bool cap_move = ff_rng_below(&w->rng, 3) == 0, back = false;
    if (w->sh->memory_phase && w->mode == 0 && ff_rng_below(&w->rng, 2)) {
        node = 0;
        for (int32_t n = 1; n < in->nodes; n++)
            if (w->d.peak[n] > w->d.peak[node]) node = n;
        i = p->on[node][ff_rng_below(&w->rng, (uint64_t)p->non[node])];
        s = w->d.ctx.stage_of[i][node];
        cap_move = true, dir = -1;
    }
    const ff_fuse_model *m = &in->models[i];
    double saved[8];
    int32_t old_cap = x->cap[i][node];
    if (cap_move) {
        int32_t c = old_cap + dir;
        if (c < 1 || c > m->micro) return 0;
        x->cap[i][node] = c;
    } else {
        back = ff_rng_below(&w->rng, 2);
        len = 1 + (int32_t)ff_rng_below(&w->rng, 4);
        k0 = (int32_t)ff_rng_below(&w->rng, (uint64_t)m->micro);
        if (k0 + len > m->micro) len = m->micro - k0;
        double *v = (back ? x->nb : x->nf) + w->d.ctx.off[i] + (int64_t)s * m->micro;
        double sigma = p->scale * (ff_rng_below(&w->rng, 2) ? 0.5 : 3.0);
        for (int32_t k = 0; k < len; k++) {
            saved[k] = v[k0 + k];
            v[k0 + k] = sigma * ff_rng_normal(&w->rng);
        }
    }
    double e;
    if (try_point(w, x, &e)) return -1;
    if (e <= w->cur_e || ff_rng_uniform(&w->rng) < exp((w->cur_e - e) / temp)) {
        w->cur_e = e;
        if (isfinite(e)) tighten(w, x);
        return 0;
    }
    if (len) { /* undo */
        double *v = (back ? x->nb : x->nf) + w->d.ctx.off[i] + (int64_t)s * m->micro;
        for (int32_t k = 0; k < len; k++) v[k0 + k] = saved[k];
    } else {
        x->cap[i][node] = old_cap;
    }
    return 0;
}

static void move_task(ff_fuse_task *t, int64_t from, int64_t to) {
    ff_fuse_task x = t[from];
    if (from < to) memmove(t + from, t + from + 1, (size_t)(to - from) * sizeof *t);
    else memmove(t + to + 1, t + to, (size_t)(from - to) * sizeof *t);
    t[to] = x;
}

/* Orders (RLHFuse's move, the simulator as the judge): one task of a node moved up to 8 places
 * earlier or later (at the bound, half the time on the node with the highest peak: the forward
 * that first reaches it moved later, or one of the next backwards moved before it); a move
 * that deadlocks is undone. */
static int step_order(worker *w, double temp) {
    const ff_fuse_instance *in = w->p->in;
    ff_fuse_schedule *s = &w->osched;
    int32_t n = (int32_t)ff_rng_below(&w->rng, (uint64_t)in->nodes);
    bool at_peak = w->sh->memory_phase && ff_rng_below(&w->rng, 2);
    if (at_peak) {
        n = 0;
        for (int32_t q = 1; q < in->nodes; q++)
            if (w->onode_peak[q] > w->onode_peak[n]) n = q;
    }
    int64_t len = s->n_tasks[n];
    if (len < 2) return 0;
    int64_t from = (int64_t)ff_rng_below(&w->rng, (uint64_t)len), d = 1 + (int64_t)ff_rng_below(&w->rng, 8);
    int64_t to = ff_rng_below(&w->rng, 2) ? from + d : from - d;
    if (at_peak) { /* the forward that first reaches the node's peak later, or a backward after it earlier */
        double mem = 0;
        int64_t p = 0;
        for (; p < len; p++) {
            ff_fuse_task t = s->tasks[n][p];
            mem += t.backward ? -in->models[t.model].act : in->models[t.model].act;
            if (!t.backward && mem >= w->onode_peak[n] * (1 - 1e-12)) break;
        }
        if (p == len) return 0;
        if (ff_rng_below(&w->rng, 2)) {
            from = p, to = p + d;
        } else {
            int64_t q = p + 1;
            for (int64_t skip = (int64_t)ff_rng_below(&w->rng, 3); q < len; q++)
                if (s->tasks[n][q].backward && skip-- == 0) break;
            if (q >= len) return 0;
            from = q, to = p;
        }
    }
    if (to < 0) to = 0;
    if (to >= len) to = len - 1;
    if (to == from) return 0;
    move_task(s->tasks[n], from, to);
    fuse_score r;
    w->decodes++;
    if (!fuse_run(&w->d.ctx, s, &r, NULL, NULL)) {
        double e = energy(w, r.makespan, r.peak, r.node_peak);
        if (e <= w->cur_e || ff_rng_uniform(&w->rng) < exp((w->cur_e - e) / temp)) {
            w->cur_e = e;
            memcpy(w->onode_peak, r.node_peak, sizeof w->onode_peak);
            keep_if_best(w, s, r.makespan, r.peak);
            return 0;
        }
    }
    move_task(s->tasks[n], to, from);
    return 0;
}

/* The makespan repair (fuse_lns.c): a window of the best schedule's critical path re-decoded. */
static int step_lns(worker *w, double temp) {
    double mk, pk;
    w->decodes++;
    int rc = fuse_lns_step(w->lns, &w->osched, &w->rng, temp, &mk, &pk);
    if (rc > 0) keep_if_best(w, &w->osched, mk, pk);
    return rc < 0 ? -1 : 0;
}

static int anneal_round(worker *w) {
    if (w->restart && begin_cycle(w)) return -1;
    w->restart = false;
    for (int r = 0; r < ROUND_DECODES; r++) {
        if (w->in_cycle == CYCLE_DECODES && begin_cycle(w)) return -1; /* back to the best, hot again */
        double f = (double)w->in_cycle++ / CYCLE_DECODES, temp = 0.01 * pow(1e-3, f);
        if ((w->mode == 4 ? step_lns : w->mode == 1 || w->mode == 3 ? step_order : step_decode)(w, temp)) return -1;
    }
    return 0;
}

/* The thread whose best is best (makespan first, then the peak under the memory phase's cap). */
static int best_worker(const shared *sh, const worker *w, int threads) {
    int bi = 0;
    for (int t = 1; t < threads; t++)
        if (better_under(sh->cap_mk, w[t].best_mk, w[t].best_pk, w[bi].best_mk, w[bi].best_pk)) bi = t;
    return bi;
}

/* Between rounds, in one thread: the best so far. When its makespan first reaches the bound
 * (with a slack: or the makespan search's share of the rounds or the time is spent), the memory
 * phase: the cap is (1 + slack) x that makespan and every thread goes on from the best to lower
 * the memory under it. Stop at the cap's peak bound, when the memory has not improved for
 * STALE_ROUNDS rounds, or at the deadline. */
static void round_end(shared *sh) {
    const problem *p = sh->w[0].p;
    int bi = best_worker(sh, sh->w, sh->n);
    double mk = sh->w[bi].best_mk, pk = sh->w[bi].best_pk;
    sh->rounds++;
    bool share_spent = sh->slack > 0 && (sh->max_rounds > 0 ? sh->rounds >= (int64_t)(MK_SHARE * (double)sh->max_rounds) : ff_now_ns() >= sh->switch_ns);
    if (!sh->memory_phase && (at_bound(p, mk) || share_spent)) {
        sh->memory_phase = true;
        sh->cap_exact = at_bound(p, mk) && sh->slack == 0 ? p->lb : mk * (1 + sh->slack);
        sh->cap_mk = sh->cap_exact * (1 + 1e-9) + 1e-12;
        sh->cap_peak_lb = ff_fuse_peak_bound(p->in, sh->cap_exact);
        int64_t now = ff_now_ns();
        sh->walk_deadline_ns = sh->deadline_ns;
        if (now < sh->deadline_ns) sh->deadline_ns = now + (int64_t)((1 - WALK_SHARE) * (double)(sh->deadline_ns - now));
        for (int t = 0; t < sh->n; t++) {
            worker *w = &sh->w[t];
            if (t != bi) {
                point_copy(&w->best_pt, &sh->w[bi].best_pt, p->items);
                w->pt_mk = sh->w[bi].pt_mk, w->pt_pk = sh->w[bi].pt_pk;
                w->best_mk = mk, w->best_pk = pk;
                copy_lists(&w->best_sched, &sh->w[bi].best_sched);
            }
            w->restart = true;
        }
        sh->round_mk = sh->round_pk = INFINITY;
    }
    if (sh->memory_phase) {
        sh->stale = better_under(sh->cap_mk, mk, pk, sh->round_mk, sh->round_pk) ? 0 : sh->stale + 1;
        if ((mk <= sh->cap_mk && pk <= sh->cap_peak_lb * (1 + 1e-9)) || sh->stale >= STALE_ROUNDS) sh->stop = true;
    }
    sh->round_mk = mk;
    sh->round_pk = pk;
    for (int t = 0; t < sh->n; t++) sh->stop |= sh->w[t].failed != 0;
    if (ff_now_ns() >= sh->deadline_ns) sh->stop = true;
    if (sh->max_rounds > 0 && sh->rounds >= sh->max_rounds) sh->stop = true;
}

static void *thread_main(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    if (w->id) {
        pthread_mutex_lock(&sh->gate);
        while (!sh->go) pthread_cond_wait(&sh->open, &sh->gate);
        int go = sh->go;
        pthread_mutex_unlock(&sh->gate);
        if (go != 1) return NULL;
    }
    for (;;) {
        if (!w->failed && anneal_round(w)) w->failed = -1;
        if (pthread_barrier_wait(&sh->barrier) == PTHREAD_BARRIER_SERIAL_THREAD) round_end(sh);
        pthread_barrier_wait(&sh->barrier);
        if (sh->stop) break;
    }
    return NULL;
}

/* ---- what runs ----------------------------------------------------------------------------- */


/* After the search, in every thread on its own copy. The executor's transfers are calls that
 * block until both ends are there, which the fused simulator (free transfers) does not see: a
 * schedule's streams run 0-25% longer than its makespan (bench_fuse), more or less by the order
 * of the tasks. Of the schedules that tie the thread's best on the fused objective (the
 * makespan, then the peak: the contract and its bounds), this keeps one whose streams run
 * faster: a task moved up to 4 places, kept when the fused makespan and peak do not rise and the
 * streams do not slow down; at most POLISH_TRIES moves, until the deadline. w->best_sched
 * changes in place; w->streams_mk is its streams' makespan (INFINITY: none). */
static void *polish(void *arg) {
    worker *w = arg;
    fuse_ctx *c = &w->d.ctx;
    ff_fuse_schedule *s = &w->best_sched;
    const ff_fuse_instance *in = c->in;
    fuse_score r0, r;
    w->streams_mk = INFINITY;
    if (fuse_run(c, s, &r0, NULL, NULL)) return NULL;
    double cur = ff_fuse_streams_makespan(in, s);
    if (cur < 0) return NULL; /* no streams: nothing to compare (the executor's own checks will say why) */
    ff_rng rng;
    ff_rng_seed(&rng, ff_seed_stream(w->seed, 0x706f6c69, (uint64_t)w->id)); /* "poli" */
    int64_t deadline_ns = w->sh->deadline_ns;
    for (int t = 0; t < POLISH_TRIES && ff_now_ns() < deadline_ns; t++) {
        int32_t n = (int32_t)ff_rng_below(&rng, (uint64_t)in->nodes);
        int64_t len = s->n_tasks[n], from = len ? (int64_t)ff_rng_below(&rng, (uint64_t)len) : 0, d = 1 + (int64_t)ff_rng_below(&rng, 4);
        int64_t to = ff_rng_below(&rng, 2) ? from + d : from - d;
        if (len < 2 || to < 0 || to >= len) continue;
        move_task(s->tasks[n], from, to);
        w->decodes++;
        if (!fuse_run(c, s, &r, NULL, NULL) && !better_under(w->sh->cap_mk, r0.makespan, r0.peak, r.makespan, r.peak)) {
            double mk = ff_fuse_streams_makespan(in, s);
            if (mk >= 0 && mk <= cur) {
                cur = mk;
                r0 = r; /* it may even be better on the fused objective */
                continue;
            }
        }
        move_task(s->tasks[n], to, from);
    }
    w->streams_mk = cur;
    return NULL;
}

/* After the search, in every thread on its own copy of the best schedule: the memory walk
 * (fuse_mem.c) under the memory phase's cap, each with its own seed, until the peak bound, the
 * walk's deadline or (with max_rounds) WALK_ROUND_TRIES x max_rounds simulations. */
static void *walk(void *arg) {
    worker *w = arg;
    const shared *sh = w->sh;
    int64_t tries = 0, max_tries = sh->max_rounds > 0 ? WALK_ROUND_TRIES * sh->max_rounds : INT64_MAX;
    uint64_t seed = ff_seed_stream(w->seed, 0x6d656d77, (uint64_t)w->id); /* "memw" */
    fuse_score r;
    if (fuse_mem_walk(&w->d.ctx, &w->best_sched, sh->cap_mk, sh->cap_peak_lb, seed, max_tries, sh->max_rounds > 0 ? 0 : sh->walk_deadline_ns, &tries) < 0 ||
        fuse_run(&w->d.ctx, &w->best_sched, &r, NULL, NULL))
        w->failed = -1;
    else
        w->best_mk = r.makespan, w->best_pk = r.peak;
    w->decodes += tries;
    return NULL;
}

/* After the search, on the best schedule: the memory descent (fuse_mem.c), every move a pure gain in
 * memory that keeps the makespan under the memory phase's cap. Deterministic (a number of tries). */
static int descend_best(worker *w, double cap) {
    int64_t tries;
    fuse_score r;
    if (fuse_mem_descend(&w->d.ctx, &w->best_sched, cap, DESCEND_TRIES, &tries) < 0 || fuse_run(&w->d.ctx, &w->best_sched, &r, NULL, NULL))
        return ff_error_set("fuse solver", "this is a bug: please report the instance", "the memory descent left a schedule that deadlocks");
    w->decodes += tries;
    w->best_mk = r.makespan, w->best_pk = r.peak;
    return 0;
}

/* ---- the entry -------------------------------------------------------------------------- */

/* fn on every worker at once: w[0] here, the others on threads of their own (one that cannot
 * start runs here, after the others). */
static void each_worker(worker *w, int threads, void *(*fn)(void *)) {
    pthread_t *tid = ff_calloc((size_t)threads, sizeof *tid);
    bool *run = ff_calloc((size_t)threads, sizeof *run);
    for (int t = 1; tid && run && t < threads; t++) run[t] = pthread_create(&tid[t], NULL, fn, &w[t]) == 0;
    fn(&w[0]);
    for (int t = 1; t < threads; t++) {
        if (run && run[t]) pthread_join(tid[t], NULL);
        else fn(&w[t]);
    }
    free(tid);
    free(run);
}

static int schedule_room(const fuse_ctx *c, ff_fuse_schedule *s) {
    if (ff_fuse_schedule_init(s, c->in->nodes)) return -1;
    for (int32_t n = 0; n < c->in->nodes; n++) {
        s->tasks[n] = ff_malloc(((size_t)c->tasks[n] + 1) * sizeof **s->tasks);
        if (!s->tasks[n]) return -1;
        s->cap[n] = c->tasks[n] + 1;
    }
    return 0;
}

static int worker_init(worker *w, const problem *p, shared *sh, int id, uint64_t seed) {
    memset(w, 0, sizeof *w);
    w->p = p;
    w->sh = sh;
    w->id = id;
    w->seed = seed;
    ff_rng_seed(&w->rng, ff_seed_stream(seed, 0x66757365, (uint64_t)id)); /* "fuse" */
    w->best_mk = w->best_pk = w->pt_mk = w->pt_pk = w->an_mk = w->an_pk = w->last_mk = w->cap_pt_mk = w->cap_pt_pk = INFINITY;
    w->mem_step = 0.5;
    if (fuse_ctx_init(&w->d.ctx, p->in) || point_init(&w->cur, p->items) || point_init(&w->best_pt, p->items) || point_init(&w->anchor, p->items) || point_init(&w->cap_pt, p->items) || schedule_room(&w->d.ctx, &w->sched) ||
        schedule_room(&w->d.ctx, &w->osched) || schedule_room(&w->d.ctx, &w->best_sched) || schedule_room(&w->d.ctx, &w->plateau) || !(w->lns = fuse_lns_new(p->in, p->qf, p->qb, p->lb, p->peak_lb, p->scale)))
        return -1;
    return 0;
}

static void worker_free(worker *w) {
    fuse_ctx_free(&w->d.ctx);
    point_free(&w->cur);
    point_free(&w->best_pt);
    point_free(&w->anchor);
    point_free(&w->cap_pt);
    ff_fuse_schedule_free(&w->sched);
    ff_fuse_schedule_free(&w->osched);
    ff_fuse_schedule_free(&w->best_sched);
    ff_fuse_schedule_free(&w->plateau);
    fuse_lns_free(&w->lns);
}

static int problem_init(problem *p, const ff_fuse_instance *in) {
    memset(p, 0, sizeof *p);
    p->in = in;
    double work = 0;
    int64_t ntask = 0;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        p->items += (int64_t)m->n_stages * m->micro;
        work += (double)m->n_stages * m->micro * (m->fwd + m->bwd);
        ntask += 2 * (int64_t)m->n_stages * m->micro;
        for (int32_t s = 0; s < m->n_stages; s++) p->on[m->stages[s]][p->non[m->stages[s]]++] = i;
    }
    p->scale = work / (double)ntask;
    p->qf = ff_malloc((size_t)p->items * sizeof *p->qf);
    p->qb = ff_malloc((size_t)p->items * sizeof *p->qb);
    double *ef = NULL, *eb = NULL;
    if (!p->qf || !p->qb) return -1;
    int64_t off = 0;
    for (int i = 0; i < in->n_models; i++) {
        size_t n = (size_t)in->models[i].n_stages * (size_t)in->models[i].micro;
        ef = ff_malloc(n * sizeof *ef), eb = ff_malloc(n * sizeof *eb);
        if (!ef || !eb) {
            free(ef);
            free(eb);
            return -1;
        }
        fuse_heads_tails(in, i, ef, eb, p->qf + off, p->qb + off);
        free(ef);
        free(eb);
        off += (int64_t)n;
    }
    ff_fuse_lower_bounds(in, &p->lb, &p->peak_lb);
    return 0;
}

int ff_fuse_solve(const ff_fuse_instance *in, const ff_fuse_solve_opts *o, ff_fuse_schedule *out, ff_fuse_solve_stats *stats) {
    int64_t t0 = ff_now_ns();
    memset(out, 0, sizeof *out);
    ff_fuse_solve_stats st = {0};
    double seconds = o && o->seconds > 0 ? o->seconds : 10;
    int threads = o && o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    uint64_t seed = o ? o->seed : 0;
    double slack = o ? o->makespan_slack : 0;
    if (!(slack >= 0 && slack <= 1)) { /* NaN too */
        ff_error_set("fuse solver", "give a fraction from 0 (makespan first) to 1, e.g. 0.02 for 2%", "makespan slack %g is out of range", slack);
        if (stats) *stats = st;
        return -1;
    }
    problem p;
    shared sh = {.gate = PTHREAD_MUTEX_INITIALIZER, .open = PTHREAD_COND_INITIALIZER, .slack = slack, .cap_mk = INFINITY};
    worker *w = NULL;
    int rc = -1, made = 0;
    if (problem_init(&p, in)) goto done;
    if (!(w = ff_calloc((size_t)threads, sizeof *w))) goto done;
    for (; made < threads; made++)
        if (worker_init(&w[made], &p, &sh, made, seed)) {
            made++;
            goto done;
        }
    /* The fixed points, in thread 0: the caps of the fewest micro-batches in flight that the
     * makespan bound allows, and a little looser; 1F1B's, and looser; none. */
    if (fuse_least_in_flight(in, p.lb, p.least)) goto done;
    static const int extras[] = {0, 1, 2, 4, -1};
    for (int pass = 0; pass < 2; pass++)
        for (size_t e = 0; e < sizeof extras / sizeof *extras; e++) {
            double en;
            if (pass == 0 && extras[e] < 0) continue;
            point_plain(&p, &w[0].cur, extras[e], pass == 0);
            if (try_point(&w[0], &w[0].cur, &en)) goto done;
        }
    bool done_early = at_bound(&p, w[0].best_mk) && w[0].best_pk <= (slack > 0 ? ff_fuse_peak_bound(in, p.lb * (1 + slack)) : p.peak_lb) * (1 + 1e-9);
    for (int t = 1; t < threads; t++) { /* every thread anneals from the best fixed point */
        point_copy(&w[t].best_pt, &w[0].best_pt, p.items);
        w[t].pt_mk = w[0].pt_mk, w[t].pt_pk = w[0].pt_pk;
        w[t].best_mk = w[0].best_mk, w[t].best_pk = w[0].best_pk;
        copy_lists(&w[t].best_sched, &w[0].best_sched);
    }
    for (int t = 0; t < threads; t++) {
        point_copy(&w[t].anchor, &w[0].best_pt, p.items);
        w[t].an_mk = w[0].pt_mk, w[t].an_pk = w[0].pt_pk;
    }
    for (int t = 0; t < threads; t++) w[t].restart = true;
    if (!done_early) {
        sh.deadline_ns = t0 + (int64_t)((1 - POLISH_SHARE) * seconds * 1e9);
        sh.switch_ns = t0 + (int64_t)(MK_SHARE * (1 - POLISH_SHARE) * seconds * 1e9);
        sh.max_rounds = o && o->max_rounds > 0 ? o->max_rounds : 0;
        sh.w = w;
        sh.n = threads;
        sh.round_mk = sh.round_pk = INFINITY;
        if (pthread_barrier_init(&sh.barrier, NULL, (unsigned)threads)) {
            ff_error_set("fuse solver", NULL, "cannot make a thread barrier");
            goto done;
        }
        pthread_t *tid = ff_calloc((size_t)threads, sizeof *tid);
        int started = 1;
        if (tid) {
            pthread_mutex_lock(&sh.gate);
            for (; started < threads; started++)
                if (pthread_create(&tid[started], NULL, thread_main, &w[started])) break;
            sh.go = started == threads ? 1 : -1; /* a thread that cannot start: the others leave at once */
            pthread_cond_broadcast(&sh.open);
            pthread_mutex_unlock(&sh.gate);
            if (sh.go == 1) thread_main(&w[0]);
            for (int t = 1; t < started; t++) pthread_join(tid[t], NULL);
        }
        free(tid);
        pthread_barrier_destroy(&sh.barrier);
        if (!tid) goto done;
        if (sh.go != 1) {
            ff_error_set("fuse solver", "ask for fewer threads (--threads)", "cannot start thread %d of %d", started + 1, threads);
            goto done;
        }
        for (int t = 0; t < threads; t++)
            if (w[t].failed) {
                ff_error_set("fuse solver", "this is a bug: please report the instance", "a decoded schedule got stuck in thread %d", t);
                goto done;
            }
    }
    int bi = best_worker(&sh, w, threads);
    if (sh.memory_phase && !(w[bi].best_pk <= sh.cap_peak_lb * (1 + 1e-9))) {
        for (int t = 0; t < threads; t++) /* every thread walks from the best */
            if (t != bi) {
                copy_lists(&w[t].best_sched, &w[bi].best_sched);
                w[t].best_mk = w[bi].best_mk, w[t].best_pk = w[bi].best_pk;
            }
        each_worker(w, threads, walk);
        for (int t = 0; t < threads; t++)
            if (w[t].failed) {
                ff_error_set("fuse solver", "this is a bug: please report the instance", "the memory walk left a schedule that deadlocks in thread %d", t);
                goto done;
            }
        bi = best_worker(&sh, w, threads);
    }
    if (sh.memory_phase && descend_best(&w[bi], sh.cap_mk)) goto done;
    /* every thread polishes the best (its own where it ties it), in parallel; the fastest streams win */
    sh.deadline_ns = t0 + (int64_t)(seconds * 1e9);
    for (int t = 0; t < threads; t++)
        if (t != bi && better_under(sh.cap_mk, w[bi].best_mk, w[bi].best_pk, w[t].best_mk, w[t].best_pk)) {
            copy_lists(&w[t].best_sched, &w[bi].best_sched);
            w[t].best_mk = w[bi].best_mk, w[t].best_pk = w[bi].best_pk;
        }
    each_worker(w, threads, polish);
    for (int t = 0; t < threads; t++)
        if (w[t].streams_mk < w[bi].streams_mk) bi = t;
    if (ff_fuse_schedule_copy(&w[bi].best_sched, out)) goto done;
    for (int t = 0; t < threads; t++) st.evaluations += w[t].decodes;
    st.optimal = at_bound(&p, w[bi].best_mk);
    rc = 0;
done:
    if (w)
        for (int t = 0; t < made; t++) worker_free(&w[t]);
    free(w);
    free(p.qf);
    free(p.qb);
    st.seconds = (double)(ff_now_ns() - t0) * 1e-9;
    if (stats) *stats = st;
    return rc;
}

int ff_fuse_solve_capped(const ff_fuse_instance *in, const ff_fuse_solve_opts *o, double peak_cap, ff_fuse_schedule *out,
                         ff_fuse_solve_stats *stats, double *slack) {
    static const double slacks[] = {0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1};
    ff_fuse_solve_opts so = o ? *o : (ff_fuse_solve_opts){0};
    ff_fuse_schedule cur = {0}, least = {0}; /* least: the lowest peak so far, for when none fits */
    double least_peak = INFINITY;
    *slack = -1;
    memset(out, 0, sizeof *out);
    for (size_t k = 0; k < sizeof slacks / sizeof *slacks; k++) {
        so.makespan_slack = slacks[k];
        ff_fuse_sim sim;
        if (ff_fuse_solve(in, &so, &cur, stats) || ff_fuse_simulate(in, &cur, &sim)) {
            ff_fuse_schedule_free(&cur);
            ff_fuse_schedule_free(&least);
            return -1;
        }
        if (sim.peak_activation <= peak_cap * (1 + 1e-9)) {
            *slack = slacks[k];
            ff_fuse_schedule_free(&least);
            *out = cur;
            return 0;
        }
        if (sim.peak_activation < least_peak) {
            ff_fuse_schedule_free(&least);
            least = cur, least_peak = sim.peak_activation;
            memset(&cur, 0, sizeof cur);
        } else {
            ff_fuse_schedule_free(&cur);
        }
    }
    *out = least;
    return 0;
}
