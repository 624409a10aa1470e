/* Pipeline schedules as data (fuseflow/pipeline.h): the containers other generators fill, the
 * layer split (the planner's rule, not a copy of it), and the generators of GPipe, 1F1B and
 * Megatron's interleaved 1F1B. Not here: checking or timing a schedule (pipe_sim.c), printing
 * it (pipe_report.c). */
#include "fuseflow/pipeline.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

static const char *kind_names[FF_PIPE_NKINDS] = {"gpipe", "1f1b", "interleaved", "custom"};
static const char *op_names[FF_PIPE_NOPS] = {"forward", "backward", "send_act", "recv_act", "send_grad", "recv_grad",
                                             "optimizer_step"};

const char *ff_pipe_kind_name(ff_pipe_kind k) { return (unsigned)k < FF_PIPE_NKINDS ? kind_names[k] : "?"; }
const char *ff_pipe_op_name(ff_pipe_op op) { return (unsigned)op < FF_PIPE_NOPS ? op_names[op] : "?"; }

int ff_pipe_kind_parse(const char *name, ff_pipe_kind *out) {
    for (int k = 0; k < FF_PIPE_CUSTOM; k++)
        if (!strcmp(name, kind_names[k])) {
            *out = (ff_pipe_kind)k;
            return 0;
        }
    return ff_error_set("pipeline kind", "use gpipe, 1f1b or interleaved", "unknown schedule '%s'", name);
}

/* ---- containers -------------------------------------------------------------------------- */

int ff_pipe_schedule_init(ff_pipe_schedule *s, int32_t n_ranks, int32_t n_models) {
    memset(s, 0, sizeof *s);
    if (n_ranks < 1 || n_ranks > FF_PIPE_MAX_INSTR)
        return ff_error_set("pipeline", NULL, "%d ranks: need 1 .. %d", (int)n_ranks, FF_PIPE_MAX_INSTR);
    if (n_models < 1 || n_models > FF_PIPE_MAX_MODELS)
        return ff_error_set("pipeline", NULL, "%d models: need 1 .. %d", (int)n_models, FF_PIPE_MAX_MODELS);
    s->streams = ff_calloc((size_t)n_ranks, sizeof *s->streams);
    if (!s->streams) return -1;
    s->n_ranks = n_ranks;
    s->n_models = n_models;
    s->config.kind = FF_PIPE_CUSTOM;
    return 0;
}

int ff_pipe_model_set(ff_pipe_schedule *s, int model, int32_t micro, int32_t n_stages, const int32_t *stage_rank,
                      const int64_t *layers, bool forward_only) {
    if (model < 0 || model >= s->n_models) return ff_error_set("pipeline", NULL, "model %d: the schedule has %d", model, (int)s->n_models);
    if (micro < 1) return ff_error_set("pipeline", NULL, "model %d: %d micro-batches (need at least 1)", model, (int)micro);
    if (n_stages < 1) return ff_error_set("pipeline", NULL, "model %d: %d virtual stages (need at least 1)", model, (int)n_stages);
    ff_pipe_model *m = &s->models[model];
    free(m->stage_rank);
    free(m->stage_chunk);
    free(m->stage_layers);
    memset(m, 0, sizeof *m);
    int32_t *chunks_on = ff_calloc((size_t)s->n_ranks, sizeof *chunks_on);
    m->stage_rank = ff_malloc(sizeof(int32_t) * (size_t)n_stages);
    m->stage_chunk = ff_malloc(sizeof(int32_t) * (size_t)n_stages);
    m->stage_layers = layers ? ff_malloc(sizeof(int64_t) * (size_t)n_stages) : NULL;
    if (!chunks_on || !m->stage_rank || !m->stage_chunk || (layers && !m->stage_layers)) goto fail;
    for (int32_t k = 0; k < n_stages; k++) {
        int32_t r = stage_rank[k];
        if (r < 0 || r >= s->n_ranks) {
            ff_error_set("pipeline", NULL, "model %d: virtual stage %d on rank %d, but the ranks are 0 .. %d", model, (int)k, (int)r,
                         (int)s->n_ranks - 1);
            goto fail;
        }
        if (chunks_on[r] > UINT16_MAX) {
            ff_error_set("pipeline", NULL, "model %d: more than %d chunks on rank %d", model, UINT16_MAX + 1, (int)r);
            goto fail;
        }
        m->stage_rank[k] = r;
        m->stage_chunk[k] = chunks_on[r]++;
        if (layers) m->stage_layers[k] = layers[k];
    }
    free(chunks_on);
    m->micro = micro;
    m->n_stages = n_stages;
    m->forward_only = forward_only;
    return 0;
fail:
    free(chunks_on);
    free(m->stage_rank);
    free(m->stage_chunk);
    free(m->stage_layers);
    memset(m, 0, sizeof *m);
    return -1;
}

int ff_pipe_push(ff_pipe_schedule *s, int32_t rank, ff_pipe_instr in) {
    assert(rank >= 0 && rank < s->n_ranks);
    ff_pipe_stream *st = &s->streams[rank];
    if (st->n == st->cap) {
        int64_t total = 0;
        for (int32_t r = 0; r < s->n_ranks; r++) total += s->streams[r].n;
        if (total >= FF_PIPE_MAX_INSTR)
            return ff_error_set("pipeline", "use fewer stages, chunks or micro-batches", "more than %d instructions", FF_PIPE_MAX_INSTR);
        int64_t cap = st->cap ? 2 * st->cap : 64;
        ff_pipe_instr *p = ff_realloc(st->instr, sizeof *p * (size_t)cap);
        if (!p) return -1;
        st->instr = p;
        st->cap = cap;
    }
    st->instr[st->n++] = in;
    return 0;
}

void ff_pipe_schedule_clear(ff_pipe_schedule *s) {
    if (!s) return;
    for (int32_t r = 0; s->streams && r < s->n_ranks; r++) free(s->streams[r].instr);
    free(s->streams);
    for (int i = 0; i < FF_PIPE_MAX_MODELS; i++) {
        free(s->models[i].stage_rank);
        free(s->models[i].stage_chunk);
        free(s->models[i].stage_layers);
    }
    memset(s, 0, sizeof *s);
}

int32_t ff_pipe_stage_of(const ff_pipe_schedule *s, int model, int32_t rank, int32_t chunk) {
    if (model < 0 || model >= s->n_models) return -1;
    const ff_pipe_model *m = &s->models[model];
    /* Megatron's layout first (k = c p + rank), then any other */
    int64_t k = (int64_t)chunk * s->n_ranks + rank;
    if (k >= 0 && k < m->n_stages && m->stage_rank[k] == rank && m->stage_chunk[k] == chunk) return (int32_t)k;
    for (int32_t j = 0; j < m->n_stages; j++)
        if (m->stage_rank[j] == rank && m->stage_chunk[j] == chunk) return j;
    return -1;
}

/* ---- layers ------------------------------------------------------------------------------ */

int ff_pipe_place_layers(int64_t layers, int32_t pp, int32_t vpp, int64_t layers_first, int64_t layers_last, int64_t *out) {
    ff_plan_model m;
    memset(&m, 0, sizeof m);
    m.layers = layers;
    ff_plan_layout l;
    memset(&l, 0, sizeof l);
    l.pp = pp;
    l.vpp = vpp > 0 ? vpp : 1;
    l.layers_first = layers_first;
    l.layers_last = layers_last;
    if (ff_plan_place_layers(&m, &l, out) != 0) return ff_error_wrap("layers %lld over pp %d x vpp %d", (long long)layers, (int)pp, (int)l.vpp);
    return 0;
}

/* ---- generators -------------------------------------------------------------------------- */

/* One rank's stream being written: the calls it groups and which micro-batch each receive
 * brings (the n-th receive for a chunk is its n-th micro-batch: every order below runs a
 * chunk's forwards, and its backwards, in ascending micro-batch order). */
typedef struct gen {
    ff_pipe_schedule *s;
    int32_t rank, p, v, call;
    int32_t *acts_in, *grads_in; /* [v] receives posted so far per chunk */
    ff_pipe_instr ops[4];
    int n_ops;
    int rc;
} gen;

static int32_t vstage(const gen *g, int32_t chunk) { return chunk * g->p + g->rank; }

static void emit(gen *g, uint8_t op, int32_t micro, int32_t chunk, int32_t peer, int32_t call) {
    if (g->rc) return;
    ff_pipe_instr in = {.op = op, .model = 0, .chunk = (uint16_t)chunk, .micro = micro, .peer = peer, .call = call};
    g->rc = ff_pipe_push(g->s, g->rank, in);
}

static void compute(gen *g, uint8_t op, int32_t micro, int32_t chunk) { emit(g, op, micro, chunk, -1, -1); }

/* A transfer joins the call being built unless its partner is this rank itself (consecutive
 * virtual stages on one rank hand over in memory) or there is none (the ends of the pipeline). */
static void add(gen *g, uint8_t op, int32_t micro, int32_t chunk, int32_t other_stage) {
    if (other_stage < 0 || other_stage >= g->p * g->v) return;
    int32_t peer = other_stage % g->p;
    if (peer == g->rank) return;
    assert(g->n_ops < 4);
    g->ops[g->n_ops++] = (ff_pipe_instr){.op = op, .chunk = (uint16_t)chunk, .micro = micro, .peer = peer};
}
static void send_act(gen *g, int32_t micro, int32_t chunk) { add(g, FF_PIPE_SEND_ACT, micro, chunk, vstage(g, chunk) + 1); }
static void send_grad(gen *g, int32_t micro, int32_t chunk) { add(g, FF_PIPE_SEND_GRAD, micro, chunk, vstage(g, chunk) - 1); }
static void recv_act(gen *g, int32_t chunk) {
    int32_t k = vstage(g, chunk) - 1;
    if (k < 0 || k % g->p == g->rank) return;
    add(g, FF_PIPE_RECV_ACT, g->acts_in[chunk]++, chunk, k);
}
static void recv_grad(gen *g, int32_t chunk) {
    int32_t k = vstage(g, chunk) + 1;
    if (k >= g->p * g->v || k % g->p == g->rank) return;
    add(g, FF_PIPE_RECV_GRAD, g->grads_in[chunk]++, chunk, k);
}

/* Post the call built so far. Its transfers go in the order activations before gradients,
 * sends before receives: when two neighbours exchange both kinds on one channel (p = 2,
 * interleaved), both sides then list them alike and NCCL's order matching pairs them right. */
static void flush(gen *g) {
    static const uint8_t order[] = {FF_PIPE_SEND_ACT, FF_PIPE_RECV_ACT, FF_PIPE_SEND_GRAD, FF_PIPE_RECV_GRAD};
    if (!g->n_ops) return;
    for (size_t o = 0; o < sizeof order; o++)
        for (int i = 0; i < g->n_ops; i++)
            if (g->ops[i].op == order[o]) emit(g, g->ops[i].op, g->ops[i].micro, g->ops[i].chunk, g->ops[i].peer, g->call);
    g->call++;
    g->n_ops = 0;
}

static void gen_gpipe(gen *g, int32_t m, bool fwd_only) {
    for (int32_t i = 0; i < m; i++) {
        recv_act(g, 0);
        flush(g);
        compute(g, FF_PIPE_FORWARD, i, 0);
        send_act(g, i, 0);
        flush(g);
    }
    if (fwd_only) return;
    for (int32_t i = 0; i < m; i++) {
        recv_grad(g, 0);
        flush(g);
        compute(g, FF_PIPE_BACKWARD, i, 0);
        send_grad(g, i, 0);
        flush(g);
    }
}

/* Megatron's forward_backward_pipelining_without_interleaving. */
static void gen_1f1b(gen *g, int32_t m) {
    int32_t s = g->rank, warm = g->p - s - 1 < m ? g->p - s - 1 : m, rest = m - warm;
    for (int32_t i = 0; i < warm; i++) {
        recv_act(g, 0);
        flush(g);
        compute(g, FF_PIPE_FORWARD, i, 0);
        send_act(g, i, 0);
        flush(g);
    }
    if (rest > 0) {
        recv_act(g, 0);
        flush(g);
    }
    for (int32_t i = 0; i < rest; i++) {
        compute(g, FF_PIPE_FORWARD, warm + i, 0);
        send_act(g, warm + i, 0); /* send forward + receive backward */
        recv_grad(g, 0);
        flush(g);
        compute(g, FF_PIPE_BACKWARD, i, 0);
        send_grad(g, i, 0); /* send backward + receive forward */
        if (i < rest - 1) recv_act(g, 0);
        flush(g);
    }
    for (int32_t i = rest; i < m; i++) {
        recv_grad(g, 0);
        flush(g);
        compute(g, FF_PIPE_BACKWARD, i, 0);
        send_grad(g, i, 0);
        flush(g);
    }
}

/* Python's floor modulo: Megatron looks up chunks of negative iteration numbers. */
static int64_t pymod(int64_t a, int64_t b) { return ((a % b) + b) % b; }

/* Megatron's unit k (a micro-batch through one chunk): groups of p micro-batches go through
 * chunk 0, then 1, ...; backwards through the chunks in reverse. */
static int32_t unit_chunk(const gen *g, int64_t k, bool forward) {
    int32_t c = (int32_t)(pymod(k, (int64_t)g->p * g->v) / g->p);
    return forward ? c : g->v - 1 - c;
}
static int32_t unit_micro(const gen *g, int64_t k) {
    int64_t pv = (int64_t)g->p * g->v;
    return (int32_t)((k / pv) * g->p + k % g->p);
}

/* Megatron's forward_backward_pipelining_with_interleaving (no overlap of transfers): which
 * transfers each call holds and which chunk each receive is for, decided as Megatron decides
 * them; the simulator checks that they pair up. */
static void gen_interleaved(gen *g, int32_t m, bool fwd_only) {
    int32_t p = g->p, v = g->v, s = g->rank;
    int64_t total = (int64_t)m * v, warm;
    bool all_warm = false;
    if (fwd_only) {
        warm = total;
    } else if (m == p) { /* Megatron: every forward first when m = p */
        warm = total;
        all_warm = true;
    } else {
        warm = 2 * (int64_t)(p - s - 1) + (int64_t)(v - 1) * p;
        if (warm > total) warm = total;
    }
    int64_t rest = total - warm;
    bool first_rank = s == 0, last_rank = s == p - 1;

    recv_act(g, 0);
    flush(g);
    for (int64_t k = 0; k < warm; k++) {
        int32_t c = unit_chunk(g, k, true);
        compute(g, FF_PIPE_FORWARD, unit_micro(g, k), c);
        int32_t next = unit_chunk(g, k + 1, true);
        bool recv_prev = !(first_rank && next == 0) && k != total - 1;
        send_act(g, unit_micro(g, k), c);
        if (recv_prev) recv_act(g, next);
        if (k == warm - 1 && !fwd_only && !all_warm && !last_rank) recv_grad(g, v - 1);
        flush(g);
    }
    for (int64_t k = 0; k < rest; k++) {
        int64_t fk = k + warm;
        int32_t fc = unit_chunk(g, fk, true), bc = unit_chunk(g, k, false);
        compute(g, FF_PIPE_FORWARD, unit_micro(g, fk), fc);
        compute(g, FF_PIPE_BACKWARD, unit_micro(g, k), bc);
        send_act(g, unit_micro(g, fk), fc);
        send_grad(g, unit_micro(g, k), bc);
        /* which chunk the next received input and gradient are for: the first rank gets from
         * the last the output of a unit p - 1 behind, and the other way round */
        bool recv_prev = true, recv_next = true;
        int32_t nfc, nbc;
        if (first_rank) {
            nfc = unit_chunk(g, fk - (p - 1), true);
            if (nfc == v - 1) recv_prev = false;
            nfc++;
        } else {
            nfc = unit_chunk(g, fk + 1, true);
        }
        if (last_rank) {
            nbc = unit_chunk(g, k - (p - 1), false);
            if (nbc == 0) recv_next = false;
            nbc--;
        } else {
            nbc = unit_chunk(g, k + 1, false);
        }
        if (k == rest - 1) recv_prev = false;
        if (recv_prev) recv_act(g, nfc);
        if (recv_next) recv_grad(g, nbc);
        flush(g);
    }
    if (fwd_only) return;
    if (all_warm && !last_rank) {
        recv_grad(g, v - 1);
        flush(g);
    }
    for (int64_t k = rest; k < total; k++) {
        int32_t c = unit_chunk(g, k, false);
        compute(g, FF_PIPE_BACKWARD, unit_micro(g, k), c);
        send_grad(g, unit_micro(g, k), c);
        int32_t next = unit_chunk(g, k + 1, false);
        bool recv_next = !(last_rank && next == v - 1) && k != total - 1;
        if (recv_next) recv_grad(g, next);
        flush(g);
    }
}

static int check_config(const ff_pipe_config *c, int32_t *v_out) {
    const char *where = "pipeline";
    if ((unsigned)c->kind >= FF_PIPE_CUSTOM) return ff_error_set(where, "use gpipe, 1f1b or interleaved", "unknown schedule kind %d", (int)c->kind);
    if (c->pp < 1) return ff_error_set(where, "give at least one stage", "pp %d", (int)c->pp);
    if (c->micro < 1) return ff_error_set(where, "give at least one micro-batch", "micro %d", (int)c->micro);
    if (c->vpp < 0) return ff_error_set(where, "give at least one chunk per stage", "vpp %d", (int)c->vpp);
    int32_t v = c->vpp > 0 ? c->vpp : 1;
    if (c->kind == FF_PIPE_INTERLEAVED) {
        if (v < 2) return ff_error_set(where, "give vpp >= 2 (with one chunk it is 1f1b)", "the interleaved schedule needs chunks: vpp %d", (int)v);
        if (v > UINT16_MAX) return ff_error_set(where, NULL, "vpp %d: at most %d chunks per stage", (int)v, UINT16_MAX);
        if (c->micro % c->pp)
            return ff_error_set(where, "Megatron's interleaved order runs micro-batches in groups of pp; choose micro as a multiple of pp",
                                "micro %d is not a multiple of pp %d", (int)c->micro, (int)c->pp);
    } else if (v != 1) {
        return ff_error_set(where, "chunks per stage need the interleaved schedule", "vpp %d with %s", (int)v, kind_names[c->kind]);
    }
    /* every micro-batch runs at least one forward per virtual stage, with a transfer on each side */
    double instr = (double)c->pp * v * c->micro * (c->forward_only ? 3.0 : 6.0);
    if (instr > FF_PIPE_MAX_INSTR)
        return ff_error_set(where, "use fewer stages, chunks or micro-batches",
                            "pp %d x vpp %d x micro %d makes about %.3g instructions, more than the %d a schedule may hold", (int)c->pp,
                            (int)v, (int)c->micro, instr, FF_PIPE_MAX_INSTR);
    if (c->layers < 0 || c->layers_first < 0 || c->layers_last < 0)
        return ff_error_set(where, NULL, "negative layer count (layers %lld, first %lld, last %lld)", (long long)c->layers,
                            (long long)c->layers_first, (long long)c->layers_last);
    if (!c->layers && (c->layers_first || c->layers_last))
        return ff_error_set(where, "give the layers too", "layers of the first and last stage without the model's layers");
    *v_out = v;
    return 0;
}

int ff_pipe_generate(const ff_pipe_config *c, ff_pipe_schedule *out) {
    memset(out, 0, sizeof *out);
    int32_t v = 1;
    if (check_config(c, &v) != 0) return -1;
    int32_t p = c->pp, S = p * v;
    int32_t *stage_rank = ff_malloc(sizeof(int32_t) * (size_t)S);
    int64_t *layers = c->layers ? ff_malloc(sizeof(int64_t) * (size_t)S) : NULL;
    int32_t *counts = ff_calloc(2 * (size_t)v, sizeof(int32_t));
    int rc = -1;
    if (!stage_rank || (c->layers && !layers) || !counts) goto done;
    for (int32_t k = 0; k < S; k++) stage_rank[k] = k % p;
    if (layers && ff_pipe_place_layers(c->layers, p, v, c->layers_first, c->layers_last, layers) != 0) goto done;
    if (ff_pipe_schedule_init(out, p, 1) != 0) goto done;
    out->config = *c;
    out->config.vpp = v;
    if (ff_pipe_model_set(out, 0, c->micro, S, stage_rank, layers, c->forward_only) != 0) goto done;
    for (int32_t r = 0; r < p; r++) {
        memset(counts, 0, 2 * (size_t)v * sizeof(int32_t));
        gen g = {.s = out, .rank = r, .p = p, .v = v, .acts_in = counts, .grads_in = counts + v};
        if (c->kind == FF_PIPE_GPIPE || (c->forward_only && c->kind == FF_PIPE_1F1B))
            gen_gpipe(&g, c->micro, c->forward_only);
        else if (c->kind == FF_PIPE_1F1B)
            gen_1f1b(&g, c->micro);
        else
            gen_interleaved(&g, c->micro, c->forward_only);
        if (!c->forward_only) compute(&g, FF_PIPE_OPTIMIZER_STEP, -1, 0);
        if (g.rc) goto done;
    }
    rc = 0;
done:
    free(stage_rank);
    free(layers);
    free(counts);
    if (rc) ff_pipe_schedule_clear(out);
    return rc;
}

double ff_pipe_bubble_formula(const ff_pipe_config *c) {
    static const ff_plan_schedule plan_kind[] = {FF_PLAN_GPIPE, FF_PLAN_1F1B, FF_PLAN_INTERLEAVED};
    if ((unsigned)c->kind >= FF_PIPE_CUSTOM) return -1;
    return ff_plan_bubble_fraction(plan_kind[c->kind], c->pp, c->micro, c->vpp > 0 ? c->vpp : 1);
}
