/* Moving a decoding sample between rollout engines (ff_rollout_export / ff_rollout_import):
 * for several seeds and cut points, with its KV rows and with a recompute, a sample moved from
 * engine A to engine B (two models with the same weights, other samples running on both)
 * ends with the tokens and log-probs it gets when it never moves, and the samples that stay
 * are untouched; the state survives bytes and back; a full engine, a corrupt or mismatched
 * state and a budget that does not fit are refused; a moved sample keeps its budget, its
 * slot's length limit and its stop tokens.
 *
 * Why bitwise holds here: the CPU backend rounds a row of every product the same whatever the
 * rows it shares the product with (batch invariance, tests/kernels/test_gemm_invariant.c). A
 * moved sample's rows and RNG state are copied bit for bit, so its steps on B are the steps it
 * would have taken on A; a recompute rebuilds the rows with a prefill, a product of more
 * rows, and gets the same rows. Both must be bitwise (with FF_BATCH_INVARIANT=0 a recompute
 * was not: same tokens, log-probs within 1.4e-6). */
#include "tests/roles/roles_test_util.h"

enum { MAXO = 32, NA = 3, NB = 2 };

typedef struct outs {
    ff_gen_output o[MAXO];
    int32_t n;
} outs;

typedef struct spec {
    int32_t prompt[8];
    int32_t prompt_len, n, max_new;
    float temperature;
} spec;

static const spec A_REQS[NA] = {
    {{2, 5, 7}, 3, 2, 24, 1.0f},
    {{3, 4, 5, 6, 7, 8, 9}, 7, 2, 24, 0.8f},
    {{9, 11}, 2, 2, 24, 1.2f},
};
static const spec B_REQS[NB] = {
    {{20, 21, 22}, 3, 2, 12, 1.0f},
    {{30, 31}, 2, 1, 12, 0.9f},
};

static ff_rollout *engine(ff_model *m, int32_t slots, int32_t max_len, int32_t max_prefill) {
    ff_rollout_config c;
    ff_rollout_config_default(&c);
    c.max_slots = slots;
    c.max_seq_len = max_len;
    c.max_prefill_tokens = max_prefill;
    ff_rollout *r = ff_rollout_new(m, &c);
    DIE_IF(!r);
    return r;
}

static void add_all(ff_rollout *r, const spec *sp, int n, uint64_t id0, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        ff_rollout_request q = {.id = id0 + (uint64_t)i, .prompt = sp[i].prompt, .prompt_len = sp[i].prompt_len,
                                .n = sp[i].n, .seed = seed * 1000 + (uint64_t)i};
        ff_sampling_default(&q.sampling);
        q.sampling.temperature = sp[i].temperature;
        q.sampling.max_new_tokens = sp[i].max_new;
        DIE_IF(ff_rollout_add(r, &q));
    }
}

static void take_all(ff_rollout *r, outs *o) {
    while (o->n < MAXO && ff_rollout_take(r, &o->o[o->n])) o->n++;
}

static void step_take(ff_rollout *r, outs *o) {
    DIE_IF(ff_rollout_step(r) < 0);
    take_all(r, o);
}

static void run_all(ff_rollout *r, outs *o) {
    while (ff_rollout_pending(r) > 0) step_take(r, o);
    take_all(r, o);
}

static void free_outs(outs *o) {
    for (int32_t i = 0; i < o->n; i++) ff_gen_output_free(&o->o[i]);
    o->n = 0;
}

static const ff_gen_output *find(const outs *o, uint64_t id, int32_t sample) {
    for (int32_t i = 0; i < o->n; i++)
        if (o->o[i].id == id && o->o[i].sample == sample) return &o->o[i];
    return NULL;
}

static bool bitwise(const ff_gen_output *a, const ff_gen_output *b) {
    return a && b && a->n_tokens == b->n_tokens && a->finish == b->finish && a->sample == b->sample && a->id == b->id &&
           memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * 4) == 0 &&
           memcmp(a->logprobs, b->logprobs, (size_t)a->n_tokens * 4) == 0;
}

/* Every output of `ref` is in `got` bit for bit, except (skip_id, skip_sample); counts match. */
static void check_untouched(const outs *ref, const outs *got, uint64_t skip_id, int32_t skip_sample) {
    int32_t expected = 0;
    for (int32_t i = 0; i < ref->n; i++) {
        const ff_gen_output *a = &ref->o[i];
        if (a->id == skip_id && a->sample == skip_sample) continue;
        expected++;
        CHECK(bitwise(a, find(got, a->id, a->sample)));
    }
    CHECK_EQ_INT(got->n, expected);
}

/* The state through bytes: write, read back, and the copy replaces it. */
static void through_bytes(ff_rollout_seq_state *s) {
    size_t n = ff_gen_seq_state_size(s);
    unsigned char *buf = malloc(n);
    REQUIRE(buf);
    CHECK(ff_gen_seq_state_write(s, buf, n) == n);
    ff_rollout_seq_state back;
    DIE_IF(ff_gen_seq_state_read(buf, n, &back));
    CHECK(back.id == s->id && back.sample == s->sample && back.n_gen == s->n_gen && back.prompt_len == s->prompt_len);
    CHECK(memcmp(back.rng.s, s->rng.s, sizeof s->rng.s) == 0);
    CHECK((back.kv.data != NULL) == (s->kv.data != NULL));
    if (s->kv.data) {
        size_t floats = (size_t)s->kv.layers * 2 * (size_t)s->kv.positions * (size_t)s->kv.kv_heads * (size_t)s->kv.head_dim;
        CHECK(memcmp(back.kv.data, s->kv.data, floats * 4) == 0);
    }
    free(buf);
    ff_gen_seq_state_free(s);
    *s = back;
}

typedef struct totals {
    int cases_kv, kv_bitwise, cases_re, re_bitwise;
    double re_max_diff;
} totals;

/* One move: A and B step k times with their own requests, the target leaves A (rows or not),
 * crosses as bytes, joins B, and both run to the end. */
static void one_case(ff_model *ma, ff_model *mb, uint64_t seed, const outs *ref_a, const outs *ref_b, uint64_t tid,
                     int32_t tsample, int k, bool with_kv, totals *t) {
    ff_rollout *a = engine(ma, 8, 48, 0), *b = engine(mb, 8, 48, 8); /* B recomputes in prefills of 8 */
    add_all(a, A_REQS, NA, 100, seed);
    add_all(b, B_REQS, NB, 200, seed + 7);
    outs got_a = {0}, got_b = {0};
    for (int s = 0; s < k; s++) {
        step_take(a, &got_a);
        step_take(b, &got_b);
    }
    REQUIRE(!find(&got_a, tid, tsample)); /* still decoding */
    int32_t running_a = ff_rollout_running(a), running_b = ff_rollout_running(b);
    ff_rollout_seq_state st;
    DIE_IF(ff_rollout_export(a, tid, tsample, with_kv, &st));
    CHECK_EQ_INT(st.n_gen, k + 1); /* one token with the prefill, one per step */
    CHECK_EQ_INT(ff_rollout_running(a), running_a - 1);
    through_bytes(&st);
    DIE_IF(ff_rollout_import(b, &st));
    CHECK_EQ_INT(ff_rollout_running(b), running_b + 1);
    ff_gen_seq_state_free(&st);
    while (ff_rollout_pending(a) > 0 || ff_rollout_pending(b) > 0) {
        if (ff_rollout_pending(a) > 0) step_take(a, &got_a);
        if (ff_rollout_pending(b) > 0) step_take(b, &got_b);
    }
    const ff_gen_output *ref = find(ref_a, tid, tsample), *moved = find(&got_b, tid, tsample);
    REQUIRE(ref && moved);
    if (with_kv) {
        CHECK(bitwise(ref, moved));
        t->kv_bitwise += bitwise(ref, moved);
        t->cases_kv++;
    } else {
        CHECK(moved->n_tokens == ref->n_tokens && moved->finish == ref->finish);
        double diff = 0;
        for (int32_t i = 0; i < ref->n_tokens && i < moved->n_tokens; i++) {
            CHECK_EQ_INT(moved->tokens[i], ref->tokens[i]);
            double d = fabs((double)moved->logprobs[i] - ref->logprobs[i]);
            if (d > diff) diff = d;
        }
        CHECK(bitwise(ref, moved));
        if (diff > t->re_max_diff) t->re_max_diff = diff;
        t->re_bitwise += bitwise(ref, moved);
        t->cases_re++;
    }
    /* the samples that stayed, on A and on B, are the ones they are without the move */
    check_untouched(ref_a, &got_a, tid, tsample);
    outs rest_b = got_b;
    for (int32_t i = 0; i < rest_b.n; i++)
        if (rest_b.o[i].id == tid && rest_b.o[i].sample == tsample) rest_b.o[i] = rest_b.o[--rest_b.n];
    check_untouched(ref_b, &rest_b, (uint64_t)-1, -1);
    CHECK_EQ_INT(ff_rollout_stats_of(a)->exported, 1);
    CHECK_EQ_INT(ff_rollout_stats_of(b)->imported, 1);
    CHECK_EQ_INT(ff_rollout_stats_of(b)->recomputed_tokens, with_kv ? 0 : A_REQS[tid - 100].prompt_len + k);
    free_outs(&got_a);
    free_outs(&got_b);
    ff_rollout_destroy(&a);
    ff_rollout_destroy(&b);
}

static void test_exact(ff_model *ma, ff_model *mb) {
    totals t = {0};
    const int cuts[] = {1, 3, 6, 10};
    for (uint64_t seed = 1; seed <= 4; seed++) {
        outs ref_a = {0}, ref_b = {0};
        ff_rollout *ra = engine(ma, 8, 48, 0), *rb = engine(mb, 8, 48, 8);
        add_all(ra, A_REQS, NA, 100, seed);
        add_all(rb, B_REQS, NB, 200, seed + 7);
        run_all(ra, &ref_a);
        run_all(rb, &ref_b);
        ff_rollout_destroy(&ra);
        ff_rollout_destroy(&rb);
        REQUIRE(ref_a.n == 6 && ref_b.n == 3);
        /* the sample that runs longest moves: it has the most cut points */
        const ff_gen_output *tgt = &ref_a.o[0];
        for (int32_t i = 1; i < ref_a.n; i++)
            if (ref_a.o[i].n_tokens > tgt->n_tokens) tgt = &ref_a.o[i];
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            if (cuts[c] + 1 >= tgt->n_tokens) continue; /* finished by then */
            for (int kv = 1; kv >= 0; kv--) one_case(ma, mb, seed, &ref_a, &ref_b, tgt->id, tgt->sample, cuts[c], kv, &t);
        }
        free_outs(&ref_a);
        free_outs(&ref_b);
    }
    printf("moved with KV rows: %d cases, %d bitwise; recomputed: %d cases, %d bitwise, max |log-prob difference| %.3g\n",
           t.cases_kv, t.kv_bitwise, t.cases_re, t.re_bitwise, t.re_max_diff);
    CHECK(t.cases_kv >= 10 && t.cases_re == t.cases_kv);
}

/* Find, over seeds, a sample of request q (on an engine of a_len positions) that finishes
 * `want` (with want_len tokens when >= 0) after more than k + 1 tokens; move it at step k to an
 * engine of b_len positions with company; it must finish the same, bit for bit. */
static void move_finishing(ff_model *ma, ff_model *mb, ff_rollout_request q, int32_t a_len, int32_t b_len, int k,
                           ff_finish_reason want, int32_t want_len) {
    for (uint64_t seed = 1; seed <= 40; seed++) {
        q.seed = seed;
        ff_rollout *ra = engine(ma, 8, a_len, 0);
        DIE_IF(ff_rollout_add(ra, &q));
        outs ref = {0};
        run_all(ra, &ref);
        ff_rollout_destroy(&ra);
        const ff_gen_output *tgt = NULL;
        for (int32_t i = 0; i < ref.n && !tgt; i++)
            if (ref.o[i].finish == want && ref.o[i].n_tokens > k + 1 && (want_len < 0 || ref.o[i].n_tokens == want_len))
                tgt = &ref.o[i];
        if (!tgt) {
            free_outs(&ref);
            continue;
        }
        ff_rollout *a = engine(ma, 8, a_len, 0), *b = engine(mb, 8, b_len, 0);
        DIE_IF(ff_rollout_add(a, &q));
        add_all(b, B_REQS, NB, 200, 3);
        outs got_a = {0}, got_b = {0};
        for (int s = 0; s < k; s++) step_take(a, &got_a), step_take(b, &got_b);
        ff_rollout_seq_state st;
        DIE_IF(ff_rollout_export(a, q.id, tgt->sample, true, &st));
        through_bytes(&st);
        DIE_IF(ff_rollout_import(b, &st));
        ff_gen_seq_state_free(&st);
        run_all(a, &got_a);
        /* ff_rollout_run orders by arrival: B's own samples, then the one that came in */
        ff_gen_output *ran;
        int32_t n_ran;
        DIE_IF(ff_rollout_run(b, &ran, &n_ran));
        REQUIRE(n_ran >= 1 && got_b.n + n_ran <= MAXO);
        CHECK(ran[n_ran - 1].id == q.id && ran[n_ran - 1].sample == tgt->sample);
        for (int32_t i = 0; i < n_ran; i++) got_b.o[got_b.n++] = ran[i];
        free(ran);
        CHECK_EQ_INT(got_b.n, 4); /* B's three and the moved one */
        const ff_gen_output *moved = find(&got_b, q.id, tgt->sample);
        CHECK(bitwise(tgt, moved));
        CHECK(moved && moved->finish == want);
        if (want_len >= 0) CHECK(moved && moved->n_tokens == want_len);
        free_outs(&got_a);
        free_outs(&got_b);
        free_outs(&ref);
        ff_rollout_destroy(&a);
        ff_rollout_destroy(&b);
        return;
    }
    REQUIRE(!"no seed gives a sample that finishes as wanted after the cut");
}

static void test_budget_and_stops(ff_model *ma, ff_model *mb) {
    static const int32_t prompt[3] = {2, 5, 7}, stops[2] = {7, 13};
    ff_rollout_request q = {.id = 300, .prompt = prompt, .prompt_len = 3, .n = 4};
    ff_sampling_default(&q.sampling);
    /* max_new_tokens: 9 tokens on A, the same 9 after the move */
    q.sampling.max_new_tokens = 9;
    move_finishing(ma, mb, q, 48, 48, 2, FF_FINISH_LENGTH, 9);
    /* A's slots end at 14 positions (11 new tokens after the prompt of 3): the moved sample
     * stops there on B, whose slots are longer */
    q.sampling.max_new_tokens = 24;
    move_finishing(ma, mb, q, 14, 48, 3, FF_FINISH_LENGTH, 11);
    /* its own stop tokens, not the model's eos */
    q.sampling.stop_tokens = stops;
    q.sampling.n_stop = 2;
    move_finishing(ma, mb, q, 48, 48, 2, FF_FINISH_STOP, -1);
}

/* A running sample of A_REQS on r, moved out. */
static void export_any(ff_rollout *r, bool with_kv, ff_rollout_seq_state *st) {
    for (uint64_t id = 100; id < 100 + NA; id++)
        for (int32_t j = 0; j < 2; j++)
            if (ff_rollout_export(r, id, j, with_kv, st) == 0) return;
    REQUIRE(!"no sample running");
}

static void refused(ff_rollout *r, const ff_rollout_seq_state *st, const char *why) {
    int32_t running = ff_rollout_running(r);
    CHECK(ff_rollout_import(r, st) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), why);
    CHECK_EQ_INT(ff_rollout_running(r), running);
}

static void test_refusals(ff_model *ma, ff_model *mb) {
    ff_rollout *a = engine(ma, 8, 48, 0);
    add_all(a, A_REQS, NA, 100, 1);
    outs got = {0};
    step_take(a, &got);
    step_take(a, &got);
    /* exporting what does not decode here */
    ff_rollout_seq_state st;
    CHECK(ff_rollout_export(a, 999, 0, true, &st) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no sample 0");
    CHECK(ff_rollout_export(a, 100, 2, true, &st) == -1);
    export_any(a, true, &st);

    /* a full engine: two slots, both decoding */
    ff_rollout *full = engine(mb, 2, 48, 0);
    static const int32_t p[2] = {30, 31}, never[1] = {39};
    ff_rollout_request q = {.id = 7, .prompt = p, .prompt_len = 2, .n = 2, .seed = 5};
    ff_sampling_default(&q.sampling);
    q.sampling.max_new_tokens = 30;
    q.sampling.temperature = 0; /* greedy: no 39 in its first tokens (checked) */
    q.sampling.stop_tokens = never;
    q.sampling.n_stop = 1;
    DIE_IF(ff_rollout_add(full, &q));
    DIE_IF(ff_rollout_step(full) < 0);
    REQUIRE(ff_rollout_running(full) == 2);
    refused(full, &st, "no free slot");
    /* slots too short for the budget */
    ff_rollout *shortb = engine(mb, 8, 16, 0);
    refused(shortb, &st, "the slots hold 16");
    /* rows of another shape, shard or length; log-probs of another mode */
    ff_rollout *b = engine(mb, 8, 48, 0);
    ff_rollout_seq_state bad = st;
    bad.kv.kv_heads = 1;
    refused(b, &bad, "kv heads");
    bad = st;
    bad.kv.tp_rank = 1, bad.kv.tp_size = 2;
    refused(b, &bad, "TP rank 1 of 2");
    bad = st;
    bad.kv.positions--;
    refused(b, &bad, "KV positions");
    bad = st;
    bad.n_gen = bad.sampling.max_new_tokens;
    refused(b, &bad, "budget");
    ff_rollout_config mc;
    ff_rollout_config_default(&mc);
    mc.max_seq_len = 48;
    mc.logprob_mode = FF_LOGPROB_MODEL;
    ff_rollout *other_mode = ff_rollout_new(mb, &mc);
    DIE_IF(!other_mode);
    refused(other_mode, &st, "logprob_mode");

    /* bytes: short, truncated, trailing, foreign, corrupt in the header and in the rows */
    size_t n = ff_gen_seq_state_size(&st);
    unsigned char *buf = malloc(n + 8);
    REQUIRE(buf);
    CHECK(ff_gen_seq_state_write(&st, buf, n - 1) == 0);
    CHECK_STR_CONTAINS(ff_error_message(), "bytes of buffer");
    REQUIRE(ff_gen_seq_state_write(&st, buf, n + 8) == n);
    memset(buf + n, 0, 8);
    ff_rollout_seq_state back;
    CHECK(ff_gen_seq_state_read(buf, 100, &back) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "truncated");
    CHECK(ff_gen_seq_state_read(buf, n - 1, &back) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "truncated");
    CHECK(ff_gen_seq_state_read(buf, n + 8, &back) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "trailing bytes");
    const size_t at[3] = {0, 40, n - 5}; /* the magic, the sample index, a KV float */
    const char *msg[3] = {"not a sequence state", "checksum mismatch", "checksum mismatch"};
    for (int i = 0; i < 3; i++) {
        buf[at[i]] ^= 0x10;
        CHECK(ff_gen_seq_state_read(buf, n, &back) == -1);
        CHECK_STR_CONTAINS(ff_error_message(), msg[i]);
        CHECK(back.tokens == NULL && back.kv.data == NULL);
        buf[at[i]] ^= 0x10;
    }
    DIE_IF(ff_gen_seq_state_read(buf, n, &back)); /* restored: accepted */
    DIE_IF(ff_rollout_import(b, &back));           /* and the engines that refused are still fine */
    CHECK_EQ_INT(ff_rollout_running(b), 1);
    free(buf);
    ff_gen_seq_state_free(&back);
    ff_gen_seq_state_free(&st);
    free_outs(&got);
    ff_rollout_destroy(&a);
    ff_rollout_destroy(&full);
    ff_rollout_destroy(&shortb);
    ff_rollout_destroy(&b);
    ff_rollout_destroy(&other_mode);
}

int main(void) {
    ff_backend *be = test_backend();
    ff_model_config c = small_config(false, false);
    ff_model *ma = small_model(be, &c, 5), *mb = small_model(be, &c, 5); /* two instances, the same weights */
    test_exact(ma, mb);
    test_budget_and_stops(ma, mb);
    test_refusals(ma, mb);
    ff_model_destroy(&ma);
    ff_model_destroy(&mb);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
