/* The rollout engine: continuous batching gives each prompt the samples and log-probs it gets
 * alone; a shared prefill gives what separate prefills give; returned log-probs equal a fresh
 * forward's at the sampling temperature; results do not depend on how requests interleave;
 * streaming, abort, weight sync and bad requests. */
#include "tests/roles/roles_test_util.h"

enum { NREQ = 6 };

typedef struct req_spec {
    int32_t prompt[8];
    int32_t prompt_len, n, max_new;
    float temperature, top_p;
    int32_t top_k;
    uint64_t seed;
} req_spec;

static const req_spec SPECS[NREQ] = {
    {{2, 5, 7}, 3, 3, 9, 1.0f, 1.0f, 0, 11},
    {{3, 4, 5, 6, 7, 8, 9}, 7, 1, 12, 0.7f, 1.0f, 0, 12},
    {{9}, 1, 4, 6, 1.3f, 0.9f, 0, 13},
    {{10, 11, 12, 13}, 4, 2, 15, 1.0f, 1.0f, 5, 14},
    {{20, 21}, 2, 1, 4, 0.0f, 1.0f, 0, 15},
    {{30, 31, 32, 33, 34}, 5, 3, 10, 0.9f, 0.95f, 8, 16},
};

static ff_rollout_request make_req(int i, uint64_t id) {
    const req_spec *s = &SPECS[i];
    ff_rollout_request q = {.id = id, .prompt = s->prompt, .prompt_len = s->prompt_len, .n = s->n, .seed = s->seed};
    ff_sampling_default(&q.sampling);
    q.sampling.temperature = s->temperature;
    q.sampling.top_p = s->top_p;
    q.sampling.top_k = s->top_k;
    q.sampling.max_new_tokens = s->max_new;
    return q;
}

static ff_rollout *engine(ff_model *m, int32_t slots) {
    ff_rollout_config c;
    ff_rollout_config_default(&c);
    c.max_slots = slots;
    c.max_seq_len = 32;
    ff_rollout *r = ff_rollout_new(m, &c);
    DIE_IF(!r);
    return r;
}

/* the samples of request i, alone on a fresh engine */
static void alone(ff_model *m, int i, ff_gen_output **outs, int32_t *n) {
    ff_rollout *r = engine(m, 8);
    ff_rollout_request q = make_req(i, 100 + (uint64_t)i);
    DIE_IF(ff_rollout_add(r, &q));
    DIE_IF(ff_rollout_run(r, outs, n));
    CHECK_EQ_INT(*n, SPECS[i].n);
    ff_rollout_destroy(&r);
}

static bool same_output(const ff_gen_output *a, const ff_gen_output *b, double tol) {
    if (a->n_tokens != b->n_tokens || a->finish != b->finish || a->sample != b->sample) return false;
    for (int32_t t = 0; t < a->n_tokens; t++)
        if (a->tokens[t] != b->tokens[t] || fabs(a->logprobs[t] - b->logprobs[t]) > tol) return false;
    return true;
}

static void free_outs(ff_gen_output *o, int32_t n) {
    for (int32_t i = 0; i < n; i++) ff_gen_output_free(&o[i]);
    free(o);
}

/* Everything at once through 3 slots (requests wait, finished ones leave, waiting ones join)
 * equals each request alone; so does a different interleaving of adds and steps. */
static void test_continuous_batching(ff_model *m) {
    ff_gen_output *ref[NREQ];
    int32_t nref[NREQ];
    for (int i = 0; i < NREQ; i++) alone(m, i, &ref[i], &nref[i]);

    /* A: all queued, 4 slots (request 2 needs 4: it waits for a fully free engine) */
    ff_rollout *r = engine(m, 4);
    for (int i = 0; i < NREQ; i++) {
        ff_rollout_request q = make_req(i, 100 + (uint64_t)i);
        DIE_IF(ff_rollout_add(r, &q));
    }
    ff_gen_output *outs;
    int32_t n;
    DIE_IF(ff_rollout_run(r, &outs, &n));
    int32_t k = 0;
    for (int i = 0; i < NREQ; i++)
        for (int32_t j = 0; j < nref[i]; j++, k++) {
            REQUIRE(k < n);
            CHECK_EQ_INT(outs[k].id, 100 + i);
            CHECK(same_output(&outs[k], &ref[i][j], 2e-5));
        }
    CHECK_EQ_INT(k, n);
    CHECK(ff_rollout_stats_of(r)->max_running <= 4);
    CHECK_EQ_INT(ff_rollout_stats_of(r)->samples_done, n);
    free_outs(outs, n);

    /* B: reverse order, adds interleaved with steps, streamed out one by one */
    ff_gen_output got[32];
    int32_t n_got = 0, finished = 0;
    for (int i = NREQ - 1; i >= 0; i--) {
        ff_rollout_request q = make_req(i, 100 + (uint64_t)i);
        DIE_IF(ff_rollout_add(r, &q));
        for (int s = 0; s < i % 3; s++) {
            int f = ff_rollout_step(r);
            DIE_IF(f < 0);
            finished += f;
        }
        while (n_got < 32 && ff_rollout_take(r, &got[n_got])) n_got++;
    }
    while (ff_rollout_pending(r) > 0) {
        int f = ff_rollout_step(r);
        DIE_IF(f < 0);
        finished += f;
        while (n_got < 32 && ff_rollout_take(r, &got[n_got])) n_got++;
    }
    CHECK_EQ_INT(finished, n_got);
    int32_t total = 0;
    for (int i = 0; i < NREQ; i++) total += nref[i];
    CHECK_EQ_INT(n_got, total);
    for (int32_t g = 0; g < n_got; g++) {
        int i = (int)got[g].id - 100;
        REQUIRE(i >= 0 && i < NREQ && got[g].sample < nref[i]);
        CHECK(same_output(&got[g], &ref[i][got[g].sample], 2e-5));
        ff_gen_output_free(&got[g]);
    }
    ff_rollout_destroy(&r);
    for (int i = 0; i < NREQ; i++) free_outs(ref[i], nref[i]);
}

/* One request with n samples (one prefill, K/V copied into n slots) equals n requests of one
 * sample each with the per-sample seeds: sample j of a request draws from the stream
 * seed ^ (0x9E3779B97F4A7C15 * (j + 1)) (model/generate.c), so a one-sample request with seed
 * s' = seed ^ K(j+1) ^ K(1) draws the same numbers from its own prefill. */
static void test_shared_prefill(ff_model *m) {
    const uint64_t K = 0x9E3779B97F4A7C15ull;
    int32_t prompt[6] = {4, 8, 15, 16, 23, 3};
    ff_rollout *r = engine(m, 8);
    ff_rollout_request q = {.id = 1, .prompt = prompt, .prompt_len = 6, .n = 5, .seed = 77};
    ff_sampling_default(&q.sampling);
    q.sampling.max_new_tokens = 10;
    DIE_IF(ff_rollout_add(r, &q));
    ff_gen_output *shared;
    int32_t ns;
    DIE_IF(ff_rollout_run(r, &shared, &ns));
    REQUIRE(ns == 5);
    for (int32_t j = 0; j < 5; j++) {
        ff_rollout_request one = q;
        one.n = 1;
        one.id = 2;
        one.seed = 77 ^ (K * (uint64_t)(j + 1)) ^ K;
        DIE_IF(ff_rollout_add(r, &one));
        ff_gen_output *sep;
        int32_t n1;
        DIE_IF(ff_rollout_run(r, &sep, &n1));
        REQUIRE(n1 == 1);
        sep[0].sample = j;
        CHECK(same_output(&shared[j], &sep[0], 2e-5));
        free_outs(sep, n1);
    }
    /* the samples differ from each other (the streams are distinct) */
    int distinct = 0;
    for (int32_t j = 1; j < 5; j++) {
        ff_gen_output a = shared[j];
        a.sample = 0;
        distinct += !same_output(&shared[0], &a, 0);
    }
    CHECK(distinct >= 3);
    free_outs(shared, ns);
    ff_rollout_destroy(&r);
}

/* The log-probs returned with the tokens are those of a fresh forward over prompt + response
 * at the sampling temperature (FF_LOGPROB_TEMPERATURE), which is what the trainer computes. */
static void test_logprobs_match_forward(ff_model *m) {
    ff_rollout *r = engine(m, 5);
    for (int i = 0; i < NREQ; i++) {
        if (SPECS[i].temperature == 0) continue;
        ff_rollout_request q = make_req(i, (uint64_t)i);
        DIE_IF(ff_rollout_add(r, &q));
    }
    ff_gen_output *outs;
    int32_t n;
    DIE_IF(ff_rollout_run(r, &outs, &n));
    int checked = 0;
    for (int32_t k = 0; k < n; k++) {
        const req_spec *s = &SPECS[outs[k].id];
        ff_rl_sample smp = {.prompt = s->prompt, .prompt_len = s->prompt_len, .response = outs[k].tokens,
                            .response_len = outs[k].n_tokens};
        float lp[32];
        float *lpp = lp;
        ff_score_opts so = {.temperature = s->temperature};
        DIE_IF(ff_score_logprobs(m, &smp, 1, &so, &lpp, NULL));
        for (int32_t t = 0; t < outs[k].n_tokens; t++) {
            CHECK_CLOSE(outs[k].logprobs[t], lp[t], 1e-4, 1e-4);
            checked++;
        }
    }
    CHECK(checked > 30);
    free_outs(outs, n);
    ff_rollout_destroy(&r);
}

/* Same seed, same samples, whatever max_slots is and whatever else is queued. */
static void test_determinism(ff_model *m) {
    ff_gen_output *a, *b;
    int32_t na, nb;
    ff_rollout *r1 = engine(m, 2), *r2 = engine(m, 16);
    for (int i = 0; i < NREQ; i++) {
        if (SPECS[i].n > 2) continue;
        ff_rollout_request q = make_req(i, (uint64_t)i);
        DIE_IF(ff_rollout_add(r1, &q));
    }
    for (int i = NREQ - 1; i >= 0; i--) {
        ff_rollout_request q = make_req(i, (uint64_t)i);
        DIE_IF(ff_rollout_add(r2, &q));
    }
    DIE_IF(ff_rollout_run(r1, &a, &na));
    DIE_IF(ff_rollout_run(r2, &b, &nb));
    /* b is in r2's arrival order (reversed requests): match by (id, sample) */
    int matched = 0;
    for (int32_t i = 0; i < na; i++)
        for (int32_t j = 0; j < nb; j++)
            if (a[i].id == b[j].id && a[i].sample == b[j].sample) {
                CHECK(same_output(&a[i], &b[j], 2e-5));
                matched++;
            }
    CHECK_EQ_INT(matched, na);
    free_outs(a, na);
    free_outs(b, nb);
    ff_rollout_destroy(&r1);
    ff_rollout_destroy(&r2);
}

/* Abort, weight sync guarded while sequences decode, bad requests. */
static void test_abort_sync_errors(ff_backend *be, ff_model *m) {
    ff_rollout *r = engine(m, 4);
    ff_rollout_request q = make_req(1, 5); /* 1 sample, 12 tokens */
    q.sampling.stop_tokens = (int32_t[]){39};
    q.sampling.n_stop = 1;
    ff_rollout_request w = make_req(2, 6); /* 4 samples: must wait for 4 free slots */
    DIE_IF(ff_rollout_add(r, &q));
    DIE_IF(ff_rollout_add(r, &w));
    DIE_IF(ff_rollout_step(r) < 0);
    DIE_IF(ff_rollout_step(r) < 0);
    CHECK_EQ_INT(ff_rollout_running(r), 1);

    ff_model_config c = *ff_model_config_of(m);
    ff_model *other = small_model(be, &c, 999);
    CHECK(ff_rollout_sync_weights(r, other) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "decoding");

    CHECK_EQ_INT(ff_rollout_abort(r, 5), 1);
    ff_gen_output o;
    REQUIRE(ff_rollout_take(r, &o) == 1);
    CHECK_EQ_INT(o.id, 5);
    CHECK(o.finish == FF_FINISH_ABORTED);
    CHECK(o.n_tokens >= 2 && o.n_tokens < 12);
    ff_gen_output_free(&o);
    CHECK_EQ_INT(ff_rollout_abort(r, 6), 4); /* waiting: they vanish */
    CHECK_EQ_INT(ff_rollout_pending(r), 0);
    CHECK(ff_rollout_take(r, &o) == 0);

    /* idle: sync works, and the engine now samples from the new weights */
    DIE_IF(ff_rollout_sync_weights(r, other));
    ff_rollout_request g = make_req(4, 7); /* greedy */
    DIE_IF(ff_rollout_add(r, &g));
    ff_gen_output *outs;
    int32_t n;
    DIE_IF(ff_rollout_run(r, &outs, &n));
    ff_rollout *ro = engine(other, 4);
    DIE_IF(ff_rollout_add(ro, &g));
    ff_gen_output *exp;
    int32_t ne;
    DIE_IF(ff_rollout_run(ro, &exp, &ne));
    REQUIRE(n == 1 && ne == 1);
    CHECK(same_output(&outs[0], &exp[0], 0));
    free_outs(outs, n);
    free_outs(exp, ne);
    ff_rollout_destroy(&ro);

    /* bad requests: clear errors, nothing queued */
    int32_t bad[2] = {3, 40};
    ff_rollout_request b = make_req(0, 9);
    b.prompt = bad;
    b.prompt_len = 2;
    CHECK(ff_rollout_add(r, &b) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "request 9");
    CHECK_STR_CONTAINS(ff_error_message(), "40");
    b = make_req(0, 10);
    b.n = 5;
    CHECK(ff_rollout_add(r, &b) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "max_slots");
    b = make_req(0, 11);
    b.prompt_len = 0;
    CHECK(ff_rollout_add(r, &b) == -1);
    CHECK_EQ_INT(ff_rollout_pending(r), 0);
    ff_model_destroy(&other);
    ff_rollout_destroy(&r);

    /* a critic without an LM head cannot generate */
    ff_model_config cc = small_config(true, false);
    ff_tensor_set *wt = ff_tensor_set_new();
    DIE_IF(ff_model_init_weights(&cc, 3, 0.1, wt));
    DIE_IF(ff_roles_add_value_head(&cc, wt, 0.1, 3));
    ff_model *critic = ff_model_new(be, &cc, wt);
    DIE_IF(!critic);
    ff_tensor_set_destroy(&wt);
    CHECK(ff_rollout_new(critic, NULL) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "LM head");
    ff_model_destroy(&critic);
}

static void test_seed_mixing(void) {
    /* the documented mixing, splitmix64 over seed + a, then + b, worked out by a Python
     * transcription of Vigna's splitmix64: a change here changes every run's sampling streams */
    CHECK(ff_seed_stream(1, 2, 3) == 0x090de4125b887e16ULL);
    CHECK(ff_seed_stream(0, 0, 1) == 0x2a98f501af37e97fULL);
    CHECK(ff_seed_stream(1, 2, 3) != ff_seed_stream(1, 3, 2));
    CHECK(ff_seed_stream(1, 2, 3) != ff_seed_stream(2, 2, 3));
    CHECK(ff_seed_stream(0, 0, 1) != ff_seed_stream(0, 1, 0));
}

int main(void) {
    ff_backend *be = test_backend();
    ff_model_config c = small_config(false, false);
    ff_model *m = small_model(be, &c, 5);
    test_continuous_batching(m);
    test_shared_prefill(m);
    test_logprobs_match_forward(m);
    test_determinism(m);
    test_abort_sync_errors(be, m);
    test_seed_mixing();
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
