/* The trainers and scoring over a pipeline group (ff_roles_pipe): the ranks are threads, one
 * stage model and cpu:1 backend each (ff_roles_pipe_stage), over the in-process mailbox
 * transport (tests/pipe/pipe_mailbox.h), against the single-rank trainer and scoring on the
 * whole model from the same weights and samples.
 *
 * Layouts over 8 layers: actor (vanilla PPO with a KL loss and an entropy bonus) tied at PP 2
 * 1F1B and untied at PP 4 interleaved (vpp 2); critic (value head) at PP 2 interleaved and
 * PP 4 1F1B; TP 2 x PP 2 (each TP rank of a stage a stage model with a TP communicator of
 * threads, each TP rank its own pipeline); PP 2 x DP 2 with the DP hook summing each stage's
 * gradients over the two pipelines (actor tied, critic), and at ZeRO-1 (the optimizer's
 * reduce-scatter over each stage's DP group), the third step with every sample on the first
 * pipeline (the other's empty share joins the hook or the reduce-scatter, and the step).
 *
 * Checked: 3 steps of ff_trainer_step over 4 micro-batches give the single-rank metrics (loss,
 * pg_loss, kl, entropy, clipfrac, approx_kl, ratio_max, entropy_mean, value_loss,
 * vf_clipfrac, value_mean, grad_norm, lr; tokens, samples, micro-batches exactly) and the
 * single-rank weights after (the union of the stages' whole-tensor exports), within fp32
 * tolerances (the first step's losses are the same arithmetic; the tied embedding's gradient
 * is two partial sums, the norm a sum of the stages', so later steps differ by rounding); every
 * rank of a pipeline (and every TP rank) returns the same metrics bit for bit; with DP the
 * replicas' losses and tokens add up to the whole batch's; log-probs, entropy, values and
 * reward scores (micro-batches of 3 samples: 6, padded to 8 under the interleaved placement)
 * come out on every rank equal to the single-rank scoring. Bad setups get errors naming the
 * problem: a stage model without a pipeline, a pipeline for a whole model, a stage built for
 * another rank, interleaved with a micro-batch count that is not a multiple of pp, more
 * virtual stages than layers, chunks without the interleaved schedule. */
#include "fuseflow/registry.h"
#include "fuseflow/roles.h"
#include "tests/model/thread_comm.h"
#include "tests/pipe/pipe_mailbox.h"
#include "tests/pipe/pipe_test_util.h"

enum { NS = 16, RMAX = 6, STEPS = 3, NMB = 4, MAXP = 4, MAXT = 2, MAXD = 2, VOCAB = 48, LAYERS = 8, SCORE_MB = 3 };

/* fp32 tolerances against the single-rank run, relative (metrics) or to each tensor's largest
 * element (weights, scores); the measured worst errors are printed at the end */
#define TOL_FIRST 1e-5  /* the first step's metrics: the same arithmetic but the norm's sum */
#define TOL_LATER 1e-4  /* later steps: on weights that differ by the clipped updates' rounding */
#define TOL_REORDER 1e-3 /* later steps with TP or DP: sums in another order, amplified by AdamW */
#define TOL_AFTER 3e-5
#define ATOL_AFTER 1e-6
#define TOL_SCORE 1e-5
#define TOL_TP 2e-4 /* TP's and DP's sums run in another order (tests/model/test_model_tp.c); measured 1.1e-4 on
                     * approx_kl (-4.8e-3, a mean of log-ratios: the log-probs' own error, 5e-7) */
#define TOL_REORDER_AFTER 2e-4 /* the weights after with TP or DP (measured up to 7e-5 under the sanitizers) */

typedef struct toy {
    int32_t prompt[NS][4], resp[NS][RMAX];
    float mask[NS][RMAX], old[NS][RMAX], adv[NS][RMAX], ref[NS][RMAX], oldv[NS][RMAX], ret[NS][RMAX];
    ff_rl_sample s[NS];
} toy;

/* varied lengths, a masked token, advantages of both signs, old log-probs near the model's */
static void toy_make(toy *t, ff_model *m, uint64_t seed) {
    ff_rng r;
    ff_rng_seed(&r, seed);
    for (int i = 0; i < NS; i++) {
        int32_t pl = 1 + (int32_t)ff_rng_below(&r, 4), rl = 1 + (int32_t)ff_rng_below(&r, RMAX);
        for (int j = 0; j < pl; j++) t->prompt[i][j] = 2 + (int32_t)ff_rng_below(&r, VOCAB - 2);
        for (int j = 0; j < rl; j++) {
            t->resp[i][j] = 2 + (int32_t)ff_rng_below(&r, VOCAB - 2);
            t->mask[i][j] = (i == 3 && j == 0) ? 0.0f : 1.0f;
            t->adv[i][j] = (float)(ff_rng_uniform(&r) * 2 - 1);
            t->ret[i][j] = (float)ff_rng_uniform(&r);
            t->oldv[i][j] = t->ret[i][j] + (float)(ff_rng_uniform(&r) * 0.8 - 0.4);
        }
        t->s[i] = (ff_rl_sample){.prompt = t->prompt[i], .prompt_len = pl, .response = t->resp[i], .response_len = rl,
                                 .mask = t->mask[i], .old_logprob = t->old[i], .advantages = t->adv[i],
                                 .ref_logprob = t->ref[i], .old_values = t->oldv[i], .returns = t->ret[i]};
    }
    float *p[NS];
    for (int i = 0; i < NS; i++) p[i] = t->old[i];
    ff_score_opts so = {.temperature = 0.8f};
    DIE_IF(ff_score_logprobs(m, t->s, NS, &so, p, NULL));
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < t->s[i].response_len; j++) {
            t->ref[i][j] = t->old[i][j] + (float)(ff_rng_uniform(&r) * 0.2 - 0.1);
            t->old[i][j] += (float)(ff_rng_uniform(&r) * 0.6 - 0.3);
        }
}

static ff_trainer_config trainer_cfg(ff_train_kind kind, ff_policy_loss *pl, const ff_kl_def *kl) {
    ff_trainer_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    pt_adamw(&c.optim); /* the pipeline tests' AdamW: clipped (the norm summed over the stages enters every
                           update), eps 1e-4 (the update depends on the gradient's scale), warm-up and decay */
    c.optim.total_steps = 2 * STEPS; /* the last step still moves the weights (lr 0 at total_steps) */
    c.loss = pl;
    c.kl = kl;
    c.kl_coef = 0.3;
    c.entropy_coeff = 0.05;
    c.temperature = 0.8f;
    c.value = (ff_rlhf_value_cfg){0.2, FF_RLHF_AGG_TOKEN_MEAN, 0};
    return c;
}

/* ---- one layout ------------------------------------------------------------------------ */

typedef struct layout {
    const char *name;
    ff_model_config cfg;
    ff_train_kind kind;
    ff_pipe_kind pk;
    int32_t vpp, pp, tp, dp;
    int zero; /* with dp 2: 0 the hook's all-reduce, 1 ZeRO-1 over the stage's DP group */
} layout;

/* What one step gives one DP replica: samples [n] in micro-batches mb [nm + 1], the global denom. */
typedef struct share {
    const ff_rl_sample *s;
    int32_t n, nm;
    int32_t mb[NMB + 1];
    double denom;
} share;

typedef struct result {
    ff_train_metrics m[STEPS];
    ff_tensor_set *after;
    float lp[NS][RMAX], ent[NS][RMAX], val[NS][RMAX], rm[NS]; /* scores before training */
    int rc;
} result;

typedef struct world {
    const layout *l;
    const ff_tensor_set *w;
    const toy *t;
    const ff_kl_def *kl;
    ff_policy_loss *pl[MAXD][MAXT][MAXP];
    share sh[MAXD][STEPS];
    rank_ctx pp[MAXD][MAXT][MAXP];   /* pipeline group (d, t): its stages */
    tc_rank tpr[MAXD][MAXP][MAXT];   /* TP group (d, s): the TP ranks of a stage */
    tc_rank dpr[MAXT][MAXP][MAXD];   /* DP group (t, s): a stage's replicas */
    result res[MAXD][MAXT][MAXP];
} world;

typedef struct rank_arg {
    world *w;
    int d, t, s;
    float *grads; /* the hook's host copy */
    tc_rank *dp;
} rank_arg;

/* The DP all-reduce: this stage's gradients summed over its replicas. */
static int dp_hook(void *user, ff_model *m, ff_buffer *grads, int64_t n) {
    (void)grads;
    rank_arg *a = user;
    if (!a->grads) REQUIRE((a->grads = malloc(sizeof(float) * (size_t)n)));
    if (ff_model_read_grads(m, a->grads) || tc_sum(a->dp, a->grads, (size_t)n) || ff_model_write_grads(m, a->grads)) return -1;
    return 0;
}

static void score_into(ff_model *m, const layout *l, const toy *t, const ff_score_opts *so, result *r) {
    float *a[NS], *b[NS];
    ff_rl_sample s[NS];
    memcpy(s, t->s, sizeof s);
    if (l->kind == FF_TRAIN_ACTOR) {
        for (int i = 0; i < NS; i++) a[i] = r->lp[i], b[i] = r->ent[i];
        if (ff_score_logprobs(m, s, NS, so, a, b)) r->rc = -1, fprintf(stderr, "score: %s\n", ff_error_message());
    } else {
        for (int i = 0; i < NS; i++) a[i] = r->val[i];
        if (ff_score_values(m, s, NS, so, a) || ff_score_reward_model(m, s, NS, so, r->rm))
            r->rc = -1, fprintf(stderr, "score: %s\n", ff_error_message());
    }
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    world *w = a->w;
    const layout *l = w->l;
    result *r = &w->res[a->d][a->t][a->s];
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_pipe_transport tr = transport_of(&w->pp[a->d][a->t][a->s]);
    ff_roles_pipe rp = {.transport = &tr, .kind = l->pk, .vpp = l->vpp};
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_comm norm, tc;
    ff_model_stage st;
    REQUIRE(ff_roles_pipe_stage(&l->cfg, &rp, a->s, first, count, &norm, &st) == 0);
    if (l->tp > 1) tc = tc_comm(&w->tpr[a->d][a->s][a->t]);
    ff_model *m = ff_model_new_opts(be, &l->cfg, w->w, &(ff_model_opts){.stage = &st, .comm = l->tp > 1 ? &tc : NULL});
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    ff_score_opts so = {.micro_batch_size = SCORE_MB, .temperature = 0.8f, .pipe = &rp};
    score_into(m, l, w->t, &so, r);
    ff_trainer_config c = trainer_cfg(l->kind, w->pl[a->d][a->t][a->s], w->kl);
    c.pipe = rp;
    if (l->dp > 1) {
        a->dp = &w->dpr[a->t][a->s][a->d];
        if (l->zero) {
            c.zero = 1;
            c.dp = tc_comm(a->dp);
        } else {
            c.grad_hook = dp_hook;
            c.grad_hook_user = a;
        }
    }
    ff_trainer *tn = ff_trainer_new(m, &c);
    if (!tn) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(tn);
    int64_t room = 0; /* the model's workspace after the first step: no later step of the same batches grows it */
    for (int k = 0; k < STEPS && r->rc == 0; k++) {
        const share *sh = &w->sh[a->d][k];
        if (ff_trainer_step(tn, sh->s, sh->n, sh->mb, sh->nm, sh->denom, &r->m[k])) {
            fprintf(stderr, "%s rank (%d, %d, %d) step %d: %s\n", l->name, a->d, a->t, a->s, k, ff_error_message());
            r->rc = -1;
        }
        ff_model_memory mem;
        ff_model_memory_of(m, &mem);
        if (k == 0) room = mem.workspace;
        if (l->dp == 1 && mem.workspace != room) { /* the same micro-batches every step (with DP the third is larger) */
            fprintf(stderr, "%s rank (%d, %d): step %d grew the workspace from %lld to %lld bytes\n", l->name, a->t, a->s, k,
                    (long long)room, (long long)mem.workspace);
            ff_test_failures++;
        }
    }
    r->after = ff_tensor_set_new();
    REQUIRE(r->after && ff_model_export_weights(m, r->after) == 0);
    ff_trainer_destroy(&tn);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    free(a->grads);
    return NULL;
}

static pt_err err_metric, err_after, err_score;
static double err_first, err_later; /* this layout's worst metric error, first step and later */

static void close_metric(const char *name, int k, const char *what, double got, double want, double tol) {
    double e = fabs(got - want) / fmax(fabs(want), 1e-3);
    if (e > err_metric.rel) err_metric.rel = e;
    double *w = k == 0 ? &err_first : &err_later;
    if (e > *w) *w = e;
    if (!(e <= tol)) {
        fprintf(stderr, "%s step %d %s: %.9g, single rank %.9g\n", name, k, what, got, want);
        ff_test_failures++;
    }
}

/* The pipeline's metrics against the single rank's (with DP: the replicas' sums). */
static void compare_metrics(const layout *l, const ff_train_metrics *got, const ff_train_metrics *want, int k, double tol) {
    const char *n = l->name;
    CHECK_EQ_INT(got->steps, want->steps);
    CHECK_EQ_INT(got->skipped, 0);
    CHECK_EQ_INT(got->tokens, want->tokens);
    close_metric(n, k, "loss", got->loss, want->loss, tol);
    close_metric(n, k, "grad_norm", got->grad_norm, want->grad_norm, tol);
    close_metric(n, k, "lr", got->lr, want->lr, 0);
    if (l->dp > 1) return; /* the means below are per replica */
    CHECK_EQ_INT(got->samples, want->samples);
    CHECK_EQ_INT(got->micro_batches, want->micro_batches);
    if (l->kind == FF_TRAIN_ACTOR) {
        close_metric(n, k, "pg_loss", got->pg_loss, want->pg_loss, tol);
        close_metric(n, k, "kl_loss", got->kl_loss, want->kl_loss, tol);
        close_metric(n, k, "entropy", got->entropy, want->entropy, tol);
        close_metric(n, k, "clipfrac", got->clipfrac, want->clipfrac, tol);
        close_metric(n, k, "approx_kl", got->approx_kl, want->approx_kl, tol);
        close_metric(n, k, "ratio_max", got->ratio_max, want->ratio_max, tol);
        close_metric(n, k, "entropy_mean", got->entropy_mean, want->entropy_mean, tol);
        CHECK(want->kl_loss != 0 && want->entropy != 0 && want->pg_loss != 0 && want->ratio_max > 1);
    } else {
        close_metric(n, k, "value_loss", got->value_loss, want->value_loss, tol);
        close_metric(n, k, "vf_clipfrac", got->vf_clipfrac, want->vf_clipfrac, tol);
        close_metric(n, k, "value_mean", got->value_mean, want->value_mean, tol);
        CHECK(want->value_loss > 0);
        if (k == 0) CHECK(want->vf_clipfrac > 0);
    }
}

/* Every field but the times (the step's and the bubble, measured by each pipeline group),
 * bit for bit. */
static bool same_metrics(ff_train_metrics a, ff_train_metrics b) {
    a.time_s = b.time_s = 0;
    a.pipe_bubble = b.pipe_bubble = 0;
    return memcmp(&a, &b, sizeof a) == 0;
}

static void run_layout(const layout *l, const ff_registry *reg) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&l->cfg, 21, 0.3, w) == 0);
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    /* the actor's samples from an LM of the same shape, so the critic's have log-probs too */
    ff_model_config lm = l->cfg;
    lm.value_head = false;
    ff_tensor_set *lw = ff_tensor_set_new();
    REQUIRE(lw && ff_model_init_weights(&lm, 21, 0.3, lw) == 0);
    ff_model *lmm = ff_model_new(be, &lm, lw);
    REQUIRE(lmm);
    toy *t = calloc(1, sizeof *t);
    REQUIRE(t);
    toy_make(t, lmm, 5);
    ff_model_destroy(&lmm);
    ff_tensor_set_destroy(&lw);

    world *wd = calloc(1, sizeof *wd);
    REQUIRE(wd);
    wd->l = l;
    wd->w = w;
    wd->t = t;
    wd->kl = l->kind == FF_TRAIN_ACTOR ? ff_registry_kl(reg, "low_var_kl") : NULL;
    ff_policy_loss *ref_pl = l->kind == FF_TRAIN_ACTOR ? ff_policy_loss_new(reg, "vanilla", NULL) : NULL;

    /* the single rank: the whole batch each step in NMB micro-batches */
    ff_model *m = ff_model_new(be, &l->cfg, w);
    REQUIRE(m);
    result *ref = calloc(1, sizeof *ref);
    REQUIRE(ref);
    ff_score_opts so = {.micro_batch_size = SCORE_MB, .temperature = 0.8f};
    score_into(m, l, t, &so, ref);
    if (l->kind == FF_TRAIN_CRITIC) { /* old values near the critic's, some beyond the clip range */
        ff_rng r;
        ff_rng_seed(&r, 7);
        for (int i = 0; i < NS; i++)
            for (int j = 0; j < t->s[i].response_len; j++) t->oldv[i][j] = ref->val[i][j] + (float)(ff_rng_uniform(&r) * 0.8 - 0.4);
    }
    ff_trainer_config c = trainer_cfg(l->kind, ref_pl, wd->kl);
    ff_trainer *tn = ff_trainer_new(m, &c);
    REQUIRE(tn);
    const double denom = ff_trainer_denom(tn, t->s, NS);
    int32_t whole_mb[NMB + 1];
    for (int b = 0; b <= NMB; b++) whole_mb[b] = b * NS / NMB;
    for (int k = 0; k < STEPS; k++) DIE_IF(ff_trainer_step(tn, t->s, NS, whole_mb, NMB, 0, &ref->m[k]));
    ref->after = ff_tensor_set_new();
    REQUIRE(ref->after && ff_model_export_weights(m, ref->after) == 0);
    ff_trainer_destroy(&tn);
    ff_model_destroy(&m);

    /* the shares: one replica takes everything; two split the batch in halves, and the third
     * step gives every sample to the first */
    for (int d = 0; d < l->dp; d++)
        for (int k = 0; k < STEPS; k++) {
            share *sh = &wd->sh[d][k];
            sh->denom = denom;
            if (l->dp == 1 || k == STEPS - 1) {
                const bool all = d == 0;
                sh->s = t->s;
                sh->n = all ? NS : 0;
                sh->nm = all ? NMB : 1;
                for (int b = 0; b <= sh->nm; b++) sh->mb[b] = all ? whole_mb[b] : 0;
            } else {
                sh->s = t->s + d * NS / 2;
                sh->n = NS / 2;
                sh->nm = NMB;
                for (int b = 0; b <= NMB; b++) sh->mb[b] = b * (NS / 2) / NMB;
            }
        }
    group *pg[MAXD][MAXT];
    tc_group tpg[MAXD][MAXP], dpg[MAXT][MAXP];
    for (int d = 0; d < l->dp; d++)
        for (int tt = 0; tt < l->tp; tt++) {
            pg[d][tt] = group_new(l->pp);
            for (int s = 0; s < l->pp; s++) {
                wd->pp[d][tt][s] = (rank_ctx){.g = pg[d][tt], .rank = s};
                wd->pl[d][tt][s] = l->kind == FF_TRAIN_ACTOR ? ff_policy_loss_new(reg, "vanilla", NULL) : NULL;
            }
        }
    for (int s = 0; s < l->pp; s++) {
        for (int d = 0; d < l->dp; d++) {
            tc_group_init(&tpg[d][s], l->tp);
            for (int tt = 0; tt < l->tp; tt++) wd->tpr[d][s][tt] = (tc_rank){.g = &tpg[d][s], .rank = tt};
        }
        for (int tt = 0; tt < l->tp; tt++) {
            tc_group_init(&dpg[tt][s], l->dp);
            for (int d = 0; d < l->dp; d++) wd->dpr[tt][s][d] = (tc_rank){.g = &dpg[tt][s], .rank = d};
        }
    }
    pthread_t th[MAXD][MAXT][MAXP];
    rank_arg args[MAXD][MAXT][MAXP];
    for (int d = 0; d < l->dp; d++)
        for (int tt = 0; tt < l->tp; tt++)
            for (int s = 0; s < l->pp; s++) {
                args[d][tt][s] = (rank_arg){.w = wd, .d = d, .t = tt, .s = s};
                REQUIRE(pthread_create(&th[d][tt][s], NULL, rank_main, &args[d][tt][s]) == 0);
            }
    for (int d = 0; d < l->dp; d++)
        for (int tt = 0; tt < l->tp; tt++)
            for (int s = 0; s < l->pp; s++) pthread_join(th[d][tt][s], NULL);

    for (int d = 0; d < l->dp; d++)
        for (int tt = 0; tt < l->tp; tt++)
            for (int s = 0; s < l->pp; s++) {
                const result *r = &wd->res[d][tt][s];
                CHECK_EQ_INT(r->rc, 0);
                for (int k = 0; k < STEPS; k++) {
                    /* the executor's bubble: some, not all, of the step (pp ranks, one of them busy at a time at least) */
                    CHECK(r->m[k].pipe_bubble > 0 && r->m[k].pipe_bubble < 1);
                    if (!same_metrics(r->m[k], wd->res[d][0][0].m[k])) {
                        fprintf(stderr, "%s: rank (dp %d, tp %d, stage %d) step %d: metrics differ from stage 0's\n", l->name,
                                d, tt, s, k);
                        ff_test_failures++;
                    }
                }
                /* scores on every rank */
                char what[160];
                snprintf(what, sizeof what, "%s rank (%d, %d, %d) scores", l->name, d, tt, s);
                const double st = l->tp > 1 ? TOL_TP : TOL_SCORE;
                for (int i = 0; i < NS; i++) {
                    const int R = t->s[i].response_len;
                    if (l->kind == FF_TRAIN_ACTOR) {
                        pt_close(&err_score, what, r->lp[i], ref->lp[i], R, 0, st);
                        pt_close(&err_score, what, r->ent[i], ref->ent[i], R, 0, st);
                    } else {
                        pt_close(&err_score, what, r->val[i], ref->val[i], R, 0, st);
                    }
                }
                if (l->kind == FF_TRAIN_CRITIC) pt_close(&err_score, what, r->rm, ref->rm, NS, 0, st);
            }
    err_first = err_later = 0;
    for (int k = 0; k < STEPS; k++) {
        ff_train_metrics sum = wd->res[0][0][0].m[k];
        for (int d = 1; d < l->dp; d++) {
            const ff_train_metrics *o = &wd->res[d][0][0].m[k];
            sum.loss += o->loss;
            sum.tokens += o->tokens;
            CHECK(o->grad_norm == sum.grad_norm && o->steps == 1);
        }
        compare_metrics(l, &sum, &ref->m[k], k, k == 0 ? (l->tp > 1 ? TOL_TP : TOL_FIRST) : l->tp > 1 || l->dp > 1 ? TOL_REORDER : TOL_LATER);
    }
    if (l->dp > 1) CHECK(wd->res[1][0][0].m[STEPS - 1].samples == 0 && wd->res[1][0][0].m[STEPS - 1].steps == 1);
    /* the weights after: every replica's union of the stages' exports */
    for (int d = 0; d < l->dp; d++)
        for (int tt = 0; tt < l->tp; tt++) {
            ff_tensor_set *sets[MAXP];
            for (int s = 0; s < l->pp; s++) sets[s] = wd->res[d][tt][s].after;
            ff_tensor_set *u = pt_merge(sets, l->pp, NULL);
            char what[160];
            snprintf(what, sizeof what, "%s (dp %d, tp %d) after", l->name, d, tt);
            pt_err e = {0};
            pt_compare_sets(&e, what, u, ref->after, ATOL_AFTER, l->tp > 1 || l->dp > 1 ? TOL_REORDER_AFTER : TOL_AFTER);
            err_after.rel = fmax(err_after.rel, e.rel);
            if (d == 0 && tt == 0)
                fprintf(stderr, "%s: metrics within %.2e (first step) and %.2e (later), weights after within %.2e\n", l->name,
                        err_first, err_later, e.rel);
            ff_tensor_set_destroy(&u);
        }
    double loss1 = 0;
    for (int d = 0; d < l->dp; d++) loss1 += wd->res[d][0][0].m[0].loss;
    fprintf(stderr, "%s: step 1 loss %.7f (single rank %.7f), grad_norm %.7f (%.7f)\n", l->name, loss1, ref->m[0].loss,
            wd->res[0][0][0].m[0].grad_norm, ref->m[0].grad_norm);

    for (int d = 0; d < l->dp; d++)
        for (int tt = 0; tt < l->tp; tt++) {
            for (int s = 0; s < l->pp; s++) {
                ff_tensor_set_destroy(&wd->res[d][tt][s].after);
                ff_policy_loss_destroy(&wd->pl[d][tt][s]);
                rank_ctx_clear(&wd->pp[d][tt][s]);
            }
            group_free(&pg[d][tt]);
        }
    for (int s = 0; s < l->pp; s++) {
        for (int d = 0; d < l->dp; d++) {
            for (int tt = 0; tt < l->tp; tt++) tc_rank_free(&wd->tpr[d][s][tt]);
            tc_group_destroy(&tpg[d][s]);
        }
        for (int tt = 0; tt < l->tp; tt++) {
            for (int d = 0; d < l->dp; d++) tc_rank_free(&wd->dpr[tt][s][d]);
            tc_group_destroy(&dpg[tt][s]);
        }
    }
    ff_tensor_set_destroy(&ref->after);
    free(ref);
    ff_policy_loss_destroy(&ref_pl);
    free(wd);
    free(t);
    ff_backend_destroy(&be);
    ff_tensor_set_destroy(&w);
}

/* ---- bad setups ---------------------------------------------------------------------------- */

static int no_call(void *ctx, const ff_pipe_xfer *x, int n) {
    (void)ctx, (void)x, (void)n;
    return ff_error_set("test", NULL, "no transfer expected");
}
static int no_sum(void *ctx, double *buf, size_t n) {
    (void)ctx, (void)buf, (void)n;
    return ff_error_set("test", NULL, "no sum expected");
}

static void test_errors(const ff_registry *reg) {
    ff_model_config cfg = tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, false, false, false);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 3, 0.3, w) == 0);
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_policy_loss *pl = ff_policy_loss_new(reg, "vanilla", NULL);
    ff_trainer_config c = trainer_cfg(FF_TRAIN_ACTOR, pl, NULL);
    ff_pipe_transport tr[2];
    for (int r = 0; r < 2; r++) tr[r] = (ff_pipe_transport){.rank = r, .size = 2, .call = no_call, .all_reduce_sum_f64 = no_sum};
    ff_roles_pipe rp[2];
    int32_t first[2][FF_MODEL_MAX_CHUNKS], count[2][FF_MODEL_MAX_CHUNKS];
    ff_model_comm norm[2];
    ff_model_stage st[2];
    ff_model *stage[2];
    for (int r = 0; r < 2; r++) {
        rp[r] = (ff_roles_pipe){.transport = &tr[r], .kind = FF_PIPE_INTERLEAVED, .vpp = 2};
        REQUIRE(ff_roles_pipe_stage(&cfg, &rp[r], r, first[r], count[r], &norm[r], &st[r]) == 0);
        CHECK(st[r].n_chunks == 2 && first[r][0] == 2 * r && count[r][0] == 2 && first[r][1] == 4 + 2 * r);
        stage[r] = ff_model_new_opts(be, &cfg, w, &(ff_model_opts){.stage = &st[r]});
        REQUIRE(stage[r]);
    }
    /* a stage model without a pipeline */
    CHECK(ff_trainer_new(stage[0], &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "is a pipeline stage");
    CHECK_STR_CONTAINS(ff_error_message(), "no pipeline is given");
    float lp[8], *plp[1] = {lp};
    int32_t tok[3] = {2, 3, 4};
    ff_rl_sample s1 = {.prompt = tok, .prompt_len = 2, .response = tok + 2, .response_len = 1};
    CHECK(ff_score_logprobs(stage[1], &s1, 1, NULL, plp, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no pipeline is given");
    /* a pipeline for a whole model */
    ff_model *whole = ff_model_new(be, &cfg, w);
    REQUIRE(whole);
    c.pipe = rp[0];
    CHECK(ff_trainer_new(whole, &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "given for a whole model");
    ff_score_opts so = {.pipe = &rp[0]};
    CHECK(ff_score_logprobs(whole, &s1, 1, &so, plp, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "given for a whole model");
    /* the stage of another rank */
    CHECK(ff_trainer_new(stage[1], &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "chunk 0 holds layers [2, 4); rank 0 of the pipeline places [0, 2)");
    /* interleaved over pp 2 with 3 micro-batches: refused before any transfer, on every rank */
    toy *t = calloc(1, sizeof *t);
    REQUIRE(t);
    toy_make(t, whole, 9);
    const int32_t mb[4] = {0, 5, 10, NS};
    for (int r = 0; r < 2; r++) {
        c.pipe = rp[r];
        ff_trainer *tn = ff_trainer_new(stage[r], &c);
        if (!tn) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(tn);
        CHECK(ff_trainer_step(tn, t->s, NS, mb, 3, 0, NULL) == -1);
        CHECK_STR_CONTAINS(ff_error_message(), "groups of pp 2, and this step has 3 non-empty micro-batches");
        CHECK_STR_CONTAINS(ff_error_message(), "micro_batch_size");
        ff_trainer_destroy(&tn);
    }
    /* placements that cannot be */
    ff_roles_pipe bad = {.transport = &tr[0], .kind = FF_PIPE_INTERLEAVED, .vpp = 8};
    CHECK(ff_roles_pipe_stage(&cfg, &bad, 0, first[0], count[0], &norm[0], &st[0]) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "8 layers over 16 virtual stages");
    bad = (ff_roles_pipe){.transport = &tr[0], .kind = FF_PIPE_1F1B, .vpp = 2};
    CHECK(ff_roles_pipe_stage(&cfg, &bad, 0, first[0], count[0], &norm[0], &st[0]) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "vpp 2 with the 1f1b schedule");
    CHECK(ff_roles_pipe_stage(&cfg, NULL, 0, first[0], count[0], &norm[0], &st[0]) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no pipeline");
    free(t);
    ff_model_destroy(&whole);
    for (int r = 0; r < 2; r++) ff_model_destroy(&stage[r]);
    ff_policy_loss_destroy(&pl);
    ff_backend_destroy(&be);
    ff_tensor_set_destroy(&w);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_errors(reg);
    /* vocab 48, hidden 32, intermediate 64, 8 layers, GQA 4/2 */
    const layout ls[] = {
        {"actor tied pp2 1f1b", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, true, false, false), FF_TRAIN_ACTOR, FF_PIPE_1F1B, 1, 2, 1, 1, 0},
        {"actor pp4 interleaved v2", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, false, true, false), FF_TRAIN_ACTOR,
         FF_PIPE_INTERLEAVED, 2, 4, 1, 1, 0},
        {"critic pp2 interleaved v2", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, false, false, true), FF_TRAIN_CRITIC,
         FF_PIPE_INTERLEAVED, 2, 2, 1, 1, 0},
        {"critic tied pp4 1f1b", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, true, false, true), FF_TRAIN_CRITIC, FF_PIPE_1F1B, 1, 4, 1, 1, 0},
        {"actor tied tp2 x pp2 1f1b", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, true, false, false), FF_TRAIN_ACTOR, FF_PIPE_1F1B, 1, 2, 2, 1, 0},
        {"actor pp2 x dp2 gpipe, an empty share", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, true, false, false), FF_TRAIN_ACTOR,
         FF_PIPE_GPIPE, 1, 2, 1, 2, 0},
        {"critic pp2 x dp2 1f1b, an empty share", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, false, false, true), FF_TRAIN_CRITIC,
         FF_PIPE_1F1B, 1, 2, 1, 2, 0},
        {"actor tied pp2 x dp2 zero1 1f1b, an empty share", tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, true, false, false),
         FF_TRAIN_ACTOR, FF_PIPE_1F1B, 1, 2, 1, 2, 1},
    };
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) run_layout(&ls[i], reg);
    fprintf(stderr, "worst relative errors against the single rank: metrics %.2e, weights after %.2e, scores %.2e\n",
            err_metric.rel, err_after.rel, err_score.rel);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}
