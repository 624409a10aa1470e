/* Tokenizers against Hugging Face's `tokenizers` library: for GPT-2, Llama 3 and Qwen2 style
 * tokenizers (and one that uses every other supported feature), the ids and decodings that
 * the Python library produced for tricky and random strings (tests/modelio/make_fixtures.py)
 * must come out exactly. Plus the byte-level tokenizer and the load errors. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static int same_ids(const int32_t *a, int32_t na, json_t *b) {
    if ((size_t)na != json_array_size(b)) return 0;
    for (int32_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(b, (size_t)i))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *a, int32_t n) {
    fprintf(stderr, "  %s:", what);
    for (int32_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "\n");
}

static void check_fixture(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/modelio/data/tok_%s.json", name);
    ff_tokenizer *t = ff_tokenizer_load(path);
    if (!t) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(t);
    snprintf(path, sizeof path, "tests/modelio/data/tok_%s.expected.jsonl", name);
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    char *line = NULL;
    size_t cap = 0;
    int n_lines = 0, bad = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t err;
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &err);
        REQUIRE(o);
        size_t tl;
        const char *text = json_string_value(json_object_get(o, "text"));
        tl = json_string_length(json_object_get(o, "text"));
        const char *keys[3] = {"ids", "ids_add_special", "ids_plain_special"};
        ff_encode_opts opts[3] = {{false, true}, {true, true}, {false, false}};
        for (int k = 0; k < 3; k++) {
            int32_t *ids, n;
            REQUIRE(ff_tokenizer_encode(t, text, tl, &opts[k], &ids, &n) == 0);
            if (!same_ids(ids, n, json_object_get(o, keys[k]))) {
                if (bad++ < 5) {
                    fprintf(stderr, "%s line %d (%s): text %s\n", name, n_lines + 1, keys[k], json_dumps(json_object_get(o, "text"), JSON_ENCODE_ANY));
                    print_ids("got", ids, n);
                    char *want = json_dumps(json_object_get(o, keys[k]), 0);
                    fprintf(stderr, "  want: %s\n", want);
                    free(want);
                }
            }
            if (k == 0) { /* decoding of the plain encoding, with and without specials */
                /* Hugging Face returns a Rust String: invalid UTF-8 (a byte-level
                 * token cut inside a character) becomes U+FFFD */
                char *raw, *dec;
                size_t dl;
                REQUIRE(ff_tokenizer_decode(t, ids, n, false, &raw, &dl) == 0);
                dec = ff_utf8_lossy(raw, dl, &dl);
                free(raw);
                const char *want = json_string_value(json_object_get(o, "decoded"));
                if (dl != json_string_length(json_object_get(o, "decoded")) || memcmp(dec, want, dl) != 0) {
                    if (bad++ < 5) fprintf(stderr, "%s line %d: decoded '%s', want '%s'\n", name, n_lines + 1, dec, want);
                }
                free(dec);
                REQUIRE(ff_tokenizer_decode(t, ids, n, true, &raw, &dl) == 0);
                dec = ff_utf8_lossy(raw, dl, &dl);
                free(raw);
                want = json_string_value(json_object_get(o, "decoded_skip"));
                if (dl != json_string_length(json_object_get(o, "decoded_skip")) || memcmp(dec, want, dl) != 0) {
                    if (bad++ < 5) fprintf(stderr, "%s line %d: decoded (skip special) '%s', want '%s'\n", name, n_lines + 1, dec, want);
                }
                free(dec);
            }
            free(ids);
        }
        json_decref(o);
        n_lines++;
    }
    free(line);
    fclose(f);
    fprintf(stderr, "tok_%s: %d strings, %d mismatches\n", name, n_lines, bad);
    CHECK(n_lines > 300);
    CHECK_EQ_INT(bad, 0);
    ff_tokenizer_destroy(&t);
}

static void test_bytes(void) {
    ff_tokenizer *t = ff_tokenizer_new_bytes();
    REQUIRE(t);
    CHECK_EQ_INT(ff_tokenizer_vocab_size(t), FF_BYTES_VOCAB);
    CHECK_EQ_INT(ff_tokenizer_bos(t), 256);
    CHECK_EQ_INT(ff_tokenizer_eos(t), 257);
    CHECK_EQ_INT(ff_tokenizer_pad(t), 258);
    CHECK_EQ_INT(ff_tokenizer_token_id(t, "<|eos|>"), 257);
    CHECK(ff_tokenizer_is_special(t, 258));
    CHECK(!ff_tokenizer_is_special(t, 65));
    const char *s = "12+345=357\n\xc3\xa9\xf0\x9f\x98\x80 \t<|eos|>";
    int32_t *ids, n;
    REQUIRE(ff_tokenizer_encode(t, s, strlen(s), NULL, &ids, &n) == 0);
    size_t plain = strlen(s) - strlen("<|eos|>");
    CHECK_EQ_INT(n, (int32_t)plain + 1);
    for (size_t i = 0; i < plain; i++) CHECK_EQ_INT(ids[i], (uint8_t)s[i]);
    CHECK_EQ_INT(ids[n - 1], FF_BYTES_EOS);
    char *dec;
    size_t dl;
    REQUIRE(ff_tokenizer_decode(t, ids, n, true, &dec, &dl) == 0);
    CHECK_EQ_INT(dl, plain);
    CHECK(memcmp(dec, s, plain) == 0);
    free(dec);
    free(ids);
    /* every byte value alone decodes to itself, even when not valid UTF-8 by itself */
    for (int32_t b = 0; b < 256; b++) {
        REQUIRE(ff_tokenizer_decode(t, &b, 1, false, &dec, &dl) == 0);
        CHECK(dl == 1 && (uint8_t)dec[0] == b);
        free(dec);
    }
    int32_t bad = 259;
    CHECK(ff_tokenizer_decode(t, &bad, 1, false, &dec, &dl) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "token id 259");

    /* saved and loaded back (as a folder, with bos/eos/pad from tokenizer_config.json) */
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/ff_test_tok_%d", (int)getpid());
    REQUIRE(ff_mkdirs(dir) == 0);
    REQUIRE(ff_tokenizer_save_dir(t, dir) == 0);
    ff_tokenizer *u = ff_tokenizer_load_dir(dir);
    REQUIRE(u);
    CHECK_EQ_INT(ff_tokenizer_eos(u), 257);
    CHECK_EQ_INT(ff_tokenizer_bos(u), 256);
    for (int32_t id = 0; id < FF_BYTES_VOCAB; id++) CHECK(!strcmp(ff_tokenizer_token(t, id), ff_tokenizer_token(u, id)));
    ff_tokenizer_destroy(&u);
    /* the committed copy, which Hugging Face's library was checked to load (make_fixtures.py) */
    u = ff_tokenizer_load("tests/modelio/data/tok_bytes.json");
    REQUIRE(u);
    for (int32_t id = 0; id < FF_BYTES_VOCAB; id++) CHECK(!strcmp(ff_tokenizer_token(t, id), ff_tokenizer_token(u, id)));
    ff_tokenizer_destroy(&u);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);

    /* not UTF-8 */
    CHECK(ff_tokenizer_encode(t, "ab\xff", 3, NULL, &ids, &n) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "not valid UTF-8 (at byte 2)");
    ff_tokenizer_destroy(&t);
}

/* expected outputs from Python's bytes.decode("utf-8", "replace") */
static void test_lossy(void) {
    const char *cases[][2] = {
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"a\xe2\x82", "a\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82\xacok\xff", "\xe2\x82\xacok\xef\xbf\xbd"},
        {"plain \xf0\x9f\x98\x80", "plain \xf0\x9f\x98\x80"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        char *o = ff_utf8_lossy(cases[i][0], strlen(cases[i][0]), &n);
        REQUIRE(o);
        if (n != strlen(cases[i][1]) || memcmp(o, cases[i][1], n) != 0) {
            fprintf(stderr, "lossy case %zu wrong\n", i);
            ff_test_failures++;
        }
        free(o);
    }
}

static void expect_load_error(const char *json, const char *needle) {
    ff_tokenizer *t = ff_tokenizer_parse(json, strlen(json), "bad.json");
    if (t) {
        fprintf(stderr, "accepted: %s\n", json);
        ff_test_failures++;
        ff_tokenizer_destroy(&t);
        return;
    }
    CHECK_STR_CONTAINS(ff_error_message(), "bad.json");
    CHECK_STR_CONTAINS(ff_error_message(), needle);
}

static void test_errors(void) {
    const char *bl = "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"}";
    char buf[2048];
    expect_load_error("{\"model\": ", "malformed JSON");
    expect_load_error("[]", "must be a JSON object");
    expect_load_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "unsupported tokenizer model 'WordPiece'");
    expect_load_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "unsupported tokenizer model 'Unigram'");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {\"a\": 0}}, %s}", bl);
    expect_load_error(buf, "dropout");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}, %s}", bl);
    expect_load_error(buf, "merge 0 ('a' + 'b') uses a token that is not in the vocabulary");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"ab\"]}, %s}", bl);
    expect_load_error(buf, "not two tokens");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}, %s}", bl);
    expect_load_error(buf, "vocab ids must be unique");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}}, %s}", bl);
    expect_load_error(buf, "bad id");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"Lowercase\"}, %s}", bl);
    expect_load_error(buf, "unsupported normalizer 'Lowercase'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
                      "unsupported pre_tokenizer 'BertPreTokenizer'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}",
                      "Metaspace needs a \"replacement\" of one character");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "
                      "\"_\", \"prepend_scheme\": \"sometimes\"}}",
                      "unknown prepend_scheme 'sometimes'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": "
                      "\" +\"}, \"content\": \"_\"}}",
                      "Replace normalizer with a Regex pattern");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                      "\"(unclosed\"}, \"behavior\": \"Isolated\"}}",
                      "does not compile");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": "
                      "\"x\"}, \"behavior\": \"Sideways\"}}",
                      "unknown behavior 'Sideways'");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"decoder\": "
                              "{\"type\": \"WordPiece\"}}");
    expect_load_error(buf, "unsupported decoder 'WordPiece'");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, %s, \"post_processor\": {\"type\": \"BertProcessing\"}}", bl);
    expect_load_error(buf, "unsupported post_processor 'BertProcessing'");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, %s, \"added_tokens\": [{\"id\": 1}]}", bl);
    expect_load_error(buf, "added token 0 needs");
    snprintf(buf, sizeof buf, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"<unk>\"}, %s}", bl);
    expect_load_error(buf, "unk_token '<unk>' is not in the vocabulary");

    ff_tokenizer *t = ff_tokenizer_load("/nonexistent/tokenizer.json");
    CHECK(t == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/tokenizer.json: cannot open");
    t = ff_tokenizer_load_dir("/nonexistent");
    CHECK(t == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/tokenizer.json");
}

/* A long word (one pre-token of 200k bytes) must not take quadratic time: BPE uses a heap. */
static void test_long_word(void) {
    ff_tokenizer *t = ff_tokenizer_load("tests/modelio/data/tok_gpt2.json");
    REQUIRE(t);
    size_t n = 200000;
    char *s = malloc(n);
    for (size_t i = 0; i < n; i++) s[i] = "0123456789"[i % 10];
    int32_t *ids, m;
    int64_t t0 = ff_now_ns();
    REQUIRE(ff_tokenizer_encode(t, s, n, NULL, &ids, &m) == 0);
    double ms = (double)(ff_now_ns() - t0) / 1e6;
    fprintf(stderr, "200k-digit word: %d tokens in %.1f ms\n", m, ms);
    char *dec;
    size_t dl;
    REQUIRE(ff_tokenizer_decode(t, ids, m, false, &dec, &dl) == 0);
    CHECK(dl == n && memcmp(dec, s, n) == 0);
    free(dec);
    free(ids);
    free(s);
    ff_tokenizer_destroy(&t);
}

int main(void) {
    check_fixture("gpt2");
    check_fixture("llama3");
    check_fixture("qwen2");
    check_fixture("features");
    check_fixture("llama2");
    check_fixture("gemma");
    check_fixture("metaspace");
    check_fixture("metaspace_split");
    test_bytes();
    test_lossy();
    test_errors();
    test_long_word();
    TEST_MAIN_END();
}
