/* Every op of include/fuseflow/rlhf.h against PyTorch: tests/reference/ref_rlhf.py computed
 * values and autograd derivatives on random variable-length batches with masks (empty and
 * fully masked sequences, holes, log-ratios past the clamps) and wrote them to
 * tests/reference/fixtures/rlhf.json. Tolerances: losses (double on both sides, identical
 * fp32 inputs) to 1e-9 relative; fp32 arrays to 1e-6 + 1e-5 relative. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/rlhf.h"
#include "tests/test_util.h"

#define LOSS_TOL 1e-9, 1e-9

static int n_cases, n_compared;

static float *farr(json_t *a, size_t *n) {
    REQUIRE(json_is_array(a));
    size_t k = json_array_size(a);
    float *v = calloc(k ? k : 1, sizeof *v);
    REQUIRE(v);
    for (size_t i = 0; i < k; i++) v[i] = (float)json_number_value(json_array_get(a, i));
    if (n) *n = k;
    return v;
}

static float *input(json_t *c, const char *key, size_t T) {
    size_t n;
    float *v = farr(json_object_get(json_object_get(c, "inputs"), key), &n);
    if (T) REQUIRE(n == T);
    return v;
}

static double pnum(json_t *c, const char *key) { return json_number_value(json_object_get(json_object_get(c, "params"), key)); }
static const char *pstr(json_t *c, const char *key) { return json_string_value(json_object_get(json_object_get(c, "params"), key)); }
static double onum(json_t *c, const char *key) { return json_number_value(json_object_get(json_object_get(c, "outputs"), key)); }

static void cmp_arr(json_t *c, const char *key, const float *got, size_t T) {
    json_t *a = json_object_get(json_object_get(c, "outputs"), key);
    REQUIRE(json_is_array(a) && json_array_size(a) == T);
    int bad = 0;
    for (size_t i = 0; i < T; i++) {
        double want = json_number_value(json_array_get(a, i));
        if (!(fabs(got[i] - want) <= 1e-6 + 1e-5 * fabs(want))) {
            if (bad++ < 3)
                fprintf(stderr, "%s: %s[%zu] = %.9g, torch %.9g\n", json_string_value(json_object_get(c, "name")), key, i,
                        got[i], want);
        }
    }
    CHECK_EQ_INT(bad, 0);
    n_compared += (int)T;
}

static void cmp_num(json_t *c, const char *key, double got, double atol, double rtol) {
    double want = onum(c, key);
    if (!(fabs(got - want) <= atol + rtol * fabs(want)))
        fprintf(stderr, "%s: %s = %.12g, torch %.12g\n", json_string_value(json_object_get(c, "name")), key, got, want);
    CHECK_CLOSE(got, want, atol, rtol);
    n_compared++;
}

static void run_case(json_t *c) {
    const char *op = json_string_value(json_object_get(c, "op"));
    json_t *off = json_object_get(c, "offsets");
    int32_t n_seq = (int32_t)json_array_size(off) - 1;
    int32_t *offsets = malloc(sizeof *offsets * (size_t)(n_seq + 1));
    REQUIRE(offsets);
    for (int32_t i = 0; i <= n_seq; i++) offsets[i] = (int32_t)json_integer_value(json_array_get(off, (size_t)i));
    size_t T;
    float *mask = farr(json_object_get(c, "mask"), &T);
    REQUIRE((size_t)offsets[n_seq] == T);
    ff_rlhf_seqs s = {n_seq, offsets, mask};
    float *o1 = calloc(T + 1, sizeof *o1), *o2 = calloc(T + 1, sizeof *o2);
    REQUIRE(o1 && o2);
    ff_rlhf_agg_mode agg = FF_RLHF_AGG_TOKEN_MEAN;
    if (pstr(c, "agg")) REQUIRE(ff_rlhf_agg_parse(pstr(c, "agg"), &agg) == 0);

    if (!strcmp(op, "agg")) {
        float *x = input(c, "x", T);
        cmp_num(c, "loss", ff_rlhf_agg(agg, &s, x, pnum(c, "denom"), o1), LOSS_TOL);
        cmp_arr(c, "dx", o1, T);
        free(x);
    } else if (!strcmp(op, "ppo")) {
        float *lp = input(c, "logp", T), *old = input(c, "old_logp", T), *adv = input(c, "adv", T);
        ff_rlhf_ppo_cfg cfg = {pnum(c, "clip_low"), pnum(c, "clip_high"), pnum(c, "clip_c"), agg, pnum(c, "denom")};
        ff_rlhf_pg_stats st;
        cmp_num(c, "loss", ff_rlhf_ppo_loss(&cfg, &s, lp, old, adv, o1, &st), LOSS_TOL);
        cmp_arr(c, "dlogp", o1, T);
        cmp_num(c, "clipfrac", st.clipfrac, 1e-12, 0);
        cmp_num(c, "clipfrac_lower", st.clipfrac_lower, 1e-12, 0);
        cmp_num(c, "approx_kl", st.approx_kl, LOSS_TOL);
        cmp_num(c, "ratio_mean", st.ratio_mean, LOSS_TOL);
        cmp_num(c, "ratio_min", st.ratio_min, LOSS_TOL);
        cmp_num(c, "ratio_max", st.ratio_max, LOSS_TOL);
        /* without dlogp or stats, the same value */
        CHECK_CLOSE(ff_rlhf_ppo_loss(&cfg, &s, lp, old, adv, NULL, NULL), onum(c, "loss"), 1e-9, 1e-9);
        free(lp), free(old), free(adv);
    } else if (!strcmp(op, "pg")) {
        float *lp = input(c, "logp", T), *adv = input(c, "adv", T);
        cmp_num(c, "loss", ff_rlhf_pg_loss(agg, 0, &s, lp, adv, o1), LOSS_TOL);
        cmp_arr(c, "dlogp", o1, T);
        free(lp), free(adv);
    } else if (!strcmp(op, "value")) {
        float *v = input(c, "v", T), *old = input(c, "old_v", T), *ret = input(c, "ret", T);
        ff_rlhf_value_cfg cfg = {pnum(c, "clip"), agg, 0};
        double cf;
        cmp_num(c, "loss", ff_rlhf_value_loss(&cfg, &s, v, old, ret, o1, &cf), LOSS_TOL);
        cmp_arr(c, "dv", o1, T);
        cmp_num(c, "clipfrac", cf, 1e-12, 0);
        free(v), free(old), free(ret);
    } else if (!strcmp(op, "kl")) {
        float *lp = input(c, "logp", T), *ref = input(c, "ref", T);
        ff_rlhf_kl_kind kind;
        REQUIRE(ff_rlhf_kl_parse(pstr(c, "kind"), &kind) == 0);
        ff_rlhf_kl(kind, (int64_t)T, lp, ref, o1, o2);
        cmp_arr(c, "kl", o1, T);
        cmp_arr(c, "dkl", o2, T);
        cmp_num(c, "loss", ff_rlhf_kl_loss(kind, agg, 0, &s, lp, ref, o1), LOSS_TOL);
        cmp_arr(c, "dlogp", o1, T);
        free(lp), free(ref);
    } else if (!strcmp(op, "kl_penalty")) {
        float *sc = input(c, "token_scores", T), *kl = input(c, "kl", T);
        ff_rlhf_kl_penalty(&s, sc, kl, pnum(c, "coef"), o1);
        cmp_arr(c, "out", o1, T);
        ff_rlhf_kl_penalty(&s, sc, kl, pnum(c, "coef"), sc); /* in place */
        cmp_arr(c, "out", sc, T);
        free(sc), free(kl);
    } else if (!strcmp(op, "gae")) {
        float *r = input(c, "rewards", T), *v = input(c, "values", T);
        ff_rlhf_gae(&s, r, v, pnum(c, "gamma"), pnum(c, "lam"), o1, o2);
        cmp_arr(c, "adv", o1, T);
        cmp_arr(c, "ret", o2, T);
        REQUIRE(ff_rlhf_gae_matrix(&s, r, v, pnum(c, "gamma"), pnum(c, "lam"), o1, o2) == 0);
        cmp_arr(c, "adv", o1, T);
        cmp_arr(c, "ret", o2, T);
        ff_rlhf_whiten(&s, o1, true, o1);
        cmp_arr(c, "adv_whitened", o1, T);
        free(r), free(v);
    } else if (!strcmp(op, "whiten")) {
        float *x = input(c, "x", T);
        ff_rlhf_whiten(&s, x, json_is_true(json_object_get(json_object_get(c, "params"), "shift_mean")), o1);
        cmp_arr(c, "out", o1, T);
        free(x);
    } else if (!strcmp(op, "grpo") || !strcmp(op, "grpo_nostd") || !strcmp(op, "rloo")) {
        float *sc = input(c, "scores", (size_t)n_seq);
        json_t *g = json_object_get(json_object_get(c, "inputs"), "group");
        int32_t *group = malloc(sizeof *group * (size_t)n_seq);
        REQUIRE(group && (int32_t)json_array_size(g) == n_seq);
        for (int32_t i = 0; i < n_seq; i++) group[i] = (int32_t)json_integer_value(json_array_get(g, (size_t)i));
        int rc = !strcmp(op, "rloo") ? ff_rlhf_rloo(&s, sc, group, o1)
                                     : ff_rlhf_grpo(&s, sc, group, !strcmp(op, "grpo"), pnum(c, "eps"), o1);
        REQUIRE(rc == 0);
        cmp_arr(c, "adv", o1, T);
        free(sc), free(group);
    } else if (!strcmp(op, "reinforce_pp")) {
        float *r = input(c, "rewards", T);
        ff_rlhf_reinforce_pp(&s, r, pnum(c, "gamma"), o1, o2);
        cmp_arr(c, "adv", o1, T);
        cmp_arr(c, "ret", o2, T);
        free(r);
    } else if (!strcmp(op, "remax")) {
        float *r = input(c, "rewards", T), *b = input(c, "baseline", (size_t)n_seq);
        ff_rlhf_remax(&s, r, b, o1, o2);
        cmp_arr(c, "adv", o1, T);
        cmp_arr(c, "ret", o2, T);
        free(r), free(b);
    } else {
        fprintf(stderr, "unknown op '%s' in the fixtures\n", op);
        CHECK(0);
    }
    n_cases++;
    free(o1), free(o2), free(offsets), free(mask);
}

int main(void) {
    const char *src = getenv("FF_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/reference/fixtures/rlhf.json", src ? src : ".");
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    if (!doc) {
        fprintf(stderr, "%s:%d: %s\n", path, err.line, err.text);
        return 1;
    }
    json_t *cases = json_object_get(doc, "cases");
    REQUIRE(json_is_array(cases) && json_array_size(cases) >= 40);
    for (size_t i = 0; i < json_array_size(cases); i++) run_case(json_array_get(cases, i));
    printf("%d cases, %d values compared with PyTorch\n", n_cases, n_compared);
    json_decref(doc);
    TEST_MAIN_END();
}
