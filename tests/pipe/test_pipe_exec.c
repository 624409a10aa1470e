/* The pipeline executor in-process: p ranks as threads (one stage model and one cpu:1 backend
 * each) over a transport of mailboxes, against the single-rank model on the same global batch
 * (8 micro-batches, the same loss normalisation). Layouts: PP 2 and 4; GPipe, 1F1B and
 * interleaved 1F1B (v = 2); 4, 5, 7 and 8 layers (uneven splits: 5 over 2, 7 over 4); untied
 * with biases and a value head, and tied embeddings (the first and last stage's copies, their
 * gradients summed).
 *
 * Checked: the first step's log-probs, entropy, values and loss; every gradient after it
 * (exported by the stages, whole tensors, each by exactly one stage); the gradient norm of
 * every step (summed over the stages); the weights and AdamW state after three steps with
 * clipping; a forward-only pass through the trained stages (the forward-only schedule of the
 * same layout), and a log-prob/value pipeline of inference-only stages made from the trained
 * weights (the union of the stages' exports), against the trained single-rank model; the tied
 * copies equal bit for bit after training; the activation room reserved per chunk is the
 * stream's (1F1B min(p - s, m), GPipe m) and no step grows it; every rank's instruction times
 * ordered, the bubble recomputed from them (printed beside the simulator's on the measured
 * stage times and the planner's formula).
 *
 * The numbers agree bit for bit where the arithmetic is the same (outputs, loss, untied
 * gradients: a stage runs the same kernels on the same activations, and a parameter's
 * micro-batch gradients accumulate in the same order); the tied embedding's gradient (two
 * partial sums added) and what follows the clipped step (the norm summed per stage) differ by
 * rounding, within the stated fp32 tolerances.
 *
 * Also: a before_step hook standing for the data-parallel all-reduce; two models in one
 * schedule (pipelines in opposite directions, as RLHFuse fuses them); TP 2 x PP 2 (1F1B with
 * tied embeddings, interleaved), each TP rank of a stage a stage model with a TP communicator
 * of threads, within tests/model/test_model_tp.c's tolerances (the sums then run in another
 * order), the TP ranks' whole tensors alike bit for bit, and the same two with sequence
 * parallelism in the stage models (whole hidden states between the stages, micro-batches of
 * odd token counts split unevenly); a run whose transport breaks fails
 * naming the call and leaves nothing in flight, and the next run is the reference's; bad
 * setups get errors naming the problem. */
#include <pthread.h>

#include "tests/pipe/pipe_mailbox.h"
#include "tests/pipe/pipe_test_util.h"

enum { MAXR = 8, NMICRO = 8 };

/* ---- one layout against the reference -------------------------------------------------------- */

typedef struct job {
    int (*before_step)(void *, ff_model *);
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

/* A log-prob and value pipeline: inference-only stage models made from the trained weights
 * (the union of the stages' exports), the forward-only schedule of the same layout. */
typedef struct infer_job {
    const ff_pipe_config *pc;
    const ff_model_config *cfg;
    const ff_tensor_set *w;
    const pt_batch *g;
    rank_ctx *ctx;
    float *lp, *ent, *val; /* [tokens] filled by the last stage's rank */
} infer_job;

typedef struct infer_arg {
    infer_job *j;
    int rank;
} infer_arg;

static void *infer_main(void *p) {
    infer_arg *a = p;
    const infer_job *j = a->j;
    ff_pipe_transport t = transport_of(&j->ctx[a->rank]);
    ff_pipe_config fc = *j->pc;
    fc.forward_only = true;
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(&fc, &s) == 0);
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    REQUIRE(ff_pipe_stage_layers(&s, 0, a->rank, first, count, &st) == 0);
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model *m = ff_model_new_opts(be, j->cfg, j->w, &(ff_model_opts){.inference = true, .stage = &st});
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    ff_pipe_exec_model em = {.model = m, .temperature = PT_TEMP, .logprobs = true, .entropy = true,
                             .values = j->cfg->value_head};
    ff_pipe_exec *e = ff_pipe_exec_new(&s, a->rank, &t, &em);
    REQUIRE(e);
    ff_forward_out o[PT_MAX_MICRO];
    pt_outs(j->g, j->cfg, j->lp, j->ent, j->val, o);
    ff_pipe_run run = {.micro = {j->g->b}, .outs = {a->rank == j->pc->pp - 1 ? o : NULL}};
    ff_pipe_exec_stats x;
    if (ff_pipe_exec_run(e, &run, &x)) fprintf(stderr, "%s\n", ff_error_message());
    CHECK(x.wall_s > 0 && x.compute_s > 0);
    ff_pipe_exec_destroy(&e);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_pipe_schedule_clear(&s);
    return NULL;
}

static void infer_layout(const char *name, const ff_model_config *cfg, const ff_pipe_config *pc, const ff_tensor_set *w,
                         const pt_batch *g, const pt_result *ref) {
    const int p = pc->pp;
    const int64_t N = g->off[g->n];
    group *gr = group_new(p);
    rank_ctx ctx[MAXR];
    infer_job j = {.pc = pc, .cfg = cfg, .w = w, .g = g, .ctx = ctx};
    REQUIRE((j.lp = calloc((size_t)N, 4)) && (j.ent = calloc((size_t)N, 4)) && (j.val = calloc((size_t)N, 4)));
    pthread_t th[MAXR];
    infer_arg args[MAXR];
    for (int r = 0; r < p; r++) {
        ctx[r] = (rank_ctx){.g = gr, .rank = r};
        args[r] = (infer_arg){.j = &j, .rank = r};
        REQUIRE(pthread_create(&th[r], NULL, infer_main, &args[r]) == 0);
    }
    for (int r = 0; r < p; r++) pthread_join(th[r], NULL);
    char what[160];
    snprintf(what, sizeof what, "%s inference stages log-probs", name);
    pt_close(&pt_err_infer, what, j.lp, ref->ilp, N, 0, PT_TOL_AFTER);
    snprintf(what, sizeof what, "%s inference stages entropy", name);
    pt_close(&pt_err_infer, what, j.ent, ref->ient, N, 0, PT_TOL_AFTER);
    if (cfg->value_head) {
        snprintf(what, sizeof what, "%s inference stages values", name);
        pt_close(&pt_err_infer, what, j.val, ref->ival, N, 0, PT_TOL_AFTER);
    }
    for (int r = 0; r < p; r++) rank_ctx_clear(&ctx[r]);
    free(j.lp), free(j.ent), free(j.val);
    group_free(&gr);
}

static void *rank_main(void *p) {
    targ *a = p;
    ff_pipe_transport t = transport_of(&a->j->ctx[a->rank]);
    pt_rank(a->j->pc, a->j->cfg, a->j->w, a->j->g, &t, "cpu:1", a->j->before_step, NULL, &a->j->res[a->rank]);
    return NULL;
}

static bool g_blocking; /* the transport without send_post: every send blocks in its call */

static void run_layout(const char *name, const ff_model_config *cfg, const ff_pipe_config *pc, const ff_tensor_set *w,
                       const pt_batch *g, const pt_result *ref, int (*before_step)(void *, ff_model *), double loss_scale) {
    const int p = pc->pp;
    job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (job){.pc = pc, .cfg = cfg, .w = w, .g = g, .before_step = before_step};
    group *gr = group_new(p);
    gr->blocking_sends = g_blocking;
    pthread_t th[MAXR];
    targ args[MAXR];
    for (int r = 0; r < p; r++) {
        j->ctx[r] = (rank_ctx){.g = gr, .rank = r};
        args[r] = (targ){.j = j, .rank = r};
        REQUIRE(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < p; r++) pthread_join(th[r], NULL);
    pt_compare(name, cfg, pc, g, j->res, ref, loss_scale);
    ff_tensor_set *as[MAXR];
    for (int r = 0; r < p; r++) as[r] = j->res[r].after;
    ff_tensor_set *trained = pt_merge(as, p, NULL);
    infer_layout(name, cfg, pc, trained, g, ref);
    ff_tensor_set_destroy(&trained);
    for (int r = 0; r < p; r++) {
        pt_result_free(&j->res[r]);
        rank_ctx_clear(&j->ctx[r]);
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
        snprintf(name, sizeof name, "%s pp%d %s%s%s", cfg_name, pc.pp, ff_pipe_kind_name(pc.kind),
                 pc.kind == FF_PIPE_INTERLEAVED ? " v2" : "", g_blocking ? " (blocking sends)" : "");
        run_layout(name, &cfg, &pc, w, &g, &ref, NULL, 1);
    }
    pt_result_free(&ref);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
}

/* ---- the hook before the step: data parallelism ------------------------------------------- */

/* Two data-parallel replicas of the same pipeline on the same micro-batches, each normalising
 * by both replicas' tokens (half the coefficients): their all-reduce doubles the gradients. The
 * hook does that at the step, and the run must equal the reference bit for bit where it does
 * without the hook (a power of two scales exactly); a hook run before the last backward would
 * miss gradients. */
static int dp_sum(void *ctx, ff_model *m) {
    (void)ctx;
    const int64_t n = ff_model_param_count(m);
    float *g = malloc(sizeof(float) * (size_t)n);
    REQUIRE(g && ff_model_read_grads(m, g) == 0);
    for (int64_t i = 0; i < n; i++) g[i] *= 2;
    int rc = ff_model_write_grads(m, g);
    free(g);
    return rc;
}

static void data_parallel(void) {
    ff_model_config cfg = tiny_config(64, 32, 48, 4, 4, 2, false, true, true);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 5, 0.2, w) == 0);
    pt_batch g;
    pt_batch_make(&g, NMICRO, cfg.vocab_size, 12, 0, 17);
    pt_result ref;
    pt_reference(&cfg, w, &g, &ref);
    for (int32_t j = 0; j < g.n; j++)
        for (int32_t t = 0; t < g.b[j].n_tokens; t++) g.a[j][t] *= 0.5f, g.c[j][t] *= 0.5f, g.d[j][t] *= 0.5f;
    ff_pipe_config pc = {.pp = 2, .micro = NMICRO, .kind = FF_PIPE_1F1B, .layers = 4};
    run_layout("4 layers pp2 1f1b, a DP hook", &cfg, &pc, w, &g, &ref, dp_sum, 2);
    pt_result_free(&ref);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
}

/* ---- two models in one schedule (RLHFuse's fused pipelines feed the executor so) ------------ */

/* Model 0 runs 1F1B from rank 0 to rank 1, model 1 the other way; each rank runs its part of
 * model 0 and then its part of model 1, in one stream (calls renumbered). */
static void fused_schedule(ff_pipe_schedule *out, int32_t micro, int64_t layers) {
    ff_pipe_config c = {.pp = 2, .micro = micro, .kind = FF_PIPE_1F1B, .layers = layers};
    ff_pipe_schedule a;
    REQUIRE(ff_pipe_generate(&c, &a) == 0);
    REQUIRE(ff_pipe_schedule_init(out, 2, 2) == 0);
    const int32_t fwd[2] = {0, 1}, back[2] = {1, 0};
    REQUIRE(ff_pipe_model_set(out, 0, micro, 2, fwd, a.models[0].stage_layers, false) == 0);
    REQUIRE(ff_pipe_model_set(out, 1, micro, 2, back, a.models[0].stage_layers, false) == 0);
    for (int32_t r = 0; r < 2; r++) {
        int32_t calls = 0;
        for (int64_t i = 0; i < a.streams[r].n; i++) {
            ff_pipe_instr in = a.streams[r].instr[i];
            calls = in.call + 1 > calls ? in.call + 1 : calls;
            REQUIRE(ff_pipe_push(out, r, in) == 0);
        }
        const ff_pipe_stream *b = &a.streams[1 - r]; /* model 1 on rank r is model 0's stage 1 - r */
        for (int64_t i = 0; i < b->n; i++) {
            ff_pipe_instr in = b->instr[i];
            in.model = 1;
            if (in.peer >= 0) in.peer = 1 - in.peer;
            if (in.call >= 0) in.call += calls;
            REQUIRE(ff_pipe_push(out, r, in) == 0);
        }
    }
    ff_pipe_schedule_clear(&a);
    ff_pipe_sim sim;
    ff_pipe_sim_opts o = {.fwd_s = 1, .bwd_s = 2};
    if (ff_pipe_simulate(out, &o, &sim)) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(sim.makespan_s > 0);
    ff_pipe_sim_clear(&sim);
}

typedef struct fused_job {
    const ff_pipe_schedule *s;
    const ff_model_config *cfg[2];
    const ff_tensor_set *w[2];
    const pt_batch *g[2];
    rank_ctx ctx[2];
    float *lp[2][2], *val[2][2]; /* [rank][model] outputs of the first step */
    ff_tensor_set *grads[2][2], *after[2][2];
    double loss[2][2];
} fused_job;

typedef struct fused_arg {
    fused_job *j;
    int rank;
} fused_arg;

static void *fused_rank(void *p) {
    fused_arg *a = p;
    fused_job *j = a->j;
    const int r = a->rank;
    ff_pipe_transport t = transport_of(&j->ctx[r]);
    ff_model_comm nc;
    ff_pipe_model_comm(&t, &nc);
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_model *m[2];
    ff_optimizer *o[2];
    ff_pipe_exec_model em[2];
    ff_forward_out outs[2][PT_MAX_MICRO];
    ff_adamw_config ac;
    pt_adamw(&ac);
    for (int i = 0; i < 2; i++) {
        int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
        ff_model_stage st;
        REQUIRE(ff_pipe_stage_layers(j->s, i, r, first, count, &st) == 0);
        st.comm = &nc;
        REQUIRE((m[i] = ff_model_new_opts(be, j->cfg[i], j->w[i], &(ff_model_opts){.stage = &st})));
        REQUIRE((o[i] = ff_optimizer_new(m[i], &ac)));
        em[i] = (ff_pipe_exec_model){.model = m[i], .opt = o[i], .temperature = PT_TEMP, .logprobs = true,
                                     .entropy = true, .values = j->cfg[i]->value_head, .loss = pt_loss,
                                     .loss_ctx = (void *)j->g[i]};
        const int64_t N = j->g[i]->off[j->g[i]->n];
        REQUIRE((j->lp[r][i] = calloc((size_t)N, 4)) && (j->val[r][i] = calloc((size_t)N, 4)));
        float *ent = calloc((size_t)N, 4);
        REQUIRE(ent);
        pt_outs(j->g[i], j->cfg[i], j->lp[r][i], ent, j->val[r][i], outs[i]);
        for (int32_t q = 0; q < j->g[i]->n; q++) outs[i][q].entropy = NULL; /* not kept: only asked for */
        free(ent);
    }
    ff_pipe_exec *e = ff_pipe_exec_new(j->s, r, &t, em);
    if (!e) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(e);
    ff_pipe_run run = {.micro = {j->g[0]->b, j->g[1]->b}, .outs = {outs[0], outs[1]}};
    for (int k = 0; k < PT_STEPS; k++) {
        ff_pipe_exec_stats st;
        if (ff_pipe_exec_run(e, &run, &st)) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(st.wall_s > 0);
        run.outs[0] = run.outs[1] = NULL;
        for (int i = 0; i < 2; i++) {
            if (k == 0) {
                j->loss[r][i] = st.loss[i];
                j->grads[r][i] = ff_tensor_set_new();
                REQUIRE(ff_model_export_grads(m[i], j->grads[r][i]) == 0);
            }
            CHECK(st.optim[i].step == k + 1);
        }
    }
    for (int i = 0; i < 2; i++) {
        j->after[r][i] = ff_tensor_set_new();
        REQUIRE(ff_model_export_weights(m[i], j->after[r][i]) == 0);
        ff_optimizer_destroy(&o[i]);
        ff_model_destroy(&m[i]);
    }
    ff_pipe_exec_destroy(&e);
    ff_backend_destroy(&be);
    return NULL;
}

static void fused(void) {
    ff_model_config cfg[2] = {tiny_config(64, 32, 48, 4, 4, 2, false, false, false),
                              tiny_config(64, 32, 48, 4, 4, 2, false, true, true)};
    ff_tensor_set *w[2];
    pt_batch g[2];
    pt_result ref[2];
    for (int i = 0; i < 2; i++) {
        REQUIRE((w[i] = ff_tensor_set_new()) && ff_model_init_weights(&cfg[i], 11 + (uint64_t)i, 0.2, w[i]) == 0);
        pt_batch_make(&g[i], NMICRO, 64, 10, 0, 23 + (uint64_t)i);
        pt_reference(&cfg[i], w[i], &g[i], &ref[i]);
    }
    ff_pipe_schedule s;
    fused_schedule(&s, NMICRO, 4);
    fused_job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (fused_job){.s = &s, .cfg = {&cfg[0], &cfg[1]}, .w = {w[0], w[1]}, .g = {&g[0], &g[1]}};
    group *gr = group_new(2);
    pthread_t th[2];
    fused_arg args[2];
    for (int r = 0; r < 2; r++) {
        j->ctx[r] = (rank_ctx){.g = gr, .rank = r};
        args[r] = (fused_arg){.j = j, .rank = r};
        REQUIRE(pthread_create(&th[r], NULL, fused_rank, &args[r]) == 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int i = 0; i < 2; i++) {
        const int head = i == 0 ? 1 : 0, N = (int)g[i].off[g[i].n];
        char what[96];
        snprintf(what, sizeof what, "fused model %d log-probs", i);
        pt_close(&pt_err_out, what, j->lp[head][i], ref[i].lp, N, 0, 0);
        if (cfg[i].value_head) {
            snprintf(what, sizeof what, "fused model %d values", i);
            pt_close(&pt_err_out, what, j->val[head][i], ref[i].val, N, 0, 0);
        }
        CHECK(j->loss[0][i] == ref[i].loss[0] && j->loss[1][i] == ref[i].loss[0]);
        ff_tensor_set *gs[2] = {j->grads[0][i], j->grads[1][i]}, *as[2] = {j->after[0][i], j->after[1][i]};
        ff_tensor_set *grads = pt_merge(gs, 2, NULL), *after = pt_merge(as, 2, NULL);
        snprintf(what, sizeof what, "fused model %d gradient", i);
        pt_compare_sets(&pt_err_grad, what, grads, ref[i].grads, 0, 0);
        snprintf(what, sizeof what, "fused model %d after %d steps", i, PT_STEPS);
        pt_compare_sets(&pt_err_after, what, after, ref[i].after, PT_ATOL_AFTER, PT_TOL_AFTER);
        ff_tensor_set_destroy(&grads);
        ff_tensor_set_destroy(&after);
        for (int r = 0; r < 2; r++) {
            free(j->lp[r][i]), free(j->val[r][i]);
            ff_tensor_set_destroy(&j->grads[r][i]);
            ff_tensor_set_destroy(&j->after[r][i]);
        }
        pt_result_free(&ref[i]);
        pt_batch_free(&g[i]);
        ff_tensor_set_destroy(&w[i]);
    }
    for (int r = 0; r < 2; r++) rank_ctx_clear(&j->ctx[r]);
    group_free(&gr);
    free(j);
    ff_pipe_schedule_clear(&s);
}

/* ---- tensor parallelism inside the stages ----------------------------------------------- */

/* A tensor-parallel group of threads: every rank posts its buffer, all read every rank's in
 * rank order (the same bits everywhere), then each writes its own. */
typedef struct tp_group {
    int n;
    pthread_barrier_t bar;
    const void *src[MAXR];
    size_t cnt[MAXR];
} tp_group;

typedef struct tp_ctx {
    tp_group *g;
    int rank;
    char *tmp;
    size_t cap;
} tp_ctx;

static char *tp_post(tp_ctx *c, const void *src, size_t n, size_t out_bytes) {
    c->g->src[c->rank] = src;
    c->g->cnt[c->rank] = n;
    pthread_barrier_wait(&c->g->bar);
    for (int r = 0; r < c->g->n; r++) REQUIRE(c->g->cnt[r] == n);
    if (out_bytes > c->cap) {
        REQUIRE((c->tmp = realloc(c->tmp, out_bytes)));
        c->cap = out_bytes;
    }
    return c->tmp;
}

static int tp_sum(void *ctx, float *buf, size_t n) {
    tp_ctx *c = ctx;
    float *o = (float *)tp_post(c, buf, n, n * 4);
    for (size_t i = 0; i < n; i++) {
        float v = 0;
        for (int r = 0; r < c->g->n; r++) v += ((const float *)c->g->src[r])[i];
        o[i] = v;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 4);
    return 0;
}

static int tp_max(void *ctx, float *buf, size_t n) {
    tp_ctx *c = ctx;
    float *o = (float *)tp_post(c, buf, n, n * 4);
    for (size_t i = 0; i < n; i++) {
        float v = ((const float *)c->g->src[0])[i];
        for (int r = 1; r < c->g->n; r++) v = fmaxf(v, ((const float *)c->g->src[r])[i]);
        o[i] = v;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 4);
    return 0;
}

static int tp_sum64(void *ctx, double *buf, size_t n) {
    tp_ctx *c = ctx;
    double *o = (double *)tp_post(c, buf, n, n * 8);
    for (size_t i = 0; i < n; i++) {
        double v = 0;
        for (int r = 0; r < c->g->n; r++) v += ((const double *)c->g->src[r])[i];
        o[i] = v;
    }
    pthread_barrier_wait(&c->g->bar);
    memcpy(buf, o, n * 8);
    return 0;
}

static int tp_gather(void *ctx, const float *in, float *out, size_t n) {
    tp_ctx *c = ctx;
    tp_post(c, in, n, 0);
    for (int r = 0; r < c->g->n; r++) memcpy(out + (size_t)r * n, c->g->src[r], n * 4);
    pthread_barrier_wait(&c->g->bar);
    return 0;
}

/* counts [n]: the parts of the ranks (sequence parallelism's row ranges) */
static size_t tp_total(const tp_ctx *c, const size_t *counts) {
    size_t N = 0;
    for (int r = 0; r < c->g->n; r++) N += counts[r];
    return N;
}

static int tp_rs_v(void *ctx, const float *in, float *out, const size_t *counts) {
    tp_ctx *c = ctx;
    tp_post(c, in, tp_total(c, counts), 0);
    size_t d0 = 0;
    for (int r = 0; r < c->rank; r++) d0 += counts[r];
    for (size_t i = 0; i < counts[c->rank]; i++) {
        float v = 0;
        for (int r = 0; r < c->g->n; r++) v += ((const float *)c->g->src[r])[d0 + i];
        out[i] = v;
    }
    pthread_barrier_wait(&c->g->bar);
    return 0;
}

static int tp_ag_v(void *ctx, const float *in, float *out, const size_t *counts) {
    tp_ctx *c = ctx;
    tp_post(c, in, tp_total(c, counts), 0);
    for (int r = 0, off = 0; r < c->g->n; off += (int)counts[r], r++) memcpy(out + off, c->g->src[r], counts[r] * 4);
    pthread_barrier_wait(&c->g->bar);
    return 0;
}

enum { TP = 2 };

typedef struct grid {
    const ff_pipe_config *pc;
    const ff_model_config *cfg;
    const ff_tensor_set *w;
    const pt_batch *g;
    rank_ctx pp[TP][MAXR]; /* pipeline group t: the stages of TP rank t */
    tp_ctx tp[MAXR][TP];   /* TP group s: the TP ranks of stage s */
    pt_result res[TP][MAXR];
} grid;

typedef struct grid_arg {
    grid *j;
    int t, s;
} grid_arg;

static void *grid_main(void *p) {
    grid_arg *a = p;
    grid *j = a->j;
    ff_pipe_transport t = transport_of(&j->pp[a->t][a->s]);
    ff_model_comm tc = {.rank = a->t, .size = TP, .ctx = &j->tp[a->s][a->t], .all_reduce_sum = tp_sum,
                        .all_reduce_max = tp_max, .all_reduce_sum_f64 = tp_sum64, .all_gather = tp_gather,
                        .reduce_scatter_sum_v = tp_rs_v, .all_gather_v = tp_ag_v};
    pt_rank(j->pc, j->cfg, j->w, j->g, &t, "cpu:1", NULL, &tc, &j->res[a->t][a->s]);
    return NULL;
}

/* TP 2 x PP p: each TP rank of a stage is a stage model with a TP communicator; the TP ranks
 * of a stage run the same stream, each in the pipeline of its TP rank. Against the single
 * rank within the TP tolerances; the two TP ranks' whole tensors bit for bit alike. */
static void tp_pp(const char *name, ff_model_config cfg, ff_pipe_config pc) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 5, 0.2, w) == 0);
    pt_batch g;
    pt_batch_make(&g, NMICRO, cfg.vocab_size, 12, 0, 17);
    pt_result ref;
    pt_reference(&cfg, w, &g, &ref);
    pc.micro = NMICRO;
    pc.layers = cfg.num_hidden_layers;
    const int p = pc.pp;
    grid *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (grid){.pc = &pc, .cfg = &cfg, .w = w, .g = &g};
    group *pg[TP];
    tp_group tg[MAXR];
    for (int t = 0; t < TP; t++) {
        pg[t] = group_new(p);
        for (int s = 0; s < p; s++) j->pp[t][s] = (rank_ctx){.g = pg[t], .rank = s};
    }
    for (int s = 0; s < p; s++) {
        tg[s] = (tp_group){.n = TP};
        pthread_barrier_init(&tg[s].bar, NULL, TP);
        for (int t = 0; t < TP; t++) j->tp[s][t] = (tp_ctx){.g = &tg[s], .rank = t};
    }
    pthread_t th[TP][MAXR];
    grid_arg args[TP][MAXR];
    for (int t = 0; t < TP; t++)
        for (int s = 0; s < p; s++) {
            args[t][s] = (grid_arg){.j = j, .t = t, .s = s};
            REQUIRE(pthread_create(&th[t][s], NULL, grid_main, &args[t][s]) == 0);
        }
    for (int t = 0; t < TP; t++)
        for (int s = 0; s < p; s++) pthread_join(th[t][s], NULL);
    pt_tp = true;
    pt_compare(name, &cfg, &pc, &g, j->res[0], &ref, 1);
    pt_tp = false;
    for (int s = 0; s < p; s++) { /* TP rank 1 gathered the same whole tensors */
        pt_err same = {0};
        char what[160];
        snprintf(what, sizeof what, "%s TP rank 1 stage %d after", name, s);
        pt_compare_sets(&same, what, j->res[1][s].after, j->res[0][s].after, 0, 0);
        CHECK(!same.differs);
        CHECK(j->res[1][s].norm[PT_STEPS - 1] == j->res[0][s].norm[PT_STEPS - 1]);
    }
    for (int t = 0; t < TP; t++) {
        for (int s = 0; s < p; s++) {
            pt_result_free(&j->res[t][s]);
            rank_ctx_clear(&j->pp[t][s]);
        }
        group_free(&pg[t]);
    }
    for (int s = 0; s < p; s++) {
        for (int t = 0; t < TP; t++) free(j->tp[s][t].tmp);
        pthread_barrier_destroy(&tg[s].bar);
    }
    free(j);
    pt_result_free(&ref);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
}

/* ---- a failed run, then a good one -------------------------------------------------------- */

typedef struct retry_job {
    const ff_model_config *cfg;
    const ff_tensor_set *w;
    const pt_batch *g;
    const ff_pipe_schedule *s;
    rank_ctx ctx[2];
    double loss[2];
    int rc[2];
} retry_job;

typedef struct retry_arg {
    retry_job *j;
    int rank;
} retry_arg;

static void *retry_main(void *p) {
    retry_arg *a = p;
    retry_job *j = a->j;
    ff_pipe_transport t = transport_of(&j->ctx[a->rank]);
    ff_model_comm nc;
    ff_pipe_model_comm(&t, &nc);
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    REQUIRE(ff_pipe_stage_layers(j->s, 0, a->rank, first, count, &st) == 0);
    st.comm = &nc;
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model *m = ff_model_new_opts(be, j->cfg, j->w, &(ff_model_opts){.stage = &st});
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(m && opt);
    ff_pipe_exec_model em = {.model = m, .opt = opt, .temperature = PT_TEMP, .logprobs = true, .entropy = true,
                             .values = j->cfg->value_head, .loss = pt_loss, .loss_ctx = (void *)j->g};
    ff_pipe_exec *e = ff_pipe_exec_new(j->s, a->rank, &t, &em);
    REQUIRE(e);
    ff_pipe_run run = {.micro = {j->g->b}};
    ff_pipe_exec_stats x;
    j->ctx[a->rank].fail_next = true; /* both ranks' first call: rank 0 after its first forward */
    j->rc[a->rank] = ff_pipe_exec_run(e, &run, &x);
    CHECK_STR_CONTAINS(ff_error_message(), "the group is broken (on purpose)");
    CHECK_STR_CONTAINS(ff_error_message(), "call 0");
    CHECK_EQ_INT(ff_model_stage_in_flight(m, 0), 0); /* the forward before the failure is dropped */
    REQUIRE(ff_pipe_exec_run(e, &run, &x) == 0);
    j->loss[a->rank] = x.loss[0];
    CHECK(x.optim[0].step == 1); /* the failed run made no step */
    ff_pipe_exec_destroy(&e);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    return NULL;
}

static void retry(void) {
    ff_model_config cfg = tiny_config(64, 32, 48, 4, 4, 2, false, true, true);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 5, 0.2, w) == 0);
    pt_batch g;
    pt_batch_make(&g, NMICRO, cfg.vocab_size, 12, 0, 17);
    pt_result ref;
    pt_reference(&cfg, w, &g, &ref);
    ff_pipe_config pc = {.pp = 2, .micro = NMICRO, .kind = FF_PIPE_1F1B, .layers = 4};
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(&pc, &s) == 0);
    retry_job j = {.cfg = &cfg, .w = w, .g = &g, .s = &s};
    group *gr = group_new(2);
    pthread_t th[2];
    retry_arg args[2];
    for (int r = 0; r < 2; r++) {
        j.ctx[r] = (rank_ctx){.g = gr, .rank = r};
        args[r] = (retry_arg){.j = &j, .rank = r};
        REQUIRE(pthread_create(&th[r], NULL, retry_main, &args[r]) == 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        CHECK(j.rc[r] == -1);
        CHECK(j.loss[r] == ref.loss[0]);
        rank_ctx_clear(&j.ctx[r]);
    }
    group_free(&gr);
    ff_pipe_schedule_clear(&s);
    pt_result_free(&ref);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
}

/* ---- bad setups ------------------------------------------------------------------------------ */

static int no_call(void *ctx, const ff_pipe_xfer *x, int n) { (void)ctx, (void)x, (void)n; return 0; }
static int no_sum(void *ctx, double *b, size_t n) { (void)ctx, (void)b, (void)n; return 0; }
static int no_done(void *ctx, bool wait, uint64_t *done) { (void)ctx, (void)wait, *done = 0; return 0; }

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
    /* streams that need sends that do not block, over a transport whose sends block */
    s.eager_sends = true;
    CHECK(ff_pipe_exec_new(&s, 0, &t, &em) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "need sends that do not block");
    s.eager_sends = false;
    t.sends_done = no_done; /* half of the pair */
    CHECK(ff_pipe_exec_new(&s, 0, &t, &em) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "the transport has sends_done only");
    t.sends_done = NULL;
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
    g_blocking = true; /* the same through blocking calls (a transport without send_post) */
    parity("4 layers", tiny_config(64, 32, 48, 4, 4, 2, false, true, true), l4, 5);
    g_blocking = false;
    /* 8 layers, tied embeddings: 1F1B and interleaved at PP 2 and 4 */
    const ff_pipe_config l8[] = {{.pp = 2, .kind = FF_PIPE_1F1B}, {.pp = 2, .vpp = 2, .kind = FF_PIPE_INTERLEAVED},
                                 {.pp = 4, .kind = FF_PIPE_1F1B}, {.pp = 4, .vpp = 2, .kind = FF_PIPE_INTERLEAVED}};
    parity("8 layers tied", tiny_config(64, 32, 48, 8, 4, 2, true, false, false), l8, 4);
    /* uneven: 5 layers over 2 stages, 7 over 4 (tied) */
    const ff_pipe_config l5[] = {{.pp = 2, .kind = FF_PIPE_1F1B}, {.pp = 2, .kind = FF_PIPE_GPIPE}};
    parity("5 layers", tiny_config(64, 32, 48, 5, 4, 2, false, true, true), l5, 2);
    const ff_pipe_config l7[] = {{.pp = 4, .kind = FF_PIPE_1F1B}};
    parity("7 layers tied", tiny_config(64, 32, 48, 7, 4, 2, true, true, true), l7, 1);
    data_parallel();
    fused();
    pt_print_errors("pipelines (the tied embedding's gradient alone not bit for bit)");
    tp_pp("tp2 x 4 layers tied pp2 1f1b", tiny_config(64, 32, 48, 4, 4, 2, true, true, true),
          (ff_pipe_config){.pp = 2, .kind = FF_PIPE_1F1B});
    tp_pp("tp2 x 8 layers pp2 interleaved v2", tiny_config(64, 32, 48, 8, 4, 2, false, false, true),
          (ff_pipe_config){.pp = 2, .vpp = 2, .kind = FF_PIPE_INTERLEAVED});
    pt_sp = true; /* the same with sequence parallelism: the stages exchange whole hidden states */
    tp_pp("tp2 SP x 4 layers tied pp2 1f1b", tiny_config(64, 32, 48, 4, 4, 2, true, true, true),
          (ff_pipe_config){.pp = 2, .kind = FF_PIPE_1F1B});
    tp_pp("tp2 SP x 8 layers pp2 interleaved v2", tiny_config(64, 32, 48, 8, 4, 2, false, false, true),
          (ff_pipe_config){.pp = 2, .vpp = 2, .kind = FF_PIPE_INTERLEAVED});
    pt_sp = false;
    pt_print_errors("TP 2 x PP 2, with and without SP");
    retry();
    errors();
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}
