/* A fused actor+critic schedule (fuseflow/fuse.h) as the pipeline executor's instruction
 * streams (ff_fuse_to_pipe): one ff_pipe model per instance model, each node's forwards and
 * backwards in the schedule's order, and the sends, receives and optimizer steps placed so that
 * blocking grouped calls cannot deadlock for any schedule that the fused simulator runs.
 *
 * How the transfers are placed (docs/pipeline.md, "Executing a fused schedule"): on a timeline
 * of the schedule (first the fused simulator's: a task starts when its node is free and its
 * input is done), every transfer gets one time tau between its producer's end and its
 * consumer's start, chosen where both nodes are idle when possible, and every optimizer step
 * the time its family's last backward ends. Each node lists its transfers and steps by tau between the
 * computes whose starts surround tau; the transfers between two computes form one call. Both
 * ends of a transfer list it at the same tau, so every channel has one order on both sides,
 * and a rank waiting in a call at tau can only wait for a peer still short of tau: a cycle of
 * waits would need tau to fall all the way round, so there is none (the proof is in the doc).
 * Any valid timeline of the node orders will do for that, so the placement is made again on
 * the timeline the pipeline simulator gives the streams (where blocking calls wait), a few
 * times, and the streams with the shortest simulated makespan are kept.
 *
 * Not here: scoring or solving schedules (fuse.c, fuse_solve.c: the timeline is fuse_run's),
 * running the streams (the executor, workers/pipe). */
#include "fuseflow/fuse.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/fuse_internal.h"
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
    int64_t *fi[FF_FUSE_MAX_MODELS], *bi[FF_FUSE_MAX_MODELS]; /* [model][stage * micro + k]: the task's index on its node */
    double *ts[FF_FUSE_MAX_NODES], *te[FF_FUSE_MAX_NODES]; /* [n_tasks] each node's task times, ascending */
    int32_t *mk[FF_FUSE_MAX_NODES];                         /* [n_tasks] each task's micro-batch */
    int32_t family[FF_FUSE_MAX_MODELS];                     /* the first model of its family */
    node_items items[FF_FUSE_MAX_NODES];
} ctx;

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

/* Each task's micro-batch (the k-th forward of a model on a node is micro-batch k), the index
 * of every (model, stage, micro-batch)'s forward and backward on its node, and the timeline. */
static int setup(ctx *c) {
    const ff_fuse_instance *in = c->in;
    const ff_fuse_schedule *s = c->s;
    memset(c->stage_on, 0xff, sizeof c->stage_on);
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        for (int32_t k = 0; k < m->n_stages; k++) c->stage_on[i][m->stages[k]] = k;
        const size_t n = (size_t)m->n_stages * (size_t)m->micro;
        c->fi[i] = ff_malloc(sizeof(int64_t) * n), c->bi[i] = ff_malloc(sizeof(int64_t) * n);
        if (!c->fi[i] || !c->bi[i]) return -1;
        c->family[i] = i;
        for (int j = 0; j < i; j++)
            if (!strcmp(in->models[j].family, m->family)) {
                c->family[i] = c->family[j];
                break;
            }
    }
    for (int32_t n = 0; n < s->nodes; n++) {
        int32_t cnt[FF_FUSE_MAX_MODELS][2] = {{0}};
        c->ts[n] = ff_malloc(sizeof(double) * ((size_t)s->n_tasks[n] + 1));
        c->te[n] = ff_malloc(sizeof(double) * ((size_t)s->n_tasks[n] + 1));
        c->mk[n] = ff_malloc(sizeof(int32_t) * ((size_t)s->n_tasks[n] + 1));
        if (!c->ts[n] || !c->te[n] || !c->mk[n]) return -1;
        for (int64_t j = 0; j < s->n_tasks[n]; j++) {
            const ff_fuse_task t = s->tasks[n][j];
            const int32_t st = c->stage_on[t.model][n], k = cnt[t.model][t.backward ? 1 : 0]++;
            (t.backward ? c->bi : c->fi)[t.model][(size_t)st * (size_t)in->models[t.model].micro + (size_t)k] = j;
            c->mk[n][j] = k;
        }
    }
    fuse_ctx fc;
    if (fuse_ctx_init(&fc, in)) return -1;
    fuse_score r;
    const int rc = fuse_run(&fc, s, &r, c->ts, c->te);
    fuse_ctx_free(&fc);
    return rc ? ff_error_set(W, NULL, "node %d does not finish, though ff_fuse_simulate ran the schedule", (int)r.stuck) : 0;
}

/* Start and end of model i's forward (grad: backward) of micro-batch k at stage st. */
static double t_start(const ctx *c, int i, int32_t st, int32_t k, bool back) {
    const int64_t j = (back ? c->bi : c->fi)[i][(size_t)st * (size_t)c->in->models[i].micro + (size_t)k];
    return c->ts[c->in->models[i].stages[st]][j];
}
static double t_end(const ctx *c, int i, int32_t st, int32_t k, bool back) {
    const int64_t j = (back ? c->bi : c->fi)[i][(size_t)st * (size_t)c->in->models[i].micro + (size_t)k];
    return c->te[c->in->models[i].stages[st]][j];
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
    const double lo = t_end(c, i, from, k, grad), hi = t_start(c, i, to, k, grad);
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
    for (int i = 0; i < in->n_models; i++)
        for (int32_t st = 0; st < in->models[i].n_stages; st++)
            for (int32_t k = 0; k < in->models[i].micro; k++) {
                const double e = t_end(c, i, st, k, true);
                end[c->family[i]] = e > end[c->family[i]] ? e : end[c->family[i]];
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
                            .micro = c->mk[n][j], .peer = -1, .call = -1};
        if (ff_pipe_push(out, n, in)) return -1;
    }
    assert(q == v->n);
    return 0;
}

static void ctx_free(ctx *c) {
    for (int i = 0; i < FF_FUSE_MAX_MODELS; i++) {
        free(c->fi[i]), free(c->bi[i]);
    }
    for (int n = 0; n < FF_FUSE_MAX_NODES; n++) {
        free(c->ts[n]), free(c->te[n]), free(c->mk[n]);
        free(c->items[n].v);
    }
}

/* The streams for the timeline in c (ts, te) into *out (initialised here). */
static int build(ctx *c, const int64_t *layers, ff_pipe_schedule *out) {
    const ff_fuse_instance *in = c->in;
    for (int32_t n = 0; n < in->nodes; n++) c->items[n].n = 0;
    if (ff_pipe_schedule_init(out, in->nodes, in->n_models)) return -1;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        int64_t per[FF_FUSE_MAX_NODES];
        if (layers && ff_pipe_place_layers(layers[i], m->n_stages, 1, 0, 0, per))
            return ff_error_wrap(W ": the layers of %s", m->name);
        if (ff_pipe_model_set(out, i, m->micro, m->n_stages, m->stages, layers ? per : NULL, false)) return -1;
        for (int32_t k = 0; k < m->micro; k++)
            for (int32_t st = 0; st + 1 < m->n_stages; st++)
                if (add_transfer(c, i, st, st + 1, k, false) || add_transfer(c, i, st + 1, st, k, true)) return -1;
    }
    if (add_steps(c)) return -1;
    for (int32_t n = 0; n < in->nodes; n++)
        if (emit(c, n, out)) return -1;
    return 0;
}

/* The streams' makespan in the pipeline simulator (transfers block until both ends are there),
 * and its timeline of the computes into c (ts, te): a valid timeline of the same node orders. */
static int streams_time(ctx *c, const ff_pipe_schedule *p, double *makespan) {
    const ff_fuse_instance *in = c->in;
    double *t = ff_malloc(sizeof(double) * 2 * FF_FUSE_MAX_NODES * (size_t)in->n_models);
    if (!t) return -1;
    ff_pipe_sim_opts o = {.hop_s = in->hop_latency};
    for (int i = 0; i < in->n_models; i++) {
        double *f = t + (size_t)i * 2 * FF_FUSE_MAX_NODES;
        for (int32_t k = 0; k < in->models[i].n_stages; k++) f[k] = in->models[i].fwd, f[FF_FUSE_MAX_NODES + k] = in->models[i].bwd;
        o.fwd_stage_s[i] = f, o.bwd_stage_s[i] = f + FF_FUSE_MAX_NODES;
    }
    ff_pipe_sim sim;
    int rc = ff_pipe_simulate(p, &o, &sim);
    free(t);
    if (rc) { /* the construction's promise broken: a bug here, not the caller's */
        ff_pipe_sim_clear(&sim);
        return ff_error_wrap(W ": the streams made of a valid schedule fail the pipeline simulator");
    }
    *makespan = sim.makespan_s;
    for (int32_t n = 0; n < in->nodes; n++)
        for (int64_t q = 0, j = 0; q < p->streams[n].n; q++) {
            const uint8_t op = p->streams[n].instr[q].op;
            if (op != FF_PIPE_FORWARD && op != FF_PIPE_BACKWARD) continue;
            c->ts[n][j] = sim.start_s[n][q], c->te[n][j] = sim.end_s[n][q];
            j++;
        }
    ff_pipe_sim_clear(&sim);
    return 0;
}

enum { REFINE = 4 }; /* placements tried on the timelines the streams themselves run */

int ff_fuse_to_pipe(const ff_fuse_instance *in, const ff_fuse_schedule *s, const int64_t *layers, ff_pipe_schedule *out) {
    memset(out, 0, sizeof *out);
    if (check_instance(in)) return -1;
    ctx *c = ff_calloc(1, sizeof *c);
    if (!c) return -1;
    c->in = in;
    c->s = s;
    int rc = -1;
    ff_fuse_sim sim;
    double best = 0;
    if (ff_fuse_simulate(in, s, &sim) || setup(c)) goto done; /* complete, and no deadlock */
    /* Placed on the fused timeline, the transfers make some nodes wait for others (a call
     * needs both ends); placed again on the timeline those streams run, they often wait less.
     * Keep the best of a few rounds. */
    if (build(c, layers, out) || streams_time(c, out, &best)) goto done;
    for (int r = 1; r < REFINE; r++) {
        ff_pipe_schedule cand;
        double mk;
        if (build(c, layers, &cand) || streams_time(c, &cand, &mk)) {
            ff_pipe_schedule_clear(&cand);
            goto done;
        }
        if (mk < best) {
            ff_pipe_schedule_clear(out);
            *out = cand, best = mk;
        } else {
            ff_pipe_schedule_clear(&cand);
        }
    }
    rc = 0;
done:
    if (rc) ff_pipe_schedule_clear(out);
    ctx_free(c);
    free(c);
    return rc;
}

/* ---- what runs ----------------------------------------------------------------------------- */

double ff_fuse_streams_makespan(const ff_fuse_instance *in, const ff_fuse_schedule *s) {
    ff_pipe_schedule p;
    if (ff_fuse_to_pipe(in, s, NULL, &p)) return -1;
    double f[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES], b[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES];
    ff_pipe_sim_opts o = {.hop_s = in->hop_latency};
    for (int i = 0; i < in->n_models; i++) {
        for (int32_t k = 0; k < in->models[i].n_stages; k++) f[i][k] = in->models[i].fwd, b[i][k] = in->models[i].bwd;
        o.fwd_stage_s[i] = f[i], o.bwd_stage_s[i] = b[i];
    }
    ff_pipe_sim sim;
    double mk = ff_pipe_simulate(&p, &o, &sim) ? -1 : sim.makespan_s;
    ff_pipe_sim_clear(&sim);
    ff_pipe_schedule_clear(&p);
    return mk;
}
