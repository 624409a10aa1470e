/* Errors, random numbers, atomic writes and the JSONL reader. */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#include "fuseflow/jsonl.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static void test_errors(void) {
    ff_error_clear();
    CHECK(!strcmp(ff_error_message(), ""));
    CHECK_EQ_INT(ff_error_set("f.bin", "copy it again", "truncated at %d", 12), -1);
    CHECK(!strcmp(ff_error_message(), "f.bin: truncated at 12 (hint: copy it again)"));
    ff_error_wrap("loading model %s", "m");
    CHECK(!strcmp(ff_error_message(), "loading model m: f.bin: truncated at 12 (hint: copy it again)"));
    ff_error_set(NULL, NULL, "plain");
    CHECK(!strcmp(ff_error_message(), "plain"));
    /* errno survives both, even when formatting fails (an unencodable wide string makes
     * vsnprintf set EILSEQ) */
    const wchar_t bad[2] = {(wchar_t)0x7fffffff, 0};
    errno = EHOSTUNREACH;
    ff_error_set("send", NULL, "%ls", bad);
    CHECK_EQ_INT(errno, EHOSTUNREACH);
    errno = ECONNRESET;
    ff_error_wrap("%ls", bad);
    CHECK_EQ_INT(errno, ECONNRESET);
}

static void test_rng(void) {
    ff_rng a, b;
    /* splitmix64's published first output from state 0 seeds the first word */
    ff_rng_seed(&a, 0);
    CHECK(a.s[0] == 0xe220a8397b1dcdafULL);
    /* xoshiro256** from seed 42, by a Python transcription of Blackman and Vigna's reference;
     * six draws, so that every word of the state (s[3] first shows in the fourth) is covered */
    static const uint64_t want[6] = {0x15780b2e0c2ec716ULL, 0x6104d9866d113a7eULL, 0xae17533239e499a1ULL,
                                     0xecb8ad4703b360a1ULL, 0xfde6dc7fe2ec5e64ULL, 0xc50da53101795238ULL};
    ff_rng_seed(&a, 42);
    for (int i = 0; i < 6; i++) CHECK(ff_rng_u64(&a) == want[i]);
    ff_rng_seed(&a, 42);
    ff_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) CHECK(ff_rng_u64(&a) == ff_rng_u64(&b));
    ff_rng_seed(&b, 43);
    CHECK(ff_rng_u64(&a) != ff_rng_u64(&b));
    /* moments of the normal and uniform draws */
    double s = 0, s2 = 0, u = 0;
    int n = 200000, hist[10] = {0};
    for (int i = 0; i < n; i++) {
        double x = ff_rng_normal(&a);
        s += x;
        s2 += x * x;
        double v = ff_rng_uniform(&a);
        CHECK(v >= 0 && v < 1);
        u += v;
        hist[ff_rng_below(&a, 10)]++;
    }
    CHECK_CLOSE(s / n, 0.0, 0.01, 0);
    CHECK_CLOSE(s2 / n, 1.0, 0.02, 0);
    CHECK_CLOSE(u / n, 0.5, 0.005, 0);
    for (int k = 0; k < 10; k++) CHECK_CLOSE(hist[k], n / 10.0, n / 10.0 * 0.05, 0);
}

static void test_files(void) {
    char dir[] = "/tmp/ff_test_util_XXXXXX";
    REQUIRE(mkdtemp(dir));
    char sub[256], path[300];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    CHECK_EQ_INT(ff_mkdirs(sub), 0);
    snprintf(path, sizeof path, "%s/x.txt", sub);
    CHECK_EQ_INT(ff_write_file_atomic(path, "hello", 5), 0);
    size_t len;
    char *t = ff_read_file(path, &len);
    REQUIRE(t);
    CHECK_EQ_INT(len, 5);
    CHECK(!strcmp(t, "hello"));
    free(t);
    CHECK(ff_read_file("/nonexistent/q", &len) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/q: cannot open");
    snprintf(path, sizeof path, "%s/nodir/x.txt", dir);
    CHECK_EQ_INT(ff_write_file_atomic(path, "x", 1), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot create");

    snprintf(path, sizeof path, "%s/d.jsonl", dir);
    /* line 3: a string holding U+0000 is valid JSON; it comes back with its length */
    const char *lines = "{\"a\":1}\n\n{\"a\":2, \"text\": \"x\\u0000y\"}\n[1]\n{\"a\":\n";
    CHECK_EQ_INT(ff_write_file_atomic(path, lines, strlen(lines)), 0);
    ff_jsonl *r = ff_jsonl_open(path);
    REQUIRE(r);
    json_t *j;
    CHECK_EQ_INT(ff_jsonl_next(r, &j), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "a")), 1);
    json_decref(j);
    CHECK_EQ_INT(ff_jsonl_next(r, &j), 1);
    CHECK_EQ_INT(ff_jsonl_line(r), 3);
    CHECK_EQ_INT(json_string_length(json_object_get(j, "text")), 3);
    CHECK(memcmp(json_string_value(json_object_get(j, "text")), "x\0y", 3) == 0);
    json_decref(j);
    CHECK_EQ_INT(ff_jsonl_next(r, &j), -1);
    CHECK_STR_CONTAINS(ff_error_message(), ":4: expected a JSON object");
    CHECK_EQ_INT(ff_jsonl_next(r, &j), -1);
    CHECK_STR_CONTAINS(ff_error_message(), ":5: malformed JSON");
    CHECK_EQ_INT(ff_jsonl_next(r, &j), 0);
    ff_jsonl_close(&r);
    CHECK(r == NULL);
    /* ff_check_writable: leaves nothing behind; a folder, a path under a file, a missing folder fail */
    snprintf(path, sizeof path, "%s/w.json", dir);
    CHECK_EQ_INT(ff_check_writable(path), 0);
    CHECK(access(path, F_OK) != 0);
    char probe[340];
    snprintf(probe, sizeof probe, "%s.tmp.%d", path, (int)getpid());
    CHECK(access(probe, F_OK) != 0);
    CHECK_EQ_INT(ff_check_writable(dir), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "is a folder");
    snprintf(path, sizeof path, "%s/d.jsonl/x.json", dir);
    CHECK_EQ_INT(ff_check_writable(path), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot be written: Not a directory");
    snprintf(path, sizeof path, "%s/no/x.json", dir);
    CHECK_EQ_INT(ff_check_writable(path), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "No such file or directory");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

/* FNV-1a is the published algorithm with the published basis and hashes pieces as their
 * join; the seed streams' tags keep their streams (values
 * computed with the formulas before they had names: a change here changes every run). */
static void test_hash_and_streams(void) {
    CHECK(ff_hash_fnv1a("foobar", 6, 0xcbf29ce484222325ULL) == 0x85944171f73967e8ULL); /* published vector */
    CHECK(FF_HASH_FNV1A_INIT == 14695981039346656037ULL); /* the published offset basis */
    CHECK(ff_hash_fnv1a("bar", 3, ff_hash_fnv1a("foo", 3, FF_HASH_FNV1A_INIT)) == ff_hash_fnv1a("foobar", 6, FF_HASH_FNV1A_INIT));
    CHECK(ff_hash_fnv1a("", 0, FF_HASH_FNV1A_INIT) == FF_HASH_FNV1A_INIT);
    CHECK(ff_seed_stream(42, 3, FF_SEED_TAG_TRAINER_SHUFFLE) == 0x3c51dfa00fdd2ce2ULL);
    CHECK(ff_seed_stream(42, 3, FF_SEED_TAG_TRAIN_ORDER + 1 * 1024 + 2) == 0xfd0704fd2d92e0d6ULL);
}

/* ff_strbuf: appends past the first 4096 bytes keep everything, in order, NUL-terminated */
static void test_strbuf(void) {
    ff_strbuf b = {0};
    for (int i = 0; i < 2000; i++) ff_strbuf_printf(&b, "%d,", i);
    REQUIRE(!b.failed && b.p);
    CHECK_EQ_INT((int64_t)strlen(b.p), (int64_t)b.len);
    CHECK(b.len > 4096 && b.cap > b.len);
    int next = 0, ok = 1;
    for (const char *q = b.p; *q; next++) {
        char *e;
        long v = strtol(q, &e, 10);
        ok = ok && v == next && *e == ',';
        q = e + 1;
    }
    CHECK(ok && next == 2000);
    free(b.p);
}

int main(void) {
    test_strbuf();
    test_errors();
    test_rng();
    test_hash_and_streams();
    test_files();
    TEST_MAIN_END();
}
