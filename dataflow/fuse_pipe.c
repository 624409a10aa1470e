/* A fused actor+critic schedule (fuseflow/fuse.h) as the pipeline executor's instruction
 * streams (ff_fuse_to_pipe): one ff_pipe model per instance model, each node's forwards and
 * backwards in the schedule's order, and the sends, receives and optimizer steps placed so that
 * blocking grouped calls cannot deadlock for any schedule that the fused simulator runs.
 *
 * How the transfers are placed (docs/pipeline.md, "Executing a fused schedule"): the schedule
 * is timed as the fused simulator times it (a task starts when its node is free and its input
 * is done), every transfer gets one time tau between its producer's end and its consumer's
 * start, chosen where both nodes are idle when possible, and every optimizer step the time its
 * family's last backward ends. Each node lists its transfers and steps by tau between the
 * computes whose starts surround tau; the transfers between two computes form one call. Both
 * ends of a transfer list it at the same tau, so every channel has one order on both sides,
 * and a rank waiting in a call at tau can only wait for a peer still short of tau: a cycle of
 * waits would need tau to fall all the way round, so there is none (the proof is in the doc).
 *
 * Not here: scoring or solving schedules (fuse.c, fuse_solve.c), running the streams (the
 * executor, workers/pipe). The timing below is the fused simulator's rule restated because the
 * streams need every task's start and end, which ff_fuse_sim does not carry. */
#include "fuseflow/fuse.h"

#include <assert.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

#define W "fused schedule"

/* One transfer or step on one node, before it becomes an instruction. */
typedef struct item {
    int64_t gap;   /* the node's computes before it */
    double tau;    /* its time: the same on both ends of a transfer, on every node of a step */
    int32_t cls;   /* 0: transfer, 1: optimizer step (after the transfers of the same time) */
    int64_t id;    /* the message or the step's family: a common order for equal times */
    ff_pipe_instr in;
} item;

typedef struct node_items {
    item *v;
    int64_t n, cap;
} node_items;

typedef struct ctx {
    const ff_fuse_instance *in;
    const ff_fuse_schedule *s;
    int32_t stage_on[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]; /* stage of model i on node n, -1 */
    /* [model][stage * micro + k]: start and end of forwards and backwards; index of the task on its node */
    double *fs[FF_FUSE_MAX_MODELS], *fe[FF_FUSE_MAX_MODELS], *bs[FF_FUSE_MAX_MODELS], *be[FF_FUSE_MAX_MODELS];
    int64_t *fi[FF_FUSE_MAX_MODELS], *bi[FF_FUSE_MAX_MODELS];
    double *ts[FF_FUSE_MAX_NODES], *te[FF_FUSE_MAX_NODES]; /* [n_tasks] each node's task times, ascending */
    int32_t *mk[FF_FUSE_MAX_NODES];                         /* [n_tasks] each task's micro-batch */
    int32_t family[FF_FUSE_MAX_MODELS];                     /* index of the family's first model */
    node_items items[FF_FUSE_MAX_NODES];
} ctx;

static const char *task_name(const ctx *c, ff_fuse_task t, char *buf, size_t cap) {
    snprintf(buf, cap, "%s %s", c->in->models[t.model].name, t.backward ? "B" : "F");
    return buf;
}

/* ---- checks ------------------------------------------------------------------------------ */

static int check_instance(const ff_fuse_instance *in) {
    if (in->nodes < 1 || in->nodes > FF_FUSE_MAX_NODES)
        return ff_error_set(W, NULL, "%d nodes: need 1 .. %d", (int)in->nodes, FF_FUSE_MAX_NODES);
    if (in->n_models < 1 || in->n_models > FF_FUSE_MAX_MODELS)
        return ff_error_set(W, NULL, "%d models: need 1 .. %d", (int)in->n_models, FF_FUSE_MAX_MODELS);
    if (!(in->hop_latency >= 0)) return ff_error_set(W, NULL, "hop latency %g: need >= 0", in->hop_latency);
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        if (m->n_stages < 1 || m->n_stages > in->nodes)
            return ff_error_set(W, "one stage per node at most", "model %s: %d stages on %d nodes", m->name, (int)m->n_stages,
                                (int)in->nodes);
        if (m->micro < 1) return ff_error_set(W, NULL, "model %s: %d micro-batches (need at least 1)", m->name, (int)m->micro);
        if (!(m->fwd > 0) || !(m->bwd > 0))
            return ff_error_set(W, NULL, "model %s: forward %g and backward %g must be > 0", m->name, m->fwd, m->bwd);
        for (int32_t k = 0; k < m->n_stages; k++) {
            if (m->stages[k] < 0 || m->stages[k] >= in->nodes)
                return ff_error_set(W, NULL, "model %s: stage %d on node %d, but the nodes are 0 .. %d", m->name, (int)k,
                                    (int)m->stages[k], (int)in->nodes - 1);
            for (int32_t q = 0; q < k; q++)
                if (m->stages[q] == m->stages[k])
                    return ff_error_set(W, "put each stage of a model on its own node", "model %s: stages %d and %d both on node %d",
                                        m->name, (int)q, (int)k, (int)m->stages[k]);
        }
    }
    return 0;
}

/* The name without its trailing digits ("critic1" -> "critic"): data-parallel replicas. */
static size_t family_len(const char *name) {
    size_t n = strlen(name);
    while (n > 0 && isdigit((unsigned char)name[n - 1])) n--;
    return n;
}

static int setup(ctx *c) {
    const ff_fuse_instance *in = c->in;
    const ff_fuse_schedule *s = c->s;
    if (s->nodes != in->nodes)
        return ff_error_set(W, "score the schedule against its own instance", "the schedule has %d nodes, the instance %d",
                            (int)s->nodes, (int)in->nodes);
    memset(c->stage_on, 0xff, sizeof c->stage_on);
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        for (int32_t k = 0; k < m->n_stages; k++) c->stage_on[i][m->stages[k]] = k;
        const size_t n = (size_t)m->n_stages * (size_t)m->micro;
        c->fs[i] = ff_malloc(sizeof(double) * n), c->fe[i] = ff_malloc(sizeof(double) * n);
        c->bs[i] = ff_malloc(sizeof(double) * n), c->be[i] = ff_malloc(sizeof(double) * n);
        c->fi[i] = ff_malloc(sizeof(int64_t) * n), c->bi[i] = ff_malloc(sizeof(int64_t) * n);
        if (!c->fs[i] || !c->fe[i] || !c->bs[i] || !c->be[i] || !c->fi[i] || !c->bi[i]) return -1;
        for (size_t q = 0; q < n; q++) c->fe[i][q] = c->be[i][q] = -1, c->fi[i][q] = c->bi[i][q] = -1;
        c->family[i] = i;
        const size_t fl = family_len(m->name);
        for (int j = 0; j < i && fl > 0; j++)
            if (family_len(in->models[j].name) == fl && !strncmp(in->models[j].name, m->name, fl)) {
                c->family[i] = c->family[j];
                break;
            }
    }
    /* every task's micro-batch (the k-th forward of a model on a node is micro-batch k) and
     * the counts: m forwards and m backwards of each model on each of its nodes, no others */
    char b[96];
    for (int32_t n = 0; n < s->nodes; n++) {
        int32_t cnt[FF_FUSE_MAX_MODELS][2] = {{0}};
        c->ts[n] = ff_malloc(sizeof(double) * ((size_t)s->n_tasks[n] + 1));
        c->te[n] = ff_malloc(sizeof(double) * ((size_t)s->n_tasks[n] + 1));
        c->mk[n] = ff_malloc(sizeof(int32_t) * ((size_t)s->n_tasks[n] + 1));
        if (!c->ts[n] || !c->te[n] || !c->mk[n]) return -1;
        for (int64_t j = 0; j < s->n_tasks[n]; j++) {
            const ff_fuse_task t = s->tasks[n][j];
            if (t.model >= in->n_models)
                return ff_error_set(W, NULL, "node %d, task %lld: model %d, but the instance has %d", (int)n, (long long)j,
                                    (int)t.model, (int)in->n_models);
            const int32_t st = c->stage_on[t.model][n], m = in->models[t.model].micro;
            if (st < 0)
                return ff_error_set(W, "a node runs only the models with a stage on it", "node %d, task %lld (%s): %s has no stage on node %d",
                                    (int)n, (long long)j, task_name(c, t, b, sizeof b), in->models[t.model].name, (int)n);
            const int32_t k = cnt[t.model][t.backward ? 1 : 0]++;
            if (k >= m)
                return ff_error_set(W, NULL, "node %d, task %lld (%s): more than the model's %d micro-batches", (int)n, (long long)j,
                                    task_name(c, t, b, sizeof b), (int)m);
            (t.backward ? c->bi : c->fi)[t.model][(size_t)st * (size_t)m + (size_t)k] = j;
            c->mk[n][j] = k;
        }
        for (int i = 0; i < in->n_models; i++)
            if (c->stage_on[i][n] >= 0 && (cnt[i][0] != in->models[i].micro || cnt[i][1] != in->models[i].micro))
                return ff_error_set(W, "list every forward and backward of each model on each of its nodes",
                                    "node %d has %d forwards and %d backwards of %s, which has %d micro-batches", (int)n,
                                    (int)cnt[i][0], (int)cnt[i][1], in->models[i].name, (int)in->models[i].micro);
    }
    return 0;
}

/* ---- the timeline (the fused simulator's rule) -------------------------------------------- */

static int32_t micro_of(const ctx *c, int32_t n, int64_t j) { return c->mk[n][j]; }

/* When task j of node n may start as far as its input goes: -1 while that input is not done. */
static double ready_at(const ctx *c, int32_t n, int64_t j, int32_t k) {
    const ff_fuse_task t = c->s->tasks[n][j];
    const ff_fuse_model *m = &c->in->models[t.model];
    const int32_t st = c->stage_on[t.model][n];
    const size_t M = (size_t)m->micro;
    double dep;
    if (!t.backward) {
        if (st == 0) return 0;
        dep = c->fe[t.model][(size_t)(st - 1) * M + (size_t)k];
    } else if (st == m->n_stages - 1) {
        return c->fe[t.model][(size_t)st * M + (size_t)k]; /* on this node: no hop */
    } else {
        dep = c->be[t.model][(size_t)(st + 1) * M + (size_t)k];
    }
    return dep < 0 ? -1 : dep + c->in->hop_latency;
}

static int timeline(ctx *c) {
    const ff_fuse_schedule *s = c->s;
    int64_t pos[FF_FUSE_MAX_NODES] = {0};
    double free_at[FF_FUSE_MAX_NODES] = {0};
    int32_t kof[FF_FUSE_MAX_NODES];
    for (bool moved = true; moved;) {
        moved = false;
        for (int32_t n = 0; n < s->nodes; n++)
            for (; pos[n] < s->n_tasks[n]; pos[n]++) {
                const int64_t j = pos[n];
                const int32_t k = kof[n] = micro_of(c, n, j);
                const double r = ready_at(c, n, j, k);
                if (r < 0) break;
                const ff_fuse_task t = s->tasks[n][j];
                const ff_fuse_model *m = &c->in->models[t.model];
                const size_t q = (size_t)c->stage_on[t.model][n] * (size_t)m->micro + (size_t)k;
                const double a = r > free_at[n] ? r : free_at[n], e = a + (t.backward ? m->bwd : m->fwd);
                (t.backward ? c->bs : c->fs)[t.model][q] = a;
                (t.backward ? c->be : c->fe)[t.model][q] = e;
                c->ts[n][j] = a, c->te[n][j] = e;
                free_at[n] = e;
                moved = true;
            }
    }
    for (int32_t n = 0; n < s->nodes; n++)
        if (pos[n] < s->n_tasks[n]) {
            char b[96], dep[96];
            const ff_fuse_task t = s->tasks[n][pos[n]];
            const ff_fuse_model *m = &c->in->models[t.model];
            const int32_t st = c->stage_on[t.model][n];
            if (!t.backward) snprintf(dep, sizeof dep, "the forward of stage %d on node %d", (int)st - 1, (int)m->stages[st - 1]);
            else if (st == m->n_stages - 1) snprintf(dep, sizeof dep, "its own forward on this node");
            else snprintf(dep, sizeof dep, "the backward of stage %d on node %d", (int)st + 1, (int)m->stages[st + 1]);
            return ff_error_set(W, "reorder the node's list so that each task's input can come first",
                                "the schedule deadlocks: node %d waits forever at its task %lld (%s of micro-batch %d) for %s",
                                (int)n, (long long)pos[n], task_name(c, t, b, sizeof b), (int)kof[n], dep);
        }
    return 0;
}

/* ---- placing transfers and steps ---------------------------------------------------------- */

/* Computes of node n that start before tau (the gap tau falls in), and how long the compute
 * running at tau still runs (0 when the node is idle there, at a start or at an end). */
static int64_t gap_of(const ctx *c, int32_t n, double tau, double *rest) {
    int64_t lo = 0, hi = c->s->n_tasks[n];
    while (lo < hi) { /* first task starting at or after tau */
        int64_t mid = lo + (hi - lo) / 2;
        if (c->ts[n][mid] < tau) lo = mid + 1;
        else hi = mid;
    }
    if (rest) *rest = lo > 0 && c->te[n][lo - 1] > tau ? c->te[n][lo - 1] - tau : 0;
    return lo;
}

/* How long nodes a and b wait at time tau in the timeline (the rest of the compute each runs). */
static double cost_at(const ctx *c, int32_t a, int32_t b, double tau) {
    double ra, rb;
    gap_of(c, a, tau, &ra);
    gap_of(c, b, tau, &rb);
    return ra + rb;
}

typedef struct pick {
    const ctx *c;
    int32_t a, b;
    double lo, hi, best, cost;
} pick;

static void consider(pick *p, double tau) {
    if (tau < p->lo || tau > p->hi) return;
    const double cost = cost_at(p->c, p->a, p->b, tau);
    if (p->cost < 0 || cost < p->cost || (cost == p->cost && tau < p->best)) p->best = tau, p->cost = cost;
}

/* The transfer's time in [lo, hi] (its producer's end, its consumer's start) that keeps its two
 * nodes waiting least in the timeline: a time both are idle when there is one, the earliest of
 * the best. The candidates are the interval's ends and the two nodes' task bounds inside it. */
static double pick_tau(const ctx *c, int32_t a, int32_t b, double lo, double hi) {
    pick p = {.c = c, .a = a, .b = b, .lo = lo, .hi = hi, .best = hi, .cost = -1};
    consider(&p, lo);
    consider(&p, hi);
    const int32_t nodes[2] = {a, b};
    for (int q = 0; q < 2 && p.cost > 0; q++) {
        const int32_t n = nodes[q];
        int64_t j = gap_of(c, n, lo, NULL);
        for (j = j > 0 ? j - 1 : 0; j < c->s->n_tasks[n] && c->ts[n][j] <= hi; j++) {
            consider(&p, c->ts[n][j]);
            consider(&p, c->te[n][j]);
        }
    }
    return p.best;
}

static int add_item(ctx *c, int32_t n, item it) {
    node_items *v = &c->items[n];
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 64;
        item *p = ff_realloc(v->v, sizeof *p * (size_t)cap);
        if (!p) return -1;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = it;
    return 0;
}

/* Model i's transfer of micro-batch k from stage `from` to the neighbouring stage `to`:
 * activations forward (after the forward of `from`, before that of `to`), gradients back. */
static int add_transfer(ctx *c, int i, int32_t from, int32_t to, int32_t k, bool grad) {
    const ff_fuse_model *m = &c->in->models[i];
    const size_t M = (size_t)m->micro, qf = (size_t)from * M + (size_t)k, qt = (size_t)to * M + (size_t)k;
    const int32_t a = m->stages[from], b = m->stages[to];
    const double lo = grad ? c->be[i][qf] : c->fe[i][qf], hi = grad ? c->bs[i][qt] : c->fs[i][qt];
    const int64_t ja = grad ? c->bi[i][qf] : c->fi[i][qf], jb = grad ? c->bi[i][qt] : c->fi[i][qt];
    const double tau = pick_tau(c, a, b, lo, hi);
    /* the sender after its compute, the receiver before its own (the gaps of tau, which only
     * rounding could move) */
    int64_t ga = gap_of(c, a, tau, NULL), gb = gap_of(c, b, tau, NULL);
    ga = ga <= ja ? ja + 1 : ga;
    gb = gb > jb ? jb : gb;
    const int64_t id = ((((int64_t)i * 2 + grad) * FF_FUSE_MAX_NODES + from) << 32) + k;
    item snd = {.gap = ga, .tau = tau, .id = id,
                .in = {.op = grad ? FF_PIPE_SEND_GRAD : FF_PIPE_SEND_ACT, .model = (uint8_t)i, .micro = k, .peer = b}};
    item rcv = {.gap = gb, .tau = tau, .id = id,
                .in = {.op = grad ? FF_PIPE_RECV_GRAD : FF_PIPE_RECV_ACT, .model = (uint8_t)i, .micro = k, .peer = a}};
    return add_item(c, a, snd) || add_item(c, b, rcv) ? -1 : 0;
}

/* Every model's step at the end of its family's last backward (replicas step together: a host's
 * hook sums their gradients across them), on each of its nodes. */
static int add_steps(ctx *c) {
    const ff_fuse_instance *in = c->in;
    double end[FF_FUSE_MAX_MODELS] = {0};
    for (int i = 0; i < in->n_models; i++) {
        const size_t n = (size_t)in->models[i].n_stages * (size_t)in->models[i].micro;
        for (size_t q = 0; q < n; q++) end[c->family[i]] = c->be[i][q] > end[c->family[i]] ? c->be[i][q] : end[c->family[i]];
    }
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        const double tau = end[c->family[i]];
        for (int32_t st = 0; st < m->n_stages; st++) {
            const int32_t n = m->stages[st];
            int64_t last = 0, g = gap_of(c, n, tau, NULL);
            for (int32_t k = 0; k < m->micro; k++) {
                const int64_t j = c->bi[i][(size_t)st * (size_t)m->micro + (size_t)k];
                last = j > last ? j : last;
            }
            item it = {.gap = g <= last ? last + 1 : g, .tau = tau, .cls = 1, .id = (int64_t)c->family[i] * FF_FUSE_MAX_MODELS + i,
                       .in = {.op = FF_PIPE_OPTIMIZER_STEP, .model = (uint8_t)i, .micro = -1, .peer = -1, .call = -1}};
            if (add_item(c, n, it)) return -1;
        }
    }
    return 0;
}

static int item_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->gap != b->gap) return a->gap < b->gap ? -1 : 1;
    if (a->tau != b->tau) return a->tau < b->tau ? -1 : 1;
    if (a->cls != b->cls) return a->cls < b->cls ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return 0;
}

/* Node n's stream: before each compute (and after the last) the items of that gap in order,
 * consecutive transfers one call. */
static int emit(ctx *c, int32_t n, ff_pipe_schedule *out) {
    node_items *v = &c->items[n];
    qsort(v->v, (size_t)v->n, sizeof *v->v, item_cmp);
    int32_t call = -1;
    bool open = false;
    int64_t q = 0;
    for (int64_t j = 0; j <= c->s->n_tasks[n]; j++) {
        for (; q < v->n && v->v[q].gap == j; q++) {
            ff_pipe_instr in = v->v[q].in;
            if (in.op == FF_PIPE_OPTIMIZER_STEP) {
                open = false;
            } else {
                if (!open) call++, open = true;
                in.call = call;
            }
            if (ff_pipe_push(out, n, in)) return -1;
        }
        open = false;
        if (j == c->s->n_tasks[n]) break;
        const ff_fuse_task t = c->s->tasks[n][j];
        ff_pipe_instr in = {.op = t.backward ? FF_PIPE_BACKWARD : FF_PIPE_FORWARD, .model = t.model,
                            .micro = micro_of(c, n, j), .peer = -1, .call = -1};
        if (ff_pipe_push(out, n, in)) return -1;
    }
    assert(q == v->n);
    return 0;
}

static void ctx_free(ctx *c) {
    for (int i = 0; i < FF_FUSE_MAX_MODELS; i++) {
        free(c->fs[i]), free(c->fe[i]), free(c->bs[i]), free(c->be[i]);
        free(c->fi[i]), free(c->bi[i]);
    }
    for (int n = 0; n < FF_FUSE_MAX_NODES; n++) {
        free(c->ts[n]), free(c->te[n]), free(c->mk[n]);
        free(c->items[n].v);
    }
}

int ff_fuse_to_pipe(const ff_fuse_instance *in, const ff_fuse_schedule *s, const int64_t *layers, ff_pipe_schedule *out) {
    memset(out, 0, sizeof *out);
    if (check_instance(in)) return -1;
    ctx *c = ff_calloc(1, sizeof *c);
    if (!c) return -1;
    c->in = in;
    c->s = s;
    int rc = -1;
    if (setup(c) || timeline(c)) goto done;
    if (ff_pipe_schedule_init(out, in->nodes, in->n_models)) goto done;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        int64_t per[FF_FUSE_MAX_NODES];
        if (layers && ff_pipe_place_layers(layers[i], m->n_stages, 1, 0, 0, per)) {
            ff_error_wrap(W ": the layers of %s", m->name);
            goto done;
        }
        if (ff_pipe_model_set(out, i, m->micro, m->n_stages, m->stages, layers ? per : NULL, false)) goto done;
        for (int32_t k = 0; k < m->micro; k++)
            for (int32_t st = 0; st + 1 < m->n_stages; st++)
                if (add_transfer(c, i, st, st + 1, k, false) || add_transfer(c, i, st + 1, st, k, true)) goto done;
    }
    if (add_steps(c)) goto done;
    for (int32_t n = 0; n < in->nodes; n++)
        if (emit(c, n, out)) goto done;
    rc = 0;
done:
    if (rc) ff_pipe_schedule_clear(out);
    ctx_free(c);
    free(c);
    return rc;
}
