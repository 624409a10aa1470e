/* Balancing by token count: Karmarkar-Karp partitions (equal counts or not), and mini-batch
 * plans over DP ranks and micro-batches: every sample exactly once, the limits held, ranks
 * balanced, deterministic. */
#include <stdio.h>
#include <stdlib.h>

#include "fuseflow/microbatch.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static void sums(const int64_t *w, const int32_t *bin, int32_t n, int32_t k, int64_t *s, int32_t *cnt) {
    for (int32_t b = 0; b < k; b++) s[b] = cnt[b] = 0;
    for (int32_t i = 0; i < n; i++) {
        REQUIRE(bin[i] >= 0 && bin[i] < k);
        s[bin[i]] += w[i];
        cnt[bin[i]]++;
    }
}

static int64_t spread_of(const int64_t *s, int32_t k) {
    int64_t lo = s[0], hi = s[0];
    for (int32_t b = 1; b < k; b++) {
        lo = s[b] < lo ? s[b] : lo;
        hi = s[b] > hi ? s[b] : hi;
    }
    return hi - lo;
}

/* greedy LPT: heaviest first into the lightest bin (the baseline KK should match or beat) */
static int64_t lpt_spread(const int64_t *w, int32_t n, int32_t k) {
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    int64_t s[64] = {0};
    for (int32_t i = 0; i < n; i++) idx[i] = i;
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = i + 1; j < n; j++)
            if (w[idx[j]] > w[idx[i]]) {
                int32_t t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
            }
    for (int32_t i = 0; i < n; i++) {
        int32_t best = 0;
        for (int32_t b = 1; b < k; b++)
            if (s[b] < s[best]) best = b;
        s[best] += w[idx[i]];
    }
    free(idx);
    return spread_of(s, k);
}

static void test_kk_small(void) {
    /* {8,7,6,5,4} in two: LPT gives 17/13; differencing gives 16/14 */
    int64_t w[5] = {8, 7, 6, 5, 4}, s[2];
    int32_t bin[5], cnt[2];
    DIE_IF(ff_balance_kk(w, 5, 2, false, bin));
    sums(w, bin, 5, 2, s, cnt);
    CHECK_EQ_INT(spread_of(s, 2), 2);
    CHECK(s[0] >= s[1]); /* bins by decreasing sum */
    CHECK_EQ_INT(lpt_spread(w, 5, 2), 4);

    /* equal counts: 4 items per bin, exact split exists */
    int64_t w2[8] = {10, 9, 8, 7, 6, 5, 4, 3}, s2[2];
    int32_t bin2[8], cnt2[2];
    DIE_IF(ff_balance_kk(w2, 8, 2, true, bin2));
    sums(w2, bin2, 8, 2, s2, cnt2);
    CHECK_EQ_INT(cnt2[0], 4);
    CHECK_EQ_INT(cnt2[1], 4);
    CHECK_EQ_INT(spread_of(s2, 2), 0);

    /* more bins than items; zero weights; one bin */
    int64_t w3[3] = {5, 0, 2}, s3[5];
    int32_t bin3[3], cnt3[5];
    DIE_IF(ff_balance_kk(w3, 3, 5, true, bin3));
    sums(w3, bin3, 3, 5, s3, cnt3);
    for (int b = 0; b < 5; b++) CHECK(cnt3[b] <= 1);
    DIE_IF(ff_balance_kk(w3, 3, 1, false, bin3));
    CHECK(bin3[0] == 0 && bin3[1] == 0 && bin3[2] == 0);
    CHECK(ff_balance_kk(w3, 3, 0, false, bin3) == -1);
    CHECK_EQ_INT(ff_balance_kk(NULL, 0, 3, true, NULL), 0);
}

static void test_kk_random(void) {
    ff_rng r;
    ff_rng_seed(&r, 42);
    int64_t w[200], s[16];
    int32_t bin[200], bin2[200], cnt[16];
    int kk_wins = 0, lpt_wins = 0;
    for (int trial = 0; trial < 200; trial++) {
        int32_t n = 1 + (int32_t)ff_rng_below(&r, 200), k = 1 + (int32_t)ff_rng_below(&r, 16);
        bool eq = trial & 1;
        int64_t wmax = 0;
        for (int32_t i = 0; i < n; i++) {
            w[i] = 5 + (int64_t)ff_rng_below(&r, 300);
            wmax = w[i] > wmax ? w[i] : wmax;
        }
        DIE_IF(ff_balance_kk(w, n, k, eq, bin));
        DIE_IF(ff_balance_kk(w, n, k, eq, bin2));
        CHECK(memcmp(bin, bin2, (size_t)n * sizeof *bin) == 0); /* deterministic */
        sums(w, bin, n, k, s, cnt);
        if (eq)
            for (int32_t b = 0; b < k; b++) CHECK(cnt[b] == n / k || cnt[b] == n / k + 1);
        for (int32_t b = 1; b < k; b++) CHECK(s[b - 1] >= s[b]);
        /* differencing never leaves bins further apart than the heaviest item */
        if (n >= k) CHECK(spread_of(s, k) <= wmax);
        if (!eq) {
            int64_t a = spread_of(s, k), l = lpt_spread(w, n, k);
            kk_wins += a < l;
            lpt_wins += l < a;
        }
    }
    CHECK(kk_wins > lpt_wins);
}

static void check_plan(const ff_mb_plan *p, const int64_t *tok, int32_t n, int32_t ranks, int32_t mbs, int32_t mbt) {
    REQUIRE(p->n_ranks == ranks);
    int32_t *seen = calloc((size_t)n + 1, sizeof *seen);
    int32_t per_rank = -1;
    int64_t rt_min = INT64_MAX, rt_max = 0, tmax = 0;
    for (int32_t i = 0; i < n; i++) tmax = tok[i] > tmax ? tok[i] : tmax;
    for (int32_t r = 0; r < ranks; r++) {
        int32_t m = p->rank_mb[r + 1] - p->rank_mb[r];
        if (per_rank < 0) per_rank = m;
        CHECK_EQ_INT(m, per_rank); /* ranks stay in step */
        int32_t cnt = 0;
        int64_t rt = 0;
        for (int32_t b = p->rank_mb[r]; b < p->rank_mb[r + 1]; b++) {
            int32_t c = p->mb_start[b + 1] - p->mb_start[b];
            int64_t t = 0;
            for (int32_t i = p->mb_start[b]; i < p->mb_start[b + 1]; i++) {
                REQUIRE(p->items[i] >= 0 && p->items[i] < n);
                seen[p->items[i]]++;
                t += tok[p->items[i]];
                if (i > p->mb_start[b]) CHECK(p->items[i] > p->items[i - 1]);
            }
            CHECK_EQ_INT(t, p->mb_tokens[b]);
            if (mbs > 0) CHECK(c <= mbs);
            if (mbt > 0 && c > 1) CHECK(t <= mbt);
            cnt += c;
            rt += t;
        }
        CHECK(cnt == n / ranks || cnt == n / ranks + 1);
        rt_min = rt < rt_min ? rt : rt_min;
        rt_max = rt > rt_max ? rt : rt_max;
    }
    for (int32_t i = 0; i < n; i++) CHECK_EQ_INT(seen[i], 1);
    CHECK(rt_max - rt_min <= tmax);
    free(seen);
}

static void test_plan(void) {
    ff_rng r;
    ff_rng_seed(&r, 7);
    int64_t tok[300];
    for (int trial = 0; trial < 60; trial++) {
        int32_t n = 1 + (int32_t)ff_rng_below(&r, 300), ranks = 1 + (int32_t)ff_rng_below(&r, 8);
        int32_t mbs = (int32_t)ff_rng_below(&r, 12), mbt = trial % 3 == 0 ? 0 : 100 + (int32_t)ff_rng_below(&r, 800);
        for (int32_t i = 0; i < n; i++) tok[i] = 10 + (int64_t)ff_rng_below(&r, 120);
        ff_mb_plan p, q;
        DIE_IF(ff_mb_plan_make(tok, n, ranks, mbs, mbt, &p));
        check_plan(&p, tok, n, ranks, mbs, mbt);
        DIE_IF(ff_mb_plan_make(tok, n, ranks, mbs, mbt, &q));
        CHECK(p.n_micro == q.n_micro && !memcmp(p.items, q.items, (size_t)n * sizeof *p.items) &&
              !memcmp(p.mb_start, q.mb_start, ((size_t)p.n_micro + 1) * sizeof *p.mb_start));
        ff_mb_plan_free(&p);
        ff_mb_plan_free(&q);
    }
    /* the fewest micro-batches: 16 samples of 10 tokens, 4 per micro-batch -> 4 of 4 */
    int64_t even[16];
    for (int i = 0; i < 16; i++) even[i] = 10;
    ff_mb_plan p;
    DIE_IF(ff_mb_plan_make(even, 16, 1, 4, 0, &p));
    CHECK_EQ_INT(p.n_micro, 4);
    for (int b = 0; b < 4; b++) CHECK_EQ_INT(p.mb_start[b + 1] - p.mb_start[b], 4);
    ff_mb_plan_free(&p);
    /* a token budget of 35 -> 3 per micro-batch -> 6 micro-batches */
    DIE_IF(ff_mb_plan_make(even, 16, 1, 0, 35, &p));
    CHECK_EQ_INT(p.n_micro, 6);
    ff_mb_plan_free(&p);
    /* one sample longer than the budget is a micro-batch alone */
    int64_t big[3] = {500, 10, 10};
    DIE_IF(ff_mb_plan_make(big, 3, 1, 0, 100, &p));
    CHECK_EQ_INT(p.n_micro, 2);
    ff_mb_plan_free(&p);
    /* fewer samples than ranks: some ranks get none */
    DIE_IF(ff_mb_plan_make(big, 3, 4, 2, 0, &p));
    check_plan(&p, big, 3, 4, 2, 0);
    ff_mb_plan_free(&p);
    /* bad input */
    CHECK(ff_mb_plan_make(even, 16, 0, 4, 0, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "DP ranks");
    int64_t neg[2] = {3, -1};
    CHECK(ff_mb_plan_make(neg, 2, 1, 0, 0, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "sample 1");
}

int main(void) {
    test_kk_small();
    test_kk_random();
    test_plan();
    TEST_MAIN_END();
}
