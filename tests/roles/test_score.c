/* Scoring: per-token log-probs/entropy, critic values and reward-model scores over
 * micro-batches equal a plain forward of each sample alone at the documented positions,
 * whatever the micro-batch limits; value heads from a policy checkpoint; errors. */
#include "tests/roles/roles_test_util.h"

enum { NS = 7 };

static int32_t PROMPTS[NS][6] = {{2, 3}, {4, 5, 6, 7, 8, 9}, {10}, {11, 12, 13}, {14, 15, 16, 17}, {18, 19}, {20, 21, 22}};
static int32_t PLEN[NS] = {2, 6, 1, 3, 4, 2, 3};
static int32_t RESP[NS][9] = {{5, 6, 7}, {30}, {31, 32, 33, 34, 35, 36, 37, 38, 1}, {0}, {22, 23}, {24, 25, 26, 27}, {28}};
static int32_t RLEN[NS] = {3, 1, 9, 0, 2, 4, 1};

static void samples(ff_rl_sample *s) {
    for (int i = 0; i < NS; i++)
        s[i] = (ff_rl_sample){.prompt = PROMPTS[i], .prompt_len = PLEN[i], .response = RESP[i], .response_len = RLEN[i]};
}

/* reference: sample i alone, full forward, outputs at positions P-1+j */
static void reference(ff_model *m, int i, float temp, float *lp, float *ent, float *val, float *last) {
    int32_t tok[16], ss[2] = {0, PLEN[i] + RLEN[i]}, tg[16];
    memcpy(tok, PROMPTS[i], (size_t)PLEN[i] * 4);
    memcpy(tok + PLEN[i], RESP[i], (size_t)RLEN[i] * 4);
    ff_batch_shift_targets(tok, ss, 1, tg);
    ff_batch b = {ss[1], 1, tok, ss, tg};
    float a[16], e[16], v[16];
    ff_forward_opts o = {false, temp};
    bool lm = ff_model_has_lm_head(m), vh = ff_model_config_of(m)->value_head;
    ff_forward_out out = {lm ? a : NULL, lm ? e : NULL, vh ? v : NULL, NULL};
    DIE_IF(ff_model_forward(m, &b, &o, &out));
    for (int j = 0; j < RLEN[i]; j++) {
        if (lp) lp[j] = a[PLEN[i] - 1 + j];
        if (ent) ent[j] = e[PLEN[i] - 1 + j];
        if (val) val[j] = v[PLEN[i] - 1 + j];
    }
    if (last) *last = v[ss[1] - 1];
}

static void test_logprobs(ff_model *m) {
    ff_rl_sample s[NS];
    samples(s);
    float lp[NS][9], ent[NS][9];
    float *plp[NS], *pent[NS];
    for (int i = 0; i < NS; i++) plp[i] = lp[i], pent[i] = ent[i];
    const ff_score_opts opts[] = {{0, 0, 0, NULL}, {1, 0, 0.7f, NULL}, {3, 0, 1.0f, NULL}, {0, 12, 1.3f, NULL}, {2, 9, 0, NULL}};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        memset(lp, 0, sizeof lp);
        DIE_IF(ff_score_logprobs(m, s, NS, &opts[k], plp, pent));
        for (int i = 0; i < NS; i++) {
            float rl[9], re[9];
            reference(m, i, opts[k].temperature, rl, re, NULL, NULL);
            for (int j = 0; j < RLEN[i]; j++) {
                CHECK_CLOSE(lp[i][j], rl[j], 1e-5, 1e-5);
                CHECK_CLOSE(ent[i][j], re[j], 1e-5, 1e-5);
            }
        }
    }
    /* temperature matters (so the comparison above is not vacuous) */
    float hot[NS][9];
    float *phot[NS];
    for (int i = 0; i < NS; i++) phot[i] = hot[i];
    ff_score_opts h = {.temperature = 2.0f};
    DIE_IF(ff_score_logprobs(m, s, NS, &h, phot, NULL));
    DIE_IF(ff_score_logprobs(m, s, NS, NULL, plp, NULL));
    CHECK(fabsf(hot[0][0] - lp[0][0]) > 1e-3);
}

static void test_values(ff_backend *be) {
    ff_model_config c = small_config(false, false);
    ff_tensor_set *w = ff_tensor_set_new();
    DIE_IF(ff_model_init_weights(&c, 9, 0.3, w));
    REQUIRE(ff_tensor_set_find(w, "lm_head.weight"));
    DIE_IF(ff_roles_add_value_head(&c, w, 0.5, 1));
    CHECK(c.value_head);
    CHECK(ff_tensor_set_find(w, "lm_head.weight") == NULL); /* untied: a critic has no LM head */
    const ff_host_tensor *sc = ff_tensor_set_find(w, "score.weight");
    REQUIRE(sc && sc->ndim == 2 && sc->shape[0] == 1 && sc->shape[1] == 32);
    CHECK(sc->data[0] != 0);
    ff_model *critic = ff_model_new(be, &c, w);
    DIE_IF(!critic);
    CHECK(!ff_model_has_lm_head(critic));
    ff_tensor_set_destroy(&w);

    ff_rl_sample s[NS];
    samples(s);
    float v[NS][9], scores[NS];
    float *pv[NS];
    for (int i = 0; i < NS; i++) pv[i] = v[i];
    ff_score_opts o = {.micro_batch_size = 2};
    DIE_IF(ff_score_values(critic, s, NS, &o, pv));
    DIE_IF(ff_score_reward_model(critic, s, NS, NULL, scores));
    for (int i = 0; i < NS; i++) {
        float rv[9], last;
        reference(critic, i, 0, NULL, NULL, rv, &last);
        for (int j = 0; j < RLEN[i]; j++) CHECK_CLOSE(v[i][j], rv[j], 1e-5, 1e-5);
        CHECK_CLOSE(scores[i], last, 1e-5, 1e-5);
    }
    /* a critic cannot give log-probs; an actor without a value head cannot give values */
    float *plp[NS];
    for (int i = 0; i < NS; i++) plp[i] = v[i];
    CHECK(ff_score_logprobs(critic, s, NS, NULL, plp, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "critic");
    ff_model_config ac = small_config(false, true);
    ff_model *actor = small_model(be, &ac, 2);
    CHECK(ff_score_values(actor, s, NS, NULL, pv) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "value head");
    /* tied embeddings stay (the critic keeps its embedding) */
    ff_tensor_set *tw = ff_tensor_set_new();
    DIE_IF(ff_model_init_weights(&ac, 9, 0.3, tw));
    DIE_IF(ff_roles_add_value_head(&ac, tw, 0, 1));
    CHECK(ff_tensor_set_find(tw, "score.weight")->data[5] == 0);
    ff_model *tc = ff_model_new(be, &ac, tw);
    DIE_IF(!tc);
    DIE_IF(ff_score_values(tc, s, NS, NULL, pv));
    ff_tensor_set_destroy(&tw);
    /* an existing score.weight of the wrong shape is refused */
    ff_tensor_set *bw = ff_tensor_set_new();
    ff_model_config bc = small_config(false, true);
    DIE_IF(ff_model_init_weights(&bc, 9, 0.3, bw));
    REQUIRE(ff_tensor_set_add(bw, "score.weight", 2, (int64_t[]){2, 32}));
    CHECK(ff_roles_add_value_head(&bc, bw, 0.1, 1) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "score.weight");
    ff_tensor_set_destroy(&bw);
    ff_model_destroy(&tc);
    ff_model_destroy(&actor);
    ff_model_destroy(&critic);
}

static void test_bad_samples(ff_model *m) {
    ff_rl_sample s[NS];
    samples(s);
    s[2].prompt_len = 0;
    float buf[NS][9];
    float *p[NS];
    for (int i = 0; i < NS; i++) p[i] = buf[i];
    CHECK(ff_score_logprobs(m, s, NS, NULL, p, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "empty prompt");
    samples(s);
    int32_t bad[1] = {99};
    s[4].response = bad;
    s[4].response_len = 1;
    CHECK(ff_score_logprobs(m, s, NS, NULL, p, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "99");
}

int main(void) {
    ff_backend *be = test_backend();
    ff_model_config c = small_config(false, false);
    ff_model *m = small_model(be, &c, 5);
    test_logprobs(m);
    test_values(be);
    test_bad_samples(m);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
