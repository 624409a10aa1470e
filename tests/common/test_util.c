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
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

/* The hint for a damaged checkpoint names the one before it (or says to start again), and
 * nothing outside OUT/checkpoints/step-N gets it. */
static void test_checkpoint_hint(void) {
    char dir[128], cmd[400], hint[4096];
    snprintf(dir, sizeof dir, "/tmp/ff_ckhint_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/checkpoints/step-00000003/actor %s/checkpoints/step-00000007 "
             "%s/checkpoints/step-00000009.tmp-5", dir, dir, dir, dir);
    REQUIRE(system(cmd) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s/checkpoints/step-00000007/actor/model.safetensors", dir);
    CHECK_EQ_INT(ff_checkpoint_hint(path, hint, sizeof hint), 0);
    char want[512];
    snprintf(want, sizeof want, "the checkpoint %s/checkpoints/step-00000007 is damaged; the one before it is "
             "%s/checkpoints/step-00000003: move the damaged one away (mv %s/checkpoints/step-00000007 "
             "%s/checkpoints/step-00000007.damaged) and run the same command with --resume", dir, dir, dir, dir);
    CHECK_STR_CONTAINS(hint, want);
    snprintf(path, sizeof path, "%s/checkpoints/step-00000003/state.json", dir);
    CHECK_EQ_INT(ff_checkpoint_hint(path, hint, sizeof hint), 0);
    CHECK_STR_CONTAINS(hint, "holds none before it");
    CHECK_STR_CONTAINS(hint, "start again without --resume");
    /* a staging folder, a model folder, a relative checkpoint of the current folder */
    snprintf(path, sizeof path, "%s/checkpoints/step-00000009.tmp-5/x", dir);
    CHECK_EQ_INT(ff_checkpoint_hint(path, hint, sizeof hint), -1);
    CHECK_EQ_INT(ff_checkpoint_hint("models/tiny/model.safetensors", hint, sizeof hint), -1);
    CHECK_EQ_INT(ff_checkpoint_hint("checkpoints/step-12", hint, sizeof hint), 0);
    CHECK_STR_CONTAINS(hint, "the checkpoint checkpoints/step-12 is damaged and ./checkpoints holds none before it");
    /* ff_checkpoint_error adds it once, and leaves other errors alone */
    snprintf(path, sizeof path, "%s/checkpoints/step-00000007/actor", dir);
    ff_error_set("model.safetensors", NULL, "cut short");
    CHECK_EQ_INT(ff_checkpoint_error(path), -1);
    CHECK_EQ_INT(ff_checkpoint_error(path), -1);
    const char *m = ff_error_message();
    CHECK_STR_CONTAINS(m, "model.safetensors: cut short (hint: the checkpoint ");
    CHECK(strstr(strstr(m, "(hint:") + 1, "(hint:") == NULL);
    ff_error_set("x", NULL, "other");
    ff_checkpoint_error("/models/x");
    CHECK(!strcmp(ff_error_message(), "x: other"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

int main(void) {
    test_checkpoint_hint();
    test_errors();
    test_rng();
    test_files();
    TEST_MAIN_END();
}
