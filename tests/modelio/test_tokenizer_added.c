/* The added-token matcher (Aho-Corasick, model/io/tokenizer_added.c) against the scan it
 * replaced: at each position from the left, the longest token that starts there, the first
 * of equal ones; the next search starts where the match ends. Hand-written cases (tokens that
 * overlap, prefixes of each other, matches at the ends of the text, a match that only a
 * failure link finds) and many random ones over a small alphabet, where such cases are
 * common. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/util.h"
#include "model/io/tok_internal.h"
#include "tests/test_util.h"

/* the old matcher: every token at every position */
static int naive_find(const char *const *pats, const size_t *lens, int n, const char *s, size_t len, size_t from, size_t *start) {
    for (size_t i = from; i < len; i++) {
        int best = -1;
        for (int k = 0; k < n; k++)
            if (lens[k] > 0 && lens[k] <= len - i && memcmp(s + i, pats[k], lens[k]) == 0 && (best < 0 || lens[k] > lens[best])) best = k;
        if (best >= 0) {
            *start = i;
            return best;
        }
    }
    return -1;
}

/* all matches of the text, as "start:index " pairs, written to out */
static void splits(const ff_acmatch *m, const char *const *pats, const size_t *lens, int n, const char *s, size_t len, char *out, size_t cap) {
    size_t i = 0, o = 0;
    out[0] = '\0';
    for (;;) {
        size_t st = 0;
        int k = m ? ff_acmatch_find(m, s, len, i, &st) : naive_find(pats, lens, n, s, len, i, &st);
        if (k < 0) break;
        o += (size_t)snprintf(out + o, cap - o, "%zu:%d ", st, k);
        i = st + lens[k];
    }
}

static int n_cases;

static void compare(const char *const *pats, const size_t *lens, int n, const char *s, size_t len) {
    ff_acmatch *m = ff_acmatch_new(pats, lens, n);
    REQUIRE(m);
    char want[4096], got[4096];
    splits(NULL, pats, lens, n, s, len, want, sizeof want);
    splits(m, pats, lens, n, s, len, got, sizeof got);
    if (strcmp(want, got) != 0 && ff_test_failures++ < 10) {
        fprintf(stderr, "text '%.*s', tokens:", (int)len, s);
        for (int k = 0; k < n; k++) fprintf(stderr, " '%.*s'", (int)lens[k], pats[k]);
        fprintf(stderr, "\n  want %s\n  got  %s\n", want, got);
    }
    n_cases++;
    ff_acmatch_destroy(&m);
}

static void compare_strs(const char *const *pats, int n, const char *s, const char *expect) {
    size_t lens[16];
    for (int k = 0; k < n; k++) lens[k] = strlen(pats[k]);
    compare(pats, lens, n, s, strlen(s));
    ff_acmatch *m = ff_acmatch_new(pats, lens, n);
    REQUIRE(m);
    char got[1024];
    splits(m, pats, lens, n, s, strlen(s), got, sizeof got);
    if (strcmp(got, expect) != 0) {
        fprintf(stderr, "text '%s': got '%s', want '%s'\n", s, got, expect);
        ff_test_failures++;
    }
    ff_acmatch_destroy(&m);
}

static void test_cases(void) {
    /* a longer token at the same start wins; the shorter one inside it is not matched */
    const char *p1[] = {"<|a", "<|ab", "<|abc"};
    compare_strs(p1, 3, "<|abc<|ab<|a<|", "0:2 5:1 9:0 ");
    /* "abcd" fails at 'e': "bc" (found only through a failure link) is the leftmost match */
    const char *p2[] = {"abcd", "bc"};
    compare_strs(p2, 2, "abce", "1:1 ");
    compare_strs(p2, 2, "abcd", "0:0 ");
    /* leftmost beats longest: "ab" at 0 then the rest; "bcx" overlapping it is not found */
    const char *p3[] = {"ab", "abcd", "bcx"};
    compare_strs(p3, 3, "abcx", "0:0 ");
    /* a shorter match found first is replaced by one that starts earlier and ends later */
    const char *p4[] = {"bc", "abcd"};
    compare_strs(p4, 2, "abcd", "0:1 ");
    compare_strs(p4, 2, "abc", "1:0 ");
    /* at both ends of the text, back to back, equal tokens (the first wins), empty ones ignored */
    const char *p5[] = {"<s>", "", "</s>", "<s>"};
    compare_strs(p5, 4, "<s><s>x</s>", "0:0 3:0 7:2 ");
    compare_strs(p5, 4, "", "");
    compare_strs(p5, 4, "<s", "");
    /* overlapping repeats: "aa" in "aaa" once, then a lone "a" is not a match */
    const char *p6[] = {"aa"};
    compare_strs(p6, 1, "aaaaa", "0:0 2:0 ");
    /* multi-byte UTF-8 and bytes >= 0x80 in tokens */
    const char *p7[] = {"\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81", "\xef\xbd\x9c"};
    compare_strs(p7, 3, "a\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81\xef\xbd\x9c", "1:1 7:0 10:2 ");
}

static void test_random(void) {
    ff_rng r;
    ff_rng_seed(&r, 16);
    const char alpha[] = "ab<|>";
    char store[12][8];
    const char *pats[12];
    size_t lens[12];
    char text[80];
    for (int round = 0; round < 20000; round++) {
        int n = 1 + (int)ff_rng_below(&r, 12);
        for (int k = 0; k < n; k++) {
            lens[k] = ff_rng_below(&r, 7); /* 0..6, empty ones included */
            for (size_t j = 0; j < lens[k]; j++) store[k][j] = alpha[ff_rng_below(&r, 5)];
            pats[k] = store[k];
        }
        size_t len = ff_rng_below(&r, sizeof text);
        for (size_t j = 0; j < len; j++) text[j] = alpha[ff_rng_below(&r, ff_rng_below(&r, 2) ? 2 : 5)];
        compare(pats, lens, n, text, len);
    }
}

/* Time with 300 tokens that share a prefix is within a small factor of the time with 3: the
 * search does not try every token at every byte. The text is full of the shared prefix. */
static void test_many_tokens(void) {
    enum { N = 300 };
    static char store[N][24];
    const char *pats[N];
    size_t lens[N];
    for (int k = 0; k < N; k++) {
        lens[k] = (size_t)snprintf(store[k], sizeof store[k], "<|extra_%d|>", k);
        pats[k] = store[k];
    }
    size_t len = 1 << 20;
    char *text = malloc(len);
    REQUIRE(text);
    for (size_t i = 0; i < len; i++) text[i] = "<|extra_x "[i % 10];
    memcpy(text + len - 12, "<|extra_299|>", 12); /* cut: "<|extra_299|" is not a token */
    memcpy(text + len / 2, "<|extra_17|>", 12);
    double sec[2];
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? N : 3;
        ff_acmatch *m = ff_acmatch_new(pats, lens, n);
        REQUIRE(m);
        int found = 0;
        sec[pass] = 1e30;
        for (int rep = 0; rep < 5; rep++) { /* the best of 5: other processes share the cores */
            int64_t t0 = ff_now_ns();
            size_t i = 0, st;
            int k;
            found = 0;
            while ((k = ff_acmatch_find(m, text, len, i, &st)) >= 0) {
                found++;
                CHECK_EQ_INT(k, 17);
                CHECK(st == len / 2);
                i = st + lens[k];
            }
            double dt = (double)(ff_now_ns() - t0) / 1e9;
            if (dt < sec[pass]) sec[pass] = dt;
        }
        CHECK_EQ_INT(found, pass ? 1 : 0);
        ff_acmatch_destroy(&m);
    }
    fprintf(stderr, "1 MB of prefixes: %.2f ms with 3 tokens, %.2f ms with %d\n", sec[0] * 1e3, sec[1] * 1e3, N);
    CHECK(sec[1] < 5 * sec[0] + 0.002);
    free(text);
}

int main(void) {
    test_cases();
    test_random();
    test_many_tokens();
    fprintf(stderr, "%d cases compared\n", n_cases);
    TEST_MAIN_END();
}
