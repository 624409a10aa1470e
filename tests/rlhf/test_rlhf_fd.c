/* Finite-difference checks of every derivative in include/fuseflow/rlhf.h, plus the
 * properties the executor relies on: micro-batches with a global normaliser add up to the
 * mini-batch, GAE's matrix form equals the recursion on long batches, masked tokens have
 * zero gradient and are never read, and the error paths (bad names, bad group ids). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/rlhf.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

typedef struct batch {
    int32_t n_seq;
    int32_t offsets[65];
    float *mask; /* [T] */
    int64_t T;
} batch;

static void make_batch(ff_rng *rng, batch *b, int32_t n_seq, int max_len) {
    b->n_seq = n_seq;
    b->offsets[0] = 0;
    for (int32_t q = 0; q < n_seq; q++) b->offsets[q + 1] = b->offsets[q] + (q == 1 ? 0 : 1 + (int32_t)ff_rng_below(rng, (uint64_t)max_len));
    b->T = b->offsets[n_seq];
    b->mask = malloc(sizeof(float) * (size_t)(b->T + 1));
    REQUIRE(b->mask);
    for (int64_t t = 0; t < b->T; t++) b->mask[t] = ff_rng_uniform(rng) < 0.8 ? 1.0f : 0.0f;
    if (n_seq > 3)
        for (int64_t t = b->offsets[3]; t < b->offsets[4]; t++) b->mask[t] = 0; /* a fully masked sequence */
}

static float *rand_arr(ff_rng *rng, int64_t T, double scale) {
    float *x = malloc(sizeof(float) * (size_t)(T + 1));
    REQUIRE(x);
    for (int64_t t = 0; t < T; t++) x[t] = (float)(ff_rng_normal(rng) * scale);
    return x;
}

/* A loss of one perturbed input, for the finite differences. */
typedef struct loss_fn {
    double (*eval)(struct loss_fn *f, float *grad); /* grad may be NULL */
    float *x;                                        /* the input being perturbed */
    void *ctx;
} loss_fn;

/* Central differences at every token; tokens where the one-sided slopes disagree sit on a
 * kink of max/min/clamp and are skipped (at most a few percent). Masked tokens must have a
 * zero gradient and leave L unchanged. */
static void fd_check(const char *what, loss_fn *f, const batch *b) {
    float *g = malloc(sizeof(float) * (size_t)(b->T + 1));
    REQUIRE(g);
    double L0 = f->eval(f, g);
    int checked = 0, kinks = 0, bad = 0;
    for (int64_t t = 0; t < b->T; t++) {
        float x0 = f->x[t];
        float xp = x0 + 1e-3f, xm = x0 - 1e-3f;
        f->x[t] = xp;
        double Lp = f->eval(f, NULL);
        f->x[t] = xm;
        double Lm = f->eval(f, NULL);
        f->x[t] = x0;
        if (b->mask[t] == 0) {
            if (g[t] != 0 || Lp != L0 || Lm != L0) bad++;
            continue;
        }
        double sp = (Lp - L0) / ((double)xp - x0), sm = (L0 - Lm) / ((double)x0 - xm);
        double fd = (Lp - Lm) / ((double)xp - xm);
        if (fabs(sp - sm) > 0.05 * fmax(fabs(sp), fabs(sm)) + 1e-7) {
            kinks++;
            continue;
        }
        checked++;
        if (!(fabs(fd - g[t]) <= 1e-5 + 2e-3 * fabs(fd))) {
            if (bad < 3) fprintf(stderr, "%s: token %lld: analytic %.9g, finite difference %.9g\n", what, (long long)t, g[t], fd);
            bad++;
        }
    }
    if (bad || kinks * 10 > checked) fprintf(stderr, "%s: %d checked, %d kinks, %d bad\n", what, checked, kinks, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK(checked > 20 && kinks * 10 <= checked);
    free(g);
}

/* ---- the losses under test ----------------------------------------------------------------- */

typedef struct ctx {
    const batch *b;
    ff_rlhf_seqs s;
    ff_rlhf_agg_mode agg;
    ff_rlhf_ppo_cfg ppo;
    ff_rlhf_value_cfg value;
    ff_rlhf_kl_kind kl;
    float *a, *c, *d; /* other inputs */
} ctx;

static double eval_agg(loss_fn *f, float *g) {
    ctx *c = f->ctx;
    return ff_rlhf_agg(c->agg, &c->s, f->x, 0, g);
}
static double eval_ppo(loss_fn *f, float *g) {
    ctx *c = f->ctx;
    return ff_rlhf_ppo_loss(&c->ppo, &c->s, f->x, c->a, c->c, g, NULL);
}
static double eval_pg(loss_fn *f, float *g) {
    ctx *c = f->ctx;
    return ff_rlhf_pg_loss(c->agg, 0, &c->s, f->x, c->c, g);
}
static double eval_value(loss_fn *f, float *g) {
    ctx *c = f->ctx;
    return ff_rlhf_value_loss(&c->value, &c->s, f->x, c->a, c->c, g, NULL);
}
static double eval_kl(loss_fn *f, float *g) {
    ctx *c = f->ctx;
    return ff_rlhf_kl_loss(c->kl, c->agg, 0, &c->s, f->x, c->a, g);
}

static void test_finite_differences(void) {
    ff_rng rng;
    ff_rng_seed(&rng, 7);
    for (int mode = 0; mode < FF_RLHF_AGG_COUNT; mode++) {
        batch b;
        make_batch(&rng, &b, 12, 16);
        ctx c = {.b = &b, .s = {b.n_seq, b.offsets, b.mask}, .agg = (ff_rlhf_agg_mode)mode};
        char what[128];
        /* aggregation */
        float *x = rand_arr(&rng, b.T, 1);
        loss_fn f = {eval_agg, x, &c};
        snprintf(what, sizeof what, "agg %s", ff_rlhf_agg_name(c.agg));
        fd_check(what, &f, &b);
        /* PPO, three clip settings */
        static const double cfgs[3][3] = {{0.2, 0.2, 3.0}, {0.2, 0.28, 0.0}, {0.1, 0.3, 1.5}};
        c.a = rand_arr(&rng, b.T, 1); /* old logp */
        c.c = rand_arr(&rng, b.T, 1); /* advantages */
        float *lp = malloc(sizeof(float) * (size_t)(b.T + 1));
        REQUIRE(lp);
        for (int64_t t = 0; t < b.T; t++) lp[t] = c.a[t] + (float)(ff_rng_normal(&rng) * 0.5);
        for (int k = 0; k < 3; k++) {
            c.ppo = (ff_rlhf_ppo_cfg){cfgs[k][0], cfgs[k][1], cfgs[k][2], c.agg, 0};
            f = (loss_fn){eval_ppo, lp, &c};
            snprintf(what, sizeof what, "ppo %g/%g/%g %s", cfgs[k][0], cfgs[k][1], cfgs[k][2], ff_rlhf_agg_name(c.agg));
            fd_check(what, &f, &b);
        }
        f = (loss_fn){eval_pg, lp, &c};
        fd_check("pg", &f, &b);
        /* value loss, clipped and not */
        float *v = malloc(sizeof(float) * (size_t)(b.T + 1));
        REQUIRE(v);
        for (int64_t t = 0; t < b.T; t++) v[t] = c.a[t] + (float)(ff_rng_normal(&rng) * 0.4);
        for (int k = 0; k < 2; k++) {
            c.value = (ff_rlhf_value_cfg){k ? 0.0 : 0.2, c.agg, 0};
            f = (loss_fn){eval_value, v, &c};
            snprintf(what, sizeof what, "value clip=%g %s", c.value.clip, ff_rlhf_agg_name(c.agg));
            fd_check(what, &f, &b);
        }
        /* KL estimators as losses (reference log-probs in c.a) */
        for (int k = 0; k < FF_RLHF_KL_COUNT; k++) {
            c.kl = (ff_rlhf_kl_kind)k;
            f = (loss_fn){eval_kl, lp, &c};
            snprintf(what, sizeof what, "kl %s %s", ff_rlhf_kl_name(c.kl), ff_rlhf_agg_name(c.agg));
            fd_check(what, &f, &b);
        }
        free(x), free(lp), free(v), free(c.a), free(c.c), free(b.mask);
    }
}

/* The per-token KL derivative (not aggregated), by differences on each token alone. */
static void test_kl_token_derivatives(void) {
    for (int k = 0; k < FF_RLHF_KL_COUNT; k++) {
        for (double d = -4.5; d <= 4.5; d += 0.37) {
            float lp = (float)d, ref = 0.0f, kl, g, kp, km;
            ff_rlhf_kl((ff_rlhf_kl_kind)k, 1, &lp, &ref, &kl, &g);
            float lpp = lp + 1e-3f, lpm = lp - 1e-3f;
            ff_rlhf_kl((ff_rlhf_kl_kind)k, 1, &lpp, &ref, &kp, NULL);
            ff_rlhf_kl((ff_rlhf_kl_kind)k, 1, &lpm, &ref, &km, NULL);
            double fd = ((double)kp - km) / ((double)lpp - lpm);
            if (k == FF_RLHF_KL_K3 && fabs(exp(-d) + d - 1 - 10) < 0.1) continue; /* the clamp's kink */
            CHECK_CLOSE(g, fd, 2e-3, 2e-3);
        }
    }
    /* k3 past its clamps has zero derivative; k1 and k3 agree in expectation sign */
    float lp = -30, ref = 0, kl, g;
    ff_rlhf_kl(FF_RLHF_KL_K3, 1, &lp, &ref, &kl, &g);
    CHECK_CLOSE(kl, 10, 0, 0);
    CHECK_CLOSE(g, 0, 0, 0);
}

/* Splitting a batch into micro-batches and passing the whole batch's normaliser gives the
 * same total loss and the same gradients: what gradient accumulation needs. */
static void test_micro_batches_add_up(void) {
    ff_rng rng;
    ff_rng_seed(&rng, 11);
    batch b;
    make_batch(&rng, &b, 10, 12);
    float *lp = rand_arr(&rng, b.T, 1), *old = rand_arr(&rng, b.T, 1), *adv = rand_arr(&rng, b.T, 1);
    float *g_full = malloc(sizeof(float) * (size_t)b.T), *g_micro = malloc(sizeof(float) * (size_t)b.T);
    REQUIRE(g_full && g_micro);
    for (int mode = 0; mode < FF_RLHF_AGG_COUNT; mode++) {
        ff_rlhf_seqs all = {b.n_seq, b.offsets, b.mask};
        ff_rlhf_ppo_cfg cfg = {0.2, 0.28, 3.0, (ff_rlhf_agg_mode)mode, 0};
        double full = ff_rlhf_ppo_loss(&cfg, &all, lp, old, adv, g_full, NULL);
        cfg.denom = ff_rlhf_agg_denom(cfg.agg, &all);
        /* micro-batches: sequences [0,4) and [4,10), each re-based to offset 0 */
        double sum = 0;
        int32_t cuts[3] = {0, 4, 10};
        for (int k = 0; k < 2; k++) {
            int32_t off[11], base = b.offsets[cuts[k]];
            for (int32_t q = cuts[k]; q <= cuts[k + 1]; q++) off[q - cuts[k]] = b.offsets[q] - base;
            ff_rlhf_seqs part = {cuts[k + 1] - cuts[k], off, b.mask + base};
            sum += ff_rlhf_ppo_loss(&cfg, &part, lp + base, old + base, adv + base, g_micro + base, NULL);
        }
        CHECK_CLOSE(sum, full, 1e-12, 1e-9);
        for (int64_t t = 0; t < b.T; t++) CHECK_CLOSE(g_micro[t], g_full[t], 1e-9, 1e-6);
    }
    free(lp), free(old), free(adv), free(g_full), free(g_micro), free(b.mask);
}

static void test_gae_matrix_long(void) {
    ff_rng rng;
    ff_rng_seed(&rng, 3);
    batch b;
    make_batch(&rng, &b, 40, 300);
    float *r = rand_arr(&rng, b.T, 1), *v = rand_arr(&rng, b.T, 1);
    float *a1 = malloc(sizeof(float) * (size_t)b.T), *r1 = malloc(sizeof(float) * (size_t)b.T);
    float *a2 = malloc(sizeof(float) * (size_t)b.T), *r2 = malloc(sizeof(float) * (size_t)b.T);
    REQUIRE(a1 && r1 && a2 && r2);
    ff_rlhf_seqs s = {b.n_seq, b.offsets, b.mask};
    static const double gl[4][2] = {{1, 1}, {0.99, 0.95}, {1, 0.9}, {0.5, 0.5}};
    for (int k = 0; k < 4; k++) {
        ff_rlhf_gae(&s, r, v, gl[k][0], gl[k][1], a1, r1);
        REQUIRE(ff_rlhf_gae_matrix(&s, r, v, gl[k][0], gl[k][1], a2, r2) == 0);
        double worst = 0;
        for (int64_t t = 0; t < b.T; t++) {
            double e = fabs((double)a1[t] - a2[t]) / (1 + fabs(a1[t]));
            if (e > worst) worst = e;
            CHECK_CLOSE(r2[t], r1[t], 1e-5, 1e-5);
        }
        CHECK(worst < 1e-5);
    }
    /* gamma = lam = 1, no holes: A_t = (sum of rewards from t on) - V_t */
    for (int64_t t = 0; t < b.T; t++) b.mask[t] = 1;
    ff_rlhf_gae(&s, r, v, 1, 1, a1, r1);
    for (int32_t q = 0; q < b.n_seq; q++) {
        double togo = 0;
        for (int64_t t = b.offsets[q + 1] - 1; t >= b.offsets[q]; t--) {
            togo += r[t];
            CHECK_CLOSE(a1[t], togo - v[t], 1e-4, 1e-5);
            CHECK_CLOSE(r1[t], togo, 1e-4, 1e-5);
        }
    }
    free(r), free(v), free(a1), free(r1), free(a2), free(r2), free(b.mask);
}

static void test_edges_and_errors(void) {
    /* an all-masked batch: zero loss, zero gradient, no NaN even with garbage values */
    int32_t off[3] = {0, 2, 3};
    float mask[3] = {0, 0, 0}, x[3] = {NAN, INFINITY, 1}, g[3] = {1, 1, 1};
    ff_rlhf_seqs s = {2, off, mask};
    for (int m = 0; m < FF_RLHF_AGG_COUNT; m++) {
        CHECK_CLOSE(ff_rlhf_agg((ff_rlhf_agg_mode)m, &s, x, 0, g), 0, 0, 0);
        CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0);
    }
    float adv[3] = {1, 1, 1};
    ff_rlhf_ppo_cfg cfg = {0.2, 0.2, 3, FF_RLHF_AGG_TOKEN_MEAN, 0};
    ff_rlhf_pg_stats st;
    CHECK_CLOSE(ff_rlhf_ppo_loss(&cfg, &s, x, x, adv, g, &st), 0, 0, 0);
    CHECK(st.clipfrac == 0 && st.ratio_mean == 0);

    /* names */
    ff_rlhf_agg_mode am;
    CHECK_EQ_INT(ff_rlhf_agg_parse("seq-mean-token-mean", &am), 0);
    CHECK_EQ_INT(am, FF_RLHF_AGG_SEQ_MEAN_TOKEN_MEAN);
    CHECK_EQ_INT(ff_rlhf_agg_parse("token_mean", &am), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown loss aggregation 'token_mean'");
    ff_rlhf_kl_kind kk;
    CHECK_EQ_INT(ff_rlhf_kl_parse("k3", &kk), 0);
    CHECK_EQ_INT(kk, FF_RLHF_KL_K3);
    CHECK_EQ_INT(ff_rlhf_kl_parse("low_var_kl", &kk), 0);
    CHECK_EQ_INT(kk, FF_RLHF_KL_K3);
    CHECK_EQ_INT(ff_rlhf_kl_parse("full", &kk), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "low_var_kl");

    /* group ids out of range */
    int32_t off4[5] = {0, 2, 4, 6, 8};
    float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1}, sc[4] = {1, 1, 1, 1}, out[8];
    ff_rlhf_seqs s4 = {4, off4, ones};
    int32_t bad_group[4] = {0, 0, 4, 1};
    CHECK_EQ_INT(ff_rlhf_grpo(&s4, sc, bad_group, true, 1e-6, out), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "group id 4");
    CHECK_EQ_INT(ff_rlhf_rloo(&s4, sc, bad_group, out), -1);
    /* equal scores within a group: zero advantage (GRPO and RLOO) */
    int32_t group[4] = {2, 2, 2, 2};
    CHECK_EQ_INT(ff_rlhf_grpo(&s4, sc, group, true, 1e-6, out), 0);
    for (int t = 0; t < 8; t++) CHECK_CLOSE(out[t], 0, 0, 0);
    /* RLOO = n/(n-1) (r - mean): scores 1,0,0,0 -> 1, -1/3, -1/3, -1/3 */
    float sc2[4] = {1, 0, 0, 0};
    CHECK_EQ_INT(ff_rlhf_rloo(&s4, sc2, group, out), 0);
    CHECK_CLOSE(out[0], 1, 1e-6, 0);
    CHECK_CLOSE(out[2], -1.0 / 3, 1e-6, 0);

    /* sequence scores <-> token rewards */
    float tok[8], back[4];
    float mask8[8] = {1, 1, 1, 0, 0, 0, 1, 1};
    ff_rlhf_seqs s8 = {4, off4, mask8};
    float sc3[4] = {5, 6, 7, 8};
    ff_rlhf_scores_to_tokens(&s8, sc3, tok);
    CHECK(tok[1] == 5 && tok[0] == 0 && tok[2] == 6 && tok[3] == 0 && tok[4] == 0 && tok[5] == 0 && tok[7] == 8);
    ff_rlhf_seq_scores(&s8, tok, back);
    CHECK(back[0] == 5 && back[1] == 6 && back[2] == 0 && back[3] == 8);

    /* adaptive KL controller: kl at twice the target raises the coefficient by 20% x n/horizon */
    ff_rlhf_kl_ctl ctl = {0.1, true, 0.05, 100};
    ff_rlhf_kl_ctl_update(&ctl, 0.1, 50);
    CHECK_CLOSE(ctl.coef, 0.1 * (1 + 0.2 * 0.5), 1e-15, 1e-12);
    ff_rlhf_kl_ctl fixed = {0.1, false, 0, 0};
    ff_rlhf_kl_ctl_update(&fixed, 10, 50);
    CHECK_CLOSE(fixed.coef, 0.1, 0, 0);
}

int main(void) {
    test_finite_differences();
    test_kl_token_derivatives();
    test_micro_batches_add_up();
    test_gae_matrix_long();
    test_edges_and_errors();
    TEST_MAIN_END();
}
