/* What the pipeline tests (and bench/bench_pipeline.c) share: a global batch of micro-batches
 * with a loss linear in the log-probs, entropy and values (its coefficients are the gradients,
 * normalised by the global batch's tokens), the single-rank reference (the whole model over the
 * same micro-batches, gradients accumulated, AdamW), one pipeline rank's run over any transport
 * (stage model, executor, steps, exports, a forward-only pass on the trained stages), and the
 * comparisons. */
#ifndef FF_TEST_PIPE_UTIL_H
#define FF_TEST_PIPE_UTIL_H

#include "fuseflow/pipe_exec.h"
#include "fuseflow/pipeline.h"
#include "tests/model/model_test_util.h"

enum { PT_MAX_MICRO = 64, PT_STEPS = 3 };
#define PT_TIED "model.embed_tokens.weight"
#define PT_TEMP 0.8f

/* A global batch: n micro-batches of 1 .. 3 sequences each, of 2 .. max_len tokens, or (equal
 * > 0) each micro-batch two sequences of `equal` tokens (equal micro-batches: the bubble
 * formula's assumption). */
typedef struct pt_batch {
    int32_t n;
    ff_batch b[PT_MAX_MICRO];
    int32_t *tok[PT_MAX_MICRO], *ss[PT_MAX_MICRO], *tg[PT_MAX_MICRO];
    float *a[PT_MAX_MICRO], *c[PT_MAX_MICRO], *d[PT_MAX_MICRO]; /* [T] loss = sum a lp + c ent + d val */
    int64_t off[PT_MAX_MICRO + 1]; /* first token of each micro-batch */
} pt_batch;

static inline void pt_batch_make(pt_batch *g, int32_t n, int32_t vocab, int32_t max_len, int32_t equal, uint64_t seed) {
    memset(g, 0, sizeof *g);
    REQUIRE(n >= 1 && n <= PT_MAX_MICRO);
    ff_rng r;
    ff_rng_seed(&r, seed);
    g->n = n;
    for (int32_t j = 0; j < n; j++) {
        int32_t S = equal > 0 ? 2 : 1 + j % 3, len[3], T = 0;
        for (int s = 0; s < S; s++) T += len[s] = equal > 0 ? equal : 2 + (int32_t)ff_rng_below(&r, (uint64_t)max_len - 1);
        g->tok[j] = malloc(sizeof(int32_t) * (size_t)T);
        g->tg[j] = malloc(sizeof(int32_t) * (size_t)T);
        g->ss[j] = malloc(sizeof(int32_t) * (size_t)(S + 1));
        REQUIRE(g->tok[j] && g->tg[j] && g->ss[j]);
        g->ss[j][0] = 0;
        for (int s = 0; s < S; s++) g->ss[j][s + 1] = g->ss[j][s] + len[s];
        for (int32_t t = 0; t < T; t++) g->tok[j][t] = (int32_t)ff_rng_below(&r, (uint64_t)vocab);
        ff_batch_shift_targets(g->tok[j], g->ss[j], S, g->tg[j]);
        g->b[j] = (ff_batch){.n_tokens = T, .n_seqs = S, .tokens = g->tok[j], .seq_start = g->ss[j], .targets = g->tg[j]};
        g->off[j + 1] = g->off[j] + T;
    }
    const double N = (double)g->off[n]; /* the global normaliser: every micro-batch divides by it */
    for (int32_t j = 0; j < n; j++) {
        int32_t T = g->b[j].n_tokens;
        g->a[j] = malloc(sizeof(float) * (size_t)T);
        g->c[j] = malloc(sizeof(float) * (size_t)T);
        g->d[j] = malloc(sizeof(float) * (size_t)T);
        REQUIRE(g->a[j] && g->c[j] && g->d[j]);
        for (int32_t t = 0; t < T; t++) {
            g->a[j][t] = (float)((g->tg[j][t] >= 0 ? -1.0 : 0.0) + 0.3 * ff_rng_normal(&r)) / (float)N;
            g->c[j][t] = (float)(0.2 * ff_rng_normal(&r) / N);
            g->d[j][t] = (float)(ff_rng_normal(&r) / N);
        }
    }
}

static inline void pt_batch_free(pt_batch *g) {
    for (int32_t j = 0; j < g->n; j++) {
        free(g->tok[j]), free(g->tg[j]), free(g->ss[j]);
        free(g->a[j]), free(g->c[j]), free(g->d[j]);
    }
    memset(g, 0, sizeof *g);
}

/* micro-batch j's loss on its outputs; its gradients are the coefficients */
static inline double pt_loss_of(const pt_batch *g, int32_t j, const ff_forward_out *o, float *dl, float *de, float *dv) {
    double loss = 0;
    for (int32_t t = 0; t < g->b[j].n_tokens; t++) {
        if (o->logprobs) loss += (double)g->a[j][t] * o->logprobs[t];
        if (o->entropy) loss += (double)g->c[j][t] * o->entropy[t];
        if (o->values) loss += (double)g->d[j][t] * o->values[t];
    }
    if (dl) memcpy(dl, g->a[j], sizeof(float) * (size_t)g->b[j].n_tokens);
    if (de) memcpy(de, g->c[j], sizeof(float) * (size_t)g->b[j].n_tokens);
    if (dv) memcpy(dv, g->d[j], sizeof(float) * (size_t)g->b[j].n_tokens);
    return loss;
}

static inline int pt_loss(void *ctx, int32_t micro, const ff_batch *b, const ff_forward_out *out, ff_pipe_loss_out *d) {
    (void)b;
    d->loss = pt_loss_of(ctx, micro, out, d->d_logprobs, d->d_entropy, d->d_values);
    return 0;
}

static inline void pt_adamw(ff_adamw_config *ac) {
    ff_adamw_config_default(ac);
    ac->lr = 1e-2;
    ac->eps = 1e-4; /* as tests/model/test_model_tp.c: the update then depends on the gradient's scale */
    ac->beta2 = 0.95;
    ac->weight_decay = 0.1;
    ac->max_grad_norm = 0.5; /* clipping on: the global norm matters */
    ac->warmup_steps = 1;
    ac->total_steps = PT_STEPS;
}

/* What a run gives: outputs [tokens] of the first step and of a forward-only pass after the
 * last, the loss and gradient norm of each step, the gradients after the first step, the weights
 * and AdamW state after the last (whole tensors; a pipeline rank's: its own). */
typedef struct pt_result {
    float *lp, *ent, *val, *ilp, *ient, *ival;
    double loss[PT_STEPS], norm[PT_STEPS];
    ff_tensor_set *grads, *after, *optim;
    float *tied;     /* a pipeline rank holding the tied embedding: its weights after training */
    int64_t tied_n;
    ff_pipe_exec_stats stats[PT_STEPS];
    double sim_bubble, formula;
    int64_t n_instr;
    double *t_start, *t_end; /* the last training step's instruction times */
    int32_t in_flight[FF_MODEL_MAX_CHUNKS]; /* the executor's count per chunk */
    int32_t n_chunks;
    int64_t workspace[PT_STEPS]; /* the stage's activation bytes after each step: reserved once */
} pt_result;

static inline void pt_result_alloc(pt_result *r, int64_t tokens) {
    memset(r, 0, sizeof *r);
    float **f[6] = {&r->lp, &r->ent, &r->val, &r->ilp, &r->ient, &r->ival};
    for (int i = 0; i < 6; i++) REQUIRE((*f[i] = calloc((size_t)tokens, sizeof(float))));
}

static inline void pt_result_free(pt_result *r) {
    free(r->lp), free(r->ent), free(r->val), free(r->ilp), free(r->ient), free(r->ival);
    ff_tensor_set_destroy(&r->grads);
    ff_tensor_set_destroy(&r->after);
    ff_tensor_set_destroy(&r->optim);
    free(r->tied), free(r->t_start), free(r->t_end);
    memset(r, 0, sizeof *r);
}

static inline void pt_outs(const pt_batch *g, const ff_model_config *cfg, float *lp, float *ent, float *val, ff_forward_out *o) {
    for (int32_t j = 0; j < g->n; j++) /* the test models all have an LM head */
        o[j] = (ff_forward_out){.logprobs = lp + g->off[j], .entropy = ent + g->off[j],
                                .values = cfg->value_head ? val + g->off[j] : NULL};
}

/* The single-rank reference: the whole model, each step's micro-batches accumulated in order. */
static inline void pt_reference(const ff_model_config *cfg, const ff_tensor_set *w, const pt_batch *g, pt_result *r) {
    pt_result_alloc(r, g->off[g->n]);
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_model *m = ff_model_new(be, cfg, w);
    REQUIRE(m);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    ff_forward_out o[PT_MAX_MICRO];
    pt_outs(g, cfg, r->lp, r->ent, r->val, o);
    float *tmp = malloc(sizeof(float) * 6 * (size_t)g->off[g->n]);
    REQUIRE(tmp);
    for (int s = 0; s < PT_STEPS; s++) {
        ff_model_zero_grad(m);
        r->loss[s] = 0;
        for (int32_t j = 0; j < g->n; j++) {
            ff_forward_out oj = o[j];
            if (s) { /* later steps: outputs into scratch */
                if (oj.logprobs) oj.logprobs = tmp + g->off[j];
                if (oj.entropy) oj.entropy = tmp + g->off[g->n] + g->off[j];
                if (oj.values) oj.values = tmp + 2 * g->off[g->n] + g->off[j];
            }
            ff_forward_opts fo = {.train = true, .temperature = PT_TEMP};
            REQUIRE(ff_model_forward(m, &g->b[j], &fo, &oj) == 0);
            float *dl = tmp + 3 * g->off[g->n], *de = dl + g->off[g->n], *dv = de + g->off[g->n];
            r->loss[s] += pt_loss_of(g, j, &oj, oj.logprobs ? dl : NULL, oj.entropy ? de : NULL, oj.values ? dv : NULL);
            REQUIRE(ff_model_backward(m, oj.logprobs ? dl : NULL, oj.entropy ? de : NULL, oj.values ? dv : NULL) == 0);
        }
        ff_optim_stats st;
        REQUIRE(ff_optimizer_step(opt, &st) == 0);
        r->norm[s] = st.grad_norm;
        if (s == 0) {
            r->grads = ff_tensor_set_new();
            REQUIRE(ff_model_export_grads(m, r->grads) == 0);
        }
    }
    r->after = ff_tensor_set_new();
    r->optim = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, r->after) == 0 && ff_optimizer_export_state(opt, r->optim) == 0);
    ff_forward_out io[PT_MAX_MICRO];
    pt_outs(g, cfg, r->ilp, r->ient, r->ival, io);
    for (int32_t j = 0; j < g->n; j++) {
        ff_forward_opts fo = {.temperature = PT_TEMP};
        REQUIRE(ff_model_forward(m, &g->b[j], &fo, &io[j]) == 0);
    }
    free(tmp);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
}

static bool pt_sp; /* pt_rank's stage models with sequence parallelism (inside their TP group) */

/* One pipeline rank: its stage of the schedule c over transport t, the same steps, its exports,
 * and a forward-only pass of the same layout on the trained stages. */
static inline void pt_rank(const ff_pipe_config *c, const ff_model_config *cfg, const ff_tensor_set *w, const pt_batch *g,
                           const ff_pipe_transport *t, const char *backend, int (*before_step)(void *, ff_model *),
                           const ff_model_comm *tp, pt_result *r) {
    const int32_t rank = t->rank;
    pt_result_alloc(r, g->off[g->n]);
    ff_pipe_schedule s, fs;
    REQUIRE(ff_pipe_generate(c, &s) == 0);
    ff_pipe_config fc = *c;
    fc.forward_only = true;
    REQUIRE(ff_pipe_generate(&fc, &fs) == 0);
    ff_backend *be = ff_backend_new(backend);
    REQUIRE(be);
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    REQUIRE(ff_pipe_stage_layers(&s, 0, rank, first, count, &st) == 0);
    ff_model_comm nc;
    ff_pipe_model_comm(t, &nc);
    st.comm = &nc;
    ff_model_opts mo = {.stage = &st, .comm = tp, .sequence_parallel = pt_sp};
    ff_model *m = ff_model_new_opts(be, cfg, w, &mo);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    const bool vh = cfg->value_head;
    ff_pipe_exec_model em = {.model = m, .opt = opt, .temperature = PT_TEMP, .logprobs = true, .entropy = true,
                             .values = vh, .loss = pt_loss, .loss_ctx = (void *)g, .before_step = before_step};
    ff_pipe_exec *e = ff_pipe_exec_new(&s, rank, t, &em);
    if (!e) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(e);
    ff_forward_out o[PT_MAX_MICRO];
    pt_outs(g, cfg, r->lp, r->ent, r->val, o);
    ff_pipe_run run = {.micro = {g->b}, .outs = {o}, .measure = true};
    for (int k = 0; k < PT_STEPS; k++) {
        if (ff_pipe_exec_run(e, &run, &r->stats[k])) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(r->stats[k].wall_s > 0);
        r->loss[k] = r->stats[k].loss[0];
        ff_model_memory mem;
        ff_model_memory_of(m, &mem);
        r->workspace[k] = mem.workspace;
        r->norm[k] = r->stats[k].optim[0].grad_norm;
        run.outs[0] = NULL; /* the first step's outputs are the ones compared */
        if (k == 0) {
            r->grads = ff_tensor_set_new();
            REQUIRE(ff_model_export_grads(m, r->grads) == 0);
        }
    }
    r->n_chunks = st.n_chunks;
    for (int32_t q = 0; q < st.n_chunks; q++) r->in_flight[q] = ff_pipe_exec_in_flight(e, 0, q);
    const double *ts, *te;
    ff_pipe_exec_times(e, &ts, &te, &r->n_instr);
    r->t_start = malloc(sizeof(double) * (size_t)r->n_instr + 1);
    r->t_end = malloc(sizeof(double) * (size_t)r->n_instr + 1);
    REQUIRE(r->t_start && r->t_end);
    memcpy(r->t_start, ts, sizeof(double) * (size_t)r->n_instr);
    memcpy(r->t_end, te, sizeof(double) * (size_t)r->n_instr);
    ff_pipe_sim sim;
    if (ff_pipe_exec_simulate(e, &sim)) fprintf(stderr, "%s\n", ff_error_message());
    r->sim_bubble = sim.bubble_fraction;
    ff_pipe_sim_clear(&sim);
    r->formula = ff_pipe_bubble_formula(c);
    r->after = ff_tensor_set_new();
    r->optim = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, r->after) == 0 && ff_optimizer_export_state(opt, r->optim) == 0);
    if ((r->tied_n = ff_model_tensor_numel(m, PT_TIED)) > 0) {
        REQUIRE((r->tied = malloc(sizeof(float) * (size_t)r->tied_n)));
        REQUIRE(ff_model_read_tensor(m, PT_TIED, false, r->tied) == 0);
    }
    /* forward-only (log-probs, entropy, values) through the trained stages */
    ff_pipe_exec_model fm = {.model = m, .temperature = PT_TEMP, .logprobs = true, .entropy = true, .values = vh};
    ff_pipe_exec *fe = ff_pipe_exec_new(&fs, rank, t, &fm);
    REQUIRE(fe);
    ff_forward_out io[PT_MAX_MICRO];
    pt_outs(g, cfg, r->ilp, r->ient, r->ival, io);
    ff_pipe_run fr = {.micro = {g->b}, .outs = {io}};
    ff_pipe_exec_stats fst;
    if (ff_pipe_exec_run(fe, &fr, &fst)) fprintf(stderr, "%s\n", ff_error_message());
    CHECK(fst.loss[0] == 0 && fst.optim[0].step == 0);
    ff_pipe_exec_destroy(&fe);
    ff_pipe_exec_destroy(&e);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_pipe_schedule_clear(&fs);
    ff_pipe_schedule_clear(&s);
}

/* The union of the ranks' sets: every name from exactly one rank, but `shared` (may be NULL),
 * which every rank has with the same value (the optimizer's step count). A new set. */
static inline ff_tensor_set *pt_merge(ff_tensor_set *const *sets, int n, const char *shared) {
    ff_tensor_set *u = ff_tensor_set_new();
    REQUIRE(u);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < sets[r]->n; i++) {
            const ff_host_tensor *t = &sets[r]->items[i];
            const ff_host_tensor *have = ff_tensor_set_find(u, t->name);
            if (have && shared && !strcmp(t->name, shared) && ff_host_tensor_numel(have) == ff_host_tensor_numel(t) &&
                !memcmp(have->data, t->data, sizeof(float) * (size_t)ff_host_tensor_numel(t)))
                continue;
            if (have) {
                fprintf(stderr, "%s: exported by two stages\n", t->name);
                ff_test_failures++;
                continue;
            }
            ff_host_tensor *c = ff_tensor_set_add(u, t->name, t->ndim, t->shape);
            REQUIRE(c);
            memcpy(c->data, t->data, sizeof(float) * (size_t)ff_host_tensor_numel(t));
        }
    return u;
}

/* The worst |got - want| of a comparison relative to want's largest element, and whether any
 * differed at all (printed: the measured margins behind the tolerances). */
typedef struct pt_err {
    double rel;
    bool differs;
} pt_err;

static inline void pt_close(pt_err *e, const char *what, const float *got, const float *want, int64_t n, double atol, double rtol) {
    double mx = 0, err = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(want[i]));
        err = fmax(err, fabs((double)got[i] - want[i]));
        e->differs = e->differs || got[i] != want[i];
    }
    if (mx > 0 && err / mx > e->rel) e->rel = err / mx;
    check_tensor_close(what, got, want, n, atol, rtol);
}

typedef struct pt_tol {
    pt_err *e;
    double atol, rtol;
} pt_tol;
static inline void pt_pair_close(void *ctx, const char *name, const float *got, const float *want, int64_t n) {
    const pt_tol *t = ctx;
    pt_close(t->e, name, got, want, n, t->atol, t->rtol);
}
static inline void pt_compare_sets(pt_err *e, const char *what, const ff_tensor_set *got, const ff_tensor_set *want,
                                   double atol, double rtol) {
    compare_tensor_sets(what, got, want, pt_pair_close, &(pt_tol){e, atol, rtol});
}

/* fp32 tolerances, relative to each array's largest element (the measured worst errors are
 * printed at the end): outputs and untied gradients are bit for bit; the tied embedding's
 * gradient is two partial sums added instead of one running sum; after three clipped AdamW
 * steps the clip coefficient differs in its last bits (the norm summed per stage), and Adam
 * divides by each element's own gradient, so near-zero ones keep their relative rounding. */
#define PT_TOL_GRAD_TIED 1e-5
#define PT_TOL_AFTER 3e-5
#define PT_ATOL_AFTER 1e-5
static pt_err pt_err_out, pt_err_grad, pt_err_after, pt_err_infer;
/* With tensor parallelism inside the stages the sums run in another order: outputs and
 * gradients are then compared within test_model_tp.c's tolerances, not bit for bit. */
static bool pt_tp;
#define PT_TOL_OUT_TP 2e-5
#define PT_TOL_GRAD_TP 3e-5
static double pt_bubble_worst; /* the largest |measured - simulated| */

/* The p ranks' results of layout pc against the reference. */
static inline void pt_compare(const char *name, const ff_model_config *cfg, const ff_pipe_config *pc, const pt_batch *g,
                              pt_result *res, const pt_result *ref, double loss_scale) {
    const int p = pc->pp;
    char what[160];
    const pt_result *h = &res[p - 1]; /* the last virtual stage's rank (p v - 1 mod p) */
    const int64_t N = g->off[g->n];
    const double to = pt_tp ? PT_TOL_OUT_TP : 0, tg = pt_tp ? PT_TOL_GRAD_TP : 0;
    /* outputs of the first step and the loss: the same arithmetic, the same bits */
    snprintf(what, sizeof what, "%s log-probs", name);
    pt_close(&pt_err_out, what, h->lp, ref->lp, N, 0, to);
    snprintf(what, sizeof what, "%s entropy", name);
    pt_close(&pt_err_out, what, h->ent, ref->ent, N, 0, to);
    if (cfg->value_head) {
        snprintf(what, sizeof what, "%s values", name);
        pt_close(&pt_err_out, what, h->val, ref->val, N, 0, to);
    }
    for (int r = 0; r < p; r++) { /* every rank knows the loss and the norm */
        CHECK_CLOSE(res[r].loss[0] * loss_scale, ref->loss[0], pt_tp ? 1e-6 : 0, pt_tp ? 1e-5 : 0);
        for (int s = 0; s < PT_STEPS; s++) CHECK_CLOSE(res[r].norm[s], ref->norm[s], 0, 1e-5);
        CHECK(res[r].norm[0] == res[0].norm[0]);
    }
    /* gradients and weights, whole tensors, each exported by one stage */
    ff_tensor_set *gs[PT_MAX_MICRO], *as[PT_MAX_MICRO], *os[PT_MAX_MICRO];
    for (int r = 0; r < p; r++) gs[r] = res[r].grads, as[r] = res[r].after, os[r] = res[r].optim;
    ff_tensor_set *grads = pt_merge(gs, p, NULL), *after = pt_merge(as, p, NULL), *optim = pt_merge(os, p, "step");
    for (size_t i = 0; i < ref->grads->n; i++) {
        const ff_host_tensor *want = &ref->grads->items[i], *got = ff_tensor_set_find(grads, want->name);
        snprintf(what, sizeof what, "%s gradient %s", name, want->name);
        if (!got) {
            fprintf(stderr, "%s: no stage exported it\n", what);
            ff_test_failures++;
            continue;
        }
        const bool tied = cfg->tie_word_embeddings && !strcmp(want->name, PT_TIED) && p > 1;
        pt_close(&pt_err_grad, what, got->data, want->data, ff_host_tensor_numel(want), 0, tied ? fmax(tg, PT_TOL_GRAD_TIED) : tg);
    }
    CHECK_EQ_INT(grads->n, ref->grads->n);
    snprintf(what, sizeof what, "%s after %d steps", name, PT_STEPS);
    pt_compare_sets(&pt_err_after, what, after, ref->after, PT_ATOL_AFTER, PT_TOL_AFTER);
    snprintf(what, sizeof what, "%s AdamW state", name);
    pt_compare_sets(&pt_err_after, what, optim, ref->optim, PT_ATOL_AFTER, PT_TOL_AFTER);
    /* forward-only through the trained stages */
    snprintf(what, sizeof what, "%s forward-only log-probs", name);
    pt_close(&pt_err_infer, what, h->ilp, ref->ilp, N, 0, PT_TOL_AFTER);
    snprintf(what, sizeof what, "%s forward-only entropy", name);
    pt_close(&pt_err_infer, what, h->ient, ref->ient, N, 0, PT_TOL_AFTER);
    if (cfg->value_head) {
        snprintf(what, sizeof what, "%s forward-only values", name);
        pt_close(&pt_err_infer, what, h->ival, ref->ival, N, 0, PT_TOL_AFTER);
    }
    /* the tied copies stayed equal */
    int holders = 0;
    for (int r = 0; r < p; r++)
        if (res[r].tied) {
            holders++;
            CHECK(res[r].tied_n == res[0].tied_n && !memcmp(res[r].tied, res[0].tied, sizeof(float) * (size_t)res[0].tied_n));
        }
    CHECK_EQ_INT(holders, cfg->tie_word_embeddings && p > 1 ? 2 : 1);
    /* activations in flight: what the executor reserved is what the stream holds (1F1B
     * min(p - s, m), GPipe m, interleaved at least the simulator's peak), and no step grew it */
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(pc, &s) == 0);
    ff_pipe_sim ps;
    ff_pipe_sim_opts po = {.fwd_s = 1, .bwd_s = 2};
    REQUIRE(ff_pipe_simulate(&s, &po, &ps) == 0);
    for (int r = 0; r < p; r++) {
        int32_t sum = 0;
        for (int32_t q = 0; q < res[r].n_chunks; q++) sum += res[r].in_flight[q];
        if (pc->kind == FF_PIPE_1F1B) CHECK_EQ_INT(sum, p - r < pc->micro ? p - r : pc->micro);
        else if (pc->kind == FF_PIPE_GPIPE) CHECK_EQ_INT(sum, pc->micro);
        else CHECK(sum >= ps.ranks[r].peak_in_flight && sum <= pc->micro * res[r].n_chunks);
        for (int k = 1; k < PT_STEPS; k++) CHECK(res[r].workspace[k] == res[r].workspace[0]);
    }
    ff_pipe_sim_clear(&ps);
    /* times: each rank's instructions in order (a call's share its times), the same bubble on
     * every rank, and the bubble again from the instruction times */
    double busy = 0, makespan = 0;
    for (int r = 0; r < p; r++) {
        const pt_result *q = &res[r];
        const ff_pipe_exec_stats *st = &q->stats[PT_STEPS - 1];
        CHECK_EQ_INT(q->n_instr, s.streams[r].n);
        CHECK(st->compute_s > 0 && st->makespan_s >= st->compute_s && st->wall_s >= st->compute_s + st->step_s);
        CHECK(st->bubble_fraction >= 0 && st->bubble_fraction < 1);
        CHECK(st->bubble_fraction == res[0].stats[PT_STEPS - 1].bubble_fraction);
        if (getenv("FF_TEST_VERBOSE")) printf("rank %d:", r);
        for (int64_t i = 0; i < q->n_instr && i < s.streams[r].n; i++) {
            const ff_pipe_instr *in = &s.streams[r].instr[i];
            const double a = q->t_start[i], b = q->t_end[i];
            CHECK(b >= a);
            if (i) CHECK(a >= q->t_end[i - 1] || (a == q->t_start[i - 1] && in->call >= 0 && in->call == s.streams[r].instr[i - 1].call));
            if (in->op == FF_PIPE_FORWARD || in->op == FF_PIPE_BACKWARD) busy += b - a, makespan = fmax(makespan, b);
            if (getenv("FF_TEST_VERBOSE")) { /* the last step's timeline, ms */
                char f[48];
                ff_pipe_instr_format(&s, in, f, sizeof f);
                printf(" %s@%.2f-%.2f", f, 1e3 * a, 1e3 * b);
            }
        }
        if (getenv("FF_TEST_VERBOSE")) printf("\n");
    }
    const ff_pipe_exec_stats *st = &res[0].stats[PT_STEPS - 1];
    CHECK_CLOSE(st->bubble_fraction, 1 - busy / (p * makespan), 1e-6, 0);
    ff_pipe_schedule_clear(&s);
    printf("%-34s bubble measured %.3f, simulated on the measured times %.3f, formula %.3f; step %.1f ms\n", name,
           st->bubble_fraction, res[0].sim_bubble, res[0].formula, 1e3 * st->wall_s);
    CHECK(res[0].sim_bubble > 0 && res[0].sim_bubble < 1);
    CHECK(res[0].formula == ff_pipe_bubble_formula(pc));
    if (fabs(st->bubble_fraction - res[0].sim_bubble) > pt_bubble_worst)
        pt_bubble_worst = fabs(st->bubble_fraction - res[0].sim_bubble);
    ff_tensor_set_destroy(&grads);
    ff_tensor_set_destroy(&after);
    ff_tensor_set_destroy(&optim);
}

/* The worst errors since the last call, then reset. */
static inline void pt_print_errors(const char *what) {
    printf("%s: worst relative errors: outputs %.3g (bit for bit: %s), gradients %.3g (%s), after AdamW %.3g, forward-only "
           "%.3g; |measured - simulated bubble| up to %.3f\n",
           what, pt_err_out.rel, pt_err_out.differs ? "no" : "yes", pt_err_grad.rel,
           pt_err_grad.differs ? "not all bit for bit" : "bit for bit", pt_err_after.rel, pt_err_infer.rel, pt_bubble_worst);
    memset(&pt_err_out, 0, sizeof pt_err_out), memset(&pt_err_grad, 0, sizeof pt_err_grad);
    memset(&pt_err_after, 0, sizeof pt_err_after), memset(&pt_err_infer, 0, sizeof pt_err_infer);
    pt_bubble_worst = 0;
}

#endif
