/* Timelines: a live run writes valid Chrome Trace Event JSON with the expected events (named
 * processes and threads, one slice per subtask, a dispatch->execution flow per slice, tracks
 * that nest), and `trace summary` gives the right numbers on a known trace and finds the
 * chain of dependent jobs in the live one. */
#include <jansson.h>
#include <math.h>

#include "tests/runtime/rt_test.h"

static json_t *summary_json(const char *path) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    int rc = ff_trace_summary(path, f, true);
    fclose(f);
    if (rc != 0) {
        fprintf(stderr, "summary of %s: %s\n", path, ff_error_message());
        free(buf);
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    if (!j) fprintf(stderr, "summary is not JSON: %s\n%s\n", e.text, buf);
    free(buf);
    return j;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static json_t *find_named(json_t *arr, const char *prefix) {
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(arr, i), "name"));
        if (n && !strncmp(n, prefix, strlen(prefix))) return json_array_get(arr, i);
    }
    return NULL;
}

static void test_known_trace(void) {
    const char *src = getenv("FF_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/runtime/data/trace_known.json", src ? src : ".");
    json_t *s = summary_json(path);
    REQUIRE(s);
    CHECK_CLOSE(num(s, "span_us"), 52, 1e-9, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "subtasks")), 5);
    json_t *w = json_object_get(s, "workers");
    CHECK_EQ_INT(json_array_size(w), 2);
    json_t *w0 = find_named(w, "worker 0"), *w1 = find_named(w, "worker 1");
    REQUIRE(w0 && w1);
    CHECK_CLOSE(num(w0, "busy_us"), 25, 1e-9, 0); /* [0,10] u [5,15] u [20,30] */
    CHECK_CLOSE(num(w0, "idle_us"), 27, 1e-9, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(w0, "subtasks")), 3);
    CHECK_CLOSE(num(w1, "busy_us"), 52, 1e-9, 0);
    CHECK_CLOSE(num(w1, "idle_us"), 0, 1e-9, 0);
    json_t *g = find_named(json_object_get(s, "groups"), "g");
    REQUIRE(g);
    CHECK_EQ_INT(json_integer_value(json_object_get(g, "members")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(g, "subtasks")), 3);
    CHECK_CLOSE(num(g, "busy_us"), 55, 1e-9, 0);  /* 15 on worker 0 + 40 on worker 1 */
    CHECK_CLOSE(num(g, "idle_us"), 49, 1e-9, 0);  /* 2 members x 52 - 55 */
    json_t *ch = json_object_get(s, "longest_chain");
    CHECK_EQ_INT(json_integer_value(json_object_get(ch, "length")), 4);
    CHECK_CLOSE(num(ch, "busy_us"), 42, 1e-9, 0); /* a 10 + b 10 + d 10 + e 12 beats c 40 */
    CHECK_CLOSE(num(ch, "elapsed_us"), 52, 1e-9, 0);
    json_t *ids = json_object_get(ch, "jobs");
    REQUIRE(json_array_size(ids) == 4);
    int64_t want[4] = {1, 2, 4, 5};
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(json_integer_value(json_array_get(ids, (size_t)i)), want[i]);
    json_decref(s);

    /* the text form says the same */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(ff_trace_summary(path, f, false) == 0);
    fclose(f);
    CHECK_STR_CONTAINS(buf, "longest chain of dependent jobs: 4 jobs, 0.042 ms of work");
    CHECK_STR_CONTAINS(buf, "worker 1 (hostB, pid 22, cpu)");
    free(buf);

    /* files that are not traces */
    CHECK(ff_trace_summary("/nonexistent/t.json", stdout, false) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/t.json");
    char tmp[128];
    snprintf(tmp, sizeof tmp, "/tmp/ff-test-trace-bad-%d.json", (int)getpid());
    ff_write_file_atomic(tmp, "{\"a\": 1}", 8);
    CHECK(ff_trace_summary(tmp, stdout, false) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no traceEvents");
    ff_write_file_atomic(tmp, "{\"traceEvents\": []}", 19);
    CHECK(ff_trace_summary(tmp, stdout, false) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no subtask events");
    ff_write_file_atomic(tmp, "{\"traceEvents\": [", 17);
    CHECK(ff_trace_summary(tmp, stdout, false) == -1);
    unlink(tmp);
}

typedef struct chain {
    ff_controller *c;
    int left;
    uint64_t ids[8];
    int n;
} chain;

static void next_link(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud);

static void submit_link(chain *ch, uint64_t after) {
    ff_arg a = ff_arg_float("ms", 50); /* far longer than any other job here, even on a loaded machine */
    ff_subtask_spec s = {.kind = "sleep", .target = FF_TARGET_ANY, .group = "all", .args = &a, .nargs = 1,
                         .after = after ? &after : NULL, .nafter = after ? 1 : 0, .label = "step"};
    uint64_t id = ff_controller_submit(ch->c, &s, next_link, ch);
    REQUIRE(id > 0);
    ch->ids[ch->n++] = id;
}

static void next_link(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)n;
    chain *ch = ud;
    CHECK(r[0].status == FF_STATUS_OK);
    if (--ch->left > 0) submit_link(ch, job);
}

static void test_live_trace(void) {
    ff_controller_opts o = rt_opts();
    o.trace = true;
    ff_controller *c = rt_start(&o, 3);
    chain ch = {c, 4, {0}, 0};
    submit_link(&ch, 0);
    rt_counter k = {0};
    for (int i = 0; i < 30; i++) {
        ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all"};
        REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
    }
    int64_t n4 = 4;
    ff_input in = rt_f32("x", &n4, 1);
    ff_subtask_spec g = {.kind = "sum", .target = FF_TARGET_GROUP, .group = "all", .inputs = &in, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &g, rt_count, &k) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(ch.n, 4);
    char path[128];
    snprintf(path, sizeof path, "/tmp/ff-test-trace-%d.json", (int)getpid());
    REQUIRE(ff_controller_trace_write(c, path) == 0);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);

    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) fprintf(stderr, "%s: %s (line %d)\n", path, e.text, e.line);
    REQUIRE(root);
    json_t *ev = json_object_get(root, "traceEvents");
    REQUIRE(json_is_array(ev));
    int nsub = 0, nproc = 0, nthread = 0;
    json_t *flows_s = json_object(), *flows_f = json_object();
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(x, "ph"));
        const char *name = json_string_value(json_object_get(x, "name"));
        int pid = (int)json_integer_value(json_object_get(x, "pid"));
        REQUIRE(ph && name);
        if (!strcmp(ph, "M") && !strcmp(name, "process_name")) {
            const char *pn = json_string_value(json_object_get(json_object_get(x, "args"), "name"));
            if (pid == 0) CHECK(!strcmp(pn, "controller"));
            else CHECK(!strncmp(pn, "worker ", 7) && strstr(pn, "pid "));
            nproc++;
        } else if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            nthread++;
        } else if (!strcmp(ph, "X") && !strcmp(json_string_value(json_object_get(x, "cat")), "subtask")) {
            nsub++;
            json_t *args = json_object_get(x, "args");
            CHECK(!strcmp(json_string_value(json_object_get(args, "status")), "ok"));
            CHECK(json_number_value(json_object_get(x, "dur")) >= 0);
            CHECK(json_number_value(json_object_get(x, "ts")) >= json_number_value(json_object_get(args, "dispatch_us")));
            CHECK(pid >= 1 && pid <= 3);
        } else if (!strcmp(ph, "s") || !strcmp(ph, "f")) {
            char key[32];
            snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_object_get(x, "id")));
            json_object_set(!strcmp(ph, "s") ? flows_s : flows_f, key, x);
        }
    }
    CHECK_EQ_INT(nproc, 4);
    CHECK(nthread >= 4);
    CHECK_EQ_INT(nsub, 3 + 4 + 30 + 3); /* group setup, chain, echoes, group sum */
    /* every subtask slice has its arrow: s on the controller, f where the slice starts */
    CHECK_EQ_INT(json_object_size(flows_s), nsub);
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(x, "ph"));
        if (strcmp(ph, "X") || strcmp(json_string_value(json_object_get(x, "cat")), "subtask")) continue;
        char key[32];
        snprintf(key, sizeof key, "%lld",
                 (long long)json_integer_value(json_object_get(json_object_get(x, "args"), "id")));
        json_t *f = json_object_get(flows_f, key), *s = json_object_get(flows_s, key);
        REQUIRE(f && s && json_is_object(f));
        CHECK(json_integer_value(json_object_get(s, "pid")) == 0);
        CHECK(json_integer_value(json_object_get(f, "pid")) == json_integer_value(json_object_get(x, "pid")));
        CHECK(json_integer_value(json_object_get(f, "tid")) == json_integer_value(json_object_get(x, "tid")));
        CHECK(json_number_value(json_object_get(f, "ts")) == json_number_value(json_object_get(x, "ts")));
        /* slices on one track never overlap */
        for (size_t j = 0; j < json_array_size(ev); j++) {
            json_t *y = json_array_get(ev, j);
            if (j == i || strcmp(json_string_value(json_object_get(y, "ph")), "X") ||
                json_integer_value(json_object_get(y, "pid")) != json_integer_value(json_object_get(x, "pid")) ||
                json_integer_value(json_object_get(y, "tid")) != json_integer_value(json_object_get(x, "tid")))
                continue;
            double a0 = json_number_value(json_object_get(x, "ts")), a1 = a0 + json_number_value(json_object_get(x, "dur"));
            double b0 = json_number_value(json_object_get(y, "ts")), b1 = b0 + json_number_value(json_object_get(y, "dur"));
            CHECK(a1 <= b0 + 0.002 || b1 <= a0 + 0.002);
        }
    }
    json_decref(flows_s);
    json_decref(flows_f);
    json_decref(root);

    /* the summary finds the chain of four dependent sleeps */
    json_t *s = summary_json(path);
    REQUIRE(s);
    json_t *ids = json_object_get(json_object_get(s, "longest_chain"), "jobs");
    CHECK_EQ_INT(json_array_size(ids), 4);
    for (int i = 0; i < 4 && i < (int)json_array_size(ids); i++)
        CHECK_EQ_INT(json_integer_value(json_array_get(ids, (size_t)i)), ch.ids[i]);
    CHECK_EQ_INT(json_array_size(json_object_get(s, "workers")), 3);
    json_decref(s);
    unlink(path);
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    test_known_trace();
    test_live_trace();
    TEST_MAIN_END();
}
