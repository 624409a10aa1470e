/* A fused actor+critic schedule (fuseflow/fuse.h) as the pipeline executor's instruction
 * streams (ff_fuse_to_pipe): one ff_pipe model per instance model, each node's forwards and
 * backwards in the schedule's order, the sends and receives between them, and the optimizer
 * steps.
 *
 * How the transfers are placed (docs/pipeline.md, "Executing a fused schedule"): the streams'
 * sends do not block (ff_pipe_schedule.eager_sends: the executor posts them over a transport
 * with send_post), so a send goes right after the compute that made its tensor, and a receive
 * right before the compute that needs it, or earlier where the same channel's next message is
 * needed first (both ends list a channel in one order, the k-th send carrying the k-th
 * receive). A rank then waits only where the fused simulator's task waits for its input, and
 * the streams run at its makespan (with no latency, exactly; with a hop latency too, since the
 * data leaves when it is sent); they cannot deadlock where the fused simulator finishes. Each
 * model's optimizer step goes where its family's last backward ends on the fused simulator's
 * timeline (tau), after the rank's own last backward of it; in its gap after the sends and
 * before the receives. A message sent before a step that both its ends take is received before
 * it too (the step's collectives share the connections), which can make the receiver wait for
 * a compute that runs across tau: the one place the streams may run longer than the fused
 * makespan. Steps meet other ranks (the gradient norm's sum, the replicas' gradient
 * sum, the tied embeddings): every rank of them reaches its step having run what starts before
 * tau on the timeline, which needs only what other ranks run before their own steps, and waits
 * for nothing made after tau, so the steps cannot deadlock with the transfers.
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
    int32_t cls;   /* in its gap: 0 sends, 1 optimizer steps (and receives held before one), 2 receives */
    double tau;    /* cls 1: the step's time: steps of one gap in the same order on every rank */
    int32_t sub;   /* cls 1: 0 a receive before the step of time tau, 1 the step */
    int64_t id;    /* transfers: channel and place in its order; steps: family and model */
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
    double fam_tau[FF_FUSE_MAX_MODELS];                     /* [family] its steps' time */
    int64_t step_gap[FF_FUSE_MAX_NODES][FF_FUSE_MAX_MODELS]; /* [node][family] its step's gap there, -1 */
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

/* End of model i's forward (back: backward) of micro-batch k at stage st, on the timeline. */
static double t_end(const ctx *c, int i, int32_t st, int32_t k, bool back) {
    const int64_t j = (back ? c->bi : c->fi)[i][(size_t)st * (size_t)c->in->models[i].micro + (size_t)k];
    return c->te[c->in->models[i].stages[st]][j];
}

/* ---- placing transfers and steps ---------------------------------------------------------- */

/* Computes of node n that start before tau (the gap tau falls in). */
static int64_t gap_of(const ctx *c, int32_t n, double tau) {
    int64_t lo = 0, hi = c->s->n_tasks[n];
    while (lo < hi) { /* first task starting at or after tau */
        int64_t mid = lo + (hi - lo) / 2;
        if (c->ts[n][mid] < tau) lo = mid + 1;
        else hi = mid;
    }
    return lo;
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

/* One activation or gradient from node a to node b: sent in the gap after its producer, needed
 * in the gap before its consumer. */
typedef struct msg {
    int32_t a, b;
    int64_t sgap, cgap;
    ff_pipe_instr snd, rcv;
} msg;

static int msg_cmp(const void *pa, const void *pb) {
    const msg *x = pa, *y = pb;
    if (x->a != y->a) return x->a < y->a ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return x->sgap < y->sgap ? -1 : x->sgap > y->sgap;
}

/* Every transfer of every model. A send is posted right after its producer (sends do not
 * block); a receive waits right before its consumer, or earlier where a later message of the
 * same channel is needed first: both ends list a channel in its send order (k-th send, k-th
 * receive), so a receive comes no later than the next one's. That earlier receive costs
 * nothing: its message left before the one the rank waits for there. */
static int add_transfers(ctx *c) {
    const ff_fuse_instance *in = c->in;
    int64_t n = 0;
    for (int i = 0; i < in->n_models; i++) n += 2 * (int64_t)in->models[i].micro * (in->models[i].n_stages - 1);
    if (!n) return 0;
    msg *v = ff_malloc(sizeof *v * (size_t)n);
    if (!v) return -1;
    int64_t q = 0;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        const size_t M = (size_t)m->micro;
        for (int32_t k = 0; k < m->micro; k++)
            for (int32_t st = 0; st + 1 < m->n_stages; st++)
                for (int grad = 0; grad < 2; grad++) {
                    const int32_t from = grad ? st + 1 : st, to = grad ? st : st + 1;
                    const int64_t *idx = grad ? c->bi[i] : c->fi[i];
                    v[q++] = (msg){.a = m->stages[from], .b = m->stages[to], .sgap = idx[(size_t)from * M + (size_t)k] + 1,
                                   .cgap = idx[(size_t)to * M + (size_t)k],
                                   .snd = {.op = grad ? FF_PIPE_SEND_GRAD : FF_PIPE_SEND_ACT, .model = (uint8_t)i, .micro = k,
                                           .peer = m->stages[to]},
                                   .rcv = {.op = grad ? FF_PIPE_RECV_GRAD : FF_PIPE_RECV_ACT, .model = (uint8_t)i, .micro = k,
                                           .peer = m->stages[from]}};
                }
    }
    qsort(v, (size_t)n, sizeof *v, msg_cmp);
    int rc = 0;
    for (int64_t lo = 0, hi; lo < n && !rc; lo = hi) { /* one channel: [lo, hi) in send order */
        for (hi = lo + 1; hi < n && v[hi].a == v[lo].a && v[hi].b == v[lo].b; hi++) {
        }
        int64_t rgap = INT64_MAX;
        for (int64_t j = hi - 1; j >= lo; j--) v[j].cgap = rgap = v[j].cgap < rgap ? v[j].cgap : rgap;
        for (int64_t j = lo; j < hi && !rc; j++) {
            const int64_t id = ((int64_t)v[j].a * FF_FUSE_MAX_NODES + v[j].b) << 32 | (j - lo);
            item r = {.gap = v[j].cgap, .cls = 2, .id = id, .in = v[j].rcv};
            /* sent before a step that both ends take, it is received before it too: the step's
             * collectives (over the same connections) come after it on both sides */
            for (int f = 0; f < c->in->n_models; f++) {
                const int64_t sa = c->step_gap[v[j].a][f], sb = c->step_gap[v[j].b][f];
                if (sa < 0 || sb < 0 || v[j].sgap > sa || v[j].cgap < sb) continue;
                if (r.cls == 2 || sb < r.gap || (sb == r.gap && c->fam_tau[f] < r.tau))
                    r.gap = sb, r.cls = 1, r.tau = c->fam_tau[f], r.sub = 0;
            }
            rc = add_item(c, v[j].a, (item){.gap = v[j].sgap, .id = id, .in = v[j].snd}) || add_item(c, v[j].b, r);
        }
    }
    free(v);
    return rc ? -1 : 0;
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
    for (int32_t n = 0; n < FF_FUSE_MAX_NODES; n++)
        for (int f = 0; f < FF_FUSE_MAX_MODELS; f++) c->step_gap[n][f] = -1;
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        const double tau = end[c->family[i]];
        c->fam_tau[c->family[i]] = tau;
        for (int32_t st = 0; st < m->n_stages; st++) {
            const int32_t n = m->stages[st];
            int64_t last = 0, g = gap_of(c, n, tau);
            for (int32_t k = 0; k < m->micro; k++) {
                const int64_t j = c->bi[i][(size_t)st * (size_t)m->micro + (size_t)k];
                last = j > last ? j : last;
            }
            item it = {.gap = g <= last ? last + 1 : g, .cls = 1, .tau = tau, .sub = 1,
                       .id = (int64_t)c->family[i] * FF_FUSE_MAX_MODELS + i,
                       .in = {.op = FF_PIPE_OPTIMIZER_STEP, .model = (uint8_t)i, .micro = -1, .peer = -1, .call = -1}};
            int64_t *sg = &c->step_gap[n][c->family[i]];
            *sg = *sg < 0 || it.gap < *sg ? it.gap : *sg;
            if (add_item(c, n, it)) return -1;
        }
    }
    return 0;
}

static int item_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->gap != b->gap) return a->gap < b->gap ? -1 : 1;
    if (a->cls != b->cls) return a->cls < b->cls ? -1 : 1;
    if (a->tau != b->tau) return a->tau < b->tau ? -1 : 1;
    if (a->sub != b->sub) return a->sub < b->sub ? -1 : 1;
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
    }
    out->eager_sends = true; /* receives placed before their consumers: blocking sends could deadlock */
    if (add_steps(c) || add_transfers(c)) return -1; /* the steps first: receives are held before those they cross */
    for (int32_t n = 0; n < in->nodes; n++)
        if (emit(c, n, out)) return -1;
    return 0;
}

int ff_fuse_to_pipe(const ff_fuse_instance *in, const ff_fuse_schedule *s, const int64_t *layers, ff_pipe_schedule *out) {
    memset(out, 0, sizeof *out);
    if (check_instance(in)) return -1;
    ctx *c = ff_calloc(1, sizeof *c);
    if (!c) return -1;
    c->in = in;
    c->s = s;
    ff_fuse_sim sim;
    int rc = ff_fuse_simulate(in, s, &sim) || setup(c) || build(c, layers, out) ? -1 : 0; /* complete, no deadlock */
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
    ff_pipe_sim_opts o = {.hop_s = in->hop_latency, .eager_sends = true};
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
