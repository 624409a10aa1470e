/* The generator's paged KV cache: the same requests give bit-identical tokens and log-probs
 * whatever the block size (1 position to a whole sequence) and pool size; the samples of a
 * request share the prompt's full blocks (counted exactly); a pool smaller than the demand
 * makes requests wait, never fail or change; clear errors for a request or a moved sequence
 * that cannot fit, and for bad block settings; a prompt longer than max_prefill_tokens
 * prefilled in chunks gives what one prefill gives; a cache held in bf16 (kv_bf16). */
#include <math.h>

#include "tests/model/model_test_util.h"

/* Every request to the end on a generator of this config; the outputs by request then
 * sample, and the generator's peak of blocks held. */
static ff_gen_output *run_all(ff_model *m, const ff_generator_config *gc, const ff_gen_request *r, int32_t nr,
                              int32_t *n_out, int32_t *peak) {
    ff_generator *g = ff_generator_new(m, gc);
    REQUIRE(g);
    int32_t total = 0, first[8];
    for (int32_t i = 0; i < nr; i++) {
        REQUIRE(ff_generator_submit(g, &r[i]) == 0);
        first[i] = total;
        total += r[i].n_samples;
    }
    ff_gen_output *o = calloc((size_t)total, sizeof *o), x;
    while (ff_generator_pending(g) > 0) REQUIRE(ff_generator_step(g) == 0);
    while (ff_generator_pop(g, &x)) o[first[x.id] + x.sample] = x;
    int32_t used, total_blocks;
    ff_generator_kv_blocks(g, &used, peak, &total_blocks);
    CHECK_EQ_INT(used, 0); /* every block back in the pool */
    CHECK(*peak <= total_blocks);
    ff_generator_destroy(&g);
    *n_out = total;
    return o;
}

/* An upper bound of the blocks the largest request may fill (budgets at max_new_tokens). */
static int32_t largest_need(const ff_gen_request *r, int nr, int32_t bs, int32_t max_seq) {
    int32_t most = 0;
    for (int i = 0; i < nr; i++) {
        int32_t len = r[i].prompt_len + r[i].sampling.max_new_tokens, shared = r[i].prompt_len / bs;
        if (len > max_seq) len = max_seq;
        int32_t need = shared + r[i].n_samples * ((len + bs - 1) / bs - shared);
        if (need > most) most = need;
    }
    return most;
}

static void test_any_layout_same_outputs(ff_model *m) {
    int32_t p0[21], p1[16], p2[] = {3, 9, 4, 1, 5}, p3[] = {2};
    for (int i = 0; i < 21; i++) p0[i] = (i * 7 + 3) % 40;
    for (int i = 0; i < 16; i++) p1[i] = (i * 5 + 1) % 40;
    ff_gen_request r[4] = {gen_request(0, p0, 21, 4, 1.0f, 30, 11), gen_request(1, p1, 16, 3, 1.0f, 20, 12), gen_request(2, p2, 5, 2, 1.0f, 25, 13),
                           gen_request(3, p3, 1, 1, 1.0f, 40, 14)};
    r[0].sampling.top_p = 0.9f;
    r[2].sampling.len_median = 9; /* drawn lengths: each sample's own budget and promise */
    r[2].sampling.len_p99_ratio = 2;
    /* the reference: one block of max_seq_len per sequence, the prompt copied to every sample */
    ff_generator_config ref = {.max_slots = 6, .max_seq_len = 64, .max_prefill_tokens = 32, .kv_block_rows = 64};
    int32_t nref, peak_ref;
    ff_gen_output *want = run_all(m, &ref, r, 4, &nref, &peak_ref);
    CHECK_EQ_INT(nref, 10);
    const int32_t rows[] = {0, 1, 3, 8, 16, 63};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        for (int small = 0; small < 2; small++) {
            ff_generator_config gc = ref;
            gc.kv_block_rows = rows[k];
            /* a small pool: what the largest request may fill, so the others wait for it */
            if (small) gc.kv_blocks = largest_need(r, 4, rows[k] ? rows[k] : 16, 64);
            int32_t n, peak;
            ff_gen_output *got = run_all(m, &gc, r, 4, &n, &peak);
            REQUIRE(n == nref);
            int same = 1;
            for (int32_t i = 0; i < n; i++)
                same &= got[i].n_tokens == want[i].n_tokens && got[i].finish == want[i].finish &&
                        !memcmp(got[i].tokens, want[i].tokens, (size_t)want[i].n_tokens * 4) &&
                        !memcmp(got[i].logprobs, want[i].logprobs, (size_t)want[i].n_tokens * 4);
            if (!same) {
                fprintf(stderr, "blocks of %d (%s pool): outputs differ from one block per sequence\n", rows[k],
                        small ? "a small" : "the default");
                ff_test_failures++;
            }
            if (small) CHECK(peak <= gc.kv_blocks);
            gen_outputs_free(got, n);
        }
    gen_outputs_free(want, nref);
}

/* One request of 4 samples, a prompt of 40 positions, 8 new tokens each, blocks of 8: the
 * prompt fills 5 blocks once; each sample then writes positions 40..46 into one block of its
 * own: 9 blocks (72 rows), where one slot per sequence holds 4 x 64 rows. */
static void test_prompt_blocks_shared(ff_model *m) {
    int32_t p[41];
    for (int i = 0; i < 41; i++) p[i] = (i * 3 + 2) % 40;
    ff_generator_config gc = {.max_slots = 4, .max_seq_len = 64, .max_prefill_tokens = 48, .kv_block_rows = 8};
    ff_generator *g = ff_generator_new(m, &gc);
    REQUIRE(g);
    int32_t used, peak, total;
    ff_generator_kv_blocks(g, &used, &peak, &total);
    CHECK_EQ_INT(total, 32); /* 4 slots x 64 / 8 */
    CHECK_EQ_INT(used, 0);
    ff_gen_request r = gen_request(1, p, 40, 4, 1.0f, 8, 5);
    REQUIRE(ff_generator_submit(g, &r) == 0);
    REQUIRE(ff_generator_step(g) == 0); /* prefill (5 blocks) and the first decode (4 more) */
    ff_generator_kv_blocks(g, &used, &peak, &total);
    CHECK_EQ_INT(used, 9);
    while (ff_generator_pending(g) > 0) REQUIRE(ff_generator_step(g) == 0);
    ff_generator_kv_blocks(g, &used, &peak, &total);
    CHECK_EQ_INT(used, 0);
    CHECK_EQ_INT(peak, 9);
    ff_gen_output o;
    for (int i = 0; i < 4; i++) {
        REQUIRE(ff_generator_pop(g, &o) == 1);
        CHECK_EQ_INT(o.n_tokens, 8);
        ff_gen_output_free(&o);
    }
    /* a partial last prompt block: 41 positions are 5 shared blocks, and each sample copies
     * the 41st row into a block of its own, in which it also decodes */
    r = gen_request(2, p, 41, 4, 1.0f, 7, 6);
    REQUIRE(ff_generator_submit(g, &r) == 0);
    REQUIRE(ff_generator_step(g) == 0);
    ff_generator_kv_blocks(g, &used, &peak, &total);
    CHECK_EQ_INT(used, 9);
    while (ff_generator_pending(g) > 0) REQUIRE(ff_generator_step(g) == 0);
    while (ff_generator_pop(g, &o)) ff_gen_output_free(&o);
    ff_generator_destroy(&g);
}

/* A pool of 9 blocks holds one such request at a time: the second waits for the first to
 * finish, then runs; a request that needs more than the pool is refused at submit. */
static void test_small_pool(ff_model *m) {
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = (i * 11 + 1) % 40;
    ff_generator_config gc = {.max_slots = 8, .max_seq_len = 64, .max_prefill_tokens = 80, .kv_block_rows = 8, .kv_blocks = 9};
    ff_generator *g = ff_generator_new(m, &gc);
    REQUIRE(g);
    ff_gen_request a = gen_request(1, p, 40, 4, 1.0f, 8, 1), b = gen_request(2, p, 40, 4, 1.0f, 8, 2);
    REQUIRE(ff_generator_submit(g, &a) == 0);
    REQUIRE(ff_generator_submit(g, &b) == 0);
    REQUIRE(ff_generator_step(g) == 0);
    CHECK_EQ_INT(ff_generator_running(g), 4); /* 8 slots free, but blocks for one request only */
    CHECK_EQ_INT(ff_generator_pending(g), 8);
    int steps = 0;
    for (; ff_generator_pending(g) > 0 && steps < 100; steps++) REQUIRE(ff_generator_step(g) == 0);
    CHECK_EQ_INT(ff_generator_pending(g), 0);
    int32_t used, peak, total, n = 0;
    ff_generator_kv_blocks(g, &used, &peak, &total);
    CHECK_EQ_INT(peak, 9);
    ff_gen_output o;
    while (ff_generator_pop(g, &o)) n += o.n_tokens == 8, ff_gen_output_free(&o);
    CHECK_EQ_INT(n, 8);

    /* 5 shared + 5 x 1 = 10 blocks > 9: refused, naming the knob, nothing queued */
    ff_gen_request c = gen_request(3, p, 40, 5, 1.0f, 8, 3);
    CHECK(ff_generator_submit(g, &c) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "kv_blocks");
    CHECK_STR_CONTAINS(ff_error_message(), "10 KV blocks");
    CHECK_EQ_INT(ff_generator_pending(g), 0);
    ff_generator_destroy(&g);

    /* bad settings */
    ff_generator_config bad = {.max_slots = 2, .max_seq_len = 16, .kv_block_rows = 17};
    CHECK(ff_generator_new(m, &bad) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "kv_block_rows 17");
    bad.kv_block_rows = -1;
    CHECK(ff_generator_new(m, &bad) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "kv_block_rows");
    bad.kv_block_rows = 4;
    bad.kv_blocks = -3;
    CHECK(ff_generator_new(m, &bad) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "kv_blocks -3");
}

/* A moved sequence lands in blocks of its own; a receiver whose pool is promised away
 * refuses it (naming kv_blocks), then takes it once room is back, and it ends as it would
 * have where it started. */
static void test_import_room(ff_model *m) {
    int32_t p[20];
    for (int i = 0; i < 20; i++) p[i] = (i * 13 + 5) % 40;
    ff_generator_config big = {.max_slots = 4, .max_seq_len = 64, .max_prefill_tokens = 32, .kv_block_rows = 4};
    ff_gen_request r = gen_request(7, p, 20, 2, 1.0f, 24, 9);
    int32_t nref, peak;
    ff_gen_output *want = run_all(m, &big, &r, 1, &nref, &peak);
    ff_generator *a = ff_generator_new(m, &big);
    REQUIRE(a);
    REQUIRE(ff_generator_submit(a, &r) == 0);
    for (int i = 0; i < 5; i++) REQUIRE(ff_generator_step(a) == 0);
    ff_gen_seq_state st;
    REQUIRE(ff_generator_export(a, 7, 1, true, &st) == 0);
    /* the receiver: blocks of 4, a pool of 12; a running request promises 11 of them */
    ff_generator_config small = {.max_slots = 4, .max_seq_len = 64, .max_prefill_tokens = 32, .kv_block_rows = 4, .kv_blocks = 12};
    ff_generator *b = ff_generator_new(m, &small);
    REQUIRE(b);
    ff_gen_request other = gen_request(8, p, 4, 1, 1.0f, 40, 3);
    REQUIRE(ff_generator_submit(b, &other) == 0);
    REQUIRE(ff_generator_step(b) == 0);
    CHECK(ff_generator_import(b, &st) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "kv_blocks");
    while (ff_generator_pending(b) > 0) REQUIRE(ff_generator_step(b) == 0);
    REQUIRE(ff_generator_import(b, &st) == 0);
    ff_gen_seq_state_free(&st);
    while (ff_generator_pending(b) > 0) REQUIRE(ff_generator_step(b) == 0);
    ff_gen_output o;
    int seen = 0;
    while (ff_generator_pop(b, &o)) {
        if (o.id == 7) {
            seen++;
            CHECK_EQ_INT(o.n_tokens, want[1].n_tokens);
            CHECK(!memcmp(o.tokens, want[1].tokens, (size_t)o.n_tokens * 4));
            CHECK(!memcmp(o.logprobs, want[1].logprobs, (size_t)o.n_tokens * 4));
        }
        ff_gen_output_free(&o);
    }
    CHECK_EQ_INT(seen, 1);
    int32_t used, total;
    ff_generator_kv_blocks(b, &used, &peak, &total);
    CHECK_EQ_INT(used, 0);
    ff_generator_destroy(&a);
    ff_generator_destroy(&b);
    gen_outputs_free(want, nref);
}

/* A prompt longer than max_prefill_tokens is prefilled in chunks, alone in its step: the
 * outputs equal one forward's bit for bit (chunks of 8 and of 7 positions, blocks of 4 and 16),
 * with shorter requests before and after it in the queue; the prefill counters count its
 * tokens once. */
static void test_chunked_prefill(ff_model *m) {
    int32_t longp[45], a[] = {3, 9, 4}, b[] = {7, 7, 1, 2, 5, 6};
    for (int i = 0; i < 45; i++) longp[i] = (i * 17 + 4) % 40;
    ff_gen_request r[3] = {gen_request(0, a, 3, 2, 1.0f, 12, 21), gen_request(1, longp, 45, 3, 1.0f, 10, 22), gen_request(2, b, 6, 1, 1.0f, 14, 23)};
    ff_generator_config one = {.max_slots = 6, .max_seq_len = 64, .max_prefill_tokens = 64};
    int32_t n_ref, peak;
    ff_gen_output *want = run_all(m, &one, r, 3, &n_ref, &peak);
    const int32_t chunks[] = {8, 7}, rows[] = {4, 16};
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 2; k++) {
            ff_generator_config gc = {.max_slots = 6, .max_seq_len = 64, .max_prefill_tokens = chunks[c], .kv_block_rows = rows[k]};
            int32_t n;
            ff_gen_output *got = run_all(m, &gc, r, 3, &n, &peak);
            REQUIRE(n == n_ref);
            int same = 1;
            for (int32_t i = 0; i < n; i++)
                same &= got[i].n_tokens == want[i].n_tokens && !memcmp(got[i].tokens, want[i].tokens, (size_t)want[i].n_tokens * 4) &&
                        !memcmp(got[i].logprobs, want[i].logprobs, (size_t)want[i].n_tokens * 4);
            if (!same) {
                fprintf(stderr, "chunks of %d, blocks of %d: outputs differ from one prefill\n", chunks[c], rows[k]);
                ff_test_failures++;
            }
            gen_outputs_free(got, n);
        }
    ff_generator_config gc = {.max_slots = 6, .max_seq_len = 64, .max_prefill_tokens = 8};
    ff_generator *g = ff_generator_new(m, &gc);
    REQUIRE(g);
    REQUIRE(ff_generator_submit(g, &r[1]) == 0);
    while (ff_generator_pending(g) > 0) REQUIRE(ff_generator_step(g) == 0);
    int64_t tokens;
    double secs;
    ff_generator_prefill_stats(g, &tokens, &secs);
    CHECK_EQ_INT((int)tokens, 45);
    CHECK(secs > 0);
    ff_gen_output o;
    while (ff_generator_pop(g, &o)) ff_gen_output_free(&o);
    ff_generator_destroy(&g);
    gen_outputs_free(want, n_ref);
}

/* Do two runs' outputs agree bit for bit? */
static bool same_outputs(const ff_gen_output *a, const ff_gen_output *b, int32_t n) {
    bool same = true;
    for (int32_t i = 0; i < n; i++)
        same &= a[i].n_tokens == b[i].n_tokens && a[i].finish == b[i].finish && !memcmp(a[i].tokens, b[i].tokens, (size_t)a[i].n_tokens * 4) &&
                !memcmp(a[i].logprobs, b[i].logprobs, (size_t)a[i].n_tokens * 4);
    return same;
}

/* The largest |cached log-prob - full forward's| over the outputs of requests r (temperature 1),
 * and the largest |log-prob| in *big. */
static double cached_vs_full(ff_model *m, const ff_gen_request *r, const ff_gen_output *o, int32_t n, double *big) {
    double worst = 0;
    *big = 0;
    for (int32_t i = 0; i < n; i++) {
        const ff_gen_request *q = &r[o[i].id];
        int32_t T = q->prompt_len + o[i].n_tokens, ss[2] = {0, T};
        int32_t *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
        float *lp = malloc((size_t)T * 4);
        REQUIRE(tok && tg && lp);
        memcpy(tok, q->prompt, (size_t)q->prompt_len * 4);
        memcpy(tok + q->prompt_len, o[i].tokens, (size_t)o[i].n_tokens * 4);
        ff_batch_shift_targets(tok, ss, 1, tg);
        ff_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
        ff_forward_opts fo = {.temperature = 1.0f};
        ff_forward_out out = {.logprobs = lp};
        REQUIRE(ff_model_forward(m, &b, &fo, &out) == 0);
        for (int32_t k = 0; k < o[i].n_tokens; k++) {
            worst = fmax(worst, fabs((double)o[i].logprobs[k] - lp[q->prompt_len - 1 + k]));
            *big = fmax(*big, fabs((double)lp[q->prompt_len - 1 + k]));
        }
        free(tok), free(tg), free(lp);
    }
    return worst;
}

/* A KV cache in bf16 (kv_bf16): half the bytes; every layout of it gives the same outputs bit
 * for bit (the rows are rounded alike wherever they are); its log-probs near a full forward's
 * (the fp32 cache's equal it to rounding); a sequence moved between two bf16 caches (its rows
 * travel as F32, widened exactly) ends as it does unmoved, bit for bit. */
static void test_kv_bf16(ff_model *m) {
    int32_t p0[21], p1[16], p2[] = {3, 9, 4, 1, 5};
    for (int i = 0; i < 21; i++) p0[i] = (i * 7 + 3) % 40;
    for (int i = 0; i < 16; i++) p1[i] = (i * 5 + 1) % 40;
    ff_gen_request r[3] = {gen_request(0, p0, 21, 3, 1.0f, 30, 11), gen_request(1, p1, 16, 2, 1.0f, 20, 12), gen_request(2, p2, 5, 2, 1.0f, 25, 13)};
    ff_generator_config c32 = {.max_slots = 6, .max_seq_len = 64, .max_prefill_tokens = 32, .kv_block_rows = 16}, c16 = c32;
    c16.kv_bf16 = true;
    ff_generator *g32 = ff_generator_new(m, &c32), *g16 = ff_generator_new(m, &c16);
    REQUIRE(g32 && g16);
    CHECK_EQ_INT(ff_generator_kv_bytes(g16) * 2, ff_generator_kv_bytes(g32));
    ff_generator_destroy(&g32), ff_generator_destroy(&g16);
    int32_t n32, n16, n, peak;
    ff_gen_output *o32 = run_all(m, &c32, r, 3, &n32, &peak), *o16 = run_all(m, &c16, r, 3, &n16, &peak);
    REQUIRE(n32 == 7 && n16 == 7);
    const int32_t rows[] = {1, 8, 64};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        ff_generator_config gc = c16;
        gc.kv_block_rows = rows[k];
        gc.kv_blocks = largest_need(r, 3, rows[k], 64); /* the others wait */
        ff_gen_output *got = run_all(m, &gc, r, 3, &n, &peak);
        if (!same_outputs(got, o16, n)) {
            fprintf(stderr, "bf16 KV cache, blocks of %d: outputs differ from blocks of 16\n", rows[k]);
            ff_test_failures++;
        }
        gen_outputs_free(got, n);
    }
    double big32, big16, d32 = cached_vs_full(m, r, o32, n32, &big32), d16 = cached_vs_full(m, r, o16, n16, &big16);
    printf("cached log-probs against a full forward: fp32 KV cache %.3g, bf16 KV cache %.3g (log-probs up to %.3g)\n", d32, d16,
           big16);
    CHECK(d32 < 1e-4);
    CHECK(d16 > d32 && d16 < 0.03 * big16); /* bf16 keeps 8 significant bits of each key and value */

    /* moved mid-decode from one bf16 cache into another (blocks of 4 there) */
    ff_generator *a = ff_generator_new(m, &c16);
    REQUIRE(a && ff_generator_submit(a, &r[0]) == 0);
    for (int i = 0; i < 6; i++) REQUIRE(ff_generator_step(a) == 0);
    ff_gen_seq_state st;
    REQUIRE(ff_generator_export(a, 0, 2, true, &st) == 0);
    ff_generator_config c4 = c16;
    c4.kv_block_rows = 4;
    ff_generator *b = ff_generator_new(m, &c4);
    REQUIRE(b && ff_generator_import(b, &st) == 0);
    ff_gen_seq_state_free(&st);
    while (ff_generator_pending(b) > 0) REQUIRE(ff_generator_step(b) == 0);
    ff_gen_output o;
    REQUIRE(ff_generator_pop(b, &o) == 1);
    CHECK(o.id == 0 && o.sample == 2);
    CHECK(same_outputs(&o, &o16[2], 1));
    ff_gen_output_free(&o);
    while (ff_generator_pending(a) > 0) REQUIRE(ff_generator_step(a) == 0);
    while (ff_generator_pop(a, &o)) ff_gen_output_free(&o);
    ff_generator_destroy(&a);
    ff_generator_destroy(&b);
    gen_outputs_free(o32, n32);
    gen_outputs_free(o16, n16);
}

int main(void) {
    ff_backend *be = ff_backend_cpu_new(2);
    REQUIRE(be);
    ff_model_config c = tiny_config(40, 32, 64, 2, 4, 2, false, true, false);
    ff_model *m = tiny_model(be, &c, 7, 0.3);
    test_any_layout_same_outputs(m);
    test_prompt_blocks_shared(m);
    test_small_pool(m);
    test_import_room(m);
    test_chunked_prefill(m);
    test_kv_bf16(m);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}
