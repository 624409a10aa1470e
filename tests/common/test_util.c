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
    const char *lines = "{\"a\":1}\n\n{\"a\":2}\n[1]\n{\"a\":\n";
    CHECK_EQ_INT(ff_write_file_atomic(path, lines, strlen(lines)), 0);
    ff_jsonl *r = ff_jsonl_open(path);
    REQUIRE(r);
    json_t *j;
    CHECK_EQ_INT(ff_jsonl_next(r, &j), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "a")), 1);
    json_decref(j);
    CHECK_EQ_INT(ff_jsonl_next(r, &j), 1);
    CHECK_EQ_INT(ff_jsonl_line(r), 3);
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

int main(void) {
    test_errors();
    test_rng();
    test_files();
    TEST_MAIN_END();
}
