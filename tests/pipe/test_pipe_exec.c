/* The pipeline executor in-process: p ranks as threads (one stage model and one cpu:1 backend
 * each) over a transport of mailboxes, against the single-rank model on the same global batch
 * (8 micro-batches, the same loss normalisation). Layouts: PP 2 and 4; GPipe, 1F1B and
 * interleaved 1F1B (v = 2); 4, 5, 7 and 8 layers (uneven splits: 5 over 2, 7 over 4); untied
 * with biases and a value head, and tied embeddings (the first and last stage's copies, their
 * gradients summed).
 *
 * Checked: the first step's log-probs, entropy, values and loss; every gradient after it
 * (exported by the stages, whole tensors, each by exactly one stage); the gradient norm of every
 * step (summed over the stages); the weights and AdamW state after three steps with clipping;
 * a forward-only pass through the trained stages (the forward-only schedule of the same layout)
 * against the trained single-rank model; the tied copies equal bit for bit after training.
 * The numbers agree bit for bit where the arithmetic is the same (outputs, loss, untied
 * gradients: a stage runs the same kernels on the same activations, and a parameter's
 * micro-batch gradients accumulate in the same order); the tied embedding's gradient (two
 * partial sums added) and what follows the clipped step (the norm summed per stage) differ by
 * rounding, within the stated fp32 tolerances. Every rank's time per instruction is recorded
 * and ordered; the measured bubble is printed beside the simulator's on the measured stage
 * times and the planner's formula. Bad setups get errors naming the problem. */
#include <pthread.h>

#include "tests/pipe/pipe_test_util.h"

enum { MAXR = 8, NMICRO = 8 };

/* ---- an in-process transport: a mailbox per (from, to), sums through a barrier ------------- */

typedef struct msg {
    struct msg *next;
    size_t n;
    float data[];
} msg;

typedef struct chan {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    msg *head, *tail;
} chan;

typedef struct group {
    int n;
    chan ch[MAXR][MAXR]; /* [from][to] */
    pthread_barrier_t bar;
    const double *src[MAXR];
    size_t cnt[MAXR];
    int64_t calls[MAXR], floats[MAXR]; /* per rank: transfers posted, floats sent */
} group;

typedef struct rank_ctx {
    group *g;
    int rank;
    double *tmp;
    size_t cap;
} rank_ctx;

static int t_call(void *ctx, const ff_pipe_xfer *x, int n) {
    rank_ctx *c = ctx;
    group *g = c->g;
    for (int i = 0; i < n; i++) { /* sends are buffered: post them all, then wait for the receives */
        if (x[i].kind != FF_PIPE_XFER_SEND) continue;
        REQUIRE(x[i].peer >= 0 && x[i].peer < g->n && x[i].peer != c->rank);
        msg *m = malloc(sizeof *m + sizeof(float) * x[i].count);
        REQUIRE(m);
        m->next = NULL;
        m->n = x[i].count;
        memcpy(m->data, x[i].buf, sizeof(float) * x[i].count);
        chan *ch = &g->ch[c->rank][x[i].peer];
        pthread_mutex_lock(&ch->mu);
        if (ch->tail) ch->tail->next = m;
        else ch->head = m;
        ch->tail = m;
        pthread_cond_broadcast(&ch->cv);
        pthread_mutex_unlock(&ch->mu);
        g->floats[c->rank] += (int64_t)x[i].count;
    }
    for (int i = 0; i < n; i++) {
        g->calls[c->rank]++;
        if (x[i].kind != FF_PIPE_XFER_RECV) continue;
        chan *ch = &g->ch[x[i].peer][c->rank];
        pthread_mutex_lock(&ch->mu);
        while (!ch->head) pthread_cond_wait(&ch->cv, &ch->mu);
        msg *m = ch->head;
        ch->head = m->next;
        if (!ch->head) ch->tail = NULL;
        pthread_mutex_unlock(&ch->mu);
        if (m->n != x[i].count) {
            fprintf(stderr, "rank %d: receive of %zu floats from rank %d met a send of %zu\n", c->rank, x[i].count,
                    x[i].peer, m->n);
            exit(1);
        }
        memcpy(x[i].buf, m->data, sizeof(float) * m->n);
        free(m);
    }
    return 0;
}

static int t_sum64(void *ctx, double *buf, size_t n) {
    rank_ctx *c = ctx;
    group *g = c->g;
    g->src[c->rank] = buf;
    g->cnt[c->rank] = n;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->n; r++) REQUIRE(g->cnt[r] == n);
    if (n > c->cap) {
        REQUIRE((c->tmp = realloc(c->tmp, sizeof(double) * n)));
        c->cap = n;
    }
    for (size_t i = 0; i < n; i++) { /* rank order on every rank: the same bits */
        double s = 0;
        for (int r = 0; r < g->n; r++) s += g->src[r][i];
        c->tmp[i] = s;
    }
    pthread_barrier_wait(&g->bar);
    memcpy(buf, c->tmp, sizeof(double) * n);
    return 0;
}

static group *group_new(int n) {
    group *g = calloc(1, sizeof *g);
    REQUIRE(g);
    g->n = n;
    pthread_barrier_init(&g->bar, NULL, (unsigned)n);
    for (int a = 0; a < MAXR; a++)
        for (int b = 0; b < MAXR; b++) {
            pthread_mutex_init(&g->ch[a][b].mu, NULL);
            pthread_cond_init(&g->ch[a][b].cv, NULL);
        }
    return g;
}

static void group_free(group **pg) {
    group *g = *pg;
    for (int a = 0; a < MAXR; a++)
        for (int b = 0; b < MAXR; b++) {
            CHECK(g->ch[a][b].head == NULL); /* every send was received */
            pthread_mutex_destroy(&g->ch[a][b].mu);
            pthread_cond_destroy(&g->ch[a][b].cv);
        }
    pthread_barrier_destroy(&g->bar);
    free(g);
    *pg = NULL;
}

static ff_pipe_transport transport_of(rank_ctx *c) {
    return (ff_pipe_transport){.rank = c->rank, .size = c->g->n, .ctx = c, .call = t_call, .all_reduce_sum_f64 = t_sum64};
}

/* ---- one layout against the reference -------------------------------------------------------- */

typedef struct job {
    const ff_pipe_config *pc;
    const ff_model_config *cfg;
    const ff_tensor_set *w;
    const pt_batch *g;
    rank_ctx ctx[MAXR];
    pt_result res[MAXR];
} job;

typedef struct targ {
    job *j;
    int rank;
} targ;

static void *rank_main(void *p) {
    targ *a = p;
    ff_pipe_transport t = transport_of(&a->j->ctx[a->rank]);
    pt_rank(a->j->pc, a->j->cfg, a->j->w, a->j->g, &t, "cpu:1", &a->j->res[a->rank]);
    return NULL;
}

static void run_layout(const char *name, const ff_model_config *cfg, const ff_pipe_config *pc, const ff_tensor_set *w,
                       const pt_batch *g, const pt_result *ref) {
    const int p = pc->pp;
    job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (job){.pc = pc, .cfg = cfg, .w = w, .g = g};
    group *gr = group_new(p);
    pthread_t th[MAXR];
    targ args[MAXR];
    for (int r = 0; r < p; r++) {
        j->ctx[r] = (rank_ctx){.g = gr, .rank = r};
        args[r] = (targ){.j = j, .rank = r};
        REQUIRE(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < p; r++) pthread_join(th[r], NULL);
    pt_compare(name, cfg, pc, g, j->res, ref);
    for (int r = 0; r < p; r++) {
        pt_result_free(&j->res[r]);
        free(j->ctx[r].tmp);
    }
    group_free(&gr);
    free(j);
}

static void parity(const char *cfg_name, ff_model_config cfg, const ff_pipe_config *layouts, int n) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 5, 0.2, w) == 0);
    pt_batch g;
    pt_batch_make(&g, NMICRO, cfg.vocab_size, 12, 0, 17);
    pt_result ref;
    pt_reference(&cfg, w, &g, &ref);
    for (int i = 0; i < n; i++) {
        ff_pipe_config pc = layouts[i];
        pc.micro = NMICRO;
        pc.layers = cfg.num_hidden_layers;
        char name[128];
        snprintf(name, sizeof name, "%s pp%d %s%s", cfg_name, pc.pp, ff_pipe_kind_name(pc.kind),
                 pc.kind == FF_PIPE_INTERLEAVED ? " v2" : "");
        run_layout(name, &cfg, &pc, w, &g, &ref);
    }
    pt_result_free(&ref);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
}

/* ---- bad setups ------------------------------------------------------------------------------ */

static int no_call(void *ctx, const ff_pipe_xfer *x, int n) { (void)ctx, (void)x, (void)n; return 0; }
static int no_sum(void *ctx, double *b, size_t n) { (void)ctx, (void)b, (void)n; return 0; }

static void errors(void) {
    ff_model_config cfg = tiny_config(32, 16, 32, 4, 4, 2, false, false, false);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 1, 0.2, w) == 0);
    ff_backend *be = ff_backend_new("cpu:1");
    ff_pipe_config pc = {.pp = 2, .micro = 4, .kind = FF_PIPE_1F1B, .layers = 4};
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(&pc, &s) == 0);
    ff_pipe_transport t = {.rank = 1, .size = 2, .call = no_call, .all_reduce_sum_f64 = no_sum};
    /* the stage's layers must be the schedule's */
    int32_t first[] = {0}, count[] = {2};
    ff_model_stage st = {.n_chunks = 1, .first_layer = first, .n_layers = count};
    ff_model *m = ff_model_new_opts(be, &cfg, w, &(ff_model_opts){.stage = &st});
    REQUIRE(m);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    ff_pipe_exec_model em = {.model = m, .opt = opt, .loss = pt_loss};
    CHECK(ff_pipe_exec_new(&s, 1, &t, &em) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "holds layers [0, 2), the schedule places [2, 4)");
    t.rank = 0;
    CHECK(ff_pipe_exec_new(&s, 1, &t, &em) == NULL); /* the transport's rank is another */
    CHECK_STR_CONTAINS(ff_error_message(), "the transport's group is the schedule's ranks");
    ff_pipe_exec *e = ff_pipe_exec_new(&s, 0, &t, &em);
    CHECK(e != NULL);
    ff_pipe_exec_destroy(&e);
    em.opt = NULL;
    CHECK(ff_pipe_exec_new(&s, 0, &t, &em) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "an optimizer");
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    /* the last stage needs a loss */
    int32_t f1[] = {2};
    st.first_layer = f1;
    REQUIRE((m = ff_model_new_opts(be, &cfg, w, &(ff_model_opts){.stage = &st})));
    REQUIRE((opt = ff_optimizer_new(m, &ac)));
    em = (ff_pipe_exec_model){.model = m, .opt = opt};
    t.rank = 1;
    CHECK(ff_pipe_exec_new(&s, 1, &t, &em) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "has no loss");
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    /* stages of a model: ranges in order, within the layers */
    int32_t bf[] = {2, 0}, bc[] = {2, 2};
    ff_model_stage bad = {.n_chunks = 2, .first_layer = bf, .n_layers = bc};
    CHECK(ff_model_new_opts(be, &cfg, w, &(ff_model_opts){.stage = &bad}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "chunk 1: layers [0, 2) of 4 (the previous chunk ends at 4)");
    /* a schedule without layers cannot place stages */
    ff_pipe_config nl = {.pp = 2, .micro = 4, .kind = FF_PIPE_1F1B};
    ff_pipe_schedule s2;
    REQUIRE(ff_pipe_generate(&nl, &s2) == 0);
    ff_model_stage out;
    CHECK(ff_pipe_stage_layers(&s2, 0, 0, first, count, &out) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no layer placement");
    ff_pipe_schedule_clear(&s2);
    ff_pipe_schedule_clear(&s);
    ff_backend_destroy(&be);
    ff_tensor_set_destroy(&w);
}

int main(void) {
    /* 4 layers: untied, biases, a value head; GPipe, 1F1B and interleaved at PP 2, GPipe and 1F1B at PP 4 */
    const ff_pipe_config l4[] = {{.pp = 2, .kind = FF_PIPE_1F1B}, {.pp = 2, .kind = FF_PIPE_GPIPE},
                                 {.pp = 2, .vpp = 2, .kind = FF_PIPE_INTERLEAVED}, {.pp = 4, .kind = FF_PIPE_1F1B},
                                 {.pp = 4, .kind = FF_PIPE_GPIPE}};
    parity("4 layers", tiny_config(64, 32, 48, 4, 4, 2, false, true, true), l4, 5);
    /* 8 layers, tied embeddings: 1F1B and interleaved at PP 2 and 4 */
    const ff_pipe_config l8[] = {{.pp = 2, .kind = FF_PIPE_1F1B}, {.pp = 2, .vpp = 2, .kind = FF_PIPE_INTERLEAVED},
                                 {.pp = 4, .kind = FF_PIPE_1F1B}, {.pp = 4, .vpp = 2, .kind = FF_PIPE_INTERLEAVED}};
    parity("8 layers tied", tiny_config(64, 32, 48, 8, 4, 2, true, false, false), l8, 4);
    /* uneven: 5 layers over 2 stages, 7 over 4 (tied) */
    const ff_pipe_config l5[] = {{.pp = 2, .kind = FF_PIPE_1F1B}, {.pp = 2, .kind = FF_PIPE_GPIPE}};
    parity("5 layers", tiny_config(64, 32, 48, 5, 4, 2, false, true, true), l5, 2);
    const ff_pipe_config l7[] = {{.pp = 4, .kind = FF_PIPE_1F1B}};
    parity("7 layers tied", tiny_config(64, 32, 48, 7, 4, 2, true, true, true), l7, 1);
    errors();
    pt_print_errors();
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}
