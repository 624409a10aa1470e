/* The lower bounds of the fused scheduling problem (fuseflow/fuse.h): every task's earliest
 * start and least remaining time, tightened at a makespan T by propagation (the chains of
 * each micro-batch and, per node, edge finding over one machine); the makespan bound from
 * them (Jackson's preemptive schedule per node, then the least T the propagation cannot
 * refute) and the peak activation bound at a makespan. Not here: the simulator (fuse.c), the
 * solver (fuse_solve.c). */
#include "fuseflow/fuse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/fuse_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
/* ---- bounds ----------------------------------------------------------------------------- */

/* Each model alone, with its own tasks on a node in their fixed orders (the k-th forward and
 * the k-th backward of a node are micro-batch k's, and a backward follows its forward):
 *   ef(s,k) = max(ef(s-1,k) + f + h, ef(s,k-1) + f)
 *   eb(s,k) = max(eb(s+1,k) + b + h  [ef(S-1,k) + f at the last stage], eb(s,k-1) + b,
 *                 ef(s,0) + (k+1) f + k b)   (its forwards 0..k and backwards 0..k-1 first)
 *   qb(s,k) = max(qb(s-1,k) + b + h, qb(s,k+1) + b)
 *   qf(s,k) = max(qf(s+1,k) + f + h  [b + qb(S-1,k) at the last stage], qf(s,k+1) + f,
 *                 (m-k) b + (m-1-k) f + qb(s,m-1))  (the node's later tasks of the model, then
 *                                                   the last backward's own tail) */
static void chains(const ff_fuse_instance *in, int i, double *ef, double *eb, double *qf, double *qb);

/* From zero, the chains are these rules exactly. */
void fuse_heads_tails(const ff_fuse_instance *in, int i, double *ef, double *eb, double *qf, double *qb) {
    size_t n = (size_t)in->models[i].n_stages * (size_t)in->models[i].micro * sizeof(double);
    memset(ef, 0, n), memset(eb, 0, n), memset(qf, 0, n), memset(qb, 0, n);
    chains(in, i, ef, eb, qf, qb);
}

typedef struct job {
    double r, p, q;
} job;

static int by_release(const void *a, const void *b) {
    double x = ((const job *)a)->r, y = ((const job *)b)->r;
    return x < y ? -1 : x > y;
}

/* Jackson's preemptive schedule on one machine (the available job with the longest tail
 * runs, preempted when a longer tail is released): its max of end + tail is the least over
 * all preemptive schedules, so at most any non-preemptive one's. jobs sorted by release;
 * heap: [n] scratch. */
static double jackson(job *jobs, int64_t n, int64_t *heap) {
    int64_t hn = 0, next = 0;
    double t = 0, best = 0;
#define HQ(x) jobs[heap[x]].q
    while (next < n || hn) {
        if (!hn && jobs[next].r > t) t = jobs[next].r;
        while (next < n && jobs[next].r <= t) { /* push */
            int64_t x = hn++;
            heap[x] = next++;
            while (x && HQ((x - 1) / 2) < HQ(x)) {
                int64_t p = (x - 1) / 2, tmp = heap[p];
                heap[p] = heap[x], heap[x] = tmp, x = p;
            }
        }
        job *j = &jobs[heap[0]];
        double until = next < n ? jobs[next].r : INFINITY;
        if (t + j->p <= until) {
            t += j->p;
            if (t + j->q > best) best = t + j->q;
            heap[0] = heap[--hn]; /* pop */
            for (int64_t x = 0;;) {
                int64_t l = 2 * x + 1, rr = l + 1, m = x;
                if (l < hn && HQ(l) > HQ(m)) m = l;
                if (rr < hn && HQ(rr) > HQ(m)) m = rr;
                if (m == x) break;
                int64_t tmp = heap[m];
                heap[m] = heap[x], heap[x] = tmp, x = m;
            }
        } else {
            j->p -= until - t;
            t = until;
        }
    }
#undef HQ
    return best;
}

/* One task of a node, for the per-node propagation: model, item s m + k, forward or backward. */
typedef struct task_ref {
    int32_t model, item;
    bool bwd;
} task_ref;

typedef struct bounds_work {
    double *ht[FF_FUSE_MAX_MODELS][4];   /* ef, eb, qf, qb of each model: tightened at some T */
    double *base[FF_FUSE_MAX_MODELS][4]; /* the same, of each model alone (fuse_heads_tails) */
    task_ref *refs[FF_FUSE_MAX_NODES];   /* [n_refs[n]] the tasks of node n */
    int64_t n_refs[FF_FUSE_MAX_NODES];
    /* per-node scratch, [most tasks on a node] each */
    double *r, *p, *d, *nr, *rel, *suf, *pm, *sm;
    int64_t *by_r, *by_d;
    job *jobs;
    int64_t *heap;
} bounds_work;

static void work_free(bounds_work *w) {
    for (int i = 0; i < FF_FUSE_MAX_MODELS; i++)
        for (int a = 0; a < 4; a++) free(w->ht[i][a]), free(w->base[i][a]);
    for (int n = 0; n < FF_FUSE_MAX_NODES; n++) free(w->refs[n]);
    free(w->r), free(w->p), free(w->d), free(w->nr), free(w->rel), free(w->suf), free(w->pm), free(w->sm);
    free(w->by_r), free(w->by_d), free(w->jobs), free(w->heap);
    memset(w, 0, sizeof *w);
}

static int work_init(const ff_fuse_instance *in, bounds_work *w) {
    memset(w, 0, sizeof *w);
    for (int i = 0; i < in->n_models; i++) {
        size_t n = (size_t)in->models[i].n_stages * (size_t)in->models[i].micro;
        for (int a = 0; a < 4; a++)
            if (!(w->ht[i][a] = malloc(n * sizeof(double))) || !(w->base[i][a] = malloc(n * sizeof(double)))) return -1;
        fuse_heads_tails(in, i, w->base[i][0], w->base[i][1], w->base[i][2], w->base[i][3]);
        for (int a = 0; a < 4; a++) memcpy(w->ht[i][a], w->base[i][a], n * sizeof(double));
    }
    int64_t most = 1;
    for (int32_t n = 0; n < in->nodes; n++) {
        int64_t c = 0;
        for (int i = 0; i < in->n_models; i++)
            for (int32_t s = 0; s < in->models[i].n_stages; s++)
                if (in->models[i].stages[s] == n) c += 2 * (int64_t)in->models[i].micro;
        if (!c) continue;
        if (!(w->refs[n] = malloc((size_t)c * sizeof *w->refs[n]))) return -1;
        for (int i = 0; i < in->n_models; i++)
            for (int32_t s = 0; s < in->models[i].n_stages; s++) {
                if (in->models[i].stages[s] != n) continue;
                for (int32_t k = 0; k < in->models[i].micro; k++) {
                    int32_t x = s * in->models[i].micro + k;
                    w->refs[n][w->n_refs[n]++] = (task_ref){i, x, false};
                    w->refs[n][w->n_refs[n]++] = (task_ref){i, x, true};
                }
            }
        if (c > most) most = c;
    }
    size_t nd = (size_t)most * sizeof(double);
    if (!(w->r = malloc(nd)) || !(w->p = malloc(nd)) || !(w->d = malloc(nd)) || !(w->nr = malloc(nd)) || !(w->rel = malloc(nd)) ||
        !(w->suf = malloc(nd)) || !(w->pm = malloc(nd)) || !(w->sm = malloc(nd)) || !(w->by_r = malloc((size_t)most * sizeof(int64_t))) ||
        !(w->by_d = malloc((size_t)most * sizeof(int64_t))) || !(w->jobs = malloc((size_t)most * sizeof(job))) ||
        !(w->heap = malloc((size_t)most * sizeof(int64_t))))
        return -1;
    return 0;
}

/* ---- propagation at a makespan T ------------------------------------------------------- */

/* Every task has a window at T: it starts no sooner than its head r and ends no later than
 * d = T - its tail. Two kinds of reasoning narrow the windows, and each holds in every schedule
 * that ends by T, so a window that empties (or a node whose tasks cannot fit theirs) proves
 * that none does:
 * - the chains: a micro-batch's steps in order, a model's forwards (and backwards) on a node in
 *   micro-batch order, a backward after its forward and after the node's earlier tasks of its
 *   model (fuse_heads_tails' rules, now over the narrowed windows of the others);
 * - edge finding on each node (one machine): if a task i cannot run before all of a set O of
 *   the node's other tasks (min(r_i, r_O) + p_i + p_O > max d_O), it runs after all of them,
 *   so it starts no sooner than O's earliest completion, max over O' in O of r_O' + p_O'. The
 *   sets tried are O = {j : d_j <= D, r_j >= rho} for every deadline D and release rho (the
 *   ones that decide the rule), and the same in mirrored time for the tails. A set whose own
 *   work cannot fit between its earliest release and D proves T infeasible.
 * The propagation repeats until nothing moves (or a pass limit). Windows only narrow, so the
 * bounds built on them (the peak bound) hold at T. */

static int by_value(const double *v, const int64_t *a, const int64_t *b) {
    return v[*a] < v[*b] ? -1 : v[*a] > v[*b];
}

static _Thread_local const double *tl_key; /* by_key's values: qsort takes no context */
static int by_key(const void *a, const void *b) { return by_value(tl_key, a, b); }

/* Edge finding over one node's tasks r, p, d [n] (heads side): nr[j] receives each new head
 * (>= r[j]). 1 if the node cannot fit its tasks (T refuted), else 0. */
static int edge_find(bounds_work *w, int64_t n, double eps) {
    double *r = w->r, *p = w->p, *d = w->d, *nr = w->nr;
    for (int64_t j = 0; j < n; j++) w->by_r[j] = w->by_d[j] = j, nr[j] = r[j];
    tl_key = r;
    qsort(w->by_r, (size_t)n, sizeof(int64_t), by_key);
    tl_key = d;
    qsort(w->by_d, (size_t)n, sizeof(int64_t), by_key);
    for (int64_t e = 0; e < n; e++) {
        double D = d[w->by_d[e]];
        if (e + 1 < n && d[w->by_d[e + 1]] <= D + eps) continue; /* the last of equal deadlines: the whole set */
        /* O = {d_j <= D} in release order: rel[x], suf[x] the work of x.., A = rel + suf */
        int64_t c = 0;
        for (int64_t y = 0; y < n; y++) {
            int64_t j = w->by_r[y];
            if (d[j] <= D + eps) w->rel[c] = r[j], w->suf[c++] = p[j];
        }
        for (int64_t x = c - 2; x >= 0; x--) w->suf[x] += w->suf[x + 1];
        for (int64_t x = 0; x < c; x++) {
            double A = w->rel[x] + w->suf[x];
            if (A > D + eps) return 1; /* O's own work does not fit before D */
            w->pm[x] = x ? fmax(w->pm[x - 1], A) : A;
        }
        for (int64_t x = c - 1; x >= 0; x--) w->sm[x] = fmax(w->rel[x] + w->suf[x], x + 1 < c ? w->sm[x + 1] : -INFINITY);
        for (int64_t i = 0; i < n; i++) {
            if (d[i] <= D + eps) continue;
            double need = D - p[i] + eps;
            int64_t lo = 0, hi = c; /* the first x with pm[x] > need */
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (w->pm[mid] > need) hi = mid;
                else lo = mid + 1;
            }
            if (lo < c && w->rel[lo] <= r[i] + eps) {
                nr[i] = fmax(nr[i], w->sm[lo]);
                continue;
            }
            lo = 0, hi = c; /* the first x with rel[x] > r_i: O = those released after i */
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (w->rel[mid] > r[i] + eps) hi = mid;
                else lo = mid + 1;
            }
            if (lo < c && r[i] + p[i] + w->suf[lo] > D + eps) nr[i] = fmax(nr[i], w->sm[lo]);
        }
    }
    return 0;
}

/* The chains of model i over its current windows (fuse_heads_tails' rules, each a max with the
 * value there); heads forward, tails backward. */
static void chains(const ff_fuse_instance *in, int i, double *ef, double *eb, double *qf, double *qb) {
    const ff_fuse_model *md = &in->models[i];
    const int32_t S = md->n_stages, m = md->micro;
    const double f = md->fwd, b = md->bwd, h = in->hop_latency;
#define AT(a, s, k) a[(int64_t)(s) * m + (k)]
    for (int32_t s = 0; s < S; s++)
        for (int32_t k = 0; k < m; k++) {
            double v = AT(ef, s, k);
            if (s > 0) v = fmax(v, AT(ef, s - 1, k) + f + h);
            if (k > 0) v = fmax(v, AT(ef, s, k - 1) + f);
            AT(ef, s, k) = v;
        }
    for (int32_t s = S - 1; s >= 0; s--)
        for (int32_t k = 0; k < m; k++) {
            double v = fmax(AT(eb, s, k), s == S - 1 ? AT(ef, s, k) + f : AT(eb, s + 1, k) + b + h);
            if (k > 0) v = fmax(v, AT(eb, s, k - 1) + b);
            v = fmax(v, AT(ef, s, 0) + (k + 1) * f + k * b);
            AT(eb, s, k) = v;
        }
    for (int32_t s = 0; s < S; s++)
        for (int32_t k = m - 1; k >= 0; k--) {
            double v = AT(qb, s, k);
            if (s > 0) v = fmax(v, AT(qb, s - 1, k) + b + h);
            if (k < m - 1) v = fmax(v, AT(qb, s, k + 1) + b);
            AT(qb, s, k) = v;
        }
    for (int32_t s = S - 1; s >= 0; s--)
        for (int32_t k = m - 1; k >= 0; k--) {
            double v = fmax(AT(qf, s, k), s == S - 1 ? b + AT(qb, s, k) : AT(qf, s + 1, k) + f + h);
            if (k < m - 1) v = fmax(v, AT(qf, s, k + 1) + f);
            v = fmax(v, (m - k) * b + (m - 1 - k) * f + AT(qb, s, m - 1));
            AT(qf, s, k) = v;
        }
#undef AT
}

#define MAX_PASSES 64

/* Narrow w->ht to the windows at T, from the models alone (w->base). 1 if that proves that no
 * schedule ends by T, else 0 (w->ht then holds for every schedule that does). */
static int tighten(const ff_fuse_instance *in, bounds_work *w, double T) {
    const double eps = 1e-9 * fmax(T, 1);
    for (int i = 0; i < in->n_models; i++) {
        size_t n = (size_t)in->models[i].n_stages * (size_t)in->models[i].micro;
        for (int a = 0; a < 4; a++) memcpy(w->ht[i][a], w->base[i][a], n * sizeof(double));
    }
    for (int pass = 0; pass < MAX_PASSES; pass++) {
        bool moved = false;
        for (int i = 0; i < in->n_models; i++) chains(in, i, w->ht[i][0], w->ht[i][1], w->ht[i][2], w->ht[i][3]);
        for (int32_t nd = 0; nd < in->nodes; nd++) {
            int64_t n = w->n_refs[nd];
            if (!n) continue;
            for (int side = 0; side < 2; side++) { /* 0: heads; 1: tails, as heads in mirrored time */
                for (int64_t j = 0; j < n; j++) {
                    task_ref t = w->refs[nd][j];
                    const ff_fuse_model *md = &in->models[t.model];
                    double head = w->ht[t.model][t.bwd][t.item], tail = w->ht[t.model][2 + t.bwd][t.item];
                    w->p[j] = t.bwd ? md->bwd : md->fwd;
                    w->r[j] = side ? tail : head;
                    w->d[j] = T - (side ? head : tail);
                    if (w->r[j] + w->p[j] > w->d[j] + eps) return 1; /* its window is empty */
                }
                if (edge_find(w, n, eps)) return 1;
                for (int64_t j = 0; j < n; j++) {
                    if (w->nr[j] <= w->r[j] + eps) continue;
                    task_ref t = w->refs[nd][j];
                    w->ht[t.model][(side ? 2 : 0) + t.bwd][t.item] = w->nr[j];
                    moved = true;
                }
            }
            int64_t nj = 0; /* Jackson's preemptive bound over the narrowed windows */
            for (int64_t j = 0; j < n; j++) {
                task_ref t = w->refs[nd][j];
                const ff_fuse_model *md = &in->models[t.model];
                w->jobs[nj++] = (job){w->ht[t.model][t.bwd][t.item], t.bwd ? md->bwd : md->fwd, w->ht[t.model][2 + t.bwd][t.item]};
            }
            qsort(w->jobs, (size_t)nj, sizeof *w->jobs, by_release);
            if (jackson(w->jobs, nj, w->heap) > T + eps) return 1;
        }
        if (!moved) break;
    }
    return 0;
}

/* Without the per-task heads and tails (out of memory): each model's own 1F1B critical path. */
static double makespan_fallback(const ff_fuse_instance *in) {
    double best = 0;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        best = fmax(best, (m->n_stages - 1 + m->micro) * (m->fwd + m->bwd) + 2 * (m->n_stages - 1) * in->hop_latency);
    }
    return best;
}

static double makespan_bound(const ff_fuse_instance *in, const bounds_work *w) {
    int64_t most = 0;
    for (int i = 0; i < in->n_models; i++) most += 2 * (int64_t)in->models[i].micro;
    job *jobs = malloc((size_t)most * sizeof *jobs);
    int64_t *heap = malloc((size_t)most * sizeof *heap);
    if (!jobs || !heap) {
        free(jobs);
        free(heap);
        return makespan_fallback(in);
    }
    double best = 0;
    for (int32_t n = 0; n < in->nodes; n++) {
        int64_t nj = 0;
        for (int i = 0; i < in->n_models; i++) {
            const ff_fuse_model *md = &in->models[i];
            for (int32_t s = 0; s < md->n_stages; s++) {
                if (md->stages[s] != n) continue;
                for (int32_t k = 0; k < md->micro; k++) {
                    int64_t x = (int64_t)s * md->micro + k;
                    jobs[nj++] = (job){w->ht[i][0][x], md->fwd, w->ht[i][2][x]};
                    jobs[nj++] = (job){w->ht[i][1][x], md->bwd, w->ht[i][3][x]};
                }
            }
        }
        if (!nj) continue;
        qsort(jobs, (size_t)nj, sizeof *jobs, by_release);
        best = fmax(best, jackson(jobs, nj, heap));
    }
    free(jobs);
    free(heap);
    return best;
}

/* #{k < n : a[k] + add <= t} (strict: < t) of an ascending a */
static int32_t count_upto(const double *a, int32_t n, double add, double t, bool strict) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (strict ? a[mid] + add < t : a[mid] + add <= t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

typedef struct node_view {
    int n_on;
    const ff_fuse_model *m[FF_FUSE_MAX_MODELS];
    const double *eb[FF_FUSE_MAX_MODELS], *qf[FF_FUSE_MAX_MODELS]; /* the model's stage on the node: [m] */
    double work, q_min;        /* the node's total work; the least tail of any of its tasks */
} node_view;

/* The memory of node v at time t in any schedule that ends by T, from below. The tasks that
 * started by t are a prefix of the node's list, so the memory then, sum over its models of
 * act x (forwards started - backwards started), is at most the node's peak. What binds it:
 * - a forward whose latest end T - qf is <= t has started (at least done_f of them);
 * - at most u backwards can have started, those whose earliest start eb is <= t (< t when
 *   strict: just before the next one may start);
 * - the tasks not started by t must all run after t and end by T - (the least tail), so at
 *   least R = work - (T - q_min - t) of the node's work has started.
 * The least memory under these (forwards up to u of a model cost nothing, their backwards
 * matching them; further work is bought by forwards, f work for act memory each, the best
 * ratio first, as fractions) is a lower bound; so is, at the prefix done by t, act x (the
 * forwards that must be done - the backwards that can be). */
static double memory_at(const node_view *v, double T, double t, bool strict) {
    double need = v->work - (T - v->q_min - t), mem = 0, done_mem = 0;
    double F[FF_FUSE_MAX_MODELS], room[FF_FUSE_MAX_MODELS];
    for (int a = 0; a < v->n_on; a++) {
        const ff_fuse_model *m = v->m[a];
        int32_t lo = 0, hi = m->micro;
        while (lo < hi) { /* forwards with T - qf <= t (qf descends in k) */
            int32_t mid = (lo + hi) / 2;
            if (T - v->qf[a][mid] <= t) lo = mid + 1;
            else hi = mid;
        }
        double done_f = lo, u = count_upto(v->eb[a], m->micro, 0, t, strict);
        /* the tasks done by t are a prefix too: forwards done - backwards that can be done */
        done_mem += m->act * fmax(0, done_f - count_upto(v->eb[a], m->micro, m->bwd, t, false));
        F[a] = fmax(done_f, u);
        mem += m->act * (F[a] - u);
        need -= m->fwd * F[a] + m->bwd * u;
        room[a] = m->micro - F[a];
    }
    while (need > 0) { /* buy forwards, most work per memory first */
        int best = -1;
        for (int a = 0; a < v->n_on; a++)
            if (room[a] > 0 && (best < 0 || v->m[a]->fwd * v->m[best]->act > v->m[best]->fwd * v->m[a]->act)) best = a;
        if (best < 0) break; /* T is below the makespan bound: no schedule; what was bought stands */
        double units = fmin(room[best], need / v->m[best]->fwd);
        mem += units * v->m[best]->act;
        need -= units * v->m[best]->fwd;
        room[best] -= units;
    }
    return fmax(mem, done_mem);
}

/* Could model md's stage s keep at most c micro-batches in flight and still end by T? The
 * forwards there start at a_0 < a_1 < ... with a_k in [ef_k, T - qf_k - f], a_k >= a_{k-1} + f,
 * and micro-batch k's backward there can end no sooner than a_k + G (G: the round trip from
 * the forward's start through the later stages and back, plus the backward itself); the
 * micro-batches k .. k+c are all in flight when forward k+c starts unless a_{k+c} >= a_k + G.
 * The earliest such starts (greedy) meet every deadline iff any do. a: [m] scratch. */
static bool in_flight_feasible(const ff_fuse_model *md, const double *ef, const double *qf, double T, double G, int32_t c, double *a) {
    double eps = 1e-9 * fmax(T, 1);
    for (int32_t k = 0; k < md->micro; k++) {
        double x = ef[k];
        if (k > 0) x = fmax(x, a[k - 1] + md->fwd);
        if (k >= c) x = fmax(x, a[k - c] + G);
        if (x > T - qf[k] - md->fwd + eps) return false;
        a[k] = x;
    }
    return true;
}

/* The fewest micro-batches of model i that must be in flight at some time on the node of its
 * stage s in a schedule that ends by T (1F1B alone at its own makespan: S - s). */
static int32_t least_in_flight(const ff_fuse_instance *in, const bounds_work *w, int i, int32_t s, double T, double *a) {
    const ff_fuse_model *md = &in->models[i];
    int64_t o = (int64_t)s * md->micro;
    int32_t S = md->n_stages, lo = 1, hi = md->micro;
    double G = (S - s) * md->fwd + (S - 1 - s) * (md->bwd + 2 * in->hop_latency) + md->bwd;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (in_flight_feasible(md, w->ht[i][0] + o, w->ht[i][2] + o, T, G, mid, a)) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* The peak bound at makespan T: the most, over the nodes and models, of act x the fewest
 * micro-batches in flight (least_in_flight), and of memory_at over the times where it can be
 * highest (where a backward may first start, from the left, and where a forward must have
 * started). */
static double peak_bound(const ff_fuse_instance *in, const bounds_work *w, double T) {
    double best = 0;
    int32_t most = 1;
    for (int i = 0; i < in->n_models; i++) {
        best = fmax(best, in->models[i].act);
        if (in->models[i].micro > most) most = in->models[i].micro;
    }
    double *a = malloc((size_t)most * sizeof *a);
    for (int i = 0; a && i < in->n_models; i++)
        for (int32_t s = 0; s < in->models[i].n_stages; s++) best = fmax(best, in->models[i].act * least_in_flight(in, w, i, s, T, a));
    free(a);
    for (int32_t n = 0; n < in->nodes; n++) {
        node_view v = {.q_min = INFINITY};
        for (int i = 0; i < in->n_models; i++)
            for (int32_t s = 0; s < in->models[i].n_stages; s++) {
                if (in->models[i].stages[s] != n) continue;
                const ff_fuse_model *m = &in->models[i];
                int64_t o = (int64_t)s * m->micro;
                v.m[v.n_on] = m;
                v.eb[v.n_on] = w->ht[i][1] + o;
                v.qf[v.n_on++] = w->ht[i][2] + o;
                v.work += m->micro * (m->fwd + m->bwd);
                for (int32_t k = 0; k < m->micro; k++) v.q_min = fmin(v.q_min, fmin(w->ht[i][2][o + k], w->ht[i][3][o + k]));
            }
        for (int a = 0; a < v.n_on; a++)
            for (int32_t k = 0; k < v.m[a]->micro; k++) {
                best = fmax(best, memory_at(&v, T, v.eb[a][k], true));
                best = fmax(best, memory_at(&v, T, T - v.qf[a][k], false));
            }
    }
    return best;
}

/* The unit every duration is a multiple of (then so is every schedule's makespan), or 0. */
static double time_unit(const ff_fuse_instance *in) {
    static const double units[] = {1, 0.5, 0.25, 0.2, 0.1, 0.05, 0.01, 0.001};
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
        bool all = true;
        double v[2 * FF_FUSE_MAX_MODELS + 1];
        int nv = 0;
        v[nv++] = in->hop_latency;
        for (int i = 0; i < in->n_models; i++) v[nv++] = in->models[i].fwd, v[nv++] = in->models[i].bwd;
        for (int x = 0; x < nv && all; x++) {
            double q = v[x] / units[u];
            all = fabs(q - nearbyint(q)) <= 1e-9 * fmax(1, q);
        }
        if (all) return units[u];
    }
    return 0;
}

/* w->ht at T for the peak bound: tightened, or the models' own where T is refuted (no schedule
 * ends by T; the bound is then only asked of a T below the makespan bound, by a caller's choice). */
static void windows_at(const ff_fuse_instance *in, bounds_work *w, double T) {
    if (tighten(in, w, T))
        for (int i = 0; i < in->n_models; i++) {
            size_t n = (size_t)in->models[i].n_stages * (size_t)in->models[i].micro;
            for (int a = 0; a < 4; a++) memcpy(w->ht[i][a], w->base[i][a], n * sizeof(double));
        }
}

/* The makespan bound: Jackson's over the models' own windows, then, where the durations share a
 * unit, the least multiple of it that the propagation does not refute (the one below it is
 * refuted: no schedule ends by then). Leaves w->ht tightened at the result. */
static double makespan_search(const ff_fuse_instance *in, bounds_work *w) {
    double lb = makespan_bound(in, w), u = time_unit(in);
    if (u <= 0) {
        windows_at(in, w, lb);
        return lb;
    }
    double lo = ceil(lb / u - 1e-9) * u;
    if (!tighten(in, w, lo)) return lo;
    /* lo refuted: double the step until a T is not, then halve back (refuted < T <= ok) */
    double bad = lo, ok = lo, step = u;
    for (int g = 0; g < 60; g++, step *= 2) {
        ok = lo + step;
        if (!tighten(in, w, ok)) break;
        bad = ok;
    }
    while (ok - bad > u * 1.5) {
        double mid = bad + floor((ok - bad) / u / 2) * u;
        if (tighten(in, w, mid)) bad = mid;
        else ok = mid;
    }
    tighten(in, w, ok);
    return ok;
}

int fuse_refutes(const ff_fuse_instance *in, double T) {
    bounds_work w;
    int rc = -1;
    if (work_init(in, &w) == 0) rc = tighten(in, &w, T);
    else ff_error_set("fuse bounds", "a smaller instance", "out of memory");
    work_free(&w);
    return rc;
}

int fuse_least_in_flight(const ff_fuse_instance *in, double T, int32_t out[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]) {
    bounds_work w;
    int32_t most = 1;
    for (int i = 0; i < in->n_models; i++)
        if (in->models[i].micro > most) most = in->models[i].micro;
    double *a = ff_malloc((size_t)most * sizeof *a);
    int rc = -1;
    if (a && work_init(in, &w) == 0) {
        windows_at(in, &w, T);
        for (int i = 0; i < in->n_models; i++)
            for (int32_t s = 0; s < in->models[i].n_stages; s++) out[i][in->models[i].stages[s]] = least_in_flight(in, &w, i, s, T, a);
        rc = 0;
    }
    work_free(&w);
    free(a);
    return rc;
}

void ff_fuse_lower_bounds(const ff_fuse_instance *in, double *makespan, double *peak_activation) {
    bounds_work w;
    double mk = makespan_fallback(in), pk = 0;
    for (int i = 0; i < in->n_models; i++) pk = fmax(pk, in->models[i].act);
    if (work_init(in, &w) == 0) {
        mk = makespan_search(in, &w);
        pk = peak_bound(in, &w, mk);
    }
    work_free(&w);
    if (makespan) *makespan = mk;
    if (peak_activation) *peak_activation = pk;
}

double ff_fuse_peak_bound(const ff_fuse_instance *in, double makespan) {
    bounds_work w;
    double pk = 0;
    for (int i = 0; i < in->n_models; i++) pk = fmax(pk, in->models[i].act);
    if (work_init(in, &w) == 0) {
        windows_at(in, &w, makespan);
        pk = peak_bound(in, &w, makespan);
    }
    work_free(&w);
    return pk;
}

