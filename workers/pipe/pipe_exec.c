/* The pipeline executor (fuseflow/pipe_exec.h): one rank's instruction stream followed on its
 * stage models, with the activations and gradients in a pool of buffers (host memory, or the
 * models' backend's when the transport moves device memory), the transfers
 * through the host's transport, the tied embeddings' gradient sum, the optimizer step, and the
 * time of every instruction. Not here: making schedules (ff_dataflow), the model's math
 * (ff_model), moving bytes (the transport: pipe_transport.c for ff_coll). */
#include "fuseflow/pipe_exec.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

#define TIED "model.embed_tokens.weight"

/* The tensors of one (chunk, micro-batch), each a pool buffer (float * in host memory, or an
 * ff_buffer * of the transport's device backend): the input activation (received, or handed over by
 * the previous chunk on this rank), the output activation, the gradient of the output
 * (received, or handed over), the gradient of the input. */
enum { ACT_IN = 0, ACT_OUT, GRAD_IN, GRAD_OUT, NBUF };
static const char *buf_name[NBUF] = {"input activation", "output activation", "output gradient", "input gradient"};

typedef struct exec_model {
    ff_pipe_exec_model m;
    const ff_pipe_model *pm;
    bool present, train;
    int32_t n_chunks, micro, H;
    int32_t *vstage;    /* [n_chunks] the virtual stage of each chunk here */
    int32_t *in_flight; /* [n_chunks] most training forwards a chunk holds at once in the stream */
    void **buf[NBUF];   /* [n_chunks * micro] */
    /* per run */
    int64_t *tok_off;   /* [micro + 1] first token of each micro-batch in the step */
    float *dmem, *omem; /* [3, tokens]: the loss's gradients; outputs when the caller gives none */
    size_t mem_cap;     /* floats of each */
    uint8_t *dmask;     /* [micro] which of d_logprobs, d_entropy, d_values the loss gave (bits 0, 1, 2) */
    double loss;
    ff_optim_stats optim;
    /* tied embeddings held on two ranks: this one's gradient and the partner's */
    int32_t tied_peer;  /* -1: nothing to sum here */
    int64_t tied_n;
    float *tied_a, *tied_b;
    ff_buffer *tied_da, *tied_db; /* device transport: the two gradients on the way */
    double *stage_s;    /* [2, n_stages] forward and backward seconds summed over micro-batches */
} exec_model;

struct ff_pipe_exec {
    const ff_pipe_schedule *s;
    int32_t rank;
    ff_pipe_transport t;
    exec_model em[FF_PIPE_MAX_MODELS];
    const ff_pipe_stream *st;
    void **pool; /* free buffers of pool_floats floats each */
    int n_pool, cap_pool;
    size_t pool_floats;
    ff_pipe_xfer *x; /* [max_call] */
    int max_call;
    /* sends that do not block (the transport's send_post): the buffers of those in flight, in
     * post order, each with its number among the transport's posted sends */
    bool eager;
    void **fly;
    uint64_t *fly_no, posted;
    int n_fly, cap_fly;
    double *t_start, *t_end; /* [st->n] */
    double *red;             /* the closing sum */
    size_t n_red;
    double makespan, bubble; /* of the last run */
};

/* ---- the pool ----------------------------------------------------------------------------- */

static void *pool_get(ff_pipe_exec *e) {
    if (e->n_pool) return e->pool[--e->n_pool];
    if (e->t.device) return ff_buffer_new(e->t.device, e->pool_floats * sizeof(float));
    return ff_malloc(e->pool_floats * sizeof(float));
}

static void buf_free(const ff_pipe_exec *e, void *b) {
    if (!e->t.device) {
        free(b);
        return;
    }
    ff_buffer *d = b;
    ff_buffer_destroy(&d);
}

/* what the transport and the model take: the host pointer, or the device buffer's address */
static float *buf_addr(const ff_pipe_exec *e, void *b) { return e->t.device ? ff_dptr_addr(ff_dptr_of(b, 0)) : b; }
static ff_dptr buf_dev(void **b) { return b && *b ? ff_dptr_of(*b, 0) : (ff_dptr){0}; }

static int pool_put(ff_pipe_exec *e, void **slot) {
    if (!*slot) return 0;
    if (e->n_pool == e->cap_pool) {
        int c = e->cap_pool ? 2 * e->cap_pool : 16;
        void **p = ff_realloc(e->pool, sizeof *p * (size_t)c);
        if (!p) {
            buf_free(e, *slot);
            *slot = NULL;
            return -1;
        }
        e->pool = p;
        e->cap_pool = c;
    }
    e->pool[e->n_pool++] = *slot;
    *slot = NULL;
    return 0;
}

/* Every buffer back to the pool; the number that were still held. */
static int sweep(ff_pipe_exec *e) {
    int held = 0;
    for (int i = 0; i < e->s->n_models; i++) {
        exec_model *m = &e->em[i];
        if (!m->present) continue;
        for (int k = 0; k < NBUF; k++)
            for (int64_t j = 0; j < (int64_t)m->n_chunks * m->micro; j++) {
                held += m->buf[k][j] != NULL;
                pool_put(e, &m->buf[k][j]);
            }
    }
    return held;
}

static void pool_drop(ff_pipe_exec *e) {
    for (int i = 0; i < e->n_pool; i++) buf_free(e, e->pool[i]);
    e->n_pool = 0;
}

/* A posted send's buffer, held until the transport says it is done. */
static int fly_add(ff_pipe_exec *e, void **slot) {
    if (e->n_fly == e->cap_fly) {
        int c = e->cap_fly ? 2 * e->cap_fly : 16;
        void **f = ff_realloc(e->fly, sizeof *f * (size_t)c);
        if (f) e->fly = f;
        uint64_t *no = f ? ff_realloc(e->fly_no, sizeof *no * (size_t)c) : NULL;
        if (!no) return -1; /* the buffer stays in its slot: the next sweep takes it */
        e->fly_no = no;
        e->cap_fly = c;
    }
    e->fly[e->n_fly] = *slot;
    e->fly_no[e->n_fly++] = ++e->posted;
    *slot = NULL;
    return 0;
}

/* The buffers of the sends that are done back to the pool (wait: every send). */
static int fly_reclaim(ff_pipe_exec *e, bool wait) {
    uint64_t done = 0;
    if (e->t.sends_done(e->t.ctx, wait, &done)) return -1;
    if (wait) e->posted = done; /* every send of the transport is done: count from there */
    int k = 0;
    while (k < e->n_fly && e->fly_no[k] <= done) {
        if (pool_put(e, &e->fly[k])) return -1;
        k++;
    }
    if (k && k < e->n_fly) {
        memmove(e->fly, e->fly + k, sizeof *e->fly * (size_t)(e->n_fly - k));
        memmove(e->fly_no, e->fly_no + k, sizeof *e->fly_no * (size_t)(e->n_fly - k));
    }
    e->n_fly -= k;
    return 0;
}

/* ---- transport over ff_coll --------------------------------------------------------------- */

static int coll_call(void *ctx, const ff_pipe_xfer *x, int n) {
    ff_coll_comm *c = ctx;
    if (ff_coll_group_start()) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = x[i].kind == FF_PIPE_XFER_SEND ? ff_coll_send(x[i].buf, x[i].count, FF_DTYPE_F32, x[i].peer, c, NULL)
                                            : ff_coll_recv(x[i].buf, x[i].count, FF_DTYPE_F32, x[i].peer, c, NULL);
    int end = ff_coll_group_end();
    return rc || end ? -1 : 0;
}

static int coll_sum64(void *ctx, double *buf, size_t n) {
    return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F64, FF_COLL_SUM, ctx, NULL);
}

static int coll_send_post(void *ctx, const ff_pipe_xfer *x) {
    return ff_coll_send_post(x->buf, x->count, FF_DTYPE_F32, x->peer, ctx);
}

static int coll_sends_done(void *ctx, bool wait, uint64_t *done) { return ff_coll_sends_done(ctx, wait, done); }

void ff_pipe_transport_coll(ff_coll_comm *comm, ff_pipe_transport *out) {
    *out = (ff_pipe_transport){.rank = ff_coll_comm_rank(comm), .size = ff_coll_comm_size(comm), .ctx = comm,
                               .call = coll_call, .all_reduce_sum_f64 = coll_sum64, .send_post = coll_send_post,
                               .sends_done = coll_sends_done};
}

/* The same on device memory: on a backend whose work is done when queued (the cpu one, whose
 * memory the cpu ff_coll reads) the calls above; else each call on the group's NCCL twin, on a
 * stream of its own ordered after the backend's stream and before its next work by events. */
static int dev_call(void *ctx, const ff_pipe_xfer *x, int n) {
    ff_pipe_coll_dev *d = ctx;
    ff_coll_comm *twin;
    if (ff_coll_comm_twin(d->comm, "nccl", &twin)) return -1;
    ff_stream *st = ff_backend_stream(d->be);
    ff_event_record(d->ready, st);
    ff_stream_wait(d->q, d->ready);
    void *ns = ff_stream_native(d->q);
    if (ff_coll_group_start()) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = x[i].kind == FF_PIPE_XFER_SEND ? ff_coll_send(x[i].buf, x[i].count, FF_DTYPE_F32, x[i].peer, twin, ns)
                                            : ff_coll_recv(x[i].buf, x[i].count, FF_DTYPE_F32, x[i].peer, twin, ns);
    int end = ff_coll_group_end();
    ff_event_record(d->done, d->q);
    ff_stream_wait(st, d->done);
    return rc || end ? -1 : 0;
}
static int dev_sum64(void *ctx, double *buf, size_t n) { return coll_sum64(((ff_pipe_coll_dev *)ctx)->comm, buf, n); }

int ff_pipe_transport_coll_dev(ff_pipe_coll_dev *d, ff_coll_comm *comm, ff_backend *be, ff_pipe_transport *out) {
    *d = (ff_pipe_coll_dev){.comm = comm, .be = be};
    if (!ff_stream_native(ff_backend_stream(be))) { /* the cpu backend: host addresses, the calls as they are */
        ff_pipe_transport_coll(comm, out);
        out->device = be;
        return 0;
    }
    ff_coll_comm *twin; /* made now, while every rank of comm makes its transport: a call's peers need not all meet */
    if (ff_coll_comm_twin(comm, "nccl", &twin) || !(d->q = ff_stream_new(be)) || !(d->ready = ff_event_new(be)) ||
        !(d->done = ff_event_new(be))) {
        ff_pipe_coll_dev_fini(d);
        return ff_error_wrap("pipeline transport on %s", ff_backend_name(be));
    }
    *out = (ff_pipe_transport){.rank = ff_coll_comm_rank(comm), .size = ff_coll_comm_size(comm), .ctx = d, .call = dev_call,
                               .all_reduce_sum_f64 = dev_sum64, .device = be};
    return 0;
}

void ff_pipe_coll_dev_fini(ff_pipe_coll_dev *d) {
    ff_event_destroy(&d->ready);
    ff_event_destroy(&d->done);
    ff_stream_destroy(&d->q);
}

void ff_pipe_model_comm(const ff_pipe_transport *t, ff_model_comm *out) {
    *out = (ff_model_comm){.rank = t->rank, .size = t->size, .ctx = t->ctx, .all_reduce_sum_f64 = t->all_reduce_sum_f64};
}

/* ---- setup -------------------------------------------------------------------------------- */

int ff_pipe_stage_layers(const ff_pipe_schedule *s, int model, int32_t rank, int32_t *first, int32_t *count,
                         ff_model_stage *out) {
    const char *w = "pipeline stage";
    if (model < 0 || model >= s->n_models) return ff_error_set(w, NULL, "model %d: the schedule has %d", model, s->n_models);
    const ff_pipe_model *pm = &s->models[model];
    if (!pm->stage_layers)
        return ff_error_set(w, "generate the schedule with its layers (ff_pipe_config.layers)",
                            "model %d has no layer placement", model);
    int32_t n = 0;
    int64_t layer = 0;
    for (int32_t k = 0; k < pm->n_stages; k++) {
        if (pm->stage_rank[k] == rank) {
            if (n == FF_MODEL_MAX_CHUNKS)
                return ff_error_set(w, "use fewer chunks per stage", "rank %d holds more than %d chunks of model %d", rank,
                                    FF_MODEL_MAX_CHUNKS, model);
            if (pm->stage_layers[k] < 1 || layer + pm->stage_layers[k] > INT32_MAX)
                return ff_error_set(w, "every virtual stage needs at least one layer", "virtual stage %d has %lld layers",
                                    k, (long long)pm->stage_layers[k]);
            first[n] = (int32_t)layer;
            count[n] = (int32_t)pm->stage_layers[k];
            n++;
        }
        layer += pm->stage_layers[k];
    }
    if (!n) return ff_error_set(w, NULL, "rank %d holds no stage of model %d", rank, model);
    *out = (ff_model_stage){.n_chunks = n, .first_layer = first, .n_layers = count};
    return 0;
}

static int model_setup(ff_pipe_exec *e, int i, const ff_pipe_exec_model *given) {
    exec_model *m = &e->em[i];
    const ff_pipe_model *pm = &e->s->models[i];
    const int32_t rank = e->rank, S = pm->n_stages;
    char w[64];
    snprintf(w, sizeof w, "pipeline executor, rank %d, model %d", rank, i);
    m->pm = pm;
    m->tied_peer = -1;
    if (!(m->stage_s = ff_calloc(2 * (size_t)S, sizeof(double)))) return -1; /* every rank: the group's means */
    for (int32_t k = 0; k < S; k++) m->n_chunks += pm->stage_rank[k] == rank;
    for (int64_t j = 0; j < e->st->n && !m->present; j++) m->present = e->st->instr[j].model == i;
    m->present = m->present || m->n_chunks > 0;
    if (!m->present) return 0;
    m->m = *given;
    m->micro = pm->micro;
    m->train = !pm->forward_only;
    if (!given->model) return ff_error_set(w, "give the rank's stage model (ff_pipe_exec_model.model)", "no model");
    ff_model *md = given->model;
    if (e->t.device && ff_model_backend(md) != e->t.device)
        return ff_error_set(w, "give the transport the stage models' backend (ff_pipe_transport.device)",
                            "the model is on backend %s, the transport moves memory of %s", ff_backend_name(ff_model_backend(md)),
                            ff_backend_name(e->t.device));
    if (ff_model_n_chunks(md) != m->n_chunks)
        return ff_error_set(w, "create the stage with ff_pipe_stage_layers", "the model has %d chunks, the schedule %d here",
                            ff_model_n_chunks(md), m->n_chunks);
    m->vstage = ff_malloc(sizeof(int32_t) * (size_t)m->n_chunks);
    m->in_flight = ff_calloc((size_t)m->n_chunks, sizeof(int32_t));
    m->tok_off = ff_malloc(sizeof(int64_t) * ((size_t)m->micro + 1));
    m->dmask = ff_calloc((size_t)m->micro, 1);
    if (!m->vstage || !m->in_flight || !m->tok_off || !m->dmask) return -1;
    for (int k = 0; k < NBUF; k++)
        if (!(m->buf[k] = ff_calloc((size_t)m->n_chunks * (size_t)m->micro, sizeof(void *)))) return -1;
    int64_t layer = 0;
    bool head_here = false;
    for (int32_t k = 0, c = 0; k < S; k++) {
        if (pm->stage_rank[k] == rank) {
            ff_model_chunk_info ci;
            ff_model_chunk_of(md, c, &ci);
            if (pm->stage_layers && (ci.first_layer != layer || ci.n_layers != pm->stage_layers[k]))
                return ff_error_set(w, "create the stage with ff_pipe_stage_layers",
                                    "chunk %d holds layers [%d, %d), the schedule places [%lld, %lld) there", c,
                                    ci.first_layer, ci.first_layer + ci.n_layers, (long long)layer,
                                    (long long)(layer + pm->stage_layers[k]));
            if (ci.embedding != (k == 0) || ci.head != (k == S - 1))
                return ff_error_set(w, "the first virtual stage holds the embedding, the last the heads",
                                    "chunk %d (virtual stage %d of %d) %s the embedding and %s the heads", c, k, S,
                                    ci.embedding ? "holds" : "lacks", ci.head ? "holds" : "lacks");
            head_here = head_here || ci.head;
            m->vstage[c++] = k;
        }
        if (pm->stage_layers) layer += pm->stage_layers[k];
    }
    m->H = ff_model_config_of(md)->hidden_size;
    if (m->train) {
        if (ff_model_is_inference(md) || !given->opt)
            return ff_error_set(w, "give a trainable model and its optimizer", "a training schedule needs %s",
                                ff_model_is_inference(md) ? "gradients (the model is inference-only)" : "an optimizer");
        if (head_here && !given->loss)
            return ff_error_set(w, "give ff_pipe_exec_model.loss", "this rank holds the last virtual stage and has no loss");
        /* Megatron's embedding group: the first and last stage keep a copy each and sum the
         * copies' gradients before the step */
        int32_t r0 = pm->stage_rank[0], r1 = pm->stage_rank[S - 1];
        if (ff_model_config_of(md)->tie_word_embeddings && r0 != r1 && (rank == r0 || rank == r1)) {
            m->tied_peer = rank == r0 ? r1 : r0;
            m->tied_n = ff_model_tensor_numel(md, TIED);
            m->tied_a = ff_malloc(sizeof(float) * (size_t)m->tied_n);
            m->tied_b = ff_malloc(sizeof(float) * (size_t)m->tied_n);
            if (!m->tied_n || !m->tied_a || !m->tied_b) return ff_error_wrap("%s: tied embeddings", w);
            if (e->t.device && (!(m->tied_da = ff_buffer_new(e->t.device, sizeof(float) * (size_t)m->tied_n)) ||
                                !(m->tied_db = ff_buffer_new(e->t.device, sizeof(float) * (size_t)m->tied_n))))
                return ff_error_wrap("%s: tied embeddings", w);
        }
    }
    /* the most training forwards each chunk holds before their backwards */
    int32_t *now = ff_calloc((size_t)m->n_chunks, sizeof(int32_t));
    if (!now) return -1;
    for (int64_t j = 0; j < e->st->n; j++) {
        const ff_pipe_instr *in = &e->st->instr[j];
        if (in->model != i || in->chunk >= m->n_chunks) continue;
        if (in->op == FF_PIPE_FORWARD && m->train && ++now[in->chunk] > m->in_flight[in->chunk])
            m->in_flight[in->chunk] = now[in->chunk];
        if (in->op == FF_PIPE_BACKWARD) now[in->chunk]--;
    }
    free(now);
    return 0;
}

void ff_pipe_exec_destroy(ff_pipe_exec **pe) {
    if (!pe || !*pe) return;
    ff_pipe_exec *e = *pe;
    if (e->s) sweep(e);
    pool_drop(e);
    free(e->pool);
    for (int i = 0; i < e->n_fly; i++) buf_free(e, e->fly[i]);
    free(e->fly);
    free(e->fly_no);
    for (int i = 0; i < FF_PIPE_MAX_MODELS; i++) {
        exec_model *m = &e->em[i];
        for (int k = 0; k < NBUF; k++) free(m->buf[k]);
        free(m->vstage);
        free(m->in_flight);
        free(m->stage_s);
        free(m->tok_off);
        free(m->dmem);
        free(m->omem);
        free(m->dmask);
        free(m->tied_a);
        free(m->tied_b);
        ff_buffer_destroy(&m->tied_da);
        ff_buffer_destroy(&m->tied_db);
    }
    free(e->x);
    free(e->t_start);
    free(e->t_end);
    free(e->red);
    free(e);
    *pe = NULL;
}

ff_pipe_exec *ff_pipe_exec_new(const ff_pipe_schedule *s, int32_t rank, const ff_pipe_transport *t,
                               const ff_pipe_exec_model *models) {
    if (!t || !t->call || !t->all_reduce_sum_f64)
        return ff_error_set("pipeline executor", "give a transport with call and all_reduce_sum_f64", "no transport"), NULL;
    if (!t->send_post != !t->sends_done)
        return ff_error_set("pipeline executor", "give both send_post and sends_done, or neither",
                            "the transport has %s only", t->send_post ? "send_post" : "sends_done"),
               NULL;
    if (s->eager_sends && !t->send_post)
        return ff_error_set("pipeline executor", "run these streams over a transport with send_post (ff_pipe_transport_coll has it)",
                            "the schedule's streams need sends that do not block, and the transport's block"),
               NULL;
    if (t->size != s->n_ranks || t->rank != rank || rank < 0 || rank >= s->n_ranks)
        return ff_error_set("pipeline executor", "the transport's group is the schedule's ranks",
                            "rank %d of a transport of %d (rank %d) for a schedule of %d ranks", rank, t->size, t->rank,
                            s->n_ranks),
               NULL;
    ff_pipe_exec *e = ff_calloc(1, sizeof *e);
    if (!e) return NULL;
    e->s = s;
    e->rank = rank;
    e->t = *t;
    e->eager = t->send_post != NULL;
    e->st = &s->streams[rank];
    const int64_t n = e->st->n;
    e->t_start = ff_calloc((size_t)n + 1, sizeof(double));
    e->t_end = ff_calloc((size_t)n + 1, sizeof(double));
    if (!e->t_start || !e->t_end) goto fail;
    for (int i = 0; i < s->n_models; i++)
        if (model_setup(e, i, &models[i])) goto fail;
    for (int64_t j = 0, run = 0; j < n; j++) { /* the longest call */
        const ff_pipe_instr *in = &e->st->instr[j];
        bool xfer = in->call >= 0;
        run = xfer && j > 0 && e->st->instr[j - 1].call == in->call ? run + 1 : xfer;
        if (run > e->max_call) e->max_call = (int)run;
    }
    if (e->max_call < 1) e->max_call = 1;
    e->x = ff_malloc(sizeof *e->x * (size_t)e->max_call);
    e->n_red = (size_t)s->n_models + 2 * (size_t)s->n_ranks;
    for (int i = 0; i < s->n_models; i++) e->n_red += 2 * (size_t)s->models[i].n_stages;
    e->red = ff_malloc(sizeof(double) * e->n_red);
    if (!e->x || !e->red) goto fail;
    return e;
fail:
    ff_pipe_exec_destroy(&e);
    return NULL;
}

/* ---- one run ------------------------------------------------------------------------------ */

static int instr_error(const ff_pipe_exec *e, int64_t i, const char *hint, const char *fmt, const char *what) {
    char in[48];
    ff_pipe_instr_format(e->s, &e->st->instr[i], in, sizeof in);
    char w[96];
    snprintf(w, sizeof w, "pipeline executor, rank %d, instruction %lld (%s)", e->rank, (long long)i, in);
    return ff_error_set(w, hint, fmt, what);
}

static void **slot(exec_model *m, int k, int32_t chunk, int32_t micro) {
    return &m->buf[k][(size_t)chunk * (size_t)m->micro + (size_t)micro];
}

static size_t count_of(const exec_model *m, int32_t micro) {
    return (size_t)(m->tok_off[micro + 1] - m->tok_off[micro]) * (size_t)m->H;
}

/* The chunk on this rank of virtual stage k of m, or -1 when k is elsewhere (or outside). */
static int32_t local_chunk(const ff_pipe_exec *e, const exec_model *m, int32_t k) {
    if (k < 0 || k >= m->pm->n_stages || m->pm->stage_rank[k] != e->rank) return -1;
    return m->pm->stage_chunk[k];
}

/* The buffer an instruction reads: its own (received), or the neighbouring chunk's on this rank. */
static void **input(ff_pipe_exec *e, exec_model *m, int k, int32_t chunk, int32_t micro, int32_t neighbour) {
    int32_t c = local_chunk(e, m, neighbour);
    return c >= 0 ? slot(m, k == ACT_IN ? ACT_OUT : GRAD_OUT, c, micro) : slot(m, k, chunk, micro);
}

static int do_forward(ff_pipe_exec *e, int64_t i, const ff_pipe_run *r) {
    const ff_pipe_instr *in = &e->st->instr[i];
    exec_model *m = &e->em[in->model];
    const int32_t c = in->chunk, j = in->micro, k = m->vstage[c], S = m->pm->n_stages, T = (int32_t)(m->tok_off[j + 1] - m->tok_off[j]);
    const ff_batch *b = &r->micro[in->model][j];
    void **src = k > 0 ? input(e, m, ACT_IN, c, j, k - 1) : NULL;
    if (src && !*src) return instr_error(e, i, "check the schedule with ff_pipe_simulate", "no %s", buf_name[ACT_IN]);
    void **dst = slot(m, ACT_OUT, c, j);
    ff_forward_out o = {0};
    const bool head = k == S - 1;
    if (head) {
        const int64_t off = m->tok_off[j], tot = m->tok_off[m->micro];
        const ff_forward_out *given = r->outs[in->model] ? &r->outs[in->model][j] : NULL;
        if (m->m.logprobs) o.logprobs = given && given->logprobs ? given->logprobs : m->omem + off;
        if (m->m.entropy) o.entropy = given && given->entropy ? given->entropy : m->omem + tot + off;
        if (m->m.values) o.values = given && given->values ? given->values : m->omem + 2 * tot + off;
    } else {
        if (*dst) return instr_error(e, i, "check the schedule with ff_pipe_simulate", "%s already there", buf_name[ACT_OUT]);
        if (!(*dst = pool_get(e))) return -1;
    }
    ff_forward_opts fo = {.train = m->train, .temperature = m->m.temperature};
    if (e->t.device ? ff_model_stage_forward_dev(m->m.model, c, j, b, buf_dev(src), &fo, &o, head ? (ff_dptr){0} : buf_dev(dst))
                    : ff_model_stage_forward(m->m.model, c, j, b, src ? *src : NULL, &fo, &o, head ? NULL : *dst))
        return ff_error_wrap("pipeline executor, rank %d: forward of micro-batch %d through virtual stage %d", e->rank, j, k);
    if (src && pool_put(e, src)) return -1;
    if (!head || !m->train) return 0;
    const int64_t off = m->tok_off[j], tot = m->tok_off[m->micro];
    ff_pipe_loss_out d = {.d_logprobs = o.logprobs ? m->dmem + off : NULL,
                          .d_entropy = o.entropy ? m->dmem + tot + off : NULL,
                          .d_values = o.values ? m->dmem + 2 * tot + off : NULL};
    for (int q = 0; q < 3; q++) memset(m->dmem + q * tot + off, 0, sizeof(float) * (size_t)T);
    if (m->m.loss(m->m.loss_ctx, j, b, &o, &d))
        return ff_error_wrap("pipeline executor, rank %d: the loss of micro-batch %d", e->rank, j);
    m->dmask[j] = (uint8_t)((d.d_logprobs ? 1 : 0) | (d.d_entropy ? 2 : 0) | (d.d_values ? 4 : 0));
    m->loss += d.loss;
    return 0;
}

static int do_backward(ff_pipe_exec *e, int64_t i) {
    const ff_pipe_instr *in = &e->st->instr[i];
    exec_model *m = &e->em[in->model];
    const int32_t c = in->chunk, j = in->micro, k = m->vstage[c], S = m->pm->n_stages;
    const bool head = k == S - 1;
    void **src = head ? NULL : input(e, m, GRAD_IN, c, j, k + 1);
    if (src && !*src) return instr_error(e, i, "check the schedule with ff_pipe_simulate", "no %s", buf_name[GRAD_IN]);
    void **dst = k > 0 ? slot(m, GRAD_OUT, c, j) : NULL;
    if (dst && *dst) return instr_error(e, i, "check the schedule with ff_pipe_simulate", "%s already there", buf_name[GRAD_OUT]);
    if (dst && !(*dst = pool_get(e))) return -1;
    const int64_t off = m->tok_off[j], tot = m->tok_off[m->micro];
    const uint8_t dm = head ? m->dmask[j] : 0;
    const float *dl = dm & 1 ? m->dmem + off : NULL, *de = dm & 2 ? m->dmem + tot + off : NULL,
                *dv = dm & 4 ? m->dmem + 2 * tot + off : NULL;
    if (e->t.device ? ff_model_stage_backward_dev(m->m.model, c, j, buf_dev(src), dl, de, dv, buf_dev(dst))
                    : ff_model_stage_backward(m->m.model, c, j, src ? *src : NULL, dl, de, dv, dst ? *dst : NULL))
        return ff_error_wrap("pipeline executor, rank %d: backward of micro-batch %d through virtual stage %d", e->rank, j, k);
    return src ? pool_put(e, src) : 0;
}

/* The transfers of one call, [i, end). */
static int do_call(ff_pipe_exec *e, int64_t i, int64_t end) {
    int n = 0;
    for (int64_t q = i; q < end; q++) {
        const ff_pipe_instr *in = &e->st->instr[q];
        exec_model *m = &e->em[in->model];
        if (in->op < FF_PIPE_SEND_ACT || in->op > FF_PIPE_RECV_GRAD || in->call < 0)
            return instr_error(e, q, "check the schedule with ff_pipe_simulate", "%s", "not a transfer of a call");
        const bool send = in->op == FF_PIPE_SEND_ACT || in->op == FF_PIPE_SEND_GRAD;
        const int k = in->op == FF_PIPE_SEND_ACT ? ACT_OUT : in->op == FF_PIPE_RECV_ACT ? ACT_IN
                    : in->op == FF_PIPE_SEND_GRAD ? GRAD_OUT : GRAD_IN;
        void **b = slot(m, k, in->chunk, in->micro);
        if (send && !*b) return instr_error(e, q, "check the schedule with ff_pipe_simulate", "no %s to send", buf_name[k]);
        if (!send && *b) return instr_error(e, q, "check the schedule with ff_pipe_simulate", "%s received twice", buf_name[k]);
        if (!send && !(*b = pool_get(e))) return -1;
        const ff_pipe_xfer x = {.kind = send ? FF_PIPE_XFER_SEND : FF_PIPE_XFER_RECV, .peer = in->peer, .buf = buf_addr(e, *b),
                                .count = count_of(m, in->micro)};
        if (send && e->eager) { /* posted now, in the channel's order; the rank goes on */
            if (e->t.send_post(e->t.ctx, &x))
                return ff_error_wrap("pipeline executor, rank %d: call %d, posting the send to rank %d", e->rank,
                                     e->st->instr[i].call, in->peer);
            if (fly_add(e, b)) return -1;
            continue;
        }
        e->x[n++] = x;
    }
    if (n && e->t.call(e->t.ctx, e->x, n))
        return ff_error_wrap("pipeline executor, rank %d: call %d (%d transfers)", e->rank, e->st->instr[i].call, n);
    if (e->eager) { /* the sends done by now give their buffers back */
        if (fly_reclaim(e, false)) return ff_error_wrap("pipeline executor, rank %d: call %d's sends", e->rank, e->st->instr[i].call);
        return 0;
    }
    for (int64_t q = i; q < end; q++) { /* what was sent is done with */
        const ff_pipe_instr *in = &e->st->instr[q];
        if (in->op == FF_PIPE_SEND_ACT || in->op == FF_PIPE_SEND_GRAD)
            pool_put(e, slot(&e->em[in->model], in->op == FF_PIPE_SEND_ACT ? ACT_OUT : GRAD_OUT, in->chunk, in->micro));
    }
    return 0;
}

static int do_step(ff_pipe_exec *e, int64_t i) {
    exec_model *m = &e->em[e->st->instr[i].model];
    /* a send still moving moves only while this rank calls the transport: the step's hook and
     * sums may block on other groups whose ranks wait for it */
    if (e->eager && fly_reclaim(e, true))
        return ff_error_wrap("pipeline executor, rank %d: the sends before the optimizer step", e->rank);
    if (m->m.before_step && m->m.before_step(m->m.step_ctx, m->m.model))
        return ff_error_wrap("pipeline executor, rank %d: before the optimizer step", e->rank);
    if (m->tied_peer >= 0) {
        /* the two copies' gradients summed on both ranks: a + b there, b + a here, the same
         * bits, so both copies take the same update and stay equal */
        if (ff_model_read_tensor(m->m.model, TIED, true, m->tied_a)) return -1;
        ff_stream *ds = e->t.device ? ff_backend_stream(e->t.device) : NULL;
        const size_t bytes = sizeof(float) * (size_t)m->tied_n;
        if (ds) ff_memcpy_h2d(ds, ff_dptr_of(m->tied_da, 0), m->tied_a, bytes);
        ff_pipe_xfer x[2] = {{.kind = FF_PIPE_XFER_SEND, .peer = m->tied_peer, .buf = ds ? buf_addr(e, m->tied_da) : m->tied_a,
                              .count = (size_t)m->tied_n},
                             {.kind = FF_PIPE_XFER_RECV, .peer = m->tied_peer, .buf = ds ? buf_addr(e, m->tied_db) : m->tied_b,
                              .count = (size_t)m->tied_n}};
        if (e->t.call(e->t.ctx, x, 2))
            return ff_error_wrap("pipeline executor, rank %d: exchange of the tied embeddings' gradients with rank %d",
                                 e->rank, m->tied_peer);
        if (ds) ff_memcpy_d2h(ds, m->tied_b, ff_dptr_of(m->tied_db, 0), bytes);
        for (int64_t q = 0; q < m->tied_n; q++) m->tied_a[q] += m->tied_b[q];
        if (ff_model_write_tensor_grad(m->m.model, TIED, m->tied_a)) return -1;
    }
    if (ff_optimizer_step(m->m.opt, &m->optim))
        return ff_error_wrap("pipeline executor, rank %d: optimizer step", e->rank);
    return 0;
}

/* Per-run sizes: token offsets, the pool's buffer size, the loss arrays, the models' room. */
static int prepare(ff_pipe_exec *e, const ff_pipe_run *r) {
    size_t need = 0;
    for (int i = 0; i < e->s->n_models; i++) {
        exec_model *m = &e->em[i];
        if (!m->present) continue;
        if (!r->micro[i])
            return ff_error_set("pipeline executor", "give every model's micro-batches (ff_pipe_run.micro)",
                                "rank %d: no micro-batches for model %d", e->rank, i);
        int32_t tmax = 0;
        m->tok_off[0] = 0;
        for (int32_t j = 0; j < m->micro; j++) {
            int32_t T = r->micro[i][j].n_tokens;
            if (T < 1) return ff_error_set("pipeline executor", NULL, "model %d: micro-batch %d has %d tokens", i, j, T);
            m->tok_off[j + 1] = m->tok_off[j] + T;
            tmax = T > tmax ? T : tmax;
        }
        if ((size_t)tmax * (size_t)m->H > need) need = (size_t)tmax * (size_t)m->H;
        size_t mem = 3 * (size_t)m->tok_off[m->micro];
        if (mem > m->mem_cap) {
            free(m->dmem);
            free(m->omem);
            m->dmem = ff_malloc(sizeof(float) * mem);
            m->omem = ff_malloc(sizeof(float) * mem);
            m->mem_cap = m->dmem && m->omem ? mem : 0;
            if (!m->mem_cap) return -1;
        }
        int rc = 0;
        if (m->train) rc = ff_model_stage_reserve(m->m.model, tmax, m->in_flight);
        else if (ff_model_is_inference(m->m.model)) rc = ff_model_stage_reserve(m->m.model, tmax, NULL);
        if (rc || (m->train && ff_model_zero_grad(m->m.model))) return -1;
        m->loss = 0;
        memset(&m->optim, 0, sizeof m->optim);
        memset(m->dmask, 0, (size_t)m->micro);
    }
    for (int i = 0; i < e->s->n_models; i++) memset(e->em[i].stage_s, 0, sizeof(double) * 2 * (size_t)e->s->models[i].n_stages);
    sweep(e);
    if (need > e->pool_floats) {
        pool_drop(e);
        e->pool_floats = need;
    }
    return 0;
}

int ff_pipe_exec_run(ff_pipe_exec *e, const ff_pipe_run *r, ff_pipe_exec_stats *stats) {
    if (e->eager && fly_reclaim(e, true)) /* a failed run's sends, still in flight */
        return ff_error_wrap("pipeline executor, rank %d: the sends of an earlier run", e->rank);
    if (prepare(e, r)) return -1;
    if (r->measure) {
        double z = 0;
        if (e->t.all_reduce_sum_f64(e->t.ctx, &z, 1)) return ff_error_wrap("pipeline executor, rank %d: barrier", e->rank);
    }
    const ff_pipe_stream *st = e->st;
    const int64_t t0 = ff_now_ns();
    double compute = 0, transfer = 0, step = 0, end_fb = 0;
    for (int64_t i = 0; i < st->n;) {
        const ff_pipe_instr *in = &st->instr[i];
        const double a = (double)(ff_now_ns() - t0) * 1e-9;
        int64_t next = i + 1;
        int rc;
        switch (in->op) {
        case FF_PIPE_FORWARD: rc = do_forward(e, i, r); break;
        case FF_PIPE_BACKWARD: rc = do_backward(e, i); break;
        case FF_PIPE_OPTIMIZER_STEP: rc = do_step(e, i); break;
        default:
            while (next < st->n && st->instr[next].call == in->call && st->instr[next].call >= 0) next++;
            rc = do_call(e, i, next);
        }
        if (rc) { /* the group is broken; a later run starts clean */
            sweep(e);
            for (int q = 0; q < e->s->n_models; q++)
                if (e->em[q].present && e->em[q].train) ff_model_stage_drop(e->em[q].m.model);
            return -1;
        }
        const double b = (double)(ff_now_ns() - t0) * 1e-9;
        for (int64_t q = i; q < next; q++) e->t_start[q] = a, e->t_end[q] = b;
        if (in->op == FF_PIPE_FORWARD || in->op == FF_PIPE_BACKWARD) {
            exec_model *m = &e->em[in->model];
            m->stage_s[(in->op == FF_PIPE_BACKWARD ? m->pm->n_stages : 0) + m->vstage[in->chunk]] += b - a;
            compute += b - a;
            end_fb = b;
        } else if (in->op == FF_PIPE_OPTIMIZER_STEP) {
            step += b - a;
        } else {
            transfer += b - a;
        }
        i = next;
    }
    if (e->eager && fly_reclaim(e, true)) /* every send received before the closing sum */
        return ff_error_wrap("pipeline executor, rank %d: waiting for the step's sends", e->rank);
    const double wall = (double)(ff_now_ns() - t0) * 1e-9;
    if (sweep(e))
        return ff_error_set("pipeline executor", "check the schedule with ff_pipe_simulate",
                            "rank %d: the stream left activations or gradients unused", e->rank);
    /* the closing sum: [losses][end of compute per rank][compute per rank][stage times per model] */
    const int nm = e->s->n_models, p = e->s->n_ranks;
    memset(e->red, 0, sizeof(double) * e->n_red);
    size_t o = (size_t)nm + 2 * (size_t)p;
    e->red[nm + e->rank] = end_fb;
    e->red[nm + p + e->rank] = compute;
    for (int i = 0; i < nm; i++) {
        exec_model *m = &e->em[i];
        const size_t n2 = 2 * (size_t)m->pm->n_stages;
        e->red[i] = m->present ? m->loss : 0;
        memcpy(e->red + o, m->stage_s, sizeof(double) * n2);
        o += n2;
    }
    if (e->t.all_reduce_sum_f64(e->t.ctx, e->red, e->n_red))
        return ff_error_wrap("pipeline executor, rank %d: the closing sum", e->rank);
    double makespan = 0, busy = 0;
    for (int q = 0; q < p; q++) {
        makespan = e->red[nm + q] > makespan ? e->red[nm + q] : makespan;
        busy += e->red[nm + p + q];
    }
    e->makespan = makespan;
    e->bubble = makespan > 0 ? 1.0 - busy / ((double)p * makespan) : 0;
    o = (size_t)nm + 2 * (size_t)p;
    for (int i = 0; i < nm; i++) { /* the group's sums, as means per micro-batch */
        exec_model *m = &e->em[i];
        const size_t n2 = 2 * (size_t)e->s->models[i].n_stages;
        for (size_t q = 0; q < n2; q++) m->stage_s[q] = e->red[o + q] / (double)e->s->models[i].micro;
        o += n2;
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        for (int i = 0; i < nm; i++) {
            stats->loss[i] = e->red[i];
            stats->optim[i] = e->em[i].optim;
        }
        stats->wall_s = wall;
        stats->compute_s = compute;
        stats->transfer_s = transfer;
        stats->step_s = step;
        stats->makespan_s = makespan;
        stats->bubble_fraction = e->bubble;
    }
    return 0;
}

int32_t ff_pipe_exec_in_flight(const ff_pipe_exec *e, int model, int32_t chunk) {
    assert(model >= 0 && model < e->s->n_models);
    const exec_model *m = &e->em[model];
    return m->present && chunk >= 0 && chunk < m->n_chunks ? m->in_flight[chunk] : 0;
}

void ff_pipe_exec_times(const ff_pipe_exec *e, const double **start_s, const double **end_s, int64_t *n) {
    *start_s = e->t_start;
    *end_s = e->t_end;
    *n = e->st->n;
}

void ff_pipe_exec_stage_times(const ff_pipe_exec *e, int model, double *fwd_s, double *bwd_s) {
    assert(model >= 0 && model < e->s->n_models);
    const exec_model *m = &e->em[model];
    const int32_t S = e->s->models[model].n_stages;
    for (int32_t k = 0; k < S; k++) {
        fwd_s[k] = m->stage_s[k];
        bwd_s[k] = m->stage_s[S + k];
    }
}

const ff_pipe_schedule *ff_pipe_exec_schedule(const ff_pipe_exec *e) { return e->s; }

int ff_pipe_exec_simulate(const ff_pipe_exec *e, ff_pipe_sim *out) {
    memset(out, 0, sizeof *out);
    ff_pipe_sim_opts o = {.eager_sends = e->eager};
    double *t[FF_PIPE_MAX_MODELS] = {0};
    int rc = -1;
    for (int i = 0; i < e->s->n_models; i++) {
        const int32_t S = e->s->models[i].n_stages;
        if (!(t[i] = ff_malloc(sizeof(double) * 2 * (size_t)S))) goto done;
        ff_pipe_exec_stage_times(e, i, t[i], t[i] + S);
        o.fwd_stage_s[i] = t[i];
        o.bwd_stage_s[i] = t[i] + S;
    }
    rc = ff_pipe_simulate(e->s, &o, out);
done:
    for (int i = 0; i < FF_PIPE_MAX_MODELS; i++) free(t[i]);
    return rc;
}
