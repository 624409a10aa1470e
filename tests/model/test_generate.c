/* Generation: KV-cache decoding gives the log-probs of a full forward over prompt +
 * response (continuous batching with fewer slots than sequences, prompts of different
 * lengths, n samples sharing a prefill), same seed => same output, batch composition does
 * not change a sequence, greedy follows the argmax, top-k 1 is greedy, stop tokens, length
 * limits, abort, a floor under the stop tokens and drawn (log-normal) response lengths, also
 * across a move, and clear errors for bad requests. Over a pipeline (two stage models as
 * threads, ff_generator_config.pipe): every stage returns the whole model's tokens and
 * log-probs bit for bit (the stages run the same kernels on the same activations). */
#include <pthread.h>

#include "tests/model/model_test_util.h"
#include "tests/model/two_stages.h"

static ff_backend *be;

/* Full-forward log-probs of a response after its prompt (temperature temp). */
static void full_logprobs(ff_model *m, const int32_t *prompt, int32_t np, const int32_t *resp, int32_t nr, float temp,
                          float *out, float *logits_last_rows) {
    int32_t T = np + nr, ss[2] = {0, T};
    int32_t *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
    memcpy(tok, prompt, (size_t)np * 4);
    memcpy(tok + np, resp, (size_t)nr * 4);
    ff_batch_shift_targets(tok, ss, 1, tg);
    float *lp = malloc((size_t)T * 4);
    int V = ff_model_config_of(m)->vocab_size;
    float *lg = logits_last_rows ? malloc((size_t)T * V * 4) : NULL;
    ff_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_forward_opts o = {.temperature = temp};
    ff_forward_out fo = {.logprobs = lp, .logits = lg};
    REQUIRE(ff_model_forward(m, &b, &o, &fo) == 0);
    for (int32_t i = 0; i < nr; i++) out[i] = lp[np - 1 + i]; /* position np-1+i predicts resp[i] */
    if (lg) memcpy(logits_last_rows, lg + (size_t)(np - 1) * V, (size_t)nr * V * 4);
    free(tok), free(tg), free(lp), free(lg);
}

static int argmax(const float *z, int V) {
    int a = 0;
    for (int v = 1; v < V; v++)
        if (z[v] > z[a]) a = v;
    return a;
}

static void test_kv_matches_full(ff_model *m) {
    int32_t p0[] = {1, 2, 3}, p1[] = {5}, p2[] = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};
    ff_gen_request r[3] = {gen_request(10, p0, 3, 2, 1.0f, 20, 1), gen_request(11, p1, 1, 3, 1.0f, 15, 2), gen_request(12, p2, 17, 1, 0.8f, 25, 3)};
    r[2].sampling.logprob_mode = FF_LOGPROB_TEMPERATURE;
    r[1].sampling.top_p = 0.9f;
    r[1].sampling.top_k = 20;
    ff_generator_config gc = {.max_slots = 3, .max_seq_len = 64, .max_prefill_tokens = 20};
    ff_gen_output *o;
    int32_t n;
    REQUIRE(ff_model_generate(m, &gc, r, 3, &o, &n) == 0);
    CHECK_EQ_INT(n, 6);
    int idx = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < r[i].n_samples; j++, idx++) {
            ff_gen_output *g = &o[idx];
            CHECK(g->id == r[i].id);
            CHECK_EQ_INT(g->sample, j);
            CHECK_EQ_INT(g->n_tokens, r[i].sampling.max_new_tokens); /* no eos in this config */
            CHECK(g->finish == FF_FINISH_LENGTH);
            float *want = malloc((size_t)g->n_tokens * 4);
            float temp = r[i].sampling.logprob_mode == FF_LOGPROB_TEMPERATURE ? r[i].sampling.temperature : 1.0f;
            full_logprobs(m, r[i].prompt, r[i].prompt_len, g->tokens, g->n_tokens, temp, want, NULL);
            char what[64];
            snprintf(what, sizeof what, "request %d sample %d: cached vs full log-probs", i, j);
            check_tensor_close(what, g->logprobs, want, g->n_tokens, 1e-4, 0);
            free(want);
        }
    /* the samples of one prompt differ (own RNG streams) */
    CHECK(memcmp(o[0].tokens, o[1].tokens, 20 * 4) != 0);
    gen_outputs_free(o, n);
}

static void test_reproducible_and_independent(ff_model *m) {
    int32_t p0[] = {4, 4, 2, 9}, p1[] = {3, 1};
    ff_gen_request r[2] = {gen_request(1, p0, 4, 2, 1.0f, 30, 77), gen_request(2, p1, 2, 1, 1.2f, 30, 78)};
    ff_gen_output *a, *b, *c;
    int32_t na, nb, nc;
    REQUIRE(ff_model_generate(m, NULL, r, 2, &a, &na) == 0);
    REQUIRE(ff_model_generate(m, NULL, r, 2, &b, &nb) == 0);
    REQUIRE(na == 3 && nb == 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(a[i].n_tokens, b[i].n_tokens);
        CHECK(memcmp(a[i].tokens, b[i].tokens, (size_t)a[i].n_tokens * 4) == 0);
        CHECK(memcmp(a[i].logprobs, b[i].logprobs, (size_t)a[i].n_tokens * 4) == 0);
    }
    /* the second request alone, one slot, still produces the same sequence */
    ff_generator_config one = {.max_slots = 1, .max_seq_len = 40};
    REQUIRE(ff_model_generate(m, &one, &r[1], 1, &c, &nc) == 0);
    CHECK_EQ_INT(c[0].n_tokens, a[2].n_tokens);
    CHECK(memcmp(c[0].tokens, a[2].tokens, (size_t)c[0].n_tokens * 4) == 0);
    gen_outputs_free(c, nc);
    /* sample 0 of an n-sample request equals the same request with one sample */
    ff_gen_request single = r[0];
    single.n_samples = 1;
    REQUIRE(ff_model_generate(m, NULL, &single, 1, &c, &nc) == 0);
    CHECK(memcmp(c[0].tokens, a[0].tokens, (size_t)c[0].n_tokens * 4) == 0);
    gen_outputs_free(c, nc);
    /* another seed, another sequence */
    r[0].seed = 99;
    REQUIRE(ff_model_generate(m, NULL, r, 1, &c, &nc) == 0);
    CHECK(memcmp(c[0].tokens, a[0].tokens, (size_t)c[0].n_tokens * 4) != 0);
    gen_outputs_free(c, nc);
    gen_outputs_free(a, na);
    gen_outputs_free(b, nb);
}

static void test_greedy_stop_length(ff_model *m) {
    int V = ff_model_config_of(m)->vocab_size;
    int32_t p[] = {2, 7, 1};
    ff_gen_request r = gen_request(5, p, 3, 1, 0.0f, 12, 0);
    ff_gen_output *o, *k1;
    int32_t n, nk;
    REQUIRE(ff_model_generate(m, NULL, &r, 1, &o, &n) == 0);
    REQUIRE(o[0].n_tokens == 12);
    float *lg = malloc((size_t)12 * V * 4), *lp = malloc(12 * 4);
    full_logprobs(m, p, 3, o[0].tokens, 12, 1.0f, lp, lg);
    for (int i = 0; i < 12; i++) CHECK_EQ_INT(o[0].tokens[i], argmax(lg + (size_t)i * V, V));
    check_tensor_close("greedy log-probs", o[0].logprobs, lp, 12, 1e-4, 0);
    /* top-k 1 at any temperature is greedy */
    ff_gen_request rk = gen_request(6, p, 3, 1, 1.5f, 12, 1234);
    rk.sampling.top_k = 1;
    REQUIRE(ff_model_generate(m, NULL, &rk, 1, &k1, &nk) == 0);
    CHECK(memcmp(k1[0].tokens, o[0].tokens, 12 * 4) == 0);
    gen_outputs_free(k1, nk);
    /* a stop token ends the sequence where it first appears, and is included */
    int32_t stop = o[0].tokens[4];
    int first = 0;
    while (o[0].tokens[first] != stop) first++;
    ff_gen_request rs = r;
    rs.sampling.stop_tokens = &stop;
    rs.sampling.n_stop = 1;
    REQUIRE(ff_model_generate(m, NULL, &rs, 1, &k1, &nk) == 0);
    CHECK(k1[0].finish == FF_FINISH_STOP);
    CHECK_EQ_INT(k1[0].n_tokens, first + 1);
    CHECK_EQ_INT(k1[0].tokens[first], stop);
    gen_outputs_free(k1, nk);
    /* the slot capacity ends a sequence at max_seq_len tokens in all */
    ff_generator_config gc = {.max_slots = 2, .max_seq_len = 8};
    REQUIRE(ff_model_generate(m, &gc, &r, 1, &k1, &nk) == 0);
    CHECK(k1[0].finish == FF_FINISH_LENGTH);
    CHECK_EQ_INT(k1[0].n_tokens, 8 - 3);
    CHECK(memcmp(k1[0].tokens, o[0].tokens, 5 * 4) == 0);
    gen_outputs_free(k1, nk);
    gen_outputs_free(o, n);
    free(lg), free(lp);
}

static int cmp_i32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

/* A floor (min_new_tokens): no stop token before it, and the log-probs stay the unmasked
 * softmax's (MODEL, TEMPERATURE) or are the masked one's (SAMPLER). Drawn lengths
 * (len_median): log-normal with the set median and p99, the same whatever the batch, and
 * carried exactly by a moved sequence (ff_generator_export, bytes, ff_generator_import). */
static void test_floor_and_lengths(ff_model *m) {
    const int V = ff_model_config_of(m)->vocab_size;
    int32_t p[] = {2, 7, 1};
    /* the stop tokens: what an unfloored sample draws early, so that without a floor it stops */
    ff_gen_request r0 = gen_request(20, p, 3, 1, 1.0f, 12, 5);
    ff_gen_output *o, *f;
    int32_t n, nf;
    REQUIRE(ff_model_generate(m, NULL, &r0, 1, &o, &n) == 0);
    int32_t stop[4] = {o[0].tokens[0], o[0].tokens[1], o[0].tokens[2], o[0].tokens[0]}; /* one listed twice */
    gen_outputs_free(o, n);
    for (int mode = 0; mode < 3; mode++) {
        ff_gen_request r = gen_request(21, p, 3, 4, 1.3f, 12, 5);
        r.sampling.stop_tokens = stop;
        r.sampling.n_stop = 4;
        r.sampling.min_new_tokens = 10;
        r.sampling.logprob_mode = (ff_logprob_mode)mode;
        REQUIRE(ff_model_generate(m, NULL, &r, 1, &f, &nf) == 0);
        for (int32_t s = 0; s < nf; s++) {
            REQUIRE(f[s].n_tokens >= 10);
            for (int i = 0; i < 9; i++)
                for (int k = 0; k < 3; k++) CHECK(f[s].tokens[i] != stop[k]);
            float *lp = malloc((size_t)f[s].n_tokens * 4), *lg = malloc((size_t)f[s].n_tokens * V * 4);
            full_logprobs(m, p, 3, f[s].tokens, f[s].n_tokens, mode == FF_LOGPROB_TEMPERATURE ? 1.3f : 1.0f, lp, lg);
            if (mode == FF_LOGPROB_SAMPLER) /* at temperature t, no top-k/p: the masked softmax of logits / t */
                for (int i = 0; i < f[s].n_tokens; i++) {
                    const float *z = lg + (size_t)i * V;
                    double mx = -1e30, sum = 0;
                    for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
                    for (int v = 0; v < V; v++) {
                        bool masked = i < 9 && (v == stop[0] || v == stop[1] || v == stop[2]);
                        if (!masked) sum += exp((z[v] - mx) / 1.3);
                    }
                    lp[i] = (float)((z[f[s].tokens[i]] - mx) / 1.3 - log(sum));
                }
            char what[64];
            snprintf(what, sizeof what, "floor, logprob mode %d, sample %d", mode, s);
            check_tensor_close(what, f[s].logprobs, lp, f[s].n_tokens, 1e-4, 0);
            free(lp), free(lg);
        }
        gen_outputs_free(f, nf);
    }

    /* drawn lengths: 8 requests x 40 samples, median 6, p99 8x the median, capped at 64 */
    enum { NR = 8, NS = 40 };
    ff_gen_request rs[NR];
    for (int i = 0; i < NR; i++) {
        rs[i] = gen_request(100 + (uint64_t)i, p, 3, NS, 1.0f, 64, 1000 + (uint64_t)i);
        rs[i].sampling.len_median = 6;
        rs[i].sampling.len_p99_ratio = 8;
    }
    ff_generator_config gc = {.max_slots = NS, .max_seq_len = 80};
    REQUIRE(ff_model_generate(m, &gc, rs, NR, &o, &n) == 0);
    REQUIRE(n == NR * NS);
    int32_t len[NR * NS];
    for (int32_t i = 0; i < n; i++) {
        len[i] = o[i].n_tokens; /* this config has no eos: each ends at its drawn length */
        CHECK(len[i] >= 1 && len[i] <= 64);
    }
    qsort(len, (size_t)n, sizeof *len, cmp_i32);
    const int32_t med = len[n / 2], p99 = len[(int)(0.99 * n)];
    if (!(med >= 5 && med <= 7 && p99 >= 30 && p99 <= 64)) {
        fprintf(stderr, "drawn lengths: median %d (want 6 +- 1), p99 %d (want about 48)\n", med, p99);
        CHECK(false);
    }
    CHECK(len[n - 1] > 2 * med); /* a tail */
    /* the same lengths with fewer slots (other batches), request 3 alone */
    ff_generator_config few = {.max_slots = NS, .max_seq_len = 80};
    REQUIRE(ff_model_generate(m, &few, &rs[3], 1, &f, &nf) == 0);
    for (int32_t s = 0; s < NS; s++) CHECK_EQ_INT(f[s].n_tokens, o[3 * NS + s].n_tokens);
    gen_outputs_free(f, nf);

    /* moved halfway: request 5's longest sample leaves after 4 steps through bytes, and ends
     * where it would have, with the same tokens and log-probs */
    int32_t longest = 0;
    for (int32_t s = 1; s < NS; s++)
        if (o[5 * NS + s].n_tokens > o[5 * NS + longest].n_tokens) longest = s;
    REQUIRE(o[5 * NS + longest].n_tokens > 6);
    ff_generator *a = ff_generator_new(m, &gc), *b = ff_generator_new(m, &gc);
    REQUIRE(a && b);
    REQUIRE(ff_generator_submit(a, &rs[5]) == 0);
    for (int i = 0; i < 4; i++) REQUIRE(ff_generator_step(a) == 0);
    ff_gen_seq_state st, back;
    REQUIRE(ff_generator_export(a, rs[5].id, longest, false, &st) == 0);
    CHECK_EQ_INT(st.sampling.max_new_tokens, o[5 * NS + longest].n_tokens);
    CHECK(st.sampling.len_median == 0); /* drawn once, not again where it lands */
    size_t nb = ff_gen_seq_state_size(&st);
    void *buf = malloc(nb);
    REQUIRE(ff_gen_seq_state_write(&st, buf, nb) == nb);
    REQUIRE(ff_gen_seq_state_read(buf, nb, &back) == 0);
    CHECK_EQ_INT(back.sampling.min_new_tokens, st.sampling.min_new_tokens);
    REQUIRE(ff_generator_import(b, &back) == 0);
    while (ff_generator_pending(b)) REQUIRE(ff_generator_step(b) == 0);
    ff_gen_output moved;
    REQUIRE(ff_generator_pop(b, &moved) == 1);
    const ff_gen_output *want = &o[5 * NS + longest];
    CHECK_EQ_INT(moved.n_tokens, want->n_tokens);
    CHECK(moved.finish == want->finish);
    CHECK(!memcmp(moved.tokens, want->tokens, (size_t)want->n_tokens * 4));
    check_tensor_close("moved sequence's log-probs", moved.logprobs, want->logprobs, want->n_tokens, 1e-5, 0);
    ff_gen_output_free(&moved);
    free(buf);
    ff_gen_seq_state_free(&st);
    ff_gen_seq_state_free(&back);
    ff_generator_destroy(&a);
    ff_generator_destroy(&b);
    gen_outputs_free(o, n);

    /* bad settings, named */
    ff_gen_request bad = gen_request(30, p, 3, 1, 1.0f, 12, 1);
    ff_generator *g = ff_generator_new(m, &gc);
    REQUIRE(g);
    bad.sampling.min_new_tokens = 13;
    CHECK(ff_generator_submit(g, &bad) == -1 && strstr(ff_error_message(), "min_new_tokens 13"));
    bad.sampling.min_new_tokens = 0;
    bad.sampling.len_median = 0.5f;
    CHECK(ff_generator_submit(g, &bad) == -1 && strstr(ff_error_message(), "len_median"));
    bad.sampling.len_median = 4;
    bad.sampling.len_p99_ratio = 0.5f;
    CHECK(ff_generator_submit(g, &bad) == -1 && strstr(ff_error_message(), "len_p99_ratio"));
    ff_generator_destroy(&g);
}

static void test_step_api_abort_errors(ff_model *m) {
    ff_generator_config gc = {.max_slots = 2, .max_seq_len = 32, .max_prefill_tokens = 8};
    ff_generator *g = ff_generator_new(m, &gc);
    REQUIRE(g);
    int32_t p[] = {1, 2, 3, 4}, big[9] = {0}, bad[] = {1, 999};
    ff_gen_request a = gen_request(1, p, 4, 1, 1.0f, 20, 1), b = gen_request(2, p, 2, 2, 1.0f, 20, 2), c = gen_request(3, p, 1, 1, 1.0f, 3, 3);
    REQUIRE(ff_generator_submit(g, &a) == 0);
    REQUIRE(ff_generator_submit(g, &b) == 0); /* needs 2 slots: waits behind a */
    REQUIRE(ff_generator_submit(g, &c) == 0);
    CHECK_EQ_INT(ff_generator_pending(g), 4);
    REQUIRE(ff_generator_step(g) == 0);
    CHECK_EQ_INT(ff_generator_running(g), 1); /* a runs; b (2 samples) waits for 2 free slots */
    CHECK_EQ_INT(ff_generator_abort(g, 1), 1);
    CHECK_EQ_INT(ff_generator_running(g), 0);
    ff_gen_output o;
    REQUIRE(ff_generator_pop(g, &o) == 1);
    CHECK(o.id == 1 && o.finish == FF_FINISH_ABORTED && o.n_tokens == 2);
    ff_gen_output_free(&o);
    CHECK_EQ_INT(ff_generator_abort(g, 2), 2); /* waiting ones just vanish */
    CHECK(ff_generator_pop(g, &o) == 0);
    while (ff_generator_pending(g) > 0) REQUIRE(ff_generator_step(g) == 0);
    REQUIRE(ff_generator_pop(g, &o) == 1);
    CHECK(o.id == 3 && o.n_tokens == 3 && o.finish == FF_FINISH_LENGTH);
    ff_gen_output_free(&o);

    /* bad requests */
    ff_gen_request e = gen_request(9, p, 0, 1, 1.0f, 5, 0);
    CHECK(ff_generator_submit(g, &e) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "empty prompt");
    e = gen_request(9, big, 9, 1, 1.0f, 5, 0); /* longer than max_prefill_tokens: prefilled in chunks (test_generate_paged.c) */
    CHECK(ff_generator_submit(g, &e) == 0);
    CHECK_EQ_INT(ff_generator_abort(g, 9), 1);
    e = gen_request(9, bad, 2, 1, 1.0f, 5, 0);
    CHECK(ff_generator_submit(g, &e) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "out of range");
    e = gen_request(9, p, 2, 3, 1.0f, 5, 0);
    CHECK(ff_generator_submit(g, &e) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "n_samples");
    e = gen_request(9, p, 2, 1, -1.0f, 5, 0);
    CHECK(ff_generator_submit(g, &e) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "temperature");
    e = gen_request(9, p, 2, 1, 1.0f, 5, 0);
    e.sampling.top_p = 0;
    CHECK(ff_generator_submit(g, &e) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "top_p");
    e.sampling.top_p = 1;
    e.sampling.max_new_tokens = 0;
    CHECK(ff_generator_submit(g, &e) == -1);
    CHECK_EQ_INT(ff_generator_pending(g), 0);
    ff_generator_destroy(&g);
    CHECK(g == NULL);
    ff_generator_config badc = {.max_slots = 0, .max_seq_len = 8};
    CHECK(ff_generator_new(m, &badc) == NULL);
    badc.max_slots = 1;
    badc.max_seq_len = 100000;
    CHECK(ff_generator_new(m, &badc) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "max_position_embeddings");

    /* destroying a generator with work in flight frees everything (ASan checks) */
    g = ff_generator_new(m, &gc);
    REQUIRE(g);
    REQUIRE(ff_generator_submit(g, &a) == 0 && ff_generator_submit(g, &b) == 0 && ff_generator_submit(g, &c) == 0);
    REQUIRE(ff_generator_step(g) == 0 && ff_generator_step(g) == 0);
    ff_generator_destroy(&g);
}

typedef struct stage_gen {
    ff_model *m;
    ff_gen_pipe pipe;
    const ff_gen_request *r;
    int32_t nr;
    ff_gen_output *outs;
    int32_t n_outs;
    int rc;
} stage_gen;

static void *stage_main(void *arg) {
    stage_gen *s = arg;
    ff_generator_config c = {.max_slots = 3, .max_seq_len = 48, .max_prefill_tokens = 24, .pipe = &s->pipe};
    s->rc = ff_model_generate(s->m, &c, s->r, s->nr, &s->outs, &s->n_outs);
    if (s->rc) fprintf(stderr, "stage %d: %s\n", s->pipe.rank, ff_error_message());
    return NULL;
}

static void test_pipeline(const ff_model_config *c, ff_model *whole) {
    const int32_t L = c->num_hidden_layers, half = L / 2;
    REQUIRE(L >= 2);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_export_weights(whole, w) == 0);
    int32_t first[2] = {0, half}, count[2] = {half, L - half};
    ff_model *st[2];
    for (int s = 0; s < 2; s++) {
        const ff_model_stage stage = {.n_chunks = 1, .first_layer = &first[s], .n_layers = &count[s]};
        st[s] = ff_model_new_opts(be, c, w, &(ff_model_opts){.inference = true, .stage = &stage});
        REQUIRE(st[s]);
    }
    int32_t p0[] = {1, 2, 3}, p1[] = {5}, p2[] = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};
    ff_gen_request r[3] = {gen_request(10, p0, 3, 2, 1.0f, 20, 1), gen_request(11, p1, 1, 3, 1.0f, 15, 2), gen_request(12, p2, 17, 1, 0.8f, 25, 3)};
    r[1].sampling.top_k = 5;
    ff_gen_output *ref = NULL;
    int32_t n_ref = 0;
    ff_generator_config c1 = {.max_slots = 3, .max_seq_len = 48, .max_prefill_tokens = 24};
    REQUIRE(ff_model_generate(whole, &c1, r, 3, &ref, &n_ref) == 0);
    two_stages t;
    ts_init(&t);
    /* through host memory, then with the pipe's device calls (the hidden states and logits
     * moved in the generators' buffers): the whole model's tokens and log-probs both times */
    for (int dev = 0; dev < 2; dev++) {
    stage_gen sg[2];
    pthread_t th[2];
    for (int s = 0; s < 2; s++) {
        sg[s] = (stage_gen){.m = st[s], .r = r, .nr = 3};
        sg[s].pipe = dev ? ts_pipe_dev(&t, s) : ts_pipe(&t, s);
        REQUIRE(pthread_create(&th[s], NULL, stage_main, &sg[s]) == 0);
    }
    for (int s = 0; s < 2; s++) pthread_join(th[s], NULL);
    int64_t tokens = 0;
    for (int s = 0; s < 2; s++) {
        CHECK_EQ_INT(sg[s].rc, 0);
        CHECK_EQ_INT(sg[s].n_outs, n_ref);
        for (int32_t i = 0; i < n_ref && i < sg[s].n_outs; i++) {
            const ff_gen_output *a = &sg[s].outs[i], *b = &ref[i];
            CHECK_EQ_INT(a->n_tokens, b->n_tokens);
            CHECK_EQ_INT(a->finish, b->finish);
            if (a->n_tokens == b->n_tokens) {
                CHECK(memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * 4) == 0);
                CHECK(memcmp(a->logprobs, b->logprobs, (size_t)a->n_tokens * 4) == 0);
            }
            tokens += a->n_tokens;
        }
        gen_outputs_free(sg[s].outs, sg[s].n_outs);
    }
    CHECK(tokens > 2 * 20); /* something was generated */
    }
    gen_outputs_free(ref, n_ref);
    /* a stage without its pipeline, or in the wrong place, is refused */
    ff_generator_config bad = {.max_slots = 2, .max_seq_len = 16};
    CHECK(ff_generator_new(st[1], &bad) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "pipeline stage");
    ff_gen_pipe wrong = {.rank = 0, .size = 2, .ctx = &t, .send = ts_send, .recv = ts_recv, .broadcast = ts_bcast0};
    bad.pipe = &wrong;
    CHECK(ff_generator_new(st[1], &bad) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "stage rank 0 of 2 lacks the embedding");
    ts_destroy(&t);
    for (int s = 0; s < 2; s++) ff_model_destroy(&st[s]);
    ff_tensor_set_destroy(&w);
}

int main(void) {
    be = ff_backend_cpu_new(2);
    REQUIRE(be);
    ff_model_config c = tiny_config(40, 32, 64, 2, 4, 2, false, true, false);
    ff_model *m = tiny_model(be, &c, 7, 0.3);
    test_kv_matches_full(m);
    test_reproducible_and_independent(m);
    test_greedy_stop_length(m);
    test_step_api_abort_errors(m);
    test_floor_and_lengths(m);
    test_pipeline(&c, m);
    ff_model_destroy(&m);
    /* tied embeddings, no biases, MHA */
    c = tiny_config(30, 24, 40, 1, 3, 3, true, false, false);
    m = tiny_model(be, &c, 8, 0.3);
    test_kv_matches_full(m);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
