/* Pre-tokenization with Unicode 16 classes (model/io/tokenizer_scan.c, unicode_tables.c):
 *  - the class table: White_Space exactly Unicode's 25 code points (U+180E not among them),
 *    and a letter or digit of each class added in Unicode 15 and 16 is one;
 *  - for each of those classes (CJK Extension H and I, Kawi, Garay, Kirat Rai, Todhri,
 *    U+1C89) and U+180E, the pieces and ids that Hugging Face's tokenizers gives with the
 *    GPT-2, Llama 3 and Qwen2 fixtures (tests/modelio/make_unicode_fixtures.py);
 *  - the scanners against PCRE2 running the same regexes, on random text made of characters
 *    whose classes did not change between PCRE2's Unicode and 16: the scanner is the regex. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"
#include "model/io/tok_internal.h"
#include "tests/test_util.h"

static void test_table(void) {
    CHECK(!strcmp(ff_unicode_version, "16.0.0"));
    static const uint32_t ws[] = {9, 10, 11, 12, 13, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                                  0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000};
    int n_space = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        if (ff_uc_class(cp) & FF_UC_SPACE) {
            bool listed = false;
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) listed |= ws[k] == cp;
            if (!listed) fprintf(stderr, "U+%04X is not White_Space\n", cp);
            CHECK(listed);
            n_space++;
        }
    CHECK_EQ_INT(n_space, 25);
    CHECK(!(ff_uc_class(0x180e) & FF_UC_SPACE));
    CHECK(!(ff_uc_class(0x200b) & FF_UC_SPACE)); /* ZERO WIDTH SPACE is Cf, not a space either */
    static const uint32_t letters[] = {0x31350, 0x2ebf0, 0x11f04, 0x10d50, 0x16d43, 0x105c0, 0x1c89, 'a', 0x65e5};
    for (size_t k = 0; k < sizeof letters / sizeof letters[0]; k++) CHECK(ff_uc_class(letters[k]) & FF_UC_L);
    static const uint32_t digits[] = {0x11f50, 0x10d40, 0x16d70, '7', 0x661};
    for (size_t k = 0; k < sizeof digits / sizeof digits[0]; k++) CHECK((ff_uc_class(digits[k]) & (FF_UC_N | FF_UC_ND_NL)) == (FF_UC_N | FF_UC_ND_NL));
    CHECK(ff_uc_class(0x00b2) & FF_UC_N); /* ² is No: a number, not a decimal digit */
    CHECK(!(ff_uc_class(0x00b2) & FF_UC_ND_NL));
    CHECK(ff_uc_class(0x0301) & FF_UC_M);
    CHECK(ff_uc_class('_') & FF_UC_PC);
    CHECK_EQ_INT(ff_uc_class(0x10ffff), 0);
    CHECK_EQ_INT(ff_uc_class(0x110000), 0);
}

static ff_scan_kind kind_of_fixture(const char *name) {
    return !strcmp(name, "gpt2") ? FF_SCAN_GPT2 : !strcmp(name, "llama3") ? FF_SCAN_LLAMA3 : FF_SCAN_QWEN2;
}

static void test_hf_cases(void) {
    FILE *f = fopen("tests/modelio/data/tok_unicode16.expected.jsonl", "r");
    REQUIRE(f);
    ff_tokenizer *toks[3] = {ff_tokenizer_load("tests/modelio/data/tok_gpt2.json"), ff_tokenizer_load("tests/modelio/data/tok_llama3.json"),
                             ff_tokenizer_load("tests/modelio/data/tok_qwen2.json")};
    REQUIRE(toks[0] && toks[1] && toks[2]);
    char *line = NULL;
    size_t cap = 0;
    int n = 0, bad = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, JSON_ALLOW_NUL, NULL);
        REQUIRE(o);
        const char *name = json_string_value(json_object_get(o, "tokenizer"));
        const char *text = json_string_value(json_object_get(o, "text"));
        size_t tl = json_string_length(json_object_get(o, "text"));
        ff_scan_kind k = kind_of_fixture(name);
        const ff_tokenizer *t = toks[k - FF_SCAN_GPT2];
        /* pieces */
        json_t *pieces = json_object_get(o, "pieces");
        size_t np = 0, i = 0;
        bool same = true;
        while (i < tl) {
            size_t e = ff_scan_next(k, text, tl, i);
            json_t *want = json_array_get(pieces, np++);
            if (!want || json_string_length(want) != e - i || memcmp(json_string_value(want), text + i, e - i) != 0) same = false;
            i = e;
        }
        if (np != json_array_size(pieces)) same = false;
        /* ids */
        int32_t *ids, m;
        REQUIRE(ff_tokenizer_encode(t, text, tl, NULL, &ids, &m) == 0);
        json_t *want_ids = json_object_get(o, "ids");
        bool same_ids = (size_t)m == json_array_size(want_ids);
        for (int32_t j = 0; same_ids && j < m; j++) same_ids = ids[j] == json_integer_value(json_array_get(want_ids, (size_t)j));
        free(ids);
        if (!same || !same_ids) {
            if (bad++ < 8) fprintf(stderr, "%s, %s: '%s': %s differ from Hugging Face's\n", name, json_string_value(json_object_get(o, "class")), text, same ? "ids" : "pieces");
        }
        n++;
        json_decref(o);
    }
    free(line);
    fclose(f);
    for (int k = 0; k < 3; k++) ff_tokenizer_destroy(&toks[k]);
    fprintf(stderr, "Unicode 15/16 cases: %d, %d differ from Hugging Face\n", n, bad);
    CHECK(n >= 200);
    CHECK_EQ_INT(bad, 0);
}

/* the regexes as tokenizer.json writes them */
static const char *k_patterns[3] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

static void test_against_pcre2(void) {
    /* letters, digits, numbers, marks, spaces of many kinds, apostrophes and the letters of
     * the contractions in both cases, long s, line breaks, punctuation, emoji, NUL */
    static const char *pool[] = {"a", "b", "Z", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m", "M", "l", "L", "d", "D", "'", "'", "'",
                                 " ", " ", " ", "\t", "\n", "\r", "\r\n", "\v", "\f", "0", "1", "9", ".", ",", "(", "!", "_", "-",
                                 "\xc5\xbf", "\xc3\xa9", "\xe6\x97\xa5", "\xd9\xa1", "\xe2\x85\xab", "\xc2\xb2", "\xcc\x81", "\xc2\xa0",
                                 "\xe2\x80\x83", "\xe3\x80\x80", "\xc2\x85", "\xe2\x80\xa8", "\xe2\x80\x8b", "\xf0\x9f\x98\x80", "\x01", "\x00"};
    ff_rng r;
    ff_rng_seed(&r, 15);
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    REQUIRE(md);
    int n = 0, bad = 0;
    for (int k = 0; k < 3; k++) {
        int err;
        PCRE2_SIZE eoff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)k_patterns[k], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
        REQUIRE(re);
        ff_scan_kind kind = ff_scan_kind_of(k_patterns[k]);
        CHECK_EQ_INT(kind, FF_SCAN_GPT2 + k);
        for (int round = 0; round < 4000; round++) {
            char text[256];
            size_t len = 0, parts = ff_rng_below(&r, 24);
            for (size_t p = 0; p < parts; p++) {
                const char *c = pool[ff_rng_below(&r, sizeof pool / sizeof pool[0])];
                size_t cl = c[0] ? strlen(c) : 1;
                memcpy(text + len, c, cl);
                len += cl;
            }
            /* the regex's matches tile the text, as the scanner's do */
            size_t i = 0;
            bool same = true;
            while (i < len && same) {
                int rc = pcre2_match(re, (PCRE2_SPTR)text, len, i, 0, md, NULL);
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t e = ff_scan_next(kind, text, len, i);
                same = rc > 0 && ov[0] == i && ov[1] == e;
                i = e;
            }
            if (!same && bad++ < 8) {
                fprintf(stderr, "pattern %d, text:", k);
                for (size_t j = 0; j < len; j++) fprintf(stderr, " %02x", (uint8_t)text[j]);
                fprintf(stderr, ": scanner and PCRE2 differ at byte %zu\n", i);
            }
            n++;
        }
        pcre2_code_free(re);
    }
    pcre2_match_data_free(md);
    fprintf(stderr, "scanner vs PCRE2: %d texts, %d differ\n", n, bad);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ff_scan_kind_of("\\p{L}+"), FF_SCAN_NONE);
}

int main(void) {
    test_table();
    test_hf_cases();
    test_against_pcre2();
    TEST_MAIN_END();
}
