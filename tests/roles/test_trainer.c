/* The trainers: the actor's loss is the registry's policy loss + KL loss - entropy bonus on the
 * right tokens; k micro-batches accumulate the gradient of one big batch; two DP ranks with
 * the global normaliser sum to the one-rank gradient, through the hook, called once with the
 * flat gradient buffer; ZeRO-1 over two DP ranks (threads) makes the same steps as the hook's
 * all-reduce, bit for bit, a rank without samples included; training lowers the loss on a toy
 * batch (actor and critic); settings from a run config; bad input. */
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "tests/model/thread_comm.h"
#include "tests/roles/roles_test_util.h"

enum { NS = 12, RMAX = 6 };

typedef struct toy {
    int32_t prompt[NS][4], resp[NS][RMAX];
    int32_t plen[NS], rlen[NS];
    float mask[NS][RMAX], old[NS][RMAX], adv[NS][RMAX], ref[NS][RMAX], oldv[NS][RMAX], ret[NS][RMAX];
    ff_rl_sample s[NS];
} toy;

/* a batch with varied lengths, a masked token, advantages of both signs */
static void toy_make(toy *t, ff_model *m, uint64_t seed) {
    ff_rng r;
    ff_rng_seed(&r, seed);
    for (int i = 0; i < NS; i++) {
        t->plen[i] = 1 + (int32_t)ff_rng_below(&r, 4);
        t->rlen[i] = 1 + (int32_t)ff_rng_below(&r, RMAX);
        for (int j = 0; j < t->plen[i]; j++) t->prompt[i][j] = 2 + (int32_t)ff_rng_below(&r, 38);
        for (int j = 0; j < t->rlen[i]; j++) {
            t->resp[i][j] = 2 + (int32_t)ff_rng_below(&r, 38);
            t->mask[i][j] = (i == 3 && j == 0) ? 0.0f : 1.0f;
            t->adv[i][j] = (float)(ff_rng_uniform(&r) * 2 - 1);
            t->ret[i][j] = (float)(ff_rng_uniform(&r));
        }
        t->s[i] = (ff_rl_sample){.prompt = t->prompt[i], .prompt_len = t->plen[i], .response = t->resp[i],
                                 .response_len = t->rlen[i], .mask = t->mask[i], .old_logprob = t->old[i],
                                 .advantages = t->adv[i], .ref_logprob = t->ref[i], .old_values = t->oldv[i],
                                 .returns = t->ret[i]};
    }
    if (ff_model_has_lm_head(m)) {
        float *p[NS], *q[NS];
        for (int i = 0; i < NS; i++) p[i] = t->old[i], q[i] = t->ref[i];
        DIE_IF(ff_score_logprobs(m, t->s, NS, NULL, p, NULL));
        DIE_IF(ff_score_logprobs(m, t->s, NS, NULL, q, NULL));
        /* old log-probs a little off the current ones, so the ratio is not 1 everywhere */
        for (int i = 0; i < NS; i++)
            for (int j = 0; j < t->rlen[i]; j++) {
                t->old[i][j] += (float)(ff_rng_uniform(&r) * 0.6 - 0.3);
                t->ref[i][j] += (float)(ff_rng_uniform(&r) * 0.2 - 0.1);
            }
    }
}

/* gradients captured by the DP hook */
typedef struct capture {
    int calls;
    ff_buffer *buf;
    int64_t n;
    float *grads;
} capture;

static int capture_hook(void *user, ff_model *m, ff_buffer *grads, int64_t n) {
    capture *c = user;
    c->calls++;
    c->buf = grads;
    c->n = n;
    free(c->grads);
    c->grads = malloc((size_t)n * sizeof(float));
    ff_model_read_grads(m, c->grads);
    return 0;
}

static ff_trainer_config actor_cfg(ff_policy_loss *loss, const ff_kl_def *kl, double ent) {
    ff_trainer_config c;
    memset(&c, 0, sizeof c);
    c.kind = FF_TRAIN_ACTOR;
    ff_adamw_config_default(&c.optim);
    c.optim.lr = 1e-2;
    c.optim.weight_decay = 0;
    c.optim.max_grad_norm = 0;
    c.loss = loss;
    c.kl = kl;
    c.kl_coef = 0.3;
    c.entropy_coeff = ent;
    c.temperature = 0.8f;
    return c;
}

/* The actor's loss equals an independent computation with rlhf.h on the trainer's inputs. */
static void test_actor_loss_value(ff_backend *be, const ff_registry *reg) {
    ff_model_config mc = small_config(false, false);
    ff_model *m = small_model(be, &mc, 3);
    toy t;
    toy_make(&t, m, 1);
    ff_policy_loss *pl = ff_policy_loss_new(reg, "vanilla", NULL);
    const ff_kl_def *kl = ff_registry_kl(reg, "low_var_kl");
    REQUIRE(pl && kl);
    ff_trainer_config c = actor_cfg(pl, kl, 0.05);
    ff_trainer *tr = ff_trainer_new(m, &c);
    DIE_IF(!tr);
    /* expected: log-probs at temperature 0.8 of the current model, packed */
    float lp[NS][RMAX], ent[NS][RMAX];
    float *plp[NS], *pent[NS];
    for (int i = 0; i < NS; i++) plp[i] = lp[i], pent[i] = ent[i];
    ff_score_opts so = {.temperature = 0.8f};
    DIE_IF(ff_score_logprobs(m, t.s, NS, &so, plp, pent));
    int32_t off[NS + 1] = {0};
    float L[NS * RMAX], O[NS * RMAX], A[NS * RMAX], R[NS * RMAX], M[NS * RMAX], E[NS * RMAX], K[NS * RMAX];
    for (int i = 0; i < NS; i++) {
        off[i + 1] = off[i] + t.rlen[i];
        for (int j = 0; j < t.rlen[i]; j++) {
            L[off[i] + j] = lp[i][j], O[off[i] + j] = t.old[i][j], A[off[i] + j] = t.adv[i][j];
            R[off[i] + j] = t.ref[i][j], M[off[i] + j] = t.mask[i][j], E[off[i] + j] = ent[i][j];
        }
    }
    ff_rlhf_seqs seqs = {NS, off, M};
    ff_rlhf_ppo_cfg pc = {0.2, 0.2, 3.0, FF_RLHF_AGG_TOKEN_MEAN, 0};
    ff_rlhf_pg_stats st;
    double pg = ff_rlhf_ppo_loss(&pc, &seqs, L, O, A, NULL, &st);
    ff_rlhf_kl(FF_RLHF_KL_K3, off[NS], L, R, K, NULL);
    double klv = ff_rlhf_agg(FF_RLHF_AGG_TOKEN_MEAN, &seqs, K, 0, NULL);
    double entv = ff_rlhf_agg(FF_RLHF_AGG_TOKEN_MEAN, &seqs, E, 0, NULL);
    double expect = pg + 0.3 * klv - 0.05 * entv;
    CHECK_CLOSE(ff_trainer_denom(tr, t.s, NS), off[NS] - 1, 0, 0); /* one masked token */

    /* three micro-batches: the losses still add up to the mini-batch's */
    int32_t mb[4] = {0, 5, 6, NS};
    ff_train_metrics mt;
    DIE_IF(ff_trainer_step(tr, t.s, NS, mb, 3, 0, &mt));
    CHECK_CLOSE(mt.loss, expect, 1e-5, 1e-4);
    CHECK_CLOSE(mt.pg_loss, pg, 1e-5, 1e-4);
    CHECK_CLOSE(mt.kl_loss, klv, 1e-6, 1e-4);
    CHECK_CLOSE(mt.entropy, entv, 1e-5, 1e-4);
    CHECK_CLOSE(mt.clipfrac, st.clipfrac, 1e-9, 1e-6);
    CHECK_CLOSE(mt.approx_kl, st.approx_kl, 1e-6, 1e-4);
    CHECK(mt.clipfrac > 0 && mt.clipfrac < 1);
    CHECK_EQ_INT(mt.steps, 1);
    CHECK_EQ_INT(mt.micro_batches, 3);
    CHECK_EQ_INT(mt.samples, NS);
    CHECK_EQ_INT(mt.tokens, off[NS] - 1);
    CHECK(mt.grad_norm > 0);
    CHECK_CLOSE(mt.lr, 1e-2, 0, 1e-9);
    ff_trainer_destroy(&tr);
    ff_policy_loss_destroy(&pl);
    ff_model_destroy(&m);
}

/* k micro-batches == one big batch; two DP ranks (global normaliser, summed gradients) ==
 * one rank; the hook sees the flat gradient buffer once per step. */
static void test_accumulation_and_dp(ff_backend *be, const ff_registry *reg, bool critic, const char *agg) {
    ff_model_config mc = small_config(critic, true);
    char params[64];
    snprintf(params, sizeof params, "loss_agg_mode: %s\n", agg);
    ff_config *pcfg = ff_config_parse(params, strlen(params), "params");
    REQUIRE(pcfg);
    ff_policy_loss *pl = critic ? NULL : ff_policy_loss_new(reg, "vanilla", ff_config_root(pcfg));
    ff_rlhf_agg_mode am = FF_RLHF_AGG_TOKEN_MEAN;
    DIE_IF(ff_rlhf_agg_parse(agg, &am));
    ff_trainer_config c = actor_cfg(pl, critic ? NULL : ff_registry_kl(reg, "k2"), 0.02);
    if (critic) {
        c.kind = FF_TRAIN_CRITIC;
        c.value = (ff_rlhf_value_cfg){0.2, am, 0};
    }
    capture cap[4] = {{0}};
    ff_model *models[4];
    ff_trainer *tr[4];
    for (int k = 0; k < 4; k++) {
        models[k] = small_model(be, &mc, 11);
        c.grad_hook = capture_hook;
        c.grad_hook_user = &cap[k];
        tr[k] = ff_trainer_new(models[k], &c);
        DIE_IF(!tr[k]);
    }
    toy t;
    toy_make(&t, models[0], 2);
    if (critic) {
        float *pv[NS];
        for (int i = 0; i < NS; i++) pv[i] = t.oldv[i];
        DIE_IF(ff_score_values(models[0], t.s, NS, NULL, pv));
        for (int i = 0; i < NS; i++) t.oldv[i][0] += 0.3f; /* some clipping */
    }
    /* 0: one micro-batch; 1: a plan of micro-batches of <= 3 samples */
    ff_train_metrics m0, m1, m2, m3;
    DIE_IF(ff_trainer_step(tr[0], t.s, NS, NULL, 0, 0, &m0));
    int64_t tok[NS];
    for (int i = 0; i < NS; i++) tok[i] = ff_rl_sample_tokens(&t.s[i]);
    ff_mb_plan plan;
    DIE_IF(ff_mb_plan_make(tok, NS, 1, 3, 0, &plan));
    CHECK(plan.n_micro == 4);
    ff_rl_sample ordered[NS];
    for (int i = 0; i < NS; i++) ordered[i] = t.s[plan.items[i]];
    DIE_IF(ff_trainer_step(tr[1], ordered, NS, plan.mb_start, plan.n_micro, 0, &m1));
    ff_mb_plan_free(&plan);
    int64_t n = ff_model_param_count(models[0]);
    CHECK(cap[0].calls == 1 && cap[1].calls == 1);
    CHECK(cap[0].buf == ff_model_grad_buffer(models[0]) && cap[0].n == n);
    double gmax = 0, dmax = 0;
    for (int64_t i = 0; i < n; i++) {
        gmax = fmax(gmax, fabs(cap[0].grads[i]));
        dmax = fmax(dmax, fabs(cap[0].grads[i] - cap[1].grads[i]));
    }
    CHECK(gmax > 1e-4);
    CHECK(dmax <= 1e-5 * gmax);
    CHECK_CLOSE(m1.loss, m0.loss, 1e-6, 1e-5);

    /* DP: ranks 2 and 3 each get half (balanced by the plan), the global denom, and their
     * hook sums the two gradient buffers (as an all-reduce would) */
    DIE_IF(ff_mb_plan_make(tok, NS, 2, 2, 0, &plan));
    ff_rl_sample share[2][NS];
    int32_t ns[2] = {0, 0}, mbs[2][NS + 1];
    double denom = 0;
    for (int r = 0; r < 2; r++) {
        int32_t nm = 0;
        mbs[r][0] = 0;
        for (int32_t b = plan.rank_mb[r]; b < plan.rank_mb[r + 1]; b++) {
            for (int32_t i = plan.mb_start[b]; i < plan.mb_start[b + 1]; i++) share[r][ns[r]++] = t.s[plan.items[i]];
            mbs[r][++nm] = ns[r];
        }
        denom += ff_trainer_denom(tr[2 + r], share[r], ns[r]);
    }
    CHECK_CLOSE(denom, ff_trainer_denom(tr[0], t.s, NS), 0, 0);
    int32_t nmb = plan.rank_mb[1] - plan.rank_mb[0];
    DIE_IF(ff_trainer_step(tr[2], share[0], ns[0], mbs[0], nmb, denom, &m2));
    DIE_IF(ff_trainer_step(tr[3], share[1], ns[1], mbs[1], nmb, denom, &m3));
    ff_mb_plan_free(&plan);
    CHECK(ns[0] == NS / 2 && ns[1] == NS / 2);
    dmax = 0;
    for (int64_t i = 0; i < n; i++) dmax = fmax(dmax, fabs(cap[2].grads[i] + cap[3].grads[i] - cap[0].grads[i]));
    CHECK(dmax <= 1e-5 * gmax);
    CHECK_CLOSE(m2.loss + m3.loss, m0.loss, 1e-6, 1e-5);
    for (int k = 0; k < 4; k++) {
        free(cap[k].grads);
        ff_trainer_destroy(&tr[k]);
        ff_model_destroy(&models[k]);
    }
    ff_policy_loss_destroy(&pl);
    ff_config_destroy(&pcfg);
}

/* ZeRO-1 in the trainer: two DP ranks (threads with a communicator each) step three times
 * on their shares of a toy batch, the third time with every sample on rank 0, once with
 * the hook all-reducing the gradients (zero 0) and once with zero 1; the parameters after
 * every step are the same bits, on both ranks, and so are the losses; the norms agree to
 * 1e-12 (summed in another association); the state is split. */
typedef struct zero_rank {
    ff_model_config mc;
    ff_policy_loss *pl;
    const ff_kl_def *kl;
    const ff_rl_sample *share[3]; /* per step */
    int32_t n[3];
    double denom[3];
    tc_rank comm;
    float *params[2][3]; /* [zero][step] */
    ff_train_metrics m[2][3];
    int64_t state_bytes[2];
} zero_rank;

static int allreduce_hook(void *user, ff_model *m, ff_buffer *grads, int64_t n) {
    (void)grads;
    float *g = malloc((size_t)n * sizeof *g);
    REQUIRE(g && ff_model_read_grads(m, g) == 0);
    int rc = tc_sum(user, g, (size_t)n);
    ff_model_write_grads(m, g);
    free(g);
    return rc;
}

static void *zero_rank_main(void *p) {
    zero_rank *z = p;
    ff_backend *be = test_backend();
    for (int zero = 0; zero < 2; zero++) {
        ff_model *m = small_model(be, &z->mc, 11);
        ff_trainer_config c = actor_cfg(z->pl, z->kl, 0.01);
        c.optim.max_grad_norm = 0.1; /* every step clips */
        c.optim.weight_decay = 0.1;
        c.zero = zero;
        if (zero) {
            c.dp = tc_comm(&z->comm);
            c.zero_bucket = 1000; /* many buckets */
        } else {
            c.grad_hook = allreduce_hook;
            c.grad_hook_user = &z->comm;
        }
        ff_trainer *tr = ff_trainer_new(m, &c);
        DIE_IF(!tr);
        z->state_bytes[zero] = ff_optimizer_state_bytes(ff_trainer_optimizer(tr));
        int64_t n = ff_model_param_count(m);
        for (int s = 0; s < 3; s++) {
            DIE_IF(ff_trainer_step(tr, z->share[s], z->n[s], NULL, 0, z->denom[s], &z->m[zero][s]));
            z->params[zero][s] = malloc((size_t)n * sizeof(float));
            REQUIRE(z->params[zero][s]);
            ff_model_read_params(m, z->params[zero][s]);
        }
        ff_trainer_destroy(&tr);
        ff_model_destroy(&m);
    }
    ff_backend_destroy(&be);
    return NULL;
}

static void test_zero(ff_backend *be, const ff_registry *reg) {
    zero_rank z[2];
    memset(z, 0, sizeof z);
    ff_model_config mc = small_config(false, true);
    ff_model *m = small_model(be, &mc, 11);
    toy t;
    toy_make(&t, m, 4);
    ff_policy_loss *pl = ff_policy_loss_new(reg, "vanilla", NULL);
    REQUIRE(pl);
    ff_trainer_config c = actor_cfg(pl, ff_registry_kl(reg, "k2"), 0.01);
    ff_trainer *tr = ff_trainer_new(m, &c); /* for the normalisers */
    DIE_IF(!tr);
    tc_group g;
    tc_group_init(&g, 2);
    for (int r = 0; r < 2; r++) {
        z[r] = (zero_rank){.mc = mc, .pl = pl, .kl = c.kl, .comm = {.g = &g, .rank = r}};
        z[r].share[0] = z[r].share[1] = t.s + r * NS / 2;
        z[r].n[0] = z[r].n[1] = NS / 2;
        z[r].share[2] = t.s; /* step 3: rank 0 all, rank 1 nothing */
        z[r].n[2] = r ? 0 : NS;
    }
    for (int s = 0; s < 3; s++) {
        double d = ff_trainer_denom(tr, z[0].share[s], z[0].n[s]) + ff_trainer_denom(tr, z[1].share[s], z[1].n[s]);
        z[0].denom[s] = z[1].denom[s] = d;
    }
    pthread_t th[2];
    for (int r = 0; r < 2; r++) REQUIRE(pthread_create(&th[r], NULL, zero_rank_main, &z[r]) == 0);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    const int64_t n = ff_model_param_count(m);
    for (int r = 0; r < 2; r++) {
        for (int s = 0; s < 3; s++) {
            CHECK(!memcmp(z[r].params[1][s], z[r].params[0][s], (size_t)n * 4));
            CHECK(!memcmp(z[r].params[1][s], z[0].params[1][s], (size_t)n * 4));
            const ff_train_metrics *a = &z[r].m[1][s], *b = &z[r].m[0][s];
            CHECK_EQ_INT(a->steps, 1);
            CHECK(a->loss == b->loss && a->samples == b->samples);
            CHECK_CLOSE(a->grad_norm, b->grad_norm, 0, 1e-12);
            CHECK(a->grad_norm > 0.1); /* clipped */
        }
        CHECK(memcmp(z[r].params[0][0], z[r].params[0][1], (size_t)n * 4)); /* the steps moved the weights */
        CHECK_EQ_INT(z[r].state_bytes[0], 8 * n);
    }
    for (int r = 0; r < 2; r++) {
        for (int zz = 0; zz < 2; zz++)
            for (int s = 0; s < 3; s++) free(z[r].params[zz][s]);
        tc_rank_free(&z[r].comm);
    }
    CHECK_EQ_INT(z[0].state_bytes[1] + z[1].state_bytes[1], 8 * n);
    CHECK(z[0].state_bytes[1] < 8 * n * 3 / 4 && z[1].state_bytes[1] > 0);
    tc_group_destroy(&g);
    ff_trainer_destroy(&tr);
    ff_policy_loss_destroy(&pl);
    ff_model_destroy(&m);
}

/* Training on a toy batch lowers its loss: the actor (PPO, old log-probs refreshed each
 * iteration as in RL) raises the log-prob of positive-advantage responses and lowers the
 * others'; the critic fits its returns. Also through ff_trainer_train_batch. */
static void test_learning(ff_backend *be, const ff_registry *reg) {
    ff_model_config mc = small_config(false, true);
    ff_model *m = small_model(be, &mc, 21);
    toy t;
    toy_make(&t, m, 3);
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < t.rlen[i]; j++) t.adv[i][j] = i % 2 ? 1.0f : -1.0f;
    ff_policy_loss *pl = ff_policy_loss_new(reg, "vanilla", NULL);
    ff_trainer_config c = actor_cfg(pl, NULL, 0);
    c.temperature = 1.0f;
    ff_trainer *tr = ff_trainer_new(m, &c);
    DIE_IF(!tr);
    float *pold[NS];
    for (int i = 0; i < NS; i++) pold[i] = t.old[i];
    double first_gap = 0, gap = 0;
    for (int it = 0; it < 15; it++) {
        DIE_IF(ff_score_logprobs(m, t.s, NS, NULL, pold, NULL));
        double pos = 0, neg = 0;
        for (int i = 0; i < NS; i++)
            for (int j = 0; j < t.rlen[i]; j++) *(i % 2 ? &pos : &neg) += t.old[i][j];
        gap = pos - neg;
        if (it == 0) first_gap = gap;
        ff_train_batch_opts o = {.mini_batch_size = 4, .micro_batch_size = 2, .epochs = 2, .shuffle = true, .seed = 5};
        ff_train_metrics mt;
        DIE_IF(ff_trainer_train_batch(tr, t.s, NS, &o, &mt));
        CHECK_EQ_INT(mt.steps, 6);
        CHECK_EQ_INT(mt.samples, 2 * NS);
    }
    CHECK(gap > first_gap + 5);
    CHECK_EQ_INT(ff_optimizer_steps_done(ff_trainer_optimizer(tr)), 90);
    ff_trainer_destroy(&tr);
    ff_model_destroy(&m);

    ff_model_config cc = small_config(true, true);
    ff_model *cm = small_model(be, &cc, 22);
    ff_trainer_config ccfg = {.kind = FF_TRAIN_CRITIC, .value = {0.5, FF_RLHF_AGG_TOKEN_MEAN, 0}};
    ff_adamw_config_default(&ccfg.optim);
    ccfg.optim.lr = 1e-2;
    ff_trainer *ct = ff_trainer_new(cm, &ccfg);
    DIE_IF(!ct);
    float *pv[NS];
    for (int i = 0; i < NS; i++) pv[i] = t.oldv[i];
    double l0 = 0, l = 0;
    for (int it = 0; it < 30; it++) {
        DIE_IF(ff_score_values(cm, t.s, NS, NULL, pv));
        ff_train_metrics mt;
        DIE_IF(ff_trainer_step(ct, t.s, NS, NULL, 0, 0, &mt));
        if (it == 0) l0 = mt.value_loss;
        l = mt.value_loss;
    }
    CHECK(l < 0.3 * l0);
    ff_trainer_destroy(&ct);
    ff_model_destroy(&cm);
    ff_policy_loss_destroy(&pl);
}

static int failing_hook(void *user, ff_model *m, ff_buffer *g, int64_t n) {
    (void)user, (void)m, (void)g, (void)n;
    return ff_error_set("all-reduce", NULL, "peer 3 is gone");
}

static void test_errors(ff_backend *be, const ff_registry *reg) {
    ff_model_config mc = small_config(false, false);
    ff_model *m = small_model(be, &mc, 4);
    ff_policy_loss *pl = ff_policy_loss_new(reg, "vanilla", NULL);
    ff_trainer_config c = actor_cfg(NULL, NULL, 0);
    CHECK(ff_trainer_new(m, &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "policy loss");
    c.kind = FF_TRAIN_CRITIC;
    CHECK(ff_trainer_new(m, &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "value head");
    c = actor_cfg(pl, ff_registry_kl(reg, "k1"), 0);
    ff_trainer *tr = ff_trainer_new(m, &c);
    DIE_IF(!tr);
    toy t;
    toy_make(&t, m, 4);
    float *p0[NS];
    for (int i = 0; i < NS; i++) p0[i] = t.old[i];
    DIE_IF(ff_score_logprobs(m, t.s, NS, NULL, p0, NULL));
    float before = t.old[0][0];
    t.s[5].advantages = NULL;
    CHECK(ff_trainer_step(tr, t.s, NS, NULL, 0, 0, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'advantages'");
    t.s[5].advantages = t.adv[5];
    t.s[2].ref_logprob = NULL;
    CHECK(ff_trainer_step(tr, t.s, NS, NULL, 0, 0, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'ref_logprob'");
    t.s[2].ref_logprob = t.ref[2];
    int32_t bad_mb[3] = {0, 4, 7};
    CHECK(ff_trainer_step(tr, t.s, NS, bad_mb, 2, 0, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "micro-batch");
    /* an empty share without a DP group makes no step */
    ff_train_metrics em;
    DIE_IF(ff_trainer_step(tr, t.s, 0, NULL, 0, 0, &em));
    CHECK_EQ_INT(em.steps, 0);
    CHECK_EQ_INT(ff_optimizer_steps_done(ff_trainer_optimizer(tr)), 0);
    /* a failed step leaves the weights alone */
    DIE_IF(ff_score_logprobs(m, t.s, 1, NULL, p0, NULL));
    CHECK_CLOSE(t.old[0][0], before, 1e-6, 1e-6);
    ff_trainer_destroy(&tr);
    /* a failing all-reduce abandons the step */
    c.grad_hook = failing_hook;
    tr = ff_trainer_new(m, &c);
    DIE_IF(!tr);
    CHECK(ff_trainer_step(tr, t.s, NS, NULL, 0, 0, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "peer 3 is gone");
    CHECK_EQ_INT(ff_optimizer_steps_done(ff_trainer_optimizer(tr)), 0);
    ff_trainer_destroy(&tr);
    /* ZeRO: 1 takes no hook (the optimizer reduces), 2 and 3 are not built */
    c.zero = 1;
    CHECK(ff_trainer_new(m, &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "a gradient hook and ZeRO-1");
    c.grad_hook = NULL;
    c.zero = 2;
    CHECK(ff_trainer_new(m, &c) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "ZeRO-2/3 are not built");
    ff_policy_loss_destroy(&pl);
    ff_model_destroy(&m);
}

/* Settings from a run config's nodes (as the executor will read them). */
static void test_from_config(ff_registry *reg) {
    const char *yaml = "trainer: {steps: 10}\n"
                       "data: {train_files: t.jsonl, val_files: v.jsonl, train_batch_size: 8, max_response_length: 7}\n"
                       "roles:\n"
                       "  actor: {model: m, workers: 1, optim: {lr: 2.0e-4, grad_clip: 0.5, warmup_steps: 3, lr_schedule: cosine,"
                       " betas: [0.8, 0.95]}}\n"
                       "  ref: {model: m, colocate_with: actor}\n"
                       "  critic: {model: m, colocate_with: actor, optim: {lr: 1.0e-3}}\n"
                       "graph:\n"
                       "  gen: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4, temperature: 0.7,"
                       " top_k: 5}\n"
                       "  ref: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob]}\n"
                       "  val: {op: value, role: critic, in: [prompt, response], out: [values]}\n"
                       "  rw: {op: reward_fn, in: [prompt, response, answer], out: [score], function: arith_exact_match}\n"
                       "  adv: {op: advantage, in: {score: score, values: values}, out: [advantages, returns], estimator: gae}\n"
                       "  tc: {op: train, role: critic, in: [prompt, response, values, returns], cliprange_value: 0.3}\n"
                       "  ta: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob],"
                       " clip_ratio: 0.25, entropy_coeff: 0.01, kl_loss: {type: k3, coef: 0.05}}\n";
    ff_run_config *run = ff_run_config_parse(yaml, "roles-test.yaml", 0, NULL, reg);
    DIE_IF(!run);
    const ff_node *gen = ff_graph_node(run->graph, (size_t)ff_graph_find_node(run->graph, "gen"));
    const ff_node *ta = ff_graph_node(run->graph, (size_t)ff_graph_find_node(run->graph, "ta"));
    const ff_node *tc = ff_graph_node(run->graph, (size_t)ff_graph_find_node(run->graph, "tc"));
    ff_sampling sp;
    ff_roles_sampling_from_node(run, gen, &sp);
    CHECK_CLOSE(sp.temperature, 0.7, 1e-6, 0);
    CHECK_EQ_INT(sp.top_k, 5);
    CHECK_EQ_INT(sp.max_new_tokens, 7);
    CHECK(sp.logprob_mode == FF_LOGPROB_TEMPERATURE);
    ff_trainer_config a, cc;
    DIE_IF(ff_roles_trainer_config_from_node(run, ta, 40, &a));
    CHECK(a.kind == FF_TRAIN_ACTOR && a.loss == ta->train.loss);
    CHECK(a.kl == ff_registry_kl(reg, "k3"));
    CHECK_CLOSE(a.kl_coef, 0.05, 1e-12, 0);
    CHECK_CLOSE(a.entropy_coeff, 0.01, 1e-12, 0);
    CHECK_CLOSE(a.temperature, 0.7, 1e-6, 0);
    CHECK_CLOSE(a.optim.lr, 2e-4, 1e-12, 0);
    CHECK_CLOSE(a.optim.beta1, 0.8, 1e-12, 0);
    CHECK_CLOSE(a.optim.max_grad_norm, 0.5, 1e-12, 0);
    CHECK_EQ_INT(a.optim.warmup_steps, 3);
    CHECK_EQ_INT(a.optim.total_steps, 40);
    DIE_IF(ff_roles_trainer_config_from_node(run, tc, 40, &cc));
    CHECK(cc.kind == FF_TRAIN_CRITIC);
    CHECK_CLOSE(cc.value.clip, 0.3, 1e-12, 0);
    CHECK_CLOSE(cc.optim.lr, 1e-3, 1e-12, 0);
    CHECK_EQ_INT(cc.optim.total_steps, 0); /* constant schedule */
    CHECK(ff_roles_trainer_config_from_node(run, gen, 40, &cc) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not a train node");
    ff_run_config_destroy(&run);
}

int main(void) {
    ff_backend *be = test_backend();
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_actor_loss_value(be, reg);
    test_accumulation_and_dp(be, reg, false, "token-mean");
    test_accumulation_and_dp(be, reg, false, "seq-mean-token-mean");
    test_accumulation_and_dp(be, reg, true, "token-mean");
    test_accumulation_and_dp(be, reg, true, "seq-mean-token-sum");
    test_zero(be, reg);
    test_learning(be, reg);
    test_errors(be, reg);
    test_from_config(reg);
    ff_registry_destroy(&reg);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
