/* The fused solver's makespan repair (dataflow/fuse_lns.h): a large-neighbourhood search step on
 * the node orders. Not here: the annealing that calls it (fuse_solve.c), memory (only carried).
 *
 * Why: the solver's two spaces move one thing at a time (a cap, the keys of a few micro-batches,
 * one task a few places), and on the instances it missed (bench_fuse: 8 nodes PP4 x 2 at 16-64
 * micro-batches, 16 nodes PP8 x 2) the last few units of makespan need several tasks on several
 * nodes reordered together, each such move alone longer. A step here: run the schedule, follow
 * its critical path back from the task that ends last (each task starts at the end of its node's
 * previous task or of its micro-batch's previous step), pick a point of it and around it a window,
 * a time span on the path's nodes there, or on that node and its neighbours, or on all nodes.
 * Every task that starts inside the window is freed; the schedule is decoded again, each node
 * following its list outside its window and, inside it, list scheduling among the freed tasks
 * (of the ones that can start, the highest key: the task's tail, or minus its present start, plus
 * noise; a small delay allowed now and then, which non-delay list scheduling never takes). Kept
 * by Metropolis at the caller's temperature on the makespan, plus a tenth of the nodes' mean end
 * past the bound (a flat max gives the walk a slope) and the solver's peak tie-break.
 *
 * Half the steps run on the schedule mirrored in time (below), so the drain gets windows
 * list-scheduled the way the ramp does.
 *
 * Measured (fuseflow schedule fuse, 9.5 s, 2 threads, docs/pipeline.md): of the 10 bench_fuse
 * instances the search missed where CP-SAT shows the bound reachable, 5 at it with the plain
 * windows, 8-9 with the mirror as well (two cycles in three the repair's); the two whose bound is
 * not reachable at 346-347 and 353 for the optima 346 and 353. Missed then in some runs: 8 nodes
 * PP4 x 2 64 micro-batches 2:2 (794 for 792) and 16 nodes PP8 x 2 8 2:2 (158 for 156); both at
 * their bounds in session 12's runs, the second in 0.5-3 s since the solver's repair cycles
 * start where the last one ended on the plateau (fuse_solve.c). */
#include "dataflow/fuse_lns.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/fuse_internal.h"
#include "fuseflow/error.h"

#define EXCESS_WEIGHT 0.1  /* the energy: makespan / bound + this x the mean node end past the bound / bound */
#define PEAK_WEIGHT 0.002  /* + this x peak / its bound (the solver's MEM_WEIGHT: memory breaks ties) */

struct fuse_lns {
    const ff_fuse_instance *in;
    fuse_ctx ctx;
    const double *qf, *qb;          /* [items] tails */
    double lb, peak_lb, scale;
    double *start[FF_FUSE_MAX_NODES], *end[FF_FUSE_MAX_NODES]; /* [tasks on n] times of the schedule stepped from */
    int64_t *pos_f, *pos_b;         /* [items] position of each task in its node's list */
    int32_t *micro_at[FF_FUSE_MAX_NODES]; /* [tasks on n] the micro-batch of each task of the schedule */
    double *key_f, *key_b;          /* [items] keys of the freed tasks */
    int64_t *chain_n, *chain_p;     /* [all tasks] the critical path, node and position */
    ff_fuse_schedule out;           /* the decoded candidate */
    ff_fuse_schedule seen;          /* the schedule start, end, pos_*, micro_at, r and ex describe (have) */
    bool have;
    fuse_score r;
    double ex;                      /* its nodes' summed end past the bound */
    int64_t total;
    /* The same problem backwards in time (each micro-batch's chain reversed: its backwards become
     * forwards through the same stages, its forwards backwards; a node's list reversed with F and
     * B swapped), whose windows list-schedule the drain the way this one schedules the ramp. A
     * schedule and its mirror have the same longest path, so the same makespan, and the same peak
     * (a mirror prefix holds what the rest of the list frees: the memory after the same cut, as
     * each model has as many forwards as backwards on a node). NULL in a mirror. */
    struct fuse_lns *mirror;
    ff_fuse_instance *mirror_in;
    double *mirror_q;               /* [4 items] its heads and tails */
    ff_fuse_schedule ms;            /* s mirrored */
};

void fuse_lns_free(fuse_lns **lp);

static fuse_lns *lns_new(const ff_fuse_instance *in, const double *qf, const double *qb, double lb, double peak_lb, double scale, bool mirror) {
    fuse_lns *l = ff_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->in = in, l->qf = qf, l->qb = qb, l->lb = lb, l->peak_lb = peak_lb > 0 ? peak_lb : 1, l->scale = scale;
    if (fuse_ctx_init(&l->ctx, in)) {
        free(l);
        return NULL;
    }
    size_t items = (size_t)l->ctx.off[in->n_models];
    for (int32_t n = 0; n < in->nodes; n++) l->total += l->ctx.tasks[n];
    l->pos_f = ff_malloc(items * sizeof *l->pos_f);
    l->pos_b = ff_malloc(items * sizeof *l->pos_b);
    l->key_f = ff_calloc(items, sizeof *l->key_f);
    l->key_b = ff_calloc(items, sizeof *l->key_b);
    l->chain_n = ff_malloc(((size_t)l->total + 1) * sizeof *l->chain_n);
    l->chain_p = ff_malloc(((size_t)l->total + 1) * sizeof *l->chain_p);
    bool ok = l->pos_f && l->pos_b && l->key_f && l->key_b && l->chain_n && l->chain_p && !ff_fuse_schedule_init(&l->out, in->nodes) &&
              !ff_fuse_schedule_init(&l->seen, in->nodes);
    for (int32_t n = 0; ok && n < in->nodes; n++) {
        size_t k = (size_t)l->ctx.tasks[n] + 1;
        l->start[n] = ff_malloc(k * sizeof **l->start);
        l->end[n] = ff_malloc(k * sizeof **l->end);
        l->micro_at[n] = ff_malloc(k * sizeof **l->micro_at);
        l->out.tasks[n] = ff_malloc(k * sizeof **l->out.tasks);
        l->seen.tasks[n] = ff_malloc(k * sizeof **l->seen.tasks);
        ok = l->start[n] && l->end[n] && l->micro_at[n] && l->out.tasks[n] && l->seen.tasks[n];
        if (ok) l->out.cap[n] = l->seen.cap[n] = (int64_t)k;
    }
    if (ok && mirror) { /* the mirror: forward and backward times swapped */
        ff_fuse_instance *mi = l->mirror_in = ff_malloc(sizeof *mi);
        l->mirror_q = ff_malloc(4 * items * sizeof *l->mirror_q);
        ok = mi && l->mirror_q && !ff_fuse_schedule_init(&l->ms, in->nodes);
        for (int32_t n = 0; ok && n < in->nodes; n++) {
            l->ms.tasks[n] = ff_malloc(((size_t)l->ctx.tasks[n] + 1) * sizeof **l->ms.tasks);
            ok = l->ms.tasks[n] != NULL;
            if (ok) l->ms.cap[n] = l->ctx.tasks[n] + 1;
        }
        if (ok) {
            *mi = *in;
            for (int i = 0; i < in->n_models; i++) {
                mi->models[i].fwd = in->models[i].bwd, mi->models[i].bwd = in->models[i].fwd;
            }
            double *q = l->mirror_q;
            for (int i = 0; i < in->n_models; i++)
                fuse_heads_tails(mi, i, q + 2 * items + l->ctx.off[i], q + 3 * items + l->ctx.off[i], q + l->ctx.off[i], q + items + l->ctx.off[i]);
            ok = (l->mirror = lns_new(mi, q, q + items, lb, peak_lb, scale, false)) != NULL;
        }
    }
    if (!ok) fuse_lns_free(&l);
    return l;
}

fuse_lns *fuse_lns_new(const ff_fuse_instance *in, const double *qf, const double *qb, double lb, double peak_lb, double scale) {
    return lns_new(in, qf, qb, lb, peak_lb, scale, true);
}

/* dst = src backwards in time: each node's list reversed, forwards and backwards swapped. */
static void mirror_lists(ff_fuse_schedule *dst, const ff_fuse_schedule *src) {
    for (int32_t n = 0; n < src->nodes; n++) {
        int64_t k = src->n_tasks[n];
        for (int64_t p = 0; p < k; p++) {
            ff_fuse_task t = src->tasks[n][k - 1 - p];
            t.backward = !t.backward;
            dst->tasks[n][p] = t;
        }
        dst->n_tasks[n] = k;
    }
}

void fuse_lns_free(fuse_lns **lp) {
    fuse_lns *l = *lp;
    if (!l) return;
    for (int32_t n = 0; n < l->in->nodes; n++) {
        free(l->start[n]);
        free(l->end[n]);
        free(l->micro_at[n]);
    }
    free(l->pos_f);
    free(l->pos_b);
    free(l->key_f);
    free(l->key_b);
    free(l->chain_n);
    free(l->chain_p);
    ff_fuse_schedule_free(&l->out);
    ff_fuse_schedule_free(&l->seen);
    ff_fuse_schedule_free(&l->ms);
    fuse_lns_free(&l->mirror);
    free(l->mirror_in);
    free(l->mirror_q);
    fuse_ctx_free(&l->ctx);
    free(l);
    *lp = NULL;
}

static bool same_lists(const ff_fuse_schedule *a, const ff_fuse_schedule *b) {
    for (int32_t n = 0; n < a->nodes; n++)
        if (a->n_tasks[n] != b->n_tasks[n] || memcmp(a->tasks[n], b->tasks[n], (size_t)a->n_tasks[n] * sizeof *a->tasks[n])) return false;
    return true;
}

static void copy_lists(ff_fuse_schedule *dst, const ff_fuse_schedule *src) {
    for (int32_t n = 0; n < src->nodes; n++) {
        memcpy(dst->tasks[n], src->tasks[n], (size_t)src->n_tasks[n] * sizeof **src->tasks);
        dst->n_tasks[n] = src->n_tasks[n];
    }
}

/* Item (fuse_ctx offsets) of task t on node n, micro-batch k. */
static int64_t item_of(const fuse_ctx *c, ff_fuse_task t, int32_t n, int32_t k) {
    return c->off[t.model] + (int64_t)c->stage_of[t.model][n] * c->in->models[t.model].micro + k;
}

/* Positions of every task in s (pos_f, pos_b). */
static void index_positions(fuse_lns *l, const ff_fuse_schedule *s) {
    const ff_fuse_instance *in = l->in;
    for (int32_t n = 0; n < in->nodes; n++) {
        int32_t cnt[FF_FUSE_MAX_MODELS][2] = {{0}};
        for (int64_t p = 0; p < s->n_tasks[n]; p++) {
            ff_fuse_task t = s->tasks[n][p];
            int32_t k = cnt[t.model][t.backward]++;
            l->micro_at[n][p] = k;
            (t.backward ? l->pos_b : l->pos_f)[item_of(&l->ctx, t, n, k)] = p;
        }
    }
}

/* The critical path of s (its times in start/end), back from a task that ends at mk: into
 * chain_n/chain_p, latest first. Its length. */
static int64_t critical_path(fuse_lns *l, const ff_fuse_schedule *s, double mk, ff_rng *rng) {
    const ff_fuse_instance *in = l->in;
    const fuse_ctx *c = &l->ctx;
    double tol = 1e-9 * fmax(1, mk);
    int32_t n = -1;
    int32_t ends_last[FF_FUSE_MAX_NODES], ne = 0;
    for (int32_t q = 0; q < in->nodes; q++)
        if (s->n_tasks[q] && l->end[q][s->n_tasks[q] - 1] >= mk - tol) ends_last[ne++] = q;
    if (!ne) return 0;
    n = ends_last[ff_rng_below(rng, (uint64_t)ne)];
    int64_t p = s->n_tasks[n] - 1, len = 0;
    while (len <= l->total) {
        l->chain_n[len] = n, l->chain_p[len++] = p;
        double st = l->start[n][p];
        if (st <= tol) break;
        ff_fuse_task t = s->tasks[n][p];
        const ff_fuse_model *m = &in->models[t.model];
        int32_t sg = c->stage_of[t.model][n];
        int32_t k = l->micro_at[n][p];
        int32_t dn = -1;
        int64_t dp = -1;
        double hop = 0;
        if (!t.backward && sg > 0) dn = m->stages[sg - 1], dp = l->pos_f[c->off[t.model] + (int64_t)(sg - 1) * m->micro + k], hop = in->hop_latency;
        else if (t.backward && sg == m->n_stages - 1) dn = n, dp = l->pos_f[c->off[t.model] + (int64_t)sg * m->micro + k];
        else if (t.backward) dn = m->stages[sg + 1], dp = l->pos_b[c->off[t.model] + (int64_t)(sg + 1) * m->micro + k], hop = in->hop_latency;
        bool by_node = p > 0 && fabs(l->end[n][p - 1] - st) <= tol;
        bool by_dep = dn >= 0 && fabs(l->end[dn][dp] + hop - st) <= tol;
        if (by_node && by_dep) by_node = ff_rng_below(rng, 2);
        if (by_node) p--;
        else if (by_dep) n = dn, p = dp;
        else break; /* cannot happen in a semi-active schedule; stop rather than loop */
    }
    return len;
}

typedef struct window {
    int64_t lo[FF_FUSE_MAX_NODES], hi[FF_FUSE_MAX_NODES]; /* freed positions [lo, hi) of each node */
    double delay;                                         /* a task ready this long after the first may be taken */
    double cut;                                           /* the window's start: what starts before it stays as it was */
} window;

/* Decode: each node follows s outside its window and list-schedules the freed tasks inside it.
 * 0, or 1 when the fixed parts leave every node waiting (a deadlock). */
static int decode(fuse_lns *l, const ff_fuse_schedule *s, const window *w, double *mk, double *pk, double *excess) {
    const ff_fuse_instance *in = l->in;
    fuse_ctx *c = &l->ctx;
    const int32_t N = in->nodes;
    int64_t items = c->off[in->n_models], pos[FF_FUSE_MAX_NODES] = {0};
    int32_t fc[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES] = {{0}}, bc[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES] = {{0}};
    int32_t rf[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES] = {{0}}, rb[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES] = {{0}}; /* freed left */
    double free_at[FF_FUSE_MAX_NODES] = {0}, mem[FF_FUSE_MAX_NODES] = {0}, tn[FF_FUSE_MAX_NODES], ready[FF_FUSE_MAX_NODES];
    int8_t ch_m[FF_FUSE_MAX_NODES], ch_b[FF_FUSE_MAX_NODES];
    double peak = 0;
    for (int64_t i = 0; i < items; i++) c->f_end[i] = c->b_end[i] = -1;
    for (int32_t n = 0; n < N; n++) {
        for (int64_t p = w->lo[n]; p < w->hi[n]; p++) (s->tasks[n][p].backward ? rb : rf)[s->tasks[n][p].model][n]++;
    }
    /* when node n can start model i's next forward / backward there (-1: not yet known) */
#define REL_F(i, n)                                                                                                          \
    (c->stage_of[i][n] == 0 ? 0                                                                                              \
     : c->f_end[c->off[i] + (int64_t)(c->stage_of[i][n] - 1) * in->models[i].micro + fc[i][n]] < 0                           \
         ? -1                                                                                                                \
         : c->f_end[c->off[i] + (int64_t)(c->stage_of[i][n] - 1) * in->models[i].micro + fc[i][n]] + in->hop_latency)
#define REL_B(i, n)                                                                                                          \
    (c->stage_of[i][n] == in->models[i].n_stages - 1 ? c->f_end[c->off[i] + (int64_t)c->stage_of[i][n] * in->models[i].micro + bc[i][n]] \
     : c->b_end[c->off[i] + (int64_t)(c->stage_of[i][n] + 1) * in->models[i].micro + bc[i][n]] < 0                           \
         ? -1                                                                                                                \
         : c->b_end[c->off[i] + (int64_t)(c->stage_of[i][n] + 1) * in->models[i].micro + bc[i][n]] + in->hop_latency)
    /* Every task that started before the cut starts there again (its node's earlier tasks and its
     * micro-batch's earlier steps started before it too, and no list changes before the window),
     * so those come from the times of s, not from the event loop. */
    for (int32_t n = 0; n < N; n++) {
        ff_fuse_task *o = l->out.tasks[n];
        int64_t p = 0;
        for (; p < s->n_tasks[n] && l->start[n][p] < w->cut; p++) {
            ff_fuse_task t = s->tasks[n][p];
            const ff_fuse_model *m = &in->models[t.model];
            int64_t it = item_of(c, t, n, l->micro_at[n][p]);
            if (!t.backward) {
                c->f_end[it] = l->end[n][p];
                fc[t.model][n]++;
                mem[n] += m->act;
                peak = fmax(peak, mem[n]);
            } else {
                c->b_end[it] = l->end[n][p];
                bc[t.model][n]++;
                mem[n] -= m->act;
            }
            o[p] = t;
        }
        pos[n] = p;
        l->out.n_tasks[n] = p;
        free_at[n] = p ? l->end[n][p - 1] : 0;
    }
    for (int32_t n = 0; n < N; n++) tn[n] = INFINITY;
    int32_t todo[FF_FUSE_MAX_NODES + 1], nt = 0;
    for (int32_t n = 0; n < N; n++) todo[nt++] = n;
    for (int64_t step = 0;; step++) {
        while (nt) { /* choose again on the nodes whose options changed */
            int32_t n = todo[--nt];
            tn[n] = INFINITY;
            if (pos[n] >= s->n_tasks[n]) continue;
            if (pos[n] < w->lo[n] || pos[n] >= w->hi[n]) {
                ff_fuse_task t = s->tasks[n][pos[n]];
                if (t.backward && bc[t.model][n] >= fc[t.model][n]) continue;
                double r = t.backward ? REL_B(t.model, n) : REL_F(t.model, n);
                if (r < 0) continue;
                tn[n] = fmax(r, free_at[n]), ready[n] = r, ch_m[n] = (int8_t)t.model, ch_b[n] = (int8_t)t.backward;
                continue;
            }
            double rel[2 * FF_FUSE_MAX_MODELS], key[2 * FF_FUSE_MAX_MODELS], first = INFINITY;
            int8_t cm[2 * FF_FUSE_MAX_MODELS], cb[2 * FF_FUSE_MAX_MODELS];
            int nc = 0;
            for (int i = 0; i < in->n_models; i++) {
                int32_t sg = c->stage_of[i][n];
                if (sg < 0) continue;
                int64_t base = c->off[i] + (int64_t)sg * in->models[i].micro;
                if (rf[i][n] > 0) {
                    double r = REL_F(i, n);
                    if (r >= 0) rel[nc] = r, key[nc] = l->key_f[base + fc[i][n]], cm[nc] = (int8_t)i, cb[nc++] = 0;
                }
                if (rb[i][n] > 0 && bc[i][n] < fc[i][n]) {
                    double r = REL_B(i, n);
                    if (r >= 0) rel[nc] = r, key[nc] = l->key_b[base + bc[i][n]], cm[nc] = (int8_t)i, cb[nc++] = 1;
                }
            }
            for (int j = 0; j < nc; j++) first = fmin(first, rel[j]);
            if (!nc) continue;
            double t = fmax(first, free_at[n]) + w->delay;
            int best = -1;
            for (int j = 0; j < nc; j++)
                if (rel[j] <= t && (best < 0 || key[j] > key[best])) best = j;
            tn[n] = fmax(rel[best], free_at[n]), ready[n] = rel[best], ch_m[n] = cm[best], ch_b[n] = cb[best];
        }
        int32_t n = -1;
        for (int32_t q = 0; q < N; q++)
            if (tn[q] < INFINITY && (n < 0 || tn[q] < tn[n])) n = q;
        if (n < 0) break;
        int i = ch_m[n];
        const ff_fuse_model *m = &in->models[i];
        int32_t sg = c->stage_of[i][n], next = -1;
        bool freed = pos[n] >= w->lo[n] && pos[n] < w->hi[n];
        double t0 = fmax(free_at[n], ready[n]);
        if (!ch_b[n]) {
            free_at[n] = t0 + m->fwd;
            c->f_end[c->off[i] + (int64_t)sg * m->micro + fc[i][n]++] = free_at[n];
            mem[n] += m->act;
            peak = fmax(peak, mem[n]);
            if (freed) rf[i][n]--;
            if (sg + 1 < m->n_stages) next = m->stages[sg + 1];
        } else {
            free_at[n] = t0 + m->bwd;
            c->b_end[c->off[i] + (int64_t)sg * m->micro + bc[i][n]++] = free_at[n];
            mem[n] -= m->act;
            if (freed) rb[i][n]--;
            if (sg > 0) next = m->stages[sg - 1];
        }
        l->out.tasks[n][l->out.n_tasks[n]++] = (ff_fuse_task){.model = (uint8_t)i, .backward = (uint8_t)ch_b[n]};
        pos[n]++;
        todo[nt++] = n;
        if (next >= 0 && next != n) todo[nt++] = next;
    }
#undef REL_F
#undef REL_B
    double end = 0, ex = 0;
    for (int32_t n = 0; n < N; n++) {
        if (pos[n] < s->n_tasks[n]) return 1;
        end = fmax(end, free_at[n]);
        ex += fmax(0, free_at[n] - l->lb);
    }
    *mk = end, *pk = peak, *excess = ex;
    return 0;
}

/* The window around a point of the critical path: [t0, t1) on a set of nodes. */
static void pick_window(fuse_lns *l, const ff_fuse_schedule *s, int64_t len, ff_rng *rng, window *w) {
    const ff_fuse_instance *in = l->in;
    int64_t at = (int64_t)ff_rng_below(rng, (uint64_t)len);
    int32_t cn = (int32_t)l->chain_n[at];
    double centre = l->start[cn][l->chain_p[at]];
    double width = l->scale * (double)(3 + ff_rng_below(rng, 14));
    double t0 = centre - ff_rng_uniform(rng) * width, t1 = t0 + width;
    w->cut = t0;
    bool on[FF_FUSE_MAX_NODES] = {false};
    int kind = (int)ff_rng_below(rng, 3);
    if (kind == 0) { /* the path's nodes in the span */
        for (int64_t j = 0; j < len; j++) {
            double st = l->start[l->chain_n[j]][l->chain_p[j]];
            if (st >= t0 && st < t1) on[l->chain_n[j]] = true;
        }
    } else if (kind == 1) { /* the node and its neighbours */
        int32_t r = (int32_t)ff_rng_below(rng, 3);
        for (int32_t q = cn - r; q <= cn + r; q++)
            if (q >= 0 && q < in->nodes) on[q] = true;
    } else {
        for (int32_t q = 0; q < in->nodes; q++) on[q] = true;
    }
    on[cn] = true;
    for (int32_t q = 0; q < in->nodes; q++) {
        w->lo[q] = w->hi[q] = 0;
        if (!on[q]) continue;
        int64_t p = 0, n_t = s->n_tasks[q];
        while (p < n_t && l->start[q][p] < t0) p++;
        w->lo[q] = p;
        while (p < n_t && l->start[q][p] < t1) p++;
        w->hi[q] = p;
    }
    w->delay = ff_rng_below(rng, 4) == 0 ? l->scale * ff_rng_uniform(rng) : 0;
}

/* The times and positions of s into the cache, unless they are there (kept while steps fail). */
static int describe(fuse_lns *l, const ff_fuse_schedule *s) {
    if (l->have && same_lists(&l->seen, s)) return 0;
    if (fuse_run(&l->ctx, s, &l->r, l->start, l->end)) return ff_error_set("fuse repair", "this is a bug", "the schedule to repair deadlocks");
    l->ex = 0;
    for (int32_t n = 0; n < l->in->nodes; n++) {
        double e = s->n_tasks[n] ? l->end[n][s->n_tasks[n] - 1] : 0;
        l->ex += fmax(0, e - l->lb);
    }
    index_positions(l, s);
    copy_lists(&l->seen, s);
    l->have = true;
    return 0;
}

int fuse_lns_step(fuse_lns *l, ff_fuse_schedule *s, ff_rng *rng, double temp, double *mk, double *pk) {
    const ff_fuse_instance *in = l->in;
    if (l->mirror && ff_rng_below(rng, 2)) { /* half the steps backwards in time */
        mirror_lists(&l->ms, s);
        int rc = fuse_lns_step(l->mirror, &l->ms, rng, temp, mk, pk);
        if (rc > 0) {
            mirror_lists(s, &l->ms);
            l->have = false;
        }
        return rc;
    }
    if (describe(l, s)) return -1;
    const fuse_score r = l->r;
    const double ex = l->ex;
    *mk = r.makespan, *pk = r.peak;
    int64_t len = critical_path(l, s, r.makespan, rng);
    if (!len) return 0;
    window w;
    pick_window(l, s, len, rng, &w);
    bool by_order = ff_rng_below(rng, 2); /* keys: the tails, or the present order */
    double sigma = l->scale * (ff_rng_below(rng, 2) ? 0.5 : 2.0);
    for (int32_t n = 0; n < in->nodes; n++) { /* keys of the freed tasks, plus noise */
        if (w.hi[n] <= w.lo[n]) continue;
        for (int64_t p = w.lo[n]; p < w.hi[n]; p++) {
            ff_fuse_task t = s->tasks[n][p];
            int64_t it = item_of(&l->ctx, t, n, l->micro_at[n][p]);
            (t.backward ? l->key_b : l->key_f)[it] = (by_order ? -l->start[n][p] : (t.backward ? l->qb : l->qf)[it]) + sigma * ff_rng_normal(rng);
        }
    }
    double nmk, npk, nex;
    if (decode(l, s, &w, &nmk, &npk, &nex)) return 0;
    double de = (nmk - r.makespan) / l->lb + EXCESS_WEIGHT * (nex - ex) / (l->lb * in->nodes) + PEAK_WEIGHT * (npk - r.peak) / l->peak_lb;
    if (de > 1e-12 && !(temp > 0 && ff_rng_uniform(rng) < exp(-de / temp))) return 0;
    copy_lists(s, &l->out);
    *mk = nmk, *pk = npk;
    l->have = false;
    return 1;
}
