/* Tensor parallelism inside the model, in-process: TP 2, 4 and 8 ranks (threads, one model
 * and one cpu:1 backend each, a communicator of barriers and shared pointers) against the
 * single-rank model on the same weights and batch, for a small model (4 layers, 8 query
 * heads, 4 key/value heads, vocabulary 64) untied with biases, tied, with a value head, and
 * as a critic. TP 8 > 4 KV heads replicates each key/value head on two ranks.
 *
 * Checked: export right after loading gives back the input tensors bit for bit; log-probs,
 * entropy, values, the loss, every gradient (exported as whole tensors), the gradient norm
 * of three AdamW steps with clipping, the weights and optimizer state after them equal the
 * single-rank model's within fp32 tolerances (stated below, with the errors measured); the
 * single-rank model's final weights and optimizer state, loaded into each rank (sliced) and
 * exported (gathered), come back bit for bit, and on them a temperature-0.7 scoring forward
 * and KV-cache generation (tokens equal, log-probs close) match the single-rank model's;
 * every rank gets the same bits; TP 1 through ff_model_new_tp is bit-identical to
 * ff_model_new; ranks that read only their shards of a checkpoint folder
 * (ff_model_tp_read_weights) run as ranks given whole tensors. The communicator counts what one training step moves per
 * rank: the calls and sizes must be exactly the design's (docs/model.md), and the bytes must be
 * the planner's traffic.tp (replicated key/value heads included) by the exact relation the
 * dtypes and the terms it does not model give; the ratio is printed. Bad TP
 * layouts and the gathered-logits request get clear errors.
 *
 * Sequence parallelism (ff_model_opts.sequence_parallel) at every TP size > 1: the same
 * checks against TP 1 and against TP without SP (T = 30 does not divide by 4 and 8), its
 * collectives counted (all-gathers and reduce-scatters instead of the [T, H] all-reduces,
 * the bytes TP's plus its two extras), the workspace per rank smaller than TP's, two pipeline
 * stages with SP against TP 1, and its errors (docs/model.md "Sequence parallelism"). */
#include <pthread.h>
#include <unistd.h>

#include "fuseflow/safetensors.h"

#include "fuseflow/plan.h"
#include "tests/model/model_test_util.h"

enum { MAXR = 8, NT = 30, NSTEPS = 3, MAXSIZES = 16 };

/* ---- an in-process communicator ------------------------------------------------------------- */

typedef enum { OP_SUM, OP_MAX, OP_SUM64, OP_GATHER, OP_RS_V, OP_AG_V, OP_N } op_kind;
static const char *op_name[OP_N] = {"all-reduce sum f32", "all-reduce max f32", "all-reduce sum f64", "all-gather f32",
                                    "reduce-scatter-v f32", "all-gather-v f32"};

typedef struct traffic {
    int n;                       /* distinct (op, count) pairs seen */
    int op[MAXSIZES];
    size_t count[MAXSIZES];
    int64_t calls[MAXSIZES];
    double ring_bytes;           /* what the rank sends in a ring implementation */
} traffic;

typedef struct group {
    int n;
    pthread_barrier_t bar;
    const void *src[MAXR];
    size_t cnt[MAXR];
    int op[MAXR];
    traffic tr[MAXR];
} group;

typedef struct rank_ctx {
    group *g;
    int rank;
    bool counting; /* this rank's, set by its own thread */
    void *tmp;
    size_t cap; /* bytes */
} rank_ctx;

static void count(rank_ctx *c, int op, size_t n, size_t esize) {
    traffic *t = &c->g->tr[c->rank];
    if (!c->counting) return;
    int i = 0;
    while (i < t->n && !(t->op[i] == op && t->count[i] == n)) i++;
    REQUIRE(i < MAXSIZES);
    if (i == t->n) t->op[i] = op, t->count[i] = n, t->calls[i] = 0, t->n++;
    t->calls[i]++;
    /* n: the elements of each rank (all-gather), of the whole buffer (all-reduce) or of all
     * ranks' parts together (the _v ones: a ring moves (k - 1) / k of them on average) */
    double k = c->g->n, bytes = (double)n * (double)esize;
    t->ring_bytes += op == OP_GATHER ? (k - 1) * bytes : op == OP_RS_V || op == OP_AG_V ? (k - 1) / k * bytes : 2 * (k - 1) / k * bytes;
}

/* Everyone posts its buffer; then every rank reads all of them (the same order on every
 * rank: the same bits everywhere); then everyone writes its own. */
static void *post(rank_ctx *c, int op, const void *src, size_t n, size_t out_bytes) {
    group *g = c->g;
    g->src[c->rank] = src;
    g->cnt[c->rank] = n;
    g->op[c->rank] = op;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->n; r++)
        if (g->cnt[r] != n || g->op[r] != op) {
            fprintf(stderr, "rank %d: %s of %zu, rank %d: %s of %zu: the ranks disagree\n", c->rank, op_name[op], n, r,
                    op_name[g->op[r]], g->cnt[r]);
            exit(1);
        }
    if (out_bytes > c->cap) {
        c->tmp = realloc(c->tmp, out_bytes);
        REQUIRE(c->tmp);
        c->cap = out_bytes;
    }
    return c->tmp;
}

static int c_sum(void *ctx, float *buf, size_t n) {
    rank_ctx *c = ctx;
    float *o = post(c, OP_SUM, buf, n, n * 4);
    for (size_t i = 0; i < n; i++) {
        float s = ((const float *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) s += ((const float *)c->g->src[r])[i];
        o[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 4);
    count(c, OP_SUM, n, 4);
    return 0;
}

static int c_max(void *ctx, float *buf, size_t n) {
    rank_ctx *c = ctx;
    float *o = post(c, OP_MAX, buf, n, n * 4);
    for (size_t i = 0; i < n; i++) {
        float s = ((const float *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) s = fmaxf(s, ((const float *)c->g->src[r])[i]);
        o[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 4);
    count(c, OP_MAX, n, 4);
    return 0;
}

static int c_sum64(void *ctx, double *buf, size_t n) {
    rank_ctx *c = ctx;
    double *o = post(c, OP_SUM64, buf, n, n * 8);
    for (size_t i = 0; i < n; i++) {
        double s = ((const double *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) s += ((const double *)c->g->src[r])[i];
        o[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 8);
    count(c, OP_SUM64, n, 8);
    return 0;
}

static int c_gather(void *ctx, const float *in, float *out, size_t n) {
    rank_ctx *c = ctx;
    post(c, OP_GATHER, in, n, 0);
    for (int r = 0; r < c->g->n; r++) memcpy(out + (size_t)r * n, c->g->src[r], n * 4);
    pthread_barrier_wait(&c->g->bar);
    count(c, OP_GATHER, n, 4);
    return 0;
}

static size_t sum_counts(const group *g, const size_t *counts) {
    size_t s = 0;
    for (int r = 0; r < g->n; r++) s += counts[r];
    return s;
}

static int c_rs_v(void *ctx, const float *in, float *out, const size_t *counts) {
    rank_ctx *c = ctx;
    const size_t N = sum_counts(c->g, counts);
    size_t d0 = 0;
    post(c, OP_RS_V, in, N, 0);
    for (int r = 0; r < c->rank; r++) d0 += counts[r];
    for (size_t i = 0; i < counts[c->rank]; i++) { /* in rank order, as c_sum: the same bits as an all-reduce */
        float s = ((const float *)c->g->src[0])[d0 + i];
        for (int r = 1; r < c->g->n; r++) s += ((const float *)c->g->src[r])[d0 + i];
        out[i] = s;
    }
    pthread_barrier_wait(&c->g->bar);
    count(c, OP_RS_V, N, 4);
    return 0;
}

static int c_ag_v(void *ctx, const float *in, float *out, const size_t *counts) {
    rank_ctx *c = ctx;
    const size_t N = sum_counts(c->g, counts);
    size_t off = 0;
    post(c, OP_AG_V, in, N, 0);
    for (int r = 0; r < c->g->n; r++) {
        if (out + off != c->g->src[r]) memcpy(out + off, c->g->src[r], counts[r] * 4); /* in place: already there */
        off += counts[r];
    }
    pthread_barrier_wait(&c->g->bar);
    count(c, OP_AG_V, N, 4);
    return 0;
}

/* The same collectives on the model's buffers (ff_model_comm's dev_ calls): on the cpu backend
 * a buffer's address is host memory, as with the cpu ff_coll beside it in a worker. The same
 * arithmetic, so a model given these must give the host calls' bits with no host copies. */
static int d_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    (void)st;
    return c_sum(ctx, ff_dptr_addr(buf), n);
}
static int d_ag_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return c_ag_v(ctx, ff_dptr_addr(in), ff_dptr_addr(out), counts);
}
static int d_rs_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return c_rs_v(ctx, ff_dptr_addr(in), ff_dptr_addr(out), counts);
}

/* ---- one rank's run --------------------------------------------------------------------- */

typedef struct result {
    float lp[NT], ent[NT], val[NT], lp07[NT], ent07[NT];
    double loss, norms[NSTEPS];
    int64_t workspace; /* ff_model_memory_of after the first training step, bytes */
    ff_tensor_set *w0, *grads, *after, *optim;
    ff_tensor_set *reload_w, *reload_o; /* the reference's after/optim loaded, then exported */
    ff_gen_output *gen;
    int32_t n_gen;
} result;

typedef struct job {
    const ff_model_config *cfg;
    const ff_tensor_set *w;             /* whole tensors */
    const ff_tensor_set *shards[MAXR];  /* or each rank's shards (ff_model_tp_read_weights) */
    const ff_batch *b;
    const float *a, *c, *d; /* loss = sum_t a lp + c ent + d val */
    const ff_tensor_set *reload_w, *reload_o; /* whole tensors to load at the end, or NULL */
    bool lm;                /* the model has an LM head */
    bool sp;                /* sequence parallelism */
    bool dev;               /* the communicator's dev_ calls (the model's buffers) too */
    bool exact;             /* compare() bit for bit (against the same TP with host calls) */
    bool p16;               /* bf16 products (ff_model_set_bf16_products) */
    group *g;
    result res[MAXR];
} job;

static const int32_t prompt0[] = {3, 17, 42, 5}, prompt1[] = {60, 1}, prompt2[] = {9, 9, 9, 33, 12};

static void run_rank(job *j, int rank, const ff_model_comm *comm) {
    result *r = &j->res[rank];
    const ff_batch *b = j->b;
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    const ff_tensor_set *w = j->shards[rank] ? j->shards[rank] : j->w;
    ff_model_opts mo = {.comm = comm, .sequence_parallel = j->sp};
    ff_model *m = comm ? ff_model_new_opts(be, j->cfg, w, &mo) : ff_model_new(be, j->cfg, w);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    if (j->p16) REQUIRE(ff_model_set_bf16_products(m, true) == 0);
    REQUIRE(ff_model_reserve(m, NT) == 0);
    r->w0 = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, r->w0) == 0);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    /* eps near the clipped gradients' elements (1e-5 .. 1e-3): the update then depends on
     * the gradient's scale, so a gradient counted twice would show (with eps 1e-8 Adam is
     * scale-invariant), and the rounding of near-zero elements is not blown up into
     * lr-sized steps of either sign (measured with eps 1e-8: 1e-4 absolute) */
    ac.eps = 1e-4;
    ac.beta2 = 0.95;
    ac.weight_decay = 0.1;
    ac.max_grad_norm = 0.5;
    ac.warmup_steps = 1;
    ac.total_steps = 3;
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    const bool vh = j->cfg->value_head;
    float lp[NT], ent[NT], val[NT]; /* steps after the first */
    for (int s = 0; s < NSTEPS; s++) {
        if (comm) ((rank_ctx *)comm->ctx)->counting = s == 0; /* one training step */
        ff_model_zero_grad(m);
        ff_forward_out o = {.logprobs = j->lm ? s ? lp : r->lp : NULL, .entropy = j->lm ? s ? ent : r->ent : NULL,
                            .values = vh ? s ? val : r->val : NULL};
        ff_forward_opts tr = {.train = true};
        REQUIRE(ff_model_forward(m, b, &tr, &o) == 0);
        if (s == 0) {
            r->loss = 0;
            for (int t = 0; t < b->n_tokens; t++)
                r->loss += (j->lm ? j->a[t] * (double)r->lp[t] + j->c[t] * (double)r->ent[t] : 0) + (vh ? j->d[t] * (double)r->val[t] : 0);
        }
        REQUIRE(ff_model_backward(m, j->lm ? j->a : NULL, j->lm ? j->c : NULL, vh ? j->d : NULL) == 0);
        ff_optim_stats st;
        REQUIRE(ff_optimizer_step(opt, &st) == 0);
        r->norms[s] = st.grad_norm;
        if (comm) ((rank_ctx *)comm->ctx)->counting = false;
        if (s == 0) { /* the step reads the gradients and leaves them */
            ff_model_memory mem;
            ff_model_memory_of(m, &mem);
            r->workspace = mem.workspace;
            r->grads = ff_tensor_set_new();
            REQUIRE(ff_model_export_grads(m, r->grads) == 0);
        }
    }
    r->after = ff_tensor_set_new();
    r->optim = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, r->after) == 0);
    REQUIRE(ff_optimizer_export_state(opt, r->optim) == 0);
    if (j->reload_w) { /* slicing the weights and the optimizer state in, gathering them out */
        r->reload_w = ff_tensor_set_new();
        r->reload_o = ff_tensor_set_new();
        REQUIRE(ff_model_load_weights(m, j->reload_w) == 0 && ff_optimizer_import_state(opt, j->reload_o) == 0);
        REQUIRE(ff_model_export_weights(m, r->reload_w) == 0 && ff_optimizer_export_state(opt, r->reload_o) == 0);
    }
    if (j->lm) {
        /* scoring (activations reused in place) at another temperature */
        ff_forward_opts sc = {.temperature = 0.7f};
        ff_forward_out o = {.logprobs = r->lp07, .entropy = r->ent07};
        REQUIRE(ff_model_forward(m, b, &sc, &o) == 0);
        if (comm && !j->p16) { /* the same rank as an inference-only model taking its weights: the same bits */
            ff_tensor_set *mine = ff_tensor_set_new();
            REQUIRE(mine && ff_model_export_weights(m, mine) == 0);
            ff_model_opts io = {.inference = true, .comm = comm, .sequence_parallel = j->sp};
            ff_model *inf = ff_model_new_from(be, j->cfg, &mine, &io);
            REQUIRE(inf && mine == NULL && ff_model_is_inference(inf) && ff_model_tp_size(inf) == comm->size);
            REQUIRE(ff_model_reserve(inf, NT) == 0);
            float lpi[NT], enti[NT];
            ff_forward_out oi = {.logprobs = lpi, .entropy = enti};
            REQUIRE(ff_model_forward(inf, b, &sc, &oi) == 0);
            CHECK(!memcmp(lpi, r->lp07, sizeof(float) * (size_t)b->n_tokens) && !memcmp(enti, r->ent07, sizeof(float) * (size_t)b->n_tokens));
            ff_tensor_set *g = ff_tensor_set_new();
            CHECK(ff_model_export_grads(inf, g) == -1); /* no gradients to gather */
            ff_tensor_set_destroy(&g);
            ff_model_destroy(&inf);
        }
        ff_gen_request q[3];
        memset(q, 0, sizeof q);
        const int32_t *pr[3] = {prompt0, prompt1, prompt2};
        const int32_t pl[3] = {4, 2, 5}, ns[3] = {2, 1, 2};
        for (int i = 0; i < 3; i++) {
            q[i].id = (uint64_t)(100 + i);
            q[i].prompt = pr[i];
            q[i].prompt_len = pl[i];
            q[i].n_samples = ns[i];
            ff_sampling_default(&q[i].sampling);
            q[i].sampling.max_new_tokens = 12;
            q[i].seed = (uint64_t)(7 + i);
        }
        q[1].sampling.temperature = 0.8f;
        q[1].sampling.top_k = 20;
        q[1].sampling.top_p = 0.9f;
        q[1].sampling.logprob_mode = FF_LOGPROB_SAMPLER;
        q[2].sampling.temperature = 0.0f;
        ff_generator_config gc = {.max_slots = 3, .max_seq_len = 24, .max_prefill_tokens = 8}; /* 5 sequences queue */
        if (ff_model_generate(m, &gc, q, 3, &r->gen, &r->n_gen)) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(r->gen);
    }
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
}

typedef struct thread_arg {
    job *j;
    rank_ctx ctx;
} thread_arg;

static void *rank_main(void *p) {
    thread_arg *a = p;
    ff_model_comm comm = {.rank = a->ctx.rank, .size = a->ctx.g->n, .ctx = &a->ctx, .all_reduce_sum = c_sum,
                          .all_reduce_max = c_max, .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather,
                          .reduce_scatter_sum_v = c_rs_v, .all_gather_v = c_ag_v};
    if (a->j->dev) comm.dev_all_reduce_sum = d_sum, comm.dev_all_gather_v = d_ag_v, comm.dev_reduce_scatter_sum_v = d_rs_v;
    run_rank(a->j, a->ctx.rank, &comm);
    return NULL;
}

static void run_group(job *j, int tp) {
    group *g = calloc(1, sizeof *g);
    REQUIRE(g);
    g->n = tp;
    pthread_barrier_init(&g->bar, NULL, (unsigned)tp);
    j->g = g;
    thread_arg args[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < tp; r++) {
        args[r] = (thread_arg){.j = j, .ctx = {.g = g, .rank = r}};
        REQUIRE(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < tp; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < tp; r++) free(args[r].ctx.tmp);
    pthread_barrier_destroy(&g->bar);
}

static void free_result(result *r) {
    ff_tensor_set_destroy(&r->w0);
    ff_tensor_set_destroy(&r->grads);
    ff_tensor_set_destroy(&r->after);
    ff_tensor_set_destroy(&r->optim);
    ff_tensor_set_destroy(&r->reload_w);
    ff_tensor_set_destroy(&r->reload_o);
    for (int32_t i = 0; i < r->n_gen; i++) ff_gen_output_free(&r->gen[i]);
    free(r->gen);
    memset(r, 0, sizeof *r);
}

/* ---- comparisons -------------------------------------------------------------------------- */

/* The worst error seen per kind of comparison, relative to the compared array's largest
 * element (printed at the end: the measured margins behind the tolerances). */
typedef enum { K_OUT, K_GRAD, K_AFTER, K_GEN, K_N } kind;
static const char *kind_name[K_N] = {"log-probs, entropy, values", "gradients", "weights and AdamW state after 3 steps",
                                     "generated log-probs"};
static double worst_rel[K_N], worst_abs[K_N];

static void close_k(kind k, const char *what, const float *got, const float *want, int64_t n, double atol, double rtol) {
    double mx = 0, e = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(want[i]));
        e = fmax(e, fabs((double)got[i] - want[i]));
    }
    if (rtol > 0 && mx > 0 && e / mx > worst_rel[k]) worst_rel[k] = e / mx;
    if (rtol > 0 && e > worst_abs[k]) worst_abs[k] = e;
    check_tensor_close(what, got, want, n, atol, rtol);
}

/* every tensor of want, present in got with its shape, within atol + rtol max|want|
 * (rtol < 0: bit for bit) */
typedef struct tol {
    kind kd;
    double atol, rtol;
} tol;
static void pair_close(void *ctx, const char *name, const float *got, const float *want, int64_t n) {
    const tol *t = ctx;
    if (t->rtol < 0) check_tensor_bits(name, got, want, n);
    else close_k(t->kd, name, got, want, n, t->atol, t->rtol);
}
static void compare_sets(kind kd, const char *what, const ff_tensor_set *got, const ff_tensor_set *want, double atol,
                         double rtol) {
    compare_tensor_sets(what, got, want, pair_close, &(tol){kd, atol, rtol});
}

static void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes)) {
        fprintf(stderr, "%s: ranks disagree\n", what);
        ff_test_failures++;
    }
}

/* fp32 tolerances against the single-rank model, relative to each array's largest element:
 * the sums differ only in order (a partial product per rank, then the all-reduce). The
 * measured worst errors are printed at the end (on the development machine: outputs 8e-7,
 * gradients 2.2e-6, after AdamW 5.7e-5 of a bias whose largest element is 0.015, i.e.
 * 8.5e-7 absolute: Adam divides by the gradient's own size, so near-zero elements keep
 * their relative rounding error). Plus, after AdamW, 1e-3 of one step's learning rate. */
#define TOL_OUT 2e-5   /* log-probs, entropy, values */
#define TOL_GRAD 3e-5  /* every gradient */
#define TOL_AFTER 3e-5 /* weights and optimizer state after three AdamW steps */
#define ATOL_AFTER 1e-5

static void compare(const char *cfg_name, int tp, const job *j, const result *ref) {
    char what[128];
    const result *r = &j->res[0];
    const int T = j->b->n_tokens;
    snprintf(what, sizeof what, "%s tp%d", cfg_name, tp);
    bool exact = tp == 1 || j->exact;
    double k = exact ? -1 : 1; /* rtol < 0: bit for bit */
    char w[192];
    snprintf(w, sizeof w, "%s export after load", what);
    compare_sets(K_AFTER, w, r->w0, j->w, 0, -1); /* slicing and gathering are copies */
    if (j->lm) {
        snprintf(w, sizeof w, "%s logprobs", what);
        if (exact) same_bits(w, r->lp, ref->lp, sizeof r->lp);
        else close_k(K_OUT, w, r->lp, ref->lp, T, 0, TOL_OUT);
        snprintf(w, sizeof w, "%s entropy", what);
        if (exact) same_bits(w, r->ent, ref->ent, sizeof r->ent);
        else close_k(K_OUT, w, r->ent, ref->ent, T, 0, TOL_OUT);
        snprintf(w, sizeof w, "%s logprobs at temperature 0.7", what);
        close_k(K_OUT, w, r->lp07, ref->lp07, T, 0, exact ? 0 : TOL_OUT);
        snprintf(w, sizeof w, "%s entropy at temperature 0.7", what);
        close_k(K_OUT, w, r->ent07, ref->ent07, T, 0, exact ? 0 : TOL_OUT);
    }
    if (j->cfg->value_head) {
        snprintf(w, sizeof w, "%s values", what);
        close_k(K_OUT, w, r->val, ref->val, T, 0, exact ? 0 : TOL_OUT);
    }
    CHECK_CLOSE(r->loss, ref->loss, exact ? 0 : 1e-6, exact ? 0 : 1e-5);
    for (int s = 0; s < NSTEPS; s++) CHECK_CLOSE(r->norms[s], ref->norms[s], 0, exact ? 0 : 1e-5);
    snprintf(w, sizeof w, "%s gradient", what);
    compare_sets(K_GRAD, w, r->grads, ref->grads, 0, exact ? k : TOL_GRAD);
    snprintf(w, sizeof w, "%s after %d AdamW steps", what, NSTEPS);
    compare_sets(K_AFTER, w, r->after, ref->after, exact ? 0 : ATOL_AFTER, exact ? k : TOL_AFTER);
    snprintf(w, sizeof w, "%s optimizer state", what);
    compare_sets(K_AFTER, w, r->optim, ref->optim, 0, exact ? k : TOL_AFTER);
    if (j->reload_w) {
        snprintf(w, sizeof w, "%s weights loaded and exported", what);
        compare_sets(K_AFTER, w, r->reload_w, j->reload_w, 0, -1);
        snprintf(w, sizeof w, "%s optimizer state imported and exported", what);
        compare_sets(K_AFTER, w, r->reload_o, j->reload_o, 0, -1);
    }
    if (j->lm) {
        CHECK_EQ_INT(r->n_gen, ref->n_gen);
        int same_tokens = 0, total = 0;
        for (int32_t i = 0; i < r->n_gen && i < ref->n_gen; i++) {
            const ff_gen_output *a = &r->gen[i], *b = &ref->gen[i];
            CHECK_EQ_INT(a->n_tokens, b->n_tokens);
            for (int32_t t = 0; t < a->n_tokens && t < b->n_tokens; t++, total++) same_tokens += a->tokens[t] == b->tokens[t];
            if (a->n_tokens == b->n_tokens) {
                snprintf(w, sizeof w, "%s generated log-probs, sequence %d", what, i);
                close_k(K_GEN, w, a->logprobs, b->logprobs, a->n_tokens, 0, exact ? 0 : TOL_OUT);
            }
        }
        if (same_tokens != total) {
            fprintf(stderr, "%s: %d of %d generated tokens differ from TP 1\n", what, total - same_tokens, total);
            ff_test_failures++;
        }
        CHECK(total >= 50);
    }
    /* every rank: the same outputs and the same whole tensors */
    for (int q = 1; q < tp; q++) {
        const result *o = &j->res[q];
        snprintf(w, sizeof w, "%s rank %d outputs", what, q);
        if (j->lm) same_bits(w, o->lp, r->lp, sizeof r->lp), same_bits(w, o->ent, r->ent, sizeof r->ent);
        if (j->cfg->value_head) same_bits(w, o->val, r->val, sizeof r->val);
        snprintf(w, sizeof w, "%s rank %d weights after", what, q);
        compare_sets(K_AFTER, w, o->after, r->after, 0, -1);
        if (j->lm)
            for (int32_t i = 0; i < r->n_gen; i++)
                same_bits(w, o->gen[i].tokens, r->gen[i].tokens, (size_t)r->gen[i].n_tokens * 4);
    }
}

/* What one training step must move per rank (docs/model.md, "Tensor parallelism"): per
 * layer two [T, H] sums forward and two backward, one for the embedding, one for the LM
 * head's input gradient, the vocabulary statistics (a max of [T], a sum of [3, T]), the
 * gradient norm (one double), and with replicated key/value heads one sum of
 * [Hkv, 2 D (H + bias)] per layer. With sequence parallelism ("Sequence parallelism") each
 * [T, H] sum is an all-gather and a reduce-scatter instead (per layer two of each forward,
 * two of each backward; the embedding's reduce-scatter forward and all-gather backward; the
 * LM head's input all-gather forward and reduce-scatter backward), plus the values'
 * all-gather of [T] and one sum of the norms' and value head's gradients [(2 L + 1 + vh) H].
 * tp_bytes: the same step's bytes without SP (SP), to which SP adds only those two. */
static void check_traffic(const char *cfg_name, int tp, const job *j, double tp_bytes) {
    const ff_model_config *c = j->cfg;
    const int L = c->num_hidden_layers, H = c->hidden_size, T = j->b->n_tokens, Hkv = c->num_key_value_heads;
    const int D = H / c->num_attention_heads, vh = c->value_head ? 1 : 0;
    const size_t sp_w = (size_t)(2 * L + 1 + vh) * (size_t)H;
    for (int q = 0; q < tp; q++) {
        const traffic *t = &j->g->tr[q];
        int64_t th = 0, vmax = 0, vsum = 0, norm = 0, kv = 0, other = 0, ag = 0, rs = 0, vag = 0, spg = 0;
        for (int i = 0; i < t->n; i++) {
            size_t n = t->count[i];
            if (t->op[i] == OP_SUM && n == (size_t)T * H) th += t->calls[i];
            else if (t->op[i] == OP_AG_V && n == (size_t)T * H) ag += t->calls[i];
            else if (t->op[i] == OP_RS_V && n == (size_t)T * H) rs += t->calls[i];
            else if (t->op[i] == OP_AG_V && n == (size_t)T) vag += t->calls[i];
            else if (t->op[i] == OP_SUM && n == sp_w && j->sp) spg += t->calls[i];
            else if (t->op[i] == OP_MAX && n == (size_t)T) vmax += t->calls[i];
            else if (t->op[i] == OP_SUM && n == 3 * (size_t)T) vsum += t->calls[i];
            else if (t->op[i] == OP_SUM64 && n == 1) norm += t->calls[i];
            else if (t->op[i] == OP_SUM && n == (size_t)Hkv * 2 * D * (H + (c->attention_bias ? 1 : 0))) kv += t->calls[i];
            else {
                fprintf(stderr, "%s tp%d rank %d: unexpected %s of %zu (%lld calls)\n", cfg_name, tp, q, op_name[t->op[i]], n,
                        (long long)t->calls[i]);
                other++;
            }
        }
        CHECK_EQ_INT(th, j->sp ? 0 : 4 * L + 1 + (j->lm ? 1 : 0));
        CHECK_EQ_INT(ag, j->sp ? 4 * L + 1 + (j->lm ? 1 : 0) : 0);
        CHECK_EQ_INT(rs, j->sp ? 4 * L + 1 + (j->lm ? 1 : 0) : 0);
        CHECK_EQ_INT(vag, j->sp ? vh : 0);
        CHECK_EQ_INT(spg, j->sp ? 1 : 0);
        CHECK_EQ_INT(vmax, j->lm ? 1 : 0);
        CHECK_EQ_INT(vsum, j->lm ? 1 : 0);
        CHECK_EQ_INT(norm, 1);
        CHECK_EQ_INT(kv, tp > Hkv ? L : 0);
        CHECK_EQ_INT(other, 0);
    }
    /* the planner's traffic.tp for this layout (TP t on t GPUs of one server, one micro-batch
     * of one T-token sequence, FP32 gradients on the wire): 4 L all-reduces of T h BF16
     * elements (with SP as many all-gathers and reduce-scatters: the same ring bytes), and with
     * replicated key/value heads L of the K/V weight gradients */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    in.model = (ff_plan_model){.layers = L, .hidden = H, .heads = c->num_attention_heads, .kv_heads = Hkv,
                               .head_dim = D, .ffn = c->intermediate_size, .vocab = c->vocab_size,
                               .tied_embeddings = c->tie_word_embeddings, .gated_mlp = true,
                               .linear_bias = c->attention_bias};
    snprintf(in.model.name, sizeof in.model.name, "test");
    in.workload.seq = T;
    in.workload.micro_batch = 1;
    in.workload.micro_batches = 1;
    in.workload.global_batch = 0;
    in.workload.grad_reduce_bytes = 4;
    in.layout.tp = tp;
    in.layout.sequence_parallel = j->sp; /* as here */
    in.cluster.gpus = tp;
    const double got = j->g->tr[0].ring_bytes, f = (double)(tp - 1) / tp;
    /* SP's own extras: the values' gather, the sum of the norms' and value head's gradients */
    const double sp_extra = j->sp ? f * T * 4.0 * vh + 2.0 * f * (double)sp_w * 4.0 : 0.0;
    if (j->sp) CHECK_CLOSE(got, tp_bytes + sp_extra, 0, 1e-12); /* an all-reduce's ring bytes are a reduce-scatter's and an all-gather's */
    ff_plan_result pr;
    int rc = ff_plan_evaluate(&in, &pr);
    /* the planner refuses SP over tokens that TP does not divide (here T = 30 at TP 4: the
     * engine splits them 8 8 7 7) */
    if (j->sp && T % tp) {
        CHECK(rc == -1);
        CHECK_STR_CONTAINS(ff_error_message(), "sequence parallelism splits");
        printf("%s tp%d SP: one training step moves %.0f bytes per rank (ring): TP's and %.0f of SP's own (the planner refuses %d tokens over %d)\n",
               cfg_name, tp, got, sp_extra, T, tp);
        return;
    }
    REQUIRE(rc == 0); /* replicated key/value heads (tp > Hkv) too */
    const double plan = pr.traffic[FF_PLAN_TP].bytes;
    if (j->sp) CHECK_STR_CONTAINS(pr.traffic[FF_PLAN_TP].collective, "all-gather + reduce-scatter");
    ff_plan_result_clear(&pr);
    const double kvn = (double)Hkv * 2 * D * (H + (c->attention_bias ? 1 : 0)) * 4.0; /* bytes of one K/V gradient sum */
    const double plan_kv = tp > Hkv ? L * ff_plan_ring_allreduce_bytes(tp, kvn) : 0.0;
    CHECK_CLOSE(plan - plan_kv, ff_plan_tp_bytes(L, 1, tp, T, H), 0, 1e-12); /* its formula for the layers */
    /* what the planner does not count: the embedding's sum, the LM head's input gradient, the
     * vocabulary statistics ([T] max, [3, T] sum), the norm (one double), SP's extras; and its
     * activations are BF16, ours FP32 */
    const double extra = ff_plan_ring_allreduce_bytes(tp, 4.0 * T * H) * (1 + (j->lm ? 1 : 0)) +
                         (j->lm ? ff_plan_ring_allreduce_bytes(tp, 4.0 * T) + ff_plan_ring_allreduce_bytes(tp, 12.0 * T) : 0.0) +
                         ff_plan_ring_allreduce_bytes(tp, 8.0) + sp_extra;
    CHECK_CLOSE(got, 2.0 * (plan - plan_kv) + plan_kv + extra, 0, 1e-12);
    printf("%s tp%d%s: one training step moves %.0f bytes per rank (ring), the planner's traffic.tp %.0f: ratio %.3f = "
           "(2 x the layers' %.0f (fp32 here, bf16 there) + %.0f of k/v gradient sums (fp32 in both) + %.0f the planner does not count "
           "(the embedding%s, the gradient norm%s)) / %.0f\n",
           cfg_name, tp, j->sp ? " SP" : "", got, plan, got / plan, plan - plan_kv, plan_kv, extra,
           j->lm ? ", the LM head's input gradient, the vocabulary statistics" : "", j->sp ? ", SP's gradient sum and values gather" : "", plan);
}

/* ---- the cases ------------------------------------------------------------------------------ */

/* Each rank reads only its shards of a whole checkpoint (sharded into several files), gets
 * exactly the slices of the whole tensors, as many elements as its parameters, and a group
 * built from them runs as one built from whole tensors. */
static void test_read_shards(const char *name, const ff_model_config *cfg, const ff_tensor_set *w, job *j, const job *ref,
                             int tp) {
    char dir[] = "/tmp/ff_test_model_tp_XXXXXX", cmd[64];
    REQUIRE(mkdtemp(dir));
    REQUIRE(ff_safetensors_save_sharded(dir, w, FF_DTYPE_F32, 24 * 1024) == 0);
    char index[128];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    CHECK(access(index, F_OK) == 0); /* more than one file */
    ff_tensor_set *sh[MAXR] = {0};
    for (int r = 0; r < tp; r++) {
        sh[r] = ff_tensor_set_new();
        if (ff_model_tp_read_weights(dir, cfg, r, tp, sh[r])) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(sh[r]->n == w->n);
        int64_t elems = 0;
        for (size_t i = 0; i < sh[r]->n; i++) elems += ff_host_tensor_numel(&sh[r]->items[i]);
        ff_backend *be = ff_backend_new("cpu:1");
        ff_model_comm solo = {.rank = r, .size = tp, .all_reduce_sum = c_sum, .all_reduce_max = c_max,
                              .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather}; /* never called here */
        ff_model *m = ff_model_new_tp(be, cfg, sh[r], &solo);
        REQUIRE(m);
        CHECK_EQ_INT(elems, ff_model_param_count(m)); /* nothing but the rank's own elements */
        ff_model_destroy(&m);
        ff_backend_destroy(&be);
        /* the shard of embed_tokens is its rows [r V/tp, (r+1) V/tp); of down_proj its columns */
        const ff_host_tensor *e = need_tensor(sh[r], "model.embed_tokens.weight"), *ew = need_tensor(w, "model.embed_tokens.weight");
        const int64_t H = cfg->hidden_size, rows = cfg->vocab_size / tp;
        CHECK_EQ_INT(e->shape[0], rows);
        CHECK(memcmp(e->data, ew->data + (size_t)(r * rows * H), (size_t)(rows * H) * 4) == 0);
        const ff_host_tensor *d = need_tensor(sh[r], "model.layers.2.mlp.down_proj.weight");
        const ff_host_tensor *dw = need_tensor(w, "model.layers.2.mlp.down_proj.weight");
        const int64_t c = cfg->intermediate_size / tp;
        CHECK_EQ_INT(d->shape[1], c);
        for (int64_t i = 0; i < H; i++)
            CHECK(memcmp(d->data + (size_t)(i * c), dw->data + (size_t)(i * cfg->intermediate_size + r * c), (size_t)c * 4) == 0);
    }
    /* a pipeline stage's read (ff_model_read_shards): layers [0, L/2) and [L/2, L), each only its
     * layers' tensors (the embedding on the first, and, tied, on the last too; the final norm
     * and heads on both), and the stage model from them holds what one from whole tensors does */
    const int32_t L = cfg->num_hidden_layers, half = L / 2;
    for (int s = 0; s < 2; s++) {
        const int32_t first = s ? half : 0, count = s ? L - half : half;
        const ff_model_stage st = {.n_chunks = 1, .first_layer = &first, .n_layers = &count};
        for (int r = 0; r < tp; r++) {
            ff_tensor_set *part = ff_tensor_set_new();
            REQUIRE(ff_model_read_shards(dir, cfg, r, tp, &st, part) == 0);
            for (size_t i = 0; i < w->n; i++) {
                const char *nm = w->items[i].name;
                int layer = -1;
                bool held = sscanf(nm, "model.layers.%d.", &layer) == 1 ? layer >= first && layer < first + count
                            : !strcmp(nm, "model.embed_tokens.weight") ? s == 0 || cfg->tie_word_embeddings
                                                                       : true;
                if ((ff_tensor_set_find(part, nm) != NULL) != held) {
                    fprintf(stderr, "%s stage %d tp rank %d: '%s' %s\n", name, s, r, nm, held ? "not read" : "read, not its own");
                    ff_test_failures++;
                }
            }
            ff_backend *be = ff_backend_new("cpu:1");
            ff_model_comm solo = {.rank = r, .size = tp, .all_reduce_sum = c_sum, .all_reduce_max = c_max,
                                  .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather}; /* never called here */
            ff_model *a = ff_model_new_opts(be, cfg, part, &(ff_model_opts){.comm = &solo, .stage = &st});
            ff_model *b = ff_model_new_opts(be, cfg, sh[r], &(ff_model_opts){.comm = &solo, .stage = &st});
            REQUIRE(a && b);
            REQUIRE(ff_model_param_count(a) == ff_model_param_count(b));
            const int64_t n = ff_model_param_count(a);
            float *pa = malloc((size_t)n * 4), *pb = malloc((size_t)n * 4);
            ff_model_read_params(a, pa);
            ff_model_read_params(b, pb);
            CHECK(memcmp(pa, pb, (size_t)n * 4) == 0);
            free(pa), free(pb);
            ff_model_destroy(&a);
            ff_model_destroy(&b);
            ff_backend_destroy(&be);
            ff_tensor_set_destroy(&part);
        }
    }
    *j = (job){.cfg = cfg, .w = w, .b = ref->b, .a = ref->a, .c = ref->c, .d = ref->d, .lm = ref->lm};
    for (int r = 0; r < tp; r++) j->shards[r] = sh[r];
    run_group(j, tp);
    char what[96];
    snprintf(what, sizeof what, "%s from shards", name);
    compare(what, tp, j, &ref->res[0]);
    for (int r = 0; r < tp; r++) free_result(&j->res[r]), ff_tensor_set_destroy(&sh[r]);
    free(j->g);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

/* Sequence parallelism on pipeline stages: every TP rank holds two stage models (layers
 * [0, L/2) and [L/2, L)) with SP on the same group, and one training step runs through both:
 * the hidden states and their gradient between the stages are whole [T, H] (gathered), the
 * same bits on every rank, and the log-probs, entropy, values and every gradient (the union
 * of the stages' exports) are the single-rank whole model's within the tolerances above. */
typedef struct stage_result {
    float lp[NT], ent[NT], val[NT];
    float *hidden, *dhidden; /* [NT, H] between the stages */
    ff_tensor_set *grads;
} stage_result;

typedef struct stage_job {
    const job *j;
    int tp;
    group *g;
    stage_result res[MAXR];
} stage_job;

typedef struct stage_arg {
    stage_job *sj;
    rank_ctx ctx;
} stage_arg;

static void *stage_rank(void *p) {
    stage_arg *a = p;
    const job *j = a->sj->j;
    stage_result *r = &a->sj->res[a->ctx.rank];
    const int L = j->cfg->num_hidden_layers, H = j->cfg->hidden_size, half = L / 2;
    ff_model_comm comm = {.rank = a->ctx.rank, .size = a->ctx.g->n, .ctx = &a->ctx, .all_reduce_sum = c_sum,
                          .all_reduce_max = c_max, .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather,
                          .reduce_scatter_sum_v = c_rs_v, .all_gather_v = c_ag_v};
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    const int32_t first[2] = {0, half}, count[2] = {half, L - half};
    ff_model *m[2];
    for (int s = 0; s < 2; s++) {
        ff_model_stage st = {.n_chunks = 1, .first_layer = &first[s], .n_layers = &count[s]};
        ff_model_opts o = {.comm = &comm, .stage = &st, .sequence_parallel = true};
        m[s] = ff_model_new_opts(be, j->cfg, j->w, &o);
        if (!m[s]) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(m[s] && ff_model_reserve(m[s], NT) == 0 && ff_model_zero_grad(m[s]) == 0);
    }
    r->hidden = calloc((size_t)NT * H, sizeof(float));
    r->dhidden = calloc((size_t)NT * H, sizeof(float));
    REQUIRE(r->hidden && r->dhidden);
    const bool vh = j->cfg->value_head;
    ff_forward_opts tr = {.train = true};
    ff_forward_out o = {.logprobs = r->lp, .entropy = r->ent, .values = vh ? r->val : NULL};
    REQUIRE(ff_model_stage_forward(m[0], 0, 0, j->b, NULL, &tr, NULL, r->hidden) == 0);
    REQUIRE(ff_model_stage_forward(m[1], 0, 0, j->b, r->hidden, &tr, &o, NULL) == 0);
    REQUIRE(ff_model_stage_backward(m[1], 0, 0, NULL, j->a, j->c, vh ? j->d : NULL, r->dhidden) == 0);
    REQUIRE(ff_model_stage_backward(m[0], 0, 0, r->dhidden, NULL, NULL, NULL, NULL) == 0);
    r->grads = ff_tensor_set_new();
    for (int s = 0; s < 2; s++) {
        REQUIRE(ff_model_export_grads(m[s], r->grads) == 0);
        ff_model_destroy(&m[s]);
    }
    ff_backend_destroy(&be);
    return NULL;
}

static void test_stages_sp(const char *name, const job *ref, int tp) {
    stage_job *sj = calloc(1, sizeof *sj);
    group *g = calloc(1, sizeof *g);
    REQUIRE(sj && g);
    *sj = (stage_job){.j = ref, .tp = tp, .g = g};
    g->n = tp;
    pthread_barrier_init(&g->bar, NULL, (unsigned)tp);
    stage_arg args[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < tp; r++) {
        args[r] = (stage_arg){.sj = sj, .ctx = {.g = g, .rank = r}};
        REQUIRE(pthread_create(&th[r], NULL, stage_rank, &args[r]) == 0);
    }
    for (int r = 0; r < tp; r++) pthread_join(th[r], NULL);
    const result *want = &ref->res[0];
    const size_t hb = (size_t)NT * (size_t)ref->cfg->hidden_size * sizeof(float);
    char w[160];
    snprintf(w, sizeof w, "%s tp%d SP on two stages", name, tp);
    const stage_result *r = &sj->res[0];
    close_k(K_OUT, w, r->lp, want->lp, NT, 0, TOL_OUT);
    close_k(K_OUT, w, r->ent, want->ent, NT, 0, TOL_OUT);
    if (ref->cfg->value_head) close_k(K_OUT, w, r->val, want->val, NT, 0, TOL_OUT);
    compare_sets(K_GRAD, w, r->grads, want->grads, 0, TOL_GRAD);
    double hmax = 0;
    for (size_t i = 0; i < hb / 4; i++) hmax = fmax(hmax, fabs(r->hidden[i]) + fabs(r->dhidden[i]));
    CHECK(hmax > 0); /* the boundary carries something */
    for (int q = 1; q < tp; q++) {
        snprintf(w, sizeof w, "%s tp%d SP on two stages, rank %d hidden states", name, tp, q);
        same_bits(w, sj->res[q].hidden, r->hidden, hb);
        same_bits(w, sj->res[q].dhidden, r->dhidden, hb);
        same_bits(w, sj->res[q].lp, r->lp, sizeof r->lp);
    }
    for (int q = 0; q < tp; q++) {
        free(args[q].ctx.tmp);
        free(sj->res[q].hidden);
        free(sj->res[q].dhidden);
        ff_tensor_set_destroy(&sj->res[q].grads);
    }
    pthread_barrier_destroy(&g->bar);
    free(g);
    free(sj);
}

/* j again with the dev_ calls: every output, gradient, weight and state bit for bit the host
 * calls' run, and the same collectives of the same sizes (base: check_traffic's) */
static void same_on_device(const char *name, int tp, const job *j, double base) {
    job *d = calloc(1, sizeof *d);
    REQUIRE(d);
    *d = *j;
    memset(d->res, 0, sizeof d->res);
    d->dev = d->exact = true;
    run_group(d, tp);
    char dn[128];
    snprintf(dn, sizeof dn, "%s on device buffers against host", name);
    compare(dn, tp, d, &j->res[0]);
    check_traffic(dn, tp, d, base);
    for (int r = 0; r < tp; r++) free_result(&d->res[r]);
    free(d->g);
    free(d);
}

/* the largest difference of two tensor sets' elements (as compare_tensor_sets pairs them) */
static void pair_diff(void *ctx, const char *name, const float *got, const float *want, int64_t n) {
    (void)name;
    double *d = ctx;
    for (int64_t i = 0; i < n; i++) d[0] = fmax(d[0], fabs((double)got[i] - want[i])), d[1] = fmax(d[1], fabs(want[i]));
}
static double rel_diff(const char *what, const ff_tensor_set *got, const ff_tensor_set *want) {
    double d[2] = {0, 0};
    compare_tensor_sets(what, got, want, pair_diff, d);
    return d[1] > 0 ? d[0] / d[1] : d[0];
}

/* bf16 products (ff_model_set_bf16_products, the CPU's definition of ff_gemm_bf16): TP (and
 * SP) split the sums of the same rounded products over ranks, so the log-probs, the loss and
 * the gradients are those of TP 1 with bf16 products within bf16 noise (a sum's last bit can
 * flip a later rounding, 2^-8 of an element: measured 4.2e-3 .. 5.7e-3 of the largest, against
 * 1e-2 allowed), and away from fp32 products. Its backward reads the product inputs the forward
 * kept in bf16: the q|k|v weight gradient of key/value heads that ranks share (ffm_tp_kv_grads)
 * and SP's gathered norm outputs among them. The bound catches a wrong buffer or layout (0.2 ..
 * 2.3 with the backward reading the forward's fp32 scratch, or the kept bf16 bytes as fp32),
 * not a rank that multiplies in fp32 (5e-3 .. 1.1e-2 from bf16 products). */
static void test_bf16_products_tp(const char *name, const job *ref32, int tp, bool sp) {
    job *r = calloc(1, sizeof *r), *j = calloc(1, sizeof *j);
    REQUIRE(r && j);
    *r = (job){.cfg = ref32->cfg, .w = ref32->w, .b = ref32->b, .a = ref32->a, .c = ref32->c, .d = ref32->d,
               .lm = ref32->lm, .p16 = true};
    run_rank(r, 0, NULL);
    *j = *r;
    memset(j->res, 0, sizeof j->res);
    j->sp = sp;
    run_group(j, tp);
    const result *g = &j->res[0], *one = &r->res[0], *f32 = &ref32->res[0];
    const int T = j->b->n_tokens;
    char w[160];
    snprintf(w, sizeof w, "%s tp%d%s bf16 products", name, tp, sp ? " SP" : "");
    CHECK_CLOSE(g->loss, one->loss, 1e-3, 1e-2);
    if (j->lm) check_tensor_close(w, g->lp, one->lp, T, 2e-2, 0);
    const double dg = rel_diff(w, g->grads, one->grads), d32 = rel_diff(w, one->grads, f32->grads);
    printf("%s: gradients %.2g of the largest from TP 1's with bf16 products, TP 1's %.2g from fp32 products\n", w, dg, d32);
    if (!(dg <= 1e-2) || !(d32 > 1e-5)) {
        fprintf(stderr, "%s: gradients %.3g from TP 1's (at most 1e-2), TP 1's %.3g from fp32 products' (above 1e-5)\n", w,
                dg, d32);
        ff_test_failures++;
    }
    for (int q = 1; q < tp; q++) {
        snprintf(w, sizeof w, "%s tp%d bf16 products rank %d", name, tp, q);
        compare_sets(K_AFTER, w, j->res[q].after, g->after, 0, -1);
    }
    for (int q = 0; q < tp; q++) free_result(&j->res[q]);
    free_result(&r->res[0]);
    free(j->g);
    free(j);
    free(r);
}

static void test_config(const char *name, ff_model_config cfg, bool critic, const int *tps, int n_tps) {
    ff_tensor_set *all = ff_tensor_set_new(), *w = ff_tensor_set_new();
    REQUIRE(ff_model_init_weights(&cfg, 21, 0.1, all) == 0); /* 0.3: chaotic, log-probs to -12 */
    for (size_t i = 0; i < all->n; i++) { /* a critic: no lm_head.weight */
        const ff_host_tensor *t = &all->items[i];
        if (critic && !strcmp(t->name, "lm_head.weight")) continue;
        ff_host_tensor *c = ff_tensor_set_add(w, t->name, t->ndim, t->shape);
        REQUIRE(c);
        memcpy(c->data, t->data, (size_t)ff_host_tensor_numel(t) * 4);
    }
    ff_tensor_set_destroy(&all);
    ff_rng rng;
    ff_rng_seed(&rng, 99);
    for (size_t i = 0; i < w->n; i++) { /* norms off 1 too, so that their slicing shows */
        ff_host_tensor *t = &w->items[i];
        if (strstr(t->name, "norm"))
            for (int64_t e = 0; e < ff_host_tensor_numel(t); e++) t->data[e] = (float)(1.0 + 0.3 * ff_rng_normal(&rng));
    }
    bool lm = !critic;
    int32_t tok[NT], ss[5] = {0, 9, 10, 24, NT}, tg[NT];
    for (int t = 0; t < NT; t++) tok[t] = (int32_t)ff_rng_below(&rng, (uint64_t)cfg.vocab_size);
    ff_batch_shift_targets(tok, ss, 4, tg);
    ff_batch b = {.n_tokens = NT, .n_seqs = 4, .tokens = tok, .seq_start = ss, .targets = tg};
    float a[NT], c[NT], d[NT];
    for (int t = 0; t < NT; t++) {
        a[t] = (float)(0.3 * ff_rng_normal(&rng));
        c[t] = (float)(0.3 * ff_rng_normal(&rng));
        d[t] = (float)(0.3 * ff_rng_normal(&rng));
    }
    job *ref = calloc(1, sizeof *ref), *j = calloc(1, sizeof *j);
    REQUIRE(ref && j);
    *ref = (job){.cfg = &cfg, .w = w, .b = &b, .a = a, .c = c, .d = d, .lm = lm};
    run_rank(ref, 0, NULL);
    const result *rr = &ref->res[0];
    CHECK(rr->norms[0] > 0.5); /* clipping is exercised */
    for (int i = 0; i < n_tps; i++) {
        *j = (job){.cfg = &cfg, .w = w, .b = &b, .a = a, .c = c, .d = d, .lm = lm, .reload_w = rr->after,
                   .reload_o = rr->optim};
        run_group(j, tps[i]);
        compare(name, tps[i], j, rr);
        if (tps[i] > 1) check_traffic(name, tps[i], j, 0);
        if (tps[i] > 1) same_on_device(name, tps[i], j, 0);
        if (tps[i] > 1) { /* sequence parallelism: the same model again, against TP 1 and this TP */
            job *s = calloc(1, sizeof *s);
            REQUIRE(s);
            *s = *j;
            memset(s->res, 0, sizeof s->res);
            s->sp = true;
            run_group(s, tps[i]);
            char sn[96];
            snprintf(sn, sizeof sn, "%s SP", name);
            compare(sn, tps[i], s, rr);
            snprintf(sn, sizeof sn, "%s SP against TP", name);
            compare(sn, tps[i], s, &j->res[0]);
            check_traffic(name, tps[i], s, j->g->tr[0].ring_bytes);
            same_on_device(sn, tps[i], s, j->g->tr[0].ring_bytes);
            printf("%s tp%d: workspace per rank after a training step of %d tokens: %lld bytes with SP, %lld without (%.3f)\n",
                   name, tps[i], NT, (long long)s->res[0].workspace, (long long)j->res[0].workspace,
                   (double)s->res[0].workspace / (double)j->res[0].workspace);
            CHECK(s->res[0].workspace < j->res[0].workspace);
            for (int r = 0; r < tps[i]; r++) free_result(&s->res[r]);
            free(s->g);
            free(s);
        }
        for (int r = 0; r < tps[i]; r++) free_result(&j->res[r]);
        free(j->g);
    }
    if (lm && !cfg.tie_word_embeddings) /* a tied last stage's copy needs ff_pipe's sum: tests/pipe */
        for (int i = 0; i < n_tps; i++)
            if (tps[i] > 1) test_stages_sp(name, ref, tps[i]);
    test_read_shards(name, &cfg, w, j, ref, tps[n_tps - 1]);
    test_bf16_products_tp(name, ref, tps[n_tps - 1], !cfg.attention_bias); /* half the configs with SP */
    free_result(&ref->res[0]);
    free(ref);
    free(j);
    ff_tensor_set_destroy(&w);
}

/* a comm of two ranks that must never be called */
static int never(void *ctx, float *b, size_t n) { (void)ctx, (void)b, (void)n; REQUIRE(!"called"); return -1; }
static int never64(void *ctx, double *b, size_t n) { (void)ctx, (void)b, (void)n; REQUIRE(!"called"); return -1; }
static int never_g(void *ctx, const float *i, float *o, size_t n) { (void)ctx, (void)i, (void)o, (void)n; REQUIRE(!"called"); return -1; }
static int never_v(void *ctx, const float *i, float *o, const size_t *n) { (void)ctx, (void)i, (void)o, (void)n; REQUIRE(!"called"); return -1; }

static void test_errors(void) {
    ff_model_config c = tiny_config(64, 32, 48, 2, 8, 4, false, false, false);
    CHECK(ff_model_tp_check(&c, 8, NULL) == 0);
    CHECK(ff_model_tp_check(&c, 3, "cfg") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "num_attention_heads 8 is not a multiple of the tensor-parallel size 3");
    ff_model_config v = c;
    v.vocab_size = 66;
    CHECK(ff_model_tp_check(&v, 4, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "vocab_size 66");
    v = c;
    v.intermediate_size = 50;
    CHECK(ff_model_tp_check(&v, 4, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "intermediate_size 50");
    v = tiny_config(96, 48, 48, 2, 12, 6, false, false, false);
    CHECK(ff_model_tp_check(&v, 4, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "num_key_value_heads 6 and the tensor-parallel size 4");
    CHECK(ff_model_tp_check(&v, 12, NULL) == 0); /* 6 divides 12: each head on 2 ranks */

    ff_backend *be = ff_backend_new("cpu:1");
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(be && w && ff_model_init_weights(&c, 1, 0.1, w) == 0);
    ff_model_comm comm = {.rank = 1, .size = 2, .all_reduce_sum = never, .all_reduce_max = never,
                          .all_reduce_sum_f64 = never64, .all_gather = NULL};
    CHECK(ff_model_new_tp(be, &c, w, &comm) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "a communicator function is NULL");
    comm.all_gather = never_g;
    comm.rank = 2;
    CHECK(ff_model_new_tp(be, &c, w, &comm) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "rank 2 of a group of 2");
    comm.rank = 1;
    /* a tensor neither whole nor this rank's shard */
    ff_tensor_set *bad = ff_tensor_set_new();
    for (size_t i = 0; i < w->n; i++) {
        const ff_host_tensor *t = &w->items[i];
        int64_t shape[2] = {t->shape[0], t->shape[1]};
        if (!strcmp(t->name, "model.layers.1.self_attn.o_proj.weight")) shape[1] = 3;
        REQUIRE(ff_tensor_set_add(bad, t->name, t->ndim, shape));
    }
    CHECK(ff_model_new_tp(be, &c, bad, &comm) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "model.layers.1.self_attn.o_proj.weight");
    ff_tensor_set_destroy(&bad);
    ff_model *m = ff_model_new_tp(be, &c, w, &comm);
    REQUIRE(m);
    CHECK_EQ_INT(ff_model_tp_size(m), 2);
    CHECK_EQ_INT(ff_model_tp_rank(m), 1);
    int32_t tok[3] = {1, 40, 63}, ss[2] = {0, 3};
    float lg[3 * 64];
    ff_batch b = {.n_tokens = 3, .n_seqs = 1, .tokens = tok, .seq_start = ss};
    CHECK(ff_model_forward(m, &b, NULL, &(ff_forward_out){.logits = lg}) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not gathered under tensor parallelism");
    tok[1] = 64; /* the whole vocabulary's range is checked, not the shard's */
    CHECK(ff_model_forward(m, &b, NULL, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "out of range for vocab_size 64");
    ff_model_destroy(&m);
    /* sequence parallelism needs the _v collectives, and at least a token per rank */
    ff_model_opts so = {.comm = &comm, .sequence_parallel = true};
    CHECK(ff_model_new_opts(be, &c, w, &so) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "reduce_scatter_sum_v and all_gather_v");
    comm.reduce_scatter_sum_v = never_v;
    comm.all_gather_v = never_v;
    m = ff_model_new_opts(be, &c, w, &so);
    REQUIRE(m);
    tok[1] = 40;
    b = (ff_batch){.n_tokens = 1, .n_seqs = 1, .tokens = tok, .seq_start = (int32_t[]){0, 1}};
    CHECK(ff_model_forward(m, &b, NULL, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "splits the batch's 1 tokens over 2 tensor-parallel ranks");
    ff_model_destroy(&m);
    ff_tensor_set_destroy(&w);
    ff_backend_destroy(&be);
}

int main(void) {
    test_errors();
    const int all[] = {1, 2, 4, 8}, some[] = {2, 4};
    test_config("untied+bias", tiny_config(64, 32, 48, 4, 8, 4, false, true, false), false, all, 4);
    test_config("tied", tiny_config(64, 32, 48, 4, 8, 4, true, false, false), false, all, 4);
    test_config("value head", tiny_config(64, 32, 48, 4, 8, 4, false, true, true), false, all, 4);
    test_config("critic", tiny_config(64, 32, 48, 4, 8, 2, false, false, true), true, some, 2);
    for (int k = 0; k < K_N; k++)
        printf("TP against TP 1, worst error relative to the largest element: %-40s %.2g (largest %.2g absolute)\n",
               kind_name[k], worst_rel[k], worst_abs[k]);
    return ff_test_failures ? 1 : 0;
}
