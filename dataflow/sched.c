/* The scheduling view of a graph for one iteration (include/fuseflow/graph.h): which tasks
 * are ready given which columns exist for which samples.
 *
 *   sample nodes       a task per sample, as soon as its inputs exist
 *   micro_batch nodes  a task per micro_batch_size ready samples; the rest when no other
 *                      sample can still become ready
 *   group nodes        a task per group, when every live sample of the group is ready
 *   batch nodes        one task over all live samples, when all are ready and the batch is
 *                      complete (a barrier)
 *   serial schedule    additionally, a node starts only when every node before it in the
 *                      topological order has finished (stage after stage: the baseline)
 *
 * Dynamic sampling: filter nodes drop whole groups; the batch is complete when as many groups
 * passed every filter as the iteration started with (surplus ones are dropped), or when the
 * executor says the prompts ran out.
 *
 * Bookkeeping is per sample with bitmasks (at most 64 columns and 64 nodes), updated when a
 * task completes, so finding the next task does not rescan every sample.
 *
 * Not here: dispatching to workers, timing, data (the executor's). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/util.h"

typedef struct queue {
    int64_t *v;
    int64_t head, n, cap;
} queue;

typedef struct task_rec {
    ff_sched_task t;
    int64_t *samples;
    bool active;
} task_rec;

struct ff_sched {
    const ff_graph *g;
    int N;
    ff_schedule mode;
    int64_t group_size;
    uint64_t need[64], after[64], outs[64], data_cols;
    int64_t mb[64];
    int n_filters;
    uint64_t filter_nodes;
    /* samples */
    int64_t n_samples, cap;
    uint64_t *cols, *ok, *disp, *done; /* [cap] */
    bool *dead;
    int64_t n_alive;
    /* groups */
    int64_t n_groups, gcap;
    uint64_t *gqueued, *gdisp; /* [gcap] */
    int *gpassed;
    bool *gdead;
    int64_t n_alive_groups, n_passed_groups, target_groups;
    bool exhausted;
    /* per node */
    int64_t n_ok[64], n_disp[64], n_done[64];
    bool batch_disp[64], batch_done[64];
    queue q[64];
    /* tasks */
    task_rec **tasks; /* each its own allocation: handed-out ff_sched_task pointers stay put */
    int64_t n_tasks, tcap, in_flight;
};

static int q_push(queue *q, int64_t x) {
    if (q->head + q->n == q->cap) {
        if (q->head > 0) {
            memmove(q->v, q->v + q->head, (size_t)q->n * sizeof *q->v);
            q->head = 0;
        }
        if (q->n == q->cap) {
            int64_t cap = q->cap ? q->cap * 2 : 64;
            int64_t *v = ff_realloc(q->v, (size_t)cap * sizeof *v);
            if (!v) return -1;
            q->v = v, q->cap = cap;
        }
    }
    q->v[q->head + q->n++] = x;
    return 0;
}

static int grow_samples(ff_sched *s, int64_t need) {
    if (need <= s->cap) return 0;
    int64_t cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    uint64_t *a[4] = {s->cols, s->ok, s->disp, s->done};
    for (int i = 0; i < 4; i++) {
        uint64_t *p = ff_realloc(a[i], (size_t)cap * sizeof *p);
        if (!p) return -1;
        a[i] = p;
    }
    s->cols = a[0], s->ok = a[1], s->disp = a[2], s->done = a[3];
    bool *d = ff_realloc(s->dead, (size_t)cap * sizeof *d);
    if (!d) return -1;
    s->dead = d;
    s->cap = cap;
    return 0;
}

static int grow_groups(ff_sched *s, int64_t need) {
    if (need <= s->gcap) return 0;
    int64_t cap = s->gcap ? s->gcap : 16;
    while (cap < need) cap *= 2;
    uint64_t *a = ff_realloc(s->gqueued, (size_t)cap * sizeof *a);
    if (!a) return -1;
    s->gqueued = a;
    uint64_t *b = ff_realloc(s->gdisp, (size_t)cap * sizeof *b);
    if (!b) return -1;
    s->gdisp = b;
    int *c = ff_realloc(s->gpassed, (size_t)cap * sizeof *c);
    if (!c) return -1;
    s->gpassed = c;
    bool *d = ff_realloc(s->gdead, (size_t)cap * sizeof *d);
    if (!d) return -1;
    s->gdead = d;
    s->gcap = cap;
    return 0;
}

static const ff_node *node(const ff_sched *s, int m) { return ff_graph_node(s->g, (size_t)m); }

/* The unit the scheduler uses: training draws its mini-batches from the whole batch (the
 * barrier RLHFuse keeps), so a train node is a batch task that the executor splits into
 * mini- and micro-batches. */
static ff_granularity unit(const ff_sched *s, int m) {
    const ff_node *n = node(s, m);
    return n->op == FF_OP_TRAIN ? FF_GRAN_BATCH : n->gran;
}

/* Is every live sample of group g ready for node m? */
static bool group_ready(const ff_sched *s, int64_t g, int m) {
    bool any = false;
    for (int64_t i = g * s->group_size; i < (g + 1) * s->group_size; i++) {
        if (s->dead[i]) continue;
        if (!(s->ok[i] >> m & 1)) return false;
        any = true;
    }
    return any;
}

/* Re-check sample i against every node whose inputs it did not yet have. */
static int evaluate(ff_sched *s, int64_t i) {
    if (s->dead[i]) return 0;
    for (int m = 0; m < s->N; m++) {
        uint64_t bit = 1ull << m;
        if ((s->ok[i] & bit) || (s->cols[i] & s->need[m]) != s->need[m] || (s->done[i] & s->after[m]) != s->after[m]) continue;
        s->ok[i] |= bit;
        s->n_ok[m]++;
        ff_granularity gr = unit(s, m);
        if (gr == FF_GRAN_SAMPLE || gr == FF_GRAN_MICRO_BATCH) {
            if (q_push(&s->q[m], i)) return -1;
        } else if (gr == FF_GRAN_GROUP) {
            int64_t g = i / s->group_size;
            if (!(s->gqueued[g] & bit) && group_ready(s, g, m)) {
                s->gqueued[g] |= bit;
                if (q_push(&s->q[m], g)) return -1;
            }
        }
    }
    return 0;
}

static void kill_sample(ff_sched *s, int64_t i) {
    if (s->dead[i]) return;
    s->dead[i] = true;
    s->n_alive--;
    for (int m = 0; m < s->N; m++) {
        uint64_t bit = 1ull << m;
        s->n_ok[m] -= (s->ok[i] & bit) != 0;
        s->n_disp[m] -= (s->disp[i] & bit) != 0;
        s->n_done[m] -= (s->done[i] & bit) != 0;
    }
}

static void kill_group(ff_sched *s, int64_t g) {
    if (s->gdead[g]) return;
    s->gdead[g] = true;
    s->n_alive_groups--;
    for (int64_t i = g * s->group_size; i < (g + 1) * s->group_size; i++) kill_sample(s, i);
}

static int add_groups(ff_sched *s, int64_t k) {
    int64_t g0 = s->n_groups, n0 = s->n_samples;
    if (grow_groups(s, g0 + k) || grow_samples(s, n0 + k * s->group_size)) return -1;
    for (int64_t g = g0; g < g0 + k; g++) {
        s->gqueued[g] = s->gdisp[g] = 0;
        s->gpassed[g] = 0;
        s->gdead[g] = false;
    }
    for (int64_t i = n0; i < n0 + k * s->group_size; i++) {
        s->cols[i] = s->data_cols;
        s->ok[i] = s->disp[i] = s->done[i] = 0;
        s->dead[i] = false;
    }
    s->n_groups += k, s->n_samples += k * s->group_size;
    s->n_alive += k * s->group_size, s->n_alive_groups += k;
    for (int64_t i = n0; i < s->n_samples; i++)
        if (evaluate(s, i)) return -1;
    return 0;
}

ff_sched *ff_sched_new(const ff_graph *g, int64_t n_groups, int64_t group_size, ff_schedule schedule) {
    if (!ff_graph_order(g)) {
        ff_error_set("scheduler", "call ff_graph_validate first", "the graph is not validated");
        return NULL;
    }
    if (n_groups < 1 || group_size < 1) {
        ff_error_set("scheduler", NULL, "an iteration needs at least one group of at least one sample");
        return NULL;
    }
    ff_sched *s = ff_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = g;
    s->N = (int)ff_graph_n_nodes(g);
    s->mode = schedule;
    s->group_size = group_size;
    for (size_t c = 0; c < ff_graph_n_columns(g); c++)
        if (ff_graph_column(g, c)->from_data) s->data_cols |= 1ull << c;
    for (int m = 0; m < s->N; m++) {
        const ff_node *n = node(s, m);
        for (int sl = 0; sl < FF_SLOT_COUNT; sl++) {
            if (n->in[sl] >= 0) s->need[m] |= 1ull << n->in[sl];
            if (n->out[sl] >= 0) s->outs[m] |= 1ull << n->out[sl];
        }
        for (int k = 0; k < n->n_after; k++) s->after[m] |= 1ull << n->after[k];
        s->mb[m] = n->micro_batch_size > 0 ? n->micro_batch_size : 8;
        if (n->op == FF_OP_FILTER) s->n_filters++, s->filter_nodes |= 1ull << m;
    }
    s->target_groups = n_groups;
    if (add_groups(s, n_groups)) {
        ff_sched_destroy(&s);
        return NULL;
    }
    return s;
}

void ff_sched_destroy(ff_sched **ps) {
    if (!ps || !*ps) return;
    ff_sched *s = *ps;
    free(s->cols), free(s->ok), free(s->disp), free(s->done), free(s->dead);
    free(s->gqueued), free(s->gdisp), free(s->gpassed), free(s->gdead);
    for (int m = 0; m < 64; m++) free(s->q[m].v);
    for (int64_t t = 0; t < s->n_tasks; t++) {
        free(s->tasks[t]->samples);
        free(s->tasks[t]);
    }
    free(s->tasks);
    free(s);
    *ps = NULL;
}

static bool batch_complete(const ff_sched *s) {
    return !s->n_filters || s->exhausted || s->n_passed_groups >= s->target_groups;
}

/* Done for every live sample so far. With dynamic sampling, added groups can make a node
 * incomplete again (a serial schedule then goes back to it: generate, filter, generate more). */
static bool node_complete(const ff_sched *s, int m) {
    if (unit(s, m) == FF_GRAN_BATCH) return s->batch_done[m];
    return s->n_done[m] == s->n_alive;
}

bool ff_sched_finished(const ff_sched *s) {
    if (!batch_complete(s)) return false;
    for (int m = 0; m < s->N; m++)
        if (!node_complete(s, m)) return false;
    return true;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int make_task(ff_sched *s, int m, int64_t group, int64_t *samples, int64_t n, const ff_sched_task **out) {
    if (s->n_tasks == s->tcap) {
        int64_t cap = s->tcap ? s->tcap * 2 : 64;
        task_rec **t = ff_realloc(s->tasks, (size_t)cap * sizeof *t);
        if (!t) {
            free(samples);
            return -1;
        }
        s->tasks = t, s->tcap = cap;
    }
    task_rec *r = ff_calloc(1, sizeof *r);
    if (!r) {
        free(samples);
        return -1;
    }
    qsort(samples, (size_t)n, sizeof *samples, cmp_i64);
    uint64_t bit = 1ull << m;
    for (int64_t k = 0; k < n; k++) {
        s->disp[samples[k]] |= bit;
        s->n_disp[m]++;
    }
    s->tasks[s->n_tasks] = r;
    r->samples = samples;
    r->active = true;
    r->t = (ff_sched_task){s->n_tasks, m, unit(s, m), group, samples, n};
    s->n_tasks++;
    s->in_flight++;
    *out = &r->t;
    return 1;
}

/* The next task of node m, if one is ready: 1, 0, or -1. */
static int next_of(ff_sched *s, int m, const ff_sched_task **out) {
    queue *q = &s->q[m];
    uint64_t bit = 1ull << m;
    switch (unit(s, m)) {
    case FF_GRAN_SAMPLE:
        while (q->n) {
            int64_t i = q->v[q->head++];
            q->n--;
            if (s->dead[i] || (s->disp[i] & bit)) continue;
            int64_t *one = ff_malloc(sizeof *one);
            if (!one) return -1;
            *one = i;
            return make_task(s, m, -1, one, 1, out);
        }
        return 0;
    case FF_GRAN_GROUP:
        while (q->n) {
            int64_t g = q->v[q->head++];
            q->n--;
            if (s->gdead[g] || (s->gdisp[g] & bit)) continue;
            s->gdisp[g] |= bit;
            int64_t *v = ff_malloc((size_t)s->group_size * sizeof *v), k = 0;
            if (!v) return -1;
            for (int64_t i = g * s->group_size; i < (g + 1) * s->group_size; i++)
                if (!s->dead[i]) v[k++] = i;
            return make_task(s, m, g, v, k, out);
        }
        return 0;
    case FF_GRAN_MICRO_BATCH: {
        /* drop dead or dispatched entries, then take a full micro-batch or the last one */
        int64_t live = 0;
        for (int64_t k = 0; k < q->n; k++) {
            int64_t i = q->v[q->head + k];
            if (!s->dead[i] && !(s->disp[i] & bit)) q->v[q->head + live++] = i;
        }
        q->n = live;
        if (!live) return 0;
        int64_t remaining = s->n_alive - s->n_disp[m];
        if (live < s->mb[m] && live < remaining) return 0;
        int64_t k = live < s->mb[m] ? live : s->mb[m];
        int64_t *v = ff_malloc((size_t)k * sizeof *v);
        if (!v) return -1;
        memcpy(v, q->v + q->head, (size_t)k * sizeof *v);
        q->head += k, q->n -= k;
        return make_task(s, m, -1, v, k, out);
    }
    case FF_GRAN_BATCH: {
        if (s->batch_disp[m] || s->n_ok[m] != s->n_alive || !batch_complete(s)) return 0;
        s->batch_disp[m] = true;
        int64_t *v = ff_malloc((size_t)(s->n_alive ? s->n_alive : 1) * sizeof *v), k = 0;
        if (!v) return -1;
        for (int64_t i = 0; i < s->n_samples; i++)
            if (!s->dead[i]) v[k++] = i;
        return make_task(s, m, -1, v, k, out);
    }
    default:
        return 0;
    }
}

int ff_sched_next(ff_sched *s, const ff_sched_task **out) {
    const int *order = ff_graph_order(s->g);
    for (int k = 0; k < s->N; k++) {
        int m = order[k];
        int rc = next_of(s, m, out);
        if (rc) return rc;
        if (s->mode == FF_SCHED_SERIAL && !node_complete(s, m)) break; /* later stages wait */
    }
    if (s->in_flight || ff_sched_finished(s)) return 0;
    for (int k = 0; k < s->N; k++) {
        int m = order[k];
        if (node_complete(s, m)) continue;
        int64_t want = ff_sched_groups_wanted(s);
        if (want > 0)
            return ff_error_set("scheduler", "add groups with ff_sched_add_groups, or call ff_sched_source_exhausted",
                                "node '%s' waits for %lld more groups to fill the batch", node(s, m)->name, (long long)want);
        return ff_error_set("scheduler", "a task was not completed, or the graph cannot make progress",
                            "nothing is ready and nothing runs, but node '%s' has not finished (%lld of %lld samples done)",
                            node(s, m)->name, (long long)s->n_done[m], (long long)s->n_alive);
    }
    return 0;
}

static task_rec *take(ff_sched *s, int64_t id) {
    if (id < 0 || id >= s->n_tasks || !s->tasks[id]->active) {
        ff_error_set("scheduler", "complete each dispatched task once", "unknown or finished task %lld", (long long)id);
        return NULL;
    }
    task_rec *r = s->tasks[id];
    r->active = false;
    s->in_flight--;
    return r;
}

static int finish(ff_sched *s, task_rec *r) {
    int m = r->t.node;
    uint64_t bit = 1ull << m;
    if (r->t.gran == FF_GRAN_BATCH) s->batch_done[m] = true;
    for (int64_t k = 0; k < r->t.n_samples; k++) {
        int64_t i = r->samples[k];
        if (s->dead[i]) continue;
        s->cols[i] |= s->outs[m];
        if (!(s->done[i] & bit)) s->done[i] |= bit, s->n_done[m]++;
    }
    for (int64_t k = 0; k < r->t.n_samples; k++)
        if (evaluate(s, r->samples[k])) return -1;
    free(r->samples);
    r->samples = NULL;
    r->t.samples = NULL;
    return 0;
}

int ff_sched_complete(ff_sched *s, int64_t id) {
    if (id >= 0 && id < s->n_tasks && s->tasks[id]->active && node(s, s->tasks[id]->t.node)->op == FF_OP_FILTER)
        return ff_error_set(node(s, s->tasks[id]->t.node)->name, "use ff_sched_complete_filter", "a filter task needs keep or drop");
    task_rec *r = take(s, id);
    return r ? finish(s, r) : -1;
}

int ff_sched_complete_filter(ff_sched *s, int64_t id, bool keep) {
    task_rec *r = take(s, id);
    if (!r) return -1;
    int64_t g = r->t.group;
    if (g < 0 || s->gdead[g]) return finish(s, r);
    if (!keep) {
        kill_group(s, g);
        return finish(s, r);
    }
    if (++s->gpassed[g] == s->n_filters) {
        s->n_passed_groups++;
        if (s->n_passed_groups == s->target_groups) /* the batch is full: drop the surplus */
            for (int64_t h = 0; h < s->n_groups; h++)
                if (!s->gdead[h] && s->gpassed[h] < s->n_filters) kill_group(s, h);
    }
    return finish(s, r);
}

int64_t ff_sched_groups_wanted(const ff_sched *s) {
    if (!s->n_filters || s->exhausted || s->n_passed_groups >= s->target_groups) return 0;
    int64_t want = s->target_groups - s->n_alive_groups;
    return want > 0 ? want : 0;
}

int64_t ff_sched_add_groups(ff_sched *s, int64_t k) {
    if (k < 1) return ff_error_set("scheduler", NULL, "add at least one group");
    int64_t first = s->n_groups;
    if (add_groups(s, k)) return -1;
    return first;
}

void ff_sched_source_exhausted(ff_sched *s) { s->exhausted = true; }
bool ff_sched_sample_alive(const ff_sched *s, int64_t i) { return i >= 0 && i < s->n_samples && !s->dead[i]; }
int64_t ff_sched_n_samples(const ff_sched *s) { return s->n_samples; }
int64_t ff_sched_in_flight(const ff_sched *s) { return s->in_flight; }
